#!/bin/sh
# ctest reports_format_planted: tools/check_reports.sh passes a report in the current claims
# format and fails, naming the line, on each planted fault: a row without a basis tag, a
# CASES.md or docs/cases.md source in the articles' table, a claim id twice, an old-format
# report. The good report is a hand-written one in the format harness/report.c writes.
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/r"
good="$tmp/r/case.md"
cat >"$good" <<'MD'
# case

## Claims of the articles

| id | claim | source | article | this suite, before → after | basis | tolerance | verdict | note |
|---|---|---|---|---|---|---|---|---|
| `a` | claim a | 004 table | ×2 | ×1 | planned | ±1%; exact | **does not hold** | no change |
| `b` | claim b | 002 §1.3 | 0.7–1 | 98% | measured (stand-in: on CPU ranks) | the range | **holds on CPU ranks** | |

## Suite checks

| id | claim | source | article | this suite, before → after | basis | tolerance | verdict | note |
|---|---|---|---|---|---|---|---|---|
| `c` | claim c | docs/cases.md §5 | ×0.5 | ×0.5 | planned | ±0.1% | **holds** | |
MD
check() { sh "$src/tools/check_reports.sh" "$tmp/r" >"$tmp/out" 2>&1; }
fail=0
check || { echo "FAIL: the good report does not pass:"; cat "$tmp/out"; fail=1; }

# plant SED WHY: the good report edited by SED fails naming WHY
plant() {
  sed "$1" "$good" >"$tmp/r/planted.md"
  if check; then echo "FAIL: '$1' passed the check"; fail=1
  elif ! grep -q "planted.md:[0-9]*: .*$2" "$tmp/out"; then echo "FAIL: '$1' not refused for '$2':"; cat "$tmp/out"; fail=1
  else echo "ok: refused: $(grep "planted.md" "$tmp/out" | head -1)"
  fi
  rm -f "$tmp/r/planted.md"
}
# the first row of the articles' table (the line after its |---| line)
first='/^## Claims of the articles/,/^## /{/^|---/{n;'
plant "${first}s/| planned |/| |/;s/| measured [^|]*|/| |/;s/| modeled |/| |/;}}" "no basis tag"
plant "${first}s/^\(| [^|]*| [^|]*| \)[^|]*|/\1CASES.md |/;}}" "source that is no article"
plant "${first}s/^\(| [^|]*| [^|]*| \)[^|]*|/\1docs\/cases.md §5 notes |/;}}" "source that is no article"
plant "${first}p;}}" "twice"
plant 's/^## Claims of the articles/## Claims/' "old-format"
# a report without any claims table in the current format
printf '# old\n\n## Claims\n\n| claim | source | article before → after | measured before → after | verdict | note |\n' \
  >"$tmp/r/planted.md"
if check; then echo "FAIL: an old-format report passed"; fail=1; else echo "ok: an old-format report is refused"; fi
rm -f "$tmp/r/planted.md"
exit $fail
