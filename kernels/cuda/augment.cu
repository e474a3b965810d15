// augment.cu: CUDA random erasing + mixup / cutmix on the normalized batch (kernels/augment.h).
//
// Grid: (element blocks, pairs). Pair p holds samples p and B-1-p (one sample when B is odd and
// p is the middle). Each thread takes one element index i of both samples: it reads both,
// replaces an erased element by its normal (rng_normal_at, the same code and bits as the CPU),
// mixes the two with explicitly rounded multiplies and adds (no FMA contraction, so the bits
// equal the CPU's and PyTorch's separately rounded products), and writes both. Reads and writes
// of a pair stay in one thread, so the in-place update needs no second buffer.
#include <cstdint>

#include "kernels/augment.h"
#include "src/base/cuda_util.h"

namespace {

constexpr int kAugmentThreads = 256;

__device__ __forceinline__ bool in_box(int y, int x, int top, int left, int h, int w) {
  return y >= top && y < top + h && x >= left && x < left + w;
}

__device__ __forceinline__ float erased(float v, const EraseBox &box, int y, int x, uint64_t i) {
  if (box.h > 0 && box.w > 0 && in_box(y, x, box.top, box.left, box.h, box.w))
    return rng_normal_at(&box.fill, i);
  return v;
}

__global__ void batch_augment_kernel(float *__restrict__ images, const EraseBox *__restrict__ boxes,
                                     MixParams mix, float keep, float take, int B, int W, int C,
                                     int64_t n) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int pa = blockIdx.y, pb = B - 1 - blockIdx.y;
  int64_t pixel = i / C;
  int y = (int)(pixel / W), x = (int)(pixel % W);
  float *a = images + (int64_t)pa * n, *b = images + (int64_t)pb * n;
  float va = a[i], vb = b[i];
  if (boxes) {
    va = erased(va, boxes[pa], y, x, (uint64_t)i);
    vb = erased(vb, boxes[pb], y, x, (uint64_t)i);
  }
  if (pa != pb && mix.mode == MIX_MIXUP) {
    float na = __fadd_rn(__fmul_rn(va, keep), __fmul_rn(vb, take));
    float nb = __fadd_rn(__fmul_rn(vb, keep), __fmul_rn(va, take));
    va = na;
    vb = nb;
  } else if (pa != pb && mix.mode == MIX_CUTMIX && in_box(y, x, mix.top, mix.left, mix.h, mix.w)) {
    float t = va;
    va = vb;
    vb = t;
  }
  a[i] = va;
  if (pa != pb) b[i] = vb;
}

}  // namespace

void batch_augment_cuda(float *images, const BatchAugment *p, EraseBox *d_boxes, int B, int H,
                        int W, int C, cudaStream_t stream) {
  if (B <= 0 || (!p->erase && p->mix.mode == MIX_NONE)) return;
  if (p->erase)
    CUDA_CHECK(cudaMemcpyAsync(d_boxes, p->erase, sizeof(EraseBox) * (size_t)B,
                               cudaMemcpyHostToDevice, stream));
  int64_t n = (int64_t)H * W * C;
  dim3 grid((unsigned)((n + kAugmentThreads - 1) / kAugmentThreads), (unsigned)((B + 1) / 2));
  // lam and 1 - lam in double, each rounded to fp32 once, as PyTorch rounds its scalars.
  float keep = (float)p->mix.lam, take = (float)(1.0 - p->mix.lam);
  batch_augment_kernel<<<grid, kAugmentThreads, 0, stream>>>(images, p->erase ? d_boxes : nullptr,
                                                             p->mix, keep, take, B, W, C, n);
  CUDA_CHECK_LAUNCH();
}
