"""Baselines for `segflow bench`: the quick-start recipe (configs/quickstart-unet3d.yaml) in
plain PyTorch and in MONAI's optimized style, on the same synthetic NIfTI dataset, the same
network (MONAI's UNet 8-16-32-64, strides 2, 1 residual unit, batch norm), the same crops
(32^3, 4 per case, 3 foreground-centred : 1 background), batch 4, DiceCE, AdamW.

  --mode torch : torch.utils.data.Dataset reading each case from disk every time (nibabel),
                 numpy crops, DataLoader(num_workers=W); no caching.
  --mode monai : MONAI CacheDataset (deterministic transforms cached) + ThreadDataLoader,
                 RandCropByPosNegLabeld, RandFlipd, DiceCELoss; AMP on CUDA.

Prints one JSON line: samples/s and step time over the measured epochs (after one warm-up
epoch), like segflow bench's "e2e" line. With --target-dice it instead trains like the
segflow recipe (cosine schedule with warm-up over --max-epochs, validation every
--val-interval epochs by sliding windows over the held-out cases) and prints the wall time
until the validation mean foreground Dice first reaches the target ("time_to_dice"); the
cases come from a segflow run's split.json (--split) so that both train and score on the
same ones. Usage:
  train_baseline.py --mode torch|monai --data DIR [--split split.json] [--epochs 3]
                    [--target-dice 0.9 --max-epochs 60 --val-interval 10] [--workers 2] [--threads 2]
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


def load_case(item):
    import nibabel as nib

    img = np.asarray(nib.load(item["image"]).dataobj, dtype=np.float32)
    lab = np.asarray(nib.load(item["label"]).dataobj, dtype=np.int64)
    return np.clip((img + 200.0) / 500.0, 0.0, 1.0), lab


def validate(net, val, dev, num_classes=5):
    """Mean over foreground classes of the per-class Dice averaged over cases (MONAI's
    DiceMetric, mean_batch), from sliding-window inference as segflow validates."""
    from monai.inferers import sliding_window_inference
    from monai.metrics import DiceMetric
    from monai.networks.utils import one_hot

    metric = DiceMetric(include_background=False, reduction="mean_batch", ignore_empty=True)
    net.eval()
    with torch.no_grad():
        for img, lab in val:
            x = torch.from_numpy(img)[None, None].to(dev)
            logits = sliding_window_inference(x, (32, 32, 32), 4, net, overlap=0.25, mode="gaussian")
            pred = logits.argmax(1, keepdim=True).cpu()
            y = torch.from_numpy(lab)[None, None]
            metric(one_hot(pred, num_classes), one_hot(y, num_classes))
    net.train()
    per_class = metric.aggregate()
    return float(torch.nanmean(per_class)), [float(v) for v in per_class]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["torch", "monai"], required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--split", help="a segflow run's split.json: train on its train ids, score on its val ids")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--target-dice", type=float, help="time-to-Dice mode: stop when validation reaches this")
    ap.add_argument("--max-epochs", type=int, default=60)
    ap.add_argument("--val-interval", type=int, default=10)
    ap.add_argument("--warmup-steps", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    from monai.losses import DiceCELoss

    items = cases(a.data)
    val_items = []
    if a.split:
        split = json.load(open(a.split))
        by_id = {os.path.basename(i["label"])[: -len(".nii.gz")]: i for i in items}
        missing = [c for c in split["train"] + split["val"] if c not in by_id]
        if missing:
            raise SystemExit(f"{a.split}: cases not in {a.data}: {missing}")
        items = [by_id[c] for c in split["train"]]
        val_items = [by_id[c] for c in split["val"]]
    timing = a.target_dice is None
    if not timing and not val_items:
        raise SystemExit("--target-dice needs --split (the held-out cases to score on)")
    dev = torch.device(a.device)
    net = network().to(dev)
    loss_fn = DiceCELoss(to_onehot_y=True, softmax=True)
    opt = torch.optim.AdamW(net.parameters(), lr=0.005, weight_decay=1e-5)
    sched = None
    if not timing:  # segflow's cosine schedule: linear warm-up, then cosine to 0 over all steps
        import math

        total = a.max_epochs * len(items)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: (s + 1) / a.warmup_steps if s < a.warmup_steps
            else 0.5 * (1 + math.cos(math.pi * min(1.0, (s - a.warmup_steps) / max(1, total - a.warmup_steps)))))
    amp = a.mode == "monai" and dev.type == "cuda"
    scaler = torch.amp.GradScaler("cuda", enabled=amp)
    val = [load_case(i) for i in val_items]  # before the clock, as segflow prepares them before training
    t_start = time.perf_counter()
    loader = torch_loader(items, a.workers) if a.mode == "torch" else monai_loader(items, a.workers)
    setup_s = time.perf_counter() - t_start
    steps = samples = 0
    measured = wait = 0.0
    history = []
    epochs = a.epochs + 1 if timing else a.max_epochs
    for epoch in range(epochs):  # timing: epoch 0 warms up
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
            if sched:
                sched.step()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            if epoch > 0 or not timing:
                steps += 1
                samples += x.shape[0]
                wait += w
            t_wait = time.perf_counter()
        if epoch > 0 or not timing:
            measured += time.perf_counter() - t0
        if not timing and (epoch + 1) % a.val_interval == 0:
            dice, per_class = validate(net, val, dev)
            elapsed = time.perf_counter() - t_start
            history.append({"epoch": epoch + 1, "seconds": elapsed, "mean_dice": dice, "dice_per_class": per_class})
            if dice >= a.target_dice:
                break
    # MONAI's ThreadDataLoader ends an epoch early, printing the error from its thread, when a
    # transform fails: refuse a figure measured on fewer steps than the epochs hold.
    ran = (a.epochs if timing else (history[-1]["epoch"] if history else epochs)) * len(items)
    if steps != ran:
        raise SystemExit(f"{a.mode}: expected {ran} steps ({len(items)} per epoch), ran {steps}; a transform failed (see above)")
    if timing:
        print(json.dumps({"bench": "baseline", "mode": a.mode, "device": str(dev), "cases": len(items), "epochs": a.epochs,
                          "steps": steps, "samples_per_s": samples / measured, "step_ms": measured / steps * 1e3,
                          "data_wait_ms": wait / steps * 1e3, "setup_s": setup_s}))
        return
    hit = next((h for h in history if h["mean_dice"] >= a.target_dice), None)
    print(json.dumps({"bench": "time_to_dice", "mode": a.mode, "device": str(dev), "cases": len(items),
                      "val_cases": len(val), "target_dice": a.target_dice,
                      "seconds": hit["seconds"] if hit else None, "epoch": hit["epoch"] if hit else None,
                      "best_dice": max(h["mean_dice"] for h in history), "history": history}))


if __name__ == "__main__":
    main()
