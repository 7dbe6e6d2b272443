#!/usr/bin/env bash
# fallback_test.sh QFORGE RECIPES_DIR WORK_DIR
# A cache root that cannot be written (read-only filesystem) or fills up (ENOSPC) must not fail a
# prewarm: it falls back to memory with exactly one warning line naming the directory and the
# reason, compiles every kernel, leaves no temp dir behind, and what is on disk still verifies.
# Each case runs twice: through the fault-injection seam QFORGE_TEST_FAULT (always), and on a
# real read-only bind mount / full tmpfs when this process may mount (root, not in a container
# that forbids it); otherwise that half prints SKIP and the test still passes.
set -u
qforge=$1 recipes=$2 work=$3
for m in "$work/ro" "$work/full" "$work/mount-probe"; do  # left by a run that was killed
  mountpoint -q "$m" 2>/dev/null && umount "$m"
done
rm -rf "$work" && mkdir -p "$work" || exit 1
unset QFORGE_CACHE_DISABLE QFORGE_CACHE_READONLY_DIRS QFORGE_TEST_FAULT QFORGE_TEST_PAUSE QFORGE_TEST_COMPILE_LOG
# --tiles any: one program per plan (no program for interior tiles), as the counts below assume.
one=("$recipes/nvfp4.json" --arch sm_90a --tiles any --role linear:input --usage training --dtype bf16 --quiet)
three=("$recipes/nvfp4.json" --arch sm_90a --tiles any --role linear:input --usage training -j 2 --quiet)
mounts=()
cleanup() { for m in "${mounts[@]}"; do umount "$m" 2>/dev/null; done; }
trap cleanup EXIT
trap 'cleanup; exit 1' INT TERM
fail() { echo "FAIL: $*"; exit 1; }
field() { sed -n "s/.* \([0-9][0-9]*\) $2.*/\1/p" <(grep '^prewarm:' "$1"); }

# check_fallback NAME CACHE_DIR REASON EXPECTED_COMPILED EXPECTED_HITS [ENV=VALUE...] -- ARGS...
check_fallback() {
  local name=$1 dir=$2 reason=$3 want_c=$4 want_h=$5
  shift 5
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  env QFORGE_CACHE_DIR="$dir" "${envs[@]}" "$qforge" prewarm "$@" >"$work/$name.out" 2>"$work/$name.err"
  local rc=$?
  cat "$work/$name.out" "$work/$name.err" | sed "s/^/  [$name] /"
  [ $rc = 0 ] || fail "$name: prewarm exited $rc"
  [ "$(field "$work/$name.out" compiled)" = "$want_c" ] || fail "$name: expected $want_c compiled"
  [ "$(field "$work/$name.out" 'cache hits')" = "$want_h" ] || fail "$name: expected $want_h cache hits"
  grep -q '(cache: memory only)' "$work/$name.out" || fail "$name: summary does not say memory only"
  [ "$(grep -c 'warning' "$work/$name.err")" = 1 ] || fail "$name: expected exactly one warning"
  grep -q "^qforge: warning: kernel cache directory $dir is not usable (.*$reason.*); compiled kernels are kept in memory only for this process$" \
    "$work/$name.err" || fail "$name: warning does not name $dir and '$reason'"
  [ -z "$(find "$dir/qforge-v1/tmp" -mindepth 1 2>/dev/null)" ] || fail "$name: left in tmp/: $(ls -A "$dir/qforge-v1/tmp")"
  QFORGE_CACHE_DIR=$dir "$qforge" verify >"$work/$name.verify" 2>&1 || { cat "$work/$name.verify"; fail "$name: verify"; }
  echo "$name: ok ($(cat "$work/$name.verify"))"
}

# Read-only, seam: the probe mkdir fails with EROFS; every kernel compiles into memory.
check_fallback erofs_seam "$work/seam-ro" "Read-only file system" 3 0 QFORGE_TEST_FAULT=EROFS -- "${three[@]}"
# Full disk, seam: every write fails with ENOSPC, the first store fails and warns, the other
# kernels are not even tried on disk.
check_fallback enospc_seam "$work/seam-full" "No space left on device" 3 0 QFORGE_TEST_FAULT=ENOSPC -- "${three[@]}"

# Real filesystems (needs mount(2)).
probe=$work/mount-probe
mkdir -p "$probe"
if ! mount -t tmpfs -o size=64k tmpfs "$probe" 2>"$work/mount.err"; then
  echo "SKIP: real read-only / full filesystem cases: cannot mount here ($(cat "$work/mount.err")); the seam cases above ran"
  echo "PASS"
  exit 0
fi
umount "$probe"

# Read-only bind mount over a cache holding one kernel: that one is a disk hit, the other two
# compile into memory, nothing on the mount changes.
ro=$work/ro
mkdir -p "$ro"
QFORGE_CACHE_DIR=$ro "$qforge" prewarm "${one[@]}" >/dev/null 2>&1 || fail "prewarm before the read-only mount"
mount --bind "$ro" "$ro" && mounts+=("$ro") && mount -o remount,ro,bind "$ro" || fail "read-only bind mount"
before=$(find "$ro" -printf '%p %s %T@\n' | sort)
check_fallback erofs_mount "$ro" "Read-only file system" 2 1 -- "${three[@]}"
[ "$(find "$ro" -printf '%p %s %T@\n' | sort)" = "$before" ] || fail "the read-only cache changed"

# A full tmpfs: mkdir still works (directories take no blocks on tmpfs), the first write fails.
full=$work/full
mkdir -p "$full"
mount -t tmpfs -o size=64k tmpfs "$full" && mounts+=("$full") || fail "tmpfs mount"
mkdir -p "$full/qforge-v1/tmp"
dd if=/dev/zero of="$full/filler" bs=4k 2>/dev/null
check_fallback enospc_tmpfs "$full" "No space left on device" 3 0 -- "${three[@]}"
echo "PASS"
