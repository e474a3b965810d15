// test_bias_resize.c: bias_table_resize (src/io/import.h) against PyTorch's
// interpolate(mode='bicubic', align_corners=False) on the official load_pretrained's layout:
// tests/fixtures/resize/bias_resize.safetensors (scripts/make_bias_resize_fixture.py) holds each
// case's source table and PyTorch's resize of it, computed in float64 and rounded once to f32, as
// we compute. Relative error <= 1e-6; measured 0 (both round the same double once to f32).
#include <math.h>

#include "src/io/import.h"
#include "src/io/safetensors.h"
#include "tests/util/test_util.h"

#ifndef SWIN_SOURCE_DIR
#define SWIN_SOURCE_DIR "."
#endif

// The fixture's cases, in its order: source window, target window (h, w), heads.
static const struct {
  int h1, w1, h2, w2, heads;
} cases[] = {
    {7, 7, 12, 12, 3}, {12, 12, 7, 7, 4}, {8, 8, 16, 16, 2}, {7, 7, 12, 7, 3}, {7, 4, 8, 12, 2}};

int main(void) {
  SafeTensors st;
  Error err;
  const char *file = SWIN_SOURCE_DIR "/tests/fixtures/resize/bias_resize.safetensors";
  if (safetensors_read(&st, file, &err) != 0) {
    test_check(0, "fixture: %s", err.msg);
    return test_finish();
  }
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    int sh = 2 * cases[k].h1 - 1, sw = 2 * cases[k].w1 - 1;
    int dh = 2 * cases[k].h2 - 1, dw = 2 * cases[k].w2 - 1, heads = cases[k].heads;
    char name[32];
    snprintf(name, sizeof name, "case%zu.src", k);
    const SafeTensorEntry *src = safetensors_find(&st, name);
    snprintf(name, sizeof name, "case%zu.dst", k);
    const SafeTensorEntry *dst = safetensors_find(&st, name);
    if (!src || !dst || src->dtype != DTYPE_F32 || dst->dtype != DTYPE_F32 ||
        src->shape[0] != (int64_t)sh * sw || dst->shape[0] != (int64_t)dh * dw) {
      test_check(0, "case %zu: fixture tensors missing or of another shape", k);
      continue;
    }
    Tensor s = safetensors_entry_tensor(&st, src), want = safetensors_entry_tensor(&st, dst);
    int64_t n = (int64_t)dh * dw * heads;
    float *got = malloc_check(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) got[i] = NAN;  // poisoned: every element must be written
    bias_table_resize(s.data, sh, sw, got, dh, dw, heads);
    double err_max = 0, ref_max = 0;
    const float *w = want.data;
    for (int64_t i = 0; i < n; i++) {
      double d = fabs((double)got[i] - w[i]);
      err_max = isnan(got[i]) || d > err_max ? (isnan(got[i]) ? INFINITY : d) : err_max;
      ref_max = fabs(w[i]) > ref_max ? fabs(w[i]) : ref_max;
    }
    double rel = err_max / ref_max;
    test_check(rel <= 1e-6, "window %dx%d -> %dx%d, %d heads: relative error %.2e (<= 1e-6)",
               cases[k].h1, cases[k].w1, cases[k].h2, cases[k].w2, heads, rel);
    free(got);
  }
  safetensors_free(&st);
  return test_finish();
}
