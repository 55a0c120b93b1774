#!/usr/bin/env python3
"""Independent reference readers for segflow's tests.

usage: reference.py {sitk|nibabel|pydicom|npy} PATH

Prints one JSON object: size (x, y, z), spacing, origin, direction (row-major, LPS),
dtype, min, max, mean, sum, and `checksum` values at a few voxels, as read by SimpleITK,
nibabel (converted RAS -> LPS) or pydicom (single file), so the C++ readers are checked
against code nobody here wrote.
"""
import json
import sys

import numpy as np


def stats(arr):
    a = np.asarray(arr)
    return {
        "dtype": str(a.dtype),
        "min": float(a.min()),
        "max": float(a.max()),
        "mean": float(a.astype(np.float64).mean()),
        "sum": float(a.astype(np.float64).sum()),
    }


def sample_voxels(a):
    """Values at up to 16 deterministic (z, y, x) positions of a (Z, Y, X) array."""
    rng = np.random.default_rng(1234)
    out = []
    for _ in range(16):
        idx = tuple(int(rng.integers(0, s)) for s in a.shape)
        out.append({"zyx": list(idx), "value": float(a[idx])})
    return out


def read_sitk(path):
    import SimpleITK as sitk
    import os
    if os.path.isdir(path):
        reader = sitk.ImageSeriesReader()
        files = reader.GetGDCMSeriesFileNames(path)
        reader.SetFileNames(files)
        img = reader.Execute()
    else:
        img = sitk.ReadImage(path)
    a = sitk.GetArrayFromImage(img)  # (Z, Y, X)
    if a.ndim == 2:
        a = a[None]
    res = {
        "size": list(img.GetSize()) + ([1] if img.GetDimension() == 2 else []),
        "spacing": list(img.GetSpacing()) + ([1.0] if img.GetDimension() == 2 else []),
        "origin": list(img.GetOrigin()) + ([0.0] if img.GetDimension() == 2 else []),
        "direction": list(img.GetDirection()) if img.GetDimension() == 3 else [1, 0, 0, 0, 1, 0, 0, 0, 1],
    }
    res.update(stats(a))
    res["voxels"] = sample_voxels(a)
    return res


def read_nibabel(path):
    import nibabel as nib
    img = nib.load(path)
    data = np.asanyarray(img.dataobj)
    if data.ndim > 3:
        data = data[..., 0] if data.ndim == 4 else data.reshape(data.shape[:3] + (-1,))[..., 0]
    while data.ndim < 3:
        data = data[..., None]
    aff = img.affine.copy()
    # RAS -> LPS
    flip = np.diag([-1.0, -1.0, 1.0])
    m = flip @ aff[:3, :3]
    origin = flip @ aff[:3, 3]
    spacing = np.linalg.norm(m, axis=0)
    direction = m / spacing
    zyx = np.transpose(data, (2, 1, 0))  # nibabel is (x, y, z)
    res = {
        "size": [int(s) for s in data.shape[:3]],
        "spacing": spacing.tolist(),
        "origin": origin.tolist(),
        "direction": direction.reshape(-1).tolist(),
    }
    res.update(stats(zyx))
    res["voxels"] = sample_voxels(zyx)
    return res


def read_pydicom(path):
    import pydicom
    ds = pydicom.dcmread(path)
    a = ds.pixel_array.astype(np.float64)
    slope = float(getattr(ds, "RescaleSlope", 1.0))
    inter = float(getattr(ds, "RescaleIntercept", 0.0))
    a = a * slope + inter
    if a.ndim == 2:
        a = a[None]
    res = {"size": [int(ds.Columns), int(ds.Rows), int(a.shape[0])]}
    if "PixelSpacing" in ds:
        res["spacing"] = [float(ds.PixelSpacing[1]), float(ds.PixelSpacing[0])]
    if "ImagePositionPatient" in ds:
        res["origin"] = [float(v) for v in ds.ImagePositionPatient]
    if "ImageOrientationPatient" in ds:
        res["orientation"] = [float(v) for v in ds.ImageOrientationPatient]
    res.update(stats(a))
    res["voxels"] = sample_voxels(a)
    return res


def read_npy(path):
    a = np.load(path)
    res = {"shape": list(a.shape)}
    res.update(stats(a))
    b = a if a.ndim >= 1 else a.reshape(1)
    res["voxels"] = sample_voxels(b)
    return res


def main():
    kind, path = sys.argv[1], sys.argv[2]
    fn = {"sitk": read_sitk, "nibabel": read_nibabel, "pydicom": read_pydicom, "npy": read_npy}[kind]
    print(json.dumps(fn(path)))


if __name__ == "__main__":
    main()
