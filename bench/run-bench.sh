#!/usr/bin/env bash
# segflow against plain PyTorch and MONAI on the same machine, data, network and batch
# (configs/quickstart-unet3d.yaml), in one run; prints JSON lines and the ratios.
# usage: bench/run-bench.sh [SECONDS per segflow loader, default 30] [baseline epochs, default 3]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
secs="${1:-30}"
epochs="${2:-3}"
py=.venv/bin/python
[[ -x $py ]] || py=python3
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cfg=configs/quickstart-unet3d.yaml
# The dataset segflow's config makes (and the baselines read): same synth settings.
build/apps/segflow bench "$cfg" --json --seconds "$secs" --loaders actors,simple --set data.root="$work/data" \
  | tee "$work/segflow.jsonl"
# The baselines train on as many cases as segflow's training split (16 - 3 held out); which
# 13 does not matter for samples/s.
mkdir -p "$work/train/imagesTr" "$work/train/labelsTr"
for f in "$work"/data/imagesTr/*_0000.nii.gz; do ln -s "$f" "$work/train/imagesTr/"; done
for f in "$work"/data/labelsTr/*.nii.gz; do ln -s "$f" "$work/train/labelsTr/"; done
ntrain=13
ls "$work/train/imagesTr" | sort | tail -n +$((ntrain + 1)) | while read -r f; do
  rm "$work/train/imagesTr/$f" "$work/train/labelsTr/${f%_0000.nii.gz}.nii.gz"; done
for mode in torch monai; do
  "$py" bench/baselines/train_baseline.py --mode "$mode" --data "$work/train" --epochs "$epochs" 2>"$work/$mode.err" \
    | tee -a "$work/base.jsonl" || { cat "$work/$mode.err" >&2; exit 1; }
done
"$py" - "$work/segflow.jsonl" "$work/base.jsonl" <<'PY'
import json, sys
seg = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
base = {j["mode"]: j for j in (json.loads(l) for l in open(sys.argv[2]) if l.strip())}
e2e = {j["loader"]: j["samples_per_s"] for j in seg if j["bench"] == "e2e"}
out = {"bench": "ratios", "segflow_actors_samples_per_s": e2e.get("actors"),
       "torch_samples_per_s": base["torch"]["samples_per_s"], "monai_samples_per_s": base["monai"]["samples_per_s"],
       "segflow_over_torch": e2e["actors"] / base["torch"]["samples_per_s"],
       "segflow_over_monai": e2e["actors"] / base["monai"]["samples_per_s"],
       "pipeline_efficiency": next(j for j in seg if j["bench"] == "summary")["pipeline_efficiency"]}
print(json.dumps(out))
PY
