// attention.cu: the entry points of CUDA window attention (kernels/attention.h; the spec is
// kernels/cpu/attention.c): they check the shapes; run, for windows of at most 64 tokens, the
// tensor-core kernels (attention_tc.cu) or the SIMT ones (attention_simt.cu), which keep a whole
// (window, head) in shared memory, and for larger windows the flash kernels, keys in tiles
// (attention_flash_tc.cu, attention_flash_simt.cu); and after any backward the dtable reduction.
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cuda/attention.cuh"
#include "kernels/gemm.h"

using namespace swin_cuda::attention;

namespace {

// The geometry a launch can serve; a violation is a bug in the model's setup, not a runtime
// condition, so it is reported like a CUDA error: message and abort.
void check_limits(const char *fn, int BW, int N, int C, int heads) {
  int hd = heads > 0 ? C / heads : 0;
  if (BW >= 0 && N >= 1 && N <= WINDOW_ATTENTION_CUDA_MAX_N && heads >= 1 && C % heads == 0 &&
      hd >= 1 && hd <= WINDOW_ATTENTION_CUDA_MAX_HEAD_DIM &&
      (int64_t)BW * heads <= (int64_t)0x7fffffff)
    return;
  fprintf(stderr,
          "%s (%s:%d): unsupported shape BW=%d N=%d C=%d heads=%d (need 1 <= N <= %d, C %% heads "
          "== 0, 1 <= C/heads <= %d, BW*heads < 2^31)\n"
          "HINT: use a window of at most %d tokens and at most %d channels per head\n",
          fn, __FILE__, __LINE__, BW, N, C, heads, WINDOW_ATTENTION_CUDA_MAX_N,
          WINDOW_ATTENTION_CUDA_MAX_HEAD_DIM, WINDOW_ATTENTION_CUDA_MAX_N,
          WINDOW_ATTENTION_CUDA_MAX_HEAD_DIM);
  abort();
}

// Windows beyond one 64-token tile take the flash kernels.
bool use_flash(int N) {
  return N > kFlashKeys;
}

}  // namespace

int64_t window_attention_saved_floats(DType dt, int BW, int N, int C, int heads) {
  int hd = heads > 0 ? C / heads : 0;
  if (use_flash(N) && flash_tensor_cores(dt, hd)) return flash_tc_saved_floats(BW, N, heads);
  if (use_flash(N)) return 2 * (int64_t)BW * heads * N;             // log-sum-exp, then delta
  if (use_tensor_cores(dt, N, hd)) return (int64_t)BW * heads * N;  // log-sum-exp per row
  return (int64_t)BW * heads * N * N;                               // the probabilities
}

void window_attention_forward_cuda(DType dt, void *out, float *att, const void *qkv,
                                   const float *table, const int *index, const float *mask, int BW,
                                   int nW, int N, int C, int heads, float scale,
                                   cudaStream_t stream) {
  check_limits("window_attention_forward_cuda", BW, N, C, heads);
  if (mask && nW < 1) {
    fprintf(stderr, "window_attention_forward_cuda (%s:%d): mask given with nW=%d\n", __FILE__,
            __LINE__, nW);
    abort();
  }
  if (BW == 0) return;
  int hd = C / heads;
  if (use_flash(N) && flash_tensor_cores(dt, hd))
    window_attention_forward_flash_tc(dt, out, att, att + 2 * (int64_t)BW * heads * N, qkv, table,
                                      index, mask, BW, nW, N, C, heads, scale, stream);
  else if (use_flash(N))
    window_attention_forward_flash_simt(dt, out, att, qkv, table, index, mask, BW, nW, N, C, heads,
                                        scale, stream);
  else if (use_tensor_cores(dt, N, hd))
    window_attention_forward_tc(dt, out, att, qkv, table, index, mask, BW, nW, N, C, heads, scale,
                                stream);
  else
    window_attention_forward_simt(dt, out, att, qkv, table, index, mask, BW, nW, N, C, heads, scale,
                                  stream);
}

int64_t window_attention_backward_cuda_scratch(DType dt, int BW, int N, int C, int heads) {
  int hd = heads > 0 ? C / heads : 0;
  if (use_flash(N)) {  // the groups' dS sums; then, once dtable has them, the qkv bias sums
    int groups = flash_tensor_cores(dt, hd)
                     ? window_attention_backward_flash_tc_groups(BW, N, C, heads)
                     : window_attention_backward_flash_simt_groups(BW, N, C, heads);
    int64_t ds = (int64_t)groups * heads * N * N;
    int64_t bias = column_sums_cuda_scratch((int64_t)BW * N, 3 * C);
    return ds > bias ? ds : bias;
  }
  if (use_tensor_cores(dt, N, hd)) return window_attention_backward_tc_scratch(BW, N, C, heads);
  return window_attention_backward_simt_scratch(BW, N, C);
}

int64_t window_attention_backward_cuda_scratch_bound(int max_N, int max_heads, int max_width) {
  // Tensor cores (N <= 64): a block per (group, head), its dS sums and 3 * head_dim bias sums.
  int64_t n = max_N < kFlashKeys ? max_N : kFlashKeys;
  int64_t bound = (int64_t)WINDOW_ATTENTION_CUDA_MAX_BLOCKS * (n * n + 3 * (int64_t)max_width);
  // Flash: groups * heads <= max(blocks / key tiles, heads) (flash_groups), over every N.
  for (int64_t N = kFlashKeys + 1; N <= max_N; N++) {
    int64_t pairs = WINDOW_ATTENTION_CUDA_MAX_BLOCKS / flash_key_tiles((int)N);
    if (pairs < max_heads) pairs = max_heads;
    if (pairs * N * N > bound) bound = pairs * N * N;
  }
  return bound;
}

void window_attention_backward_cuda(DType dt, void *dqkv, float *dqkv_bias, float *dtable,
                                    const void *dout, const void *qkv, const void *out, float *att,
                                    const float *table, const int *index, const float *mask, int BW,
                                    int nW, int N, int C, int heads, float scale, float *scratch,
                                    cudaStream_t stream) {
  check_limits("window_attention_backward_cuda", BW, N, C, heads);
  if (BW == 0) return;
  int hd = C / heads;
  if (use_flash(N)) {
    // att: the forward's log-sum-exp, then room for delta (then, for the tensor cores, the
    // forward's dense bias); the groups' dS sums in scratch.
    float *delta = att + (int64_t)BW * heads * N;
    int groups = flash_tensor_cores(dt, hd)
                     ? window_attention_backward_flash_tc(dt, dqkv, dout, qkv, out, att, delta,
                                                          delta + (int64_t)BW * heads * N, mask, BW,
                                                          nW, N, C, heads, scale, scratch, stream)
                     : window_attention_backward_flash_simt(dt, dqkv, dout, qkv, out, att, delta,
                                                            table, index, mask, BW, nW, N, C, heads,
                                                            scale, scratch, stream);
    window_attention_dtable_backward(dtable, scratch, groups, index, N, heads, stream);
    if (dqkv_bias) column_sums_cuda(dt, dqkv_bias, dqkv, (int64_t)BW * N, 3 * C, scratch, stream);
    return;
  }
  bool tc = use_tensor_cores(dt, N, hd);
  // Partial window sums of dS, (rows, E) with E = heads * N * N: the tensor-core path's per
  // block in scratch, the SIMT path's per window over the probabilities in att.
  float *ds = tc ? scratch : att;
  int64_t rows = BW;
  if (tc)
    rows = window_attention_backward_tc(dt, dqkv, dqkv_bias, dout, qkv, att, table, index, mask, BW,
                                        nW, N, C, heads, scale, scratch, stream);
  else
    window_attention_backward_simt(dt, dqkv, dqkv_bias, dout, qkv, att, BW, N, C, heads, scale,
                                   scratch, stream);
  window_attention_dtable_backward(dtable, ds, rows, index, N, heads, stream);
}
