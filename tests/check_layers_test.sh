#!/bin/sh
# ctest layers_planted: tools/check_layers.sh fails on an include that climbs a layer or
# reaches into another case's folder, planted in a copy of the tree's sources, and passes
# on the copy as it is.
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -R "$src/engine" "$src/datasets" "$src/kit" "$src/cases" "$src/harness" "$src/tools" "$tmp/"
check() { sh "$src/tools/check_layers.sh" --internal "$tmp" >"$tmp.out" 2>&1; }
fail=0

check || { echo "FAIL: the unplanted copy does not pass:"; cat "$tmp.out"; fail=1; }

# expect_refused FILE TEXT WHY: FILE with TEXT planted makes the check fail naming FILE and WHY
expect_refused() {
  printf '%s\n' "$2" >"$tmp/$1"
  if check; then echo "FAIL: $1 with '$2' passed the check"; fail=1
  elif ! grep -q "^$1:1: .*$3" "$tmp.out"; then echo "FAIL: $1 not named ($3):"; cat "$tmp.out"; fail=1
  else echo "ok: $1 refused: $(grep "^$1:1:" "$tmp.out")"
  fi
  rm -f "$tmp/$1"
}
expect_refused cases/dataloader/planted.c '#include "../../harness/report.h"' "climbs a layer"
expect_refused cases/dataloader/planted.c '#include "harness/registry.h"' "climbs a layer"
expect_refused cases/multi-gpu/planted.c '#include "../seg-ckpt/seg.h"' "another case"
expect_refused kit/planted.c '#include "cases/llm-lora/llm.h"' "climbs a layer"
expect_refused datasets/planted.c '#include "kit/case.h"' "climbs a layer"
expect_refused engine/core/planted.c '#include "../../datasets/segset.h"' "climbs a layer"
expect_refused harness/planted.c '#include "engine/kernels/kcommon.h"' "the engine's insides"
expect_refused tools/planted.c '#include "../engine/backend/cpu/cpu_internal.h"' "the engine's insides"

rm -f "$tmp.out"
exit $fail
