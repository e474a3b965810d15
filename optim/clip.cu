// clip.cu: the gradient sum of squares of optim/clip.h on the GPU, in double, deterministic.
//
// Pass 1: a number of blocks fixed by n alone; thread t of the grid sums the elements
// t, t + T, t + 2T, ... (T threads in all; neighbouring threads read neighbouring floats, so
// every load is coalesced whatever grad's alignment) into double accumulators, and each block
// reduces its threads in a fixed tree into one double partial in scratch. Pass 2: one block
// adds the partials in a fixed tree. No atomics anywhere, so the bits never depend on timing.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "optim/clip.h"
#include "src/base/cuda_util.h"

namespace {

using namespace swin_cuda;

constexpr int kWarp = 32;
constexpr int kThreadsPerBlock = 256;
// At most this many partials; below, one block per 8 elements per thread.
constexpr int64_t kMaxBlocks = 1024;
constexpr int64_t kMinElementsPerBlock = (int64_t)kThreadsPerBlock * 8;

int64_t partial_count(int64_t n) {
  int64_t blocks = (n + kMinElementsPerBlock - 1) / kMinElementsPerBlock;
  return blocks < 1 ? 1 : blocks > kMaxBlocks ? kMaxBlocks : blocks;
}

// The partials are doubles at the first 8-byte boundary of the float scratch.
double *partials_in(float *scratch) {
  return reinterpret_cast<double *>(((uintptr_t)scratch + 7) & ~(uintptr_t)7);
}

// Sum over the block's threads, returned in thread 0: a butterfly within each warp, then the
// warps' sums in warp order. blockDim.x must be kThreadsPerBlock.
__device__ double block_sum(double v) {
  __shared__ double warp_sums[kThreadsPerBlock / kWarp];
  v = warp_sum(v);
  if (threadIdx.x % kWarp == 0) warp_sums[threadIdx.x / kWarp] = v;
  __syncthreads();
  double total = 0.0;
  if (threadIdx.x == 0) {
    for (int w = 0; w < kThreadsPerBlock / kWarp; w++) total += warp_sums[w];
  }
  return total;
}

// partial[block] = sum of grad[i]^2 over this block's threads' elements. Squares of floats are
// exact in double, so only the additions round.
__global__ void __launch_bounds__(kThreadsPerBlock)
    sum_squares_partial_kernel(double *__restrict__ partial, const float *__restrict__ grad,
                               int64_t n) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  // Four loads in flight per thread, into two accumulators (a fixed association).
  double acc0 = 0.0, acc1 = 0.0;
  for (; i + 3 * stride < n; i += 4 * stride) {
    double a = grad[i], b = grad[i + stride], c = grad[i + 2 * stride], d = grad[i + 3 * stride];
    acc0 += a * a;
    acc1 += b * b;
    acc0 += c * c;
    acc1 += d * d;
  }
  for (; i < n; i += stride) {
    double a = grad[i];
    acc0 += a * a;
  }
  double total = block_sum(acc0 + acc1);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

// *result = sum of partial[0 .. count): thread t adds t, t + 256, ... in order, then the block
// tree.
__global__ void __launch_bounds__(kThreadsPerBlock)
    sum_partials_kernel(double *__restrict__ result, const double *__restrict__ partial,
                        int64_t count) {
  double acc = 0.0;
  for (int64_t p = threadIdx.x; p < count; p += blockDim.x) acc += partial[p];
  double total = block_sum(acc);
  if (threadIdx.x == 0) *result = total;
}

}  // namespace

int64_t grad_sum_squares_cuda_scratch(int64_t n) {
  // Two floats per double partial, plus one for the step to an 8-byte boundary.
  return 2 * partial_count(n) + 1;
}

void grad_sum_squares_cuda(const float *grad, int64_t n, double *result_device, float *scratch,
                           cudaStream_t stream) {
  if (n < 0) n = 0;
  const int64_t blocks = partial_count(n);
  double *partial = partials_in(scratch);
  sum_squares_partial_kernel<<<(unsigned)blocks, kThreadsPerBlock, 0, stream>>>(partial, grad, n);
  CUDA_CHECK_LAUNCH();
  sum_partials_kernel<<<1, kThreadsPerBlock, 0, stream>>>(result_device, partial, blocks);
  CUDA_CHECK_LAUNCH();
}
