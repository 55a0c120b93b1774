#!/usr/bin/env bash
# clang-tidy with the checked-in .clang-tidy over segflow's sources.
# Compile commands: build-asan/ (clang 14, the asan preset that scripts/fuzz.sh builds) when it
# is there: its precompiled header is clang's own, which roughly halves the time per file;
# otherwise build/'s (GCC), with the GCC precompiled header replaced by the header it holds
# (clang cannot read GCC's .gch).
# usage: scripts/tidy.sh [-j N] [--changed BASE | --sources | --all | FILE...]
#   --sources  the library and program sources (messages, pipeline, models, actors, daemon, apps,
#              bench), not the tests; --all (the default) adds the tests and fuzz harnesses.
#   About 17 s of CPU per file: LibTorch's headers are in every translation unit.
# Prints one line per file with findings and a JSON summary line; exits 1 on any finding.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
jobs=1
if [ "${1:-}" = "-j" ]; then jobs=$2; shift 2; fi
db=build/tidy
if [ -f build-asan/compile_commands.json ] && [ -f build-asan/CMakeFiles/segflow_pch.dir/cmake_pch.hxx.pch ]; then
  src=build-asan/compile_commands.json
  db=build-asan/tidy
else
  [ -f build/compile_commands.json ] ||
    { echo "tidy: no compile commands: run scripts/build.sh (or scripts/fuzz.sh for build-asan/)" >&2; exit 2; }
  src=build/compile_commands.json
fi
mkdir -p "$db"
python3 - "$src" "$db/compile_commands.json" <<'PY'
import json, os, shlex, sys
root = os.getcwd() + "/"
out = []
for e in json.load(open(sys.argv[1])):
    f = e["file"]
    if not f.startswith(root) or f[len(root):].split("/")[0] in ("build", "build-asan", "cmake"):
        continue  # generated files and the precompiled-header stubs
    if "-include-pch" not in e["command"]:  # GCC: the .gch becomes the header it holds
        args = [("torch/torch.h" if a.endswith("cmake_pch.hxx") else a)
                for a in shlex.split(e["command"]) if not a.startswith("-Winvalid-pch")]
        e["command"] = " ".join(shlex.quote(a) for a in args)
    out.append(e)
# One entry per file (a source built into two targets is checked once).
seen = {}
for e in out:
    seen.setdefault(e["file"], e)
json.dump(list(seen.values()), open(sys.argv[2], "w"), indent=0)
PY
list_db() { python3 -c "import json; [print(e['file']) for e in json.load(open('$db/compile_commands.json'))]"; }
case "${1:---all}" in
  --changed) mapfile -t files < <(git diff --name-only "${2:?--changed needs a base}" -- '*.cpp' | grep -v '^tests/plugins/' || true) ;;
  --all) mapfile -t files < <(list_db) ;;
  --sources) mapfile -t files < <(list_db | grep -E "^$PWD/(messages|pipeline|models|actors|daemon|apps|bench)/") ;;
  *) files=("$@") ;;
esac
[ "${#files[@]}" -gt 0 ] || { echo "tidy: no files"; exit 0; }
t0=$(date +%s)
out=$(mktemp)
# xargs exits 123 when any clang-tidy failed; each failing file is named on stderr.
set +e
printf '%s\n' "${files[@]}" | xargs -P "$jobs" -I{} sh -c \
  'o=$(mktemp); clang-tidy -p "$0" --quiet "$1" > "$o" 2>/dev/null; rc=$?; if [ $rc -ne 0 ]; then cat "$o"; echo "tidy: findings in $1" >&2; fi; rm -f "$o"; exit $rc' \
  "$db" {} > "$out"
rc=$?
set -e
cat "$out"
bad=$(grep -c '^.*: \(warning\|error\): ' "$out" || true)
rm -f "$out"
echo "{\"tidy\": \"$db\", \"files\": ${#files[@]}, \"findings\": $bad, \"seconds\": $(( $(date +%s) - t0 )), \"jobs\": $jobs}"
[ $rc -eq 0 ] || exit 1
