#!/usr/bin/env bash
# install_test.sh BUILD_DIR SOURCE_DIR WORK_DIR CMAKE PYTHON LIBDIR
#   CMAKE, PYTHON: the build's cmake and Python (ctest passes ${CMAKE_COMMAND}, ${Python3_EXECUTABLE});
#   LIBDIR: its CMAKE_INSTALL_LIBDIR (lib, lib64, lib/x86_64-linux-gnu, ...).
# `cmake --install` of the build into an empty prefix, then the prefix used the ways users use it,
# with nothing from the build or source tree on any search path:
#   - the installed CLI checks the installed recipes;
#   - a C program outside the tree (tests/install) finds the package with find_package(qforge),
#     links qforge::qforge, loads an installed recipe through <qforge/qforge.h> and prints a
#     quantizer's outputs, with libqforge.so resolved from the prefix;
#   - the same program compiled with `pkg-config --cflags --libs qforge` (the prefix's qforge.pc)
#     prints the same;
#   - installed shipped kernels (what -DQFORGE_INSTALL_KERNELS=ON puts in DATADIR/qforge/kernels;
#     made here with the installed CLI for one plan, so that the test does not prewarm every
#     recipe): the installed CLI and libqforge serve that plan from them with an empty cache and
#     QFORGE_CACHE_SHIPPED_DIRS unset, and compile it when the variable is set and empty;
#   - the Python package's sources (python/qforge, as a pure-Python copy: `pip install ./python`
#     builds the wheel, which bundles its own library; tests/tools/wheel_test.sh checks that) in a
#     fresh directory, which then finds the prefix's library through the `qforge` on PATH (no
#     QFORGE_LIBRARY) and answers the same query.
set -u
build=$1 src=$2 work=$3 cmake=$4 python=$5 libdir=$6
fail() { echo "FAIL: $*"; exit 1; }
# Nothing from the caller's environment may redirect the install or the loader.
unset DESTDIR LD_LIBRARY_PATH QFORGE_LIBRARY PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR
rm -rf "$work" && mkdir -p "$work" || exit 1
work=$(cd "$work" && pwd -P) || exit 1
prefix=$work/prefix
"$cmake" --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1 || { cat "$work/install.log"; fail "cmake --install"; }

for f in bin/qforge "$libdir/libqforge.so" "$libdir/libqforge.so.0.6" include/qforge/qforge.h "$libdir/pkgconfig/qforge.pc" \
         "$libdir/cmake/qforge/qforgeConfig.cmake" "$libdir/cmake/qforge/qforgeConfigVersion.cmake" \
         "$libdir/cmake/qforge/qforgeTargets.cmake" share/qforge/recipes/recipe.schema.json; do
  [ -e "$prefix/$f" ] || fail "the install lacks $f"
done
shipped=$(ls "$src"/recipes/*.json | wc -l) installed=$(ls "$prefix"/share/qforge/recipes/*.json | wc -l)
[ "$shipped" = "$installed" ] || fail "$installed recipes installed, $shipped shipped"

recipes=$(ls "$prefix"/share/qforge/recipes/*.json | grep -v recipe.schema.json)
# shellcheck disable=SC2086
"$prefix/bin/qforge" check $recipes >"$work/check.log" 2>&1 || { cat "$work/check.log"; fail "installed qforge check"; }

# The consumer: configured against the prefix only.
"$cmake" -S "$src/tests/install" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$prefix" >"$work/consumer.log" 2>&1 &&
  "$cmake" --build "$work/consumer" >>"$work/consumer.log" 2>&1 || { cat "$work/consumer.log"; fail "building the consumer"; }
out=$("$work/consumer/qforge_consumer") || fail "the consumer exited $?: $out"
echo "$out"
expected="rowwise_data e4m3 [4096, 7168] 29360128 B
rowwise_scale_inv e8m0 [224, 4096] 917504 B
columnwise_data e4m3 [7168, 4096] 29360128 B
columnwise_scale_inv e8m0 [128, 7168] 917504 B"
[ "$out" = "$expected" ] || fail "consumer output differs; expected:
$expected"
lib=$(ldd "$work/consumer/qforge_consumer" | awk '/libqforge/ {print $3}')
[ "$lib" = "$prefix/$libdir/libqforge.so.0.6" ] || fail "the consumer loads libqforge from '$lib', not the prefix"

# The same program built by hand with pkg-config and the prefix's qforge.pc alone
# (PKG_CONFIG_LIBDIR replaces the default search path); the run path from its libdir.
pc() { PKG_CONFIG_LIBDIR="$prefix/$libdir/pkgconfig" PKG_CONFIG_PATH="" pkg-config "$@"; }
command -v pkg-config >/dev/null || fail "pkg-config is not installed (scripts/setup.sh installs it)"
[ "$(pc --modversion qforge)" = "$(sed -n 's/^project(qforge VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")" ] ||
  fail "qforge.pc's version '$(pc --modversion qforge)' is not the project's"
# shellcheck disable=SC2046
"${CC:-cc}" -o "$work/consumer_pc" "$src/tests/install/consumer.c" $(pc --cflags --libs qforge) \
  -DQFORGE_RECIPES_DIR="\"$(pc --variable=recipesdir qforge)\"" -Wl,-rpath,"$(pc --variable=libdir qforge)" \
  >"$work/consumer_pc.log" 2>&1 || { cat "$work/consumer_pc.log"; fail "building the consumer with pkg-config"; }
out_pc=$("$work/consumer_pc") || fail "the pkg-config consumer exited $?: $out_pc"
[ "$out_pc" = "$expected" ] || fail "the pkg-config consumer's output differs: $out_pc"
lib=$(ldd "$work/consumer_pc" | awk '/libqforge/ {print $3}')
[ "$(realpath "$lib")" = "$(realpath "$prefix/$libdir/libqforge.so.0.6")" ] ||
  fail "the pkg-config consumer loads libqforge from '$lib', not the prefix"
echo "pkg-config consumer: ok"

# The Python package's files, copied (python_pytest may be writing __pycache__ in the tree meanwhile).
mkdir -p "$work/py/qforge" && cp "$src"/python/qforge/*.py "$work/py/qforge/" || exit 1
cd "$work" || exit 1
py=$(PATH="$prefix/bin:$PATH" PYTHONPATH="$work/py" "$python" - "$prefix" <<'PY'
import sys
import qforge
prefix = sys.argv[1]
ctx = qforge.Context(prefix + "/share/qforge/recipes/mxfp8_hopper.json")
for b in ctx.quantizer("linear:input").outputs(4096, 7168):
    print(b.name, b.dtype, list(b.shape), b.bytes)
print("library", qforge.library()._name)
print("package", qforge.__file__)
PY
) || fail "python: $py"
echo "$py"
grep -qx "rowwise_data e4m3 \[4096, 7168\] 29360128" <<<"$py" || fail "python query output"
grep -qx "library $prefix/$libdir/libqforge.so.0.6" <<<"$py" || fail "python did not load the prefix's library"
grep -qx "package $work/py/qforge/__init__.py" <<<"$py" || fail "python imported qforge from elsewhere"
# Installed shipped kernels: one plan's, prewarmed by the installed CLI into the prefix's kernels
# directory, then found by the installed CLI (from BINDIR) and libqforge (from LIBDIR) themselves.
kernels=$prefix/share/qforge/kernels
plan=("$prefix/share/qforge/recipes/mxfp8_hopper.json" --arch sm_90a --dtype bf16 --role linear:input --usage training --quiet)
env -u QFORGE_CACHE_SHIPPED_DIRS QFORGE_CACHE_DIR="$kernels" "$prefix/bin/qforge" prewarm "${plan[@]}" >"$work/kernels.log" 2>&1 ||
  { cat "$work/kernels.log"; fail "prewarming the installed kernels"; }
grep -q " 0 failed" "$work/kernels.log" && ! grep -q " 0 compiled" "$work/kernels.log" || { cat "$work/kernels.log"; fail "the installed kernels' prewarm compiled nothing"; }
env -u QFORGE_CACHE_SHIPPED_DIRS QFORGE_CACHE_DIR="$work/empty-cli" "$prefix/bin/qforge" prewarm "${plan[@]}" >"$work/served.log" 2>&1 ||
  { cat "$work/served.log"; fail "the installed CLI's prewarm"; }
grep -q " 0 compiled, [1-9][0-9]* cache hits, 0 failed" "$work/served.log" ||
  { cat "$work/served.log"; fail "the installed CLI did not take the installed kernels"; }
QFORGE_CACHE_SHIPPED_DIRS="" QFORGE_CACHE_DIR="$work/empty-off" "$prefix/bin/qforge" prewarm "${plan[@]}" >"$work/off.log" 2>&1 ||
  { cat "$work/off.log"; fail "the installed CLI's prewarm without shipped roots"; }
grep -q " 0 compiled" "$work/off.log" && { cat "$work/off.log"; fail "an empty QFORGE_CACHE_SHIPPED_DIRS still took the installed kernels"; }
# libqforge.so from the prefix (through the Python package's copy, which names no shipped root of
# its own): preparing the plan writes nothing to an empty writable cache, and with the variable
# set and empty it compiles into it.
prepare() {  # prepare CACHE_DIR [VAR=VALUE]: the number of entries the preparation wrote
  env -u QFORGE_CACHE_SHIPPED_DIRS QFORGE_CACHE_DIR="$1" ${2:+"$2"} PATH="$prefix/bin:$PATH" PYTHONPATH="$work/py" \
    "$python" - "$prefix" <<'PY' >"$1.log" 2>&1 || { cat "$1.log" >&2; echo "FAIL: python: preparing the plan ($1)" >&2; exit 1; }
import sys
import qforge
ctx = qforge.Context(sys.argv[1] + "/share/qforge/recipes/mxfp8_hopper.json")
ctx.quantizer("linear:input", usage="training").prepare("sm_90a")
PY
  find "$1" -name meta.json | wc -l
}
written=$(prepare "$work/empty-lib") || exit 1
[ "$written" = 0 ] || fail "libqforge compiled $written kernels instead of taking the installed ones"
written=$(prepare "$work/empty-lib-off" QFORGE_CACHE_SHIPPED_DIRS=) || exit 1
[ "$written" -gt 0 ] || fail "with QFORGE_CACHE_SHIPPED_DIRS set and empty, libqforge still took the installed kernels"
echo "installed kernels: ok"
echo "install test: ok"
