#!/usr/bin/env bash
# Cost per epoch as the dataset grows (cases x volume size) and as the decode workers grow,
# with the real data path and trainer of configs/quickstart-unet3d.yaml (segflow bench).
# Prints one JSON line per point: epoch_s (a warm epoch, cases served from the cache),
# first_epoch_s (the cold epoch that decodes every case), samples/s and the pipeline
# efficiency (e2e / compute). The baseline of each sweep is its first point; ratios to it
# are in the "vs_first" fields.
# usage: bench/scaling.sh [EPOCHS per point, default 2]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
epochs="${1:-2}"
py=.venv/bin/python
[[ -x $py ]] || py=python3
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cfg=configs/quickstart-unet3d.yaml

point() {  # sweep cases size workers
  local sweep=$1 cases=$2 size=$3 workers=$4
  local root="$work/data-c$cases-s$size"
  build/apps/segflow bench "$cfg" --json --epochs "$epochs" --loaders actors \
    --set data.root="$root" --set data.synth.cases="$cases" --set data.synth.size="$size" \
    --set data.val_cases=1 --set train.decode_workers="$workers" 2>/dev/null |
    "$py" -c '
import json, sys
sweep, cases, size, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
lines = [json.loads(l) for l in sys.stdin if l.strip()]
e2e = next(j for j in lines if j["bench"] == "e2e")
summ = next(j for j in lines if j["bench"] == "summary")
print(json.dumps({"bench": "scaling", "sweep": sweep, "cases": cases, "size": size, "decode_workers": workers,
                  "train_cases": cases - 1, "steps_per_epoch": e2e["steps"] // e2e["epochs"],
                  "epoch_s": e2e["seconds"] / e2e["epochs"], "first_epoch_s": e2e["first_epoch_s"],
                  "samples_per_s": e2e["samples_per_s"], "data_wait_ms": e2e["data_wait_ms"],
                  "pipeline_efficiency": summ["pipeline_efficiency"]["actors"],
                  "peak_host_mb": summ["peak_host_mb"]}))
' "$sweep" "$cases" "$size" "$workers"
}

{
  for c in 8 16 32; do point cases "$c" 48 2; done
  for s in 32 48 64; do point size 16 "$s" 2; done
  for w in 1 2 4; do point workers 16 64 "$w"; done
} | tee "$work/points.jsonl"

"$py" - "$work/points.jsonl" <<'PY'
import json, sys
pts = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for sweep in ("cases", "size", "workers"):
    p = [x for x in pts if x["sweep"] == sweep]
    b = p[0]
    print(json.dumps({"bench": "scaling_summary", "sweep": sweep,
                      "points": [{k: x[k] for k in ("cases", "size", "decode_workers")} for x in p],
                      "epoch_s_vs_first": [round(x["epoch_s"] / b["epoch_s"], 3) for x in p],
                      "first_epoch_s_vs_first": [round(x["first_epoch_s"] / b["first_epoch_s"], 3) for x in p],
                      "epoch_s_per_case": [round(x["epoch_s"] / x["train_cases"], 4) for x in p]}))
PY
