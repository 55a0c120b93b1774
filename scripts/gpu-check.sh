#!/usr/bin/env bash
# The GPU check: every CUDA test case and the benchmarks that matter (the spleen recipe, MONAI
# beside it, the quickstart's Dice, NCCL at world size 1), on the GPU machine, in about 240 s.
# Make the bundle and the wheels here first, then run it through the device tool:
#   scripts/make-gpu-bundle.sh && scripts/fetch-gpu-wheels.sh      (here, after a build)
#   device run: bash scripts/gpu-check.sh   carry: ["gpu-bundle.tar.xz", "gpu-wheels"]   timeout_s: 330
# scripts/gpu_check.py does the work: its header and docs/how-to/gpu-check.md give the plan
# (a probe, the CUDA cases one process each, the benchmarks in priority order, each under a
# cap so that the whole ends within SEGFLOW_GPU_CHECK_SECONDS, default 240) and the files it
# writes under $OUT (at most 6: summary.json, summary.txt, tests.txt, bench.jsonl, env.txt,
# monai.jsonl). Exit status: 0 all passed and every benchmark ran; 1 a test case failed;
# 2 no GPU, no bundle or a failed probe; 3 tests passed, benchmark incomplete.
#
#   SEGFLOW_GPU_CHECK_REHEARSE=1 bash scripts/gpu-check.sh   (here, no GPU) the whole check on
#     the CPU at tiny sizes: every CUDA case must fail, the benchmarks' plumbing runs.
#   bash scripts/gpu-check.sh --bundle-cpu-check DIR   (here, no GPU needed) unpacks the
#     bundle into DIR and runs its CPU test cases from there, away from the build tree.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
repo=$PWD

# python3 with torch (LibTorch comes from its wheel): the device's python3; here, the venv's.
py=${SEGFLOW_GPU_CHECK_PYTHON:-python3}
if [[ -z ${SEGFLOW_GPU_CHECK_PYTHON:-} ]] &&
  ! python3 -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("torch") is None)' 2> /dev/null &&
  [[ -x .venv/bin/python ]]; then
  py=.venv/bin/python
fi

if [[ ${1:-} != --bundle-cpu-check ]]; then
  budget=${SEGFLOW_GPU_CHECK_SECONDS:-240}
  # The check keeps its own budget; this outer cap only catches a hung interpreter.
  timeout -k 5 $((${budget%.*} + 20)) "$py" scripts/gpu_check.py
  rc=$?
  if ((rc == 124 || rc == 137)); then
    echo "gpu-check: the outer cap ($((${budget%.*} + 20)) s) stopped scripts/gpu_check.py" |
      tee -a "${OUT:-/tmp/segflow-gpu-check}/summary.txt" >&2
  fi
  exit "$rc"
fi

# ---- --bundle-cpu-check DIR ----
dir=${2:?usage: gpu-check.sh --bundle-cpu-check DIR}
[[ -f gpu-bundle.tar.xz ]] || { echo "gpu-check: gpu-bundle.tar.xz is missing: run scripts/make-gpu-bundle.sh" >&2; exit 2; }
rm -rf "$dir" && mkdir -p "$dir"
# Python's tarfile: no xz binary needed (the GPU machine may have none).
if ! "$py" -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' gpu-bundle.tar.xz "$dir" ||
  [[ ! -x $dir/gpu-bundle/bin/segflow ]]; then
  echo "gpu-check: cannot unpack the bundle into $dir" >&2
  exit 2
fi
b=$(cd "$dir/gpu-bundle" && pwd)
tl=$("$py" - << 'EOF'
import glob, os, torch
d = os.path.dirname(torch.__file__)
site = os.path.dirname(d)
print(":".join([os.path.join(d, "lib")] + sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib")))))
EOF
) || { echo "gpu-check: $py has no torch (LibTorch comes from its wheel)" >&2; exit 2; }
export LD_LIBRARY_PATH="$tl:$b/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export SEGFLOW_BIN="$b/bin" SEGFLOW_SOURCE_DIR="$b" SEGFLOW_PYTHON=$py
export DCMDICTPATH="$b/share/dcmtk/dicom.dic:$b/share/dcmtk/private.dic"
cd "$dir" || exit 2
if ldd "$b"/bin/* | grep -E "not found|$repo/build"; then echo "gpu-check: the bundle needs the build tree" >&2; exit 1; fi
fails=0
# CPU cases that need neither the reference readers (SimpleITK, MONAI: not on the GPU
# machine) nor the build's plugin folder.
run() { echo "== $*"; "$@" || fails=$((fails + 1)); }
run "$b/bin/segflow_models_tests" -tce='*CUDA*,*reproduces*,*converter*,*MONAI*' -tse='serial'
run "$b/bin/segflow_models_tests" -tc='*CUDA*' # here: skips, with a message
run "$b/bin/segflow_apps_tests" -tc='*bf16*,*corrupt checkpoint*,*cross-validation table*,*--fold all*'
run "$b/bin/segflow_actors_tests" -tc='*SimpleLoader*' -tce='*CUDA*'
run "$b/bin/segflow_parallel_tests" -tc='*2 Gloo ranks in one process*'
run "$b/bin/segflow" synth --cases 1 --size 16 --format dicom --out "$dir/dicom"
run "$b/bin/segflow" inspect "$dir/dicom/case_000" --json
echo "bundle CPU check: $fails failing"
exit $((fails > 0))
