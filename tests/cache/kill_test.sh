#!/usr/bin/env bash
# kill_test.sh QFORGE RECIPES_DIR WORK_DIR
# A `qforge prewarm` killed with SIGKILL while it compiles or publishes a kernel must leave
# nothing that loads: `qforge verify` passes, a later prewarm compiles the kernel again and
# publishes a valid entry, and what the killed process left in tmp/ (its temp dir, its lock file)
# is removed. A process waiting for the killed one's key lock must not hang: it takes over.
#  1. For each pause point of QFORGE_TEST_PAUSE (compile: key lock held, nothing written;
#     write: image.bin written into the temp dir; publish: temp dir complete, before the rename):
#     kill -9 there, check, then prewarm again.
#  2. A second process waits on the lock of a process paused at "compile"; the holder is killed;
#     the waiter compiles the kernel and succeeds.
#  3. Kill -9 at random times during a 3-kernel prewarm, 4 times over; verify after each kill;
#     then prewarm and `qforge clear` leave tmp/ empty.
set -u
qforge=$1 recipes=$2 work=$3
rm -rf "$work" && mkdir -p "$work" || exit 1
export QFORGE_CACHE_DIR=$work/cache
unset QFORGE_CACHE_DISABLE QFORGE_CACHE_READONLY_DIRS QFORGE_TEST_FAULT QFORGE_TEST_PAUSE QFORGE_TEST_COMPILE_LOG
# --tiles any: one program per plan (no program for interior tiles), as the counts below assume.
one=("$recipes/nvfp4.json" --arch sm_90a --tiles any --role linear:input --usage training --dtype bf16 -j 1 --quiet)
three=("$recipes/nvfp4.json" --arch sm_90a --tiles any --role linear:input --usage training -j 2 --quiet)
tmpdir=$QFORGE_CACHE_DIR/qforge-v1/tmp
fail() { echo "FAIL: $*"; exit 1; }
field() { sed -n "s/.* \([0-9][0-9]*\) $2.*/\1/p" <(grep '^prewarm:' "$1"); }
wait_for() {  # FILE PATTERN SECONDS
  for _ in $(seq 1 $(($3 * 20))); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    sleep 0.05
  done
  return 1
}
verify_ok() {  # EXPECTED_KERNELS
  "$qforge" verify >"$work/verify.out" 2>&1 || { cat "$work/verify.out"; fail "qforge verify exited $? ($1)"; }
  grep -q "^ok: $1 kernels\? verified" "$work/verify.out" || { cat "$work/verify.out"; fail "verify: expected $1 kernels"; }
}
prewarm_ok() {  # LOG EXPECTED_COMPILED ARGS...
  local log=$1 want=$2
  shift 2
  "$qforge" prewarm "$@" >"$log" 2>&1 || { cat "$log"; fail "prewarm exited $?"; }
  [ "$(field "$log" compiled)" = "$want" ] || { cat "$log"; fail "prewarm: expected $want compiled"; }
}

# 1. kill -9 at each pause point
for point in compile write publish; do
  rm -rf "$QFORGE_CACHE_DIR"
  QFORGE_TEST_PAUSE=$point "$qforge" prewarm "${one[@]}" >"$work/a.out" 2>"$work/a.err" &
  a=$!
  wait_for "$work/a.err" "paused at $point" 60 || { cat "$work/a.err"; fail "$point: never reached the pause"; }
  kill -9 $a
  wait $a 2>/dev/null
  left=$(ls -A "$tmpdir")
  verify_ok 0
  [ "$("$qforge" list --json | grep -c '"key"')" = 0 ] || fail "$point: list shows an entry"
  prewarm_ok "$work/b.out" 1 "${one[@]}"
  verify_ok 1
  [ -z "$(ls -A "$tmpdir")" ] || fail "$point: tmp/ not cleaned: $(ls -A "$tmpdir")"
  echo "killed at $point: verify ok, left in tmp/: [$(tr '\n' ' ' <<<"$left")] -> removed by the next prewarm, which compiled 1 kernel"
done

# 2. the lock holder dies; its waiter takes over
rm -rf "$QFORGE_CACHE_DIR"
QFORGE_TEST_PAUSE=compile "$qforge" prewarm "${one[@]}" >"$work/a.out" 2>"$work/a.err" &
a=$!
wait_for "$work/a.err" "paused at compile" 60 || { cat "$work/a.err"; fail "holder never paused"; }
"$qforge" prewarm "${one[@]}" >"$work/w.out" 2>&1 &
w=$!
sleep 1.5
kill -0 $w 2>/dev/null || { cat "$work/w.out"; fail "the waiter finished while the lock holder was still compiling"; }
t0=$(date +%s.%N)
kill -9 $a
wait $a 2>/dev/null
wait $w
rc=$?
t1=$(date +%s.%N)
cat "$work/w.out"
[ $rc = 0 ] || fail "waiter exited $rc"
[ "$(field "$work/w.out" compiled)" = 1 ] || fail "waiter did not compile the kernel"
verify_ok 1
echo "waiter finished $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }') s after its lock holder was killed"

# 3. kill at random times
rm -rf "$QFORGE_CACHE_DIR"
for i in 1 2 3 4; do
  "$qforge" prewarm "${three[@]}" >"$work/r.out" 2>&1 &
  r=$!
  delay=$(awk -v s="$RANDOM" 'BEGIN { printf "%.2f", 0.1 + (s % 150) / 100 }')
  sleep "$delay"
  kill -9 $r 2>/dev/null
  wait $r 2>/dev/null
  "$qforge" verify >"$work/verify.out" 2>&1 || { cat "$work/verify.out"; fail "verify after kill $i at ${delay} s"; }
  echo "kill $i at ${delay} s: $(cat "$work/verify.out"), tmp/: $(ls -A "$tmpdir" | wc -l) left"
done
"$qforge" prewarm "${three[@]}" >"$work/r.out" 2>&1 || { cat "$work/r.out"; fail "prewarm after the kills"; }
grep '^prewarm:' "$work/r.out"
verify_ok 3
"$qforge" clear >/dev/null || fail "qforge clear"
[ -z "$(ls -A "$tmpdir")" ] || fail "tmp/ not empty after clear: $(ls -A "$tmpdir")"
echo "PASS"
