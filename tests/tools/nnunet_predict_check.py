#!/usr/bin/env python3
"""nnU-Net v2's own predictor on what `segflow export --to nnunet` wrote, against `segflow infer`.

usage:
  nnunet_predict_check.py prepare SRC_DIR OUT_DIR --spacing S [--crop N]
      copies every SRC_DIR/*_0000.nii.gz with its voxel spacing set to S mm on every axis
      (same array, same origin and direction), cut to the first N voxels on each axis when
      --crop is given (SimpleITK)
  nnunet_predict_check.py predict RESULTS_DIR FOLD [--step 0.5] --set NAME IN_DIR SEGFLOW_DIR GAUSSIAN ...
      nnunetv2's nnUNetPredictor (device cpu, no mirroring, use_gaussian = GAUSSIAN 0|1)
      initialised from RESULTS_DIR with fold FOLD predicts each IN_DIR/*_0000.nii.gz
      (SimpleITKIO, predict_single_npy_array) and compares the label map with segflow's
      (SEGFLOW_DIR/<case>.nii.gz or <case>_0000.nii.gz), for each --set.
Prints one JSON object {"sets": {NAME: {cases: [per case voxels, agreeing voxels, labels
each predicted], voxels, agree, agreement}}}.
Nothing of segflow is imported.
"""
import argparse
import glob
import json
import os
import sys
import tempfile


def prepare(a):
    import SimpleITK as sitk

    os.makedirs(a.out, exist_ok=True)
    for f in sorted(glob.glob(os.path.join(a.src, "*_0000.nii.gz"))):
        img = sitk.ReadImage(f)
        if a.crop:
            img = img[: a.crop, : a.crop, : a.crop]
        img.SetSpacing([a.spacing] * img.GetDimension())
        sitk.WriteImage(img, os.path.join(a.out, os.path.basename(f)))


def predict(a):
    for k in ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_results"):
        os.environ.setdefault(k, tempfile.gettempdir())
    import numpy as np
    import SimpleITK as sitk
    import torch
    from nnunetv2.imageio.simpleitk_reader_writer import SimpleITKIO
    from nnunetv2.inference.predict_from_raw_data import nnUNetPredictor

    torch.set_num_threads(1)
    # The checkpoint is plain data: torch.load's default (weights_only) unpickler reads it too.
    ck = torch.load(os.path.join(a.results, f"fold_{a.fold}", "checkpoint_final.pth"), weights_only=True)
    checkpoint = {"keys": sorted(ck.keys()), "tensors": len(ck["network_weights"]),
                  "init_args": ck["init_args"], "trainer_name": ck["trainer_name"],
                  "mirroring": ck["inference_allowed_mirroring_axes"]}
    predictors = {}
    for gaussian in (False, True):
        p = nnUNetPredictor(tile_step_size=a.step, use_gaussian=gaussian, use_mirroring=False,
                            perform_everything_on_device=False, device=torch.device("cpu"), allow_tqdm=False)
        p.initialize_from_trained_model_folder(a.results, use_folds=(a.fold,), checkpoint_name="checkpoint_final.pth")
        predictors[gaussian] = p
    sets = {}
    for name, inputs, segflow, gaussian in a.set:
        cases, voxels, agree = [], 0, 0
        for f in sorted(glob.glob(os.path.join(inputs, "*_0000.nii.gz"))):
            case = os.path.basename(f)[: -len("_0000.nii.gz")]
            img, props = SimpleITKIO().read_images([f])
            ours = predictors[gaussian == "1"].predict_single_npy_array(img, props, None, None, False)
            theirs = None
            for n in (case + ".nii.gz", case + "_0000.nii.gz"):
                if os.path.exists(os.path.join(segflow, n)):
                    theirs = sitk.GetArrayFromImage(sitk.ReadImage(os.path.join(segflow, n)))
            if theirs is None or theirs.shape != ours.shape:
                print(json.dumps({"error": f"{name}/{case}: no segflow prediction of shape {ours.shape} in {segflow}"}))
                return 1
            same = int((theirs == ours).sum())
            cases.append({"case": case, "shape": list(ours.shape), "voxels": int(ours.size), "agree": same,
                          "labels_nnunet": sorted(int(v) for v in np.unique(ours)),
                          "labels_segflow": sorted(int(v) for v in np.unique(theirs))})
            voxels += int(ours.size)
            agree += same
        sets[name] = {"cases": cases, "voxels": voxels, "agree": agree,
                      "agreement": agree / voxels if voxels else 0.0}
    print(json.dumps({"checkpoint": checkpoint, "sets": sets}))
    return 0


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("src")
    p.add_argument("out")
    p.add_argument("--spacing", type=float, required=True)
    p.add_argument("--crop", type=int, default=0)
    q = sub.add_parser("predict")
    q.add_argument("results")
    q.add_argument("fold", type=int)
    q.add_argument("--step", type=float, default=0.5)
    q.add_argument("--set", nargs=4, action="append", required=True,
                   metavar=("NAME", "IN_DIR", "SEGFLOW_DIR", "GAUSSIAN"))
    a = ap.parse_args()
    if a.cmd == "prepare":
        prepare(a)
        return 0
    return predict(a)


if __name__ == "__main__":
    sys.exit(main())
