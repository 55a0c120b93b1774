#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh needs on the GPU machine into gpu-bundle/ and
# gpu-bundle.tar.xz (both git-ignored; the device tool carries the tarball):
#   bin/    the stripped segflow binary, every suite's test executable and the step benchmark
#   lib/    the shared libraries they need that the GPU machine lacks (see the rules below)
#   share/dcmtk/  DCMTK's data dictionaries (DCMDICTPATH), without which no DICOM file reads
#   configs/, tests/tools/  what the test cases read through source_path() (SEGFLOW_SOURCE_DIR)
#   MANIFEST      the commit, the LibTorch it was built against ("torch VERSION": gpu-check
#                 compares it with the device's), every library left out and why, the files
# Library rules (each library ldd resolves is classified by rule, never by where it happens
# to lie; MANIFEST lists the verdicts):
#   glibc     left out: glibc's own libraries (libc, libm, libpthread, libdl, librt, libresolv,
#             libutil, libanl, libnsl.so.1, libnss_*, ld-linux, ...: by soname, and by dpkg's
#             owner libc6 where dpkg answers). A second glibc beside the device's dynamic loader breaks processes.
#   driver    left out: libcuda / libnvidia-* come with the device's driver.
#   cuda      left out: the CUDA runtime libraries (cudart, cuBLAS, cuDNN, NCCL, ...: by name),
#             anything under an */nvidia/* folder (pip's nvidia-* wheels) or a CUDA toolkit
#             (/usr/local/cuda*); the device's torch wheel and toolkit bring their own.
#   libtorch  left out: anything in the build's torch/lib (LibTorch comes from the device's
#             python3 torch wheel, the same version: gpu-check refuses a mismatch).
#   ship      everything else (DCMTK, CAF, ZeroMQ, ICU, libstdc++, ...).
# Refuses: a stale build (`ninja -n` must have no work for the bundled targets, their globs
# and build.ninja must be current: build them first, under the lock, see /work/notes/TEAM.md), a library ldd cannot find (other than the
# driver's), and a carried tree over the device tool's 64 MiB (tracked and untracked files,
# gpu-bundle.tar.xz and gpu-wheels/ together).
# usage: scripts/make-gpu-bundle.sh   (after building the targets it names; set SEGFLOW_BUILD_DIR
#        for another build folder)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${SEGFLOW_BUILD_DIR:-build}
suites=(models pipeline actors parallel apps)
targets=(segflow segflow_step_bench)
bins=("$build/apps/segflow" "$build/bench/segflow_step_bench")
for s in "${suites[@]}"; do
  targets+=("segflow_${s}_tests")
  bins+=("$build/tests/segflow_${s}_tests")
done
die() { echo "make-gpu-bundle: $*" >&2; exit 1; }

# 1. A fresh build of exactly what is packed. A plain `ninja -n` always plans a CMake re-run in
# a build with CONFIGURE_DEPENDS globs (their check is a phony edge that a dry run cannot
# execute), so the three ways a build goes stale are checked apart, writing nothing in build/:
#  (a) a globbed source list changed: CMake's VerifyGlobs.cmake, run as a script that reports;
#  (b) an input of build.ninja's own rule (a CMakeLists.txt, a package config) is newer than it;
#  (c) the targets: `ninja -n` with the manifest named by its absolute path (so that ninja does
#      not plan to regenerate it) must have no work to do.
stale() {  # prints why $build is stale for the bundled targets; nothing when it is fresh
  local abs tmp plan
  abs=$(cd "$build" && pwd)
  if [[ -f $abs/CMakeFiles/VerifyGlobs.cmake ]]; then
    tmp=$(mktemp)
    sed 's/^\( *\)file(TOUCH_NOCREATE .*/\1set(SEGFLOW_GLOBS_CHANGED 1)/' "$abs/CMakeFiles/VerifyGlobs.cmake" > "$tmp"
    printf 'if(SEGFLOW_GLOBS_CHANGED)\n  message(FATAL_ERROR "stale")\nendif()\n' >> "$tmp"
    cmake -P "$tmp" > /dev/null 2>&1 || echo "a globbed source list changed (a file added or removed): CMake must re-run"
    rm -f "$tmp"
  fi
  ninja -C "$build" -f "$abs/build.ninja" -t query build.ninja | awk '/^  input:/{on=1; next} /^  outputs:/{on=0} on{print $NF}' |
    while read -r f; do
      [[ $f == /* ]] || f=$abs/$f
      if [[ -e $f && $f -nt $abs/build.ninja ]]; then echo "$f is newer than build.ninja: CMake must re-run"; fi
    done
  plan=$(ninja -C "$build" -f "$abs/build.ninja" -n "${targets[@]}" 2>&1) || { echo "ninja -n failed: $plan"; return 0; }
  if ! grep -q "no work to do" <<< "$plan"; then
    echo "ninja -n would run:"
    grep -E '^\[[0-9]+/[0-9]+\]' <<< "$plan" | head -n 8 || true
  fi
  return 0
}
for b in "${bins[@]}"; do [[ -x $b ]] || die "$b is missing: build it first (ninja -C $build ${targets[*]})"; done
why=$(stale)
if [[ -n $why ]]; then
  echo "make-gpu-bundle: $build is stale for the bundled targets:" >&2
  while read -r line; do echo "  $line" >&2; done <<< "$why"
  die "build them first: flock /tmp/segflow-build.lock ninja -C $build ${targets[*]}"
fi
py=.venv/bin/python
[[ -x $py ]] || py=python3
torch_version=$("$py" -c 'import torch; print(torch.__version__)') || die "$py cannot import torch"
torch_lib=$("$py" -c 'import os, torch; print(os.path.realpath(os.path.join(os.path.dirname(torch.__file__), "lib")))')
dict_dir=""
for d in /usr/share/libdcmtk*; do [[ -f $d/dicom.dic ]] && dict_dir=$d; done
[[ -n $dict_dir ]] || die "DCMTK's dicom.dic not found under /usr/share/libdcmtk*"

# 2. The library rules.
# glibc's sonames (libnsl.so.1 is glibc's; libnsl.so.2 is libnsl2's and ships).
glibc_names='^((ld-linux.*|libc|libm|libmvec|libpthread|libdl|librt|libresolv|libutil|libanl|libBrokenLocale|libthread_db|libnss_(files|dns|compat|db|hesiod)|libmemusage|libpcprofile|libSegFault|libc_malloc_debug)\.so|libnsl\.so\.1)'
cuda_names='^lib(cudart|cublas|cublasLt|cufft|cufile|curand|cusolver|cusparse|cusparseLt|cupti|nvrtc|nvJitLink|nvToolsExt|nvshmem_host|cudnn[a-z_]*|nccl)\.so'
classify() {  # $1: a library path as ldd resolved it; prints glibc|driver|cuda|libtorch|ship
  local lib=$1 real base owner
  real=$(realpath "$lib")
  base=$(basename "$lib")
  if [[ $base =~ $glibc_names ]]; then echo glibc; return; fi
  if command -v dpkg > /dev/null; then
    # (under usrmerge dpkg knows /usr/lib/... for what ldd finds in /lib/...)
    owner=$(dpkg -S "$lib" 2> /dev/null || dpkg -S "$real" 2> /dev/null || dpkg -S "/usr$real" 2> /dev/null || true)
    if [[ ${owner%%:*} == libc6 || ${owner%%:*} == libc6-dev ]]; then echo glibc; return; fi
  fi
  if [[ $base =~ ^(libcuda|libnvidia-[a-z0-9_-]+)\.so ]]; then echo driver; return; fi
  if [[ $lib == */nvidia/* || $real == */nvidia/* || $real == /usr/local/cuda* || $base =~ $cuda_names ]]; then
    echo cuda
    return
  fi
  if [[ $real == "$torch_lib"/* ]]; then echo libtorch; return; fi
  echo ship
}

rm -rf gpu-bundle gpu-bundle.tar.xz
mkdir -p gpu-bundle/bin gpu-bundle/lib gpu-bundle/share/dcmtk gpu-bundle/tests
for b in "${bins[@]}"; do strip -o "gpu-bundle/bin/$(basename "$b")" "$b"; done
ldd_out=$(for b in gpu-bundle/bin/*; do ldd "$b"; done)
missing=$(grep "not found" <<< "$ldd_out" | awk '{print $1}' | sort -u | grep -Ev '^(libcuda|libnvidia-)' || true)
[[ -z $missing ]] || die "ldd finds no $(tr '\n' ' ' <<< "$missing")(run it where the build runs)"
verdicts=""
while read -r lib; do
  v=$(classify "$lib")
  verdicts+="$v $lib"$'\n'
  [[ $v == ship ]] && cp -L "$lib" gpu-bundle/lib/
done < <(awk '/=> \//{print $3}' <<< "$ldd_out" | sort -u)
strip --strip-unneeded gpu-bundle/lib/*.so* 2> /dev/null || true
# The rules hold: nothing of glibc's, the driver's, the CUDA wheels' or LibTorch's went in.
for f in gpu-bundle/lib/*; do
  v=$(classify "$f")
  [[ $v == ship ]] || die "$f is a $v library: the rules must have left it out"
done
cp "$dict_dir"/*.dic gpu-bundle/share/dcmtk/
cp -r configs gpu-bundle/configs
cp -r tests/tools gpu-bundle/tests/tools
find gpu-bundle -name __pycache__ -prune -exec rm -rf {} +
{
  echo "torch $torch_version"
  echo "commit $(git rev-parse HEAD 2> /dev/null || echo unknown)$(git diff --quiet HEAD 2> /dev/null || echo ' (with uncommitted changes)')"
  echo "made $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m) from $build (fresh: ninja -n has no work)"
  echo "suites ${suites[*]}"
  echo "libraries (rule, path as ldd resolved it):"
  sort <<< "$verdicts" | sed '/^$/d; s/^/  /'
  echo "files:"
  (cd gpu-bundle && find . -type f ! -name MANIFEST | sort | sed 's/^/  /')
} > gpu-bundle/MANIFEST
tar -C . -cf - gpu-bundle | xz -T2 -6 > gpu-bundle.tar.xz
du -sh gpu-bundle gpu-bundle.tar.xz
echo "left out by rule: $(grep -c '^glibc' <<< "$verdicts" || true) glibc, $(grep -c '^driver' <<< "$verdicts" || true) driver," \
  "$(grep -c '^cuda' <<< "$verdicts" || true) CUDA, $(grep -c '^libtorch' <<< "$verdicts" || true) LibTorch; shipped $(find gpu-bundle/lib -type f | wc -l)"

# 3. What travels: the tree (tracked and untracked-not-ignored files), the bundle, the wheels.
"$py" - << 'EOF' || exit 1
import os, subprocess, sys
files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                       capture_output=True, check=True).stdout.split(b"\0")
tree = sum(os.path.getsize(f) for f in files if f and os.path.isfile(f))
bundle = os.path.getsize("gpu-bundle.tar.xz")
wheels = sum(os.path.getsize(os.path.join("gpu-wheels", f)) for f in os.listdir("gpu-wheels")) \
    if os.path.isdir("gpu-wheels") else 0
mib = lambda b: b / 2**20
total = tree + bundle + wheels
print(f"carried: tree {mib(tree):.1f} MiB + gpu-bundle.tar.xz {mib(bundle):.1f} MiB + gpu-wheels/ "
      f"{mib(wheels):.1f} MiB = {mib(total):.1f} MiB of the device tool's 64 MiB")
if total > 64 * 2**20:
    sys.exit("make-gpu-bundle: over the device tool's 64 MiB: the call would be refused")
EOF
