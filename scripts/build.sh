#!/usr/bin/env bash
# Configures and builds segflow (Release, Ninja, ccache, shared PCH) into build/.
# usage: scripts/build.sh [extra cmake -D options]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
jobs="${SEGFLOW_JOBS:-$(nproc)}"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" > build-configure.log 2>&1 || { cat build-configure.log; exit 1; }
ninja -C build -j"$jobs"
