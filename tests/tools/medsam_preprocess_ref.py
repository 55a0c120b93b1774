#!/usr/bin/env python3
"""numpy / cc3d reference of MedSAM's preprocessing for tests/pipeline/transforms/test_medsam_preprocess.cpp.

usage: medsam_preprocess_ref.py OUT_DIR CT_NIFTI MR_NIFTI LABEL_NIFTI

Writes OUT_DIR/NAME.npy for the inputs (volumes as (1, Z, Y, X) float32 / uint8, the
slice with the most voxels of label 5 and its box) and what MedSAM's code makes of them:
  ct_norm, mr_norm   pre_CT_MR.py: CT clipped to [40 - 200, 40 + 200], MR clipped to the 0.5 /
                     99.5 percentiles of its voxels > 0; (x - min) / (max - min) * 255 over the
                     volume, MR zeros kept 0, np.uint8 (truncation)
  minmax             per slice (x - min) / clip(max - min, 1e-8) of ct_norm
  resized_S, resized_label_S, box_S   the slice (and its label 5 mask and box) with the longest
                     side resized to S (bilinear with half-pixel centres / nearest with source
                     index floor(i * in / out), as cv2 INTER_NEAREST) and zero-padded bottom /
                     right to S x S; box * S / max(H, W) (LiteMedSAM's resize_box)
  dust_default       cc3d.dust(label, 1000, connectivity=26), then per slice cc3d.dust(., 100, 8)
  dust_small         the same with 50 voxels / 6-connected and 10 pixels / 4-connected
"""

import os
import sys

import cc3d
import nibabel as nib
import numpy as np


def zyx(path, dtype):
    return np.ascontiguousarray(np.asarray(nib.load(path).dataobj).transpose(2, 1, 0)).astype(dtype)


def medsam_normalize(x, modality):
    if modality == "ct":
        pre = np.clip(x, 40 - 200, 40 + 200)
    else:
        lo, hi = np.percentile(x[x > 0], 0.5), np.percentile(x[x > 0], 99.5)
        pre = np.clip(x, lo, hi)
    pre = (pre - np.min(pre)) / (np.max(pre) - np.min(pre)) * 255.0
    if modality == "mr":
        pre[x == 0] = 0
    return np.uint8(pre)


def bilinear(img, out_h, out_w):
    h, w = img.shape

    def axis(n_in, n_out):
        src = np.clip((np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5, 0, None)
        i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
        return i0, np.minimum(i0 + 1, n_in - 1), src - i0

    y0, y1, ty = axis(h, out_h)
    x0, x1, tx = axis(w, out_w)
    top = img[y0][:, x0] * (1 - tx) + img[y0][:, x1] * tx
    bot = img[y1][:, x0] * (1 - tx) + img[y1][:, x1] * tx
    return top * (1 - ty)[:, None] + bot * ty[:, None]


def resize_pad(img, mask, size):
    h, w = img.shape
    scale = size / max(h, w)
    nh, nw = int(h * scale + 0.5), int(w * scale + 0.5)
    out = np.zeros((size, size), np.float64)
    out[:nh, :nw] = bilinear(img.astype(np.float64), nh, nw)
    iy = np.minimum((np.arange(nh) * (h / nh)).astype(np.int64), h - 1)
    ix = np.minimum((np.arange(nw) * (w / nw)).astype(np.int64), w - 1)
    m = np.zeros((size, size), np.uint8)
    m[:nh, :nw] = mask[iy][:, ix]
    return out, m, scale


def dust(label, t3, c3, t2, c2):
    out = cc3d.dust(label.copy(), threshold=t3, connectivity=c3, in_place=False)
    for z in range(out.shape[0]):
        out[z] = cc3d.dust(out[z].copy(), threshold=t2, connectivity=c2, in_place=False)
    return out


def main():
    out_path, ct_path, mr_path, label_path = sys.argv[1:5]
    ct = zyx(ct_path, np.float32)
    mr = zyx(mr_path, np.float32)
    label = zyx(label_path, np.uint8)
    ct_norm = medsam_normalize(ct.astype(np.float64), "ct").astype(np.float32)
    mr_norm = medsam_normalize(mr.astype(np.float64), "mr").astype(np.float32)
    mins = ct_norm.min(axis=(1, 2), keepdims=True)
    maxs = ct_norm.max(axis=(1, 2), keepdims=True)
    minmax = (ct_norm - mins) / np.clip(maxs - mins, 1e-8, None)
    z = int((label == 5).sum(axis=(1, 2)).argmax())
    mask = (label[z] == 5).astype(np.uint8)
    ys, xs = np.nonzero(mask)
    box = np.array([xs.min(), ys.min(), xs.max(), ys.max()], np.float64)
    t = {
        "ct": ct[None], "mr": mr[None], "label": label[None],
        "ct_norm": ct_norm[None], "mr_norm": mr_norm[None], "minmax": minmax[None].astype(np.float32),
        "slice": minmax[z][None].astype(np.float32), "slice_label": mask[None], "box": box.astype(np.float32),
        "dust_default": dust(label, 1000, 26, 100, 8)[None],
        "dust_small": dust(label, 50, 6, 10, 4)[None],
    }
    for size in (1024, 64):
        img, m, scale = resize_pad(minmax[z], mask, size)
        t[f"resized_{size}"] = img[None].astype(np.float32)
        t[f"resized_label_{size}"] = m[None]
        t[f"box_{size}"] = (box * scale).astype(np.float32)
    os.makedirs(out_path, exist_ok=True)
    for k, v in t.items():
        np.save(os.path.join(out_path, k + ".npy"), np.ascontiguousarray(v))
    removed = int((label != t["dust_default"][0]).sum())
    print(f"slice {z}, box {box.tolist()}, dust removed {removed} voxels (defaults), "
          f"{int((label != t['dust_small'][0]).sum())} (small sizes)")


if __name__ == "__main__":
    main()
