#!/usr/bin/env bash
# From folds to a model, end to end (issue 30 item 7), on a small synthetic CT-like dataset:
#   synth -> plan (2d, 3d_fullres) -> train --fold all (each configuration) -> cv -> select
#   -> postprocess determine -> package -> infer --model (NIfTI cases and a DICOM series -> SEG)
# printing each step's figures. The numbers in docs/how-to/from-folds-to-model.md come from
# this script. A reduced version of the chain runs in tests/apps/test_package.cpp.
#
# usage: scripts/demo-folds-to-model.sh [WORK_DIR]      (default: /tmp/segflow-demo; emptied first)
# env:   SEGFLOW (default build/apps/segflow), CASES (9), FOLDS (3), EPOCHS (40),
#        CONFIGURATIONS ("3d_fullres 2d"): plan configurations, or NAME=JOB.yaml for a
#          hand-written recipe trained on the same data (data.root set to WORK_DIR/data), e.g.
#          "quickstart=configs/quickstart-unet3d.yaml nnunet=configs/nnunet-like-3d.yaml";
#        SIZE (32: the synthetic cases' edge), THREADS (OMP_NUM_THREADS, default 2),
#        START_AT=7 (reuse WORK_DIR's trained runs, cv and selection; redo package and infer)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
segflow="${SEGFLOW:-$here/build/apps/segflow}"
work="${1:-/tmp/segflow-demo}"
cases="${CASES:-9}" folds="${FOLDS:-3}" epochs="${EPOCHS:-40}" size="${SIZE:-32}"
read -r -a configs <<<"${CONFIGURATIONS:-3d_fullres 2d}"
export OMP_NUM_THREADS="${THREADS:-2}"
py="$here/.venv/bin/python"
[ -x "$py" ] || py=python3
[ -x "$segflow" ] || { echo "demo: no segflow binary at $segflow (build first, or set SEGFLOW)" >&2; exit 2; }

step() { printf '\n=== %s\n$ %s\n' "$1" "${*:2}"; "${@:2}"; }
start=$SECONDS
if [ "${START_AT:-1}" -ge 7 ]; then
  cd "$work" && rm -rf model preds dicom seg.dcm
else
  rm -rf "$work" && mkdir -p "$work" && cd "$work"

  step "1. a dataset: $cases synthetic CT-like cases with 4 organs" \
    "$segflow" synth --out data --cases "$cases" --size "$size" --format nifti --seed 4
  planned=()
  for c in "${configs[@]}"; do [[ "$c" == *=* ]] || planned+=("$c"); done
  if [ "${#planned[@]}" -gt 0 ]; then
    step "2. plan: nnU-Net's rules, ${#planned[@]} configuration(s)" \
      "$segflow" plan data --configurations "$(IFS=,; echo "${planned[*]}")" --device cpu
  fi

  summaries=()
  for entry in "${configs[@]}"; do
    c="${entry%%=*}" job="data/.segflow-plans/$entry.yaml" extra=()
    if [[ "$entry" == *=* ]]; then  # a recipe of the user's: on the demo's data, under the demo's name
      job="${entry#*=}"
      [[ "$job" == /* ]] || job="$here/$job"
      extra=(--set "data.root=$work/data" --set "name=data-$c")
    fi
    step "3. train $c: $folds folds of $epochs epochs, out-of-fold predictions and probabilities saved" \
      "$segflow" train "$job" "${extra[@]}" --fold all --quiet \
      --set "data.folds=$folds" --set "train.epochs=$epochs" --set "train.val_interval=$epochs" \
      --set "train.checkpoint_interval=$epochs" --set validation.save_probabilities=true \
      --set "output.runs_dir=runs-$c"
    step "4. cv $c: out-of-fold Dice / HD95 / NSD with 95% bootstrap intervals" \
      "$segflow" cv runs-"$c"/* --out "cv-$c"
    summaries+=("cv-$c/cv_summary.json")
  done

  step "5. select: every configuration and ensemble on the same out-of-fold cases" \
    "$segflow" select "${summaries[@]}" --out selection.json
fi
# The winner's runs; postprocessing is determined on one configuration's out-of-fold
# predictions (the best single configuration's when the winner is an ensemble).
best_single="$("$py" -c 'import json,sys
s=json.load(open("selection.json"))
names={c["name"]: c for c in s["configurations"]}
w=[r for r in s["ranking"] if not r["ensemble"]][0]
print(" ".join(names[w["name"]]["runs"]))')"
printf 'winner: %s\n' "$("$py" -c 'import json; print(json.load(open("selection.json"))["winner"]["name"])')"
if [ "${START_AT:-1}" -lt 7 ]; then
  # shellcheck disable=SC2086
  step "6. postprocess determine on the best configuration's out-of-fold predictions" \
    "$segflow" postprocess determine $best_single --out postprocessing.json
fi
step "7. package the winner with its postprocessing" \
  "$segflow" package --selection selection.json --postprocessing postprocessing.json --out model
step "8. infer --model on every case (the package's members, TTA and postprocessing)" \
  "$segflow" infer --model model --input data --output preds --device cpu --quiet
step "   ... scored against the ground truth" \
  "$segflow" eval --pred preds --gt data --classes 1,2,3,4
step "9. a DICOM series in, a DICOM SEG out" \
  "$segflow" synth --out dicom --cases 1 --size 32 --format dicom --seed 11
series="$(find dicom -mindepth 1 -maxdepth 2 -type d -name 'case_*' | sort | head -1)"
step "   infer --model on $series" \
  "$segflow" infer --model model --input "$series" --output seg.dcm --device cpu
"$py" -c 'import pydicom,sys; d=pydicom.dcmread(sys.argv[1]); print("SEG:", d.Modality, d.SOPClassUID.name, "segments:", [s.SegmentLabel for s in d.SegmentSequence])' seg.dcm
printf '\ndemo done in %d s; everything is under %s\n' $((SECONDS - start)) "$work"
