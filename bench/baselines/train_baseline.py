"""Baselines for `segflow bench`: the quick-start recipe (configs/quickstart-unet3d.yaml) in
plain PyTorch and in MONAI's optimized style, on the same synthetic NIfTI dataset, the same
network (MONAI's UNet 8-16-32-64, strides 2, 1 residual unit, batch norm), the same crops
(32^3, 4 per case, 3 foreground-centred : 1 background), batch 4, DiceCE, AdamW.

  --mode torch : torch.utils.data.Dataset reading each case from disk every time (nibabel),
                 numpy crops, DataLoader(num_workers=W); no caching.
  --mode monai : MONAI CacheDataset (deterministic transforms cached) + ThreadDataLoader,
                 RandCropByPosNegLabeld, RandFlipd, DiceCELoss; AMP on CUDA.

Prints one JSON line: samples/s and step time over the measured epochs (after one warm-up
epoch), like segflow bench's "e2e" line. Usage:
  train_baseline.py --mode torch|monai --data DIR [--epochs 3] [--workers 2] [--threads 2]
"""
import argparse
import glob
import json
import os
import time

import numpy as np
import torch


def cases(root):
    imgs = sorted(glob.glob(os.path.join(root, "imagesTr", "*_0000.nii.gz")))
    out = []
    for p in imgs:
        cid = os.path.basename(p)[: -len("_0000.nii.gz")]
        out.append({"image": p, "label": os.path.join(root, "labelsTr", cid + ".nii.gz")})
    return out


def network():
    from monai.networks.nets import UNet

    return UNet(spatial_dims=3, in_channels=1, out_channels=5, channels=(8, 16, 32, 64), strides=(2, 2, 2),
                num_res_units=1, norm="batch")


class PlainDataset(torch.utils.data.Dataset):
    """Reads, windows and crops a case on every access (what a first PyTorch script does)."""

    def __init__(self, items, seed):
        self.items, self.rng = items, np.random.default_rng(seed)

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        import nibabel as nib

        img = np.asarray(nib.load(self.items[i]["image"]).dataobj, dtype=np.float32)
        lab = np.asarray(nib.load(self.items[i]["label"]).dataobj, dtype=np.int64)
        img = np.clip((img + 200.0) / 500.0, 0.0, 1.0)
        size = 32
        pad = [(0, max(0, size - s)) for s in img.shape]
        img, lab = np.pad(img, pad), np.pad(lab, pad)
        fg = np.argwhere(lab > 0)
        bg = np.argwhere(lab == 0)
        xs, ys = [], []
        for k in range(4):
            pool = fg if (k < 3 and len(fg)) else bg
            c = pool[self.rng.integers(len(pool))]
            lo = [int(min(max(c[d] - size // 2, 0), img.shape[d] - size)) for d in range(3)]
            sl = tuple(slice(lo[d], lo[d] + size) for d in range(3))
            x, y = img[sl], lab[sl]
            if self.rng.random() < 0.5:
                x, y = x[::-1], y[::-1]
            xs.append(np.ascontiguousarray(x)[None])
            ys.append(np.ascontiguousarray(y)[None])
        return torch.from_numpy(np.stack(xs)), torch.from_numpy(np.stack(ys))


def torch_loader(items, workers):
    ds = PlainDataset(items, 0)
    # Each item is 4 crops; batch 1 item = batch 4 crops, as segflow's batch_size 4.
    return torch.utils.data.DataLoader(ds, batch_size=1, shuffle=True, num_workers=workers,
                                       collate_fn=lambda b: (b[0][0], b[0][1]))


def monai_loader(items, workers):
    from monai.data import CacheDataset, ThreadDataLoader
    from monai.transforms import (Compose, EnsureChannelFirstd, FgBgToIndicesd, LoadImaged, RandCropByPosNegLabeld,
                                  RandFlipd, ScaleIntensityRanged, SpatialPadd)

    det = [LoadImaged(keys=["image", "label"]), EnsureChannelFirstd(keys=["image", "label"]),
           ScaleIntensityRanged(keys=["image"], a_min=-200, a_max=300, b_min=0.0, b_max=1.0, clip=True),
           # The synthetic volumes have 26 slices: pad to the crop size (symmetric, as segflow's
           # rand_crop_pos_neg does), or RandCropByPosNegLabeld refuses them.
           SpatialPadd(keys=["image", "label"], spatial_size=(32, 32, 32)),
           FgBgToIndicesd(keys="label", fg_postfix="_fg", bg_postfix="_bg", image_key="image")]
    rnd = [RandCropByPosNegLabeld(keys=["image", "label"], label_key="label", spatial_size=(32, 32, 32), pos=3, neg=1,
                                  num_samples=4, fg_indices_key="label_fg", bg_indices_key="label_bg"),
           RandFlipd(keys=["image", "label"], prob=0.5, spatial_axis=0)]
    ds = CacheDataset(items, transform=Compose(det + rnd), cache_rate=1.0, num_workers=workers, progress=False)
    # As MONAI's fast-training tutorial does: once the cache is filled, the random transforms
    # and the network work on plain tensors (MetaTensor's per-op dispatch costs on CPU).
    from monai.data import set_track_meta

    set_track_meta(False)
    # batch_size 1 item x num_samples 4 crops = 4 crops per step.
    return ThreadDataLoader(ds, batch_size=1, shuffle=True, num_workers=0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["torch", "monai"], required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    from monai.losses import DiceCELoss

    items = cases(a.data)
    dev = torch.device(a.device)
    net = network().to(dev)
    loss_fn = DiceCELoss(to_onehot_y=True, softmax=True)
    opt = torch.optim.AdamW(net.parameters(), lr=0.005, weight_decay=1e-5)
    amp = a.mode == "monai" and dev.type == "cuda"
    scaler = torch.amp.GradScaler("cuda", enabled=amp)
    t_setup = time.perf_counter()
    loader = torch_loader(items, a.workers) if a.mode == "torch" else monai_loader(items, a.workers)
    setup_s = time.perf_counter() - t_setup
    steps = samples = 0
    measured = wait = 0.0
    for epoch in range(a.epochs + 1):  # epoch 0 warms up
        t0 = time.perf_counter()
        t_wait = time.perf_counter()
        for batch in loader:
            if a.mode == "monai":
                x = torch.cat([b["image"] for b in batch]) if isinstance(batch, list) else batch["image"]
                y = torch.cat([b["label"] for b in batch]) if isinstance(batch, list) else batch["label"]
            else:
                x, y = batch
            w = time.perf_counter() - t_wait
            if hasattr(x, "as_tensor"):  # a MetaTensor: the plain tensor under it
                x, y = x.as_tensor(), y.as_tensor()
            x, y = torch.as_tensor(x).to(dev), torch.as_tensor(y).to(dev)
            with torch.autocast(dev.type, enabled=amp):
                loss = loss_fn(net(x), y)
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            if epoch > 0:
                steps += 1
                samples += x.shape[0]
                wait += w
            t_wait = time.perf_counter()
        if epoch > 0:
            measured += time.perf_counter() - t0
    # MONAI's ThreadDataLoader ends an epoch early, printing the error from its thread, when a
    # transform fails: refuse a figure measured on fewer steps than the epochs hold.
    if steps != a.epochs * len(items):
        raise SystemExit(f"{a.mode}: expected {a.epochs * len(items)} steps ({a.epochs} epochs x {len(items)} cases), "
                         f"ran {steps}; a transform failed (see above)")
    print(json.dumps({"bench": "baseline", "mode": a.mode, "device": str(dev), "cases": len(items), "epochs": a.epochs,
                      "steps": steps, "samples_per_s": samples / measured, "step_ms": measured / steps * 1e3,
                      "data_wait_ms": wait / steps * 1e3, "setup_s": setup_s}))


if __name__ == "__main__":
    main()
