#!/usr/bin/env bash
# The CPU thread matrix (issue 40): segflow's training throughput at its defaults (no variable,
# no flag) against every fixed OpenMP wait policy and intra-op team, on a quiet machine and
# beside 1 and 2 busy processes, and against the PyTorch, MONAI and MedSAM loops at their own
# defaults on the same data, in one run. JSON lines (bench/cpu_threads.py says which); the
# "cpu_threads_line" lines hold the ratios the goals are stated in.
#
# usage: bench/cpu-threads.sh [--workloads quickstart,medsam-tiny,medsam-small,spleen,fullres]
#                             [--loads 0,1,2] [--threads 1,2] [--policies libgomp,passive,active,spin=N]
#                             [--peers yes|no] [--repeat R] [--work DIR]
#   defaults: every workload, loads 0,1,2, threads 1..cores, policies libgomp,passive,active,
#   peers yes, one run per setting. About 40 minutes on 2 cores; run it on a quiet machine (each
#   line reports "foreign_load", the cores other processes kept busy during it, and a run above
#   0.15 is repeated).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$here/.venv/bin/python"
[ -x "$py" ] || { echo "cpu-threads: no venv at $here/.venv (scripts/setup.sh)" >&2; exit 1; }
exec "$py" "$here/bench/cpu_threads.py" "$@"
