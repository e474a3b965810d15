// test_gpu_optim.c: optim/adamw.cu and optim/clip.cu against the CPU reference (optim/adamw.c,
// optim/clip.c). AdamW: several steps with fresh gradients from zero moments, with and without
// weight decay, with grad_scale, at step 100000, on ~1e6 elements and odd sizes, on the 16-byte
// and the scalar path, bitwise repeatable. Gradient sum of squares: exact small cases, ~1e6 and
// 2^24 elements against the CPU, bitwise repeatable and independent of the alignment of the
// gradient and of the scratch, which must stay within its advertised size.
#include "tests/test_gpu_util.h"

#ifdef SWIN_HAVE_CUDA
#include "optim/adamw.h"
#include "optim/clip.h"

// Floats after the sum-of-squares scratch that must survive it.
#define GUARD 64
#define GUARD_VALUE 12345.0f

static float *host_alloc(int64_t n) {
  return malloc(sizeof(float) * (size_t)(n ? n : 1));
}

static int bitwise_equal(const float *a, const float *b, int64_t n) {
  return memcmp(a, b, sizeof(float) * (size_t)n) == 0;
}

// A device array of n floats starting `offset` floats into its allocation (*base, to free),
// filled from host.
static float *device_at(float **base, const float *host, int64_t n, int offset) {
  *base = gpu_alloc(sizeof(float) * (size_t)(n + offset));
  CUDA_CHECK(cudaMemcpy(*base + offset, host, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice));
  return *base + offset;
}

// ---- AdamW ----------------------------------------------------------------------------------
// `steps` steps from zero moments starting at step `first_step`, a fresh gradient each step, on
// the CPU and the GPU side by side; then params, moments and the params' displacement are
// compared, and one more step is run twice from the same state for bitwise repeatability.
static void check_adamw(TestRng *rng, const char *label, int64_t n, AdamWHyper h, float grad_scale,
                        int64_t first_step, int steps, int offset) {
  printf("-- adamw %s: n=%lld, steps %lld..%lld%s\n", label, (long long)n, (long long)first_step,
         (long long)(first_step + steps - 1), offset ? " (misaligned by one float)" : "");
  float *p = host_alloc(n), *g = host_alloc(n), *m = host_alloc(n), *v = host_alloc(n);
  float *p0 = host_alloc(n), *got_p = host_alloc(n), *got_m = host_alloc(n);
  float *got_v = host_alloc(n), *delta = host_alloc(n), *want_delta = host_alloc(n);
  test_fill_uniform(rng, p, n, -2.0f, 2.0f);
  memcpy(p0, p, sizeof(float) * (size_t)n);
  if (first_step == 1) {
    memset(m, 0, sizeof(float) * (size_t)n);  // AdamW state starts at zero
    memset(v, 0, sizeof(float) * (size_t)n);
  } else {  // a late step: moments as a long run leaves them
    test_fill_uniform(rng, m, n, -0.1f, 0.1f);
    test_fill_uniform(rng, v, n, 1e-3f, 1e-2f);
  }
  float *bp, *bg, *bm, *bv;
  float *d_p = device_at(&bp, p, n, offset), *d_g = device_at(&bg, g, n, offset);
  float *d_m = device_at(&bm, m, n, offset), *d_v = device_at(&bv, v, n, offset);
  for (int64_t step = first_step; step < first_step + steps; step++) {
    test_fill_uniform(rng, g, n, -1.0f, 1.0f);
    CUDA_CHECK(cudaMemcpy(d_g, g, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice));
    adamw_update_cpu(p, g, m, v, n, h, step, grad_scale);
    adamw_update_cuda(d_p, d_g, d_m, d_v, n, h, step, grad_scale, 0);
  }
  gpu_download(got_p, d_p, n);
  gpu_download(got_m, d_m, n);
  gpu_download(got_v, d_v, n);
  for (int64_t i = 0; i < n; i++) delta[i] = got_p[i] - p0[i], want_delta[i] = p[i] - p0[i];
  // The same float formula on both sides, but nvcc fuses multiply-adds: an ulp or two per
  // operation per step, carried from step to step; 1e-6 is well above a few steps of that.
  char name[128];
  snprintf(name, sizeof name, "adamw %s param vs CPU", label);
  test_close(name, got_p, p, n, 1e-6);
  snprintf(name, sizeof name, "adamw %s m vs CPU", label);
  test_close(name, got_m, m, n, 1e-6);
  snprintf(name, sizeof name, "adamw %s v vs CPU", label);
  test_close(name, got_v, v, n, 1e-6);
  // The displacement (~lr per step) is small next to |p| (~1), so it carries the rounding of p
  // itself, one ulp of |p| (1.2e-7) per step against >= 5e-4: tolerance 1e-3 (a wrong update,
  // a skipped element or a wrong bias correction is O(1) off).
  snprintf(name, sizeof name, "adamw %s displacement p - p0 vs CPU", label);
  test_close(name, delta, want_delta, n, 1e-3);

  // Bitwise repeatability: one more step from the same state, twice.
  float *rp = host_alloc(n), *rm = host_alloc(n), *rv = host_alloc(n);
  const int64_t next = first_step + steps;
  for (int rep = 0; rep < 2; rep++) {
    CUDA_CHECK(cudaMemcpy(d_p, got_p, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_m, got_m, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_v, got_v, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice));
    adamw_update_cuda(d_p, d_g, d_m, d_v, n, h, next, grad_scale, 0);
    gpu_download(rep ? p : rp, d_p, n);
    gpu_download(rep ? m : rm, d_m, n);
    gpu_download(rep ? v : rv, d_v, n);
  }
  test_check(bitwise_equal(p, rp, n) && bitwise_equal(m, rm, n) && bitwise_equal(v, rv, n),
             "adamw %s: a repeated step is bitwise equal", label);

  void *dev[] = {bp, bg, bm, bv};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) CUDA_CHECK(cudaFree(dev[i]));
  float *host[] = {p, g, m, v, p0, got_p, got_m, got_v, delta, want_delta, rp, rm, rv};
  for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
}

static void check_adamw_all(TestRng *rng) {
  AdamWHyper base = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0};
  AdamWHyper wd = base;
  wd.weight_decay = 0.05f;
  // Adam is invariant to the gradient's scale except through eps; a large eps makes a wrong
  // grad_scale visible in the params, not only in m and v.
  AdamWHyper big_eps = wd;
  big_eps.eps = 1e-2f;
  AdamWHyper late = {
      .lr = 5e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.05f};
  check_adamw(rng, "wd 0", 1000003, base, 1.0f, 1, 5, 0);  // ~1e6: 16-byte body + ragged tail
  check_adamw(rng, "wd 0.05", 10007, wd, 1.0f, 1, 5, 0);
  check_adamw(rng, "wd 0.05 grad_scale 0.25 eps 1e-2", 10007, big_eps, 0.25f, 1, 5, 0);
  check_adamw(rng, "wd 0.05 grad_scale 2^-16", 4099, wd, 1.0f / 65536.0f, 1, 5, 0);
  check_adamw(rng, "wd 0.05, misaligned (scalar path)", 4099, wd, 1.0f, 1, 5, 1);
  // A handful of elements: one step from zero moments, where m = (1 - b1) g and v = (1 - b2) g^2
  // round the same with or without fused multiply-adds. Over several steps a single m can
  // cancel to near 0 and its relative error mean nothing, which a norm over many elements
  // dilutes but one over 3 does not.
  check_adamw(rng, "wd 0.05, 3 elements (tail only)", 3, wd, 1.0f, 1, 1, 0);
  check_adamw(rng, "wd 0.05, 5 elements (one vector, tail of 1)", 5, wd, 1.0f, 1, 1, 0);
  // beta1^t underflows and beta2^t = 4.5e-44: the host's double bias corrections.
  check_adamw(rng, "step 100000", 100003, late, 1.0f, 100000, 2, 0);
}

// ---- gradient sum of squares ----------------------------------------------------------------
// The GPU's sum of squares of host g (n), copied `grad_offset` floats into its allocation, with
// the scratch starting `scratch_offset` floats into its own; checks the scratch guard. Returns
// the result read back from the device.
static double gpu_sum_squares(const float *g, int64_t n, int grad_offset, int scratch_offset,
                              int *guard_ok) {
  float *bg;
  float *d_g = device_at(&bg, g, n, grad_offset);
  const int64_t nscratch = grad_sum_squares_cuda_scratch(n);
  const int64_t total = scratch_offset + nscratch + GUARD;
  float *init = host_alloc(total), *after = host_alloc(total);
  for (int64_t i = 0; i < total; i++) init[i] = GUARD_VALUE;
  float *d_scratch = gpu_upload(init, total);
  double *d_result = gpu_alloc(sizeof(double));
  CUDA_CHECK(cudaMemset(d_result, 0xFF, sizeof(double)));  // NaN until written
  grad_sum_squares_cuda(d_g, n, d_result, d_scratch + scratch_offset, 0);
  double result;
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemcpy(&result, d_result, sizeof(double), cudaMemcpyDeviceToHost));
  gpu_download(after, d_scratch, total);
  *guard_ok = 1;
  for (int64_t i = 0; i < total; i++) {
    int inside = i >= scratch_offset && i < scratch_offset + nscratch;
    if (!inside && after[i] != GUARD_VALUE) *guard_ok = 0;
  }
  CUDA_CHECK(cudaFree(bg));
  CUDA_CHECK(cudaFree(d_scratch));
  CUDA_CHECK(cudaFree(d_result));
  free(init);
  free(after);
  return result;
}

static void check_sum_squares_exact(void) {
  float g34[2] = {3.0f, 4.0f};
  int guard_ok;
  double s = gpu_sum_squares(g34, 2, 0, 0, &guard_ok);
  test_check(s == 25.0 && guard_ok, "sum of squares of (3, 4) = 25 (got %.17g)", s);
  s = gpu_sum_squares(g34, 0, 0, 0, &guard_ok);
  test_check(s == 0.0 && guard_ok, "sum of squares of 0 elements = 0 (got %.17g)", s);
  float one = -1.5f;
  s = gpu_sum_squares(&one, 1, 0, 0, &guard_ok);
  test_check(s == 2.25 && guard_ok, "sum of squares of (-1.5) = 2.25 (got %.17g)", s);
}

static void check_sum_squares(TestRng *rng, int64_t n) {
  printf("-- sum of squares: n=%lld (scratch %lld floats)\n", (long long)n,
         (long long)grad_sum_squares_cuda_scratch(n));
  float *g = host_alloc(n);
  test_fill_uniform(rng, g, n, -3.0f, 3.0f);
  double want = grad_sum_squares_cpu(g, n);
  int guard_ok;
  double got = gpu_sum_squares(g, n, 0, 0, &guard_ok);
  // Both are double sums of the exact squares (a float's square fits in a double) in different
  // orders: at most ~n * 1.1e-16 relative apart, in practice far less; 1e-10.
  double e = fabs(got - want) / want;
  test_check(e <= 1e-10, "sum of squares vs CPU                     rel_err %.3e (tol 1e-10)", e);
  test_check(guard_ok, "sum of squares stays inside its scratch");
  double again = gpu_sum_squares(g, n, 0, 0, &guard_ok);
  test_check(memcmp(&got, &again, sizeof got) == 0, "sum of squares bitwise equal on a second run");
  // The partition is over element indices, not addresses: the same bits whatever the alignment
  // of the gradient or of the scratch.
  double shifted = gpu_sum_squares(g, n, 1, 1, &guard_ok);
  test_check(memcmp(&got, &shifted, sizeof got) == 0 && guard_ok,
             "sum of squares bitwise equal with gradient and scratch misaligned by one float");
  free(g);
}
#endif

int main(void) {
  GPU_TEST_MAIN_BEGIN();
#ifdef SWIN_HAVE_CUDA
  TestRng rng = {.state = 20240611u};
  check_adamw_all(&rng);
  check_sum_squares_exact();
  check_sum_squares(&rng, 1000003);
  check_sum_squares(&rng, ((int64_t)1 << 20) + 17);
  check_sum_squares(&rng, 12345);                   // fewer blocks than the maximum
  check_sum_squares(&rng, ((int64_t)1 << 24) + 5);  // a Swin-T-sized gradient (28M) order
  int64_t most = grad_sum_squares_cuda_scratch((int64_t)1 << 40);
  test_check(most <= 2049, "sum of squares scratch is bounded: %lld floats for 2^40 elements",
             (long long)most);
#endif
  return test_finish();
}
