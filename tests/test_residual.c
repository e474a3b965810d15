// test_residual.c: kernels/cpu/residual.c. The residual add with drop path against the formula
// in double (dropped samples pass x through untouched), its backward and the mean pool's
// backward by the adjoint identity <f(x), y> = <x, f_backward(y)>, in place and with scale NULL.
#include "kernels/residual.h"
#include "tests/util/test_util.h"

static double dot_d(const float *a, const float *b, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; i++) s += (double)a[i] * b[i];
  return s;
}

static void check_adjoint(const char *what, const float *fx, const float *y, int64_t ny,
                          const float *x, const float *bwd_y, int64_t nx) {
  double lhs = dot_d(fx, y, ny), rhs = dot_d(x, bwd_y, nx);
  double e = fabs(lhs - rhs) / fabs(rhs);
  // Each side is exact in double but for one fp32 rounding per element of f(x) or bwd(y):
  // ~1e-7 relative in the worst case, so 1e-6.
  test_check(e <= 1e-6, "%-48s rel_err %.3e (tol 1.0e-06)", what, e);
}

static void check_residual(TestRng *rng, int B, int64_t L) {
  int64_t n = (int64_t)B * L;
  float *x = malloc(n * sizeof(float)), *branch = malloc(n * sizeof(float));
  float *out = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
  float *dout = malloc(n * sizeof(float)), *dbranch = malloc(n * sizeof(float));
  float *scale = malloc(B * sizeof(float)), *want_plain = malloc(n * sizeof(float));
  test_fill_uniform(rng, x, n, -1.0f, 1.0f);
  test_fill_uniform(rng, branch, n, -1.0f, 1.0f);
  test_fill_uniform(rng, dout, n, -1.0f, 1.0f);
  // keep_prob 0.8: dropped samples get 0, kept ones 1 / 0.8 (timm's scale_by_keep).
  for (int b = 0; b < B; b++) scale[b] = b % 3 == 1 ? 0.0f : 1.0f / 0.8f;
  for (int64_t i = 0; i < n; i++) {
    want[i] = (float)((double)x[i] + (double)scale[i / L] * branch[i]);
    want_plain[i] = (float)((double)x[i] + branch[i]);
  }
  printf("-- residual: B=%d, L=%lld\n", B, (long long)L);

  // One product and one sum in fp32: within an ulp or two of the double result.
  test_poison(out, n);
  residual_forward_cpu(out, x, branch, scale, B, L);
  test_close("forward x + scale[b] * branch", out, want, n, 1e-6);
  int dropped_exact = 1;
  for (int64_t i = 0; i < n; i++)
    if (scale[i / L] == 0.0f && out[i] != x[i]) dropped_exact = 0;
  test_check(dropped_exact, "dropped samples pass x through bitwise");
  test_poison(out, n);
  residual_forward_cpu(out, x, branch, NULL, B, L);
  test_close("forward x + branch (scale NULL)", out, want_plain, n, 1e-6);
  float *inplace = malloc(n * sizeof(float));
  memcpy(inplace, x, n * sizeof(float));
  residual_forward_cpu(inplace, inplace, branch, scale, B, L);
  test_close("forward in place (out == x)", inplace, want, n, 1e-6);

  // The branch's gradient is the adjoint of branch -> scale[b] * branch.
  float *scaled = malloc(n * sizeof(float));
  for (int64_t i = 0; i < n; i++) scaled[i] = scale[i / L] * branch[i];
  test_poison(dbranch, n);
  residual_backward_cpu(dbranch, dout, scale, B, L);
  check_adjoint("adjoint <scale * branch, y> = <branch, dbranch>", scaled, dout, n, branch, dbranch,
                n);
  memcpy(inplace, dout, n * sizeof(float));
  residual_backward_cpu(inplace, inplace, scale, B, L);
  test_close("backward in place (dbranch == dout)", inplace, dbranch, n, 0.0);
  test_poison(dbranch, n);
  residual_backward_cpu(dbranch, dout, NULL, B, L);
  test_close("backward scale NULL copies dout", dbranch, dout, n, 0.0);
  memcpy(inplace, dout, n * sizeof(float));
  residual_backward_cpu(inplace, inplace, NULL, B, L);
  test_close("backward scale NULL in place", inplace, dout, n, 0.0);

  free(x);
  free(branch);
  free(out);
  free(want);
  free(dout);
  free(dbranch);
  free(scale);
  free(want_plain);
  free(inplace);
  free(scaled);
}

static void check_mean_pool(TestRng *rng, int B, int L, int C) {
  int64_t nin = (int64_t)B * L * C, nout = (int64_t)B * C;
  float *inp = malloc(nin * sizeof(float)), *out = malloc(nout * sizeof(float));
  float *want = malloc(nout * sizeof(float)), *dout = malloc(nout * sizeof(float));
  float *dinp = malloc(nin * sizeof(float));
  test_fill_uniform(rng, inp, nin, -1.0f, 1.0f);
  test_fill_uniform(rng, dout, nout, -1.0f, 1.0f);
  for (int b = 0; b < B; b++)
    for (int c = 0; c < C; c++) {
      double s = 0.0;
      for (int l = 0; l < L; l++) s += inp[((int64_t)b * L + l) * C + c];
      want[(int64_t)b * C + c] = (float)(s / L);
    }
  printf("-- mean pool: B=%d L=%d C=%d\n", B, L, C);
  test_poison(out, nout);
  mean_pool_forward_cpu(out, inp, B, L, C);
  // Summed in double and rounded once, like the reference: equal up to an ulp.
  test_close("mean pool forward vs double", out, want, nout, 1e-6);
  test_poison(dinp, nin);
  mean_pool_backward_cpu(dinp, dout, B, L, C);
  check_adjoint("adjoint <pool(x), y> = <x, pool_backward(y)>", out, dout, nout, inp, dinp, nin);
  free(inp);
  free(out);
  free(want);
  free(dout);
  free(dinp);
}

int main(void) {
  TestRng rng = {.state = 0x7e5u};
  check_residual(&rng, 7, 8 * 12 * 5);
  check_residual(&rng, 3, 56 * 56 * 96);  // Swin-T stage 1 sample size
  check_mean_pool(&rng, 5, 49, 96);       // Swin-T head: 7x7 tokens
  check_mean_pool(&rng, 2, 3, 7);
  return test_finish();
}
