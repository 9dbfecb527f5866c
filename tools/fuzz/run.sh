#!/usr/bin/env bash
# Build the libFuzzer targets (clang, ASan + UBSan) in build-fuzz and run each one, from its
# committed seed corpus tools/fuzz/corpus/<name>/ (new inputs go to build-fuzz/corpus/<name>/,
# never into the tree). Usage:
#   tools/fuzz/run.sh [--time S | --runs N] [target ...]      (default: every target, 60 s)
# Exits non-zero when a target crashes, leaks, hangs or trips a sanitizer; the reproducer is
# left in build-fuzz/crashes/<name>/.
set -euo pipefail
cd "$(dirname "$0")/../.."
limit=(-max_total_time=60)
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --time) limit=(-max_total_time="$2"); shift 2 ;;
    --runs) limit=(-runs="$2"); shift 2 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
need=(clang libclang-rt-14-dev libomp-14-dev)
missing=()
for p in "${need[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "fuzz: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
  else
    echo "fuzz: missing packages: ${missing[*]}; run: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
fi
./tools/deps.sh
B="${FUZZ_BUILD:-build-fuzz}"   # separate build folders let several people fuzz at once
if [ ! -f "$B/CMakeCache.txt" ]; then
  cmake -S . -B "$B" -DCMAKE_C_COMPILER=clang -DVRAMLAB_FUZZ=ON -DVRAMLAB_CUDA=OFF \
        -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
else
  cmake "$B" >/dev/null # a target added since the folder was made must be known by name
fi
if [ ${#targets[@]} -eq 0 ]; then
  for f in tools/fuzz/fuzz_*.c; do targets+=("$(basename "$f" .c)"); done
fi
cmake --build "$B" -j "$(nproc)" --target "${targets[@]}"
fail=0
for t in "${targets[@]}"; do
  mkdir -p "$B/corpus/$t" "$B/crashes/$t" tools/fuzz/corpus/"$t"
  log="$B/$t.log"
  echo "fuzz: $t ${limit[*]}" >&2
  # the targets write only below $TMPDIR (their own folder, removed here)
  tmp=$(mktemp -d)
  if TMPDIR="$tmp" ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
     UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
     "./$B/$t" "${limit[@]}" -rss_limit_mb=4096 -timeout=20 -print_final_stats=1 \
       -artifact_prefix="$B/crashes/$t/" "$B/corpus/$t" "tools/fuzz/corpus/$t" \
       >"$log" 2>&1; then
    runs=$(grep -m1 'stat::number_of_executed_units' "$log" | awk '{print $2}')
    cov=$(grep -E '^#[0-9]+.*(DONE|cov:)' "$log" | tail -1 | grep -o 'cov: [0-9]*' || true)
    echo "fuzz: $t ok: ${runs:-?} executions, ${cov:-cov: ?} edges" >&2
  else
    echo "fuzz: $t FAILED (log: $log, reproducer in $B/crashes/$t/)" >&2
    tail -40 "$log" >&2
    fail=1
  fi
  rm -rf "$tmp"
done
exit $fail
