// layernorm_postnorm.cu: the res-post-norm residual of Swin V2 on CUDA (kernels/layernorm.h,
// postnorm_residual_{forward,backward}): x_out = x_in + scale * LN(branch), with the branch, the
// windowed copy of the output and the incoming gradient each addressed through its window map.
// kernels/cpu/layernorm.c is the spec.
//
// One strategy: one warp per token row, which re-reads the row for each pass (from L1/L2), with
// 16-byte vectors where every row start is aligned (else one element at a time), as the
// multi-pass residual + LayerNorm kernels (layernorm_multipass.cu) do. Any C works; Swin-L's
// last stage (C = 1536) is 12 vectors per lane in bf16. Row statistics are warp shuffle sums in
// fp32, the same on every lane.
//
// The backward's parameter gradients (dweight, dbias, and dbranch's column sums, the bias
// gradient of the layer that produced the branch) follow the fixed partition of backward_plan:
// each block owns a range of rows, each warp accumulates its rows in its own shared-memory copy,
// the block adds its warps in order into its slot of scratch, and launch_part_reduce adds the
// slots in block order: bitwise the same run after run on one kind of GPU.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/layernorm.cuh"

using namespace swin_cuda;
using namespace swin_cuda::layernorm;

namespace {

// ---- forward ----------------------------------------------------------------------------------
// Row t: the statistics of branch[bmap(t)] in two passes (mean, then squared deviations), then
// v = x_in[t] + s * LN(branch row), stored to x_out[t] and, with xw_out, to xw_out[omap(t)]
// (the same rounding of the same value: the same bits). x_out may be x_in: each element is read
// before it is written, by the same thread.
template <typename T, int VEC>
__global__ void __launch_bounds__(kForwardThreads)
    postnorm_residual_forward_kernel(T *x_out, T *__restrict__ xw_out, float *__restrict__ mean,
                                     float *__restrict__ rstd, const T *x_in,
                                     const T *__restrict__ branch, RowMap bmap,
                                     const float *__restrict__ scale,
                                     const float *__restrict__ weight,
                                     const float *__restrict__ bias, RowMap omap, int64_t N,
                                     int64_t L, int C) {
  const int lane = threadIdx.x % kWarp;
  const int64_t t = (int64_t)blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (t >= N) return;  // whole warps leave together; no block-wide synchronization follows
  const T *br = branch + mapped_row(bmap, t, L) * C;
  float sum = 0.0f;
  for (int c = lane * VEC; c < C; c += kWarp * VEC) {
    float v[VEC];
    load_vec<T, VEC>(v, br + c);
#pragma unroll
    for (int k = 0; k < VEC; k++) sum += v[k];
  }
  const float m = warp_sum(sum) / C;
  float sq = 0.0f;
  for (int c = lane * VEC; c < C; c += kWarp * VEC) {
    float v[VEC];
    load_vec<T, VEC>(v, br + c);
#pragma unroll
    for (int k = 0; k < VEC; k++) sq += (v[k] - m) * (v[k] - m);
  }
  // IEEE sqrt and division (nvcc's defaults without --use_fast_math): rstd within an ulp.
  const float r = 1.0f / sqrtf(warp_sum(sq) / C + LAYERNORM_EPS);
  const float s = scale ? scale[image_of(bmap, t, L)] : 1.0f;
  const T *xi = x_in ? x_in + t * C : nullptr;
  T *xo = x_out + t * C;
  T *xw = xw_out ? xw_out + mapped_row(omap, t, L) * C : nullptr;
  for (int c = lane * VEC; c < C; c += kWarp * VEC) {
    float v[VEC], res[VEC];
    load_vec<T, VEC>(v, br + c);
    if (xi) load_vec<T, VEC>(res, xi + c);
#pragma unroll
    for (int k = 0; k < VEC; k++) {
      const float n = (v[k] - m) * r * weight[c + k] + bias[c + k];
      v[k] = xi ? res[k] + s * n : s * n;
    }
    store_vec<T, VEC>(xo + c, v);
    if (xw) store_vec<T, VEC>(xw + c, v);
  }
  if (lane == 0) {
    mean[t] = m;
    rstd[t] = r;
  }
}

// ---- backward ---------------------------------------------------------------------------------
// Row t: g = dres_in[t] + dx[xmap(t)] (either may be absent), written to dres_out[t]; u = s * g
// is the gradient of LN(branch row); dbranch[bmap(t)] = rstd * (gy - mean(gy) - xhat *
// mean(gy * xhat)) with gy = u * weight (the CPU's formula). The first pass forms g, stores it and
// takes the row sums (and the dweight / dbias terms u * xhat, u); the second reads g back from
// dres_out when there is one (dres_out may be dres_in, already overwritten by then, by the same
// thread) or forms it again. With param_sums the warp accumulates dweight and dbias (parts 0, 1 of
// kResidualParts), with sum_branch the column sums of dbranch as stored (part 2).
template <typename T, int VEC>
__global__ void __launch_bounds__(kBackwardMaxThreads) postnorm_residual_backward_kernel(
    float *dres_out, T *__restrict__ dbranch, float *__restrict__ partial, const float *dres_in,
    const T *__restrict__ dx, RowMap xmap, const T *__restrict__ branch,
    const float *__restrict__ weight, const float *__restrict__ mean,
    const float *__restrict__ rstd, RowMap bmap, const float *__restrict__ scale, int64_t N,
    int64_t L, int C, int64_t rows_per_block, bool param_sums, bool sum_branch) {
  extern __shared__ float4 shared_f4[];  // float4: 16-byte alignment
  float *acc_all = reinterpret_cast<float *>(shared_f4);
  const int warps = blockDim.x / kWarp, warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  float *acc_dw = acc_all + (size_t)warp * kResidualParts * C, *acc_db = acc_dw + C;
  float *acc_ds = acc_db + C;
  const bool sums = param_sums || sum_branch;
  if (sums) zero_accumulators(acc_dw, C, kResidualParts);

  const int64_t row_begin = (int64_t)blockIdx.x * rows_per_block;
  const int64_t row_end = row_begin + rows_per_block < N ? row_begin + rows_per_block : N;
  for (int64_t t = row_begin + warp; t < row_end; t += warps) {
    const float m = mean[t], r = rstd[t];
    const float s = scale ? scale[image_of(bmap, t, L)] : 1.0f;
    const int64_t brow = mapped_row(bmap, t, L) * C;
    const T *x = branch + brow;
    const T *d = dx ? dx + mapped_row(xmap, t, L) * C : nullptr;
    const float *res = dres_in ? dres_in + t * C : nullptr;
    float *g_out = dres_out ? dres_out + t * C : nullptr;
    float sum_g = 0.0f, sum_gx = 0.0f;
    for (int c = lane * VEC; c < C; c += kWarp * VEC) {
      float g[VEC], xv[VEC];
#pragma unroll
      for (int k = 0; k < VEC; k++) g[k] = 0.0f;
      if (res) load_vec<float, VEC>(g, res + c);
      if (d) {
        float dv[VEC];
        load_vec<T, VEC>(dv, d + c);
#pragma unroll
        for (int k = 0; k < VEC; k++) g[k] += dv[k];
      }
      if (g_out) store_vec<float, VEC>(g_out + c, g);
      load_vec<T, VEC>(xv, x + c);
#pragma unroll
      for (int k = 0; k < VEC; k++) {
        const float u = s * g[k], xhat = (xv[k] - m) * r, gy = u * weight[c + k];
        sum_g += gy;
        sum_gx += gy * xhat;
        if (param_sums) {
          acc_dw[c + k] += u * xhat;
          acc_db[c + k] += u;
        }
      }
    }
    const float mean_g = warp_sum(sum_g) / C, mean_gx = warp_sum(sum_gx) / C;
    T *db = dbranch + brow;
    for (int c = lane * VEC; c < C; c += kWarp * VEC) {
      float g[VEC], xv[VEC], out[VEC];
      if (g_out) {
        load_vec<float, VEC>(g, g_out + c);
      } else {
#pragma unroll
        for (int k = 0; k < VEC; k++) g[k] = 0.0f;
        if (res) load_vec<float, VEC>(g, res + c);
        if (d) {
          float dv[VEC];
          load_vec<T, VEC>(dv, d + c);
#pragma unroll
          for (int k = 0; k < VEC; k++) g[k] += dv[k];
        }
      }
      load_vec<T, VEC>(xv, x + c);
#pragma unroll
      for (int k = 0; k < VEC; k++) {
        const float xhat = (xv[k] - m) * r;
        out[k] = r * (s * g[k] * weight[c + k] - mean_g - xhat * mean_gx);
      }
      store_vec<T, VEC>(db + c, out);
      if (sum_branch) {
#pragma unroll
        for (int k = 0; k < VEC; k++) acc_ds[c + k] += round_to<T>(out[k]);
      }
    }
  }
  if (sums) store_block_partial(partial, acc_all, C, kResidualParts);
}

// Launch configuration: the forward one warp per row, kForwardWarpsPerBlock rows per block; the
// backward backward_plan's partition (rows per block, warps per block, their shared memory).
template <typename T>
void launch_forward(T *xo, T *xw, float *mean, float *rstd, const T *xi, const T *br, RowMap bmap,
                    const float *scale, const float *weight, const float *bias, RowMap omap,
                    int64_t N, int64_t L, int C, cudaStream_t stream) {
  const unsigned blocks = (unsigned)((N + kForwardWarpsPerBlock - 1) / kForwardWarpsPerBlock);
  if (can_vectorize<T>(C, {xo, xw, xi, br}))
    postnorm_residual_forward_kernel<T, kVec16<T>><<<blocks, kForwardThreads, 0, stream>>>(
        xo, xw, mean, rstd, xi, br, bmap, scale, weight, bias, omap, N, L, C);
  else
    postnorm_residual_forward_kernel<T, 1><<<blocks, kForwardThreads, 0, stream>>>(
        xo, xw, mean, rstd, xi, br, bmap, scale, weight, bias, omap, N, L, C);
}

template <typename T>
BackwardPlan launch_backward(float *dres_out, T *dbr, float *scratch, const float *dres_in,
                             const T *dx, RowMap xmap, const T *br, const float *weight,
                             const float *mean, const float *rstd, RowMap bmap, const float *scale,
                             int64_t N, int64_t L, int C, bool param_sums, bool sum_branch,
                             cudaStream_t stream) {
  const BackwardPlan p = backward_plan(N, C, kResidualParts);
  const size_t shared = param_sums || sum_branch ? p.shared_bytes : 0;
  auto kernel = can_vectorize<T>(C, {dbr, dx, br, dres_in, dres_out})
                    ? postnorm_residual_backward_kernel<T, kVec16<T>>
                    : postnorm_residual_backward_kernel<T, 1>;
  allow_shared(kernel, shared);
  kernel<<<(unsigned)p.blocks, p.warps * kWarp, shared, stream>>>(
      dres_out, dbr, scratch, dres_in, dx, xmap, br, weight, mean, rstd, bmap, scale, N, L, C,
      p.rows_per_block, param_sums, sum_branch);
  return p;
}

}  // namespace

void postnorm_residual_forward_cuda(DType dt, void *x_out, void *xw_out, float *mean, float *rstd,
                                    const void *x_in, const void *branch,
                                    const WindowMap *branch_map, const float *scale,
                                    const float *weight, const float *bias,
                                    const WindowMap *out_map, int B, int64_t L, int C,
                                    cudaStream_t stream) {
  const int64_t N = (int64_t)B * L;
  if (N <= 0 || C <= 0) return;
  if (!x_out || !branch) {
    fprintf(stderr, "postnorm_residual_forward_cuda: x_out and branch are required\n");
    abort();
  }
  const RowMap bmap = row_map(branch_map, L, N), omap = row_map(out_map, L, N);
  SWIN_DISPATCH(dt, T,
                launch_forward<T>(static_cast<T *>(x_out), static_cast<T *>(xw_out), mean, rstd,
                                  static_cast<const T *>(x_in), static_cast<const T *>(branch),
                                  bmap, scale, weight, bias, omap, N, L, C, stream));
  CUDA_CHECK_LAUNCH();
}

int64_t postnorm_residual_backward_cuda_scratch(int64_t rows, int C) {
  if (rows <= 0 || C <= 0) return 0;
  return backward_plan(rows, C, kResidualParts).blocks * kResidualParts * (int64_t)C;
}

void postnorm_residual_backward_cuda(DType dt, float *dres_out, void *dbranch, float *dbranch_bias,
                                     float *dweight, float *dbias, const float *dres_in,
                                     const void *dx, const WindowMap *x_map, const void *branch,
                                     const float *weight, const float *mean, const float *rstd,
                                     const WindowMap *branch_map, const float *scale, int B,
                                     int64_t L, int C, float *scratch, cudaStream_t stream) {
  const int64_t N = (int64_t)B * L;
  if (N <= 0 || C <= 0) return;
  if (!dbranch || !branch) {
    fprintf(stderr, "postnorm_residual_backward_cuda: dbranch and branch are required\n");
    abort();
  }
  const bool param_sums = dweight || dbias, sum_branch = dbranch_bias != nullptr;
  if ((param_sums || sum_branch) && !scratch) {
    fprintf(stderr,
            "postnorm_residual_backward_cuda: parameter gradients need scratch (%lld floats)\n"
            "HINT: allocate postnorm_residual_backward_cuda_scratch(B * L, C) floats on the "
            "device\n",
            (long long)postnorm_residual_backward_cuda_scratch(N, C));
    abort();
  }
  const RowMap xmap = row_map(x_map, L, N), bmap = row_map(branch_map, L, N);
  BackwardPlan p = {};
  SWIN_DISPATCH(dt, T,
                p = launch_backward<T>(dres_out, static_cast<T *>(dbranch), scratch, dres_in,
                                       static_cast<const T *>(dx), xmap,
                                       static_cast<const T *>(branch), weight, mean, rstd, bmap,
                                       scale, N, L, C, param_sums, sum_branch, stream));
  CUDA_CHECK_LAUNCH();
  // Parts 0 and 1 (dweight, dbias) with param_sums, part 2 (dbranch's columns) with sum_branch.
  if (param_sums || sum_branch)
    launch_part_reduce(PartOutputs{{dweight, dbias, dbranch_bias}}, scratch, p.blocks, C,
                       kResidualParts, param_sums ? 0 : 2, sum_branch ? 3 : 2, stream);
}
