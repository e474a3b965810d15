// layernorm.cu: CUDA LayerNorm over the last dimension (kernels/layernorm.h), fp32.
//
// One warp per row: the lanes stride over the row's C values (16 bytes at a time when the
// layout allows), so every load is coalesced, and the row statistics are warp-shuffle sums,
// the same on every lane. The row is read again from L1/L2 for each pass instead of being kept
// in registers, which keeps one kernel for every C.
//
// The backward's parameter gradients are sums over all N rows. Floating-point atomics would
// make their last bits depend on timing, so each block instead owns a fixed range of rows, each
// of its warps accumulates its rows' dout * xhat and dout in its own shared-memory copy (one
// lane per column, no races), the block adds its warps in warp order into its slot of scratch,
// and a second kernel adds the blocks' slots in block order. The partition depends only on
// (N, C), so dweight and dbias are bitwise the same run after run.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/common.cuh"
#include "kernels/layernorm.h"
#include "src/cuda_util.h"

namespace {

using namespace swin_cuda;

constexpr int kWarp = 32;
constexpr int kForwardWarpsPerBlock = 8;
constexpr int kForwardThreads = kForwardWarpsPerBlock * kWarp;
// Shared memory a block may use without opting in.
constexpr int kDefaultSharedBytes = 48 * 1024;
// The backward's warps per block: at most 8, fewer when 8 warps' accumulators (2C floats each)
// would not fit in the default shared memory (C > 768).
constexpr int kBackwardMaxWarps = 8;
constexpr int kBackwardMaxThreads = kBackwardMaxWarps * kWarp;
// Upper bound on the backward's row blocks, so the partial sums (2C floats per block) stay small
// next to the rows themselves; past 1024 * 8 rows each warp takes several rows.
constexpr int64_t kBackwardMaxBlocks = 1024;
// The reduction of the partials: 32 columns per block, 32 thread rows splitting the partials.
constexpr int kReduceRows = 32;
constexpr int kReduceThreads = kWarp * kReduceRows;

// VEC consecutive floats at p (16-byte aligned when VEC == 4).
template <int VEC>
__device__ __forceinline__ void load_vec(float (&v)[VEC], const float *p) {
  if constexpr (VEC == 4) {
    float4 t = *reinterpret_cast<const float4 *>(p);
    v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
  } else {
    for (int k = 0; k < VEC; k++) v[k] = p[k];
  }
}
template <int VEC>
__device__ __forceinline__ void store_vec(float *p, const float (&v)[VEC]) {
  if constexpr (VEC == 4) {
    *reinterpret_cast<float4 *>(p) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
    for (int k = 0; k < VEC; k++) p[k] = v[k];
  }
}

// ---- forward --------------------------------------------------------------------------------
// Two passes over the row (mean, then squared deviations from it) as on the CPU, avoiding the
// cancellation of E[x^2] - E[x]^2; a third pass writes the output. VEC is 4 only when C % 4 == 0
// and inp, out, weight, bias are 16-byte aligned, so lane offsets c stay inside the row.
template <int VEC>
__global__ void __launch_bounds__(kForwardThreads)
    layernorm_forward_kernel(float *__restrict__ out, float *__restrict__ mean,
                             float *__restrict__ rstd, const float *__restrict__ inp,
                             const float *__restrict__ weight, const float *__restrict__ bias,
                             int64_t N, int C) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = (int64_t)blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (row >= N) return;  // whole warps leave together; no block-wide synchronization follows
  const float *x = inp + row * C;
  float *y = out + row * C;

  float sum = 0.0f;
  for (int c = lane * VEC; c < C; c += kWarp * VEC) {
    float xv[VEC];
    load_vec<VEC>(xv, x + c);
    for (int k = 0; k < VEC; k++) sum += xv[k];
  }
  const float m = warp_sum(sum) / C;
  float sq = 0.0f;
  for (int c = lane * VEC; c < C; c += kWarp * VEC) {
    float xv[VEC];
    load_vec<VEC>(xv, x + c);
    for (int k = 0; k < VEC; k++) {
      float d = xv[k] - m;
      sq += d * d;
    }
  }
  // IEEE sqrt and division (nvcc's defaults without --use_fast_math): rstd within an ulp.
  const float r = 1.0f / sqrtf(warp_sum(sq) / C + LAYERNORM_EPS);
  for (int c = lane * VEC; c < C; c += kWarp * VEC) {
    float xv[VEC], wv[VEC], bv[VEC], yv[VEC];
    load_vec<VEC>(xv, x + c);
    load_vec<VEC>(wv, weight + c);
    load_vec<VEC>(bv, bias + c);
    for (int k = 0; k < VEC; k++) yv[k] = (xv[k] - m) * r * wv[k] + bv[k];
    store_vec<VEC>(y + c, yv);
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// ---- backward -------------------------------------------------------------------------------
// The fixed partition of the backward: `warps` warps per block, `rows_per_block` consecutive
// rows per block, `blocks` blocks. Everything is a function of (N, C) alone.
struct BackwardPlan {
  int warps;
  int64_t rows_per_block, blocks;
  size_t shared_bytes;  // per block: `warps` accumulator pairs of C floats
};

BackwardPlan backward_plan(int64_t N, int C) {
  BackwardPlan p;
  int64_t fit = kDefaultSharedBytes / (2 * (int64_t)C * (int64_t)sizeof(float));
  p.warps = fit < 1 ? 1 : fit > kBackwardMaxWarps ? kBackwardMaxWarps : (int)fit;
  int64_t max_rows = (int64_t)p.warps * kBackwardMaxBlocks;
  int64_t rows_per_warp = N > max_rows ? (N + max_rows - 1) / max_rows : 1;
  p.rows_per_block = rows_per_warp * p.warps;
  p.blocks = (N + p.rows_per_block - 1) / p.rows_per_block;
  p.shared_bytes = (size_t)p.warps * 2 * (size_t)C * sizeof(float);
  return p;
}

// dinp = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * weight, per row (as the CPU);
// partial[block] (2C) = this block's rows' sums of dout * xhat (C) then of dout (C).
// Warp w of a block takes rows begin + w, begin + w + warps, ...; lane l owns columns
// l*VEC + j*32*VEC + k of its warp's accumulators, so only that lane ever touches them.
template <int VEC>
__global__ void __launch_bounds__(kBackwardMaxThreads)
    layernorm_backward_kernel(float *__restrict__ dinp, float *__restrict__ partial,
                              const float *__restrict__ dout, const float *__restrict__ inp,
                              const float *__restrict__ weight, const float *__restrict__ mean,
                              const float *__restrict__ rstd, int64_t N, int C,
                              int64_t rows_per_block) {
  extern __shared__ float4 shared_f4[];  // float4: 16-byte alignment for the VEC == 4 accesses
  float *acc_all = reinterpret_cast<float *>(shared_f4);
  const int warps = blockDim.x / kWarp, warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  float *acc_dw = acc_all + (size_t)warp * 2 * C, *acc_db = acc_dw + C;
  for (int c = lane * VEC; c < C; c += kWarp * VEC) {
    for (int k = 0; k < VEC; k++) acc_dw[c + k] = acc_db[c + k] = 0.0f;
  }

  const int64_t row_begin = (int64_t)blockIdx.x * rows_per_block;
  const int64_t row_end = row_begin + rows_per_block < N ? row_begin + rows_per_block : N;
  for (int64_t row = row_begin + warp; row < row_end; row += warps) {
    const float *x = inp + row * C, *dy = dout + row * C;
    float *dx = dinp + row * C;
    const float m = mean[row], r = rstd[row];
    float sum_g = 0.0f, sum_gx = 0.0f;
    for (int c = lane * VEC; c < C; c += kWarp * VEC) {
      float xv[VEC], dyv[VEC], wv[VEC], dwv[VEC], dbv[VEC];
      load_vec<VEC>(xv, x + c);
      load_vec<VEC>(dyv, dy + c);
      load_vec<VEC>(wv, weight + c);
      load_vec<VEC>(dwv, acc_dw + c);
      load_vec<VEC>(dbv, acc_db + c);
      for (int k = 0; k < VEC; k++) {
        float xhat = (xv[k] - m) * r;
        float g = dyv[k] * wv[k];
        sum_g += g;
        sum_gx += g * xhat;
        dwv[k] += dyv[k] * xhat;
        dbv[k] += dyv[k];
      }
      store_vec<VEC>(acc_dw + c, dwv);
      store_vec<VEC>(acc_db + c, dbv);
    }
    const float mean_g = warp_sum(sum_g) / C, mean_gx = warp_sum(sum_gx) / C;
    for (int c = lane * VEC; c < C; c += kWarp * VEC) {
      float xv[VEC], dyv[VEC], wv[VEC], dxv[VEC];
      load_vec<VEC>(xv, x + c);
      load_vec<VEC>(dyv, dy + c);
      load_vec<VEC>(wv, weight + c);
      for (int k = 0; k < VEC; k++) {
        float xhat = (xv[k] - m) * r;
        dxv[k] = r * (dyv[k] * wv[k] - mean_g - xhat * mean_gx);
      }
      store_vec<VEC>(dx + c, dxv);
    }
  }

  // Every thread reaches this barrier: the row loop above has no early exit.
  __syncthreads();
  float *slot = partial + (int64_t)blockIdx.x * 2 * C;
  for (int c = threadIdx.x; c < 2 * C; c += blockDim.x) {
    float s = 0.0f;
    for (int w = 0; w < warps; w++) s += acc_all[(size_t)w * 2 * C + c];
    slot[c] = s;
  }
}

// dweight += sum over blocks of partial[.][0:C], dbias += of partial[.][C:2C], in double and in
// a fixed order: thread row ty adds blocks ty, ty + 32, ... in order, then thread row 0 adds the
// 32 thread rows in order. Block (32, 32), one block per 32 of the 2C columns.
__global__ void __launch_bounds__(kReduceThreads)
    layernorm_param_grad_reduce_kernel(float *__restrict__ dweight, float *__restrict__ dbias,
                                       const float *__restrict__ partial, int64_t blocks, int C) {
  __shared__ double rows[kReduceRows][kWarp];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int col = blockIdx.x * kWarp + tx;
  double s = 0.0;
  if (col < 2 * C) {
    for (int64_t p = ty; p < blocks; p += kReduceRows) s += partial[p * 2 * C + col];
  }
  rows[ty][tx] = s;
  __syncthreads();
  if (ty == 0 && col < 2 * C) {
    double total = 0.0;
    for (int y = 0; y < kReduceRows; y++) total += rows[y][tx];
    if (col < C)
      dweight[col] += (float)total;
    else
      dbias[col - C] += (float)total;
  }
}

}  // namespace

void layernorm_forward_cuda(float *out, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int64_t N, int C,
                            cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  const int threads = kForwardThreads;
  const unsigned blocks = (unsigned)((N + kForwardWarpsPerBlock - 1) / kForwardWarpsPerBlock);
  if (C % 4 == 0 && aligned16(out) && aligned16(inp) && aligned16(weight) && aligned16(bias)) {
    layernorm_forward_kernel<4>
        <<<blocks, threads, 0, stream>>>(out, mean, rstd, inp, weight, bias, N, C);
  } else {
    layernorm_forward_kernel<1>
        <<<blocks, threads, 0, stream>>>(out, mean, rstd, inp, weight, bias, N, C);
  }
  CUDA_CHECK_LAUNCH();
}

int64_t layernorm_backward_cuda_scratch(int64_t N, int C) {
  if (N <= 0 || C <= 0) return 0;
  return backward_plan(N, C).blocks * 2 * (int64_t)C;
}

template <int VEC>
static void layernorm_backward_launch(const BackwardPlan &p, float *dinp, float *scratch,
                                      const float *dout, const float *inp, const float *weight,
                                      const float *mean, const float *rstd, int64_t N, int C,
                                      cudaStream_t stream) {
  // Past 48 KiB (C > 6144: one warp's accumulators alone) the block must opt in to more.
  if (p.shared_bytes > (size_t)kDefaultSharedBytes) {
    CUDA_CHECK(cudaFuncSetAttribute(layernorm_backward_kernel<VEC>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)p.shared_bytes));
  }
  layernorm_backward_kernel<VEC><<<(unsigned)p.blocks, p.warps * kWarp, p.shared_bytes, stream>>>(
      dinp, scratch, dout, inp, weight, mean, rstd, N, C, p.rows_per_block);
  CUDA_CHECK_LAUNCH();
}

void layernorm_backward_cuda(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, const float *mean,
                             const float *rstd, int64_t N, int C, float *scratch,
                             cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  const BackwardPlan p = backward_plan(N, C);
  if (C % 4 == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) && aligned16(weight)) {
    layernorm_backward_launch<4>(p, dinp, scratch, dout, inp, weight, mean, rstd, N, C, stream);
  } else {
    layernorm_backward_launch<1>(p, dinp, scratch, dout, inp, weight, mean, rstd, N, C, stream);
  }
  const unsigned reduce_blocks = (unsigned)((2 * (int64_t)C + kWarp - 1) / kWarp);
  layernorm_param_grad_reduce_kernel<<<reduce_blocks, dim3(kWarp, kReduceRows), 0, stream>>>(
      dweight, dbias, scratch, p.blocks, C);
  CUDA_CHECK_LAUNCH();
}
