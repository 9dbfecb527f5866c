#!/bin/sh
# The layer check (ctest: layers): every quoted #include of the C sources under engine/,
# datasets/, kit/, cases/ and harness/ (the driver) may only reach down the layers
#   engine <- datasets <- kit <- cases <- harness
# and a case only into its own folder (cases/<name>/), never another case's.
# --internal also refuses, outside engine/ (tools/ included, tests/ not: they test the
# insides), an include of engine/kernels/ or of an engine
# header named *_internal.h (the engine's insides; public headers are engine/include/).
#
# An include is resolved the way the build resolves it: a name found beside the including
# file is that file, else a name found from the repository root ("kit/case.h"), else it is
# outside the tree (a system header, or the engine's public vramlab/*.h through its include
# folder) and the engine's. Prints each offending line; exits 1 when there is one.
#
#   tools/check_layers.sh [--internal] [ROOT]     (ROOT: the repository, default: here)
internal=0
if [ "$1" = "--internal" ]; then internal=1; shift; fi
root=${1:-.}
cd "$root" || exit 2

files=$(find engine datasets kit cases harness tools -type f | sort)
srcs=$(echo "$files" | grep -E '\.(c|h|cu|cuh)$')
# Every file of the tree first (what an include can resolve to), then each include line
# "file:line:#include ..." of the sources.
{ echo "$files"; echo "--"; grep -Hn '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' $srcs; } | awk -v internal=$internal '
  # the layer of a path: 0 engine, 1 datasets, 2 kit, 3 cases, 4 harness
  function layer(p) {
    if (p ~ /^engine\//) return 0; if (p ~ /^datasets\//) return 1; if (p ~ /^kit\//) return 2
    if (p ~ /^cases\//) return 3; if (p ~ /^harness\//) return 4; return -1 }
  # the case folder of a path under cases/ (cases/<name>), else ""
  function case_of(p, q) { if (p !~ /^cases\/[^\/]+\//) return ""; split(p, q, "/"); return q[1] "/" q[2] }
  # a path without ./ and dir/../ steps
  function normal(p, q, r, n, i, m, s) {
    m = split(p, q, "/"); n = 0
    for (i = 1; i <= m; i++) {
      if (q[i] == "." || q[i] == "") continue
      if (q[i] == ".." && n > 0 && r[n] != "..") { n--; continue }
      r[++n] = q[i] }
    s = r[1]; for (i = 2; i <= n; i++) s = s "/" r[i]; return s }
  !listed { if ($0 == "--") listed = 1; else have[$0] = 1; next }
  {
    f = $0; sub(/:.*/, "", f); rest = substr($0, length(f) + 2); line = rest; sub(/:.*/, "", line)
    inc = rest; sub(/^[^"]*"/, "", inc); sub(/".*/, "", inc)
    dir = f; sub(/\/[^\/]*$/, "", dir)
    if (normal(dir "/" inc) in have) to = normal(dir "/" inc)
    else if (normal(inc) in have) to = normal(inc)
    else to = "engine/include/" inc
    from = layer(f); tl = layer(to); why = ""
    if (from < 0) { if (!internal) next }  # tools/: outside the layers, only --internal
    else if (tl > from) why = "climbs a layer"
    else if (from == 3 && tl == 3 && case_of(to) != case_of(f)) why = "reaches into another case'"'"'s folder"
    if (why == "" && internal && from != 0 && (to ~ /^engine\/kernels\// || to ~ /^engine\/.*_internal\.h$/))
      why = "reaches into the engine'"'"'s insides"
    if (why != "") { printf "%s:%s: #include \"%s\" (%s) %s\n", f, line, inc, to, why; bad = 1 }
  }
  END { exit bad }' || bad=1
if [ "${bad:-0}" = 1 ]; then
  echo "check_layers: includes must go down engine <- datasets <- kit <- cases <- harness (README.md, Layers)" >&2
  exit 1
fi
echo "check_layers: every include goes down the layers"
