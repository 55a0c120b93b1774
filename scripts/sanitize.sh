#!/usr/bin/env bash
# The test suites under sanitizers (clang): the asan preset (ASan + UBSan + LeakSanitizer,
# build-asan/) runs the pipeline, models, actors, daemon and fuzz-replay suites; the tsan
# preset (ThreadSanitizer, build-tsan/) runs the actors and daemon suites against a CAF built
# with TSan (scripts/build-caf-tsan.sh, run on first use: about 5 minutes). A sanitizer
# finding aborts the case (the build uses -fno-sanitize-recover), so a suite that passes
# had none. Each suite runs in one process per suite with its segflow/segflowd binaries
# (the daemon tests start the sanitized segflowd). Prints one JSON line per suite: seconds,
# exit code, cases passed/failed, the number of report files its processes wrote
# (build-<preset>/sanitizer-reports/<suite>/) and the first report; any report fails the run.
#
# usage: scripts/sanitize.sh [asan|tsan|all] [SUITE ...]     (default: asan, its suites)
#   SEGFLOW_SANITIZE_CASES_EXCLUDE   doctest -tce patterns for the models suite (default:
#                                    the long training cases, which the release run covers)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mode="${1:-asan}"
shift || true
py=.venv/bin/python
[[ -x $py ]] || py=python3
models_exclude="${SEGFLOW_SANITIZE_CASES_EXCLUDE:-*shipped*,*recipe*,*reaches*,*learns*,*trains*,*nnU-Net-like*}"

run_mode() {  # preset suites...
  local preset=$1
  shift
  local build="build-$preset" suites=("$@")
  if [[ $preset == tsan ]]; then
    # ThreadSanitizer needs CAF itself instrumented (scripts/build-caf-tsan.sh: Debian's own
    # 0.17.6 source, built once and cached); with Debian's uninstrumented libcaf_core every
    # message hand-off between actors is reported as a race.
    local caf
    caf="$(bash scripts/build-caf-tsan.sh)" || exit 2
    cmake --preset tsan -DCAF_INCLUDE_DIR="$caf/include" -DCAF_CORE_LIBRARY="$caf/lib/libcaf_core.so" \
      -DCAF_IO_LIBRARY="$caf/lib/libcaf_io.so" > "$build.configure.log" 2>&1 ||
      { cat "$build.configure.log"; exit 2; }
  else
    [[ -f $build/build.ninja ]] || cmake --preset "$preset" > "$build.configure.log" 2>&1 ||
      { cat "$build.configure.log"; exit 2; }
  fi
  local targets=(segflow segflowd)
  for s in "${suites[@]}"; do targets+=("segflow_${s}_tests"); done
  local t0=$(date +%s)
  ninja -C "$build" -j"$(nproc)" "${targets[@]}" > "$build/sanitize-build.log" 2>&1 ||
    { tail -40 "$build/sanitize-build.log"; exit 2; }
  echo "sanitize: $preset build took $(( $(date +%s) - t0 ))s" >&2
  for s in "${suites[@]}"; do
    local log="$build/sanitize-$s.log" args=()
    [[ $s == models ]] && args=(-tce="$models_exclude")
    local s0=$(date +%s)
    # Every sanitized process of the suite (the test binary and the segflow/segflowd it
    # starts) writes its reports to files here, so a finding in a child process is seen
    # even when the test only sees that child die.
    local reports="$build/sanitizer-reports/$s"
    rm -rf "$reports"
    mkdir -p "$reports"
    set +e
    ASAN_OPTIONS="$ASAN_OPTIONS:log_path=$PWD/$reports/report" UBSAN_OPTIONS="$UBSAN_OPTIONS:log_path=$PWD/$reports/report" \
      TSAN_OPTIONS="$TSAN_OPTIONS:log_path=$PWD/$reports/report" \
      SEGFLOW_BIN="$PWD/$build/apps" OMP_NUM_THREADS=2 timeout 1800 "$build/tests/segflow_${s}_tests" "${args[@]}" \
      > "$log" 2>&1
    local rc=$?
    "$py" - "$preset" "$s" "$rc" "$(( $(date +%s) - s0 ))" "$log" "$reports" <<'PY' | tee -a "$build/sanitize-results.jsonl"
import json, os, re, sys
preset, suite, rc, seconds, log, reports = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
text = open(log, errors="replace").read()
m = re.search(r"test cases:\s+(\d+) \|\s+(\d+) passed \|\s+(\d+) failed", text)
files = sorted(os.path.join(reports, f) for f in os.listdir(reports))
pat = re.compile(r"^(==\d+==ERROR: .*|SUMMARY: \w+Sanitizer: .*|WARNING: ThreadSanitizer: .*|.*runtime error: .*)$", re.M)
first = None
for t in [open(f, errors="replace").read() for f in files] + [text]:
    rep = pat.search(t)
    if rep:
        first = rep.group(1)[:300]
        break
print(json.dumps({"sanitize": preset, "suite": suite, "rc": rc, "seconds": seconds,
                  "cases": int(m.group(1)) if m else None, "passed": int(m.group(2)) if m else None,
                  "failed": int(m.group(3)) if m else None, "report_files": len(files),
                  "first_report": first}))
sys.exit(1 if files else 0)
PY
    local found=${PIPESTATUS[0]}
    set -e
    [[ $rc -eq 0 && $found -eq 0 ]] || status=1
  done
}

# LibTorch, CAF and DCMTK keep some allocations for the life of the process (not segflow leaks).
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:detect_odr_violation=0}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$PWD/tests/fuzz/lsan.supp:print_suppressions=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export TSAN_OPTIONS="${TSAN_OPTIONS:-suppressions=$PWD/tests/tsan.supp:halt_on_error=1:second_deadlock_stack=1}"
status=0
case "$mode" in
  asan) if [[ $# -gt 0 ]]; then run_mode asan "$@"; else run_mode asan pipeline models actors daemon fuzz; fi ;;
  tsan) if [[ $# -gt 0 ]]; then run_mode tsan "$@"; else run_mode tsan actors daemon; fi ;;
  all) run_mode asan pipeline models actors daemon fuzz; run_mode tsan actors daemon ;;
  *) echo "usage: scripts/sanitize.sh [asan|tsan|all] [SUITE ...]" >&2; exit 2 ;;
esac
exit $status
