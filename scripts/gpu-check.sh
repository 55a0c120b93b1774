#!/usr/bin/env bash
# The GPU check: run on the lent GPU machine through the device tool, from the repository
# root, with gpu-bundle.tar.xz carried (made here by scripts/make-gpu-bundle.sh after a build).
# The machine has torch 2.11.0+cu130 in python3 and the CUDA toolkit but none of the Debian
# libraries, so the bundle brings them. Runs the CUDA test cases (each suite's cases whose
# names say CUDA), then `segflow bench` on cuda:0 for about two minutes, and writes
# everything under $OUT (nvidia-smi.txt, tests.txt, bench.jsonl, summary.txt). < 8 minutes.
#   device run: bash scripts/gpu-check.sh     carry: ["gpu-bundle.tar.xz"]     timeout_s: 540
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-/tmp/segflow-gpu-check}"
mkdir -p "$OUT"
start=$(date +%s)
log() { echo "[$(( $(date +%s) - start ))s] $*" | tee -a "$OUT/summary.txt"; }
[[ -d gpu-bundle/bin || ! -f gpu-bundle.tar.xz ]] || tar -xJf gpu-bundle.tar.xz
[[ -d gpu-bundle/bin ]] || { log "gpu-bundle/ is missing: run scripts/make-gpu-bundle.sh here and carry it"; exit 1; }
# LibTorch from the machine's torch wheel, and the CUDA runtime libraries of its nvidia-* wheels
# (or the toolkit's) for the bundle's libcudart dependency.
torch_lib="$(python3 -c 'import glob, os, torch; d = os.path.dirname(torch.__file__); print(":".join([os.path.join(d, "lib")] + sorted(glob.glob(os.path.join(os.path.dirname(d), "nvidia", "*", "lib")))))'):/usr/local/cuda/lib64"
export LD_LIBRARY_PATH="$PWD/gpu-bundle/lib:$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export SEGFLOW_BIN="$PWD/gpu-bundle/bin" SEGFLOW_REQUIRE_CUDA=1
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))' | tee -a "$OUT/summary.txt"
ldd gpu-bundle/bin/segflow > "$OUT/ldd.txt" 2>&1
if grep -q "not found" "$OUT/ldd.txt"; then log "missing libraries:"; grep "not found" "$OUT/ldd.txt" | tee -a "$OUT/summary.txt"; fi

log "CUDA tests"
fails=0
for t in gpu-bundle/bin/segflow_*_tests; do
  timeout 150 "$t" --test-case='*CUDA*,*cuda*,*GPU*,*NCCL*' --duration=true >> "$OUT/tests.txt" 2>&1
  rc=$?
  log "$(basename "$t"): rc=$rc"
  [[ $rc -eq 0 ]] || fails=$((fails + 1))
done
grep -E "^\[doctest\] (test cases|assertions)" "$OUT/tests.txt" | tee -a "$OUT/summary.txt"

log "benchmark (spleen-like recipe, cuda:0)"
data="$(mktemp -d)"
timeout 240 gpu-bundle/bin/segflow bench configs/spleen-ct-unet3d.yaml --json --seconds 90 \
  --set data.root="$data/spleen" --set train.device=cuda:0 > "$OUT/bench.jsonl" 2> "$OUT/bench.stderr.txt"
log "bench rc=$?"
cat "$OUT/bench.jsonl" | tee -a "$OUT/summary.txt"
log "done, $fails failing suites"
exit $fails
