#!/usr/bin/env bash
# Fetches real third-party test data from PyPI source archives into a cache outside git
# (never committed): the totalsegmentator 2.18.0 sdist (real CT NIfTI volumes with
# 117-class label maps, a real Siemens CT DICOM series in lossless JPEG 2000, its label on
# the series grid) and pydicom-data 1.0.0 (a dcmqi DICOM SEG, an Enhanced CT, JPEG 2000
# files). Idempotent: a complete cache is left alone.
#
# usage: scripts/fetch-test-data.sh [DIR]      (default: $SEGFLOW_TESTDATA or ~/.cache/segflow-testdata)
# Prints the cache folder on its last line. The tests find it through the same rule.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${1:-${SEGFLOW_TESTDATA:-$HOME/.cache/segflow-testdata}}"
py="$here/.venv/bin/python"
[ -x "$py" ] || py=python3
stamp="$dest/.complete-v1"
if [ -f "$stamp" ]; then
  echo "$dest"
  exit 0
fi
mkdir -p "$dest"
tmp="$(mktemp -d "$dest/.fetch.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
"$py" -m pip download -q --no-deps --no-binary :all: -d "$tmp" \
  "totalsegmentator==2.18.0" "pydicom-data==1.0.0" >&2
tar -xzf "$tmp"/totalsegmentator-2.18.0.tar.gz -C "$tmp" \
  totalsegmentator-2.18.0/tests/reference_files
tar -xzf "$tmp"/pydicom-data-1.0.0.tar.gz -C "$tmp" pydicom-data-1.0.0/data_store/data
rm -rf "$dest/totalsegmentator" "$dest/pydicom-data"
mv "$tmp/totalsegmentator-2.18.0/tests/reference_files" "$dest/totalsegmentator"
mv "$tmp/pydicom-data-1.0.0/data_store/data" "$dest/pydicom-data"
touch "$stamp"
echo "$dest"
