#!/usr/bin/env bash
# nnU-Net v2 trained by nnU-Net itself against segflow's own plan of the same dataset, on the
# same fold-0 split, for the same wall time (issue 29 item 7). Prints JSON lines:
#   {"name": "nnunet_bench", "side": "nnunet"|"segflow", samples_per_s, s_per_epoch, step_ms,
#    dice_per_class (segflow eval of each side's predictions on the same validation cases),
#    time_to_dice (seconds to the --target mean Dice, segflow's validations; nnU-Net: its
#    per-epoch pseudo Dice), peak_host_mb (GNU time's maximum resident set: the main
#    process, or the largest child, not nnU-Net's augmentation workers added up), wall_s,
#    device, config}
#   {"name": "nnunet_bench_ratios", ...}  segflow / nnU-Net ratios
#
# usage: bench/nnunet-bench.sh [--cases N] [--size S] [--epochs E] [--target D] [--device cpu|cuda]
#                              [--preset default|resenc-m|resenc-l|resenc-xl] [--work DIR] [--keep]
#   --preset: both sides plan with that planner: nnU-Net with -pl nnUNetPlannerResEncM (...L,
#            ...XL) and trains -p nnUNetResEncUNetMPlans; segflow with segflow plan --preset.
#   nnU-Net: nnUNetv2_plan_and_preprocess -c 3d_fullres, then
#            nnUNetv2_train 990 3d_fullres 0 -tr nnUNetTrainer_5epochs -device cpu (E = 5; other
#            E: nnUNetTrainer_Xepochs variants that exist: 1, 5, 10, 20, 50, 100, ...).
#   segflow: segflow plan (measured memory model on the device), then segflow train on its
#            3d_fullres.yaml, fold 0 of the same splits, stopped at nnU-Net's wall time.
# Needs the build (scripts/build.sh) and the venv's nnunetv2 (scripts/setup.sh).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cases=10 size=32 epochs=5 target=0.5 device=cpu work="" keep=0 preset=default
while [ $# -gt 0 ]; do
  case "$1" in
    --cases) cases="$2"; shift 2 ;;
    --size) size="$2"; shift 2 ;;
    --epochs) epochs="$2"; shift 2 ;;
    --target) target="$2"; shift 2 ;;
    --device) device="$2"; shift 2 ;;
    --preset) preset="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "nnunet-bench: unknown argument $1" >&2; exit 2 ;;
  esac
done
segflow="$here/build/apps/segflow"
py="$here/.venv/bin/python"
bin="$here/.venv/bin"
[ -x "$segflow" ] || { echo "nnunet-bench: build segflow first (scripts/build.sh)" >&2; exit 1; }
[ -x "$bin/nnUNetv2_train" ] || { echo "nnunet-bench: nnunetv2 missing in .venv (scripts/setup.sh)" >&2; exit 1; }
if [ -z "$work" ]; then work="$(mktemp -d /tmp/nnunet-bench.XXXXXX)"; fi
if [ "$keep" = 0 ]; then trap 'rm -rf "$work"' EXIT; fi
mkdir -p "$work"
case "$preset" in
  default) planner=ExperimentPlanner plans=nnUNetPlans ;;
  resenc-m) planner=nnUNetPlannerResEncM plans=nnUNetResEncUNetMPlans ;;
  resenc-l) planner=nnUNetPlannerResEncL plans=nnUNetResEncUNetLPlans ;;
  resenc-xl) planner=nnUNetPlannerResEncXL plans=nnUNetResEncUNetXLPlans ;;
  *) echo "nnunet-bench: --preset: expected default, resenc-m, resenc-l or resenc-xl, got $preset" >&2; exit 2 ;;
esac
trainer="nnUNetTrainer_${epochs}epochs"
[ "$epochs" = 1 ] && trainer=nnUNetTrainer_1epoch
log() { echo "nnunet-bench: $*" >&2; }

# ---- the dataset (nnU-Net v2 raw layout) and the fold-0 split both sides use ----
ds="$work/ds"
"$segflow" synth --cases "$cases" --size "$size" --format nifti --seed 11 --out "$ds" >&2
export nnUNet_raw="$work/nnUNet_raw" nnUNet_preprocessed="$work/nnUNet_preprocessed"
export nnUNet_results="$work/nnUNet_results" nnUNet_compile=f nnUNet_n_proc_DA=2 nnUNet_def_n_proc=2
mkdir -p "$nnUNet_raw/Dataset990_Segflow" "$nnUNet_preprocessed" "$nnUNet_results"
for f in imagesTr labelsTr dataset.json; do ln -sfn "$ds/$f" "$nnUNet_raw/Dataset990_Segflow/$f"; done

# ---- segflow's plan (fingerprint + measured trials) ----
t0=$(date +%s.%N)
/usr/bin/time -f %M -o "$work/plan.rss" "$segflow" plan "$ds" --out "$work/plan" --device "$device" \
  --configurations 3d_fullres --preset "$preset" >&2
plan_s=$(echo "$(date +%s.%N) - $t0" | bc)
log "segflow plan: ${plan_s}s"

# ---- nnU-Net: plan, preprocess, train fold 0 on segflow's split ----
"$segflow" train "$work/plan/3d_fullres.yaml" --set train.epochs=1 --set train.steps_per_epoch=1 \
  --set train.val_interval=0 --set "output.runs_dir=$work/split-runs" --quiet >"$work/split.out" 2>&1
split_run="$(sed -n 's/^run folder: //p' "$work/split.out")"
t0=$(date +%s.%N)
/usr/bin/time -f %M -o "$work/nn_pre.rss" "$bin/nnUNetv2_plan_and_preprocess" -d 990 -c 3d_fullres -np 2 \
  -pl "$planner" --verify_dataset_integrity >"$work/nn_pre.log" 2>&1
nn_pre_s=$(echo "$(date +%s.%N) - $t0" | bc)
cp "$split_run/splits.json" "$nnUNet_preprocessed/Dataset990_Segflow/splits_final.json"
t0=$(date +%s.%N)
/usr/bin/time -f %M -o "$work/nn_train.rss" "$bin/nnUNetv2_train" 990 3d_fullres 0 \
  -tr "$trainer" -p "$plans" -device "$device" >"$work/nn_train.log" 2>&1
nn_train_s=$(echo "$(date +%s.%N) - $t0" | bc)
log "nnU-Net: preprocess ${nn_pre_s}s, train ${nn_train_s}s"
nn_fold="$nnUNet_results/Dataset990_Segflow/${trainer}__${plans}__3d_fullres/fold_0"

# ---- segflow: the same wall time as nnU-Net's training (validation each epoch) ----
budget=$(printf '%.0f' "$nn_train_s")
t0=$(date +%s.%N)
set +e
/usr/bin/time -f %M -o "$work/sf_train.rss" timeout "$budget" "$segflow" train "$work/plan/3d_fullres.yaml" \
  --set train.epochs=100000 --set train.val_interval=10 \
  --set train.checkpoint_interval=10 --set "output.runs_dir=$work/runs" --quiet >"$work/sf_train.out" 2>"$work/sf_train.log"
sf_rc=$?
set -e
sf_train_s=$(echo "$(date +%s.%N) - $t0" | bc)
sf_run="$(ls -d "$work"/runs/*/ | head -1)"
log "segflow: train ${sf_train_s}s (exit $sf_rc: 124 = stopped at the budget), run $sf_run"

# ---- the same validation cases, scored the same way (segflow eval) ----
mkdir -p "$work/val_images" "$work/val_labels" "$work/sf_pred"
"$py" - "$split_run/split.json" "$ds" "$work" <<'EOF'
import json, os, sys
split, ds, work = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
for cid in split["val"]:
    os.symlink(f"{ds}/imagesTr/{cid}_0000.nii.gz", f"{work}/val_images/{cid}.nii.gz")
    os.symlink(f"{ds}/labelsTr/{cid}.nii.gz", f"{work}/val_labels/{cid}.nii.gz")
EOF
ckpt="$sf_run/best.pt"; [ -f "$ckpt" ] || ckpt="$sf_run/last.pt"
"$segflow" infer --checkpoint "$ckpt" --input "$work/val_images" --output "$work/sf_pred" --device "$device" \
  --quiet >/dev/null 2>"$work/sf_infer.log"
"$segflow" eval --pred "$work/sf_pred" --gt "$work/val_labels" --json >"$work/sf_eval.json"
"$segflow" eval --pred "$nn_fold/validation" --gt "$work/val_labels" --json >"$work/nn_eval.json"

# ---- JSON lines ----
"$py" - "$work" "$nn_fold" "$sf_run" "$target" "$device" "$trainer" "$cases" "$size" "$nn_train_s" "$sf_train_s" \
  "$plan_s" "$nn_pre_s" "$preset" "$plans" <<'EOF'
import glob, json, re, sys
work, nn_fold, sf_run, target, device, trainer, cases, size = sys.argv[1:9]
nn_train_s, sf_train_s, plan_s, nn_pre_s = map(float, sys.argv[9:13])
preset, plans_name = sys.argv[13:15]
target = float(target)

def rss(name):
    return int(open(f"{work}/{name}.rss").read().split()[-1]) / 1024.0

def dice(path):
    """segflow eval --json: per class mean Dice over the cases, and their mean."""
    j = json.load(open(path))
    per = {k: v.get("dice") for k, v in j.get("mean", {}).items()}
    vals = [v for v in per.values() if v is not None]
    return {"mean_dice": sum(vals) / len(vals) if vals else None}, per

nn_plans = json.load(open(f"{work}/nnUNet_preprocessed/Dataset990_Segflow/{plans_name}.json"))
nn_cfg = nn_plans["configurations"]["3d_fullres"]
log = open(glob.glob(f"{nn_fold}/training_log_*.txt")[0]).read()
epoch_times = [float(x) for x in re.findall(r"Epoch time: ([0-9.]+) s", log)]
pseudo = [float(x) for x in re.findall(r"Pseudo dice \[([^\]]*)\]", log) and
          [sum(float(v.strip().strip("np.float32()")) for v in m.split(",")) / len(m.split(","))
           for m in re.findall(r"Pseudo dice \[([^\]]*)\]", log)]]
nn_bs = nn_cfg["batch_size"]
nn_sps = nn_bs * 250 / (sum(epoch_times) / len(epoch_times)) if epoch_times else None
nn_ttd = None
if epoch_times:
    t = 0.0
    for et, d in zip(epoch_times, pseudo):
        t += et
        if d >= target and nn_ttd is None:
            nn_ttd = t
nn_eval, nn_dice = dice(f"{work}/nn_eval.json")

sf_plans = json.load(open(f"{work}/plan/plans.json"))
sf_cfg = sf_plans["configurations"]["3d_fullres"]
recs = [json.loads(l) for l in open(f"{sf_run}/metrics.jsonl")]
epochs_r = [r for r in recs if r.get("type") == "epoch"]
vals = [r for r in recs if r.get("type") == "validation"]
# Training throughput over the epochs after the first (validation not included); an epoch
# here is one pass over the training cases, so "s_per_epoch" is given for nnU-Net's
# 250 steps of the planned batch, from that throughput.
sf_bs = json.load(open(f"{work}/plan/plans.json"))["configurations"]["3d_fullres"]["batch_size"]
tail = epochs_r[1:] if len(epochs_r) > 1 else epochs_r
sf_samples = sum(r.get("samples_per_s", 0) * r.get("seconds", 0) for r in tail)
sf_sps = sf_samples / sum(r.get("seconds", 0) for r in tail) if tail else None
sf_spe = 250 * sf_bs / sf_sps if sf_sps else None
sf_steps = sum(r.get("steps", 0) for r in epochs_r)
sf_ttd, t = None, 0.0  # training + validation seconds, in record order
for r in recs:
    if r.get("type") in ("epoch", "validation"):
        t += r.get("seconds", 0.0)
    if r.get("type") == "validation" and (r.get("mean_dice") or 0) >= target and sf_ttd is None:
        sf_ttd = t
sf_eval, sf_dice = dice(f"{work}/sf_eval.json")

common = {"device": device, "cases": int(cases), "size": int(size), "target_dice": target, "preset": preset}
nn = {"name": "nnunet_bench", "side": "nnunet", "samples_per_s": nn_sps,
      "s_per_epoch": sum(epoch_times) / len(epoch_times) if epoch_times else None,
      "step_ms": 1000 * sum(epoch_times) / len(epoch_times) / 250 if epoch_times else None,
      "epochs": len(epoch_times), "dice_per_class": nn_dice, "mean_dice": nn_eval.get("mean_dice"),
      "steps": 250 * len(epoch_times), "pseudo_dice_per_epoch": pseudo, "time_to_dice_s": nn_ttd, "peak_host_mb": rss("nn_train"),
      "wall_s": nn_train_s, "preprocess_s": nn_pre_s, "patch_size": nn_cfg["patch_size"],
      "batch_size": nn_bs, "config": {"trainer": trainer, **common}}
sf = {"name": "nnunet_bench", "side": "segflow", "samples_per_s": sf_sps, "s_per_epoch": sf_spe,
      "step_ms": 1000 * sf_spe / 250 if sf_spe else None, "epochs": len(epochs_r), "steps": sf_steps,
      "dice_per_class": sf_dice, "mean_dice": sf_eval.get("mean_dice"),
      "val_dice_per_epoch": [v.get("mean_dice") for v in vals], "time_to_dice_s": sf_ttd,
      "peak_host_mb": rss("sf_train"), "wall_s": sf_train_s, "plan_s": plan_s,
      "patch_size": sf_cfg["patch_size"], "batch_size": sf_cfg["batch_size"],
      "config": {"plan": "segflow plan --memory-model measured --preset " + preset, "val_interval_epochs": 10,
                 **common}}
print(json.dumps(nn))
print(json.dumps(sf))
ratio = lambda a, b: (a / b) if (a is not None and b not in (None, 0)) else None
print(json.dumps({"name": "nnunet_bench_ratios", "samples_per_s": ratio(sf_sps, nn_sps),
                  "mean_dice": ratio(sf["mean_dice"], nn["mean_dice"]),
                  "time_to_dice": ratio(sf_ttd, nn_ttd), "peak_host_mb": ratio(sf["peak_host_mb"], nn["peak_host_mb"]),
                  "note": "segflow / nnU-Net", **common}))
EOF
