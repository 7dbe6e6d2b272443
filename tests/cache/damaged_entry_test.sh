#!/usr/bin/env bash
# damaged_entry_test.sh QFORGE RECIPES_DIR WORK_DIR
# The CLI side of tests/unit/cache_test.cpp's CorruptEntriesAreDetectedAndRecompiled: after a
# prewarm, three entries are damaged on disk (image.bin cut in half, one bit of image.bin
# flipped, source.cu deleted). `qforge verify` must name each one and exit 1; the next prewarm
# must recompile exactly those three (nothing else) and `qforge verify` must pass again.
set -u
qforge=$1 recipes=$2 work=$3
rm -rf "$work" && mkdir -p "$work" || exit 1
export QFORGE_CACHE_DIR=$work/cache
unset QFORGE_CACHE_DISABLE QFORGE_CACHE_READONLY_DIRS QFORGE_TEST_FAULT QFORGE_TEST_PAUSE QFORGE_TEST_COMPILE_LOG
# --tiles any: one program per plan (no program for interior tiles), as the counts below assume.
args=("$recipes/nvfp4.json" --arch sm_90a --tiles any --role linear:input --usage training -j 2 --quiet)
fail() { echo "FAIL: $*"; exit 1; }
field() { sed -n "s/.* \([0-9][0-9]*\) $2.*/\1/p" <(grep '^prewarm:' "$1"); }

"$qforge" prewarm "${args[@]}" >"$work/p1.out" 2>&1 || { cat "$work/p1.out"; fail "first prewarm"; }
mapfile -t entries < <(find "$QFORGE_CACHE_DIR/qforge-v1" -mindepth 2 -maxdepth 2 -type d -regextype posix-extended -regex '.*/[0-9a-f]{64}' | sort)
[ ${#entries[@]} = 3 ] || fail "expected 3 entries, found ${#entries[@]}"

img=${entries[0]}/image.bin
truncate -s $(($(stat -c %s "$img") / 2)) "$img"
img=${entries[1]}/image.bin
off=$(($(stat -c %s "$img") / 2))
byte=$(od -An -tu1 -j $off -N 1 "$img" | tr -d ' ')
printf "$(printf '\\%03o' $((byte ^ 1)))" | dd of="$img" bs=1 seek=$off conv=notrunc status=none
rm "${entries[2]}/source.cu"

"$qforge" verify >"$work/v1.out" 2>&1
rc=$?
cat "$work/v1.out"
[ $rc = 1 ] || fail "verify of damaged entries exited $rc, expected 1"
grep -q "^${entries[0]}: image.bin has [0-9]* bytes, meta.json says" "$work/v1.out" || fail "truncated image not named"
grep -q "^${entries[1]}: image.bin SHA-256 does not match meta.json" "$work/v1.out" || fail "flipped bit not named"
grep -q "^${entries[2]}: source.cu missing" "$work/v1.out" || fail "missing source.cu not named"
grep -q "^3 problems" "$work/v1.out" || fail "expected 3 problems"

"$qforge" prewarm "${args[@]}" >"$work/p2.out" 2>&1 || { cat "$work/p2.out"; fail "prewarm over damaged entries"; }
grep '^prewarm:' "$work/p2.out"
[ "$(field "$work/p2.out" compiled)" = 3 ] || fail "expected the 3 damaged kernels recompiled"
"$qforge" verify || fail "verify after the rebuild"
[ -z "$(ls -A "$QFORGE_CACHE_DIR/qforge-v1/tmp")" ] || fail "damaged copies left in tmp/"

# A damaged entry of one kernel is rebuilt without touching the others.
rm "${entries[1]}/meta.json"
"$qforge" prewarm "${args[@]}" >"$work/p3.out" 2>&1 || { cat "$work/p3.out"; fail "third prewarm"; }
grep '^prewarm:' "$work/p3.out"
[ "$(field "$work/p3.out" compiled)" = 1 ] && [ "$(field "$work/p3.out" 'cache hits')" = 2 ] || fail "expected 1 compiled, 2 hits"
"$qforge" verify || fail "verify after the last rebuild"
echo "PASS"
