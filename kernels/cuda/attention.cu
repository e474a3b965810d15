// attention.cu: the entry points of CUDA window attention (kernels/attention.h; the spec is
// kernels/cpu/attention.c): they check the shapes, run the tensor-core kernels (attention_tc.cu)
// or the SIMT ones (attention_simt.cu), and after either backward the dtable reduction.
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cuda/attention.cuh"

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

}  // namespace

int64_t window_attention_saved_floats(DType dt, int BW, int N, int C, int heads) {
  int hd = heads > 0 ? C / heads : 0;
  if (use_tensor_cores(dt, N, hd)) return (int64_t)BW * heads * N;  // log-sum-exp per row
  return (int64_t)BW * heads * N * N;                               // the probabilities
}

void window_attention_forward_cuda(DType dt, void *out, float *att, const void *qkv,
                                   const float *table, const int *index, const float *mask, int BW,
                                   int nW, int N, int C, int heads, cudaStream_t stream) {
  check_limits("window_attention_forward_cuda", BW, N, C, heads);
  if (mask && nW < 1) {
    fprintf(stderr, "window_attention_forward_cuda (%s:%d): mask given with nW=%d\n", __FILE__,
            __LINE__, nW);
    abort();
  }
  if (BW == 0) return;
  int hd = C / heads;
  if (use_tensor_cores(dt, N, hd))
    window_attention_forward_tc(dt, out, att, qkv, table, index, mask, BW, nW, N, C, heads, stream);
  else
    window_attention_forward_simt(dt, out, att, qkv, table, index, mask, BW, nW, N, C, heads,
                                  stream);
}

int64_t window_attention_backward_cuda_scratch(DType dt, int BW, int N, int C, int heads) {
  int hd = heads > 0 ? C / heads : 0;
  if (use_tensor_cores(dt, N, hd)) return window_attention_backward_tc_scratch(BW, N, C, heads);
  return window_attention_backward_simt_scratch(BW, N, C);
}

void window_attention_backward_cuda(DType dt, void *dqkv, float *dqkv_bias, float *dtable,
                                    const void *dout, const void *qkv, float *att,
                                    const float *table, const int *index, const float *mask, int BW,
                                    int nW, int N, int C, int heads, float *scratch,
                                    cudaStream_t stream) {
  check_limits("window_attention_backward_cuda", BW, N, C, heads);
  if (BW == 0) return;
  int hd = C / heads;
  bool tc = use_tensor_cores(dt, N, hd);
  // Partial window sums of dS, (rows, E) with E = heads * N * N: the tensor-core path's per
  // block in scratch, the SIMT path's per window over the probabilities in att.
  float *ds = tc ? scratch : att;
  int64_t rows = BW;
  if (tc)
    rows = window_attention_backward_tc(dt, dqkv, dqkv_bias, dout, qkv, att, table, index, mask, BW,
                                        nW, N, C, heads, scratch, stream);
  else
    window_attention_backward_simt(dt, dqkv, dqkv_bias, dout, qkv, att, BW, N, C, heads, scratch,
                                   stream);
  window_attention_dtable_backward(dtable, ds, rows, index, N, heads, stream);
}
