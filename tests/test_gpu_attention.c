// test_gpu_attention.c: kernels/cuda/attention.cu against the CPU reference
// (kernels/cpu/attention.c) on the same random inputs: forward out and att, backward dqkv and
// the bias-table gradient (from zero and accumulated on random values), the backward with its
// scratch aliasing att, bitwise determinism of repeated runs, and untouched memory past dtable.
// Covers unshifted and shifted windows (mask nW = 4, 6, 16, 64), square, rectangular and
// single-token windows, odd head dims, the Swin-T stage shapes, and the N = 64 / head_dim = 64
// limit (the shared-memory opt-in path).
#include "tests/test_gpu_util.h"

#ifdef SWIN_HAVE_CUDA
#include "kernels/attention.h"
#include "kernels/window.h"

typedef struct {
  const char *what;
  int B, H, W, wh, ww, sh, sw, C, heads;
} AttnShape;

// Trailing floats after dtable that must come back unchanged (the kernel writes only the
// table rows index uses). They hold -0.0: even a stray "+= 0" turns them into +0.0.
#define DTABLE_GUARD 64

static float *host_alloc(int64_t n) {
  return malloc(sizeof(float) * (size_t)(n ? n : 1));
}

static int bitwise_equal(const float *a, const float *b, int64_t n) {
  return memcmp(a, b, sizeof(float) * (size_t)n) == 0;
}

static void check_shape(TestRng *rng, const AttnShape *s) {
  int N = s->wh * s->ww, C = s->C, heads = s->heads;
  int nW = (s->H / s->wh) * (s->W / s->ww), BW = s->B * nW;
  int rows = (2 * s->wh - 1) * (2 * s->ww - 1);
  int masked = s->sh || s->sw;
  int64_t nqkv = (int64_t)BW * N * 3 * C, nout = (int64_t)BW * N * C;
  int64_t natt = (int64_t)BW * heads * N * N, ntab = (int64_t)rows * heads;
  int64_t nmask = (int64_t)nW * N * N;
  int64_t nscratch = window_attention_backward_cuda_scratch(BW, N, heads);
  printf("-- %s: B=%d map %dx%d window %dx%d shift (%d, %d) -> BW=%d nW=%d N=%d C=%d heads=%d%s\n",
         s->what, s->B, s->H, s->W, s->wh, s->ww, s->sh, s->sw, BW, nW, N, C, heads,
         masked ? " masked" : "");

  // Scores of a few units so that the softmax is neither flat nor one-hot (as the CPU test).
  float *qkv = host_alloc(nqkv), *table = host_alloc(ntab), *dout = host_alloc(nout);
  float *dtable0 = host_alloc(ntab), *mask = masked ? host_alloc(nmask) : NULL;
  int *index = malloc(sizeof(int) * (size_t)N * N);
  test_fill_uniform(rng, qkv, nqkv, -1.5f, 1.5f);
  test_fill_uniform(rng, table, ntab, -1.0f, 1.0f);
  test_fill_uniform(rng, dout, nout, -1.0f, 1.0f);
  test_fill_uniform(rng, dtable0, ntab, -1.0f, 1.0f);
  relative_position_index(index, s->wh, s->ww);
  if (masked) attention_mask_build(mask, s->H, s->W, s->wh, s->ww, s->sh, s->sw);

  // CPU reference: forward, backward from a zero table gradient (the window sums alone), and
  // the accumulated expectation dtable0 + sums (the CPU adds its fp32 sum the same way).
  float *want_out = host_alloc(nout), *want_att = host_alloc(natt);
  float *want_dqkv = host_alloc(nqkv), *want_dtable = calloc((size_t)ntab + 1, sizeof(float));
  float *want_acc = host_alloc(ntab);
  window_attention_forward_cpu(want_out, want_att, qkv, table, index, mask, BW, nW, N, C, heads);
  window_attention_backward_cpu(want_dqkv, want_dtable, dout, qkv, want_att, index, BW, N, C,
                                heads);
  for (int64_t t = 0; t < ntab; t++) want_acc[t] = dtable0[t] + want_dtable[t];

  float *d_qkv = gpu_upload(qkv, nqkv), *d_table = gpu_upload(table, ntab);
  float *d_dout = gpu_upload(dout, nout);
  float *d_mask = masked ? gpu_upload(mask, nmask) : NULL;
  int *d_index = gpu_upload_bytes(index, sizeof(int) * (size_t)N * N);
  float *d_out = gpu_alloc(sizeof(float) * (size_t)nout);
  float *d_att = gpu_alloc(sizeof(float) * (size_t)natt);
  float *d_att_ref = gpu_upload(want_att, natt);  // the backward's input: the CPU's P
  float *d_att_copy = gpu_alloc(sizeof(float) * (size_t)natt);
  float *d_dqkv = gpu_alloc(sizeof(float) * (size_t)nqkv);
  float *d_scratch = gpu_alloc(sizeof(float) * (size_t)nscratch);
  float *d_dtable = gpu_alloc(sizeof(float) * (size_t)(ntab + DTABLE_GUARD));
  float *out = host_alloc(nout), *att = host_alloc(natt), *out2 = host_alloc(nout);
  float *att2 = host_alloc(natt), *dqkv = host_alloc(nqkv), *dqkv2 = host_alloc(nqkv);
  float *dtable = host_alloc(ntab + DTABLE_GUARD), *dtable2 = host_alloc(ntab + DTABLE_GUARD);

  // ---- forward ----
  gpu_poison(d_out, nout);
  gpu_poison(d_att, natt);
  window_attention_forward_cuda(d_out, d_att, d_qkv, d_table, d_index, d_mask, BW, nW, N, C, heads,
                                0);
  gpu_download(out, d_out, nout);
  gpu_download(att, d_att, natt);
  // fp32 scores and exp on both sides (CUDA expf and the CPU's fast_expf: each within 2 ulp),
  // sums of N <= 64 terms of size O(1) in different orders: a few 1e-7 relative (the CPU is
  // itself ~2e-7 from double loops).
  test_close("forward out vs CPU", out, want_out, nout, 1e-6);
  test_close("forward att (softmax) vs CPU", att, want_att, natt, 1e-6);
  gpu_poison(d_out, nout);
  gpu_poison(d_att, natt);
  window_attention_forward_cuda(d_out, d_att, d_qkv, d_table, d_index, d_mask, BW, nW, N, C, heads,
                                0);
  gpu_download(out2, d_out, nout);
  gpu_download(att2, d_att, natt);
  test_check(bitwise_equal(out, out2, nout) && bitwise_equal(att, att2, natt),
             "forward out, att bitwise equal run twice");

  // ---- backward, separate scratch, table gradient from zero ----
  float *guard = host_alloc(ntab + DTABLE_GUARD);
  for (int64_t t = 0; t < ntab + DTABLE_GUARD; t++) guard[t] = t < ntab ? 0.0f : -0.0f;
  CUDA_CHECK(cudaMemcpy(d_dtable, guard, sizeof(float) * (size_t)(ntab + DTABLE_GUARD),
                        cudaMemcpyHostToDevice));
  gpu_poison(d_dqkv, nqkv);
  gpu_poison(d_scratch, nscratch);
  window_attention_backward_cuda(d_dqkv, d_dtable, d_dout, d_qkv, d_att_ref, d_index, BW, N, C,
                                 heads, d_scratch, 0);
  gpu_download(dqkv, d_dqkv, nqkv);
  gpu_download(dtable, d_dtable, ntab + DTABLE_GUARD);
  // Sums over N <= 64 products of fp32 P, dP, dS in other orders than the CPU's; dS = P (dP -
  // rowsum) cancels a little: the CPU is ~2e-7 from double loops, 1e-5 leaves a wide margin.
  test_close("backward dqkv vs CPU", dqkv, want_dqkv, nqkv, 1e-5);
  // dtable sums dS over BW windows and the N^2 / rows pairs of each table row: double sums on
  // both sides, the GPU rounding each per-(h, i, j) window sum to fp32 once: ~1e-7 relative.
  test_close("backward dtable (from zero) vs CPU", dtable, want_dtable, ntab, 1e-5);
  int guard_ok = 1;
  for (int64_t t = ntab; t < ntab + DTABLE_GUARD; t++)
    guard_ok &= dtable[t] == 0.0f && signbit(dtable[t]);
  test_check(guard_ok, "backward leaves the %d floats past dtable untouched", DTABLE_GUARD);

  // ---- backward with scratch == att, table gradient accumulated on random values ----
  CUDA_CHECK(
      cudaMemcpy(d_att_copy, d_att_ref, sizeof(float) * (size_t)natt, cudaMemcpyDeviceToDevice));
  CUDA_CHECK(cudaMemcpy(d_dtable, dtable0, sizeof(float) * (size_t)ntab, cudaMemcpyHostToDevice));
  gpu_poison(d_dqkv, nqkv);
  window_attention_backward_cuda(d_dqkv, d_dtable, d_dout, d_qkv, d_att_copy, d_index, BW, N, C,
                                 heads, d_att_copy, 0);
  gpu_download(dqkv2, d_dqkv, nqkv);
  gpu_download(dtable2, d_dtable, ntab);
  // The same arithmetic as the run above: in-place scratch must not change a bit of dqkv.
  test_check(bitwise_equal(dqkv, dqkv2, nqkv), "backward dqkv bitwise equal with scratch == att");
  // The sums as above plus an O(1) start value: the same budget.
  test_close("backward dtable accumulates (+=) vs CPU", dtable2, want_acc, ntab, 1e-5);

  // ---- determinism: the same accumulation again, separate scratch ----
  CUDA_CHECK(cudaMemcpy(d_dtable, dtable0, sizeof(float) * (size_t)ntab, cudaMemcpyHostToDevice));
  gpu_poison(d_dqkv, nqkv);
  gpu_poison(d_scratch, nscratch);
  window_attention_backward_cuda(d_dqkv, d_dtable, d_dout, d_qkv, d_att_ref, d_index, BW, N, C,
                                 heads, d_scratch, 0);
  gpu_download(dqkv, d_dqkv, nqkv);
  gpu_download(dtable, d_dtable, ntab);
  test_check(bitwise_equal(dqkv, dqkv2, nqkv) && bitwise_equal(dtable, dtable2, ntab),
             "backward dqkv, dtable bitwise equal run twice (BW=%d)", BW);

  CUDA_CHECK(cudaFree(d_qkv));
  CUDA_CHECK(cudaFree(d_table));
  CUDA_CHECK(cudaFree(d_dout));
  CUDA_CHECK(cudaFree(d_mask));
  CUDA_CHECK(cudaFree(d_index));
  CUDA_CHECK(cudaFree(d_out));
  CUDA_CHECK(cudaFree(d_att));
  CUDA_CHECK(cudaFree(d_att_ref));
  CUDA_CHECK(cudaFree(d_att_copy));
  CUDA_CHECK(cudaFree(d_dqkv));
  CUDA_CHECK(cudaFree(d_scratch));
  CUDA_CHECK(cudaFree(d_dtable));
  float *host[] = {qkv,       table,       dout,     dtable0, mask, want_out, want_att,
                   want_dqkv, want_dtable, want_acc, out,     att,  out2,     att2,
                   dqkv,      dqkv2,       dtable,   dtable2, guard};
  for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
  free(index);
}
#endif

int main(void) {
  GPU_TEST_MAIN_BEGIN();
#ifdef SWIN_HAVE_CUDA
  TestRng rng = {.state = 0x9a77e4u};
  const AttnShape shapes[] = {
      {"unshifted windows, N=16", 2, 8, 8, 4, 4, 0, 0, 12, 3},
      {"shifted windows, mask nW=4", 2, 8, 8, 4, 4, 2, 2, 12, 3},
      {"H != W, shifted, mask nW=6", 2, 8, 12, 4, 4, 2, 2, 8, 2},
      {"rectangular window 3x4, shifted", 2, 6, 8, 3, 4, 1, 2, 16, 2},
      {"rectangular window 4x8 (N=32), shifted", 2, 8, 16, 4, 8, 2, 4, 64, 2},
      // rows 3 * 15 = 45 < 49 = 7 * 7 of a 4x4 window of the same N: the table has fewer rows
      // than the kernel's bound, the guard checks nothing is written past them.
      {"window 2x8, table rows below the N=16 bound", 2, 4, 16, 2, 8, 1, 4, 16, 2},
      {"window 5x3, odd head_dim 7, shifted", 3, 10, 9, 5, 3, 2, 1, 21, 3},
      {"single-token window", 2, 2, 3, 1, 1, 0, 0, 8, 2},
      {"window = 7x7 map, no shift", 2, 7, 7, 7, 7, 0, 0, 64, 2},
      {"Swin-T stage 1 (C=96, heads=3), mask nW=64", 4, 56, 56, 7, 7, 3, 3, 96, 3},
      {"Swin-T stage 1 unshifted", 2, 56, 56, 7, 7, 0, 0, 96, 3},
      {"Swin-T stage 2 (C=192, heads=6), mask nW=16", 2, 28, 28, 7, 7, 3, 3, 192, 6},
      {"Swin-T stage 3 (C=384, heads=12), mask nW=4", 2, 14, 14, 7, 7, 3, 3, 384, 12},
      {"Swin-T stage 4 (C=768, heads=24), window = map", 4, 7, 7, 7, 7, 0, 0, 768, 24},
      {"limit N=64 (8x8), head_dim 64, shifted", 2, 16, 16, 8, 8, 4, 4, 128, 2},
      {"N=64, head_dim 40 (two lanes' worth, partial)", 1, 8, 8, 8, 8, 0, 0, 80, 2},
  };
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) check_shape(&rng, &shapes[i]);
#endif
  return test_finish();
}
