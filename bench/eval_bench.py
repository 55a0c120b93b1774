#!/usr/bin/env python3
"""`segflow eval` against MONAI 1.4 on one label-map pair: JSON lines.

usage: .venv/bin/python bench/eval_bench.py [--shape 512,512,100] [--spacing 0.8,0.8,2.5] [--repeat 3]

Writes a ground truth and a prediction (5 classes, two of them one-sided) with
tests/tools/monai_metrics.py, then times, as separate processes and including the reads:
  eval_segflow            segflow eval --json on the pair (same grid)
  eval_segflow_resampled  the prediction on another grid (padded, shifted, flipped), mapped first
  eval_monai              monai_metrics.py score: MONAI's compute_dice/iou/hausdorff/
                          average_surface_distance/surface_dice on the same files (one run;
                          includes Python's and MONAI's import, about 5-10 s here)
Each line: name, step_ms (wall time per case, the best of --repeat), samples_per_s (cases/s),
cpu_s (user + system seconds: less sensitive to a busy machine), peak_rss_mb, device,
config; the segflow lines also the Dice of class 1 and the largest difference to MONAI's
numbers over every class and metric.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd):
    """(wall seconds, peak RSS MiB, stdout, CPU seconds (user + system)) of one child."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err)
        _, status, usage = os.wait4(p.pid, 0)
        dt = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if p.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed: {err.read().decode()}")
        return dt, usage.ru_maxrss / 1024.0, out.read().decode(), usage.ru_utime + usage.ru_stime


def max_difference(ours, monai):
    worst = 0.0
    for c, m in monai["classes"].items():
        o = ours["cases"][0]["classes"][c]
        for k in ("dice", "iou", "hd95", "assd", "nsd", "volume_pred_ml", "volume_gt_ml"):
            if isinstance(m[k], (int, float)) and m[k] is not None and o[k] is not None:
                worst = max(worst, abs(o[k] - m[k]))
    return worst


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="512,512,100")
    ap.add_argument("--spacing", default="0.8,0.8,2.5")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    binary = os.path.join(os.environ.get("SEGFLOW_BIN", os.path.join(ROOT, "build", "apps")), "segflow")
    script = os.path.join(ROOT, "tests", "tools", "monai_metrics.py")
    config = {"shape": [int(v) for v in a.shape.split(",")], "spacing": [float(v) for v in a.spacing.split(",")],
              "classes": 5, "tolerance_mm": 2.0, "threads": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, script, "make", tmp, "--shape", a.shape, "--spacing", a.spacing],
                       check=True, capture_output=True)
        gt = os.path.join(tmp, "gt.nii.gz")
        t_monai, rss_monai, ref, cpu_monai = run([sys.executable, script, "score", os.path.join(tmp, "pred.nii.gz"),
                                                  gt, "--classes", "1,2,3,4,5", "--tolerance", "2"])
        monai = json.loads(ref)
        for name, pred in (("eval_segflow", "pred.nii.gz"), ("eval_segflow_resampled", "pred_moved.nii.gz")):
            times, cpus, rss, out = [], [], 0.0, ""
            for _ in range(a.repeat):
                dt, peak, out, cpu = run([binary, "eval", "--pred", os.path.join(tmp, pred), "--gt", gt, "--json"])
                times.append(dt)
                cpus.append(cpu)
                rss = max(rss, peak)
            ours = json.loads(out)
            best = min(times)
            print(json.dumps({"name": name, "step_ms": round(best * 1000, 1), "samples_per_s": round(1 / best, 3),
                              "cpu_s": round(min(cpus), 2), "peak_rss_mb": round(rss, 1), "device": "cpu",
                              "config": config,
                              "dice_class_1": ours["cases"][0]["classes"]["1"]["dice"],
                              "max_abs_difference_to_monai": max_difference(ours, monai)}))
        print(json.dumps({"name": "eval_monai", "step_ms": round(t_monai * 1000, 1),
                          "samples_per_s": round(1 / t_monai, 3), "cpu_s": round(cpu_monai, 2),
                          "peak_rss_mb": round(rss_monai, 1),
                          "device": "cpu", "config": config}))


if __name__ == "__main__":
    main()
