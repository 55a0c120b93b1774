#!/usr/bin/env bash
# The GPU check's own rules (scripts/gpu_check.py), rehearsed in seconds on a CPU with a fake
# bundle whose programs answer at once (or sleep, where SEGFLOW_GPU_CHECK_SLOW says so) and a
# fake torch that sees no GPU. Asserts:
#  1. the plan at the default budget: every cap fits its phase, the phases end before 240 s;
#  2. without CUDA (no rehearsal): exit status 2, a verdict, at most 7 files;
#  3. a quick rehearsal (everything answers at once; a fake nvidia-smi samples): the runs'
#     lines are parsed into figures, the GPU windows hold samples, the files are complete;
#  4. a rehearsal at a 24 s budget whose test cases, benchmarks and background work all
#     overrun (they would sleep 1000 s): it still ends within the budget, writes a verdict
#     (tests FAIL, benchmark incomplete) and at most 7 files, each named in OUT_FILES, and its
#     exit status is non-zero; the overrunning cases are reported as timed out and rerun.
# usage: bash tests/scripts/test_gpu_check_budget.sh   (CTest runs it; about 30 s)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# ---- the fakes ----
mkdir -p "$work/site/torch" "$work/bundle/bin" "$work/bundle/configs" "$work/bundle/lib" "$work/path"
cat > "$work/path/nvidia-smi" << 'EOF'
#!/usr/bin/env bash
[[ $* == *-lms* ]] || { echo "fake nvidia-smi"; exit 0; }
while true; do echo "93, 20480"; sleep 0.25; done
EOF
cat > "$work/site/torch/__init__.py" << 'EOF'
__version__ = "0.0.0+fake"
class version:
    cuda = None
class cuda:
    @staticmethod
    def is_available():
        return False
    @staticmethod
    def device_count():
        return 0
EOF
echo "torch 0.0.0+fake" > "$work/bundle/MANIFEST"
touch "$work/bundle/configs/spleen-ct-unet3d.yaml" "$work/bundle/configs/quickstart-unet3d.yaml"
cat > "$work/bundle/bin/segflow" << 'EOF'
#!/usr/bin/env bash
cmd=$1; shift
runs="" out=""
while (($#)); do
  case "$1" in
    --out) out=$2; shift ;;
    output.runs_dir=*) runs=${1#output.runs_dir=} ;;
  esac
  shift
done
case "$cmd" in
  synth) mkdir -p "$out/imagesTr" "$out/labelsTr" ;;
  bench)
    sleep 1
    echo '{"bench": "e2e", "samples_per_s": 64, "seconds": 1.0, "step_ms": 60, "data_wait_ms": 1}'
    echo '{"bench": "compute", "samples_per_s": 65, "seconds": 0.1}'
    echo '{"bench": "summary", "pipeline_efficiency": {"actors": 0.98}, "peak_gpu_mb": 1, "peak_host_mb": 1}' ;;
  train)
    mkdir -p "$runs/fake-run"
    echo '{"train": ["case_000"], "val": ["case_001"]}' > "$runs/fake-run/split.json"
    echo '{"type": "epoch", "epoch": 0, "seconds": 0.1, "samples_per_s": 10}' > "$runs/fake-run/metrics.jsonl"
    echo '{"type": "validation", "epoch": 0, "seconds": 0.1, "mean_dice": 0.94}' >> "$runs/fake-run/metrics.jsonl"
    echo "validation epoch 1: mean Dice 0.9400 [] over 1 cases (0.1 s)" >&2 ;;
esac
EOF
cat > "$work/bundle/bin/segflow_step_bench" << 'EOF'
#!/usr/bin/env bash
echo "segflow_step_bench: CUDA is not available" >&2
exit 1
EOF
for s in models pipeline actors parallel apps; do
  cat > "$work/bundle/bin/segflow_${s}_tests" << 'EOF'
#!/usr/bin/env bash
if [[ $1 == --list-test-cases ]]; then
  printf '[doctest] listing\n===\nCUDA: a fake case\nCUDA: a fake case, with a comma\n===\n'
  exit 0
fi
echo "SEGFLOW_REQUIRE_CUDA is set but no CUDA device is visible: this CUDA case may not skip"
echo "[doctest] test cases: 1 | 0 passed | 1 failed | 0 skipped"
exit 1
EOF
done
chmod +x "$work/bundle/bin/"* "$work/path/nvidia-smi"
export PATH="$work/path:$PATH" PYTHONPATH="$work/site" SEGFLOW_GPU_CHECK_PYTHON=python3 SEGFLOW_GPU_CHECK_BUNDLE="$work/bundle" \
  SEGFLOW_GPU_CHECK_WHEELS="$work/no-wheels"
unset SEGFLOW_GPU_CHECK_SLOW SEGFLOW_GPU_CHECK_REHEARSE SEGFLOW_GPU_CHECK_SECONDS

check_files() {  # $1: OUT folder
  local n
  n=$(find "$1" -type f | wc -l)
  ((n <= 7)) || fail "$n files under $1 (at most 7): $(ls "$1")"
  for f in "$1"/*; do
    [[ $(basename "$f") =~ ^(summary\.json|summary\.txt|tests\.txt|bench\.jsonl|env\.txt|monai\.jsonl)$ ]] ||
      fail "unexpected file $f"
  done
  python3 -c 'import json, sys; v = json.load(open(sys.argv[1]))["verdict"]; assert v["final"] == "final", v' \
    "$1/summary.json" || fail "no final verdict in $1/summary.json"
  grep -q "^exit status" "$1/summary.txt" || fail "no verdict line in $1/summary.txt"
}

# 1. The plan.
python3 - "$repo/scripts" << 'EOF' || fail "the default plan does not fit 240 s"
import sys
sys.path.insert(0, sys.argv[1])
import gpu_check as g
end = {k: v * g.FULL_BUDGET_S for k, v in g.PHASE_END.items()}
assert end["probe"] < end["tests"] < end["bench"] <= g.FULL_BUDGET_S - 5, end
assert max(c for _, c in g.SUITES) <= end["tests"] - end["probe"], "a case cap exceeds the tests phase"
assert max(c for _, c, _ in g.BENCH_RUNS) <= end["bench"] - end["tests"], "a run cap exceeds the bench phase"
assert all(least <= cap for _, cap, least in g.BENCH_RUNS)
assert len(g.OUT_FILES) <= 7
EOF
echo "ok: the plan at 240 s"

# 2. No CUDA, no rehearsal: refused at once.
set +e
OUT="$work/out-nocuda" bash "$repo/scripts/gpu-check.sh" > "$work/nocuda.log" 2>&1
rc=$?
set -e
((rc == 2)) || { cat "$work/nocuda.log"; fail "without CUDA: exit status $rc, expected 2"; }
check_files "$work/out-nocuda"
echo "ok: without CUDA, exit status 2 and a verdict"

# 3. A quick rehearsal: the plumbing of the figures.
set +e
OUT="$work/out-quick" SEGFLOW_GPU_CHECK_REHEARSE=1 SEGFLOW_GPU_CHECK_SECONDS=60 bash "$repo/scripts/gpu-check.sh" \
  > "$work/quick.log" 2>&1
rc=$?
set -e
((rc == 1)) || { cat "$work/quick.log"; fail "quick rehearsal: exit status $rc, expected 1 (the CUDA cases fail)"; }
check_files "$work/out-quick"
python3 - "$work/out-quick" << 'EOF' || { cat "$work/quick.log"; fail "quick rehearsal: figures"; }
import json, sys
s = json.load(open(sys.argv[1] + "/summary.json"))
f, runs = s["figures"], s["bench_runs"]
assert all(runs[n]["status"] == "ok" for n in ("spleen_bf16", "spleen_bf16_cl", "quickstart", "segflow_ttd",
                                               "dp_devices", "torchrun_ws1")), runs
assert runs["spleen_fp16"]["status"].startswith("not run"), runs
assert f["samples_per_s_e2e"] == 64 and f["pipeline_efficiency"] == 0.98 and f["s_per_32_case_epoch"] == 2.0, f
assert f["gpu_util_e2e_mean_pct"] == 93.0 and f["quickstart_last_dice"] == 0.94, f
assert s["goals"]["gpu_util_pct"]["met"] is True and s["goals"]["s_per_32_case_epoch"]["met"] is False, s["goals"]
lines = [json.loads(line) for line in open(sys.argv[1] + "/bench.jsonl")]
assert any(j["bench"] == "gpu_window" and j["n"] >= 2 for j in lines), lines
assert any(j["bench"] == "parallel_ws1" and j["label"] == "NCCL world size 1 only" for j in lines), lines
assert any(j["bench"] == "segflow_vs_monai" for j in map(json.loads, open(sys.argv[1] + "/monai.jsonl")))
assert s["tests"] and all(t["rerun"] for t in s["tests"]), s["tests"]
EOF
echo "ok: a quick rehearsal parses every run into figures"

# 4. A rehearsal whose phases all overrun.
budget=24
start=$(date +%s.%N)
set +e
OUT="$work/out-slow" SEGFLOW_GPU_CHECK_REHEARSE=1 SEGFLOW_GPU_CHECK_SECONDS=$budget \
  SEGFLOW_GPU_CHECK_SLOW=case-=1000,bench=1000,background=1000 bash "$repo/scripts/gpu-check.sh" > "$work/slow.log" 2>&1
rc=$?
set -e
took=$(python3 -c "import sys, time; print(round(time.time() - float(sys.argv[1]), 1))" "$start")
cat "$work/slow.log"
((rc != 0)) || fail "the rehearsal passed without CUDA"
python3 -c "import sys; sys.exit(float(sys.argv[1]) > float(sys.argv[2]) + 2)" "$took" "$budget" ||
  fail "the check took $took s, over its $budget s budget"
check_files "$work/out-slow"
python3 - "$work/out-slow/summary.json" << 'EOF' || fail "summary.json does not report the overruns"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["verdict"]["tests"].startswith("FAIL"), s["verdict"]
assert s["verdict"]["bench"].startswith("incomplete"), s["verdict"]
assert any(t["status"].startswith("timed out") for t in s["tests"]), s["tests"]
assert any((t["rerun"] or "").startswith(("timed out", "not run")) for t in s["tests"]), s["tests"]
assert any(r["status"].startswith(("timed out", "not run")) for r in s["bench_runs"].values()), s["bench_runs"]
assert s["seconds"] <= s["budget_s"], s["seconds"]
EOF
echo "ok: overrunning phases: $took s of a $budget s budget, exit status $rc, a verdict, at most 7 files"
