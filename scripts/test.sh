#!/usr/bin/env bash
# The test command: builds every test suite, plugin and benchmark that scripts/build.sh left
# out (build/ must be configured: run scripts/build.sh first), then runs every doctest case
# as its own CTest test, two at a time. Extra arguments go to ctest (e.g. -R daemon).
#   SEGFLOW_JOBS   parallel compile jobs (default: the number of cores)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
[[ -f build/build.ninja ]] || { echo "test: build/ is not configured: run scripts/build.sh first" >&2; exit 2; }
start=$(date +%s)
ninja -C build -j"${SEGFLOW_JOBS:-$(nproc)}"
echo "test: suites built in $(( $(date +%s) - start )) s"
exec ctest --test-dir build --output-on-failure -j2 "$@"
