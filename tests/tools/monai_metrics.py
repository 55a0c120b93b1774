#!/usr/bin/env python3
"""Reference figures for `segflow eval` from MONAI 1.4's metric functions.

usage:
  monai_metrics.py make OUT [--seed S] [--shape X,Y,Z] [--spacing SX,SY,SZ]
      Writes OUT/gt.nii.gz and OUT/pred.nii.gz with nibabel: anisotropic uint8 label maps
      (an ellipsoid, a sphere, a blob cut by the grid's edge; class 4 only in the
      prediction, class 5 only in the ground truth) on an oblique grid, the prediction a
      noisy, shifted copy with spurious specks. Also OUT/pred_moved.nii.gz (the prediction
      on another grid: padded, shifted, flipped along y, so that it maps back onto the
      ground-truth grid voxel for voxel), OUT/pred_far.nii.gz (the prediction 1 m away) and
      OUT/ct.nii.gz (a float image that is not a label map). A Z of 1 writes 2D slices.
  monai_metrics.py score PRED GT --classes 1,2,... --tolerance T[,T2,...]
      Reads both with nibabel and prints one JSON object {"classes": {"1": {dice, iou,
      hd95, assd, nsd, nsd_at, volume_pred_ml, volume_gt_ml}, ...}} (nsd at the first
      tolerance, nsd_at {"T": nsd} at each) from compute_dice /
      compute_iou (ignore_empty=False), compute_hausdorff_distance(percentile=95),
      compute_average_surface_distance(symmetric=True) and compute_surface_dice, all with
      the spacing from the header. NaN prints as null, infinity as "inf".
"""
import argparse
import json
import os
import sys
import warnings

import numpy as np


def ellipsoid(shape, spacing, centre_mm, radii_mm):
    grids = np.meshgrid(*[np.arange(n) * s for n, s in zip(shape, spacing)], indexing="ij")
    r = sum(((g - c) / rr) ** 2 for g, c, rr in zip(grids, centre_mm, radii_mm))
    return r <= 1.0


def make(out, seed, shape, spacing):
    import nibabel as nib

    rng = np.random.default_rng(seed)
    os.makedirs(out, exist_ok=True)
    two_d = shape[2] == 1
    ext = [n * s for n, s in zip(shape, spacing)]
    gt = np.zeros(shape, np.uint8)
    pred = np.zeros(shape, np.uint8)
    zc = (lambda f: ext[2] * f) if not two_d else (lambda f: 0.0)
    zr = (lambda r: r) if not two_d else (lambda r: 1e9)

    def put(arr, mask, value):
        arr[mask] = value

    # 1: an ellipsoid; the prediction shifted by about a voxel and with a different radius.
    put(gt, ellipsoid(shape, spacing, (ext[0] * 0.35, ext[1] * 0.4, zc(0.5)), (ext[0] * 0.2, ext[1] * 0.25, zr(ext[2] * 0.3))), 1)
    put(pred, ellipsoid(shape, spacing, (ext[0] * 0.35 + spacing[0] * 1.3, ext[1] * 0.4, zc(0.52)),
                        (ext[0] * 0.22, ext[1] * 0.23, zr(ext[2] * 0.33))), 1)
    # 2: a sphere, predicted smaller.
    put(gt, ellipsoid(shape, spacing, (ext[0] * 0.72, ext[1] * 0.7, zc(0.45)), (ext[0] * 0.12,) * 2 + (zr(ext[0] * 0.12),)), 2)
    put(pred, ellipsoid(shape, spacing, (ext[0] * 0.71, ext[1] * 0.7, zc(0.45)), (ext[0] * 0.1,) * 2 + (zr(ext[0] * 0.1),)), 2)
    # 3: a blob cut by the grid's x = 0 face and y = max face (the grid edge is surface).
    put(gt, ellipsoid(shape, spacing, (0.0, ext[1] * 0.95, zc(0.3)), (ext[0] * 0.15, ext[1] * 0.2, zr(ext[2] * 0.4))), 3)
    put(pred, ellipsoid(shape, spacing, (spacing[0], ext[1] * 0.93, zc(0.3)), (ext[0] * 0.15, ext[1] * 0.2, zr(ext[2] * 0.4))), 3)
    # 4: only predicted; 5: only in the ground truth.
    put(pred, ellipsoid(shape, spacing, (ext[0] * 0.2, ext[1] * 0.15, zc(0.7)), (ext[0] * 0.06,) * 2 + (zr(ext[2] * 0.2),)), 4)
    put(gt, ellipsoid(shape, spacing, (ext[0] * 0.8, ext[1] * 0.2, zc(0.25)), (ext[0] * 0.07,) * 2 + (zr(ext[2] * 0.2),)), 5)
    # Noise: flip labels of random voxels near the class boundaries, and a few specks.
    for arr in (gt, pred):
        boundary = np.zeros(shape, bool)
        for axis in range(3):
            if shape[axis] > 1:
                boundary |= np.diff(arr, axis=axis, prepend=arr.take([0], axis=axis)) != 0
        flip = boundary & (rng.random(shape) < 0.3)
        src = np.roll(arr, 1, axis=int(rng.integers(0, 2)))
        arr[flip] = src[flip]
    for _ in range(6):
        idx = tuple(int(rng.integers(0, n)) for n in shape)
        pred[idx] = int(rng.integers(1, 4))

    # An oblique grid: a rotation about z, then per-axis spacing (RAS affine for nibabel).
    a = np.deg2rad(20.0)
    rot = np.array([[np.cos(a), -np.sin(a), 0], [np.sin(a), np.cos(a), 0], [0, 0, 1]])
    affine = np.eye(4)
    affine[:3, :3] = rot @ np.diag(spacing)
    affine[:3, 3] = [-40.0, 25.0, 10.0]

    def save(arr, aff, name, dtype=np.uint8):
        data = arr[:, :, 0] if two_d else arr
        img = nib.Nifti1Image(data.astype(dtype), aff)
        img.set_sform(aff, code=1)
        img.set_qform(aff, code=1)
        nib.save(img, os.path.join(out, name))

    save(gt, affine, "gt.nii.gz")
    save(pred, affine, "pred.nii.gz")
    # The prediction on another grid: 5 voxels more before x, 2 after; y reversed; 1 more
    # before and after z (3D only). Index (i, j, k) of the moved grid is voxel
    # (i - 5, ny - 1 - j, k - 1) of the original.
    pz = (0, 0) if two_d else (1, 1)
    moved = np.pad(pred[:, ::-1, :], ((5, 2), (0, 0), pz))
    maff = affine.copy()
    maff[:3, 1] = -affine[:3, 1]
    maff[:3, 3] = affine[:3, 3] + affine[:3, 0] * -5 + affine[:3, 1] * (shape[1] - 1) + affine[:3, 2] * -pz[0]
    save(moved, maff, "pred_moved.nii.gz")
    far = affine.copy()
    far[:3, 3] += 1000.0
    save(pred, far, "pred_far.nii.gz")
    ct = rng.normal(40.0, 30.0, shape).astype(np.float32)
    save(ct, affine, "ct.nii.gz", np.float32)


def one_hot(arr, labels):
    import torch

    chans = [np.zeros(arr.shape, bool)] + [arr == lab for lab in labels]
    return torch.as_tensor(np.stack(chans)[None].astype(np.float32))


def clean(v):
    v = float(v)
    if np.isnan(v):
        return None
    if np.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


def score(pred_path, gt_path, labels, tolerances):
    import nibabel as nib
    from monai.metrics import (compute_average_surface_distance, compute_dice, compute_hausdorff_distance,
                               compute_iou, compute_surface_dice)

    p_img, g_img = nib.load(pred_path), nib.load(gt_path)
    p = np.asarray(p_img.dataobj).astype(np.int64)
    g = np.asarray(g_img.dataobj).astype(np.int64)
    spacing = [float(z) for z in g_img.header.get_zooms()[: g.ndim]]
    P, G = one_hot(p, labels), one_hot(g, labels)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dice = compute_dice(P, G, include_background=False, ignore_empty=False)[0]
        iou = compute_iou(P, G, include_background=False, ignore_empty=False)[0]
        hd = compute_hausdorff_distance(P, G, include_background=False, percentile=95, spacing=spacing)[0]
        asd = compute_average_surface_distance(P, G, include_background=False, symmetric=True, spacing=spacing)[0]
        nsd = [compute_surface_dice(P, G, class_thresholds=[t] * len(labels), include_background=False,
                                    spacing=spacing)[0] for t in tolerances]
    ml = float(np.prod(spacing)) / 1000.0
    out = {}
    for i, lab in enumerate(labels):
        out[str(lab)] = {
            "dice": clean(dice[i]),
            "iou": clean(iou[i]),
            "hd95": clean(hd[i]),
            "assd": clean(asd[i]),
            "nsd": clean(nsd[0][i]),
            "nsd_at": {repr(t): clean(n[i]) for t, n in zip(tolerances, nsd)},
            "volume_pred_ml": float((p == lab).sum()) * ml,
            "volume_gt_ml": float((g == lab).sum()) * ml,
        }
    return {"spacing": spacing, "shape": list(g.shape), "classes": out}


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("out")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--shape", default="48,40,20")
    m.add_argument("--spacing", default="0.8,1.1,2.5")
    s = sub.add_parser("score")
    s.add_argument("pred")
    s.add_argument("gt")
    s.add_argument("--classes", required=True)
    s.add_argument("--tolerance", required=True)
    a = ap.parse_args()
    if a.cmd == "make":
        make(a.out, a.seed, [int(v) for v in a.shape.split(",")], [float(v) for v in a.spacing.split(",")])
        print(json.dumps({"out": a.out}))
    else:
        labels = [int(v) for v in a.classes.split(",")]
        tolerances = [float(v) for v in a.tolerance.split(",")]
        print(json.dumps(score(a.pred, a.gt, labels, tolerances)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
