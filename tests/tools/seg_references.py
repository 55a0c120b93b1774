#!/usr/bin/env python3
"""pydicom's view of a DICOM SEG against the series it labels (the hospital loop tests).

usage: seg_references.py SEG_FILE_OR_FOLDER SERIES_FOLDER

Prints one JSON object: {seg: {sop_class, study, ref_series, frame_of_reference, rows, columns,
frames, segment_labels, referenced_instances, frame_positions}, source: {study, series,
frame_of_reference, rows, columns, instances, positions}}. A folder as the first argument
must hold exactly one SEG (Segmentation Storage) file; other files are ignored.
"""
import json
import os
import sys

import pydicom

SEG_CLASS = "1.2.840.10008.5.1.4.1.1.66.4"


def files_under(path):
    if os.path.isfile(path):
        return [path]
    out = []
    for root, dirs, names in os.walk(path):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        out += [os.path.join(root, n) for n in names if not n.startswith(".")]
    return sorted(out)


def read(path):
    try:
        return pydicom.dcmread(path)
    except Exception:
        return None


def seg_view(ds):
    refs = []
    for s in getattr(ds, "ReferencedSeriesSequence", []):
        refs += [str(i.ReferencedSOPInstanceUID) for i in getattr(s, "ReferencedInstanceSequence", [])]
    positions = []
    for fg in getattr(ds, "PerFrameFunctionalGroupsSequence", []):
        positions.append([float(v) for v in fg.PlanePositionSequence[0].ImagePositionPatient])
    return {
        "sop_class": str(ds.SOPClassUID),
        "study": str(ds.StudyInstanceUID),
        "ref_series": str(ds.ReferencedSeriesSequence[0].SeriesInstanceUID),
        "frame_of_reference": str(ds.FrameOfReferenceUID),
        "rows": int(ds.Rows),
        "columns": int(ds.Columns),
        "frames": int(getattr(ds, "NumberOfFrames", 1)),
        "segment_labels": [str(s.SegmentLabel) for s in ds.SegmentSequence],
        "referenced_instances": sorted(set(refs)),
        "frame_positions": sorted(set(tuple(round(v, 3) for v in p) for p in positions)),
    }


def source_view(folder):
    sets = [d for d in (read(f) for f in files_under(folder)) if d is not None and str(d.SOPClassUID) != SEG_CLASS]
    first = sets[0]
    return {
        "study": str(first.StudyInstanceUID),
        "series": str(first.SeriesInstanceUID),
        "frame_of_reference": str(first.FrameOfReferenceUID),
        "rows": int(first.Rows),
        "columns": int(first.Columns),
        "instances": sorted(str(d.SOPInstanceUID) for d in sets),
        "positions": sorted(set(tuple(round(float(v), 3) for v in d.ImagePositionPatient) for d in sets)),
    }


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    segs = [d for d in (read(f) for f in files_under(sys.argv[1])) if d is not None and str(d.SOPClassUID) == SEG_CLASS]
    if len(segs) != 1:
        sys.exit(f"{sys.argv[1]}: expected exactly one SEG, found {len(segs)}")
    out = {"seg": seg_view(segs[0]), "source": source_view(sys.argv[2])}
    for k in ("frame_positions",):
        out["seg"][k] = [list(p) for p in out["seg"][k]]
    out["source"]["positions"] = [list(p) for p in out["source"]["positions"]]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
