# Sourced by the GPU scripts that run GoogleTest cases one process each (gemm_check.sh,
# gemm_ab.sh): a trapped kernel poisons only its own CUDA context.
#   run_gpu_tests TESTBIN FILTER LOG [PARALLEL] [TIMEOUT_S]
# runs every case of FILTER (a --gtest_filter), PARALLEL at a time (default 4), each under
# TIMEOUT_S (default 120); appends each case's exit status and key output lines to LOG and prints
# one line per case: "P" (passed), "S NAME" (skipped: no GPU, or a GTEST_SKIP) or "F NAME".
run_gpu_test() {
  local t=$1 out rc
  out=$(timeout "$GPU_TEST_TIMEOUT" "$GPU_TESTBIN" --gtest_filter="$t" 2>&1); rc=$?
  { echo "=== $t rc=$rc"; echo "$out" | grep -E "measure|Failure|Expected|Which is|first|error|differ|OK \]|FAILED \]|SKIPPED" | head -20; } >>"$GPU_TEST_LOG"
  if [ $rc -eq 0 ] && echo "$out" | grep -q "\[  SKIPPED \] 1 test"; then echo "S $t"
  elif [ $rc -eq 0 ] && echo "$out" | grep -q "\[  PASSED  \] 1 test"; then echo P; else echo "F $t"; fi
}

run_gpu_tests() {
  local bin=$1 filter=$2 log=$3 par=${4:-4}
  export GPU_TESTBIN=$bin GPU_TEST_LOG=$log GPU_TEST_TIMEOUT=${5:-120}
  export -f run_gpu_test
  "$bin" --gtest_list_tests --gtest_filter="$filter" | awk '/^[^ ]/{s=$1} /^  /{print s $1}' |
    xargs -P "$par" -I{} bash -c 'run_gpu_test "$@"' _ {}
}
