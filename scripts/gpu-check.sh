#!/usr/bin/env bash
# The GPU check: every suite's CUDA test cases and a short benchmark, on the GPU machine.
# Run from the repository root through the device tool, with the bundle carried:
#   device run: bash scripts/gpu-check.sh     carry: ["gpu-bundle.tar.xz"]     timeout_s: 330
# (make the bundle here first: scripts/make-gpu-bundle.sh). It cannot pass without CUDA: it
# stops at once when no CUDA device is visible, and the test cases run with
# SEGFLOW_REQUIRE_CUDA=1, so a CUDA case that finds no device fails instead of skipping.
# Writes under $OUT (default /tmp/segflow-gpu-check):
#   summary.txt     what ran, each suite's verdict and the benchmark lines, then PASS or FAIL
#   summary.json    the same as one JSON object (suites, cases, assertions, bench, verdict)
#   gpu-tests.txt   the full doctest output of every suite's CUDA cases
#   bench.jsonl     `segflow bench` JSON lines (e2e, compute, summary) of the spleen recipe,
#                   cache in host memory (bench-cpu.jsonl) then in GPU memory (bench-cuda.jsonl)
#   step-bench.jsonl  segflow_step_bench on cuda:0: the step's parts, old way and new
#   bench.stderr.txt, nvidia-smi.txt, ldd.txt
# Whole run under 5 minutes: CUDA cases about 2 minutes, the benchmark what is left (<= 2.5).
# Exit status: 0 when every suite passed and the benchmark ran, else 1 (2: no GPU, no bundle).
#
#   bash scripts/gpu-check.sh --bundle-cpu-check DIR   (here, no GPU needed) unpacks the
#     bundle into DIR and runs its CPU test cases from there, away from the build tree.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD
start=$(date +%s)
budget_s=${SEGFLOW_GPU_CHECK_SECONDS:-290}

# LibTorch from python3's torch wheel, then the CUDA runtime of its nvidia-* wheels, then the
# bundle's own libraries (DCMTK, CAF, ZeroMQ, ...) and the toolkit's.
torch_libs() {
  python3 - <<'EOF'
import glob, os, torch
d = os.path.dirname(torch.__file__)
site = os.path.dirname(d)
print(":".join([os.path.join(d, "lib")] + sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib"))) +
               sorted(glob.glob(os.path.join(site, "nvidia", "*", "*", "lib")))))
EOF
}

bundle_env() {  # $1: the unpacked gpu-bundle folder
  local b=$1 tl
  tl=$(torch_libs) || return 1
  export LD_LIBRARY_PATH="$tl:$b/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export SEGFLOW_BIN="$b/bin" SEGFLOW_SOURCE_DIR="$b"
  export DCMDICTPATH="$b/share/dcmtk/dicom.dic:$b/share/dcmtk/private.dic"
}

unpack() {  # $1: tarball, $2: destination folder
  mkdir -p "$2" && tar -C "$2" -xJf "$1" && [[ -x $2/gpu-bundle/bin/segflow ]]
}

if [[ ${1:-} == --bundle-cpu-check ]]; then
  dir=${2:?usage: gpu-check.sh --bundle-cpu-check DIR}
  [[ -f gpu-bundle.tar.xz ]] || { echo "gpu-check: gpu-bundle.tar.xz is missing: run scripts/make-gpu-bundle.sh" >&2; exit 2; }
  rm -rf "$dir" && unpack gpu-bundle.tar.xz "$dir" || { echo "gpu-check: cannot unpack the bundle into $dir" >&2; exit 2; }
  b=$(cd "$dir/gpu-bundle" && pwd)
  bundle_env "$b" || { echo "gpu-check: python3 has no torch (LibTorch comes from its wheel)" >&2; exit 2; }
  cd "$dir"
  export SEGFLOW_PYTHON=${SEGFLOW_PYTHON:-python3}
  if ldd "$b"/bin/* | grep -E "not found|$repo/build" ; then echo "gpu-check: the bundle needs the build tree" >&2; exit 1; fi
  fails=0
  # CPU cases that need neither the reference readers (SimpleITK, MONAI: not on the GPU
  # machine) nor the build's plugin folder.
  run() { echo "== $*"; "$@" || fails=$((fails + 1)); }
  run "$b/bin/segflow_models_tests" -tce='*CUDA*,*reproduces*,*converter*,*MONAI*' -tse='serial'
  run "$b/bin/segflow_models_tests" -tc='*CUDA*'  # here: skips, with a message
  run "$b/bin/segflow_apps_tests" -tc='*bf16*,*corrupt checkpoint*,*cross-validation table*,*--fold all*'
  run "$b/bin/segflow_actors_tests" -tc='*SimpleLoader*' -tce='*CUDA*'
  run "$b/bin/segflow_parallel_tests" -tc='*2 Gloo ranks in one process*'
  run "$b/bin/segflow" synth --cases 1 --size 16 --format dicom --out "$dir/dicom"
  run "$b/bin/segflow" inspect "$dir/dicom/case_000" --json
  echo "bundle CPU check: $fails failing"
  exit $((fails > 0))
fi

OUT="${OUT:-/tmp/segflow-gpu-check}"
mkdir -p "$OUT"
: > "$OUT/summary.txt"
log() { echo "[$(($(date +%s) - start))s] $*" | tee -a "$OUT/summary.txt"; }
left() { echo $((budget_s - ($(date +%s) - start))); }
declare -A suite_rc suite_cases suite_failed
verdict() {  # writes summary.json and the last line; $1: exit status
  python3 - "$OUT" "$1" "$(($(date +%s) - start))" "${!suite_rc[@]}" <<'EOF' || true
import json, os, sys
out, rc, seconds, suites = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
res = {"verdict": "PASS" if rc == 0 else "FAIL", "exit_status": rc, "seconds": seconds, "suites": {}, "bench": []}
for s in suites:
    res["suites"][s] = {k: os.environ.get(f"SEGFLOW_GC_{k}_{s}") for k in ("rc", "cases", "failed")}
try:
    res["bench"] = [json.loads(l) for l in open(os.path.join(out, "bench.jsonl")) if l.strip()]
except (OSError, ValueError):
    pass
json.dump(res, open(os.path.join(out, "summary.json"), "w"), indent=1)
EOF
  log "$( (($1 == 0)) && echo PASS || echo FAIL) (exit status $1)"
  exit "$1"
}

# 1. A GPU, or stop now.
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
smi=$?
cuda=$(python3 -c 'import torch; print(int(torch.cuda.is_available()), torch.cuda.device_count(), torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")' 2>&1 | tail -n 1)
# SEGFLOW_GPU_CHECK_REHEARSE=1 goes on without a GPU, to rehearse the script's own logic on a
# CPU machine: every CUDA case must then fail (SEGFLOW_REQUIRE_CUDA) and so must the check.
if [[ ${SEGFLOW_GPU_CHECK_REHEARSE:-0} == 1 ]]; then
  log "REHEARSAL without a GPU (SEGFLOW_GPU_CHECK_REHEARSE=1): expect every part to fail"
elif [[ $smi -ne 0 || ${cuda%% *} != 1 ]]; then
  log "no CUDA device visible: nvidia-smi exit $smi ($(head -n1 "$OUT/nvidia-smi.txt")); python3 torch: ${cuda//$'\n'/ }"
  log "gpu-check needs a GPU machine (run it through the device tool); nothing was tested"
  verdict 2
fi
log "CUDA: $cuda"

# 2. The bundle.
[[ -d gpu-bundle/bin ]] || { [[ -f gpu-bundle.tar.xz ]] && unpack gpu-bundle.tar.xz .; }
if [[ ! -x gpu-bundle/bin/segflow ]]; then
  log "gpu-bundle/ is missing: run scripts/make-gpu-bundle.sh here and carry gpu-bundle.tar.xz"
  verdict 2
fi
bundle_env "$repo/gpu-bundle"
export SEGFLOW_REQUIRE_CUDA=1
head -n 3 gpu-bundle/MANIFEST | tee -a "$OUT/summary.txt"
ldd gpu-bundle/bin/* > "$OUT/ldd.txt" 2>&1
if grep -q "not found" "$OUT/ldd.txt"; then
  log "missing libraries:"
  grep "not found" "$OUT/ldd.txt" | sort -u | tee -a "$OUT/summary.txt"
fi

# 3. Every suite's CUDA cases (names contain "CUDA"; doctest filters ignore case).
log "CUDA test cases"
fails=0
: > "$OUT/gpu-tests.txt"
for s in models pipeline actors parallel apps; do
  t=gpu-bundle/bin/segflow_${s}_tests
  echo "===== $s" >> "$OUT/gpu-tests.txt"
  # At most 90 s a suite, and always 120 s kept for the benchmark.
  t_out=$(($(left) - 120))
  ((t_out > 90)) && t_out=90
  ((t_out < 15)) && t_out=15
  part=$(mktemp)
  timeout "$t_out" "$t" --test-case='*CUDA*' --duration=true > "$part" 2>&1
  rc=$?
  cat "$part" >> "$OUT/gpu-tests.txt"
  line=$(grep -E "^\[doctest\] test cases:" "$part" | tail -n1)
  rm -f "$part"
  cases=$(sed -E 's/.*test cases: *([0-9]+).*/\1/' <<< "$line")
  failed=$(sed -E 's/.* ([0-9]+) failed.*/\1/' <<< "$line")
  # A suite that ran no CUDA case at all is a failure too: the check would prove nothing.
  [[ $rc -eq 0 && ${cases:-0} -eq 0 ]] && rc=3
  [[ $rc -eq 124 ]] && echo "(timed out after $t_out s)" >> "$OUT/gpu-tests.txt"
  suite_rc[$s]=$rc
  export "SEGFLOW_GC_rc_$s=$rc" "SEGFLOW_GC_cases_$s=${cases:-0}" "SEGFLOW_GC_failed_$s=${failed:-?}"
  log "$s: rc=$rc, $line"
  [[ $rc -eq 0 ]] || fails=$((fails + 1))
done
grep -E "ERROR|FATAL|timed out|Segmentation" "$OUT/gpu-tests.txt" | head -n 20 | tee -a "$OUT/summary.txt"

# 4. The training step's parts, old against new, on the GPU (about 10 s).
log "step parts (bench/step_bench.cpp) on cuda:0"
timeout 40 gpu-bundle/bin/segflow_step_bench --device cuda:0 --reps 20 > "$OUT/step-bench.jsonl" 2>> "$OUT/bench.stderr.txt"
log "step bench rc=$?"
tee -a "$OUT/summary.txt" < "$OUT/step-bench.jsonl"

# 5. The benchmark: the spleen recipe (UNet 16-256, 96^3 crops x 4, bf16, SGD) on 8 synthetic
# cases, e2e (the actor data path) against compute (the same steps on staged batches), first
# with the cache in host memory, then with train.cache_device: cuda (the cache in GPU memory).
secs=$(( ($(left) - 60) / 4 ))
(( secs > 30 )) && secs=30
if (( secs < 5 )); then
  log "benchmark skipped: $(left) s left"
  fails=$((fails + 1))
else
  data=$(mktemp -d)
  : > "$OUT/bench.jsonl"
  for cache in cpu cuda; do
    log "benchmark: spleen recipe, 8 cases, ${secs} s per phase, cache on $cache"
    timeout $(( $(left) - 5 )) gpu-bundle/bin/segflow bench configs/spleen-ct-unet3d.yaml --json --seconds "$secs" \
      --set data.root="$data/spleen" --set data.synth.cases=8 --set train.device=cuda:0 --set train.log_every=1000 \
      --set train.cache_device=$cache > "$OUT/bench-$cache.jsonl" 2>> "$OUT/bench.stderr.txt"
    rc=$?
    log "bench (cache on $cache) rc=$rc"
    [[ $rc -eq 0 ]] || { fails=$((fails + 1)); tail -n 5 "$OUT/bench.stderr.txt" | tee -a "$OUT/summary.txt"; }
    tee -a "$OUT/summary.txt" < "$OUT/bench-$cache.jsonl"
    cat "$OUT/bench-$cache.jsonl" >> "$OUT/bench.jsonl"
  done
  rm -rf "$data"
fi
log "$fails failing parts"
verdict $((fails > 0))
