# Sourced by the GPU scripts (gpu_check.sh, bench.sh, gemm_check.sh, ablate.sh, gemm_ab.sh):
#   gpu_build OUT_DIR [target...]
# configures qforge (Release, or $QFORGE_BUILD_TYPE; no lit) into $BUILD (an absolute path: $QFORGE_BUILD_DIR,
# default build-gpu) and builds the targets (all without any), logging to OUT_DIR/configure.log
# and OUT_DIR/build.log. GoogleTest / nlohmann_json come from .gpudeps/ when present
# ($QFORGE_DEPS_PREFIX overrides). Returns 1, after printing the errors, when either step fails.
#   gpu_build_in DIR OUT_DIR [target...]
# the same for the source tree in DIR (another tree beside this checkout, e.g. a variant of
# scripts/tree_variants.sh), built into DIR/build with this checkout's dependency prefix.

# $QFORGE_DEPS_PREFIX, else this checkout's .gpudeps/ when present (else empty).
gpu_deps_prefix() {
  local prefix=${QFORGE_DEPS_PREFIX:-}
  [ -z "$prefix" ] && [ -d .gpudeps ] && prefix="$PWD/.gpudeps"
  echo "$prefix"
}

gpu_build() {
  local out=$1; shift
  BUILD=${QFORGE_BUILD_DIR:-build-gpu}
  case $BUILD in /*) ;; *) BUILD="$PWD/$BUILD" ;; esac  # absolute: the scripts pass it to other directories
  export PATH="/usr/local/cuda/bin:$PATH"
  local prefix
  prefix=$(gpu_deps_prefix)
  local gen=() targets=() t
  command -v ninja >/dev/null && gen=(-G Ninja)
  for t in "$@"; do targets+=(--target "$t"); done
  cmake -S . -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE="${QFORGE_BUILD_TYPE:-Release}" -DQFORGE_LIT_TESTS=OFF \
    ${prefix:+-DCMAKE_PREFIX_PATH=$prefix} >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; return 1; }
  cmake --build "$BUILD" -j"$(nproc)" "${targets[@]}" >"$out/build.log" 2>&1 || { grep -E "error" "$out/build.log" | head -40; return 1; }
}

gpu_build_in() {
  local dir=$1 prefix
  shift
  prefix=$(gpu_deps_prefix)
  (cd "$dir" && QFORGE_BUILD_DIR=build QFORGE_DEPS_PREFIX="$prefix" gpu_build "$@")
}
