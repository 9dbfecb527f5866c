#!/usr/bin/env bash
# Rewrite the golden plan snapshots (tests/golden/<case>.json: `vramlab plan CASE --json` at
# full scale, every rung). Do it only on purpose: test_golden compares plans with them
# exactly, so a change of a planned byte or FLOP shows up as a failing test.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/vramlab}
for c in $("$bin" list | awk '/^[a-z]/ && !/^devices:/ {print $1}'); do
  # cases that resolve workers=cores plan for 2 cores (test_golden does the same)
  pin=()
  if "$bin" list "$c" --json | grep -q '"name":[[:space:]]*"cores"'; then pin=(--set cores=2); fi
  # a case with a PyTorch mimic (vramlab/mimic.h) keeps it in its golden plan, as the plan hook
  # writes it (test_golden calls the hook)
  mimic=()
  if "$bin" plan "$c" --json --mimic pytorch "${pin[@]}" >/dev/null 2>&1; then mimic=(--mimic pytorch); fi
  "$bin" plan "$c" --json "${mimic[@]}" "${pin[@]}" > "tests/golden/$c.json.tmp"
  mv "tests/golden/$c.json.tmp" "tests/golden/$c.json"
  echo "tests/golden/$c.json"
done
