// patch.cu: CUDA patch-embedding gather, patch merging (forward and backward) and the uint8 ->
// normalized float conversion of input batches (kernels/patch.h).
//
// The same index maps as kernels/cpu/patch.c. Gather and merge give each output row (a patch,
// a merged slot, a token) to one row of threads that strides over its channels, so reads and
// writes stay coalesced over C; normalization is one thread per element.
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/common.cuh"
#include "kernels/patch.h"
#include "src/cuda_util.h"

namespace {

using namespace swin_cuda;

constexpr int kThreadsPerBlock = 256;

// Row index of this thread row, or -1 past the end.
__device__ inline int64_t launch_row(int64_t rows_total) {
  int64_t r = (int64_t)blockIdx.x * blockDim.y + threadIdx.y;
  return r < rows_total ? r : -1;
}

// The gather and merge index math is 32-bit per row; offsets are 64-bit.
void check_rows(const char *fn, int64_t rows, int B, int H, int W) {
  if (rows > INT_MAX) {
    fprintf(stderr, "%s: %lld rows (B=%d H=%d W=%d) exceed 2^31 - 1\n", fn, (long long)rows, B, H,
            W);
    abort();
  }
}

__device__ inline void set_zero(float &v) {
  v = 0.0f;
}
__device__ inline void set_zero(float4 &v) {
  v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

// ---- patch gather -------------------------------------------------------------------------
// Row u = (b, y, x) of patches (B, Hp, Wp, Cin*p*p); column c*p*p + i*p + j reads image pixel
// (y*p + i, x*p + j), channel c.
__global__ void patch_gather_kernel(float *__restrict__ patches, const float *__restrict__ images,
                                    int npatch, int H, int W, int Cin, int p) {
  int64_t u64 = launch_row(npatch);
  if (u64 < 0) return;
  int u = (int)u64;
  int Hp = H / p, Wp = W / p, pp = p * p, row = Cin * pp;
  int b = u / (Hp * Wp), yx = u - b * (Hp * Wp);
  int y = yx / Wp, x = yx - y * Wp;
  float *dst = patches + (int64_t)u * row;
  const float *src = images + (((int64_t)b * H + (int64_t)y * p) * W + (int64_t)x * p) * Cin;
  for (int col = threadIdx.x; col < row; col += blockDim.x) {
    int c = col / pp, ij = col - c * pp;
    int i = ij / p, j = ij - i * p;
    dst[col] = src[((int64_t)i * W + j) * Cin + c];
  }
}

// ---- patch merging ------------------------------------------------------------------------
// Slot k of the 2x2 neighbourhood is (dy, dx) = (k & 1, k >> 1): (0,0), (1,0), (0,1), (1,1),
// timm's order.

// Row u = (merged token m, slot k) of merged (B, H/2, W/2, 4C) seen as (B*H2*W2*4, C): copied
// from token (2y + dy, 2x + dx). cv vectors of type V per C-row.
template <typename V>
__global__ void patch_merge_forward_kernel(V *__restrict__ merged, const V *__restrict__ tokens,
                                           int slots, int H, int W, int cv) {
  int64_t u64 = launch_row(slots);
  if (u64 < 0) return;
  int u = (int)u64;
  int H2 = H / 2, W2 = W / 2;
  int k = u & 3, m = u >> 2;
  int b = m / (H2 * W2), yx = m - b * (H2 * W2);
  int y = 2 * (yx / W2) + (k & 1), x = 2 * (yx % W2) + (k >> 1);
  V *dst = merged + (int64_t)u * cv;
  const V *src = tokens + (((int64_t)b * H + y) * W + x) * cv;
  for (int i = threadIdx.x; i < cv; i += blockDim.x) dst[i] = src[i];
}

// Row u = token (b, y, x) of dtokens (B, H, W, C): its slot of dmerged, or zero for the last
// row/column of an odd map (it takes no part in the merge).
template <typename V>
__global__ void patch_merge_backward_kernel(V *__restrict__ dtokens, const V *__restrict__ dmerged,
                                            int ntok, int H, int W, int cv) {
  int64_t u64 = launch_row(ntok);
  if (u64 < 0) return;
  int u = (int)u64;
  int H2 = H / 2, W2 = W / 2;
  int b = u / (H * W), yx = u - b * (H * W);
  int y = yx / W, x = yx - y * W;
  V *dst = dtokens + (int64_t)u * cv;
  if (y < 2 * H2 && x < 2 * W2) {
    int k = (y & 1) + 2 * (x & 1);
    const V *src = dmerged + ((((int64_t)b * H2 + y / 2) * W2 + x / 2) * 4 + k) * cv;
    for (int i = threadIdx.x; i < cv; i += blockDim.x) dst[i] = src[i];
  } else {
    for (int i = threadIdx.x; i < cv; i += blockDim.x) set_zero(dst[i]);
  }
}

// ---- normalization ------------------------------------------------------------------------
// Grid-stride over the n elements; the channel index advances with the stride instead of being
// recomputed with a 64-bit modulo per element.
__global__ void images_normalize_kernel(float *__restrict__ images,
                                        const uint8_t *__restrict__ pixels, int64_t n, int Cin,
                                        const float *__restrict__ mean,
                                        const float *__restrict__ std) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  int c = (int)(i % Cin), c_step = (int)(stride % Cin);
  for (; i < n; i += stride) {
    // The CPU's three fp32 operations (IEEE division: no fast-math here).
    images[i] = ((float)pixels[i] / 255.0f - mean[c]) / std[c];
    c += c_step;
    if (c >= Cin) c -= Cin;
  }
}

}  // namespace

void patch_gather_cuda(float *patches, const float *images, int B, int H, int W, int Cin, int p,
                       cudaStream_t stream) {
  int64_t npatch = (int64_t)B * (H / p) * (W / p);
  if (npatch <= 0 || Cin <= 0) return;
  check_rows("patch_gather_cuda", npatch, B, H, W);
  RowLaunch l = row_launch(npatch, Cin * p * p, kThreadsPerBlock);
  patch_gather_kernel<<<l.grid, l.block, 0, stream>>>(patches, images, (int)npatch, H, W, Cin, p);
  CUDA_CHECK_LAUNCH();
}

void patch_merge_forward_cuda(float *merged, const float *tokens, int B, int H, int W, int C,
                              cudaStream_t stream) {
  int64_t slots = (int64_t)B * (H / 2) * (W / 2) * 4;
  if (slots <= 0 || C <= 0) return;
  check_rows("patch_merge_forward_cuda", slots, B, H, W);
  if (C % 4 == 0 && aligned16(merged) && aligned16(tokens)) {
    RowLaunch l = row_launch(slots, C / 4, kThreadsPerBlock);
    patch_merge_forward_kernel<float4><<<l.grid, l.block, 0, stream>>>(
        (float4 *)merged, (const float4 *)tokens, (int)slots, H, W, C / 4);
  } else {
    RowLaunch l = row_launch(slots, C, kThreadsPerBlock);
    patch_merge_forward_kernel<float>
        <<<l.grid, l.block, 0, stream>>>(merged, tokens, (int)slots, H, W, C);
  }
  CUDA_CHECK_LAUNCH();
}

void patch_merge_backward_cuda(float *dtokens, const float *dmerged, int B, int H, int W, int C,
                               cudaStream_t stream) {
  int64_t ntok = (int64_t)B * H * W;
  if (ntok <= 0 || C <= 0) return;
  check_rows("patch_merge_backward_cuda", ntok, B, H, W);
  if (C % 4 == 0 && aligned16(dtokens) && aligned16(dmerged)) {
    RowLaunch l = row_launch(ntok, C / 4, kThreadsPerBlock);
    patch_merge_backward_kernel<float4><<<l.grid, l.block, 0, stream>>>(
        (float4 *)dtokens, (const float4 *)dmerged, (int)ntok, H, W, C / 4);
  } else {
    RowLaunch l = row_launch(ntok, C, kThreadsPerBlock);
    patch_merge_backward_kernel<float>
        <<<l.grid, l.block, 0, stream>>>(dtokens, dmerged, (int)ntok, H, W, C);
  }
  CUDA_CHECK_LAUNCH();
}

void images_normalize_cuda(float *images, const uint8_t *pixels, int64_t B, int H, int W, int Cin,
                           const float *mean, const float *std, cudaStream_t stream) {
  int64_t n = B * H * W * Cin;
  if (n <= 0) return;
  // Enough blocks to fill the device several times over; the loop covers the rest.
  int64_t blocks = (n + kThreadsPerBlock - 1) / kThreadsPerBlock;
  if (blocks > 8192) blocks = 8192;
  images_normalize_kernel<<<(unsigned)blocks, kThreadsPerBlock, 0, stream>>>(images, pixels, n, Cin,
                                                                             mean, std);
  CUDA_CHECK_LAUNCH();
}
