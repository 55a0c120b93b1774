#!/usr/bin/env python3
"""Independent reference readers for segflow's tests.

usage: reference.py {sitk|nibabel|pydicom|pydicom_czyx|pydicom_czyx_list|pydicom_seg|npy} PATH

(pydicom_czyx_list: PATH is a text file naming one DICOM file a line; prints one object
mapping each name to its pydicom_czyx result, so a test pays for one Python start-up.)
       reference.py many {sitk|nibabel|pydicom|npy} PATH... (one object keyed by path)
       reference.py arrays {pydicom_czyx|sitk} LIST OUTDIR
(for every path named in the text file LIST, line i, writes OUTDIR/i.npy with the whole
float32 (C, Z, Y, X) array as that reader decodes it, rescaled in float64 like segflow, and
prints {path: {"npy": file, "shape": [...]} or {"error": message}}, so a test can compare
every voxel, not only samples.)

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


def read_pydicom_czyx(path):
    """One DICOM file as pydicom decodes it, laid out (C, Z, Y, X) like segflow's tensors:
    frames are slices, colour samples are channels; rescale applied to monochrome only.
    Voxels are sampled at "czyx" positions."""
    import pydicom
    ds = pydicom.dcmread(path)
    a = ds.pixel_array.astype(np.float64)
    spp = int(getattr(ds, "SamplesPerPixel", 1))
    frames = int(getattr(ds, "NumberOfFrames", 1) or 1)
    if frames == 1:
        a = a[None]
    if spp > 1:
        a = np.moveaxis(a, -1, 0)  # (Z, Y, X, C) -> (C, Z, Y, X)
    else:
        a = a * float(getattr(ds, "RescaleSlope", 1.0)) + float(getattr(ds, "RescaleIntercept", 0.0))
        a = a[None]
    res = {"shape": list(a.shape)}
    res.update(stats(a))
    rng = np.random.default_rng(1234)
    res["voxels"] = []
    for _ in range(32):
        idx = tuple(int(rng.integers(0, s)) for s in a.shape)
        res["voxels"].append({"czyx": list(idx), "value": float(a[idx])})
    return res


def read_pydicom_czyx_list(path):
    with open(path) as f:
        names = [line.strip() for line in f if line.strip()]
    return {name: read_pydicom_czyx(name) for name in names}


def read_pydicom_seg(path):
    """A DICOM SEG as pydicom reads it: segments, shared geometry and, per frame, the
    referenced segment, the plane position, the source SOP instance and the set-pixel count."""
    import pydicom
    ds = pydicom.dcmread(path)
    px = ds.pixel_array
    if px.ndim == 2:
        px = px[None]
    shared = ds.SharedFunctionalGroupsSequence[0]
    res = {
        "sop_class": str(ds.SOPClassUID),
        "modality": str(ds.Modality),
        "rows": int(ds.Rows),
        "columns": int(ds.Columns),
        "segmentation_type": str(ds.SegmentationType),
        "segments": [{"number": int(s.SegmentNumber), "label": str(s.SegmentLabel)} for s in ds.SegmentSequence],
        "frames": [],
    }
    if "PlaneOrientationSequence" in shared:
        res["orientation"] = [float(v) for v in shared.PlaneOrientationSequence[0].ImageOrientationPatient]
    if "PixelMeasuresSequence" in shared:
        res["pixel_spacing"] = [float(v) for v in shared.PixelMeasuresSequence[0].PixelSpacing]
    if "ReferencedSeriesSequence" in ds:
        res["referenced_series"] = [str(s.SeriesInstanceUID) for s in ds.ReferencedSeriesSequence]
    for i, fg in enumerate(ds.PerFrameFunctionalGroupsSequence[: px.shape[0]]):
        fr = {
            "segment": int(fg.SegmentIdentificationSequence[0].ReferencedSegmentNumber),
            "position": [float(v) for v in fg.PlanePositionSequence[0].ImagePositionPatient],
            "count": int(np.count_nonzero(px[i])),
        }
        if "DerivationImageSequence" in fg:
            src = fg.DerivationImageSequence[0].SourceImageSequence[0]
            fr["source_sop"] = str(src.ReferencedSOPInstanceUID)
        res["frames"].append(fr)
    return res


def read_npy(path):
    a = np.load(path)
    res = {"shape": list(a.shape)}
    res.update(stats(a))
    b = a if a.ndim >= 1 else a.reshape(1)
    res["voxels"] = sample_voxels(b)
    return res


def pydicom_czyx_array(path):
    """The (C, Z, Y, X) float32 array behind read_pydicom_czyx: frames are slices, colour
    samples are channels, RescaleSlope/Intercept applied in float64 (monochrome only)."""
    import pydicom
    ds = pydicom.dcmread(path)
    a = ds.pixel_array.astype(np.float64)
    spp = int(getattr(ds, "SamplesPerPixel", 1))
    frames = int(getattr(ds, "NumberOfFrames", 1) or 1)
    if frames == 1:
        a = a[None]
    if spp > 1:
        return np.moveaxis(a, -1, 0).astype(np.float32)
    a = a * float(getattr(ds, "RescaleSlope", 1.0)) + float(getattr(ds, "RescaleIntercept", 0.0))
    return a[None].astype(np.float32)


def sitk_czyx_array(path):
    """SimpleITK's (GDCM's) reading of a file or a series folder as a (C, Z, Y, X) float32
    array (GDCM applies the rescale)."""
    import SimpleITK as sitk
    import os
    if os.path.isdir(path):
        reader = sitk.ImageSeriesReader()
        reader.SetFileNames(reader.GetGDCMSeriesFileNames(path))
        img = reader.Execute()
    else:
        img = sitk.ReadImage(path)
    a = sitk.GetArrayFromImage(img).astype(np.float64)  # (Z, Y, X[, C]) or (Y, X[, C])
    comps = img.GetNumberOfComponentsPerPixel()
    if img.GetDimension() == 2:
        a = a[None]
    if comps > 1:
        return np.moveaxis(a, -1, 0).astype(np.float32)
    return a[None].astype(np.float32)


def write_arrays(kind, list_path, out_dir):
    import os
    fn = {"pydicom_czyx": pydicom_czyx_array, "sitk": sitk_czyx_array}[kind]
    with open(list_path) as f:
        names = [line.strip() for line in f if line.strip()]
    out = {}
    for i, name in enumerate(names):
        try:
            a = np.ascontiguousarray(fn(name))
            npy = os.path.join(out_dir, "%d.npy" % i)
            np.save(npy, a)
            out[name] = {"npy": npy, "shape": list(a.shape)}
        except Exception as e:  # one undecodable file does not hide the others
            out[name] = {"error": "%s: %s" % (type(e).__name__, e)}
    return out


def read_many(kind, paths):
    """`many READER PATH...`: {PATH: READER's object, or {"error": message}} in one process."""
    fn = {"sitk": read_sitk, "nibabel": read_nibabel, "pydicom": read_pydicom, "npy": read_npy,
          "pydicom_czyx": read_pydicom_czyx, "pydicom_czyx_list": read_pydicom_czyx_list,
          "pydicom_seg": read_pydicom_seg}[kind]
    out = {}
    for p in paths:
        try:
            out[p] = fn(p)
        except Exception as e:  # one unreadable file does not hide the others
            out[p] = {"error": "%s: %s" % (type(e).__name__, e)}
    return out


def main():
    if sys.argv[1] == "many":
        print(json.dumps(read_many(sys.argv[2], sys.argv[3:])))
        return
    if sys.argv[1] == "arrays":
        print(json.dumps(write_arrays(sys.argv[2], sys.argv[3], sys.argv[4])))
        return
    kind, path = sys.argv[1], sys.argv[2]
    fn = {"sitk": read_sitk, "nibabel": read_nibabel, "pydicom": read_pydicom, "npy": read_npy,
          "pydicom_czyx": read_pydicom_czyx, "pydicom_czyx_list": read_pydicom_czyx_list,
          "pydicom_seg": read_pydicom_seg}[kind]
    print(json.dumps(fn(path)))


if __name__ == "__main__":
    main()
