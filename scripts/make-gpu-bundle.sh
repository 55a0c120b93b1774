#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh needs on the GPU machine into gpu-bundle/ and
# gpu-bundle.tar.xz (both git-ignored; the device tool carries the tarball, 64 MiB at most):
#   bin/    the stripped segflow binary, every suite's test executable and the step benchmark
#   lib/    every shared library they need that the GPU machine lacks: all but LibTorch's
#           (its python3 has the torch 2.11.0+cu130 wheel), the C library's and CUDA's driver
#   share/dcmtk/  DCMTK's data dictionaries (DCMDICTPATH), without which no DICOM file reads
#   configs/, tests/tools/  what the test cases read through source_path() (SEGFLOW_SOURCE_DIR)
#   MANIFEST      the commit, the build's flags and what is inside
# The bundle runs from any folder: scripts/gpu-check.sh --bundle-cpu-check DIR runs its CPU
# cases from an unpacked copy, the way the GPU machine will.
# usage: scripts/make-gpu-bundle.sh   (after building: scripts/build.sh)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
suites=(models pipeline actors parallel apps)
bins=(build/apps/segflow build/bench/segflow_step_bench)
for s in "${suites[@]}"; do bins+=("build/tests/segflow_${s}_tests"); done
for b in "${bins[@]}"; do
  [[ -x $b ]] || { echo "make-gpu-bundle: $b is missing: build it first (scripts/build.sh)" >&2; exit 1; }
done
dict_dir=""
for d in /usr/share/libdcmtk*; do [[ -f $d/dicom.dic ]] && dict_dir=$d; done
[[ -n $dict_dir ]] || { echo "make-gpu-bundle: DCMTK's dicom.dic not found under /usr/share/libdcmtk*" >&2; exit 1; }

rm -rf gpu-bundle gpu-bundle.tar.xz
mkdir -p gpu-bundle/bin gpu-bundle/lib gpu-bundle/share/dcmtk gpu-bundle/tests
for b in "${bins[@]}"; do strip -o "gpu-bundle/bin/$(basename "$b")" "$b"; done
# Libraries: everything ldd resolves outside torch/lib, CUDA's driver and glibc's own set.
for b in gpu-bundle/bin/*; do ldd "$b"; done | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
  case "$lib" in
    */torch/lib/*|*/libcuda.so*|*/libc.so*|*/libm.so*|*/libdl.so*|*/libpthread.so*|*/librt.so*|*/ld-linux*) ;;
    *) cp -L "$lib" gpu-bundle/lib/ ;;
  esac
done
strip --strip-unneeded gpu-bundle/lib/*.so* 2>/dev/null || true
cp "$dict_dir"/*.dic gpu-bundle/share/dcmtk/
cp -r configs gpu-bundle/configs
cp -r tests/tools gpu-bundle/tests/tools
find gpu-bundle -name __pycache__ -prune -exec rm -rf {} +
{
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "made $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m)"
  echo "torch $(.venv/bin/python -c 'import torch; print(torch.__version__)' 2>/dev/null || echo '?') (the build's LibTorch)"
  echo "suites ${suites[*]}"
  (cd gpu-bundle && find . -type f ! -name MANIFEST | sort)
} > gpu-bundle/MANIFEST
# Compressed, it travels inside the device tool's 64 MiB (ICU's data alone is 30 MB raw).
tar -C . -cJf gpu-bundle.tar.xz gpu-bundle
size=$(stat -c %s gpu-bundle.tar.xz)
du -sh gpu-bundle gpu-bundle.tar.xz
if (( size > 64 * 1024 * 1024 )); then
  echo "make-gpu-bundle: gpu-bundle.tar.xz is $((size / 1048576)) MiB, over the device tool's 64 MiB" >&2
  exit 1
fi
