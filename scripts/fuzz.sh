#!/usr/bin/env bash
# Coverage-guided fuzzing of segflow's input parsers (tests/fuzz/README.md).
# Builds the libFuzzer harnesses with ASan + UBSan (the asan preset, clang, build-asan/),
# writes their seed corpora (tests/fuzz/make_seeds.py), then runs each harness for SECONDS:
# first every kept finding (tests/fuzz/regressions/<harness>/) and seed, then mutations.
# The working corpus grows in build-asan/fuzz-corpus/<harness>/ and is reused by the next run.
# Prints one JSON line per harness (executions, executions/s, coverage, corpus size, peak
# RSS, findings) and appends it to build-asan/fuzz-results.jsonl. A finding (crash, leak,
# timeout, out-of-memory, broken promise) is saved under build-asan/fuzz-findings/<harness>/
# and makes the script exit 1: reproduce it with `build-asan/fuzz/fuzz_<harness> FILE`, fix
# it, and keep the file in tests/fuzz/regressions/<harness>/ so the replay suite runs it.
#
# usage: scripts/fuzz.sh [SECONDS per harness, default 30] [HARNESS ...]   (default: all)
#   SEGFLOW_FUZZ_SEED   libFuzzer's -seed (CI fixes it, so a run's mutations can be replayed)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds="${1:-30}"
shift || true
py=.venv/bin/python
[[ -x $py ]] || py=python3
build=build-asan
all=(dicom dicom_seg dicom_series nifti nrrd_mha npy job_config control)
harnesses=("${@:-${all[@]}}")

[[ -f $build/build.ninja ]] || cmake --preset asan > "$build.configure.log" 2>&1 ||
  { cat "$build.configure.log"; exit 2; }
start=$(date +%s)
ninja -C "$build" -j"$(nproc)" segflow_fuzzers > "$build/fuzz-build.log" 2>&1 ||
  { tail -50 "$build/fuzz-build.log"; exit 2; }
echo "fuzz: harnesses built in $(( $(date +%s) - start ))s" >&2
"$py" tests/fuzz/make_seeds.py "$build/fuzz-seeds" >&2

# A leak or undefined behaviour is a finding; LibTorch's and CAF's own process-lifetime
# allocations are not (tests/fuzz/lsan.supp).
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1:detect_odr_violation=0}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$PWD/tests/fuzz/lsan.supp:print_suppressions=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export OMP_NUM_THREADS=1

status=0
for h in "${harnesses[@]}"; do
  exe="$build/fuzz/fuzz_$h"
  [[ -x $exe ]] || { echo "fuzz: no harness $h ($exe)" >&2; exit 2; }
  corpus="$build/fuzz-corpus/$h" findings="$build/fuzz-findings/$h"
  rm -rf "$findings"
  mkdir -p "$corpus" "$findings" "tests/fuzz/regressions/$h"
  log="$build/fuzz-$h.log"
  set +e
  "$exe" ${SEGFLOW_FUZZ_SEED:+-seed=$SEGFLOW_FUZZ_SEED} -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -max_len=262144 \
    -print_final_stats=1 -artifact_prefix="$findings/" \
    "$corpus" "$build/fuzz-seeds/$h" "tests/fuzz/regressions/$h" > "$log" 2>&1
  rc=$?
  set -e
  "$py" - "$h" "$seconds" "$rc" "$log" "$corpus" "$findings" <<'PY' | tee -a "$build/fuzz-results.jsonl"
import json, os, re, sys
h, seconds, rc, log, corpus, findings = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:]
text = open(log, errors="replace").read()
stat = dict(re.findall(r"^stat::(\w+):\s+(\d+)", text, re.M))
cov = re.findall(r"cov: (\d+) ft: (\d+)", text)
found = sorted(os.listdir(findings))
print(json.dumps({"fuzz": h, "seconds": seconds, "rc": rc,
                  "execs": int(stat.get("number_of_executed_units", 0)),
                  "execs_per_s": int(stat.get("average_exec_per_sec", 0)),
                  "cov": int(cov[-1][0]) if cov else 0, "features": int(cov[-1][1]) if cov else 0,
                  "new_units": int(stat.get("new_units_added", 0)), "corpus": len(os.listdir(corpus)),
                  "peak_rss_mb": int(stat.get("peak_rss_mb", 0)), "findings": found}))
PY
  if [[ $rc -ne 0 ]] || [[ -n "$(ls -A "$findings")" ]]; then
    status=1
    echo "fuzz: $h found something (rc $rc); the end of $log:" >&2
    grep -E "ERROR|SUMMARY|broken promise|Test unit written" "$log" | tail -8 >&2 || tail -20 "$log" >&2
  fi
done
exit $status
