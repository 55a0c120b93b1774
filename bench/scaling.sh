#!/usr/bin/env bash
# Cost per epoch as the dataset grows (cases x volume size) and as the decode workers grow,
# with the real data path and trainer of configs/quickstart-unet3d.yaml (segflow bench).
# Prints one JSON line per point: epoch_s (a warm epoch, cases served from the cache),
# first_epoch_s (the cold epoch that decodes every case), samples/s and the pipeline
# efficiency (e2e / compute). The baseline of each sweep is its first point; ratios to it
# are in the "vs_first" fields.
#
# usage: bench/scaling.sh [EPOCHS per point, default 2]     quick sweeps (32-64^3, 8-32 cases)
#        bench/scaling.sh --real [options]                   real sizes (128-320^3, 8-64 cases)
# --real sweeps the volume size 128, 192, 256, 320 at 8 cases and the cases 8, 16, 32, 64 at
# size 128 (data.synth size: x = y = size, z = size x spacing ratio x 1.2, about 0.3-1.3 x size).
# Each point also reports the synthesis time, the peak host memory, the cache's bytes and
# bytes per cached voxel, and the voxels per case. The datasets are made first with
# `segflow synth` (NIfTI .nii.gz, seed 1); the cases sweep makes its largest dataset once
# and takes the others as its first N cases (the same cases at every point).
# Guards (a shared 2-core machine): a point is skipped when its estimated cache exceeds
# --max-cache-gib (default 16) or what MemAvailable leaves, when its estimated synthesis +
# decode time exceeds --max-point-s (default 900), or when it would end past --budget-s
# (default 3000) from the start; a bench that runs past --max-point-s is stopped and reported as such.
# options: --epochs N (default 2)  --cases-size N (default 128)  --size-cases N (default 8)
#          --sizes "128 192 256 320"  --cases "8 16 32 64"  --workers N (default 2)
#          --max-cache-gib G  --max-point-s S  --budget-s S
#          --keep DIR (work there and keep the datasets; a later run reuses them)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
py=.venv/bin/python
[[ -x $py ]] || py=python3
cfg=configs/quickstart-unet3d.yaml
seg=build/apps/segflow

real=0 epochs=2 cases_size=128 size_cases=8 sizes="128 192 256 320" case_list="8 16 32 64"
workers=2 max_cache_gib=16 max_point_s=900 budget_s=3000 keep=""
while (($#)); do
  case $1 in
    --real) real=1 ;;
    --epochs) epochs=$2; shift ;;
    --cases-size) cases_size=$2; shift ;;
    --size-cases) size_cases=$2; shift ;;
    --sizes) sizes=$2; shift ;;
    --cases) case_list=$2; shift ;;
    --workers) workers=$2; shift ;;
    --max-cache-gib) max_cache_gib=$2; shift ;;
    --max-point-s) max_point_s=$2; shift ;;
    --budget-s) budget_s=$2; shift ;;
    --keep) keep=$2; shift ;;
    [0-9]*) epochs=$1 ;;
    *) echo "bench/scaling.sh: unknown option $1 (see the header of the script)" >&2; exit 2 ;;
  esac
  shift
done

if [[ -n $keep ]]; then
  work=$keep
  mkdir -p "$work"
else
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
fi

# Reads segflow bench's JSON lines on stdin and prints the point's line.
summarise='
import json, sys
sweep, cases, size, workers, extra = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), json.loads(sys.argv[5])
lines = [json.loads(l) for l in sys.stdin if l.strip().startswith("{")]
e2e = next(j for j in lines if j["bench"] == "e2e")
summ = next(j for j in lines if j["bench"] == "summary")
p = {"bench": "scaling", "sweep": sweep, "cases": cases, "size": size, "decode_workers": workers,
     "train_cases": cases - 1, "steps_per_epoch": e2e["steps"] // e2e["epochs"],
     "epoch_s": e2e["seconds"] / e2e["epochs"], "first_epoch_s": e2e["first_epoch_s"],
     "samples_per_s": e2e["samples_per_s"], "data_wait_ms": e2e["data_wait_ms"],
     "pipeline_efficiency": summ["pipeline_efficiency"]["actors"],
     "peak_host_mb": summ["peak_host_mb"]}
if "cache_bytes" in e2e:
    ent = max(e2e["cache_entries"], 1)
    p.update({"first_epoch_decode_s": e2e["first_epoch_decode_s"],
              "cache_mb": e2e["cache_bytes"] / 2**20, "cache_entries": e2e["cache_entries"],
              "voxels_per_case": e2e["cached_voxels"] // ent,
              "bytes_per_cached_voxel": e2e["bytes_per_cached_voxel"],
              "cache_dtype": e2e["cache_dtype"], "cache_device": e2e["cache_device"]})
p.update(extra)
print(json.dumps(p))
'

bench_point() {  # sweep cases size workers root extra-json [timeout]
  local sweep=$1 cases=$2 size=$3 workers=$4 root=$5 extra=$6 limit=${7:-0} rc=0
  local out="$work/bench-$sweep-c$cases-s$size-w$workers.out"
  local -a cmd=("$seg" bench "$cfg" --json --epochs "$epochs" --loaders actors
    --set data.root="$root" --set data.synth.cases="$cases" --set data.synth.size="$size"
    --set data.val_cases=1 --set train.decode_workers="$workers")
  if ((limit > 0)); then
    timeout "$limit" "${cmd[@]}" >"$out" 2>"$out.err" || rc=$?
  else
    "${cmd[@]}" >"$out" 2>"$out.err" || rc=$?
  fi
  if ((rc != 0)); then
    local why last
    last=$(tail -n 1 "$out.err" | tr -d '"' | tr -d "\\\\")
    why="segflow bench failed (exit $rc): $last"
    ((rc == 124)) && why="stopped after --max-point-s $limit s (segflow bench still running)"
    echo "{\"bench\": \"scaling\", \"sweep\": \"$sweep\", \"cases\": $cases, \"size\": $size, \"skipped\": \"$why\"}"
    return 0
  fi
  "$py" -c "$summarise" "$sweep" "$cases" "$size" "$workers" "$extra" <"$out"
}

loadavg() {  # sweep when
  echo "{\"bench\": \"scaling_load\", \"sweep\": \"$1\", \"when\": \"$2\", \"loadavg\": [$(cut -d' ' -f1-3 /proc/loadavg | tr ' ' ',')], \"time\": \"$(date -u +%FT%TZ)\"}"
}

if ((real == 0)); then
  point() {  # sweep cases size workers (data.synth makes the dataset inside segflow bench)
    bench_point "$1" "$2" "$3" "$4" "$work/data-c$2-s$3" '{}'
  }
  {
    for c in 8 16 32; do point cases "$c" 48 2; done
    for s in 32 48 64; do point size 16 "$s" 2; done
    for w in 1 2 4; do point workers 16 64 "$w"; done
  } | tee "$work/points.jsonl"
else
  start=$(date +%s)
  # Mean voxels per case: size^2 x size x 1.2 x E[sxy / sz] with sxy ~ U(0.7, 1.6),
  # sz ~ U(1.5, 3) (pipeline/synth.cpp): 1.2 x 1.15 x ln(2) / 1.5 = 0.64.
  est_voxels() { echo $(( $1 * $2 * $2 * $2 * 64 / 100 )); }
  # Synthesis rate from one probe case at the smallest size (voxels per second).
  probe_size=$(tr ' ' '\n' <<<"$sizes $cases_size" | sort -n | head -n 1)
  t0=$(date +%s.%N)
  "$seg" synth --cases 1 --size "$probe_size" --seed 1 --out "$work/probe" >/dev/null
  t1=$(date +%s.%N)
  rate=$("$py" -c "import sys; print(int($(est_voxels 1 "$probe_size") / max(float(sys.argv[2]) - float(sys.argv[1]), 1e-3)))" "$t0" "$t1")
  rm -rf "$work/probe"
  echo "{\"bench\": \"scaling_probe\", \"size\": $probe_size, \"synth_voxels_per_s\": $rate}"

  # Decides whether a point of `cases` x `size` runs; prints the reason to skip, or nothing.
  # Synthesis cost counts only the cases still to make (new); decode and training are
  # taken as about as long again as the synthesis.
  guard() {  # cases size new_cases
    local vox est_cache est_s avail now
    vox=$(est_voxels "$1" "$2")
    est_cache=$((vox * 4))  # bytes: about 3.3 per voxel with cache_dtype exact, plus a margin
    est_s=$(( ($(est_voxels "$3" "$2") + vox) / rate + 10 ))
    avail=$(( $(awk '/MemAvailable/ {print $2}' /proc/meminfo) * 1024 ))
    now=$(( $(date +%s) - start ))
    if ((est_cache > max_cache_gib * 1024 * 1024 * 1024)); then
      echo "estimated cache $((est_cache >> 20)) MiB exceeds --max-cache-gib $max_cache_gib"
    elif ((est_cache + (2 << 30) > avail)); then
      echo "estimated cache $((est_cache >> 20)) MiB + 2 GiB exceeds MemAvailable $((avail >> 20)) MiB"
    elif ((est_s > max_point_s)); then
      echo "estimated ${est_s} s (synthesis + decode) exceeds --max-point-s $max_point_s"
    elif ((now + est_s > budget_s)); then
      echo "estimated ${est_s} s would end past --budget-s $budget_s (${now} s used)"
    fi
  }

  # Makes (or takes) the dataset of the first `cases` cases at `size`; prints the synthesis
  # seconds (0 when it was taken from a larger one).
  make_root() {  # cases size root
    local cases=$1 size=$2 root=$3 full="$work/full-s$2"
    if [[ -f $full/dataset.json ]] && (( $(cat "$full/.cases") >= cases )); then
      rm -rf "$root"
      mkdir -p "$root/imagesTr" "$root/labelsTr"
      "$py" - "$full" "$root" "$cases" <<'PY'
import json, os, sys
full, root, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
ds = json.load(open(os.path.join(full, "dataset.json")))
ds["training"] = ds["training"][:n]
ds["numTraining"] = n
for e in ds["training"]:
    for k in ("image", "label"):
        os.symlink(os.path.abspath(os.path.join(full, e[k])), os.path.join(root, e[k]))
json.dump(ds, open(os.path.join(root, "dataset.json"), "w"), indent=2)
PY
      echo 0
      return
    fi
    rm -rf "$full"
    local t0 t1
    t0=$(date +%s.%N)
    "$seg" synth --cases "$cases" --size "$size" --seed 1 --out "$full" >/dev/null
    t1=$(date +%s.%N)
    echo "$cases" >"$full/.cases"
    make_root "$cases" "$size" "$root" >/dev/null
    "$py" -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 2))" "$t0" "$t1"
  }

  real_point() {  # sweep cases size new_cases
    local sweep=$1 cases=$2 size=$3 why synth_s
    why=$(guard "$cases" "$size" "$4")
    if [[ -n $why ]]; then
      echo "{\"bench\": \"scaling\", \"sweep\": \"$sweep\", \"cases\": $cases, \"size\": $size, \"skipped\": \"$why\"}"
      return 0
    fi
    synth_s=$(make_root "$cases" "$size" "$work/data-c$cases-s$size")
    bench_point "$sweep" "$cases" "$size" "$workers" "$work/data-c$cases-s$size" \
      "{\"synth_s\": $synth_s, \"synth_cases\": $4}" "$max_point_s"
    rm -rf "$work/data-c$cases-s$size"  # the links; the full dataset stays for the next point
  }

  {
    # Cases at a fixed size: make the largest dataset that passes the guard, once.
    loadavg cases before
    largest=0
    for c in $case_list; do
      [[ -z $(guard "$c" "$cases_size" "$c") ]] && largest=$c
    done
    for c in $case_list; do
      if ((largest > 0 && c <= largest)); then
        if [[ -f $work/full-s$cases_size/dataset.json ]]; then real_point cases "$c" "$cases_size" 0
        else
          # the first point makes the largest dataset
          why=$(guard "$largest" "$cases_size" "$largest")
          if [[ -n $why ]]; then
            echo "{\"bench\": \"scaling\", \"sweep\": \"cases\", \"cases\": $c, \"size\": $cases_size, \"skipped\": \"$why\"}"
            continue
          fi
          synth_s=$(make_root "$largest" "$cases_size" "$work/data-c$largest-s$cases_size")
          echo "{\"bench\": \"scaling_synth\", \"cases\": $largest, \"size\": $cases_size, \"synth_s\": $synth_s}"
          real_point cases "$c" "$cases_size" 0
        fi
      else
        echo "{\"bench\": \"scaling\", \"sweep\": \"cases\", \"cases\": $c, \"size\": $cases_size, \"skipped\": \"$(guard "$c" "$cases_size" "$c")\"}"
      fi
    done
    loadavg cases after
    # Volume size at a fixed number of cases (a size the cases sweep made is reused).
    loadavg size before
    for s in $sizes; do
      new=$size_cases
      [[ -f $work/full-s$s/.cases ]] && (($(cat "$work/full-s$s/.cases") >= size_cases)) && new=0
      real_point size "$size_cases" "$s" "$new"
      [[ -z $keep ]] && ((s != cases_size)) && rm -rf "$work/full-s$s"
    done
    loadavg size after
  } | tee "$work/points.jsonl"
fi

"$py" - "$work/points.jsonl" <<'PY'
import json, sys
pts = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
pts = [x for x in pts if x.get("bench") == "scaling" and "skipped" not in x]
for sweep in ("cases", "size", "workers"):
    p = [x for x in pts if x["sweep"] == sweep]
    if not p:
        continue
    b = p[0]
    s = {"bench": "scaling_summary", "sweep": sweep,
         "points": [{k: x[k] for k in ("cases", "size", "decode_workers")} for x in p],
         "epoch_s_vs_first": [round(x["epoch_s"] / b["epoch_s"], 3) for x in p],
         "first_epoch_s_vs_first": [round(x["first_epoch_s"] / b["first_epoch_s"], 3) for x in p],
         "epoch_s_per_case": [round(x["epoch_s"] / x["train_cases"], 4) for x in p]}
    if all("voxels_per_case" in x for x in p):
        s["first_epoch_s_per_mvoxel"] = [
            round(x["first_epoch_s"] / (x["train_cases"] * x["voxels_per_case"] / 1e6), 4) for x in p]
        s["cache_mb_vs_first"] = [round(x["cache_mb"] / b["cache_mb"], 3) for x in p]
    print(json.dumps(s))
PY
