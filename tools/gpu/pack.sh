#!/usr/bin/env bash
# tools/gpu/pack.sh [--no-diffusers] [--pack DIR] [--limit MIB]
#
# Runs HERE (Debian 12, apt): downloads the .deb files that tools/gpu/first-light.sh unpacks
# on a GPU machine that has none of our Debian packages and cannot download anything. The
# -dev packages the build needs (tools/deps.sh's libraries), pkgconf (the build's pkg-config)
# and their runtime closure from apt's own dependency lists (libgfortran5 and libquadmath0
# behind OpenBLAS, the OpenCL ICD loader behind oneDNN), less what a bare Ubuntu 24.04 image
# with nvcc has: libc6, libgcc-s1, libstdc++6, libgomp1 (nvcc needs gcc/g++, which bring
# them), zlib1g, dpkg, debconf. first-light.sh --dry-run checks every library the binaries
# load against exactly that list.
# Not packed: Open MPI (its closure is ~160 packages here, and it relocates only through
# OPAL_PREFIX; MPI is optional in the build, and the collective stage says it was skipped).
# diffusers' pure-Python wheel (pip download --no-deps) rides along for sd-lora's PyTorch peer
# (stage 5); --no-diffusers leaves it out.
#
# Output: PACK/debs/*.deb, PACK/wheels/*.whl, PACK/MANIFEST (package, version, file). A pack
# that is already complete downloads nothing. Prints the size of what would travel (the
# working tree as the device tool copies it: tracked + untracked files git does not ignore,
# plus PACK) and exits 1 past the limit (60 MiB; the tool carries 64 MiB in all).
set -euo pipefail
cd "$(dirname "$0")/../.."

pack=.gpu-pack
limit_mib=60
diffusers=1
while [ $# -gt 0 ]; do
  case "$1" in
    --diffusers) diffusers=1 ;; # the default; kept for old command lines
    --no-diffusers) diffusers=0 ;;
    --pack) pack=${2:?--pack needs a folder}; shift ;;
    --limit) limit_mib=${2:?--limit needs MiB}; shift ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "pack: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
case "$limit_mib" in ''|*[!0-9]*) echo "pack: --limit wants whole MiB, not '$limit_mib'" >&2; exit 2 ;; esac

# The -dev packages the build needs (tools/deps.sh's libraries) and pkgconf; their runtime
# closure comes from apt's own dependency lists (so the names follow the distribution: this
# machine's Debian 12 or CI's Ubuntu), less what the GPU image has (glibc and GCC's runtime).
roots=(libopenblas-openmp-dev libdnnl-dev libcjson-dev libinih-dev libturbojpeg0-dev libcmocka-dev pkgconf)
base='^(libc6|libgcc-s1|libstdc\+\+6|libgomp1|gcc-[0-9]+-base|zlib1g|debconf|dpkg)$'
mapfile -t debs < <(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
    --no-replaces --no-enhances --no-pre-depends "${roots[@]}" | grep -v '^[ <]' | sort -u | grep -Ev "$base")
[ ${#debs[@]} -ge ${#roots[@]} ] || { echo "pack: apt-cache found no packages (apt-get update first?)" >&2; exit 1; }

mkdir -p "$pack/debs" "$pack/wheels"
missing=()
for p in "${debs[@]}"; do
  compgen -G "$pack/debs/${p}_*.deb" >/dev/null || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || { echo "pack: apt-get not found: this script runs on Debian/Ubuntu" >&2; exit 1; }
  echo "pack: downloading ${#missing[@]} packages: ${missing[*]}" >&2
  # apt-get download writes into the current folder; _apt cannot write into every folder,
  # which apt reports as a warning and then downloads as the caller: not an error.
  (cd "$pack/debs" && apt-get download -q "${missing[@]}" 2>&1 |
     { grep -v "^W: Download is performed unsandboxed" || true; } >&2) ||
    { echo "pack: apt-get download failed (apt-get update first?)" >&2; exit 1; }
  for p in "${missing[@]}"; do
    compgen -G "$pack/debs/${p}_*.deb" >/dev/null || { echo "pack: $p did not download" >&2; exit 1; }
  done
fi
# One version per package: a stale .deb from an older download would be unpacked too.
for p in "${debs[@]}"; do
  n=$(compgen -G "$pack/debs/${p}_*.deb" | wc -l)
  [ "$n" -eq 1 ] || { echo "pack: $n files for $p in $pack/debs: delete the older ones" >&2; exit 1; }
done

if [ "$diffusers" = 1 ] && ! compgen -G "$pack/wheels/diffusers-*.whl" >/dev/null; then
  pip=(python3 -m pip)
  "${pip[@]}" download -q --no-deps --only-binary :all: --python-version 3.12 \
    --platform any --implementation py -d "$pack/wheels" diffusers ||
    { echo "pack: pip download diffusers failed" >&2; exit 1; }
fi

{
  echo "# tools/gpu/pack.sh $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "# tree: $(git describe --always --dirty 2>/dev/null || echo unknown)" # the GPU copy has no .git
  for f in "$pack"/debs/*.deb; do
    printf '%s\t%s\t%s\n' "$(dpkg-deb -f "$f" Package)" "$(dpkg-deb -f "$f" Version)" "${f##*/}"
  done
  for f in "$pack"/wheels/*.whl; do [ -e "$f" ] && printf 'wheel\t-\t%s\n' "${f##*/}"; done
} > "$pack/MANIFEST"

# What travels: the device tool copies tracked and untracked-not-ignored files, and the
# ignored paths named in carry (this pack).
tree_b=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
pack_b=$(du -sb "$pack" | cut -f1)
total_b=$((tree_b + pack_b))
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "pack: $(ls "$pack"/debs/*.deb | wc -l) debs, $(ls "$pack"/wheels/*.whl 2>/dev/null | wc -l) wheels in $pack: $(mib "$pack_b")"
echo "pack: what travels: tree $(mib "$tree_b") + pack $(mib "$pack_b") = $(mib "$total_b") (limit $limit_mib MiB)"
if [ "$total_b" -gt $((limit_mib * 1048576)) ]; then
  echo "pack: refused: $(mib "$total_b") is past the $limit_mib MiB limit (the device tool carries 64 MiB in all)" >&2
  exit 1
fi
