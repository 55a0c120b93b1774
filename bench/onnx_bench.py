#!/usr/bin/env python3
"""segflow infer against onnxruntime running the exported model from its manifest.

    .venv/bin/python bench/onnx_bench.py CHECKPOINT IMAGE.nii.gz [--reps 3] [--threads 2]

Exports CHECKPOINT with `segflow export --to onnx`, then alternates, --reps times each, two
whole processes on the same scan with the same thread count: `segflow infer` and
tests/tools/onnx_check.py's manifest-driven runtime (nibabel + numpy preprocessing, MONAI's
sliding_window_inference, onnxruntime's CPU provider). Both include their start-up (LibTorch /
Python imports). Prints one JSON line per run and a summary line with the medians and the
ratio onnxruntime / segflow (> 1: segflow faster), plus the label agreement of the last pair.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(cmd, env):
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"onnx_bench: {' '.join(cmd)} failed:\n{r.stderr}{r.stdout}")
    return time.perf_counter() - t0, r.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("image")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--segflow", default=os.path.join(ROOT, "build", "apps", "segflow"))
    a = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), ORT_THREADS=str(a.threads))
    with tempfile.TemporaryDirectory() as tmp:
        onnx = os.path.join(tmp, "model.onnx")
        timed([a.segflow, "export", "--checkpoint", a.checkpoint, "--to", "onnx", onnx], env)
        seg = os.path.join(tmp, "seg.nii.gz")
        times = {"segflow": [], "onnxruntime": []}
        last = None
        for rep in range(a.reps):
            s, _ = timed([a.segflow, "infer", "--checkpoint", a.checkpoint, "--input", a.image, "--output", seg,
                          "--device", "cpu", "--quiet"], env)
            o, out = timed([sys.executable, "-W", "ignore", os.path.join(ROOT, "tests", "tools", "onnx_check.py"),
                            "infer", os.path.join(tmp, "model.manifest.json"), a.image, seg], env)
            last = json.loads(out.strip().splitlines()[-1])
            times["segflow"].append(s)
            times["onnxruntime"].append(o)
            print(json.dumps({"bench": "onnx_vs_segflow_infer", "rep": rep, "segflow_infer_s": round(s, 3),
                              "onnxruntime_s": round(o, 3)}))
        ms, mo = statistics.median(times["segflow"]), statistics.median(times["onnxruntime"])
        print(json.dumps({"bench": "onnx_vs_segflow_infer", "summary": True, "image": os.path.basename(a.image),
                          "threads": a.threads, "reps": a.reps, "segflow_infer_median_s": round(ms, 3),
                          "onnxruntime_median_s": round(mo, 3), "ratio_onnxruntime_over_segflow": round(mo / ms, 3),
                          "label_agreement": last["agreement"]}))


if __name__ == "__main__":
    main()
