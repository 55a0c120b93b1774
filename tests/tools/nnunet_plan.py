#!/usr/bin/env python3
"""nnU-Net v2's own planner on a dataset, the reference `segflow plan` is compared with.

usage: nnunet_plan.py DATASET OUT.json [--gpu-memory-gb G] [--processes N] [--keep DIR]

DATASET is an nnU-Net v2 raw dataset folder (dataset.json with channel_names, labels,
numTraining, file_ending; imagesTr/, labelsTr/), e.g. what `segflow synth --format nifti`
writes. The script lays it out as nnUNet_raw/Dataset990_Segflow (symbolic links) in a
temporary folder, runs nnunetv2's DatasetFingerprintExtractor and ExperimentPlanner (the
default nnUNetPlans, PlainConvUNet) there, and writes one JSON object:
  {"fingerprint": dataset_fingerprint.json, "plans": nnUNetPlans.json, "nnunetv2": version}
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
    ap.add_argument("--gpu-memory-gb", type=float, default=8.0)
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

        fe = DatasetFingerprintExtractor(990, num_processes=a.processes, verbose=False)
        fe.show_progress_bar = False
        fingerprint = fe.run(overwrite_existing=True)
        planner = ExperimentPlanner(990, gpu_memory_target_in_gb=a.gpu_memory_gb)
        # the planner prints its configurations; keep stdout for nothing else
        stdout = sys.stdout
        sys.stdout = sys.stderr
        try:
            plans = planner.plan_experiment()
        finally:
            sys.stdout = stdout
        with open(os.path.join(pre, "Dataset990_Segflow", "dataset_fingerprint.json")) as f:
            fingerprint = json.load(f)
        with open(os.path.join(pre, "Dataset990_Segflow", "nnUNetPlans.json")) as f:
            plans = json.load(f)
        with open(a.out, "w") as f:
            json.dump({"fingerprint": fingerprint, "plans": plans, "nnunetv2": version("nnunetv2")}, f)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
