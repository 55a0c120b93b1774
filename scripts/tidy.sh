#!/usr/bin/env bash
# clang-tidy with the checked-in .clang-tidy over segflow's sources, using build/'s compile
# commands, with the GCC precompiled header replaced by the header it holds (clang cannot
# read GCC's .gch).
# usage: scripts/tidy.sh [--changed BASE | FILE...]   (no argument: every source; slow,
#        about 20 s per LibTorch source on 2 cores)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ -f build/compile_commands.json ] || { echo "tidy: build/compile_commands.json missing: run scripts/build.sh" >&2; exit 2; }
db=build/tidy
mkdir -p "$db"
python3 - build/compile_commands.json "$db/compile_commands.json" <<'PY'
import json, re, shlex, sys
out = []
for e in json.load(open(sys.argv[1])):
    args = shlex.split(e["command"])
    keep = []
    for a in args:
        if a.startswith("-Winvalid-pch"):
            continue
        if a.endswith("cmake_pch.hxx"):  # the shared PCH holds <torch/torch.h>
            keep.append("torch/torch.h")
            continue
        keep.append(a)
    e["command"] = " ".join(shlex.quote(a) for a in keep)
    if not e["file"].endswith("pch_stub.cpp"):
        out.append(e)
json.dump(out, open(sys.argv[2], "w"), indent=0)
PY
if [ "${1:-}" = "--changed" ]; then
  mapfile -t files < <(git diff --name-only "${2:?--changed needs a base}" -- '*.cpp' | grep -v '^tests/plugins/' || true)
elif [ $# -gt 0 ]; then
  files=("$@")
else
  mapfile -t files < <(python3 -c "import json; [print(e['file']) for e in json.load(open('$db/compile_commands.json'))]")
fi
[ "${#files[@]}" -gt 0 ] || { echo "tidy: no files"; exit 0; }
status=0
for f in "${files[@]}"; do
  clang-tidy -p "$db" --quiet "$f" 2>/dev/null || { status=1; echo "tidy: findings in $f" >&2; }
done
[ $status = 0 ] && echo "tidy: ${#files[@]} file(s) clean"
exit $status
