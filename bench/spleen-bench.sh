#!/usr/bin/env bash
# segflow's spleen recipe (configs/spleen-ct-unet3d.yaml) against MONAI's fast-training recipe
# (bench/baselines/monai_spleen_fast.py) in one run, on the same synthetic data, split,
# network, crops, optimizer and AMP. Prints JSON lines and a final "spleen_ratios" line:
#  1. samples/s: `segflow bench` (end to end and compute only, actors loader) and MONAI
#     (CacheDataset -> ThreadDataLoader, cache on the device), over EPOCHS after a warm-up
#     (once, with the first seed);
#  2. with TARGET: time to validation Dice TARGET (`segflow train` and MONAI, validating
#     every VAL epochs on the same held-out cases), for every seed of --seeds and every target
#     of a comma list; the final line gives, per target, how many seeds each side reached it
#     on, the median times and the geometric mean of the per-seed MONAI/segflow time ratios
#     over the seeds where both did.
# Full size (the config as shipped: 32 cases of 160^2, 96^3 crops, 160^3 windows) needs a GPU;
# on a CPU pass a reduced size, e.g. `bench/spleen-bench.sh --size 64 --crop 48 --roi 64 --cases 8`.
# usage: bench/spleen-bench.sh [--size S] [--crop C] [--roi R] [--cases N] [--epochs E]
#                              [--target DICE[,DICE2...] --max-epochs M --val VAL]
#                              [--seed S | --seeds S1,S2,...] [--lr LR] [--amp none|bf16|fp16]
#                              [--set KEY=VALUE]... [--device D] [--out DIR]
# A seed sets segflow's `seed` (its split of the cases, weights, crops, augmentation) and MONAI's
# set_determinism; MONAI trains on segflow's split, so both sides share it for every seed; the
# synthetic data stay the same. --lr replaces the recipe's SGD learning rate (0.2) on both sides,
# --amp its autocast (bf16) on both sides. --set passes a config override to segflow only (a
# recipe experiment; the MONAI side does not change).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
size=160 crop=96 roi=160 cases=32 epochs=3 target="" max_epochs=300 val=10 seeds=0 lr="" amp="" device="" out=""
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --size) size=$2; shift 2 ;;
    --crop) crop=$2; shift 2 ;;
    --roi) roi=$2; shift 2 ;;
    --cases) cases=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --target) target=$2; shift 2 ;;
    --max-epochs) max_epochs=$2; shift 2 ;;
    --val) val=$2; shift 2 ;;
    --seed|--seeds) seeds=$2; shift 2 ;;
    --lr) lr=$2; shift 2 ;;
    --amp) amp=$2; shift 2 ;;
    --set) extra+=(--set "$2"); shift 2 ;;
    --device) device=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "spleen-bench.sh: unknown argument $1 (see the usage at the top of the script)" >&2; exit 2 ;;
  esac
done
[[ $seeds =~ ^[0-9]+(,[0-9]+)*$ ]] ||
  { echo "spleen-bench.sh: --seeds: expected non-negative integers separated by commas, got '$seeds'" >&2; exit 2; }
[[ -z $target || $target =~ ^(0?\.[0-9]+|1(\.0*)?)(,(0?\.[0-9]+|1(\.0*)?))*$ ]] ||
  { echo "spleen-bench.sh: --target: expected Dice values in (0, 1] separated by commas, got '$target'" >&2; exit 2; }
IFS=, read -r -a seed_list <<< "$seeds"
py=.venv/bin/python
[[ -x $py ]] || py=python3
segflow=${SEGFLOW_BIN:-build/apps}/segflow
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
[ -n "$out" ] && mkdir -p "$out"
[ -n "$device" ] || device=$("$py" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')
cfg=configs/spleen-ct-unet3d.yaml
# Stage 6 of the config is rand_crop_pos_neg.
base=(--set data.root="$work/data" --set data.synth.size="$size" --set data.synth.cases="$cases"
      --set "stages.6.options.spatial_size=[$crop, $crop, $crop]" --set "validation.roi_size=[$roi, $roi, $roi]"
      --set train.device="$device" --set output.runs_dir="$work/runs")
monai_opts=()
[ -n "$lr" ] && { base+=(--set optimizer.lr="$lr"); monai_opts+=(--lr "$lr"); }
[ -n "$amp" ] && { base+=(--set train.amp="$amp"); monai_opts+=(--amp "$amp"); }
emit() { tee -a "$work/all.jsonl"; }

first=1
for seed in "${seed_list[@]}"; do
  sets=("${base[@]}" --set seed="$seed" "${extra[@]}")
  # A 1-epoch training run makes the dataset (the first time) and this seed's split.
  rm -rf "$work/runs"
  "$segflow" train "$cfg" "${sets[@]}" --set train.epochs=1 --set train.val_interval=0 > "$work/prep.log" 2>&1 ||
    { cat "$work/prep.log" >&2; exit 1; }
  # Kept outside runs/, which the time-to-Dice part below empties before training again.
  split="$work/split-$seed.json"
  cp "$(ls -d "$work"/runs/*/ | head -1)split.json" "$split"

  # 1. Samples per second (once).
  if [ "$first" = 1 ]; then
    "$segflow" bench "$cfg" --json --epochs "$epochs" --loaders actors "${sets[@]}" 2>"$work/bench.err" | emit ||
      { cat "$work/bench.err" >&2; exit 1; }
    "$py" bench/baselines/monai_spleen_fast.py --data "$work/data" --split "$split" --crop "$crop" --roi "$roi" \
      --epochs "$epochs" --device "$device" "${monai_opts[@]}" 2>"$work/monai.err" | emit ||
      { cat "$work/monai.err" >&2; exit 1; }
    first=0
  fi

  # 2. Time to Dice.
  [ -n "$target" ] || continue
  rm -rf "$work/runs"
  "$segflow" train "$cfg" "${sets[@]}" --set train.epochs="$max_epochs" --set train.val_interval="$val" \
    > "$work/train.log" 2>&1 || { cat "$work/train.log" >&2; exit 1; }
  run="$(ls -d "$work"/runs/*/ | head -1)"
  "$py" - "$run/metrics.jsonl" "$target" "$seed" <<'PY' | emit
import json, sys
sys.path.insert(0, "bench/baselines")
from monai_spleen_fast import hits, targets_arg  # the same reading of targets and hits as the MONAI side
targets, elapsed, history = targets_arg(sys.argv[2]), 0.0, []
for line in open(sys.argv[1]):
    j = json.loads(line)
    if j["type"] in ("epoch", "validation"):
        elapsed += j["seconds"]
    if j["type"] == "validation" and j.get("mean_dice") is not None:
        history.append({"epoch": j["epoch"] + 1, "seconds": elapsed, "mean_dice": j["mean_dice"]})
reached = hits(history, targets)
hit = reached[f"{targets[-1]:g}"]
print(json.dumps({"bench": "time_to_dice", "name": "segflow_spleen", "seed": int(sys.argv[3]), "targets": reached,
                  "target_dice": targets[-1], "seconds": hit["seconds"] if hit else None,
                  "epoch": hit["epoch"] if hit else None,
                  "best_dice": max((h["mean_dice"] for h in history), default=None), "history": history}))
PY
  "$py" bench/baselines/monai_spleen_fast.py --data "$work/data" --split "$split" --crop "$crop" --roi "$roi" \
    --target-dice "$target" --max-epochs "$max_epochs" --val-interval "$val" --device "$device" --seed "$seed" \
    "${monai_opts[@]}" 2>"$work/monai-ttd.err" | emit || { cat "$work/monai-ttd.err" >&2; exit 1; }
done

# The --set overrides travel as their own argument list after "--" (extra holds "--set K=V" pairs).
"$py" - "$work/all.jsonl" "$size" "$crop" "$roi" "$cases" "$device" "$seeds" "$lr" "$amp" -- "${extra[@]}" <<'PY' | emit
import json, math, statistics, sys
rest = sys.argv[sys.argv.index("--") + 1:]
segflow_set = [v for flag, v in zip(rest[::2], rest[1::2]) if flag == "--set"]
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
get = lambda **kw: next((r for r in rows if all(r.get(k) == v for k, v in kw.items())), None)
e2e, comp, summ = get(bench="e2e"), get(bench="compute"), get(bench="summary")
monai = get(bench="baseline", name="monai_fast_spleen")
seeds = [int(s) for s in sys.argv[7].split(",")]
ratio = lambda a, b: a / b if a and b else None
median = lambda v: statistics.median(v) if v else None


def per_target():
    """Per target: seeds reached on each side, median seconds and epochs over the seeds that
    reached it, and the per-seed MONAI/segflow time ratios where both did (> 1: segflow sooner)."""
    side = {n: {r["seed"]: r for r in rows if r.get("bench") == "time_to_dice" and r["name"] == n}
            for n in ("segflow_spleen", "monai_fast_spleen")}
    if not side["segflow_spleen"]:
        return None
    out = {}
    for t in side["segflow_spleen"][seeds[0]]["targets"]:
        hit = {n: {s: side[n][s]["targets"][t] for s in seeds if side[n][s]["targets"][t]} for n in side}
        both = [s for s in seeds if s in hit["segflow_spleen"] and s in hit["monai_fast_spleen"]]
        ratios = [hit["monai_fast_spleen"][s]["seconds"] / hit["segflow_spleen"][s]["seconds"] for s in both]
        out[t] = {
            "seeds": len(seeds),
            "reached": {n.split("_")[0]: sorted(hit[n]) for n in side},
            "median_s": {n.split("_")[0]: median([h["seconds"] for h in hit[n].values()]) for n in side},
            "median_epoch": {n.split("_")[0]: median([h["epoch"] for h in hit[n].values()]) for n in side},
            "monai_over_segflow_per_seed": dict(zip(map(str, both), ratios)),
            "monai_over_segflow_geomean": math.exp(statistics.fmean(map(math.log, ratios))) if ratios else None}
    return out


print(json.dumps({
    "bench": "spleen_ratios", "name": "spleen-ct-unet3d", "device": sys.argv[6],
    "config": {"size": int(sys.argv[2]), "crop": int(sys.argv[3]), "roi": int(sys.argv[4]), "cases": int(sys.argv[5]),
               "seeds": seeds, "lr": float(sys.argv[8]) if sys.argv[8] else None,  # None: the config's
               "amp": sys.argv[9] or None, "segflow_set": segflow_set},
    "samples_per_s": e2e["samples_per_s"], "step_ms": e2e["step_ms"], "data_wait_ms": e2e["data_wait_ms"],
    "segflow_e2e_samples_per_s": e2e["samples_per_s"], "segflow_compute_samples_per_s": comp["samples_per_s"],
    "pipeline_efficiency": summ["pipeline_efficiency"], "segflow_peak_host_mb": summ["peak_host_mb"],
    "segflow_peak_gpu_mb": summ.get("peak_gpu_mb"),
    "monai_samples_per_s": monai["samples_per_s"], "monai_peak_host_mb": monai["peak_host_mb"],
    "monai_peak_device_mb": monai["peak_device_mb"],
    "segflow_over_monai": ratio(e2e["samples_per_s"], monai["samples_per_s"]),
    "time_to_dice": per_target()}))
PY
[ -n "$out" ] && cp "$work/all.jsonl" "$out/spleen-bench.jsonl"
exit 0
