#!/usr/bin/env bash
# segflow against plain PyTorch and MONAI on the same machine, data, network, batch and
# split (configs/quickstart-unet3d.yaml), in one run; prints JSON lines and the ratios:
#  1. time to Dice: `segflow train` of the recipe, and each baseline trained the same way
#     (same train/val cases from the run's split.json, cosine schedule, validation every 10
#     epochs), until the validation mean foreground Dice reaches TARGET;
#  2. samples/s: `segflow bench` (actors and simple loaders, with the compute-only limit)
#     and each baseline over EPOCHS epochs after a warm-up one.
# usage: bench/run-bench.sh [SECONDS per segflow loader, default 30] [baseline epochs, default 3] [TARGET, default 0.9]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
secs="${1:-30}"
epochs="${2:-3}"
target="${3:-0.9}"
py=.venv/bin/python
[[ -x $py ]] || py=python3
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cfg=configs/quickstart-unet3d.yaml
set_data=(--set data.root="$work/data")

# 1. Time to Dice. segflow's run makes the dataset and the split the baselines reuse.
build/apps/segflow train "$cfg" "${set_data[@]}" --set output.runs_dir="$work/runs" > "$work/train.log" 2>&1 ||
  { cat "$work/train.log" >&2; exit 1; }
run="$(ls -d "$work"/runs/*/ | head -1)"
"$py" - "$run/metrics.jsonl" "$target" <<'PY' | tee "$work/ttd.jsonl"
import json, sys
target, elapsed, hit, best, history = float(sys.argv[2]), 0.0, None, 0.0, []
for line in open(sys.argv[1]):
    j = json.loads(line)
    if j["type"] in ("epoch", "validation"):
        elapsed += j["seconds"]
    if j["type"] == "validation" and j["mean_dice"] is not None:
        best = max(best, j["mean_dice"])
        history.append({"epoch": j["epoch"] + 1, "seconds": elapsed, "mean_dice": j["mean_dice"]})
        if hit is None and j["mean_dice"] >= target:
            hit = history[-1]
print(json.dumps({"bench": "time_to_dice", "mode": "segflow", "target_dice": target,
                  "seconds": hit["seconds"] if hit else None, "epoch": hit["epoch"] if hit else None,
                  "best_dice": best, "history": history}))
PY
for mode in torch monai; do
  "$py" bench/baselines/train_baseline.py --mode "$mode" --data "$work/data" --split "$run/split.json" \
    --target-dice "$target" 2>"$work/$mode-ttd.err" | tee -a "$work/ttd.jsonl" || { cat "$work/$mode-ttd.err" >&2; exit 1; }
done

# 2. Samples per second.
build/apps/segflow bench "$cfg" --json --seconds "$secs" --loaders actors,simple "${set_data[@]}" 2>/dev/null \
  | tee "$work/segflow.jsonl"
for mode in torch monai; do
  "$py" bench/baselines/train_baseline.py --mode "$mode" --data "$work/data" --split "$run/split.json" \
    --epochs "$epochs" 2>"$work/$mode.err" | tee -a "$work/base.jsonl" || { cat "$work/$mode.err" >&2; exit 1; }
done

"$py" - "$work/segflow.jsonl" "$work/base.jsonl" "$work/ttd.jsonl" <<'PY'
import json, sys
rows = lambda f: [json.loads(l) for l in open(f) if l.strip()]
seg, base, ttd = rows(sys.argv[1]), {j["mode"]: j for j in rows(sys.argv[2])}, {j["mode"]: j for j in rows(sys.argv[3])}
e2e = {j["loader"]: j["samples_per_s"] for j in seg if j["bench"] == "e2e"}
def ratio(a, b):
    return a / b if a and b else None
out = {"bench": "ratios", "segflow_actors_samples_per_s": e2e.get("actors"),
       "torch_samples_per_s": base["torch"]["samples_per_s"], "monai_samples_per_s": base["monai"]["samples_per_s"],
       "segflow_over_torch": ratio(e2e["actors"], base["torch"]["samples_per_s"]),
       "segflow_over_monai": ratio(e2e["actors"], base["monai"]["samples_per_s"]),
       "pipeline_efficiency": next(j for j in seg if j["bench"] == "summary")["pipeline_efficiency"],
       "target_dice": ttd["segflow"]["target_dice"],
       "time_to_dice_s": {m: ttd[m]["seconds"] for m in ttd},
       # > 1: segflow reached the target that many times sooner
       "time_to_dice_torch_over_segflow": ratio(ttd["torch"]["seconds"], ttd["segflow"]["seconds"]),
       "time_to_dice_monai_over_segflow": ratio(ttd["monai"]["seconds"], ttd["segflow"]["seconds"])}
print(json.dumps(out))
PY
