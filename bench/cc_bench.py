#!/usr/bin/env python3
"""Connected components of a 512 x 512 x 300 synthetic label map's foreground: segflow vs
scipy.ndimage.label vs cc3d (connected-components-3d), in one run. JSON lines.

usage: .venv/bin/python bench/cc_bench.py [--shape 300,512,512] [--connectivity 26] [--repeat 3]

The map: 12 ellipsoid "organs" of 4 classes plus 20000 speckles of 1-30 voxels (a noisy
prediction's stray islands), about 8% foreground; the mask is label > 0. Each line: name,
seconds (best of --repeat; segflow's measured inside segflow_cc_bench, excluding its file
read; scipy's and cc3d's around the call), components, ratio (seconds / segflow's seconds),
config. The component counts must agree.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import cc3d
import numpy as np
from scipy import ndimage

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def label_map(shape, seed=0):
    rng = np.random.default_rng(seed)
    z, y, x = shape
    lab = np.zeros(shape, np.uint8)
    zz, yy, xx = np.ogrid[:z, :y, :x]
    for i in range(12):
        c = rng.uniform([0.2 * z, 0.2 * y, 0.2 * x], [0.8 * z, 0.8 * y, 0.8 * x])
        r = rng.uniform([0.04 * z, 0.04 * y, 0.04 * x], [0.12 * z, 0.12 * y, 0.12 * x])
        inside = ((zz - c[0]) / r[0]) ** 2 + ((yy - c[1]) / r[1]) ** 2 + ((xx - c[2]) / r[2]) ** 2 <= 1
        lab[inside] = 1 + i % 4
    for _ in range(20000):
        p = rng.integers([0, 0, 0], [z - 4, y - 4, x - 4])
        s = rng.integers(1, 4, size=3)
        lab[p[0]:p[0] + s[0], p[1]:p[1] + s[1], p[2]:p[2] + s[2]] = rng.integers(1, 5)
    return lab


def best_of(fn, repeat):
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="300,512,512")
    ap.add_argument("--connectivity", type=int, default=26)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    shape = tuple(int(s) for s in a.shape.split(","))
    mask = label_map(shape) > 0
    config = {"shape": list(shape), "connectivity": a.connectivity, "foreground": float(mask.mean()),
              "threads": 1}
    binary = os.path.join(os.environ.get("SEGFLOW_BENCH_BIN", os.path.join(ROOT, "build", "bench")),
                          "segflow_cc_bench")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "mask.npy")
        np.save(path, mask.astype(np.uint8))
        p = subprocess.run([binary, path, "--connectivity", str(a.connectivity), "--repeat", str(a.repeat)],
                           capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"segflow_cc_bench failed: {p.stderr}")
        ours = json.loads(p.stdout)
    rank_k = {6: 1, 18: 2, 26: 3}[a.connectivity]
    structure = ndimage.generate_binary_structure(3, rank_k)
    t_scipy, (_, n_scipy) = best_of(lambda: ndimage.label(mask, structure=structure), a.repeat)
    t_cc3d, (_, n_cc3d) = best_of(
        lambda: cc3d.connected_components(mask, connectivity=a.connectivity, return_N=True), a.repeat)
    base = ours["seconds"]
    for name, secs, n in (("cc_segflow", base, ours["components"]), ("cc_scipy", t_scipy, n_scipy),
                          ("cc_cc3d", t_cc3d, n_cc3d)):
        print(json.dumps({"name": name, "seconds": round(secs, 4), "components": int(n),
                          "ratio": round(secs / base, 2), "config": config}))
    if not (ours["components"] == n_scipy == n_cc3d):
        sys.exit("component counts differ")


if __name__ == "__main__":
    main()
