#!/usr/bin/env python3
"""Does every shipped recipe learn? (issue 42) Trains each job config of configs/ on its own
synthetic data, at the size stated in its row below (the shipped size where a CPU affords it),
and checks the best validation mean Dice against the row's floor. One JSON line per recipe
(`bench: recipe_learns`) with the steps trained, the best and last validation Dice, the Dice per
class at the best validation, the floor and `learns`; the exit status is 1 when a recipe stays
below its floor, so a recipe that silently learns nothing is found.

    flock /tmp/segflow-cpu.lock .venv/bin/python bench/recipes-learn.py                # every row
    .venv/bin/python bench/recipes-learn.py --recipes nnunet-like-3d,quickstart-unet3d

Needs the built segflow (--bin, default build/apps). Figures: bench/RESULTS.md.
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name -> (overrides for a CPU run, floor on the best validation mean Dice, what the size is)
RECIPES = {
    "quickstart-unet3d": ([], 0.80, "as shipped: 16 cases of 48^3, 60 epochs"),
    "nnunet-like-3d": ([], 0.70, "as shipped: 16 cases of 64^3, the planned 40 x 40 x 20 patch, 150 epochs"),
    "unet2d-slices": ([], 0.70, "as shipped: 10 cases of 64^2, 64 x 64 slices, 300 epochs"),
    "medsam-box2d": ([], 0.75, "as shipped: tiny SAM, 12 cases of 64^2, 100 epochs"),
    "spleen-ct-unet3d": (["data.synth.size=64", "data.synth.cases=8", "stages.6.options.spatial_size=[48, 48, 48]",
                          "validation.roi_size=[64, 64, 64]", "train.epochs=60", "train.val_interval=10"], 0.50,
                         "8 cases of 64^3 with 48^3 crops (the shipped 160^3 with 96^3 crops is sized for a GPU), "
                         "60 epochs"),
}
# medsam-vitb fine-tunes MedSAM's ViT-B weights (a 375 MB download, a minute per step on a CPU):
# not a row here; tests/apps/test_amp_configs.cpp trains it shrunk to a tiny SAM.
NOT_CHECKED = {"medsam-vitb": "fine-tunes MedSAM's ViT-B weights: needs the weights and a GPU"}


def records(run_dir, kind):
    """The metrics.jsonl records of `kind` ("validation", "epoch") under run_dir."""
    out = []
    for dirpath, _, files in os.walk(run_dir):
        if "metrics.jsonl" in files:
            with open(os.path.join(dirpath, "metrics.jsonl")) as f:
                out += [e for e in map(json.loads, f) if e.get("type") == kind]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipes", default=",".join(RECIPES), help="comma-separated config names")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "apps"))
    ap.add_argument("--work", default=None, help="where data and runs go (default a folder in /tmp)")
    args = ap.parse_args()
    work = args.work or os.path.join("/tmp", f"segflow-recipes-{os.getpid()}")
    os.makedirs(work, exist_ok=True)
    segflow = os.path.join(args.bin, "segflow")
    failed = False
    for name in args.recipes.split(","):
        if name in NOT_CHECKED:
            print(json.dumps({"bench": "recipe_learns", "recipe": name, "checked": False,
                              "why": NOT_CHECKED[name]}), flush=True)
            continue
        if name not in RECIPES:
            sys.exit(f"recipes-learn: no row for '{name}' (rows: {', '.join(RECIPES)})")
        sets, floor, size = RECIPES[name]
        run_dir = os.path.join(work, "run-" + name)
        data = os.path.join(work, "data-" + name)
        cmd = [segflow, "train", os.path.join(ROOT, "configs", name + ".yaml"), "--run-dir", run_dir, "--quiet",
               "--set", "data.root=" + data]
        for s in sets:
            cmd += ["--set", s]
        t0 = time.time()
        r = subprocess.run(cmd, capture_output=True, text=True)
        seconds = time.time() - t0
        vals = records(run_dir, "validation")
        line = {"bench": "recipe_learns", "recipe": name, "size": size, "exit_code": r.returncode,
                "seconds": round(seconds, 1), "steps": sum(e.get("steps", 0) for e in records(run_dir, "epoch")), "validations": len(vals),
                "floor": floor}
        if vals:
            best = max(vals, key=lambda e: e["mean_dice"])
            line.update({"best_dice": round(best["mean_dice"], 4), "best_epoch": best["epoch"],
                         "last_dice": round(vals[-1]["mean_dice"], 4),
                         "dice_by_class": {k: round(v, 4) for k, v in best.get("dice_by_class", {}).items()}})
        line["learns"] = bool(r.returncode == 0 and vals and line["best_dice"] >= floor)
        if r.returncode != 0:
            line["error"] = (r.stderr or r.stdout)[-600:]
        failed |= not line["learns"]
        print(json.dumps(line), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
