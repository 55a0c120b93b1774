#!/usr/bin/env python3
"""pydicom's view of DICOM instances for the DICOM node tests (an independent reader).

usage: dicom_instances.py list PATH...
           One JSON object keyed by SOPInstanceUID: {file, sop_class, study, series, patient,
           modality, transfer_syntax, pixel_sha1, ref_series, segments_present}. Folders are
           walked (hidden names skipped); files pydicom cannot read as DICOM are left out.
           pixel_sha1 hashes the PixelData bytes as stored; ref_series is the SEG's
           ReferencedSeriesSequence[0].SeriesInstanceUID; segments_present lists the segment
           numbers of a SEG that have at least one set pixel.
       dicom_instances.py reseg IN OUT SEGMENT
           Writes a copy of the SEG IN with a new SOPInstanceUID and SeriesInstanceUID (still
           referencing the same image series) in which every frame of segment SEGMENT is
           cleared: a second, different label for the same series.
"""
import hashlib
import json
import os
import sys

import numpy as np
import pydicom
from pydicom.uid import generate_uid


def frame_segments(ds):
    out = []
    for fg in ds.PerFrameFunctionalGroupsSequence:
        out.append(int(fg.SegmentIdentificationSequence[0].ReferencedSegmentNumber))
    return out


def frame_bits(ds):
    """The SEG's binary frames as a (frames, rows * cols) uint8 array of 0/1."""
    n = int(getattr(ds, "NumberOfFrames", 1))
    per = int(ds.Rows) * int(ds.Columns)
    bits = np.unpackbits(np.frombuffer(ds.PixelData, np.uint8), bitorder="little")
    return bits[: n * per].reshape(n, per)


def describe(path):
    ds = pydicom.dcmread(path)
    info = {
        "file": path,
        "sop_class": str(ds.SOPClassUID),
        "study": str(getattr(ds, "StudyInstanceUID", "")),
        "series": str(getattr(ds, "SeriesInstanceUID", "")),
        "patient": str(getattr(ds, "PatientID", "")),
        "modality": str(getattr(ds, "Modality", "")),
        "transfer_syntax": str(ds.file_meta.TransferSyntaxUID),
        "pixel_sha1": hashlib.sha1(ds.PixelData).hexdigest() if "PixelData" in ds else "",
        "ref_series": "",
        "segments_present": [],
    }
    if "ReferencedSeriesSequence" in ds and len(ds.ReferencedSeriesSequence):
        info["ref_series"] = str(ds.ReferencedSeriesSequence[0].SeriesInstanceUID)
    if info["modality"] == "SEG" and "PixelData" in ds:
        bits = frame_bits(ds)
        segs = frame_segments(ds)
        info["segments_present"] = sorted({s for s, f in zip(segs, bits) if f.any()})
    return str(ds.SOPInstanceUID), info


def walk(paths):
    for p in paths:
        if os.path.isdir(p):
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for f in sorted(files):
                    if not f.startswith("."):
                        yield os.path.join(root, f)
        else:
            yield p


def cmd_list(paths):
    out = {}
    for f in walk(paths):
        try:
            uid, info = describe(f)
        except Exception:  # not DICOM (dataset.json, logs)
            continue
        out[uid] = info
    print(json.dumps(out))


def cmd_reseg(src, dst, segment):
    ds = pydicom.dcmread(src)
    bits = frame_bits(ds).copy()
    segs = frame_segments(ds)
    for i, s in enumerate(segs):
        if s == segment:
            bits[i, :] = 0
    packed = np.packbits(bits.reshape(-1), bitorder="little").tobytes()
    if len(packed) % 2:
        packed += b"\0"
    ds.PixelData = packed
    ds.SOPInstanceUID = generate_uid()
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    ds.SeriesInstanceUID = generate_uid()
    ds.save_as(dst, write_like_original=False)
    print(json.dumps({"sop_instance": str(ds.SOPInstanceUID)}))


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "list":
        cmd_list(sys.argv[2:])
    elif len(sys.argv) == 5 and sys.argv[1] == "reseg":
        cmd_reseg(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        sys.stderr.write(__doc__)
        sys.exit(2)


if __name__ == "__main__":
    main()
