#!/usr/bin/env bash
# MedSAM's training step against segflow's on the same data (issue 32 item 4). Prints JSON lines:
#   {"bench": "medsam_step", "side": "medsam", ...}  MedSAM's train_one_gpu.py loop in PyTorch
#       (bench/medsam_step.py: segment_anything's Sam, DiceLoss + BCE, AdamW, npy slices + boxes)
#   {"bench": "e2e"|"compute"|"summary", "config": "medsam-bench-<preset>", ...}  segflow bench
#       on the same cases (the medsam_box stage cuts the same kind of slices and boxes)
#   {"bench": "medsam_ratios", ...}  segflow / MedSAM: samples/s, step ms, peak host memory
# Both sides: the same preset sizes (models/nets/sam.cpp), batch, image size, fp32, the prompt
# encoder frozen, AdamW lr 1e-4 wd 0.01, no data-loader workers, the same thread count.
#
# usage: bench/medsam-bench.sh [--preset tiny|small|vit_b] [--batch B] [--steps N] [--cases C]
#                              [--threads T] [--device cpu|cuda] [--work DIR] [--keep]
#   defaults: tiny, batch 4, 20 steps, 4 cases, 2 threads, cpu. vit_b is 1024 x 1024: on a CPU
#   a step takes about a minute per side; on a GPU it is the device run's size.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
preset=tiny batch=4 steps=20 cases=4 threads=2 device=cpu work="" keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --preset) preset="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --cases) cases="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --device) device="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "medsam-bench: unknown argument $1" >&2; exit 2 ;;
  esac
done
case "$preset" in
  tiny) img=64 ;; small) img=256 ;; vit_b) img=1024 ;;
  *) echo "medsam-bench: --preset: expected tiny, small or vit_b, got '$preset'" >&2; exit 2 ;;
esac
segflow="$here/build/apps/segflow"
py="$here/.venv/bin/python"
[ -x "$segflow" ] || { echo "medsam-bench: build segflow first (scripts/build.sh)" >&2; exit 1; }
[ -x "$py" ] || { echo "medsam-bench: no venv at $here/.venv (scripts/setup.sh)" >&2; exit 1; }
if [ -z "$work" ]; then work="$(mktemp -d /tmp/medsam-bench.XXXXXX)"; fi
[ "$keep" = 1 ] || trap 'rm -rf "$work"' EXIT
mkdir -p "$work"
export OMP_NUM_THREADS="$threads"

# The same cases for both sides: segflow's synthetic CT with four organs.
"$segflow" synth --out "$work/data" --cases "$cases" --size 64 --format nifti --seed 7 >/dev/null
"$py" "$here/bench/medsam_step.py" slices "$work/data" "$work/npy" --img "$img" >&2

shift_px=$(( (20 * img + 512) / 1024 )); [ "$shift_px" -ge 1 ] || shift_px=1
per_case=$(( (batch * steps + cases - 1) / cases ))  # slices per case per epoch: >= steps batches
cat >"$work/job.yaml" <<EOF
name: medsam-bench-$preset
seed: 0
data: {root: $work/data, num_classes: 2, val_cases: 0}
stages:
  - {name: load}
  - {name: scale_intensity_range, options: {a_min: -200, a_max: 300, b_min: 0.0, b_max: 1.0, clip: true}}
  - {name: medsam_box, options: {image_size: $img, bbox_shift: $shift_px, num_samples: $per_case}}
model: {name: sam, preset: $preset, spatial_dims: 2, in_channels: 3, out_channels: 1}
loss: {name: dice_bce, sigmoid: true, squared_pred: true, to_onehot_y: false}
optimizer: {name: adamw, lr: 0.0001, weight_decay: 0.01}
schedule: {name: constant}
train: {epochs: 2, batch_size: $batch, device: $device, amp: none, val_interval: 0, loader: simple, threads: $threads}
output: {runs_dir: $work/runs}
EOF

medsam="$("$py" "$here/bench/medsam_step.py" train "$work/npy" --preset "$preset" --batch "$batch" \
  --steps "$steps" --threads "$threads" --device "$device")"
echo "$medsam"
ours="$(cd "$work" && "$segflow" bench "$work/job.yaml" --epochs 2 --loaders simple --json 2>/dev/null)"
echo "$ours"
"$py" - "$medsam" "$ours" <<'EOF'
import json, sys
m = json.loads(sys.argv[1])
lines = [json.loads(l) for l in sys.argv[2].splitlines() if l.startswith("{")]
e2e = next(l for l in lines if l.get("bench") == "e2e")
summary = next(l for l in lines if l.get("bench") == "summary")
print(json.dumps({
    "bench": "medsam_ratios", "preset": m["preset"], "img_size": m["img_size"], "batch_size": m["batch_size"],
    "device": m["device"], "medsam_samples_per_s": m["samples_per_s"], "segflow_samples_per_s": e2e["samples_per_s"],
    "samples_per_s_ratio": e2e["samples_per_s"] / m["samples_per_s"],
    "step_ms_ratio": e2e["step_ms"] / m["step_ms"],
    "peak_host_mb_ratio": e2e["peak_host_mb"] / m["peak_host_mb"],
    "pipeline_efficiency": {"medsam": m["pipeline_efficiency"], "segflow": summary["pipeline_efficiency"]["simple"]},
}))
EOF
