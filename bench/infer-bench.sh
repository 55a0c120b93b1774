#!/usr/bin/env bash
# `segflow infer` against nnU-Net v2's own predictor on the same weights (issue 43 item 1).
# A segflow plan of synthetic phantoms is trained, exported with `segflow export --to nnunet`,
# and both predict the same CT: segflow from the checkpoint, nnunetv2's
# nnUNetv2_predict_from_modelfolder from the export (device cpu, one preprocessing and one
# export process, its default step 0.5 set to the run's overlap). Without mirroring and with
# it (nnU-Net mirrors the axes the export lists, segflow's --tta mirror the axes the training
# flipped: the same axes). Prints JSON lines:
#   {"name": "infer_bench", "side": "nnunet"|"segflow", "tta": "none"|"mirror", wall_s,
#    peak_rss_mb (GNU time's maximum resident set of the process; nnU-Net's largest process),
#    labels, ct: {size, spacing}, model: {network, patch_size, ...}}
#   {"name": "infer_bench_ratios", "tta": ..., "speed": nnU-Net wall / segflow wall,
#    "peak_rss": segflow / nnU-Net, "agreement": share of voxels with equal labels}
#
# usage: bench/infer-bench.sh [--train-cases N] [--train-size S] [--epochs E]
#                             [--preset default|resenc-m|resenc-l|resenc-xl]
#                             [--size XY] [--slices Z] [--ct-spacing X,Y,Z] [--ct FILE]
#                             [--tta none|mirror|both] [--blend nnunet|run] [--work DIR] [--keep]
#   --size, --slices: the synthetic CT (default 512 x 512 x 300), a phantom of `segflow synth`
#                     at the plan's spacing (no resampling on either side) unless --ct-spacing
#   --ct FILE:        predict this CT instead (e.g. the real TotalSegmentator CT of
#                     scripts/fetch-test-data.sh); its own spacing, resampled by both sides
#   --blend:          segflow infer --blend nnunet (default: nnU-Net's window layout and
#                     Gaussian, logits blended: the same output) or run (the run's
#                     validation.mode, segflow's Gaussian)
# Needs the build (scripts/build.sh) and the venv's nnunetv2 (scripts/setup.sh).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
train_cases=8 train_size=64 epochs=3 preset=default size=512 slices=300 ct_spacing="" ct="" tta=both
blend=nnunet work="" keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --train-cases) train_cases="$2"; shift 2 ;;
    --train-size) train_size="$2"; shift 2 ;;
    --epochs) epochs="$2"; shift 2 ;;
    --preset) preset="$2"; shift 2 ;;
    --size) size="$2"; shift 2 ;;
    --slices) slices="$2"; shift 2 ;;
    --ct-spacing) ct_spacing="$2"; shift 2 ;;
    --ct) ct="$2"; shift 2 ;;
    --tta) tta="$2"; shift 2 ;;
    --blend) blend="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "infer-bench: unknown argument $1" >&2; exit 2 ;;
  esac
done
case "$blend" in nnunet) blend_flag="--blend nnunet" ;; run) blend_flag="" ;;
  *) echo "infer-bench: --blend: expected nnunet or run, got $blend" >&2; exit 2 ;; esac
case "$tta" in none) ttas="none" ;; mirror) ttas="mirror" ;; both) ttas="none mirror" ;;
  *) echo "infer-bench: --tta: expected none, mirror or both, got $tta" >&2; exit 2 ;; esac
segflow="$here/build/apps/segflow"
py="$here/.venv/bin/python"
bin="$here/.venv/bin"
[ -x "$segflow" ] || { echo "infer-bench: build segflow first (scripts/build.sh)" >&2; exit 1; }
[ -x "$bin/nnUNetv2_predict_from_modelfolder" ] || { echo "infer-bench: nnunetv2 missing in .venv (scripts/setup.sh)" >&2; exit 1; }
[ -z "$ct" ] || [ -f "$ct" ] || { echo "infer-bench: --ct $ct: no such file" >&2; exit 2; }
if [ -z "$work" ]; then work="$(mktemp -d /tmp/infer-bench.XXXXXX)"; fi
if [ "$keep" = 0 ]; then trap 'rm -rf "$work"' EXIT; fi
mkdir -p "$work"
log() { echo "infer-bench: $*" >&2; }
export nnUNet_raw="$work/nnUNet_raw" nnUNet_preprocessed="$work/nnUNet_preprocessed"
export nnUNet_results="$work/nnUNet_results" nnUNet_compile=f

# ---- the model: segflow's plan of the phantoms, trained, and its nnU-Net export ----
"$segflow" synth --cases "$train_cases" --size "$train_size" --format nifti --seed 11 --out "$work/ds" >&2
"$segflow" train "$work/ds" --preset "$preset" --set train.epochs="$epochs" \
  --set "output.runs_dir=$work/runs" --quiet >"$work/train.out" 2>"$work/train.log"
run="$(ls -d "$work"/runs/*/ | head -1)"
ckpt="$run/best.pt"; [ -f "$ckpt" ] || ckpt="$run/last.pt"
results="$nnUNet_results/Dataset990_Segflow/nnUNetTrainer__nnUNetPlans__3d_fullres"
mkdir -p "$(dirname "$results")"
"$segflow" export --checkpoint "$ckpt" --to nnunet "$results" --fold 0 >&2
log "trained $run, exported to $results"

# ---- the CT: a phantom at the plan's spacing (or --ct-spacing), XY x XY x Z ----
mkdir -p "$work/ct"
if [ -z "$ct" ]; then
  spacing="$ct_spacing"
  if [ -z "$spacing" ]; then  # the export's spacing is (z, y, x)
    spacing="$("$py" -c 'import json,sys; s=json.load(open(sys.argv[1]))["configurations"]["3d_fullres"]["spacing"]; print(f"{s[2]},{s[1]},{s[0]}")' "$results/plans.json")"
  fi
  "$segflow" synth --cases 1 --size "$size" --spacing "$spacing" --format nifti --seed 5 --out "$work/big" >&2
  "$py" - "$work/big/imagesTr/case_000_0000.nii.gz" "$work/ct/ct_0000.nii.gz" "$slices" <<'EOF'
import sys
import numpy as np
import SimpleITK as sitk
src, dst, z = sys.argv[1], sys.argv[2], int(sys.argv[3])
img = sitk.ReadImage(src)
a = sitk.GetArrayFromImage(img)  # (z, y, x)
# Z slices: the phantom's own, mirrored at its ends as often as needed, or its middle Z.
if a.shape[0] < z:
    reps = -(-z // a.shape[0])
    a = np.concatenate([a if k % 2 == 0 else a[::-1] for k in range(reps)], axis=0)
start = (a.shape[0] - z) // 2
out = sitk.GetImageFromArray(np.ascontiguousarray(a[start:start + z]))
out.SetSpacing(img.GetSpacing()); out.SetOrigin(img.GetOrigin()); out.SetDirection(img.GetDirection())
sitk.WriteImage(out, dst)
EOF
else
  cp "$ct" "$work/ct/ct_0000.nii.gz"
fi
ct_info="$("$py" -c 'import json,sys,SimpleITK as s; i=s.ReadImage(sys.argv[1]); print(json.dumps({"size": list(i.GetSize()), "spacing": [round(v, 4) for v in i.GetSpacing()]}))' "$work/ct/ct_0000.nii.gz")"
log "CT $ct_info"

step="$("$py" -c 'import json,sys; p=json.load(open(sys.argv[1])); print(p.get("segflow", {}).get("tile_step_size", 0.5))' "$results/plans.json")"
for t in $ttas; do
  nn_flag="--disable_tta"; sf_tta=none
  if [ "$t" = mirror ]; then nn_flag=""; sf_tta=mirror; fi
  rm -rf "$work/nn_$t" "$work/sf_$t"; mkdir -p "$work/nn_$t" "$work/sf_$t"
  log "nnU-Net predicting (tta $t)"
  /usr/bin/time -f "%e %M" -o "$work/nn_$t.time" "$bin/nnUNetv2_predict_from_modelfolder" -i "$work/ct" \
    -o "$work/nn_$t" -m "$results" -f 0 -chk checkpoint_final.pth -step_size "$step" -device cpu \
    -npp 1 -nps 1 $nn_flag >"$work/nn_$t.log" 2>&1
  log "segflow predicting (tta $t)"
  /usr/bin/time -f "%e %M" -o "$work/sf_$t.time" "$segflow" infer --checkpoint "$ckpt" \
    --input "$work/ct/ct_0000.nii.gz" --output "$work/sf_$t/ct.nii.gz" --tta "$sf_tta" --device cpu \
    --postprocess none $blend_flag --quiet >"$work/sf_$t.json" 2>"$work/sf_$t.log"
done

# ---- JSON lines ----
"$py" - "$work" "$results" "$ct_info" "$preset" "$epochs" "$ttas" "$blend" <<'EOF'
import json, sys
import numpy as np
import SimpleITK as sitk
work, results, ct_info, preset, epochs, ttas, blend = sys.argv[1:8]
ct = json.loads(ct_info)
conf = json.load(open(f"{results}/plans.json"))["configurations"]["3d_fullres"]
model = {"network": conf["architecture"]["network_class_name"].rsplit(".", 1)[-1],
         "patch_size_zyx": conf["patch_size"], "spacing_zyx": conf["spacing"], "preset": preset,
         "epochs": int(epochs), "segflow_blend": blend}
threads = {"cores": __import__("os").cpu_count()}
for t in ttas.split():
    sides = {}
    for side, name in (("nnunet", "nn"), ("segflow", "sf")):
        wall, rss = open(f"{work}/{name}_{t}.time").read().split()[-2:]
        path = f"{work}/nn_{t}/ct.nii.gz" if side == "nnunet" else f"{work}/sf_{t}/ct.nii.gz"
        lab = sitk.GetArrayFromImage(sitk.ReadImage(path))
        sides[side] = {"wall_s": float(wall), "peak_rss_mb": int(rss) / 1024.0, "labels": lab}
        print(json.dumps({"name": "infer_bench", "side": side, "tta": t, "wall_s": float(wall),
                          "peak_rss_mb": round(int(rss) / 1024.0, 1),
                          "labels": sorted(int(v) for v in np.unique(lab)), "ct": ct, "model": model,
                          **threads}))
    a, b = sides["nnunet"]["labels"], sides["segflow"]["labels"]
    agree = float((a == b).mean()) if a.shape == b.shape else None
    fg = (a > 0) | (b > 0)
    print(json.dumps({"name": "infer_bench_ratios", "tta": t,
                      "speed": sides["nnunet"]["wall_s"] / sides["segflow"]["wall_s"],
                      "peak_rss": sides["segflow"]["peak_rss_mb"] / sides["nnunet"]["peak_rss_mb"],
                      "agreement": agree,
                      "foreground_agreement": float((a == b)[fg].mean()) if agree is not None and fg.any() else None,
                      "note": "speed: nnU-Net wall / segflow wall; peak_rss: segflow / nnU-Net",
                      "ct": ct, "model": model}))
EOF
