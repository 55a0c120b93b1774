#!/usr/bin/env bash
# The main job on the embedded default: a synthetic CT dataset, inspected.
# (Training joins here once `segflow train` lands.)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
bin=build/apps/segflow
data="${SEGFLOW_DATA:-data/phantoms}"
"$bin" synth --cases "${SEGFLOW_CASES:-8}" --size "${SEGFLOW_SIZE:-64}" --format dicom --compress rle --out "$data"
"$bin" inspect "$data/case_000" --json
"$bin" inspect "$data" --json
