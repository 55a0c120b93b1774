#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz harnesses (tests/fuzz/README.md) into OUT/<harness>/.

Seeds come from real files the tests already use (Debian's pydicom test files, pydicom-data
and TotalSegmentator's files fetched by scripts/fetch-test-data.sh), from the shipped job
configs, and from small volumes written here by independent writers (nibabel, SimpleITK,
numpy, pydicom), so every harness starts from inputs that reach deep into its reader.
Files over --max-bytes are left out (libFuzzer mutates small inputs far faster).

usage: make_seeds.py OUT [--max-bytes N]
"""
import argparse
import copy
import glob
import gzip
import json
import os
import pathlib
import shutil
import sys

import numpy as np

SRC = pathlib.Path(__file__).resolve().parents[2]
TESTDATA = pathlib.Path(os.environ.get("SEGFLOW_TESTDATA") or pathlib.Path.home() / ".cache" / "segflow-testdata")
PYDICOM_FILES = pathlib.Path("/usr/lib/python3/dist-packages/pydicom/data/test_files")
SEPARATOR = b"\n--segflow-file--\n"


def put(out, harness, name, data):
    d = out / harness
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


def copy_files(out, harness, paths, max_bytes, prefix=""):
    n = 0
    for p in sorted(set(paths)):
        p = pathlib.Path(p)
        if p.is_file() and 0 < p.stat().st_size <= max_bytes:
            put(out, harness, prefix + p.name, p.read_bytes())
            n += 1
    return n


def dicom_seeds(out, max_bytes):
    import pydicom

    real = glob.glob(str(PYDICOM_FILES / "*.dcm")) + glob.glob(str(TESTDATA / "pydicom-data" / "*.dcm"))
    segs = [p for p in real if "liver" in os.path.basename(p)]
    copy_files(out, "dicom", [p for p in real if p not in segs], max_bytes)
    copy_files(out, "dicom_seg", segs, max_bytes * 2)
    # A small series: CT_small.dcm at three positions (uncompressed), and a UID-less variant.
    ct = pydicom.dcmread(PYDICOM_FILES / "CT_small.dcm")
    for variant in ("uid", "nouid", "gap"):
        parts = []
        for i in range(3):
            ds = copy.deepcopy(ct)
            step = 2.5 if variant != "gap" or i < 2 else 7.5
            ds.ImagePositionPatient = [float(v) for v in ct.ImagePositionPatient[:2]] + [
                float(ct.ImagePositionPatient[2]) + step * i]
            ds.SOPInstanceUID = f"{ct.SOPInstanceUID}.{i + 1}"
            ds.InstanceNumber = i + 1
            if variant == "nouid":
                del ds.SeriesInstanceUID
            buf = pydicom.filebase.DicomBytesIO()
            pydicom.dcmwrite(buf, ds, write_like_original=False)
            parts.append(buf.getvalue())
        put(out, "dicom_series", f"ct_small_{variant}.bin", SEPARATOR.join(parts))
    # Two real slices of TotalSegmentator's CT series (JPEG 2000) when fetched.
    series = sorted(glob.glob(str(TESTDATA / "totalsegmentator" / "example_ct_dicom" / "*")))[:2]
    if len(series) == 2:
        put(out, "dicom_series", "totalseg_two_slices.bin", SEPARATOR.join(pathlib.Path(p).read_bytes() for p in series))


def volume_seeds(out, tmp):
    import nibabel as nib
    import SimpleITK as sitk

    rng = np.random.default_rng(7)
    vols = {
        "u8": rng.integers(0, 4, (6, 5, 4)).astype(np.uint8),
        "i16": rng.integers(-1024, 2000, (6, 5, 4)).astype(np.int16),
        "f32": rng.standard_normal((5, 4, 3)).astype(np.float32),
    }
    oblique = np.array([[0, -1.5, 0, 10], [0.8, 0, 0, -3], [0, 0, 2.5, 40], [0, 0, 0, 1]], dtype=float)
    for k, v in vols.items():
        img = nib.Nifti1Image(v, np.diag([0.7, 0.7, 3.0, 1.0]))
        if k == "i16":
            img.header.set_slope_inter(0.5, -100)
        p = tmp / f"{k}.nii"
        nib.save(img, p)
        put(out, "nifti", f"{k}.nii", p.read_bytes())
        put(out, "nifti", f"{k}.nii.gz", gzip.compress(p.read_bytes(), mtime=0))
    nib.save(nib.Nifti1Image(vols["u8"], oblique), tmp / "oblique.nii")
    put(out, "nifti", "oblique.nii", (tmp / "oblique.nii").read_bytes())
    nib.save(nib.Nifti2Image(vols["f32"], np.eye(4)), tmp / "n2.nii")
    put(out, "nifti", "nifti2.nii", (tmp / "n2.nii").read_bytes())
    nib.save(nib.Nifti1Image(rng.standard_normal((4, 3, 3, 2)).astype(np.float32), np.eye(4)), tmp / "4d.nii")
    put(out, "nifti", "four_d.nii", (tmp / "4d.nii").read_bytes())
    # A real header: TotalSegmentator's CT cropped to 12^3, its affine kept.
    ct = TESTDATA / "totalsegmentator" / "example_ct_sm.nii.gz"
    if ct.exists():
        real = nib.load(ct)
        crop = np.asarray(real.dataobj[:12, :12, :12])
        nib.save(nib.Nifti1Image(crop, real.affine, real.header), tmp / "real.nii")
        put(out, "nifti", "totalseg_crop.nii", (tmp / "real.nii").read_bytes())

    for k, v in vols.items():
        img = sitk.GetImageFromArray(v)
        img.SetSpacing((0.7, 0.8, 2.5))
        img.SetOrigin((10.0, -20.0, 5.0))
        img.SetDirection((0, 1, 0, -1, 0, 0, 0, 0, 1))
        for ext, compress in ((".nrrd", False), (".mha", False), (".nrrd", True), (".mha", True)):
            p = tmp / f"{k}{'_gz' if compress else ''}{ext}"
            sitk.WriteImage(img, str(p), compress)
            put(out, "nrrd_mha", p.name, p.read_bytes())
    vec = sitk.GetImageFromArray(rng.standard_normal((3, 4, 5, 2)).astype(np.float32), isVector=True)
    sitk.WriteImage(vec, str(tmp / "vector.nrrd"))
    put(out, "nrrd_mha", "vector.nrrd", (tmp / "vector.nrrd").read_bytes())

    arrays = {
        "u8_3d": vols["u8"], "i16_3d": vols["i16"], "f32_4d": rng.standard_normal((2, 3, 4, 5)).astype(np.float32),
        "f64_fortran": np.asfortranarray(rng.standard_normal((3, 4, 5))), "bool": vols["u8"] > 1,
        "i64_be": vols["i16"].astype(">i8"), "u16_2d": vols["i16"][0].astype(np.uint16),
    }
    for k, a in arrays.items():
        np.save(tmp / f"{k}.npy", a)
        put(out, "npy", f"{k}.npy", (tmp / f"{k}.npy").read_bytes())


def text_seeds(out):
    for p in sorted((SRC / "configs").glob("*.yaml")):
        if p.name == "daemon.yaml":
            continue
        put(out, "job_config", p.name, p.read_bytes())
    quick = (SRC / "configs" / "quickstart-unet3d.yaml").read_bytes()
    put(out, "job_config", "quickstart_with_set.yaml",
        quick + b"\n--set--\ntrain.epochs=2\nmodel.channels=[4,8]\nstages.0.options.prob=0.5\n")
    requests = [
        {"cmd": "ping"}, {"cmd": "list"}, {"cmd": "status"}, {"cmd": "status", "job": 1},
        {"cmd": "datasets"}, {"cmd": "datasets", "dataset": "spleen"}, {"cmd": "stages"},
        {"cmd": "stop", "job": 1}, {"cmd": "pause", "job": 1, "now": True}, {"cmd": "resume", "job": 1},
        {"cmd": "start", "config": quick.decode(), "file": "quick.yaml", "set": ["train.epochs=1"]},
        {"cmd": "start", "path": "configs/quickstart-unet3d.yaml"},
        {"cmd": "infer", "checkpoint": "best.pt", "input": "scan.nii.gz", "output": "out.nii.gz", "tta": "mirror"},
        {"cmd": "dicom", "send": ["a.dcm"]}, {"cmd": "shutdown", "now": False},
    ]
    for i, r in enumerate(requests):
        put(out, "control", f"{i:02d}_{r['cmd']}.json", json.dumps(r).encode())
    for name, raw in (("not_json", b"{\"cmd\": "), ("array", b"[1,2]"), ("bad_utf8", b"{\"cmd\": \"\xff\xfe\"}")):
        put(out, "control", name + ".json", raw)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--max-bytes", type=int, default=128 * 1024)
    a = ap.parse_args()
    out = pathlib.Path(a.out)
    if out.exists():
        shutil.rmtree(out)
    tmp = out / ".tmp"
    tmp.mkdir(parents=True)
    dicom_seeds(out, a.max_bytes)
    volume_seeds(out, tmp)
    text_seeds(out)
    shutil.rmtree(tmp)
    counts = {d.name: len(list(d.iterdir())) for d in sorted(out.iterdir())}
    print(json.dumps({"seeds": counts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
