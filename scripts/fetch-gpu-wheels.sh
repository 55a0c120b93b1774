#!/usr/bin/env bash
# Fills gpu-wheels/ (git-ignored) with what bench/baselines/monai_spleen_fast.py needs on the GPU
# machine beyond its python3 (Python 3.12 with torch, numpy, scipy, packaging and
# typing-extensions: /work/.library/device/KINDS.md): MONAI and nibabel, as wheels for Python
# 3.12, without their dependencies (every one they need is there: the script prints their
# Requires-Dist lines to check). scripts/gpu-check.sh installs them there, off-line, with
#   python3 -m pip install --no-index --no-deps --target DIR gpu-wheels/*.whl
# and the device tool carries the folder: carry ["gpu-bundle.tar.xz", "gpu-wheels"].
# The versions are the ones bench/RESULTS.md's CPU comparisons used (the venv's).
# usage: scripts/fetch-gpu-wheels.sh [MONAI_VERSION [NIBABEL_VERSION]]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
monai=${1:-1.4.0}
nibabel=${2:-$(.venv/bin/python -c 'import nibabel; print(nibabel.__version__)' 2> /dev/null || echo 5.3.2)}
rm -rf gpu-wheels
mkdir -p gpu-wheels
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any \
  -d gpu-wheels "monai==$monai" "nibabel==$nibabel"
for w in gpu-wheels/*.whl; do
  echo "$(basename "$w"): $(du -k "$w" | cut -f1) KiB; needs:"
  unzip -p "$w" '*.dist-info/METADATA' | grep '^Requires-Dist' | grep -v 'extra ==' | sed 's/^/  /' || true
done
echo "gpu-wheels/: $(du -sh gpu-wheels | cut -f1) (the device has torch, numpy, packaging, typing-extensions)"
