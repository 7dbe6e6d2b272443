#!/usr/bin/env bash
# A/B of the grouped-GEMM kernels on a Hopper machine: the working tree against BASE, a whole
# source tree (rev:REV or tree:DIR, scripts/tree_variants.sh), built side by side. First the GEMM
# GPU tests matching $TESTS (a GoogleTest filter; default the exact, random and edge cases; TESTS=-
# skips them) on the working tree's build, one process each, then `qforge gemm ... --bench` of
# every SHAPE on both builds, alternated $ROUNDS times (default 3), each with its own kernel cache.
#   scripts/gemm_ab.sh OUT_DIR BASE [SHAPE...]
#     BASE   rev:REV | tree:DIR
#     SHAPE  the `qforge gemm` arguments of one case, as one word (default: the goal's blockwise
#            shape, "--scaling blockwise --groups 8 --m 4096 --n 4096 --k 7168")
# Writes OUT_DIR/gemm_ab.md (TFLOP/s of every round, working tree and BASE) and prints it; exits
# 1 when a test or a benchmark fails.
set -uo pipefail
cd "$(dirname "$0")/.."
usage="usage: scripts/gemm_ab.sh OUT_DIR rev:REV|tree:DIR [SHAPE...]"
OUT=${1:?$usage}
BASE=${2:?$usage}
shift 2
SHAPES=("$@")
[ ${#SHAPES[@]} -eq 0 ] && SHAPES=("--scaling blockwise --groups 8 --m 4096 --n 4096 --k 7168")
ROUNDS=${ROUNDS:-3}
TESTS=${TESTS:-Variants/GemmExact.*:Variants/GemmRandom.*:GemmEdge.*}
. scripts/tree_variants.sh
is_tree_variant "$BASE" || { echo "gemm_ab: BASE: expected rev:REV or tree:DIR, got '$BASE'"; exit 1; }
check_tree_variant gemm_ab "$BASE" || exit 1
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
. scripts/gpu_build.sh
gpu_build "$OUT" qforge qforge_unit_tests || exit 1
NEW="$BUILD/tools/qforge"
TESTBIN="$BUILD/tests/qforge_unit_tests"
tree="$OUT/base-tree"
rm -rf "$tree" && mkdir -p "$tree"
copy_tree_variant gemm_ab "$BASE" "$tree" || exit 1
gpu_build_in "$tree" "$OUT" qforge ||
  { echo "gemm_ab: building $BASE failed (log: $OUT/build.log)"; exit 1; }
OLD="$tree/build/tools/qforge"
rc=0

if [ "$TESTS" != "-" ]; then
  export QFORGE_CACHE_DIR="$OUT/cache-new"
  . scripts/gpu_tests.sh  # one process per test
  : >"$OUT/tests.log"
  results=$(run_gpu_tests "$TESTBIN" "$TESTS" "$OUT/tests.log" 6 150)
  pass=$(grep -c "^P" <<<"$results"); fail=$(grep -c "^F" <<<"$results"); skip=$(grep -c "^S" <<<"$results")
  echo "gemm_ab: GPU GEMM tests ($TESTS): $pass passed, $fail failed, $skip skipped (log: $OUT/tests.log)"
  [ "$fail" -gt 0 ] && { grep "^F" <<<"$results"; rc=1; }
  [ "$pass" -eq 0 ] && { echo "gemm_ab: no test passed of '$TESTS'"; rc=1; }
fi

: >"$OUT/bench.tsv"
for ((round = 1; round <= ROUNDS; ++round)); do
  for i in "${!SHAPES[@]}"; do
    for v in new base; do
      bin=$NEW; [ $v = base ] && bin=$OLD
      # shellcheck disable=SC2086  # a SHAPE is several arguments
      line=$(QFORGE_CACHE_DIR="$OUT/cache-$v" timeout 120 "$bin" gemm ${SHAPES[$i]} --bench --iters 20 2>&1 |
             tee -a "$OUT/bench_$v.log" | grep "^bench:")
      tf=$(sed -n 's/.*, \([0-9.]*\) TFLOP\/s.*/\1/p' <<<"$line")
      [ -z "$tf" ] && { echo "gemm_ab: qforge gemm ${SHAPES[$i]} --bench failed ($v, log: $OUT/bench_$v.log)"; rc=1; tf=-; }
      printf '%s\t%s\t%s\n' "$i" "$v" "$tf" >>"$OUT/bench.tsv"
    done
  done
done
{
  echo "| qforge gemm (TFLOP/s, $ROUNDS rounds alternated) | working tree | $BASE |"
  echo "|---|---|---|"
  for i in "${!SHAPES[@]}"; do
    cell() { awk -F'\t' -v i="$i" -v v="$1" '$1 == i && $2 == v {s = s (s == "" ? "" : " / ") $3} END {print s}' "$OUT/bench.tsv"; }
    echo "| ${SHAPES[$i]} | $(cell new) | $(cell base) |"
  done
} | tee "$OUT/gemm_ab.md"
exit $rc
