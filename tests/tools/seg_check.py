"""Independent readings for segflow's DICOM SEG and DICOM-dataset tests.

  seg_check.py segments FILE...        {FILE: [segment, ...]} as pydicom reads SegmentSequence
                                       (number, label, description, algorithm type, category and
                                       type code meanings; "" when absent), or {"error": ...}
  seg_check.py onto SERIES_DIR LABEL OUT.npy
                                       SimpleITK: LABEL resampled (nearest, identity transform:
                                       through patient coordinates) onto the grid of the DICOM
                                       series in SERIES_DIR, saved as (1, Z, Y, X) int32; prints
                                       {"size": [x, y, z], "counts": {value: voxels}}
"""
import json
import sys

import numpy as np


def code_meaning(item, keyword):
    if keyword in item and len(item[keyword].value) > 0:
        return str(item[keyword].value[0].get("CodeMeaning", ""))
    return ""


def segments(path):
    import pydicom
    ds = pydicom.dcmread(path, stop_before_pixels=True)
    out = []
    for s in ds.SegmentSequence:
        out.append({
            "number": int(s.SegmentNumber),
            "label": str(s.get("SegmentLabel", "")),
            "description": str(s.get("SegmentDescription", "")),
            "algorithm_type": str(s.get("SegmentAlgorithmType", "")),
            "category": code_meaning(s, "SegmentedPropertyCategoryCodeSequence"),
            "type": code_meaning(s, "SegmentedPropertyTypeCodeSequence"),
        })
    return out


def onto(series_dir, label, out_npy):
    import SimpleITK as sitk
    reader = sitk.ImageSeriesReader()
    reader.SetFileNames(reader.GetGDCMSeriesFileNames(series_dir))
    ref = reader.Execute()
    lab = sitk.ReadImage(label)
    res = sitk.Resample(lab, ref, sitk.Transform(), sitk.sitkNearestNeighbor, 0, sitk.sitkInt32)
    a = sitk.GetArrayFromImage(res).astype(np.int32)[None]
    np.save(out_npy, np.ascontiguousarray(a))
    values, counts = np.unique(a, return_counts=True)
    return {"size": list(res.GetSize()), "counts": {str(int(v)): int(c) for v, c in zip(values, counts)}}


def main():
    if sys.argv[1] == "segments":
        out = {}
        for p in sys.argv[2:]:
            try:
                out[p] = segments(p)
            except Exception as e:  # one unreadable file does not hide the others
                out[p] = {"error": "%s: %s" % (type(e).__name__, e)}
        print(json.dumps(out))
    elif sys.argv[1] == "onto":
        print(json.dumps(onto(sys.argv[2], sys.argv[3], sys.argv[4])))
    else:
        sys.exit("usage: seg_check.py segments FILE... | onto SERIES_DIR LABEL OUT.npy")


if __name__ == "__main__":
    main()
