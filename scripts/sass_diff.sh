#!/usr/bin/env bash
# SASS identity check for kernel refactors, without a GPU.
#
# Compiles the kernel translation units of a git revision (default HEAD) and of the working tree
# to cubins (device code only, the build's nvcc flags: -O3 -DNDEBUG -lineinfo -std=c++20), dumps
# `cuobjdump -sass` per kernel, normalises it and compares kernel by kernel. Also compares the
# `-Xptxas -v` resources of every kernel (registers, stack frame, spill stores/loads).
#
#   scripts/sass_diff.sh [REV] [ARCHS] [FILES...]
#     REV    git revision to compare the working tree with (default HEAD); with
#            SASS_NEW_REV=<rev> that revision is compared instead of the working tree
#     ARCHS  comma-separated, default "80,90a" (the archs CMake builds by default)
#     FILES  .cu files relative to the repo root, default the kernel launch units (the sm90
#            forward's kernels are in fwd_sm90_d*.cu since v1.5: against an older REV use
#            SASS_POOL=1) and src/dispatch/flex_dispatch.cu
#   Env: SASS_NAME_SED  sed script applied to the demangled kernel names of both sides before
#                       they are paired (e.g. 's/flashspan::BFloat16/true/g' when a template
#                       parameter changes spelling only); SASS_CACHE (default build-sass/cache):
#                       cubins are cached by the sha1 of the unit's preprocessed source and of
#                       the tree files it includes, so an unchanged unit is not rebuilt;
#                       SASS_JOBS (default 1) parallel nvcc jobs.
#                       SASS_POOL=1: kernels are paired by name over all FILES together (a
#                       unit missing from one side is skipped there), for kernels that move
#                       from one unit to another; the report then names one unit, "pool".
#   SASS_CUOBJDUMP     cuobjdump to use (default: cuobjdump on PATH or in /usr/local/cuda/bin,
#                      else build-sass/tools/cuobjdump; the pip wheels nvidia-cuda-cuobjdump and
#                      nvidia-cuda-nvdisasm hold one, with nvdisasm beside it).
# Normalisation: the instruction addresses are dropped and branch labels (.L_x_N) are
# renumbered per kernel in order of first use; the instruction text and its encoding stay
# (register numbers, constant-bank offsets of the kernel parameters, scheduling all count:
# two kernels compare equal only when their code is byte-identical).
# Exit status: 0 when every kernel of both sides pairs up with an identical SASS body and the
# same resources; 1 otherwise (the differences are printed); 2 on a build error.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export PATH="$PATH:/usr/local/cuda/bin"
rev=${1:-HEAD}
archs=${2:-80,90a}
shift $(( $# >= 2 ? 2 : $# )) || true
files=("$@")
if [ ${#files[@]} -eq 0 ]; then
  files=(src/kernels/sm80/launch_fwd_sm80.cu src/kernels/sm80/launch_bwd_sm80.cu
         src/kernels/sm90/launch_fwd_sm90.cu src/kernels/sm90/fwd_sm90_d64.cu src/kernels/sm90/fwd_sm90_d128.cu
         src/kernels/sm90/fwd_sm90_d192.cu src/kernels/sm90/fwd_sm90_d256.cu src/kernels/sm90/launch_bwd_sm90.cu
         src/kernels/common/launch_bwd_common.cu src/dispatch/flex_dispatch.cu)
fi
cache=${SASS_CACHE:-$root/build-sass/cache}
cuobjdump=${SASS_CUOBJDUMP:-$(command -v cuobjdump || true)}
[ -n "$cuobjdump" ] || cuobjdump=$root/build-sass/tools/cuobjdump
if [ ! -x "$cuobjdump" ]; then
  echo "no cuobjdump (set SASS_CUOBJDUMP; pip download nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)" >&2; exit 2
fi
export NVDISASM_PATH=${NVDISASM_PATH:-$(dirname "$cuobjdump")}
jobs=${SASS_JOBS:-1}
mkdir -p "$cache"

tree_hash() {  # $1 = a directory holding src/ and include/
  (cd "$1" && find src include -type f | LC_ALL=C sort | xargs sha1sum | sha1sum | cut -c1-16)
}

nvcc_flags() {  # $1 = tree, $2 = arch
  echo -O3 -DNDEBUG -DFLASHSPAN_WITH_CUDA=1 -I"$1/include" -I"$1/src" --expt-relaxed-constexpr -lineinfo \
       -std=c++20 -arch="sm_$2"
}

# build_side DIR -> prints the directory of DIR's results (ARCH/NAME.cubin, ARCH/NAME.ptxas).
# Cubins are cached by content (the key below), so a unit whose code did not change is not
# rebuilt, in whichever tree it is.
build_side() {
  local dir=$1 out
  out=$cache/side-$(tree_hash "$dir")
  local arch f name key obj
  local pids=()
  for arch in ${archs//,/ }; do
    mkdir -p "$out/$arch" "$cache/obj/$arch"
    for f in "${files[@]}"; do
      name=$(basename "$f" .cu)
      [ -z "${SASS_POOL:-}" ] || [ -f "$dir/$f" ] || continue
      # Key: the preprocessed unit (line markers dropped) and the text of every file of the tree
      # it includes (code under #if __CUDA_ARCH__ is not in the host-side preprocessed text).
      # shellcheck disable=SC2046
      key=$( { nvcc $(nvcc_flags "$dir" "$arch") -E "$dir/$f" 2>/dev/null | grep -v '^#';
               nvcc $(nvcc_flags "$dir" "$arch") -M "$dir/$f" 2>/dev/null | tr ' \\' '\n\n' |
                 grep "^$dir/" | LC_ALL=C sort -u | sed "s|^$dir/||" |
                 while read -r d; do echo "$d"; cat "$dir/$d"; done;
               echo "$arch"; } | sha1sum | cut -c1-16)
      obj=$cache/obj/$arch/$name-$key
      ln -sfn "$obj.cubin" "$out/$arch/$name.cubin"
      ln -sfn "$obj.ptxas" "$out/$arch/$name.ptxas"
      [ -s "$obj.cubin" ] && continue
      (
        # shellcheck disable=SC2046
        if ! nvcc $(nvcc_flags "$dir" "$arch") -cubin -Xptxas -v -o "$obj.cubin.tmp" "$dir/$f" > "$obj.ptxas" 2>&1; then
          echo "build failed: $dir/$f sm_$arch (log: $obj.ptxas)" >&2
          exit 2
        fi
        mv "$obj.cubin.tmp" "$obj.cubin"
      ) &
      pids+=($!)
      if [ ${#pids[@]} -ge "$jobs" ]; then wait "${pids[0]}" || exit 2; pids=("${pids[@]:1}"); fi
    done
  done
  local p
  for p in "${pids[@]}"; do wait "$p" || exit 2; done
  echo "$out"
}

# kernels DIR ARCH NAME -> DIR/ARCH/NAME.k/<sha1 of normalised name>.sass + names.tsv + res.tsv
split_sass() {
  local out=$1 arch=$2 name=$3
  local kd=$out/$arch/$name.k
  rm -rf "$kd"; mkdir -p "$kd"
  : > "$kd/mangled.txt"   # a unit without kernels (host code only) has no Function
  "$cuobjdump" -sass "$out/$arch/$name.cubin" | awk -v kd="$kd" '
    /Function : / { fn = $3; file = kd "/" fn ".raw"; print fn > (kd "/mangled.txt"); next }
    file == "" { next }
    {
      line = $0
      sub(/^[ \t]*\/\*[0-9a-f]+\*\/[ \t]*/, "", line)           # address
      gsub(/[ \t]+/, " ", line)
      if (line == "" || line ~ /^\.(headerflags|section|sectionflags|sectioninfo)/) next
      print line > file
    }'
  # Renumber labels per kernel; pair by the demangled, SASS_NAME_SED-normalised name.
  : > "$kd/names.tsv"
  local fn dem norm key
  while read -r fn; do
    dem=$(echo "$fn" | c++filt)
    norm=$(echo "$dem" | sed -e "${SASS_NAME_SED:-}")
    key=$(echo "$norm" | sha1sum | cut -c1-16)
    awk '{
      line = $0; out = ""
      while (match(line, /\.L_x_[0-9]+/)) {
        lab = substr(line, RSTART, RLENGTH)
        if (!(lab in map)) map[lab] = "L" (n++)
        out = out substr(line, 1, RSTART - 1) map[lab]; line = substr(line, RSTART + RLENGTH)
      }
      print out line }' "$kd/$fn.raw" > "$kd/$key.sass"
    rm -f "$kd/$fn.raw"
    printf '%s\t%s\n' "$key" "$norm" >> "$kd/names.tsv"
  done < <(sort -u "$kd/mangled.txt")
  # Resources from the ptxas log: key regs stack spill_st spill_ld
  awk '
    /Compiling entry function/ { fn = $0; sub(/.*function .\047?/, "", fn); sub(/\047 for .*/, "", fn); next }
    /bytes stack frame/ && fn != "" { st = $1; ss = $5; sl = $9; next }
    /Used [0-9]+ registers/ && fn != "" {
      for (i = 1; i <= NF; i++) if ($i == "Used") r = $(i + 1)
      print fn "\t" r "\t" st "\t" ss "\t" sl; fn = "" }' "$out/$arch/$name.ptxas" |
  while IFS=$'\t' read -r fn r st ss sl; do
    norm=$(echo "$fn" | c++filt | sed -e "${SASS_NAME_SED:-}")
    key=$(echo "$norm" | sha1sum | cut -c1-16)
    printf '%s\t%s\t%s\t%s\t%s\n' "$key" "$r" "$st" "$ss" "$sl"
  done | sort > "$kd/res.tsv"
}

if [ "$rev" = WORKTREE ]; then
  echo "REV must be a git revision" >&2; exit 2
fi
base_src=$(mktemp -d)
new_src=$(mktemp -d)
trap 'rm -rf "$base_src" "$new_src"' EXIT
git archive "$rev" src include | tar -x -C "$base_src"
echo "== building $rev (archs $archs, ${#files[@]} files)" >&2
a=$(build_side "$base_src")
if [ -n "${SASS_NEW_REV:-}" ]; then
  git archive "$SASS_NEW_REV" src include | tar -x -C "$new_src"
  echo "== building $SASS_NEW_REV" >&2
  b=$(build_side "$new_src")
else
  echo "== building the working tree" >&2
  b=$(build_side "$root")
fi
new_name=${SASS_NEW_REV:-working tree}

# pool_sass DIR ARCH -> DIR/ARCH/pool.k: the kernels of every unit of DIR (SASS_POOL).
pool_sass() {
  local out=$1 arch=$2 f name
  local kd=$out/$arch/pool.k
  rm -rf "$kd"; mkdir -p "$kd"
  : > "$kd/names.tsv"; : > "$kd/res.tsv"
  for f in "${files[@]}"; do
    name=$(basename "$f" .cu)
    [ -e "$out/$arch/$name.cubin" ] || continue
    split_sass "$out" "$arch" "$name"
    cp "$out/$arch/$name.k"/*.sass "$kd"/ 2>/dev/null || true
    cat "$out/$arch/$name.k/names.tsv" >> "$kd/names.tsv"
    cat "$out/$arch/$name.k/res.tsv" >> "$kd/res.tsv"
  done
  sort -u -o "$kd/names.tsv" "$kd/names.tsv"
  sort -u -o "$kd/res.tsv" "$kd/res.tsv"
}

units=("${files[@]}")
[ -z "${SASS_POOL:-}" ] || units=(pool)
status=0
total=0
for arch in ${archs//,/ }; do
  for f in "${units[@]}"; do
    name=$(basename "$f" .cu)
    if [ -n "${SASS_POOL:-}" ]; then
      pool_sass "$a" "$arch"
      pool_sass "$b" "$arch"
    else
      split_sass "$a" "$arch" "$name"
      split_sass "$b" "$arch" "$name"
    fi
    ka=$a/$arch/$name.k kb=$b/$arch/$name.k
    n_same=0 n_diff=0 n_res=0
    # Name-free check: the multiset of kernel bodies.
    if [ "$(for s in "$ka"/*.sass; do [ -f "$s" ] && sha1sum < "$s"; done | sort | sha1sum)" = \
         "$(for s in "$kb"/*.sass; do [ -f "$s" ] && sha1sum < "$s"; done | sort | sha1sum)" ]; then
      multiset=same
    else
      multiset=DIFFERENT
    fi
    while IFS=$'\t' read -r key nm; do
      total=$((total + 1))
      if [ ! -f "$kb/$key.sass" ]; then
        echo "[$arch $name] only in $rev: $nm"; status=1; n_diff=$((n_diff + 1)); continue
      fi
      if cmp -s "$ka/$key.sass" "$kb/$key.sass"; then
        n_same=$((n_same + 1))
      else
        n_diff=$((n_diff + 1)); status=1
        echo "[$arch $name] SASS differs: $nm"
        { diff "$ka/$key.sass" "$kb/$key.sass" || true; } | head -${SASS_DIFF_LINES:-20} | sed 's/^/    /'
        echo "    ($({ diff "$ka/$key.sass" "$kb/$key.sass" || true; } | grep -c '^[<>]') lines differ; $(wc -l < "$ka/$key.sass") -> $(wc -l < "$kb/$key.sass") instructions)"
      fi
      ra=$(grep "^$key" "$ka/res.tsv" | cut -f2- | tr '\t' ' ')
      rb=$(grep "^$key" "$kb/res.tsv" | cut -f2- | tr '\t' ' ')
      if [ "$ra" != "$rb" ]; then
        n_res=$((n_res + 1)); status=1
        echo "[$arch $name] resources (regs stack spill_st spill_ld) $ra -> $rb: $nm"
      fi
    done < "$ka/names.tsv"
    while IFS=$'\t' read -r key nm; do
      [ -f "$ka/$key.sass" ] || { echo "[$arch $name] only in $new_name: $nm"; status=1; }
    done < "$kb/names.tsv"
    echo "sm_$arch $name: $(wc -l < "$ka/names.tsv") kernels; identical $n_same, differing $n_diff, resource changes $n_res; body multiset $multiset; max regs $(cut -f2 "$kb/res.tsv" | sort -n | tail -1), spill stores total $(awk -F'\t' '{s += $4} END {print s + 0}' "$kb/res.tsv") B"
  done
done
if [ "$status" = 0 ]; then
  echo "SASS identical: all $total kernels of archs $archs ($rev vs $new_name)"
fi
exit $status
