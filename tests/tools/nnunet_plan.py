#!/usr/bin/env python3
"""nnU-Net v2's own planner on a dataset, the reference `segflow plan` is compared with.

usage: nnunet_plan.py DATASET OUT.json [--planner P] [--gpu-memory-gb G] [--processes N] [--keep DIR]

DATASET is an nnU-Net v2 raw dataset folder (dataset.json with channel_names, labels,
numTraining, file_ending; imagesTr/, labelsTr/), e.g. what `segflow synth --format nifti`
writes. The script lays it out as nnUNet_raw/Dataset990_Segflow (symbolic links) in a
temporary folder, runs nnunetv2's DatasetFingerprintExtractor and a planner there (--planner
default: ExperimentPlanner, nnUNetPlans, PlainConvUNet; resenc-m / resenc-l / resenc-xl:
nnUNetPlannerResEncM / L / XL, ResidualEncoderUNet, at their own memory targets unless
--gpu-memory-gb is given), and writes one JSON object:
  {"fingerprint": dataset_fingerprint.json, "plans": the plans file, "nnunetv2": version,
   "estimates": {configuration: the planner's own static_estimate_VRAM_usage of the planned
                 patch and network (the feature-map voxels it compares with its reference)}}
Nothing of segflow is imported.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dataset")
    ap.add_argument("out")
    ap.add_argument("--planner", default="default", choices=["default", "resenc-m", "resenc-l", "resenc-xl"])
    ap.add_argument("--gpu-memory-gb", type=float, default=None)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--keep", default="", help="use this folder instead of a temporary one, and keep it")
    a = ap.parse_args()

    work = a.keep or tempfile.mkdtemp(prefix="nnunet_plan_")
    raw = os.path.join(work, "nnUNet_raw")
    pre = os.path.join(work, "nnUNet_preprocessed")
    res = os.path.join(work, "nnUNet_results")
    ds = os.path.join(raw, "Dataset990_Segflow")
    os.makedirs(ds, exist_ok=True)
    os.makedirs(pre, exist_ok=True)
    os.makedirs(res, exist_ok=True)
    src = os.path.abspath(a.dataset)
    for name in ("imagesTr", "labelsTr", "dataset.json"):
        link = os.path.join(ds, name)
        if not os.path.lexists(link):
            os.symlink(os.path.join(src, name), link)
    # nnunetv2 reads its folders from the environment when it is imported.
    os.environ["nnUNet_raw"], os.environ["nnUNet_preprocessed"], os.environ["nnUNet_results"] = raw, pre, res
    os.environ.setdefault("nnUNet_def_n_proc", str(a.processes))
    try:
        from importlib.metadata import version
        from nnunetv2.experiment_planning.dataset_fingerprint.fingerprint_extractor import \
            DatasetFingerprintExtractor
        from nnunetv2.experiment_planning.experiment_planners.default_experiment_planner import ExperimentPlanner
        from nnunetv2.experiment_planning.experiment_planners.residual_unets.residual_encoder_unet_planners import (
            nnUNetPlannerResEncL, nnUNetPlannerResEncM, nnUNetPlannerResEncXL)

        fe = DatasetFingerprintExtractor(990, num_processes=a.processes, verbose=False)
        fe.show_progress_bar = False
        fingerprint = fe.run(overwrite_existing=True)
        cls, target = {"default": (ExperimentPlanner, 8.0), "resenc-m": (nnUNetPlannerResEncM, 8.0),
                       "resenc-l": (nnUNetPlannerResEncL, 24.0), "resenc-xl": (nnUNetPlannerResEncXL, 40.0)}[a.planner]
        planner = cls(990, gpu_memory_target_in_gb=a.gpu_memory_gb if a.gpu_memory_gb is not None else target)
        # the planner prints its configurations; keep stdout for nothing else
        stdout = sys.stdout
        sys.stdout = sys.stderr
        try:
            plans = planner.plan_experiment()
        finally:
            sys.stdout = stdout
        with open(os.path.join(pre, "Dataset990_Segflow", "dataset_fingerprint.json")) as f:
            fingerprint = json.load(f)
        with open(os.path.join(pre, "Dataset990_Segflow", planner.plans_identifier + ".json")) as f:
            plans = json.load(f)
        estimates = {}
        for name, c in plans["configurations"].items():
            if "architecture" not in c:
                continue
            arch = c["architecture"]
            estimates[name] = float(planner.static_estimate_VRAM_usage(
                c["patch_size"], len(planner.dataset_json["channel_names"]), len(planner.dataset_json["labels"]),
                arch["network_class_name"], arch["arch_kwargs"], arch["_kw_requires_import"]))
        with open(a.out, "w") as f:
            json.dump({"fingerprint": fingerprint, "plans": plans, "nnunetv2": version("nnunetv2"),
                       "estimates": estimates}, f)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
