#!/usr/bin/env bash
# concurrent_prewarm_test.sh QFORGE RECIPES_DIR WORK_DIR
# Eight `qforge prewarm` processes start at once on the same empty cache (one recipe, one role,
# one arch: 3 kernels, so the test stays a few seconds on 2 cores). Every process must succeed,
# `qforge verify` must pass, no temp dir or lock file may be left behind, and every kernel must
# be compiled exactly once across the eight processes: the per-key lock makes the others wait
# and then hit. Compiles are counted twice, independently: the sum of the "N compiled" of each
# process's summary, and one line per compile in $QFORGE_TEST_COMPILE_LOG (key, pid).
set -u
qforge=$1 recipes=$2 work=$3
procs=8
rm -rf "$work" && mkdir -p "$work" || exit 1
export QFORGE_CACHE_DIR=$work/cache QFORGE_TEST_COMPILE_LOG=$work/compiles.log
unset QFORGE_CACHE_DISABLE QFORGE_CACHE_READONLY_DIRS
args=("$recipes/nvfp4.json" --arch sm_90a --role linear:input --usage training -j 2 --quiet)
fail() { echo "FAIL: $*"; exit 1; }

t0=$(date +%s.%N)
pids=()
for i in $(seq 1 $procs); do
  "$qforge" prewarm "${args[@]}" >"$work/out.$i" 2>"$work/err.$i" &
  pids+=($!)
done
rcs=()
for p in "${pids[@]}"; do wait "$p"; rcs+=($?); done
t1=$(date +%s.%N)

compiled=0 hits=0 kernels=
for i in $(seq 1 $procs); do
  s=$(grep '^prewarm:' "$work/out.$i")
  echo "process $i (exit ${rcs[$((i - 1))]}): $s"
  [ -s "$work/err.$i" ] && sed "s/^/  stderr: /" "$work/err.$i"
  [ "${rcs[$((i - 1))]}" = 0 ] || fail "process $i exited ${rcs[$((i - 1))]}"
  [ -n "$s" ] || fail "process $i printed no summary"
  k=$(sed -n 's/^prewarm: \([0-9]*\) kernels.*/\1/p' <<<"$s")
  c=$(sed -n 's/.*: \([0-9]*\) compiled.*/\1/p' <<<"$s")
  h=$(sed -n 's/.* \([0-9]*\) cache hits.*/\1/p' <<<"$s")
  f=$(sed -n 's/.* \([0-9]*\) failed.*/\1/p' <<<"$s")
  [ "$f" = 0 ] || fail "process $i: $f kernels failed"
  [ -z "$kernels" ] && kernels=$k
  [ "$k" = "$kernels" ] || fail "process $i planned $k kernels, process 1 $kernels"
  [ $((c + h)) = "$k" ] || fail "process $i: $c compiled + $h hits != $k kernels"
  compiled=$((compiled + c)) hits=$((hits + h))
done
wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
echo "$procs processes, $kernels kernels each: $compiled compiles, $hits cache hits in total, ${wall} s"

echo "compiles per key (from \$QFORGE_TEST_COMPILE_LOG):"
[ -f "$work/compiles.log" ] || fail "no compile log written"
awk '{ n[$1]++ } END { for (k in n) printf "  %s %d\n", k, n[k] }' "$work/compiles.log" | sort
keys=$(awk '{ print $1 }' "$work/compiles.log" | sort -u | wc -l)
lines=$(wc -l <"$work/compiles.log")
[ "$lines" = "$compiled" ] || fail "compile log has $lines lines, the summaries say $compiled compiles"
[ "$keys" = "$kernels" ] || fail "compile log names $keys keys, expected $kernels"

if grep -q 'cannot lock' "$work"/err.*; then
  # A filesystem without flock: correctness still holds, "compile once" does not.
  [ "$compiled" -le $((kernels * procs)) ] || fail "$compiled compiles"
  echo "NOTE: no file locking on this filesystem; compile-once not checked"
else
  [ "$compiled" = "$kernels" ] || fail "expected each of $kernels kernels compiled once, got $compiled compiles"
fi

"$qforge" verify >"$work/verify.out" 2>&1
rc=$?
cat "$work/verify.out"
[ $rc = 0 ] || fail "qforge verify exited $rc"
grep -q "^ok: $kernels kernels verified" "$work/verify.out" || fail "verify did not see $kernels kernels"
left=$(find "$QFORGE_CACHE_DIR/qforge-v1/tmp" "$QFORGE_CACHE_DIR/qforge-v1/locks" -mindepth 1 2>/dev/null)
[ -z "$left" ] || fail "left behind: $left"
echo "PASS"
