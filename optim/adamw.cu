// adamw.cu: one optimizer update on CUDA (optim/optimizer.h), with no host round trip: the
// global gradient norm (optim/clip.cu), a one-thread kernel that takes the step's decisions
// (optimizer_decide: skip a non-finite step, clip, the loss scale, AdamW's bias corrections),
// and one launch of the fused AdamW over the chunk table, which also writes the compute copy.
// Each element's gradient, moments and weight are read and written once (5 streams of n floats,
// plus the compute copy), 16 bytes at a time.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/optimizer.h"
#include "src/base/cuda_util.h"

namespace {

using namespace swin_cuda;

constexpr int kThreadsPerBlock = 256;

// What one step applies to every element, written by the decide kernel.
struct StepScalars {
  double bias1;  // 1 - beta1^t
  int skip;
  float grad_scale;  // clip coefficient / loss scale
  float bias2_sqrt;  // sqrt(1 - beta2^t)
  float lr;          // this step's learning rate, before each chunk's lr_scale
};

// The bias corrections in double, exactly as adamw_update_cpu computes them. The learning rate
// comes from device memory (*lr), so a captured step replays with each step's own.
__global__ void optimizer_decide_kernel(StepScalars *out, OptimState *state,
                                        const double *sum_squares, const float *lr,
                                        OptimizerStep h) {
  StepDecision d = optimizer_decide(state, *sum_squares, h);
  StepScalars s = {1.0, d.skip ? 1 : 0, d.grad_scale, 1.0f, *lr};
  if (!d.skip) {
    s.bias1 = 1.0 - pow((double)h.beta1, (double)d.t);
    s.bias2_sqrt = (float)sqrt(1.0 - pow((double)h.beta2, (double)d.t));
  }
  *out = s;
}

// The CPU's element update, written the same way; step_size = chunk lr / (1 - beta1^t).
__device__ __forceinline__ void adamw_element(float &p, float grad, float &m, float &v,
                                              const StepScalars &s, const OptimizerStep &h,
                                              float decay, float step_size) {
  float g = grad * s.grad_scale;
  float mi = h.beta1 * m + (1.0f - h.beta1) * g;
  float vi = h.beta2 * v + (1.0f - h.beta2) * g * g;
  m = mi;
  v = vi;
  p = p * decay - step_size * mi / (sqrtf(vi) / s.bias2_sqrt + h.eps);
}

// Block b updates chunk b: 4 elements per thread per iteration with 16-byte accesses (chunk
// offsets are multiples of 4 and the buffers 16-byte aligned), the ragged tail one at a time.
// compute (the weights in the compute type) is written when given.
template <typename T>
__global__ void __launch_bounds__(kThreadsPerBlock)
    adamw_chunks_kernel(float *__restrict__ params, T *__restrict__ compute,
                        const float *__restrict__ grads, float *__restrict__ m,
                        float *__restrict__ v, const AdamWChunk *__restrict__ chunks,
                        const StepScalars *__restrict__ scalars, OptimizerStep h) {
  const StepScalars s = *scalars;
  if (s.skip) return;
  const AdamWChunk ch = chunks[blockIdx.x];
  // The chunk's learning rate and what follows from it, as adamw_update_cpu computes them from
  // the lr the CPU backend hands it: torch's decoupled decay, and lr / (1 - beta1^t) in double.
  const float lr = s.lr * ch.lr_scale;
  const float decay = 1.0f - lr * ch.weight_decay;
  const float step_size = (float)((double)lr / s.bias1);
  const int64_t base = ch.offset;
  int i = threadIdx.x * 4;
  for (; i + 4 <= ch.count; i += blockDim.x * 4) {
    int64_t e = base + i;
    float4 p4 = *reinterpret_cast<float4 *>(params + e);
    float4 g4 = *reinterpret_cast<const float4 *>(grads + e);
    float4 m4 = *reinterpret_cast<float4 *>(m + e);
    float4 v4 = *reinterpret_cast<float4 *>(v + e);
    adamw_element(p4.x, g4.x, m4.x, v4.x, s, h, decay, step_size);
    adamw_element(p4.y, g4.y, m4.y, v4.y, s, h, decay, step_size);
    adamw_element(p4.z, g4.z, m4.z, v4.z, s, h, decay, step_size);
    adamw_element(p4.w, g4.w, m4.w, v4.w, s, h, decay, step_size);
    *reinterpret_cast<float4 *>(params + e) = p4;
    *reinterpret_cast<float4 *>(m + e) = m4;
    *reinterpret_cast<float4 *>(v + e) = v4;
    if (compute) {
      compute[e] = from_float<T>(p4.x);
      compute[e + 1] = from_float<T>(p4.y);
      compute[e + 2] = from_float<T>(p4.z);
      compute[e + 3] = from_float<T>(p4.w);
    }
  }
  // The tail (count % 4 elements) goes to the first threads, one element each.
  for (int t = (ch.count & ~3) + threadIdx.x; t < ch.count; t += blockDim.x) {
    int64_t e = base + t;
    float p = params[e], mi = m[e], vi = v[e];
    adamw_element(p, grads[e], mi, vi, s, h, decay, step_size);
    params[e] = p;
    m[e] = mi;
    v[e] = vi;
    if (compute) compute[e] = from_float<T>(p);
  }
}

// dst (n, T) = src (n, f32).
template <typename T>
__global__ void to_compute_kernel(T *__restrict__ dst, const float *__restrict__ src, int64_t n) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = from_float<T>(src[i]);
}

// The scratch layout: the sum of squares (a double), the step scalars, then clip.cu's partials
// (optimizer_step_cuda_scratch's 16 floats cover the alignment, the double and the scalars).
static_assert(sizeof(StepScalars) <= 32, "StepScalars outgrew its room in the scratch");
struct Scratch {
  double *sum_squares;
  StepScalars *scalars;
  float *partials;
};

Scratch split_scratch(float *scratch) {
  uintptr_t p = ((uintptr_t)scratch + 15) & ~(uintptr_t)15;
  Scratch s;
  s.sum_squares = reinterpret_cast<double *>(p);
  s.scalars = reinterpret_cast<StepScalars *>(p + 16);
  s.partials = reinterpret_cast<float *>(p + 16 + ((sizeof(StepScalars) + 15) & ~(size_t)15));
  return s;
}

}  // namespace

int64_t optimizer_step_cuda_scratch(int64_t n) {
  return 16 + grad_sum_squares_cuda_scratch(n);
}

void optimizer_step_cuda(DType compute_dtype, float *params, void *compute, const float *grads,
                         float *m, float *v, int64_t n, const AdamWChunk *chunks, int num_chunks,
                         OptimizerStep hyper, const float *lr, OptimState *state, float *scratch,
                         cudaStream_t stream) {
  Scratch s = split_scratch(scratch);
  grad_sum_squares_cuda(grads, n, s.sum_squares, s.partials, stream);
  optimizer_decide_kernel<<<1, 1, 0, stream>>>(s.scalars, state, s.sum_squares, lr, hyper);
  CUDA_CHECK_LAUNCH();
  if (num_chunks <= 0) return;
  if (!compute) {
    adamw_chunks_kernel<float><<<(unsigned)num_chunks, kThreadsPerBlock, 0, stream>>>(
        params, nullptr, grads, m, v, chunks, s.scalars, hyper);
  } else {
    SWIN_DISPATCH(compute_dtype, T,
                  adamw_chunks_kernel<T><<<(unsigned)num_chunks, kThreadsPerBlock, 0, stream>>>(
                      params, static_cast<T *>(compute), grads, m, v, chunks, s.scalars, hyper));
  }
  CUDA_CHECK_LAUNCH();
}

void to_compute_cuda(DType dt, void *dst, const float *src, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  SWIN_DISPATCH(dt, T,
                to_compute_kernel<T>
                <<<blocks_for(n, kThreadsPerBlock), kThreadsPerBlock, 0, stream>>>(
                    static_cast<T *>(dst), src, n));
  CUDA_CHECK_LAUNCH();
}
