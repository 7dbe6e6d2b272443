#!/usr/bin/env bash
# Fuzzes the recipe front end (tests/fuzz/: parse + validate -> role resolution -> lower +
# passes -> printer, buffers, CUDA codegen, CPU reference) with libFuzzer + ASan + UBSan for a
# given time, starting from the shipped recipes, the malformed ones and the saved regressions.
# Fails on any crash, leak, timeout or broken property. Needs clang with libFuzzer
# (scripts/setup.sh installs it).
#   scripts/fuzz.sh [seconds, default 120]
# Environment: QFORGE_FUZZ_BUILD_DIR (default build-fuzz), QFORGE_FUZZ_JOBS (build jobs,
# default nproc). The corpus grows in $BUILD/corpus between runs; a crashing input is written
# to $BUILD/artifacts/ (add it to tests/fuzz/regressions/ once fixed).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TO_RUN=${1:-120}
BUILD=${QFORGE_FUZZ_BUILD_DIR:-build-fuzz}
JOBS=${QFORGE_FUZZ_JOBS:-$(nproc)}
export PATH="/usr/local/cuda/bin:$PATH"
CXX_FUZZ=${QFORGE_FUZZ_CXX:-clang++}

if ! echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' |
     "$CXX_FUZZ" -x c++ -fsanitize=fuzzer - -o /dev/null 2>/dev/null; then
  echo "fuzz: $CXX_FUZZ cannot link -fsanitize=fuzzer: install clang and libFuzzer (scripts/setup.sh)" >&2
  exit 1
fi

cmake -S . -B "$BUILD" -DCMAKE_CXX_COMPILER="$CXX_FUZZ" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DQFORGE_FUZZ=ON -DQFORGE_BUILD_TESTS=OFF >/dev/null
cmake --build "$BUILD" -j"$JOBS" --target recipe_fuzzer

mkdir -p "$BUILD/corpus" "$BUILD/artifacts"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
log="$BUILD/fuzz.log"
# -max_len: shipped recipes are under 2 KB; -timeout: one input takes milliseconds.
# New inputs go to the first corpus directory; the others are only read.
set +e
"$BUILD/tests/fuzz/recipe_fuzzer" \
  -max_total_time="$SECONDS_TO_RUN" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
  -dict=tests/fuzz/recipe.dict -artifact_prefix="$BUILD/artifacts/" -print_final_stats=1 \
  "$BUILD/corpus" recipes tests/recipes/bad tests/fuzz/regressions 2>&1 | tee "$log" |
  grep -E --line-buffered "INITED|DONE|ERROR|SUMMARY|uncaught|Test unit written|stat::" 
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ]; then
  echo "fuzz: FAILED (exit $rc); full log: $log" >&2
  tail -60 "$log" >&2
  echo "fuzz: reproduce with: $BUILD/tests/fuzz/recipe_fuzzer $BUILD/artifacts/<crash-file>;" \
       "once fixed, copy the input to tests/fuzz/regressions/" >&2
  exit 1
fi
echo "fuzz: ok, ${SECONDS_TO_RUN} s without a crash, leak or timeout"
