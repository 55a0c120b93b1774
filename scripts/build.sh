#!/usr/bin/env bash
# Configures segflow (Release, Ninja, ccache, shared precompiled header, unity batches) into
# build/ and builds what the main job runs: the `segflow` and `segflowd` programs. The test
# suites and benchmarks are built by scripts/test.sh (or `ninja -C build`).
# usage: scripts/build.sh [extra cmake -D options]
#   SEGFLOW_JOBS      parallel compile jobs (default: the number of cores)
#   SEGFLOW_TARGETS   what to build (default: "segflow segflowd"; "all" for everything)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
jobs="${SEGFLOW_JOBS:-$(nproc)}"
read -r -a targets <<< "${SEGFLOW_TARGETS:-segflow segflowd}"
start=$(date +%s)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" > build-configure.log 2>&1 || { cat build-configure.log; exit 1; }
ninja -C build -j"$jobs" "${targets[@]}"
echo "build: ${targets[*]} configured and built in $(( $(date +%s) - start )) s"
