#!/usr/bin/env bash
# The main job on the embedded default data: a synthetic CT dataset in DICOM (RLE, DICOM SEG
# labels) inspected; the quick-start 3D UNet trained on synthetic CT (configs/quickstart-
# unet3d.yaml: data made on first use, about a minute on 2 cores); then inference with the
# best checkpoint on one DICOM series, written as DICOM SEG in the series' geometry.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
bin=build/apps/segflow
data="${SEGFLOW_DATA:-data/phantoms}"
rm -rf "$data"
"$bin" synth --cases "${SEGFLOW_CASES:-4}" --size "${SEGFLOW_SIZE:-48}" --format dicom --compress rle --out "$data"
"$bin" inspect "$data/case_000" --json
"$bin" inspect "$data" --json
start=$(date +%s)
run="$("$bin" train configs/quickstart-unet3d.yaml "$@" | sed -n 's/^run folder: //p')"
echo "main-job: trained in $(( $(date +%s) - start )) s: $run"
grep '"type":"validation"' "$run/metrics.jsonl" | tail -n 1
"$bin" infer --checkpoint "$run/best.pt" --input "$data/case_000" --output "$run/case_000_seg.dcm"
"$bin" inspect "$run/case_000_seg.dcm" --json
