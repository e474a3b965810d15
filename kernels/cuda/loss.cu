// loss.cu: CUDA softmax cross-entropy with label smoothing or soft targets, fused with its
// gradient, and top-1 / top-5 counting (kernels/loss.h).
//
// The arithmetic of kernels/cpu/loss.c, one block per row: max in float, then in double
// lse = max + log(sum_k exp(x_k - max)), log p_k = x_k - lse, loss = -sum_k t_k log p_k and
// dlogits_k = (exp(log p_k) - t_k) / grad_count. The rows are few (B*K is ~1e5 per step), so
// double costs nothing that matters and keeps the GPU within rounding of the CPU at any logit
// magnitude.
// Block sums go through warp shuffles and then one warp over the warp partials: a fixed tree, so
// the results are the same bits on every run.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/loss.h"
#include "src/base/cuda_util.h"

namespace {

using namespace swin_cuda;

constexpr int kLossThreads = 256;  // a multiple of 32 (the block reductions assume full warps)
constexpr int kTopkWarps = 4;      // rows (one per warp) per top-k block

// Sum over the block, returned to every thread. Every thread of the block must call it.
// scratch: 32 values of shared memory, reused by each call (hence the leading barrier).
template <typename T>
__device__ T block_sum(T v, T *scratch) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return warp_sum(lane < warps ? scratch[lane] : T(0));
}

__device__ float block_max(float v, float *scratch) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return warp_max(lane < warps ? scratch[lane] : -INFINITY);
}

// Block b handles row b. Exactly one of labels and soft is non-NULL; dlogits may be NULL.
__global__ void cross_entropy_kernel(float *__restrict__ losses, float *__restrict__ dlogits,
                                     const float *__restrict__ logits,
                                     const int *__restrict__ labels, const float *__restrict__ soft,
                                     float smoothing, const float *__restrict__ grad_scale, int K,
                                     int grad_count) {
  __shared__ float scratch_f[32];
  __shared__ double scratch_d[32];
  int b = blockIdx.x;
  const float *x = logits + (int64_t)b * K;
  float *g = dlogits ? dlogits + (int64_t)b * K : nullptr;
  int y = labels ? labels[b] : -1;
  if (labels && (y < 0 || y >= K)) {
    // The whole block takes this branch (y is the row's): no barrier is skipped by a part of it.
    // An out-of-range label has no target row: a visibly non-finite step, as on the CPU.
    if (threadIdx.x == 0) losses[b] = NAN;
    if (g)
      for (int k = threadIdx.x; k < K; k += blockDim.x) g[k] = NAN;
    return;
  }

  float mx = -INFINITY;
  for (int k = threadIdx.x; k < K; k += blockDim.x) mx = fmaxf(mx, x[k]);
  mx = block_max(mx, scratch_f);

  double sum = 0.0;
  for (int k = threadIdx.x; k < K; k += blockDim.x) sum += exp((double)x[k] - mx);
  sum = block_sum(sum, scratch_d);
  double lse = mx + log(sum);

  // t = (1 - s) onehot(y) + s / K for hard labels, the given row for soft targets.
  double off_target = (double)smoothing / K;
  const double scale = grad_scale ? (double)*grad_scale : 1.0;
  const float *t_row = soft ? soft + (int64_t)b * K : nullptr;
  double loss = 0.0;
  for (int k = threadIdx.x; k < K; k += blockDim.x) {
    double logp = (double)x[k] - lse;
    double target = t_row ? (double)t_row[k] : off_target + (k == y ? 1.0 - smoothing : 0.0);
    loss -= target * logp;
    if (g) g[k] = (float)((exp(logp) - target) / grad_count * scale);
  }
  loss = block_sum(loss, scratch_d);
  if (threadIdx.x == 0) losses[b] = (float)loss;
}

// One warp per row: the label's rank is the number of classes ahead of it (a larger logit, or
// an equal one at a smaller index), as on the CPU. No barriers, so whole warps may leave early.
__global__ void topk_kernel(const float *__restrict__ logits, const int *__restrict__ labels, int B,
                            int K, unsigned long long *top1, unsigned long long *top5) {
  int64_t row = (int64_t)blockIdx.x * kTopkWarps + (threadIdx.x >> 5);
  int lane = threadIdx.x & 31;
  if (row >= B) return;
  int y = labels[row];
  if (y < 0 || y >= K) return;
  const float *x = logits + row * K;
  float v = x[y];
  if (isnan(v)) return;
  int rank = 0;
  for (int k = lane; k < K; k += 32) {
    float xk = x[k];
    rank += xk > v || (xk == v && k < y);
  }
  rank = warp_sum(rank);
  if (lane == 0) {
    if (rank < 1) atomicAdd(top1, 1ull);
    if (rank < 5) atomicAdd(top5, 1ull);
  }
}

// One thread adds the B row losses in row order (double), so the sum is the same every run.
__global__ void losses_accumulate_kernel(double *sum, int64_t *count, int64_t *bad,
                                         const float *__restrict__ losses, int B, bool mean) {
  double total = 0.0;
  for (int b = 0; b < B; b++) total += losses[b];
  if (!mean) {
    *sum += total;
    *count += B;
  } else if (isfinite(total)) {
    *sum += total / B;
    *count += 1;
  } else if (bad) {
    *bad += 1;
  }
}

}  // namespace

void cross_entropy_forward_backward_cuda(float *losses, float *dlogits, const float *logits,
                                         const int *labels, const float *soft_targets,
                                         float smoothing, const float *grad_scale, int B, int K,
                                         int grad_count, cudaStream_t stream) {
  if (B <= 0 || K <= 0) return;
  cross_entropy_kernel<<<B, kLossThreads, 0, stream>>>(
      losses, dlogits, logits, labels, soft_targets, smoothing, grad_scale, K, grad_count);
  CUDA_CHECK_LAUNCH();
}

void losses_accumulate_cuda(double *sum, int64_t *count, int64_t *bad, const float *losses, int B,
                            bool mean, cudaStream_t stream) {
  if (B <= 0) return;
  losses_accumulate_kernel<<<1, 1, 0, stream>>>(sum, count, bad, losses, B, mean);
  CUDA_CHECK_LAUNCH();
}

void topk_accumulate_cuda(const float *logits, const int *labels, int B, int K, int64_t *top1,
                          int64_t *top5, cudaStream_t stream) {
  if (B <= 0 || K <= 0) return;
  unsigned blocks = (unsigned)(((int64_t)B + kTopkWarps - 1) / kTopkWarps);
  topk_kernel<<<blocks, kTopkWarps * 32, 0, stream>>>(logits, labels, B, K,
                                                      reinterpret_cast<unsigned long long *>(top1),
                                                      reinterpret_cast<unsigned long long *>(top5));
  CUDA_CHECK_LAUNCH();
}
