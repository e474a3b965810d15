// patch.cu: the patch-embedding input on CUDA (kernels/patch.h): uint8 pixels normalized (or
// normalized floats as given) and gathered into patch rows in one pass, in the compute type.
// Patch merging lives with its LayerNorm in kernels/cuda/layernorm.cu.
//
// Each output row (one patch) goes to a row of threads striding over its Cin*p*p columns, so the
// writes are coalesced; the reads walk p pixels of Cin channels per patch row.
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

struct Norm {
  float mean[4], std[4];
};

// Row u = (b, y, x) of patches (B, Hp, Wp, Cin*p*p); column c*p*p + i*p + j is pixel
// (y*p + i, x*p + j), channel c, normalized as images_normalize_cpu does for uint8 input.
template <typename In, typename T>
__global__ void patch_embed_input_kernel(T *__restrict__ patches, const In *__restrict__ input,
                                         Norm norm, int npatch, int H, int W, int Cin, int p) {
  int64_t u64 = (int64_t)blockIdx.x * blockDim.y + threadIdx.y;
  if (u64 >= npatch) return;
  int u = (int)u64;
  int Hp = H / p, Wp = W / p, pp = p * p, row = Cin * pp;
  int b = u / (Hp * Wp), yx = u - b * (Hp * Wp);
  int y = yx / Wp, x = yx - y * Wp;
  T *dst = patches + (int64_t)u * row;
  const In *src = input + (((int64_t)b * H + (int64_t)y * p) * W + (int64_t)x * p) * Cin;
  for (int col = threadIdx.x; col < row; col += blockDim.x) {
    int c = col / pp, ij = col - c * pp;
    int i = ij / p, j = ij - i * p;
    In v = src[((int64_t)i * W + j) * Cin + c];
    float f;
    if constexpr (sizeof(In) == 1)
      f = ((float)v / 255.0f - norm.mean[c]) / norm.std[c];
    else
      f = (float)v;
    dst[col] = from_float<T>(f);
  }
}

__global__ void images_normalize_kernel(float *__restrict__ images,
                                        const uint8_t *__restrict__ pixels, Norm norm, int64_t n,
                                        int Cin) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int c = (int)(i % Cin);
  images[i] = ((float)pixels[i] / 255.0f - norm.mean[c]) / norm.std[c];
}

}  // namespace

void images_normalize_cuda(float *images, const uint8_t *pixels, int64_t B, int H, int W, int Cin,
                           const float *mean, const float *std, cudaStream_t stream) {
  int64_t n = B * H * W * Cin;
  if (n <= 0) return;
  Norm norm = {};
  for (int c = 0; c < Cin && c < 4; c++) norm.mean[c] = mean[c], norm.std[c] = std[c];
  images_normalize_kernel<<<blocks_for(n, kThreadsPerBlock), kThreadsPerBlock, 0, stream>>>(
      images, pixels, norm, n, Cin);
  CUDA_CHECK_LAUNCH();
}

void patch_embed_input_cuda(DType dt, void *patches, const void *input, DType input_dtype,
                            const float *mean, const float *std, int B, int H, int W, int Cin,
                            int p, cudaStream_t stream) {
  int64_t npatch = (int64_t)B * (H / p) * (W / p);
  if (npatch <= 0) return;
  if (npatch > INT_MAX || Cin > 4 || (input_dtype != DTYPE_U8 && input_dtype != DTYPE_F32)) {
    fprintf(stderr, "patch_embed_input_cuda: unsupported input (%lld patches, Cin %d, %s)\n",
            (long long)npatch, Cin, dtype_name(input_dtype));
    abort();
  }
  Norm norm = {};
  for (int c = 0; c < Cin; c++) {
    norm.mean[c] = mean ? mean[c] : 0.0f;
    norm.std[c] = std ? std[c] : 1.0f;
  }
  RowLaunch l = row_launch(npatch, Cin * p * p, kThreadsPerBlock);
  SWIN_DISPATCH(dt, T, {
    T *out = static_cast<T *>(patches);
    if (input_dtype == DTYPE_U8)
      patch_embed_input_kernel<uint8_t, T><<<l.grid, l.block, 0, stream>>>(
          out, static_cast<const uint8_t *>(input), norm, (int)npatch, H, W, Cin, p);
    else
      patch_embed_input_kernel<float, T><<<l.grid, l.block, 0, stream>>>(
          out, static_cast<const float *>(input), norm, (int)npatch, H, W, Cin, p);
  });
  CUDA_CHECK_LAUNCH();
}
