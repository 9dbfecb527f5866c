#!/usr/bin/env bash
# Run a program on NP ranks under mpirun with what Open MPI needs here: permission to run
# as root, no CMA single-copy (containers forbid it), --oversubscribe when NP exceeds the
# cores, and a wall-clock limit (MPIRUN_TIMEOUT seconds, default 240) so a stuck job dies
# (exit status 124) instead of hanging CI.
# usage: tests/mpirun.sh NP EXE [ARGS...]
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 NP EXE [ARGS...]" >&2
  exit 2
fi
np=$1
shift
case "$np" in '' | *[!0-9]*) echo "$0: NP must be a positive number of ranks, got '$np'" >&2; exit 2 ;; esac
if ! command -v mpirun >/dev/null 2>&1; then
  echo "$0: mpirun not found: apt-get install libopenmpi-dev openmpi-bin" >&2
  exit 127
fi
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# Under the sanitizers (make asan): Open MPI is built without frame pointers, so ASan's fast
# unwinder stops at its first frame and tests/lsan.supp cannot see that Open MPI allocated a
# block; the slow unwinder walks on into libmpi/libopen-pal (MPI tests only: it is slower).
if [ -n "${ASAN_OPTIONS:-}" ] && [[ "$ASAN_OPTIONS" != *fast_unwind_on_malloc* ]]; then export ASAN_OPTIONS="$ASAN_OPTIONS:fast_unwind_on_malloc=0"; fi
extra=()
if [ "$np" -gt "$(nproc)" ]; then extra+=(--oversubscribe); fi
exec timeout --kill-after=10 "${MPIRUN_TIMEOUT:-240}" \
  mpirun -np "$np" --mca btl_vader_single_copy_mechanism none --bind-to none "${extra[@]}" "$@"
