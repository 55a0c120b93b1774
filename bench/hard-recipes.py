#!/usr/bin/env python3
"""Recipes and networks on data that separates them (issue 42 item 6). The normal phantoms are
learnt by every recipe (the quickstart reaches Dice 0.94), so this writes `segflow synth
--difficulty hard` data (unenhanced-CT contrast, strong noise and bias field, a thin spleen on
the left kidney, the right kidney against the liver, 0.7 x 0.7 x 5 mm voxels), trains each arm
on the same training cases for the same wall time, and scores every arm's best checkpoint on
the same held-out test cases (segflow infer, then segflow eval):

    quickstart   configs/quickstart-unet3d.yaml (MONAI's UNet, 48^3 crops)
    plan         segflow train DATASET: nnU-Net's default planner, PlainConvUNet
    resenc-m     segflow train DATASET --preset resenc-m: ResEnc M, ResidualEncoderUNet

One JSON line per arm (`bench: hard_recipes`): steps, epochs, wall seconds, the test cases'
Dice per class and its mean, the network and patch; then one line with each arm's mean Dice
relative to the quickstart's.

    flock /tmp/segflow-cpu.lock .venv/bin/python bench/hard-recipes.py [--budget-s 300] [--cases 16]
        [--test-cases 6] [--size 64] [--arms quickstart,plan,resenc-m]

Needs the built segflow (--bin, default build/apps). Figures: bench/RESULTS.md.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"hard-recipes: {' '.join(cmd)} failed ({r.returncode}):\n{(r.stderr or r.stdout)[-1500:]}")
    return r


def records(run_dir, kind):
    out = []
    for dirpath, _, files in os.walk(run_dir):
        if "metrics.jsonl" in files:
            with open(os.path.join(dirpath, "metrics.jsonl")) as f:
                out += [e for e in map(json.loads, f) if e.get("type") == kind]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget-s", type=int, default=300, help="training wall time per arm")
    ap.add_argument("--cases", type=int, default=16)
    ap.add_argument("--test-cases", type=int, default=6)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--arms", default="quickstart,plan,resenc-m")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "apps"))
    ap.add_argument("--work", default=None)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    segflow = os.path.join(a.bin, "segflow")
    work = a.work or f"/tmp/segflow-hard-{os.getpid()}"
    os.makedirs(work, exist_ok=True)
    train_ds, test_ds = os.path.join(work, "train"), os.path.join(work, "test")
    for ds, n, seed in ((train_ds, a.cases, 21), (test_ds, a.test_cases, 22)):
        if not os.path.exists(os.path.join(ds, "dataset.json")):
            run([segflow, "synth", "--out", ds, "--cases", str(n), "--size", str(a.size), "--seed", str(seed),
                 "--difficulty", "hard"])
    # The test cases as segflow infer input and segflow eval reference (same file names).
    images, labels = os.path.join(work, "test_images"), os.path.join(work, "test_labels")
    os.makedirs(images, exist_ok=True)
    os.makedirs(labels, exist_ok=True)
    for f in sorted(os.listdir(os.path.join(test_ds, "labelsTr"))):
        cid = f[: -len(".nii.gz")]
        for src, dst in ((f"{test_ds}/imagesTr/{cid}_0000.nii.gz", f"{images}/{cid}.nii.gz"),
                         (f"{test_ds}/labelsTr/{cid}.nii.gz", f"{labels}/{cid}.nii.gz")):
            if not os.path.exists(dst):
                os.symlink(src, dst)

    results = {}
    for arm in a.arms.split(","):
        run_dir = os.path.join(work, "run-" + arm)
        shutil.rmtree(run_dir, ignore_errors=True)
        common = ["--run-dir", run_dir, "--quiet"]
        if arm == "quickstart":
            cmd = [segflow, "train", os.path.join(ROOT, "configs", "quickstart-unet3d.yaml"), "--set",
                   "data.root=" + train_ds, "--set", "train.epochs=100000", "--set", "train.val_interval=5"] + common
        elif arm in ("plan", "resenc-m", "resenc-l"):
            preset = "default" if arm == "plan" else arm
            cmd = [segflow, "train", train_ds, "--preset", preset, "--plans", os.path.join(work, "plans-" + arm),
                   "--set", "train.epochs=100000", "--set", "train.val_interval=5",
                   "--set", "train.checkpoint_interval=5"] + common
        else:
            sys.exit(f"hard-recipes: unknown arm {arm}")
        t0 = time.time()
        r = subprocess.run(["timeout", str(a.budget_s)] + cmd, capture_output=True, text=True)
        wall = time.time() - t0
        if r.returncode not in (0, 124):
            sys.exit(f"hard-recipes: {arm}: exit {r.returncode}:\n{(r.stderr or r.stdout)[-1500:]}")
        ckpt = None
        for dirpath, _, files in os.walk(run_dir):
            for name in ("best.pt", "last.pt"):
                if name in files and ckpt is None:
                    ckpt = os.path.join(dirpath, name)
        if ckpt is None:
            sys.exit(f"hard-recipes: {arm}: no checkpoint after {wall:.0f} s (raise --budget-s)")
        pred = os.path.join(work, "pred-" + arm)
        shutil.rmtree(pred, ignore_errors=True)
        run([segflow, "infer", "--checkpoint", ckpt, "--input", images, "--output", pred, "--quiet"])
        ev = json.loads(run([segflow, "eval", "--pred", pred, "--gt", labels, "--json"]).stdout)
        per = {k: round(v["dice"], 4) for k, v in ev.get("mean", {}).items() if v.get("dice") is not None}
        epochs = records(run_dir, "epoch")
        config = {}
        for dirpath, _, files in os.walk(run_dir):
            if "config.json" in files and not config:
                config = json.load(open(os.path.join(dirpath, "config.json")))
        model = config.get("model", {})
        line = {"bench": "hard_recipes", "arm": arm, "budget_s": a.budget_s, "wall_s": round(wall, 1),
                "steps": sum(e.get("steps", 0) for e in epochs), "epochs": len(epochs),
                "checkpoint": os.path.basename(ckpt), "network": model.get("name"),
                "batch_size": config.get("train", {}).get("batch_size"),
                "test_dice_by_class": per, "test_mean_dice": round(sum(per.values()) / len(per), 4) if per else None,
                "cases": a.cases, "test_cases": a.test_cases, "size": a.size}
        results[arm] = line
        print(json.dumps(line), flush=True)
    base = results.get("quickstart", {}).get("test_mean_dice")
    if base:
        print(json.dumps({"bench": "hard_recipes_ratios", "base": "quickstart",
                          **{arm: round(r["test_mean_dice"] / base, 3) for arm, r in results.items()
                             if r.get("test_mean_dice") is not None}}), flush=True)
    if not a.keep and not a.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
