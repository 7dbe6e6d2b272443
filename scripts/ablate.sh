#!/usr/bin/env bash
# "What limits it", by taking stages out: builds the cast kernels with one stage removed
# (bench/ablate.py: scale-entry stores, column partials, a whole direction) beside the shipped
# ones, one tree per variant, and times every variant with qforge_bench on a Hopper machine,
# alternating the variants ROUNDS times. The variants' outputs are wrong on purpose; only their
# times mean something.
#   scripts/ablate.sh OUT_DIR [SIZES] [FILTER...]
#     SIZES   qforge_bench --sizes (default 16384x16384)
#     FILTER  qforge_bench --filter substrings (default: mxfp8_hopper and 1x128 blockwise
#             linear:input training)
#   ABLATIONS="no-entries no-rowwise ..." picks variants (default all), ROUNDS (default 2),
#   METRIC the reported time (default time_us, back to back; graph_us for small sizes: GPU time
#   per call replayed from a CUDA graph), MEMBERS member rows for qforge_bench --groups (grouped
#   cases, e.g. 2048,6144,3072,5120,4096,1024,7168,4096 with a "... grouped_linear:input ..." filter).
#   A variant rev:REV is the whole tracked tree at git revision REV, unchanged: an A/B of the
#   working tree against a commit (ABLATIONS=rev:HEAD~1 times a kernel change against its parent).
#   A variant tree:DIR is the source tree in directory DIR of the repository root (one path
#   component), e.g. `mkdir base && git archive REV | tar -x -C base` before the device call
#   (scripts/tree_variants.sh: the device's repository lacks commits made since it was copied).
# Writes OUT_DIR/json/VARIANT__ROUND__N.json and OUT_DIR/ablate.md, and prints the table.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/ablate.sh OUT_DIR [SIZES] [FILTER...]}
SIZES=${2:-16384x16384}
shift 2 || shift $#
FILTERS=("$@")
[ ${#FILTERS[@]} -eq 0 ] && FILTERS=("mxfp8_hopper linear:input training" "float8_block_scaling linear:input training")
ROUNDS=${ROUNDS:-2}
mkdir -p "$OUT/json"
OUT=$(cd "$OUT" && pwd)
python3 bench/ablate.py check templates/qforge || exit 1
. scripts/tree_variants.sh
read -r -a NAMES <<<"${ABLATIONS:-$(python3 bench/ablate.py list | awk '{print $1}' | tr '\n' ' ')}"
for v in "${NAMES[@]}"; do  # every variant checked before the first build (ablate.py names a bad one)
  if is_tree_variant "$v"; then
    check_tree_variant ablate "$v" || exit 1
  else
    python3 bench/ablate.py check templates/qforge "$v" >/dev/null || exit 1
  fi
done
. scripts/gpu_build.sh
gpu_build "$OUT" qforge_bench || exit 1
declare -A BENCH=([shipped]="$BUILD/bench/qforge_bench")
for v in "${NAMES[@]}"; do
  tree="$OUT/tree-${v//[^A-Za-z0-9_.-]/_}"
  rm -rf "$tree" && mkdir -p "$tree"
  if is_tree_variant "$v"; then
    copy_tree_variant ablate "$v" "$tree" || exit 1
  else
    git ls-files -z | tar --null -cf - -T - | tar -C "$tree" -xf - || { echo "ablate: copying the tree failed"; exit 1; }
    python3 bench/ablate.py apply "$v" templates/qforge "$tree/templates/qforge" || exit 1
  fi
  gpu_build_in "$tree" "$OUT" qforge_bench ||
    { echo "ablate: building $v failed (log: $OUT/build.log)"; exit 1; }
  BENCH[$v]="$tree/build/bench/qforge_bench"
done
for ((round = 1; round <= ROUNDS; ++round)); do
  for i in "${!FILTERS[@]}"; do
    for v in shipped "${NAMES[@]}"; do
      # One kernel cache per variant: the variants' kernels share their generated source.
      QFORGE_CACHE_DIR="$OUT/cache-${v//[^A-Za-z0-9_.-]/_}" "${BENCH[$v]}" --sizes "$SIZES" ${MEMBERS:+--groups "$MEMBERS"} --filter "${FILTERS[$i]}" \
        --out "$OUT/json/${v}__${round}__${i}.json" >"$OUT/json/${v}__${round}__${i}.log" 2>&1 ||
        { echo "ablate: qforge_bench ($v) failed: $OUT/json/${v}__${round}__${i}.log"; exit 1; }
    done
  done
done
python3 bench/ablate.py report "$OUT/json" "${METRIC:-time_us}" | tee "$OUT/ablate.md"
