#!/usr/bin/env python3
"""segflow infer --boxes against onnxruntime running the exported SAM (encoder + decoder).

    .venv/bin/python bench/sam_onnx_bench.py CHECKPOINT IMAGE.nii.gz BOXES.json [--reps 3] [--threads 2]

Exports the SAM CHECKPOINT with `segflow export --to onnx` (OUT.encoder.onnx, OUT.decoder.onnx,
OUT.manifest.json), then alternates, --reps times each, on the same scan, boxes and thread count:
`segflow infer --boxes` and tests/tools/sam_onnx_check.py's manifest-driven runtime (nibabel +
numpy preprocessing, torch's interpolate for the resizes, onnxruntime's CPU provider; one image
embedding per slice, as segflow). Both are whole processes (LibTorch / Python imports included);
each also reports its own in-process time (segflow's "seconds": checkpoint load to written
labels; the runtime's "seconds": manifest read and sessions to the label map, and "network_s":
the encoder and decoder runs only). Prints one JSON line per run and a summary with the medians,
the ratio onnxruntime / segflow (> 1: segflow faster) and the label agreement of the last pair.
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
        sys.exit(f"sam_onnx_bench: {' '.join(cmd)} failed:\n{r.stderr}{r.stdout}")
    return time.perf_counter() - t0, r.stdout


def last_json(out):
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("image")
    ap.add_argument("boxes")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--segflow", default=os.path.join(ROOT, "build", "apps", "segflow"))
    a = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), ORT_THREADS=str(a.threads))
    check = os.path.join(ROOT, "tests", "tools", "sam_onnx_check.py")
    with tempfile.TemporaryDirectory() as tmp:
        onnx = os.path.join(tmp, "sam.onnx")
        timed([a.segflow, "export", "--checkpoint", a.checkpoint, "--to", "onnx", onnx], env)
        seg = os.path.join(tmp, "seg.nii.gz")
        keys = ["segflow_s", "onnxruntime_s", "segflow_inproc_s", "onnxruntime_inproc_s", "onnxruntime_network_s"]
        times = {k: [] for k in keys}
        last = None
        for rep in range(a.reps):
            s, out = timed([a.segflow, "infer", "--checkpoint", a.checkpoint, "--input", a.image, "--output", seg,
                            "--boxes", a.boxes, "--device", "cpu"], env)
            inproc = last_json(out).get("seconds", float("nan"))
            o, out = timed([sys.executable, "-W", "ignore", check, "infer", os.path.join(tmp, "sam.manifest.json"),
                            a.image, a.boxes, seg], env)
            last = last_json(out)
            row = [s, o, inproc, last["seconds"], last["network_s"]]
            for k, v in zip(keys, row):
                times[k].append(v)
            print(json.dumps({"bench": "sam_onnx_vs_segflow_boxes", "rep": rep,
                              **{k: round(v, 4) for k, v in zip(keys, row)}}))
        med = {k: statistics.median(v) for k, v in times.items()}
        print(json.dumps({"bench": "sam_onnx_vs_segflow_boxes", "summary": True,
                          "image": os.path.basename(a.image), "threads": a.threads, "reps": a.reps,
                          **{k + "_median": round(v, 4) for k, v in med.items()},
                          "ratio_onnxruntime_over_segflow": round(med["onnxruntime_s"] / med["segflow_s"], 3),
                          "ratio_inproc": round(med["onnxruntime_inproc_s"] / med["segflow_inproc_s"], 3),
                          "label_agreement": last["agreement"]}))


if __name__ == "__main__":
    main()
