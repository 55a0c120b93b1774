#!/usr/bin/env python3
"""NRRD and MetaImage files written by SimpleITK (an independent writer), for segflow's tests.

usage: sitk_formats.py write SRC OUT_DIR PREFIX [--oblique] [--derived]
       sitk_formats.py read OUT_DIR FILE...

write: reads SRC (e.g. a NIfTI file) with SimpleITK and writes it (with --oblique, after giving it a
rotated direction, same voxels, spacing and origin) as
  PREFIX.nrrd (gzip), PREFIX_raw.nrrd, PREFIX.nhdr (+ .raw.gz), PREFIX_raw.nhdr (+ .raw),
  PREFIX.mha (compressed), PREFIX_raw.mha, PREFIX.mhd (+ .zraw), PREFIX_raw.mhd (+ .raw).
With --derived, also NRRD files made from PREFIX_raw.nrrd by editing its text header (the
same physical grid and voxels, other conventions):
  PREFIX_ras.nrrd   space right-anterior-superior (x and y of directions and origin negated)
  PREFIX_las.nrrd   space left-anterior-superior (y negated)
  PREFIX_ascii.nrrd encoding ascii (numbers as text)
Then reads every file back with SimpleITK and saves its voxels to OUT_DIR/<file>.npy (Z, Y, X)
and prints one JSON object {file: {size, spacing, origin, direction, dtype, npy}}; for the
derived files also "expected" (the geometry SimpleITK read from PREFIX_raw.nrrd).

read: reads each FILE (written by segflow) with SimpleITK and prints the same object, the
voxels saved to OUT_DIR/<file name>.npy.
"""
import json
import math
import os
import sys

import numpy as np
import SimpleITK as sitk


def rotation(deg_z, deg_x):
    a, b = math.radians(deg_z), math.radians(deg_x)
    rz = np.array([[math.cos(a), -math.sin(a), 0], [math.sin(a), math.cos(a), 0], [0, 0, 1]])
    rx = np.array([[1, 0, 0], [0, math.cos(b), -math.sin(b)], [0, math.sin(b), math.cos(b)]])
    return rz @ rx


def geometry(img):
    return {
        "size": list(img.GetSize()),
        "spacing": list(img.GetSpacing()),
        "origin": list(img.GetOrigin()),
        "direction": list(img.GetDirection()),
    }


def split_nrrd(path):
    data = open(path, "rb").read()
    end = data.index(b"\n\n")
    return data[:end].decode("ascii").split("\n"), data[end + 2:]


def vec(text):
    return [float(v) for v in text.strip().strip("()").split(",")]


def fmt(v):
    return "(" + ",".join(repr(float(x)) for x in v) + ")"


def derive(out_dir, prefix, written):
    lines, payload = split_nrrd(os.path.join(out_dir, prefix + "_raw.nrrd"))
    for name, flip in (("_ras", [-1, -1, 1]), ("_las", [1, -1, 1])):
        new = []
        for line in lines:
            if line.startswith("space:"):
                line = "space: " + ("right-anterior-superior" if name == "_ras" else "left-anterior-superior")
            elif line.startswith("space directions:"):
                dirs = line.split(":", 1)[1].split()
                line = "space directions: " + " ".join(fmt([f * x for f, x in zip(flip, vec(d))]) for d in dirs)
            elif line.startswith("space origin:"):
                line = "space origin: " + fmt([f * x for f, x in zip(flip, vec(line.split(":", 1)[1]))])
            new.append(line)
        with open(os.path.join(out_dir, prefix + name + ".nrrd"), "wb") as f:
            f.write(("\n".join(new) + "\n\n").encode("ascii") + payload)
        written.append(prefix + name + ".nrrd")
    # ascii: the values as text, x fastest (C order of the (Z, Y, X) array).
    img = sitk.ReadImage(os.path.join(out_dir, prefix + "_raw.nrrd"))
    arr = sitk.GetArrayFromImage(img)
    new = [("encoding: ascii" if line.startswith("encoding:") else line) for line in lines
           if not line.startswith("endian:")]
    with open(os.path.join(out_dir, prefix + "_ascii.nrrd"), "wb") as f:
        f.write(("\n".join(new) + "\n\n").encode("ascii"))
        f.write("\n".join(str(v) for v in arr.reshape(-1).tolist()).encode("ascii") + b"\n")
    written.append(prefix + "_ascii.nrrd")


def describe(path, npy):
    back = sitk.ReadImage(path)
    arr = sitk.GetArrayFromImage(back)
    if arr.ndim == 4:  # vector pixels (Z, Y, X, C) -> (C, Z, Y, X), as segflow lays them out
        arr = np.moveaxis(arr, -1, 0)
    np.save(npy, arr)
    r = geometry(back)
    r.update({"dtype": str(arr.dtype), "npy": npy, "components": back.GetNumberOfComponentsPerPixel()})
    return r


def write(src, out_dir, prefix, oblique, derived):
    img = sitk.ReadImage(src)
    if oblique:
        img.SetDirection(rotation(25.0, 25.0).reshape(-1).tolist())
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for ext in ("nrrd", "nhdr", "mha", "mhd"):
        for compressed in (True, False):
            name = prefix + ("" if compressed else "_raw") + "." + ext
            sitk.WriteImage(img, os.path.join(out_dir, name), useCompression=compressed)
            written.append(name)
    if derived:
        derive(out_dir, prefix, written)
    expected = geometry(sitk.ReadImage(os.path.join(out_dir, prefix + "_raw.nrrd")))
    result = {}
    for name in written:
        r = describe(os.path.join(out_dir, name), os.path.join(out_dir, name + ".npy"))
        if any(name.startswith(prefix + s) for s in ("_ras", "_las", "_ascii")):
            r["expected"] = expected
        result[name] = r
    return result


def main():
    sitk.ProcessObject.SetGlobalWarningDisplay(False)
    if sys.argv[1] == "read":
        out_dir = sys.argv[2]
        os.makedirs(out_dir, exist_ok=True)
        print(json.dumps({p: describe(p, os.path.join(out_dir, os.path.basename(p) + ".npy")) for p in sys.argv[3:]}))
        return
    src, out_dir, prefix = sys.argv[2], sys.argv[3], sys.argv[4]
    print(json.dumps(write(src, out_dir, prefix, "--oblique" in sys.argv[5:], "--derived" in sys.argv[5:])))


if __name__ == "__main__":
    main()
