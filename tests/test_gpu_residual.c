// test_gpu_residual.c: kernels/cuda/residual.cu against the CPU reference
// (kernels/cpu/residual.c) on the same random inputs: the residual add with per-sample drop path
// (dropped samples pass x through bitwise) and without (scale NULL), in place (out == x,
// dbranch == dout), its backward, and the head's mean pool and its backward; on the 16-byte and
// the scalar path (L or C not a multiple of 4, misaligned pointers), at Swin-T sizes, and for
// bitwise-repeatable results.
#include "tests/test_gpu_util.h"

#ifdef SWIN_HAVE_CUDA
#include "kernels/residual.h"

static float *host_alloc(int64_t n) {
  return malloc(sizeof(float) * (size_t)(n ? n : 1));
}

static int bitwise_equal(const float *a, const float *b, int64_t n) {
  return memcmp(a, b, sizeof(float) * (size_t)n) == 0;
}

// A device array of n floats starting `offset` floats into its allocation (*base, to free),
// filled from host when host is not NULL.
static float *device_at(float **base, const float *host, int64_t n, int offset) {
  *base = gpu_alloc(sizeof(float) * (size_t)(n + offset));
  if (host)
    CUDA_CHECK(cudaMemcpy(*base + offset, host, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice));
  return *base + offset;
}

static void check_residual(TestRng *rng, int B, int64_t L, int offset) {
  const int64_t n = (int64_t)B * L;
  printf("-- residual: B=%d L=%lld%s\n", B, (long long)L,
         offset ? " (misaligned by one float)" : "");
  float *x = host_alloc(n), *branch = host_alloc(n), *dout = host_alloc(n);
  float *scale = host_alloc(B);
  test_fill_uniform(rng, x, n, -1.0f, 1.0f);
  test_fill_uniform(rng, branch, n, -1.0f, 1.0f);
  test_fill_uniform(rng, dout, n, -1.0f, 1.0f);
  // keep_prob 0.8: dropped samples get 0, kept ones 1 / 0.8 (timm's scale_by_keep).
  for (int b = 0; b < B; b++) scale[b] = b % 3 == 1 ? 0.0f : 1.0f / 0.8f;
  float *want = host_alloc(n), *want_plain = host_alloc(n);
  float *want_dbranch = host_alloc(n);
  residual_forward_cpu(want, x, branch, scale, B, L);
  residual_forward_cpu(want_plain, x, branch, NULL, B, L);
  residual_backward_cpu(want_dbranch, dout, scale, B, L);

  float *bx, *bbranch, *bdout, *bout, *bwork;
  float *d_x = device_at(&bx, x, n, offset), *d_branch = device_at(&bbranch, branch, n, offset);
  float *d_dout = device_at(&bdout, dout, n, offset), *d_out = device_at(&bout, NULL, n, offset);
  float *d_work = device_at(&bwork, NULL, n, offset);
  float *d_scale = gpu_upload(scale, B);
  float *got = host_alloc(n), *again = host_alloc(n);

  // Forward with drop path: x + s * branch is one fma here, a product and a sum on the CPU,
  // so an ulp apart at most: 1e-6 as a norm.
  gpu_poison(d_out, n);
  residual_forward_cuda(d_out, d_x, d_branch, d_scale, B, L, 0);
  gpu_download(got, d_out, n);
  test_close("forward x + scale[b] * branch vs CPU", got, want, n, 1e-6);
  int dropped_exact = 1;
  for (int64_t i = 0; i < n; i++)
    if (scale[i / L] == 0.0f && got[i] != x[i]) dropped_exact = 0;
  test_check(dropped_exact, "forward: dropped samples pass x through bitwise");
  gpu_poison(d_out, n);
  residual_forward_cuda(d_out, d_x, d_branch, d_scale, B, L, 0);
  gpu_download(again, d_out, n);
  test_check(bitwise_equal(got, again, n), "forward bitwise equal on a second run");
  // In place: the same arithmetic, so the same bits.
  CUDA_CHECK(cudaMemcpy(d_work, d_x, sizeof(float) * (size_t)n, cudaMemcpyDeviceToDevice));
  residual_forward_cuda(d_work, d_work, d_branch, d_scale, B, L, 0);
  gpu_download(again, d_work, n);
  test_check(bitwise_equal(got, again, n), "forward in place (out == x) bitwise equal");

  // Without drop path the fma with s = 1 is exactly x + branch: the CPU's bits (tolerance 0).
  gpu_poison(d_out, n);
  residual_forward_cuda(d_out, d_x, d_branch, NULL, B, L, 0);
  gpu_download(got, d_out, n);
  test_close("forward x + branch (scale NULL) vs CPU", got, want_plain, n, 0.0);
  CUDA_CHECK(cudaMemcpy(d_work, d_x, sizeof(float) * (size_t)n, cudaMemcpyDeviceToDevice));
  residual_forward_cuda(d_work, d_work, d_branch, NULL, B, L, 0);
  gpu_download(again, d_work, n);
  test_check(bitwise_equal(got, again, n), "forward scale NULL in place bitwise equal");

  // Backward: one fp32 product per element on both sides, so the CPU's bits (tolerance 0).
  gpu_poison(d_out, n);
  residual_backward_cuda(d_out, d_dout, d_scale, B, L, 0);
  gpu_download(got, d_out, n);
  test_close("backward dbranch = scale[b] * dout vs CPU", got, want_dbranch, n, 0.0);
  CUDA_CHECK(cudaMemcpy(d_work, d_dout, sizeof(float) * (size_t)n, cudaMemcpyDeviceToDevice));
  residual_backward_cuda(d_work, d_work, d_scale, B, L, 0);
  gpu_download(again, d_work, n);
  test_check(bitwise_equal(got, again, n), "backward in place (dbranch == dout) bitwise equal");
  gpu_poison(d_out, n);
  residual_backward_cuda(d_out, d_dout, NULL, B, L, 0);
  gpu_download(got, d_out, n);
  test_close("backward scale NULL copies dout", got, dout, n, 0.0);
  CUDA_CHECK(cudaMemcpy(d_work, d_dout, sizeof(float) * (size_t)n, cudaMemcpyDeviceToDevice));
  residual_backward_cuda(d_work, d_work, NULL, B, L, 0);
  gpu_download(again, d_work, n);
  test_close("backward scale NULL in place leaves dout", again, dout, n, 0.0);

  void *dev[] = {bx, bbranch, bdout, bout, bwork, d_scale};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) CUDA_CHECK(cudaFree(dev[i]));
  float *host[] = {x, branch, dout, scale, want, want_plain, want_dbranch, got, again};
  for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
}

static void check_mean_pool(TestRng *rng, int B, int L, int C, int offset) {
  const int64_t nin = (int64_t)B * L * C, nout = (int64_t)B * C;
  printf("-- mean pool: B=%d L=%d C=%d%s\n", B, L, C, offset ? " (misaligned by one float)" : "");
  float *inp = host_alloc(nin), *dout = host_alloc(nout);
  float *want = host_alloc(nout), *want_dinp = host_alloc(nin);
  float *out = host_alloc(nout), *dinp = host_alloc(nin);
  float *out2 = host_alloc(nout), *dinp2 = host_alloc(nin);
  test_fill_uniform(rng, inp, nin, -1.0f, 1.0f);
  test_fill_uniform(rng, dout, nout, -1.0f, 1.0f);
  mean_pool_forward_cpu(want, inp, B, L, C);
  mean_pool_backward_cpu(want_dinp, dout, B, L, C);

  float *binp, *bdout, *bout, *bdinp;
  float *d_inp = device_at(&binp, inp, nin, offset),
        *d_dout = device_at(&bdout, dout, nout, offset);
  float *d_out = device_at(&bout, NULL, nout, offset),
        *d_dinp = device_at(&bdinp, NULL, nin, offset);
  gpu_poison(d_out, nout);
  mean_pool_forward_cuda(d_out, d_inp, B, L, C, 0);
  gpu_download(out, d_out, nout);
  // The same double additions in the same token order, rounded once: the CPU's bits.
  test_close("mean pool forward vs CPU", out, want, nout, 0.0);
  gpu_poison(d_dinp, nin);
  mean_pool_backward_cuda(d_dinp, d_dout, B, L, C, 0);
  gpu_download(dinp, d_dinp, nin);
  // One IEEE division per element on both sides: the CPU's bits.
  test_close("mean pool backward vs CPU", dinp, want_dinp, nin, 0.0);

  gpu_poison(d_out, nout);
  gpu_poison(d_dinp, nin);
  mean_pool_forward_cuda(d_out, d_inp, B, L, C, 0);
  mean_pool_backward_cuda(d_dinp, d_dout, B, L, C, 0);
  gpu_download(out2, d_out, nout);
  gpu_download(dinp2, d_dinp, nin);
  test_check(bitwise_equal(out, out2, nout) && bitwise_equal(dinp, dinp2, nin),
             "mean pool forward and backward bitwise equal on a second run");

  void *dev[] = {binp, bdout, bout, bdinp};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) CUDA_CHECK(cudaFree(dev[i]));
  float *host[] = {inp, dout, want, want_dinp, out, dinp, out2, dinp2};
  for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
}
#endif

int main(void) {
  GPU_TEST_MAIN_BEGIN();
#ifdef SWIN_HAVE_CUDA
  TestRng rng = {.state = 0x7e5cu};
  check_residual(&rng, 7, 8 * 12 * 5, 0);    // as the CPU test
  check_residual(&rng, 5, 1001, 0);          // L % 4 != 0: scalar path, samples mid-vector
  check_residual(&rng, 3, 96, 1);            // misaligned by one float: scalar path
  check_residual(&rng, 1, 3, 0);             // fewer elements than one vector
  check_residual(&rng, 8, 56 * 56 * 96, 0);  // Swin-T stage 1 tokens, batch 8
  check_mean_pool(&rng, 5, 49, 96, 0);       // Swin-T head, 7x7 tokens
  check_mean_pool(&rng, 2, 3, 7, 0);         // C % 4 != 0: scalar backward
  check_mean_pool(&rng, 3, 49, 96, 1);       // misaligned: scalar backward
  check_mean_pool(&rng, 8, 49, 768, 0);      // Swin-T head, batch 8
  check_mean_pool(&rng, 4, 144, 1024, 0);    // Swin-B at 384 px: 12x12 tokens
#endif
  return test_finish();
}
