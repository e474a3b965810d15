// test_gpu_layernorm.c: kernels/cuda/layernorm.cu against the CPU reference
// (kernels/cpu/layernorm.c) on the same random inputs: forward out, mean and rstd; backward dinp
// and dweight / dbias accumulated onto random values; bitwise determinism of repeated runs;
// a scratch buffer of exactly the advertised size, and dweight / dbias, with guard floats
// behind them that must come back untouched. Covers the 16-byte path (C % 4 == 0) and the
// scalar one (odd C, rows misaligned by one float), blocks of 8, 4, 2 and 1 warps, the
// shared-memory opt-in past C = 6144, several rows per warp with a ragged last block, and the
// Swin-T shapes at batch 8.
#include "tests/test_gpu_util.h"

#ifdef SWIN_HAVE_CUDA
#include "kernels/layernorm.h"

typedef struct {
  const char *what;
  int64_t N;
  int C;
  int offset;  // floats by which the device rows are shifted (1: not 16-byte aligned)
} LnShape;

// Floats after dweight, dbias and the scratch that must survive the backward.
#define GUARD 64
#define GUARD_VALUE 12345.0f

static float *host_alloc(int64_t n) {
  return malloc(sizeof(float) * (size_t)(n ? n : 1));
}

static int bitwise_equal(const float *a, const float *b, int64_t n) {
  return memcmp(a, b, sizeof(float) * (size_t)n) == 0;
}

static int guard_intact(const float *g) {
  for (int i = 0; i < GUARD; i++)
    if (g[i] != GUARD_VALUE) return 0;
  return 1;
}

// Device copy of n host floats followed by GUARD guard floats.
static float *upload_guarded(const float *host, int64_t n) {
  float *tmp = host_alloc(n + GUARD);
  memcpy(tmp, host, sizeof(float) * (size_t)n);
  for (int i = 0; i < GUARD; i++) tmp[n + i] = GUARD_VALUE;
  float *d = gpu_upload(tmp, n + GUARD);
  free(tmp);
  return d;
}

// A device array of n floats starting `offset` floats into its allocation, filled from host.
static float *upload_at(float **base, const float *host, int64_t n, int offset) {
  *base = gpu_alloc(sizeof(float) * (size_t)(n + offset));
  CUDA_CHECK(cudaMemcpy(*base + offset, host, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice));
  return *base + offset;
}

static void check_shape(TestRng *rng, const LnShape *s) {
  const int64_t N = s->N, NC = s->N * s->C;
  const int C = s->C;
  printf("-- %s: N=%lld C=%d%s\n", s->what, (long long)N, C,
         s->offset ? " (rows misaligned by one float)" : "");

  // Inputs as in the CPU test: each row its own offset, so the mean subtraction matters.
  float *inp = host_alloc(NC), *weight = host_alloc(C), *bias = host_alloc(C);
  float *dout = host_alloc(NC), *dw0 = host_alloc(C), *db0 = host_alloc(C);
  for (int64_t n = 0; n < N; n++) {
    float offset = test_rng_uniform(rng, -3.0f, 3.0f);
    test_fill_uniform(rng, inp + n * C, C, offset - 1.0f, offset + 1.0f);
  }
  test_fill_uniform(rng, weight, C, 0.5f, 1.5f);
  test_fill_uniform(rng, bias, C, -0.5f, 0.5f);
  test_fill_uniform(rng, dout, NC, -1.0f, 1.0f);
  test_fill_uniform(rng, dw0, C, -1.0f, 1.0f);
  test_fill_uniform(rng, db0, C, -1.0f, 1.0f);

  // CPU reference; the backward starts from dw0 / db0 like the GPU one.
  float *want_out = host_alloc(NC), *want_mean = host_alloc(N), *want_rstd = host_alloc(N);
  float *want_dinp = host_alloc(NC), *want_dw = host_alloc(C), *want_db = host_alloc(C);
  layernorm_forward_cpu(want_out, want_mean, want_rstd, inp, weight, bias, N, C);
  memcpy(want_dw, dw0, sizeof(float) * (size_t)C);
  memcpy(want_db, db0, sizeof(float) * (size_t)C);
  layernorm_backward_cpu(want_dinp, want_dw, want_db, dout, inp, weight, want_mean, want_rstd, N,
                         C);

  // Device inputs, shifted by s->offset floats when testing the scalar path.
  float *inp_base, *weight_base, *bias_base, *dout_base, *out_base, *dinp_base;
  float *d_inp = upload_at(&inp_base, inp, NC, s->offset);
  float *d_weight = upload_at(&weight_base, weight, C, s->offset);
  float *d_bias = upload_at(&bias_base, bias, C, s->offset);
  float *d_dout = upload_at(&dout_base, dout, NC, s->offset);
  out_base = gpu_alloc(sizeof(float) * (size_t)(NC + s->offset));
  dinp_base = gpu_alloc(sizeof(float) * (size_t)(NC + s->offset));
  float *d_out = out_base + s->offset, *d_dinp = dinp_base + s->offset;
  float *d_mean = gpu_alloc(sizeof(float) * (size_t)N),
        *d_rstd = gpu_alloc(sizeof(float) * (size_t)N);

  // ---- forward
  float *out = host_alloc(NC), *mean = host_alloc(N), *rstd = host_alloc(N);
  float *out2 = host_alloc(NC), *mean2 = host_alloc(N), *rstd2 = host_alloc(N);
  gpu_poison(d_out, NC);
  gpu_poison(d_mean, N);
  gpu_poison(d_rstd, N);
  layernorm_forward_cuda(d_out, d_mean, d_rstd, d_inp, d_weight, d_bias, N, C, 0);
  gpu_download(out, d_out, NC);
  gpu_download(mean, d_mean, N);
  gpu_download(rstd, d_rstd, N);
  // The GPU sums a row in fp32 (each lane up to C/32 terms, then a 5-level shuffle tree) where
  // the CPU sums in double: the statistics differ by a few 1e-8 relative, and out adds a few
  // ulps of fma-vs-separate rounding. 1e-6 leaves room; any indexing mistake is O(1).
  test_close("forward out", out, want_out, NC, 1e-6);
  test_close("forward mean", mean, want_mean, N, 1e-6);
  test_close("forward rstd", rstd, want_rstd, N, 1e-6);
  gpu_poison(d_out, NC);
  gpu_poison(d_mean, N);
  gpu_poison(d_rstd, N);
  layernorm_forward_cuda(d_out, d_mean, d_rstd, d_inp, d_weight, d_bias, N, C, 0);
  gpu_download(out2, d_out, NC);
  gpu_download(mean2, d_mean, N);
  gpu_download(rstd2, d_rstd, N);
  test_check(bitwise_equal(out, out2, NC) && bitwise_equal(mean, mean2, N) &&
                 bitwise_equal(rstd, rstd2, N),
             "forward out, mean, rstd bitwise equal on a second run");

  // ---- backward, from the CPU's mean and rstd so that only the backward is compared
  CUDA_CHECK(cudaMemcpy(d_mean, want_mean, sizeof(float) * (size_t)N, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_rstd, want_rstd, sizeof(float) * (size_t)N, cudaMemcpyHostToDevice));
  const int64_t nscratch = layernorm_backward_cuda_scratch(N, C);
  float *scratch_init = host_alloc(nscratch + GUARD);
  for (int64_t i = 0; i < nscratch + GUARD; i++) scratch_init[i] = GUARD_VALUE;
  float *d_scratch = gpu_upload(scratch_init, nscratch + GUARD);
  float *dinp = host_alloc(NC), *dw = host_alloc(C + GUARD), *db = host_alloc(C + GUARD);
  float *dinp2 = host_alloc(NC), *dw2 = host_alloc(C + GUARD), *db2 = host_alloc(C + GUARD);
  float *scratch_after = host_alloc(nscratch + GUARD);
  float *d_dw = upload_guarded(dw0, C), *d_db = upload_guarded(db0, C);
  gpu_poison(d_dinp, NC);
  layernorm_backward_cuda(d_dinp, d_dw, d_db, d_dout, d_inp, d_weight, d_mean, d_rstd, N, C,
                          d_scratch, 0);
  gpu_download(dinp, d_dinp, NC);
  gpu_download(dw, d_dw, C + GUARD);
  gpu_download(db, d_db, C + GUARD);
  gpu_download(scratch_after, d_scratch, nscratch + GUARD);
  // dinp: the row sums of g and g * xhat are fp32 here, double on the CPU, and the subtraction
  // g - mean(g) - xhat mean(g xhat) amplifies their last-bit differences a little: 1e-5.
  test_close("backward dinp", dinp, want_dinp, NC, 1e-5);
  // dweight / dbias: dw0 plus sums over N rows, fp32 within a block (a few rows per warp, then
  // up to 8 warps), double across blocks, against the CPU's double chunks: ~1e-7 relative;
  // 1e-5 is the budget for reductions over thousands of terms.
  test_close("backward dweight (accumulated onto random values)", dw, want_dw, C, 1e-5);
  test_close("backward dbias (accumulated onto random values)", db, want_db, C, 1e-5);
  test_check(guard_intact(dw + C) && guard_intact(db + C),
             "backward leaves the floats after dweight and dbias untouched");
  test_check(guard_intact(scratch_after + nscratch),
             "backward stays inside its %lld scratch floats", (long long)nscratch);

  CUDA_CHECK(cudaMemcpy(d_dw, dw0, sizeof(float) * (size_t)C, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_db, db0, sizeof(float) * (size_t)C, cudaMemcpyHostToDevice));
  gpu_poison(d_dinp, NC);
  gpu_poison(d_scratch, nscratch);
  layernorm_backward_cuda(d_dinp, d_dw, d_db, d_dout, d_inp, d_weight, d_mean, d_rstd, N, C,
                          d_scratch, 0);
  gpu_download(dinp2, d_dinp, NC);
  gpu_download(dw2, d_dw, C);
  gpu_download(db2, d_db, C);
  test_check(
      bitwise_equal(dinp, dinp2, NC) && bitwise_equal(dw, dw2, C) && bitwise_equal(db, db2, C),
      "backward dinp, dweight, dbias bitwise equal on a second run (scratch poisoned)");

  void *dev[] = {inp_base, weight_base, bias_base, dout_base, out_base, dinp_base,
                 d_mean,   d_rstd,      d_scratch, d_dw,      d_db};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) CUDA_CHECK(cudaFree(dev[i]));
  float *host[] = {inp,       weight,    bias,      dout,    dw0,          db0,  want_out,
                   want_mean, want_rstd, want_dinp, want_dw, want_db,      out,  mean,
                   rstd,      out2,      mean2,     rstd2,   scratch_init, dinp, dw,
                   db,        dinp2,     dw2,       db2,     scratch_after};
  for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
}
#endif

int main(void) {
  GPU_TEST_MAIN_BEGIN();
#ifdef SWIN_HAVE_CUDA
  TestRng rng = {.state = 0x1a7e5cu};
  const LnShape shapes[] = {
      {"as the CPU test", 50, 96, 0},
      {"C not a multiple of 4 (scalar path)", 13, 37, 0},
      {"C=768, as the CPU test", 200, 768, 0},
      {"one row of 5", 1, 5, 0},
      {"N=3001, C=96, ragged last block", 3001, 96, 0},
      {"rows misaligned by one float (scalar path, C % 4 == 0)", 301, 96, 1},
      {"N=10007: 2 rows per warp, last block short of its warps", 10007, 96, 0},
      {"Swin-T stage 1 tokens, batch 8", 8 * 56 * 56, 96, 0},
      {"Swin-T merge into stage 2 (4C = 384), batch 8", 8 * 28 * 28, 384, 0},
      {"Swin-T stage 4 and head, batch 8", 8 * 7 * 7, 768, 0},
      {"C=1536: 4 warps per block", 600, 1536, 0},
      {"C=3072 (Swin-L merge into stage 4): 2 warps per block", 97, 3072, 0},
      {"C=6148: one warp per block, shared-memory opt-in, float4", 9, 6148, 0},
      {"C=7001: shared-memory opt-in, scalar path", 20, 7001, 0},
  };
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) check_shape(&rng, &shapes[i]);
#endif
  return test_finish();
}
