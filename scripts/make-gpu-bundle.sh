#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh needs on the GPU machine into gpu-bundle/ (git-ignored):
# the stripped segflow binary and test executables from build/, and every shared library
# they need that is neither LibTorch's (the GPU machine has torch 2.11.0+cu130 in python3)
# nor the C library's nor CUDA's runtime, packed as gpu-bundle.tar.xz for the device tool
# to carry (64 MiB at most).
# usage: scripts/make-gpu-bundle.sh   (after scripts/build.sh)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
rm -rf gpu-bundle && mkdir -p gpu-bundle/bin gpu-bundle/lib
bins=(build/apps/segflow build/tests/segflow_models_tests build/tests/segflow_pipeline_tests build/tests/segflow_apps_tests)
for b in build/tests/segflow_parallel_tests; do [[ -x $b ]] && bins+=("$b"); done
for b in "${bins[@]}"; do
  [[ -x $b ]] || { echo "make-gpu-bundle: $b is missing: run scripts/build.sh first" >&2; exit 1; }
  strip -o "gpu-bundle/bin/$(basename "$b")" "$b"
done
# Libraries: everything ldd resolves outside torch/lib and outside glibc's own set.
for b in gpu-bundle/bin/*; do ldd "$b"; done | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
  case "$lib" in
    */torch/lib/*|*/libcudart.so*|*/libc.so*|*/libm.so*|*/libdl.so*|*/libpthread.so*|*/librt.so*|*/ld-linux*|*/libcuda.so*) ;;
    *) cp -L "$lib" gpu-bundle/lib/ ;;
  esac
done
strip --strip-unneeded gpu-bundle/lib/*.so* 2>/dev/null || true
# Compressed, it travels well inside the device tool's 64 MiB (ICU's data alone is 30 MB).
tar -C . -cJf gpu-bundle.tar.xz gpu-bundle
du -sh gpu-bundle gpu-bundle.tar.xz
