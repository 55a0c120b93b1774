#!/usr/bin/env python3
"""Independent checks of what `segflow infer` writes (nibabel, pydicom, numpy).

usage:
  infer_check.py probs PROBS LABELS [INPUT]
      PROBS: the (x, y, z, class) float NIfTI of --save-probabilities; LABELS: the label map
      written with it; INPUT: the scan. Prints {"shape", "dtype", "max_sum_error" (largest
      |sum over classes - 1|), "min", "argmax_agreement" (fraction of voxels whose argmax is
      the written label), "affine_matches_labels", "affine_matches_input"}.
  infer_check.py seg SEG [--rgb R,G,B ...]
      Prints {"segments": [{"number", "label", "lab"}], "expected_lab": [...]}: each
      segment's SegmentLabel and RecommendedDisplayCIELabValue as pydicom reads them, and for
      each --rgb (sRGB 0..255, in segment order) the DICOM-scaled CIELab (D65) computed here
      from the sRGB, CIE XYZ and CIELab definitions.
"""
import argparse
import json
import sys

import numpy as np


def probs(path, labels, input_path):
    import nibabel as nib

    p = nib.load(path)
    lab = nib.load(labels)
    a = np.asarray(p.dataobj)
    res = {
        "shape": list(a.shape),
        "dtype": str(a.dtype),
        "max_sum_error": float(np.abs(a.sum(axis=-1) - 1.0).max()),
        "min": float(a.min()),
        "argmax_agreement": float((a.argmax(axis=-1) == np.asarray(lab.dataobj)).mean()),
        "affine_matches_labels": bool(np.allclose(p.affine, lab.affine, atol=1e-4)),
    }
    if input_path:
        res["affine_matches_input"] = bool(np.allclose(p.affine, nib.load(input_path).affine, atol=1e-4))
    return res


def srgb_to_dicom_lab(rgb):
    c = np.asarray(rgb, dtype=np.float64) / 255.0
    lin = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    m = np.array([[0.4124564, 0.3575761, 0.1804375], [0.2126729, 0.7151522, 0.0721750],
                  [0.0193339, 0.1191920, 0.9503041]])
    xyz = m @ lin / np.array([0.95047, 1.0, 1.08883])
    d = 6.0 / 29.0
    f = np.where(xyz > d ** 3, np.cbrt(xyz), xyz / (3 * d * d) + 4.0 / 29.0)
    L, a, b = 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])
    return [L * 65535 / 100, (a + 128) * 65535 / 255, (b + 128) * 65535 / 255]


def coded(item, keyword):
    """The first code of `keyword` in `item` as {value, scheme, meaning, pydicom}: `pydicom` is the
    SNOMED CT code pydicom's own code dictionary holds for that meaning (None if it has none)."""
    from pydicom.sr.codedict import codes

    if keyword not in item or len(item[keyword].value) == 0:
        return None
    c = item[keyword].value[0]
    meaning = str(c.CodeMeaning)
    attr = "".join(w[:1].upper() + w[1:] for w in meaning.replace("-", " ").split())
    try:
        known = getattr(codes.SCT, attr).value
    except AttributeError:
        known = None
    out = {"value": str(c.CodeValue), "scheme": str(c.CodingSchemeDesignator), "meaning": meaning,
           "pydicom": known}
    modifier = coded(c, "SegmentedPropertyTypeModifierCodeSequence")
    if modifier:
        out["modifier"] = modifier
    return out


def seg(path, rgbs):
    import pydicom

    ds = pydicom.dcmread(path)
    segs = []
    for s in ds.SegmentSequence:
        item = {"number": int(s.SegmentNumber), "label": str(s.SegmentLabel),
                "category": coded(s, "SegmentedPropertyCategoryCodeSequence"),
                "type": coded(s, "SegmentedPropertyTypeCodeSequence")}
        if "RecommendedDisplayCIELabValue" in s:
            item["lab"] = [int(v) for v in s.RecommendedDisplayCIELabValue]
        segs.append(item)
    return {"segments": segs, "expected_lab": [srgb_to_dicom_lab(r) for r in rgbs]}


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("probs")
    p.add_argument("probs")
    p.add_argument("labels")
    p.add_argument("input", nargs="?")
    s = sub.add_parser("seg")
    s.add_argument("seg")
    s.add_argument("--rgb", action="append", default=[])
    a = ap.parse_args()
    if a.cmd == "probs":
        out = probs(a.probs, a.labels, a.input)
    else:
        out = seg(a.seg, [[int(v) for v in r.split(",")] for r in a.rgb])
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
