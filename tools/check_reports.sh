#!/bin/sh
# tools/check_reports.sh DIR: every case report DIR/*.md (index.md and regress.md apart) in the
# claims format of issue #19, as `vramlab report` writes it (harness/report.c TABLE_HEAD):
#  - it has a "## Claims of the articles" table with the column head
#    | id | claim | source | article | this suite, before → after | basis | tolerance | verdict | note |
#    (a report in the older format, without basis or id columns, fails: regenerate it);
#  - every row of a claims table ("Claims of the articles", "Suite checks") has a basis tag:
#    planned, measured, modeled or configured;
#  - every row of "Claims of the articles" names an article as its source (a three-digit
#    article id first: "004 multi-GPU table"); docs/cases.md, CASES.md or anything else is a
#    suite check and belongs in "Suite checks";
#  - no claim id appears twice in one report.
# Prints FILE:LINE: why for each problem; exit 1 when there is one (2: bad usage).
# tests/check_reports_test.sh (ctest reports_format_planted) proves it fails on each.
set -u
dir=${1:-}
[ -n "$dir" ] && [ -d "$dir" ] || { echo "usage: check_reports.sh REPORTS_DIR" >&2; exit 2; }
head='| id | claim | source | article | this suite, before → after | basis | tolerance | verdict | note |'
fail=0
n=0
for f in "$dir"/*.md; do
  [ -e "$f" ] || continue
  case $(basename "$f") in index.md | regress.md) continue ;; esac
  n=$((n + 1))
  awk -v F="$f" -v HEAD="$head" '
    function trim(s) { gsub(/^[ \t]+|[ \t]+$/, "", s); return s }
    function bad(why) { printf "%s:%d: %s\n", F, NR, why; nbad++ }
    BEGIN { sect = ""; intable = 0; seenhead = 0; nbad = 0 }
    /^## / {
      sect = substr($0, 4); intable = 0
      if (sect == "Claims") bad("an old-format claims table (\"## Claims\"): regenerate the report with this vramlab")
      next
    }
    (sect == "Claims of the articles" || sect == "Suite checks") && /^\|/ {
      if (!intable) {
        if ($0 != HEAD) { bad("the claims table head is not the current one (id, ..., basis, tolerance, verdict)"); intable = 2; next }
        if (sect == "Claims of the articles") seenhead = 1
        intable = 1; next
      }
      if (intable == 2) next
      if ($0 ~ /^\|---/) next
      n = split($0, c, "|")
      # c[1] is empty (the line starts with |); id, claim, source, article, suite, basis, ...
      if (n < 10) { bad("a claims row with " (n - 2) " cells, not 9"); next }
      id = trim(c[2]); src = trim(c[4]); basis = trim(c[7])
      gsub(/`/, "", id)
      if (id == "") bad("a claims row without an id")
      else if (id in seen) bad("claim id \"" id "\" twice (first on line " seen[id] ")")
      else seen[id] = NR
      if (basis !~ /^(planned|measured|modeled|configured)([ (]|$)/)
        bad("claim \"" id "\" has no basis tag (planned, measured, modeled or configured): \"" basis "\"")
      if (sect == "Claims of the articles" && (src !~ /^[0-9][0-9][0-9]([^0-9]|$)/ || src ~ /CASES\.md|docs\//))
        bad("claim \"" id "\" in the articles table has a source that is no article: \"" src "\" (scope = suite)")
      next
    }
    !/^\|/ { if (intable) intable = 0 }
    END {
      if (!seenhead) { printf "%s: no \"## Claims of the articles\" table in the current format\n", F; nbad++ }
      exit nbad > 0
    }' "$f" || fail=1
done
[ "$n" -gt 0 ] || { echo "$dir: no case report (*.md)"; exit 1; }
[ $fail -eq 0 ] && echo "check_reports: $n reports in $dir carry the claims format"
exit $fail
