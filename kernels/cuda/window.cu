// window.cu: CUDA cyclic shift + window partition and its reverse (kernels/window.h).
//
// The same permutation as kernels/cpu/window.c: token t = r*ww + c of window (wi, wj) of image b
// is pixel ((wi*wh + r + sh) % H, (wj*ww + c + sw) % W) of the un-rolled map. Threads walk the
// tokens in window order; the threads of one token stride over its C-vector, 16 bytes at a time
// when the layout allows, so both the gather and the scatter side are coalesced over C.
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/common.cuh"
#include "kernels/window.h"
#include "src/cuda_util.h"

namespace {

using namespace swin_cuda;

constexpr int kThreadsPerBlock = 256;

// Moves token `tok` (in window order) between the map and its window: dst and src are the two
// arrays in the direction of the copy, as vectors of type V (float4 or float); cv vectors per
// token. kToWindows picks which side is the destination.
template <typename V, bool kToWindows>
__global__ void window_permute_kernel(V *__restrict__ dst, const V *__restrict__ src, int tokens,
                                      int H, int W, int cv, int wh, int ww, int sh, int sw) {
  int64_t tok64 = (int64_t)blockIdx.x * blockDim.y + threadIdx.y;
  if (tok64 >= tokens) return;
  int tok = (int)tok64;
  int N = wh * ww, nWw = W / ww, nW = (H / wh) * nWw;
  int bw = tok / N, t = tok - bw * N;
  int b = bw / nW, w = bw - b * nW;
  int r = t / ww, c = t - r * ww;
  int y = ((w / nWw) * wh + r + sh) % H;
  int x = ((w % nWw) * ww + c + sw) % W;
  int64_t win_off = (int64_t)tok * cv;
  int64_t map_off = (((int64_t)b * H + y) * W + x) * cv;
  V *d = dst + (kToWindows ? win_off : map_off);
  const V *s = src + (kToWindows ? map_off : win_off);
  for (int i = threadIdx.x; i < cv; i += blockDim.x) d[i] = s[i];
}

template <bool kToWindows>
void window_permute(float *dst, const float *src, int B, int H, int W, int C, int wh, int ww,
                    int sh, int sw, cudaStream_t stream) {
  int64_t tokens = (int64_t)B * H * W;
  if (tokens <= 0 || C <= 0) return;
  if (tokens > INT_MAX) {
    fprintf(stderr, "window_%s_cuda: %lld tokens (B=%d H=%d W=%d) exceed 2^31 - 1\n",
            kToWindows ? "partition" : "reverse", (long long)tokens, B, H, W);
    abort();
  }
  // Windows tile the map exactly (H % wh == 0, W % ww == 0), as on the CPU, so every token of
  // the destination is written exactly once.
  if (C % 4 == 0 && aligned16(dst) && aligned16(src)) {
    RowLaunch l = row_launch(tokens, C / 4, kThreadsPerBlock);
    window_permute_kernel<float4, kToWindows><<<l.grid, l.block, 0, stream>>>(
        (float4 *)dst, (const float4 *)src, (int)tokens, H, W, C / 4, wh, ww, sh, sw);
  } else {
    RowLaunch l = row_launch(tokens, C, kThreadsPerBlock);
    window_permute_kernel<float, kToWindows>
        <<<l.grid, l.block, 0, stream>>>(dst, src, (int)tokens, H, W, C, wh, ww, sh, sw);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void window_partition_cuda(float *windows, const float *tokens, int B, int H, int W, int C, int wh,
                           int ww, int sh, int sw, cudaStream_t stream) {
  window_permute<true>(windows, tokens, B, H, W, C, wh, ww, sh, sw, stream);
}

void window_reverse_cuda(float *tokens, const float *windows, int B, int H, int W, int C, int wh,
                         int ww, int sh, int sw, cudaStream_t stream) {
  window_permute<false>(tokens, windows, B, H, W, C, wh, ww, sh, sw, stream);
}
