#!/usr/bin/env bash
# Proves the GPU bundle on a bare Debian 12 root, as bare as the GPU machine: debootstrap's
# minbase plus python3 (no xz, no -dev library, no DCMTK, CAF, ZeroMQ or ITK), LibTorch only
# from the torch wheel (the venv's torch and its CUDA/Python dependencies, bind-mounted
# read-only under /opt/torchsite), then runs `gpu-check.sh --bundle-cpu-check` inside it.
# Needs root (debootstrap, mount, chroot) and the Debian mirror apt uses.
# usage: sudo scripts/bundle-bare-check.sh [ROOT_DIR]    (after scripts/make-gpu-bundle.sh)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=${1:-/tmp/segflow-bare-root}
[[ -f gpu-bundle.tar.xz ]] || { echo "bundle-bare-check: run scripts/make-gpu-bundle.sh first" >&2; exit 2; }
command -v debootstrap > /dev/null || apt-get install -y debootstrap
mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
if [[ ! -x $root/usr/bin/python3 ]]; then
  debootstrap --variant=minbase --include=python3,libgomp1 bookworm "$root" "${mirror:-http://deb.debian.org/debian}"
fi
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$root/opt/torchsite"
for p in torch torchgen functorch nvidia cuda triton sympy mpmath networkx jinja2 markupsafe fsspec filelock setuptools; do
  [[ -e $site/$p ]] || continue
  mkdir -p "$root/opt/torchsite/$p"
  mountpoint -q "$root/opt/torchsite/$p" || mount --bind -o ro "$site/$p" "$root/opt/torchsite/$p"
done
cp "$site/typing_extensions.py" "$root/opt/torchsite/"
mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
mkdir -p "$root/root/check/scripts"
cp scripts/gpu-check.sh "$root/root/check/scripts/"
cp gpu-bundle.tar.xz "$root/root/check/"
echo "bare root: $(chroot "$root" dpkg -l | grep -c '^ii') packages, $(chroot "$root" dpkg -l | grep -c -- '-dev ' || true) -dev"
chroot "$root" env -i PATH=/usr/bin:/bin HOME=/root PYTHONPATH=/opt/torchsite OMP_NUM_THREADS=2 \
  bash -c 'cd /root/check && bash scripts/gpu-check.sh --bundle-cpu-check /root/unpacked'
