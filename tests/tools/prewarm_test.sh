#!/usr/bin/env bash
# prewarm_test.sh QFORGE RECIPES_DIR ARCHS CACHE_DIR
# A cold `qforge prewarm` into an empty cache must compile everything without a failure; a
# second, warm run must compile nothing and finish in under a second (every kernel a disk hit);
# `qforge verify` must then find every cached kernel consistent with its key.
set -u
qforge=$1 recipes=$2 archs=$3 cache=$4
export QFORGE_CACHE_DIR=$cache
rm -rf "$cache" || exit 1

summary() { grep '^prewarm:' "$1" | tail -n 1; }
field() { sed -n "s/.* \([0-9][0-9]*\) $2.*/\1/p" <<<"$1"; }

log=$(mktemp) || exit 1
trap 'rm -f "$log"' EXIT

t0=$(date +%s.%N)
"$qforge" prewarm "$recipes" --arch "$archs" >"$log" 2>&1
rc=$?
t1=$(date +%s.%N)
cat "$log"
cold=$(summary "$log")
if [ $rc -ne 0 ]; then echo "FAIL: cold prewarm exited $rc"; exit 1; fi
if [ -z "$cold" ] || [ "$(field "$cold" failed)" != "0" ]; then echo "FAIL: cold prewarm: '$cold'"; exit 1; fi

t2=$(date +%s.%N)
"$qforge" prewarm "$recipes" --arch "$archs" >"$log" 2>&1
rc=$?
t3=$(date +%s.%N)
cat "$log"
warm=$(summary "$log")
cold_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
warm_s=$(awk -v a="$t2" -v b="$t3" 'BEGIN { printf "%.3f", b - a }')
echo "prewarm cold: ${cold_s} s, warm: ${warm_s} s"
if [ $rc -ne 0 ]; then echo "FAIL: warm prewarm exited $rc"; exit 1; fi
if [ -z "$warm" ] || [ "$(field "$warm" compiled)" != "0" ] || [ "$(field "$warm" failed)" != "0" ]; then
  echo "FAIL: warm prewarm compiled kernels again: '$warm'"; exit 1
fi
if ! awk -v w="$warm_s" 'BEGIN { exit !(w < 1.0) }'; then
  echo "FAIL: warm prewarm took ${warm_s} s (expected < 1 s)"; exit 1
fi

"$qforge" verify
rc=$?
if [ $rc -ne 0 ]; then echo "FAIL: qforge verify exited $rc"; exit 1; fi
echo "PASS"
