/* Loads a shipped recipe from the installed recipes directory through the installed C API and
 * prints what one quantizer writes for a [4096, 7168] tensor: no GPU needed. */
#include <qforge/qforge.h>
#include <stdio.h>

static int fail(const char* what) {
  fprintf(stderr, "%s: %s\n", what, qf_last_error());
  return 1;
}

int main(void) {
  const char* path = QFORGE_RECIPES_DIR "/mxfp8_hopper.json";
  qf_context* ctx = NULL;
  qf_quantizer* q = NULL;
  int n = 0;
  if (qf_context_create(&path, 1, &ctx) != QF_OK) return fail("qf_context_create");
  if (qf_quantizer_create(ctx, NULL, "linear:input", QF_DTYPE_BF16, QF_USAGE_TRAINING, &q) != QF_OK)
    return fail("qf_quantizer_create");
  if (qf_quantizer_num_outputs(q, &n) != QF_OK) return fail("qf_quantizer_num_outputs");
  for (int i = 0; i < n; ++i) {
    qf_buffer_info b;
    if (qf_quantizer_output_info(q, 4096, 7168, i, &b) != QF_OK) return fail("qf_quantizer_output_info");
    printf("%s %s [%lld, %lld] %lld B\n", b.name, b.dtype, (long long)b.shape[0], (long long)b.shape[1],
           (long long)b.bytes);
  }
  qf_quantizer_destroy(q);
  qf_context_destroy(ctx);
  return 0;
}
