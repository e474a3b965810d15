// adamw.cu: the CUDA AdamW update of optim/adamw.h, one fused elementwise pass: each element's
// gradient, moments and weight are read and written once (5 streams of n floats), 16 bytes at a
// time when all four arrays are 16-byte aligned.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "optim/adamw.h"
#include "src/cuda_util.h"

namespace {

using namespace swin_cuda;

constexpr int kThreadsPerBlock = 256;

// What one step needs per element; the step-dependent factors are computed once on the host.
struct AdamWStep {
  float beta1, beta2, eps;
  float decay;       // 1 - lr * wd: decoupled decay, applied before the Adam step as torch does
  float step_size;   // lr / (1 - beta1^t)
  float bias2_sqrt;  // sqrt(1 - beta2^t)
  float grad_scale;
};

// The CPU's element update, written the same way.
__device__ __forceinline__ void adamw_element(float &p, float grad, float &m, float &v,
                                              const AdamWStep &s) {
  float g = grad * s.grad_scale;
  float mi = s.beta1 * m + (1.0f - s.beta1) * g;
  float vi = s.beta2 * v + (1.0f - s.beta2) * g * g;
  m = mi;
  v = vi;
  p = p * s.decay - s.step_size * mi / (sqrtf(vi) / s.bias2_sqrt + s.eps);
}

// One thread per VEC consecutive elements, the ragged tail one float at a time; VEC is 4 only
// when every pointer is 16-byte aligned.
template <int VEC>
__global__ void __launch_bounds__(kThreadsPerBlock)
    adamw_kernel(float *__restrict__ param, const float *__restrict__ grad, float *__restrict__ m,
                 float *__restrict__ v, int64_t n, AdamWStep s) {
  int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  if (VEC == 4 && i + 4 <= n) {
    float4 p4 = *reinterpret_cast<float4 *>(param + i);
    float4 g4 = *reinterpret_cast<const float4 *>(grad + i);
    float4 m4 = *reinterpret_cast<float4 *>(m + i);
    float4 v4 = *reinterpret_cast<float4 *>(v + i);
    adamw_element(p4.x, g4.x, m4.x, v4.x, s);
    adamw_element(p4.y, g4.y, m4.y, v4.y, s);
    adamw_element(p4.z, g4.z, m4.z, v4.z, s);
    adamw_element(p4.w, g4.w, m4.w, v4.w, s);
    *reinterpret_cast<float4 *>(param + i) = p4;
    *reinterpret_cast<float4 *>(m + i) = m4;
    *reinterpret_cast<float4 *>(v + i) = v4;
  } else {
    for (int64_t end = i + VEC < n ? i + VEC : n; i < end; i++) {
      float p = param[i], mi = m[i], vi = v[i];
      adamw_element(p, grad[i], mi, vi, s);
      param[i] = p;
      m[i] = mi;
      v[i] = vi;
    }
  }
}

}  // namespace

void adamw_update_cuda(float *param, const float *grad, float *m, float *v, int64_t n,
                       AdamWHyper hyper, int64_t step, float grad_scale, cudaStream_t stream) {
  if (n <= 0) return;
  // Bias corrections in double, exactly as adamw_update_cpu: at step 1e5 beta2^t is within a
  // few ulps of 0 in float, and 1 - beta2^t for small t loses digits in float.
  double bias1 = 1.0 - pow((double)hyper.beta1, (double)step);
  double bias2 = 1.0 - pow((double)hyper.beta2, (double)step);
  AdamWStep s;
  s.beta1 = hyper.beta1;
  s.beta2 = hyper.beta2;
  s.eps = hyper.eps;
  s.decay = 1.0f - hyper.lr * hyper.weight_decay;
  s.step_size = (float)((double)hyper.lr / bias1);
  s.bias2_sqrt = (float)sqrt(bias2);
  s.grad_scale = grad_scale;
  const bool vec4 = aligned16(param) && aligned16(grad) && aligned16(m) && aligned16(v);
  const int vec = vec4 ? 4 : 1;
  const int64_t per_block = (int64_t)kThreadsPerBlock * vec;
  const unsigned blocks = (unsigned)((n + per_block - 1) / per_block);
  if (vec4) {
    adamw_kernel<4><<<blocks, kThreadsPerBlock, 0, stream>>>(param, grad, m, v, n, s);
  } else {
    adamw_kernel<1><<<blocks, kThreadsPerBlock, 0, stream>>>(param, grad, m, v, n, s);
  }
  CUDA_CHECK_LAUNCH();
}
