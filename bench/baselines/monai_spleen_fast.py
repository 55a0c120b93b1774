"""MONAI's fast-training spleen recipe (the tutorial that made its name: "fast_training_tutorial",
deterministic transforms cached once and moved to the device with EnsureTyped(device=...),
ThreadDataLoader with no worker processes, set_track_meta(False), DiceCELoss, SGD, AMP) on the
same data, network and crops as segflow's configs/spleen-ct-unet3d.yaml, so that
bench/spleen-bench.sh can put the two side by side in one run:

  data     an MSD folder (imagesTr/*_0000.nii.gz, labelsTr/*.nii.gz), e.g. segflow synth's;
           the train/val cases of a segflow run's split.json when --split is given
  det.     LoadImaged, EnsureChannelFirstd, Orientationd(RAS), Spacingd(1.5, 1.5, 2.0),
           ScaleIntensityRanged(-57, 164 -> 0, 1, clip), CropForegroundd, SpatialPadd(crop)
           (segflow's crop pads volumes smaller than the crop), FgBgToIndicesd,
           EnsureTyped(device=--cache-device, track_meta=False)
  random   RandCropByPosNegLabeld(crop^3, pos 1, neg 1, num_samples 4): segflow's config has no
           other random stage, so neither has this (MONAI's tutorial adds flips, rotations and
           intensity jitter at 10 %)
  network  MONAI UNet 16-32-64-128-256, strides 2, 2 residual units, batch norm, 5 classes
  train    DiceCELoss(to_onehot_y, softmax), SGD lr 0.2 momentum 0.9 wd 4e-5, 4 crops per
           step, autocast (--amp bf16 as segflow's config; fp16 uses a GradScaler)
  validate sliding_window_inference(roi^3, sw_batch 4, overlap 0.5, gaussian), DiceMetric
           over the foreground classes (mean over classes of the per-class mean over cases)

--segflow-cache DIR trains MONAI's loop on segflow's deterministic cache instead of MONAI's own
(the files of a disk cache written by `segflow train CONFIG --set train.disk_cache=DIR --set
train.cache_dtype=none` with the same stages): every training case's image, label and crop
centres as segflow's stages made them, turned from segflow's (C, z, y, x) into MONAI's
(C, x, y, z) and padded to the crop as SpatialPadd does; validation stays MONAI's. It tells
a difference in the data path from one in the training loop.

Prints JSON lines: {"bench": "baseline", "mode": "monai_fast_spleen", samples_per_s, step_ms,
data_wait_ms, setup_s, peak memory, ...} over --epochs after one warm-up epoch, or with
--target-dice T[,T2...] {"bench": "time_to_dice", ...} (per target, the wall time from the start of
caching until the validation Dice first reaches it, validating every --val-interval epochs; the
run stops at the highest target or --max-epochs, or after --max-seconds). With --throughput,
time-to-Dice mode also prints a "baseline" line first, measured over its training epochs after
the first (validation left out), with the wall-clock window of each measured epoch ("windows":
[[start, end], ...] in Unix seconds) so that a GPU utilisation sampler can be cut to them:
scripts/gpu_check.py gets samples/s and time to Dice from one process this way.
"""
import argparse
import glob
import json
import os
import resource
import struct
import time

import numpy as np
import torch


def cases(root):
    out = []
    for p in sorted(glob.glob(os.path.join(root, "imagesTr", "*_0000.nii.gz"))):
        cid = os.path.basename(p)[: -len("_0000.nii.gz")]
        out.append({"id": cid, "image": p, "label": os.path.join(root, "labelsTr", cid + ".nii.gz")})
    if not out:
        raise SystemExit(f"{root}: no imagesTr/*_0000.nii.gz (an MSD dataset, e.g. segflow synth --format nifti)")
    return out


def transforms(crop, cache_device):
    from monai.transforms import (CropForegroundd, EnsureChannelFirstd, EnsureTyped, FgBgToIndicesd, LoadImaged,
                                  Orientationd, RandCropByPosNegLabeld, ScaleIntensityRanged, Spacingd, SpatialPadd)

    keys = ["image", "label"]
    det = [
        LoadImaged(keys=keys),
        EnsureChannelFirstd(keys=keys),
        Orientationd(keys=keys, axcodes="RAS"),
        Spacingd(keys=keys, pixdim=(1.5, 1.5, 2.0), mode=("bilinear", "nearest")),
        ScaleIntensityRanged(keys=["image"], a_min=-57, a_max=164, b_min=0.0, b_max=1.0, clip=True),
        CropForegroundd(keys=keys, source_key="image", allow_smaller=True),
        SpatialPadd(keys=keys, spatial_size=(crop, crop, crop)),
        FgBgToIndicesd(keys="label", fg_postfix="_fg", bg_postfix="_bg", image_key="image"),
        EnsureTyped(keys=keys, device=cache_device, track_meta=False),
    ]
    rnd = [
        RandCropByPosNegLabeld(keys=keys, label_key="label", spatial_size=(crop, crop, crop), pos=1, neg=1,
                               num_samples=4, fg_indices_key="label_fg", bg_indices_key="label_bg"),
    ]
    val = det[:7] + [EnsureTyped(keys=keys, device=cache_device, track_meta=False)]
    return det + rnd, val


SFC_DTYPES = {"float32": np.float32, "float64": np.float64, "float16": np.float16, "uint8": np.uint8,
              "int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64, "bool": np.bool_}


def read_sfc(path):
    """One file of segflow's disk cache (pipeline/cache/disk_cache.cpp): a 40-byte fixed header
    (magic SFCACHE1, version, header length, payload length, two hashes), a JSON header naming
    each tensor's dtype, shape and offset, then the payload from the next multiple of 64 bytes."""
    b = open(path, "rb").read()
    if len(b) < 40 or b[:8] != b"SFCACHE1":
        raise SystemExit(f"{path}: not a segflow disk cache file (no SFCACHE1 magic)")
    (version, header_bytes) = struct.unpack_from("<II", b, 8)
    if version != 1:
        raise SystemExit(f"{path}: disk cache version {version}, this reader knows version 1")
    header = json.loads(b[40:40 + header_bytes])
    payload = (40 + header_bytes + 63) // 64 * 64
    tensors = {}
    for t in header["tensors"]:
        if t["dtype"] not in SFC_DTYPES:
            raise SystemExit(f"{path}: tensor '{t['name']}' has dtype {t['dtype']}, not one this reader knows")
        dt = np.dtype(SFC_DTYPES[t["dtype"]])
        tensors[t["name"]] = np.frombuffer(b, dtype=dt, count=t["bytes"] // dt.itemsize,
                                           offset=payload + t["offset"]).reshape(t["shape"]).copy()
    return header["id"], tensors


def segflow_cases(cache_dir, ids, crop):
    """The training cases of `ids` from segflow's disk cache, in MONAI's layout, padded to `crop`
    (symmetric, zeros, as SpatialPadd) with the crop-centre indices moved onto the padded grid."""
    found = {}
    for path in glob.glob(os.path.join(cache_dir, "*.sfc")):
        cid, tensors = read_sfc(path)
        found[cid] = (path, tensors)
    out = []
    for cid in ids:
        if cid not in found:
            raise SystemExit(f"{cache_dir}: no cached sample of case {cid} (written by a segflow run on this split?)")
        path, t = found[cid]
        need = {"image": "float32", "label": None, "fg_indices": "int64", "bg_indices": "int64"}
        for name, dtype in need.items():
            if name not in t or (dtype and t[name].dtype != np.dtype(dtype)):
                raise SystemExit(f"{path}: tensor '{name}' missing or not {dtype} (has {sorted(t)}); write the "
                                 "cache with train.cache_dtype: none and an fg_bg_indices stage")
        zyx = t["image"].shape[1:]
        xyz = zyx[::-1]
        padded = [max(n, crop) for n in xyz]
        before = [(p - n) // 2 for p, n in zip(padded, xyz)]
        pad = []  # torch's pad lists the last dim (z in MONAI's layout) first
        for d in (2, 1, 0):
            pad += [before[d], padded[d] - xyz[d] - before[d]]
        to_monai = lambda a: torch.nn.functional.pad(torch.from_numpy(a).permute(0, 3, 2, 1).float(), pad)

        def move(flat):
            z, y, x = np.unravel_index(flat, zyx)
            return np.ravel_multi_index((x + before[0], y + before[1], z + before[2]), padded)

        out.append({"image": to_monai(t["image"]), "label": to_monai(t["label"]),
                    "label_fg": move(t["fg_indices"]), "label_bg": move(t["bg_indices"])})
    return out


def network():
    from monai.networks.layers import Norm
    from monai.networks.nets import UNet

    return UNet(spatial_dims=3, in_channels=1, out_channels=5, channels=(16, 32, 64, 128, 256), strides=(2, 2, 2, 2),
                num_res_units=2, norm=Norm.BATCH)


def validate(net, val_loader, roi, dev, amp_dtype):
    from monai.data import decollate_batch
    from monai.inferers import sliding_window_inference
    from monai.metrics import DiceMetric
    from monai.networks.utils import one_hot

    metric = DiceMetric(include_background=False, reduction="mean_batch", ignore_empty=True)
    net.eval()
    with torch.no_grad():
        for batch in val_loader:
            x, y = batch["image"].to(dev), batch["label"].to(dev)
            with torch.autocast(dev.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                logits = sliding_window_inference(x, (roi, roi, roi), 4, net, overlap=0.5, mode="gaussian")
            pred = logits.float().argmax(1, keepdim=True)
            metric(one_hot(pred, 5), one_hot(y.long(), 5))
    net.train()
    per_class = metric.aggregate()
    return float(torch.nanmean(per_class)), [float(v) for v in per_class]


def targets_arg(text):
    try:
        out = sorted(float(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected Dice targets such as 0.3,0.5, got '{text}'")
    if not out or not all(0 < t <= 1 for t in out):
        raise argparse.ArgumentTypeError(f"expected Dice targets in (0, 1], got '{text}'")
    return out


def hits(history, targets):
    """Per target (as text), the first validation at or over it: {"seconds", "epoch"}, or None."""
    first = lambda t: next(({"seconds": h["seconds"], "epoch": h["epoch"]} for h in history if h["mean_dice"] >= t), None)
    return {f"{t:g}": first(t) for t in targets}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--split", help="a segflow run's split.json (train on its train ids, validate on its val ids)")
    ap.add_argument("--crop", type=int, default=96, help="crop edge in voxels (the config's 96)")
    ap.add_argument("--roi", type=int, default=160, help="sliding-window edge for validation (the config's 160)")
    ap.add_argument("--epochs", type=int, default=3, help="measured epochs (after one warm-up epoch)")
    ap.add_argument("--target-dice", type=targets_arg, help="time-to-Dice mode: one target or a comma list")
    ap.add_argument("--max-epochs", type=int, default=300)
    ap.add_argument("--val-interval", type=int, default=10)
    ap.add_argument("--amp", choices=["none", "bf16", "fp16"], default="bf16")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--cache-device", help="where the deterministic cache lives (default: --device)")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0: torch's default)")
    ap.add_argument("--cache-workers", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0, help="weights, crops and augmentation (the data stay)")
    ap.add_argument("--lr", type=float, default=0.2, help="SGD learning rate (the recipe's 0.2)")
    ap.add_argument("--max-seconds", type=float, help="time-to-Dice mode: stop after this many seconds from the "
                    "start of caching (at the end of an epoch); the target then counts as not reached")
    ap.add_argument("--throughput", action="store_true", help="time-to-Dice mode: also print samples/s over the "
                    "training epochs after the first (a 'baseline' line with each epoch's window)")
    ap.add_argument("--segflow-cache", help="train on segflow's deterministic cache in this disk-cache folder "
                    "(train.cache_dtype: none) instead of MONAI's own; needs --split")
    a = ap.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    from monai.data import CacheDataset, DataLoader, Dataset, ThreadDataLoader, set_track_meta
    from monai.losses import DiceCELoss
    from monai.utils import set_determinism

    set_determinism(seed=a.seed)
    dev = torch.device(a.device)
    cache_dev = torch.device(a.cache_device or a.device)
    items = cases(a.data)
    val_items = []
    if a.split:
        split = json.load(open(a.split))
        by_id = {i["id"]: i for i in items}
        missing = [c for c in split["train"] + split["val"] if c not in by_id]
        if missing:
            raise SystemExit(f"{a.split}: cases not in {a.data}: {missing}")
        items, val_items = [by_id[c] for c in split["train"]], [by_id[c] for c in split["val"]]
    if a.target_dice is not None and not val_items:
        raise SystemExit("--target-dice needs --split (the held-out cases to validate on)")
    amp_dtype = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}[a.amp]
    if amp_dtype == torch.float16 and dev.type != "cuda":
        raise SystemExit("--amp fp16 needs CUDA (use bf16 on a CPU)")

    train_tf, val_tf = transforms(a.crop, cache_dev)
    t_start = time.perf_counter()
    if a.segflow_cache:
        if not a.split:
            raise SystemExit("--segflow-cache needs --split (the cache holds segflow's cases by id)")
        # Only the random crop runs per step; the tensors move to the cache device as MONAI's own
        # EnsureTyped(device=...) would put them.
        recs = [{k: v.to(cache_dev) if torch.is_tensor(v) else v for k, v in r.items()}
                for r in segflow_cases(a.segflow_cache, split["train"], a.crop)]
        train_ds = Dataset(recs, transform=train_tf[-1])
    else:
        train_ds = CacheDataset(items, transform=train_tf, cache_rate=1.0, num_workers=a.cache_workers,
                                progress=False)
    val_ds = CacheDataset(val_items, transform=val_tf, cache_rate=1.0, num_workers=a.cache_workers,
                          progress=False) if val_items else None
    setup_s = time.perf_counter() - t_start
    set_track_meta(False)  # as the tutorial: plain tensors from here on
    # 1 item x num_samples 4 = the config's 4 crops per step.
    loader = ThreadDataLoader(train_ds, num_workers=0, batch_size=1, shuffle=True)
    val_loader = DataLoader(val_ds, batch_size=1, num_workers=0) if val_ds else None

    net = network().to(dev)
    loss_fn = DiceCELoss(to_onehot_y=True, softmax=True)
    opt = torch.optim.SGD(net.parameters(), lr=a.lr, momentum=0.9, weight_decay=4e-5)
    scaler = torch.amp.GradScaler("cuda", enabled=amp_dtype == torch.float16)
    if dev.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.cuda.reset_peak_memory_stats(dev)

    timing = a.target_dice is None
    epochs = a.epochs + 1 if timing else a.max_epochs
    steps = samples = 0
    measured = wait = 0.0
    history = []
    tp = {"steps": 0, "samples": 0, "seconds": 0.0, "wait": 0.0, "windows": []}  # --throughput
    epochs_run, stopped = 0, "max_epochs"
    for epoch in range(epochs):
        t0, wall0 = time.perf_counter(), time.time()
        t_wait = t0
        for batch in loader:
            x, y = batch["image"].to(dev, non_blocking=True), batch["label"].to(dev, non_blocking=True)
            w = time.perf_counter() - t_wait
            opt.zero_grad(set_to_none=True)
            with torch.autocast(dev.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                loss = loss_fn(net(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            if epoch > 0 or not timing:
                steps += 1
                samples += x.shape[0]
                wait += w
            if epoch > 0:
                tp["steps"], tp["samples"], tp["wait"] = tp["steps"] + 1, tp["samples"] + x.shape[0], tp["wait"] + w
            t_wait = time.perf_counter()
        if epoch > 0 or not timing:
            measured += time.perf_counter() - t0
        if epoch > 0:
            tp["seconds"] += time.perf_counter() - t0
            tp["windows"].append([round(wall0, 3), round(time.time(), 3)])
        epochs_run += 1
        if not timing and (epoch + 1) % a.val_interval == 0:
            dice, per_class = validate(net, val_loader, a.roi, dev, amp_dtype)
            history.append({"epoch": epoch + 1, "seconds": time.perf_counter() - t_start, "mean_dice": dice,
                            "dice_per_class": per_class})
            if dice >= a.target_dice[-1]:
                stopped = "target"
                break
        if not timing and a.max_seconds is not None and time.perf_counter() - t_start >= a.max_seconds:
            stopped = "max_seconds"
            break
    ran = (a.epochs if timing else epochs_run) * len(items)
    if steps != ran:
        raise SystemExit(f"monai_fast_spleen: expected {ran} steps ({len(items)} per epoch), ran {steps}; "
                         "a transform failed (see above)")
    import monai

    versions = {"monai": monai.__version__, "torch": torch.__version__, "numpy": np.__version__}
    common = {"mode": "monai_fast_spleen", "device": str(dev), "cache_device": str(cache_dev), "amp": a.amp,
              "versions": versions,
              "train_data": "segflow_cache" if a.segflow_cache else "monai",
              "cases": len(items), "crop": a.crop, "setup_s": setup_s,
              "peak_host_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
              "peak_device_mb": torch.cuda.max_memory_allocated(dev) / 2**20 if dev.type == "cuda" else None}
    if timing:
        print(json.dumps({"bench": "baseline", "name": "monai_fast_spleen", **common, "epochs": a.epochs,
                          "steps": steps, "samples_per_s": samples / measured, "step_ms": measured / steps * 1e3,
                          "data_wait_ms": wait / steps * 1e3}))
        return
    if a.throughput:
        n = tp["steps"]
        print(json.dumps({"bench": "baseline", "name": "monai_fast_spleen", **common, "epochs": epochs_run - 1,
                          "steps": n, "samples_per_s": tp["samples"] / tp["seconds"] if n else None,
                          "step_ms": tp["seconds"] / n * 1e3 if n else None,
                          "data_wait_ms": tp["wait"] / n * 1e3 if n else None,
                          "measured": "training epochs after the first, validation left out",
                          "windows": tp["windows"]}))
    reached = hits(history, a.target_dice)
    hit = reached[f"{a.target_dice[-1]:g}"]
    print(json.dumps({"bench": "time_to_dice", "name": "monai_fast_spleen", **common, "seed": a.seed,
                      "val_cases": len(val_items), "targets": reached,
                      "target_dice": a.target_dice[-1], "seconds": hit["seconds"] if hit else None,
                      "epoch": hit["epoch"] if hit else None,
                      "best_dice": max(h["mean_dice"] for h in history) if history else None,
                      "epochs_run": epochs_run, "stopped": stopped, "history": history}))


if __name__ == "__main__":
    main()
