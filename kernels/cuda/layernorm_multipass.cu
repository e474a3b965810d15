// layernorm_multipass.cu: the multi-pass LayerNorm kernels, residual + LayerNorm and patch
// merging + LayerNorm, forward and backward: one warp per row, re-read for each pass, serving
// every row the register kernels (layernorm_register.cu) do not; with their launchers.
#include <cstdint>

#include "kernels/cuda/layernorm.cuh"

namespace swin_cuda::layernorm {
namespace {

// Upper bound on the multi-pass backward's row blocks, so the partial sums (a few C floats per
// block) stay small next to the rows themselves; past that each warp takes several rows: two
// full waves at 3 resident 256-thread blocks per SM (792 on the H200's 132 SMs; 1024 ran 2.54
// waves in Swin-T's stage 0, the last one half empty, Nsight Compute). Large maps reach the
// bound and then fill the waves; fixed per device, so the partition depends on the shapes and
// the SM count only. (The register backward sizes its waves by its shapes' residency:
// reg_backward_plan.)
int64_t backward_max_blocks() {
  return 2 * 3 * (int64_t)device_sm_count();
}

// ---- residual + LayerNorm, forward ------------------------------------------------------------
// Row t: v = x_in[t] + scale[b] * branch[bmap(t)] rounded to T (written to x_out[t]) or x_in[t];
// two passes for the statistics (mean, then squared deviations from it, as the CPU: no
// cancellation of E[x^2] - E[x]^2), a third writes LN(v) to ln_out[lmap(t)].
template <typename T, int VEC>
__global__ void __launch_bounds__(kForwardThreads)
    residual_layernorm_forward_kernel(T *x_out, T *__restrict__ ln_out, float *__restrict__ mean,
                                      float *__restrict__ rstd, const T *x_in,
                                      const T *__restrict__ branch, RowMap bmap,
                                      const float *__restrict__ scale,
                                      const float *__restrict__ weight,
                                      const float *__restrict__ bias, RowMap lmap, int64_t N,
                                      int64_t L, int C) {
  const int lane = threadIdx.x % kWarp;
  const int64_t t = (int64_t)blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (t >= N) return;  // whole warps leave together; no block-wide synchronization follows
  const T *src = x_in + t * C;
  if (branch) {
    const T *br = branch + mapped_row(bmap, t, L) * C;
    T *dst = x_out + t * C;
    const float s = scale ? scale[image_of(bmap, t, L)] : 1.0f;
    for (int c = lane * VEC; c < C; c += kWarp * VEC) {
      float xv[VEC], bv[VEC];
      load_vec<T, VEC>(xv, src + c);
      load_vec<T, VEC>(bv, br + c);
#pragma unroll
      for (int k = 0; k < VEC; k++) xv[k] = xv[k] + s * bv[k];
      store_vec<T, VEC>(dst + c, xv);
    }
    src = dst;  // LayerNorm reads the sum as stored
  }
  if (!ln_out) return;

  float sum = 0.0f;
  for (int c = lane * VEC; c < C; c += kWarp * VEC) {
    float xv[VEC];
    load_vec<T, VEC>(xv, src + c);
#pragma unroll
    for (int k = 0; k < VEC; k++) sum += xv[k];
  }
  const float m = warp_sum(sum) / C;
  float sq = 0.0f;
  for (int c = lane * VEC; c < C; c += kWarp * VEC) {
    float xv[VEC];
    load_vec<T, VEC>(xv, src + c);
#pragma unroll
    for (int k = 0; k < VEC; k++) {
      float d = xv[k] - m;
      sq += d * d;
    }
  }
  // IEEE sqrt and division (nvcc's defaults without --use_fast_math): rstd within an ulp.
  const float r = 1.0f / sqrtf(warp_sum(sq) / C + LAYERNORM_EPS);
  T *y = ln_out + mapped_row(lmap, t, L) * C;
  for (int c = lane * VEC; c < C; c += kWarp * VEC) {
    float xv[VEC], yv[VEC];
    load_vec<T, VEC>(xv, src + c);
#pragma unroll
    for (int k = 0; k < VEC; k++) yv[k] = (xv[k] - m) * r * weight[c + k] + bias[c + k];
    store_vec<T, VEC>(y + c, yv);
  }
  if (lane == 0) {
    mean[t] = m;
    rstd[t] = r;
  }
}

// ---- residual + LayerNorm, backward -----------------------------------------------------------
// Row t: g = dres_in[t] + rstd * (gy - mean(gy) - xhat * mean(gy * xhat)), gy = dln[lmap(t)] *
// weight (the CPU's formula); dres_out[t] = g, dbranch[bmap(t)] = scale[b] * g. Without dln the
// LayerNorm term and the parameter gradients are absent. With sum_branch the block's slot of
// partial also gets the column sums of dbranch as stored (part 2 of kResidualParts; parts 0 and
// 1 are dweight and dbias). dres_in and dres_out may be the same array (each element is read
// before it is written, by the same thread).
template <typename T, int VEC>
__global__ void __launch_bounds__(kBackwardMaxThreads)
    residual_layernorm_backward_kernel(float *dres_out, T *__restrict__ dbranch,
                                       float *__restrict__ partial, const float *dres_in,
                                       const T *__restrict__ dln, const T *__restrict__ x,
                                       const float *__restrict__ weight,
                                       const float *__restrict__ mean,
                                       const float *__restrict__ rstd, RowMap bmap,
                                       const float *__restrict__ scale, RowMap lmap, int64_t N,
                                       int64_t L, int C, int64_t rows_per_block, bool sum_branch) {
  extern __shared__ float4 shared_f4[];  // float4: 16-byte alignment
  float *acc_all = reinterpret_cast<float *>(shared_f4);
  const int warps = blockDim.x / kWarp, warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  float *acc_dw = acc_all + (size_t)warp * kResidualParts * C, *acc_db = acc_dw + C;
  float *acc_ds = acc_db + C;
  const bool sums = dln || sum_branch;
  if (sums) zero_accumulators(acc_dw, C, kResidualParts);

  const int64_t row_begin = (int64_t)blockIdx.x * rows_per_block;
  const int64_t row_end = row_begin + rows_per_block < N ? row_begin + rows_per_block : N;
  for (int64_t t = row_begin + warp; t < row_end; t += warps) {
    float mean_g = 0.0f, mean_gx = 0.0f, m = 0.0f, r = 0.0f;
    const T *xr = x ? x + t * C : nullptr;
    const T *dy = dln ? dln + mapped_row(lmap, t, L) * C : nullptr;
    if (dln) {
      m = mean[t];
      r = rstd[t];
      float sum_g = 0.0f, sum_gx = 0.0f;
      for (int c = lane * VEC; c < C; c += kWarp * VEC) {
        float xv[VEC], dyv[VEC];
        load_vec<T, VEC>(xv, xr + c);
        load_vec<T, VEC>(dyv, dy + c);
#pragma unroll
        for (int k = 0; k < VEC; k++) {
          float xhat = (xv[k] - m) * r;
          float g = dyv[k] * weight[c + k];
          sum_g += g;
          sum_gx += g * xhat;
          acc_dw[c + k] += dyv[k] * xhat;
          acc_db[c + k] += dyv[k];
        }
      }
      mean_g = warp_sum(sum_g) / C;
      mean_gx = warp_sum(sum_gx) / C;
    }
    const float s = scale ? scale[image_of(bmap, t, L)] : 1.0f;
    T *db = dbranch ? dbranch + mapped_row(bmap, t, L) * C : nullptr;
    for (int c = lane * VEC; c < C; c += kWarp * VEC) {
      float gv[VEC];
#pragma unroll
      for (int k = 0; k < VEC; k++) gv[k] = dres_in ? dres_in[t * C + c + k] : 0.0f;
      if (dln) {
        float xv[VEC], dyv[VEC];
        load_vec<T, VEC>(xv, xr + c);
        load_vec<T, VEC>(dyv, dy + c);
#pragma unroll
        for (int k = 0; k < VEC; k++) {
          float xhat = (xv[k] - m) * r;
          gv[k] += r * (dyv[k] * weight[c + k] - mean_g - xhat * mean_gx);
        }
      }
      if (dres_out) {
#pragma unroll
        for (int k = 0; k < VEC; k++) dres_out[t * C + c + k] = gv[k];
      }
      if (db) {
#pragma unroll
        for (int k = 0; k < VEC; k++) gv[k] *= s;
        store_vec<T, VEC>(db + c, gv);
        if (sum_branch) {
#pragma unroll
          for (int k = 0; k < VEC; k++) acc_ds[c + k] += round_to<T>(gv[k]);
        }
      }
    }
  }
  if (sums) store_block_partial(partial, acc_all, C, kResidualParts);
}

// ---- patch merging + LayerNorm ----------------------------------------------------------------
// Merged row u = (b, y, x) of (B, H/2, W/2, 4C): segment k (C values) is token (2y + dy, 2x + dx)
// with (dy, dx) = (k & 1, k >> 1), timm's order (kernels/patch.h). The multi-pass kernels here
// serve the rows the register kernels (layernorm_register.cu) cannot hold: C not a multiple of the
// vector, misaligned bases, or 4C too wide for a lane's registers.
__device__ __forceinline__ int64_t merge_source_row(int64_t u, int k, int H, int W) {
  int H2 = H / 2, W2 = W / 2;
  int64_t b = u / ((int64_t)H2 * W2), yx = u - b * H2 * W2;
  int y = 2 * (int)(yx / W2) + (k & 1), x = 2 * (int)(yx % W2) + (k >> 1);
  return (b * H + y) * W + x;
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kForwardThreads)
    merge_layernorm_forward_kernel(T *__restrict__ out, float *__restrict__ mean,
                                   float *__restrict__ rstd, const T *__restrict__ tokens,
                                   const float *__restrict__ weight, const float *__restrict__ bias,
                                   int64_t N, int H, int W, int C) {
  const int lane = threadIdx.x % kWarp;
  const int64_t u = (int64_t)blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (u >= N) return;
  const T *seg[4];
  for (int k = 0; k < 4; k++) seg[k] = tokens + merge_source_row(u, k, H, W) * C;
  const int C4 = 4 * C;
  // Element e of the merged row is seg[e / C][e % C]; a vector never crosses a segment
  // (VEC divides C).
  float sum = 0.0f;
  for (int e = lane * VEC; e < C4; e += kWarp * VEC) {
    float xv[VEC];
    load_vec<T, VEC>(xv, seg[e / C] + e % C);
#pragma unroll
    for (int k = 0; k < VEC; k++) sum += xv[k];
  }
  const float m = warp_sum(sum) / C4;
  float sq = 0.0f;
  for (int e = lane * VEC; e < C4; e += kWarp * VEC) {
    float xv[VEC];
    load_vec<T, VEC>(xv, seg[e / C] + e % C);
#pragma unroll
    for (int k = 0; k < VEC; k++) {
      float d = xv[k] - m;
      sq += d * d;
    }
  }
  const float r = 1.0f / sqrtf(warp_sum(sq) / C4 + LAYERNORM_EPS);
  T *y = out + u * C4;
  for (int e = lane * VEC; e < C4; e += kWarp * VEC) {
    float xv[VEC], yv[VEC];
    load_vec<T, VEC>(xv, seg[e / C] + e % C);
#pragma unroll
    for (int k = 0; k < VEC; k++) yv[k] = (xv[k] - m) * r * weight[e + k] + bias[e + k];
    store_vec<T, VEC>(y + e, yv);
  }
  if (lane == 0) {
    mean[u] = m;
    rstd[u] = r;
  }
}

// dtokens (f32) of the four tokens of merged row u from the LayerNorm backward of dout[u]; every
// token belongs to exactly one merged row (H, W even), so dtokens is overwritten in full.
template <typename T, int VEC>
__global__ void __launch_bounds__(kBackwardMaxThreads)
    merge_layernorm_backward_kernel(float *__restrict__ dtokens, float *__restrict__ partial,
                                    const T *__restrict__ dout, const T *__restrict__ tokens,
                                    const float *__restrict__ weight,
                                    const float *__restrict__ mean, const float *__restrict__ rstd,
                                    int64_t N, int H, int W, int C, int64_t rows_per_block) {
  extern __shared__ float4 shared_f4[];
  float *acc_all = reinterpret_cast<float *>(shared_f4);
  const int C4 = 4 * C;
  const int warps = blockDim.x / kWarp, warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  float *acc_dw = acc_all + (size_t)warp * 2 * C4, *acc_db = acc_dw + C4;
  zero_accumulators(acc_dw, C4);

  const int64_t row_begin = (int64_t)blockIdx.x * rows_per_block;
  const int64_t row_end = row_begin + rows_per_block < N ? row_begin + rows_per_block : N;
  for (int64_t u = row_begin + warp; u < row_end; u += warps) {
    int64_t rows[4];
    for (int k = 0; k < 4; k++) rows[k] = merge_source_row(u, k, H, W);
    const T *dy = dout + u * C4;
    const float m = mean[u], r = rstd[u];
    float sum_g = 0.0f, sum_gx = 0.0f;
    for (int e = lane * VEC; e < C4; e += kWarp * VEC) {
      float xv[VEC], dyv[VEC];
      load_vec<T, VEC>(xv, tokens + rows[e / C] * C + e % C);
      load_vec<T, VEC>(dyv, dy + e);
#pragma unroll
      for (int k = 0; k < VEC; k++) {
        float xhat = (xv[k] - m) * r;
        float g = dyv[k] * weight[e + k];
        sum_g += g;
        sum_gx += g * xhat;
        acc_dw[e + k] += dyv[k] * xhat;
        acc_db[e + k] += dyv[k];
      }
    }
    const float mean_g = warp_sum(sum_g) / C4, mean_gx = warp_sum(sum_gx) / C4;
    for (int e = lane * VEC; e < C4; e += kWarp * VEC) {
      float xv[VEC], dyv[VEC];
      load_vec<T, VEC>(xv, tokens + rows[e / C] * C + e % C);
      load_vec<T, VEC>(dyv, dy + e);
      float *dx = dtokens + rows[e / C] * C + e % C;
#pragma unroll
      for (int k = 0; k < VEC; k++) {
        float xhat = (xv[k] - m) * r;
        dx[k] = r * (dyv[k] * weight[e + k] - mean_g - xhat * mean_gx);
      }
    }
  }
  store_block_partial(partial, acc_all, C4);
}

// The forward's multi-pass kernel for T: 16-byte vectors when aligned, else scalar.
template <typename T>
void launch_residual_forward(T *xo, T *lo, float *mean, float *rstd, const T *xi, const T *br,
                             RowMap bmap, const float *scale, const float *weight,
                             const float *bias, RowMap lmap, int64_t N, int64_t L, int C,
                             cudaStream_t stream) {
  const bool aligned = can_vectorize<T>(C, {xo, lo, xi, br});
  const unsigned blocks = (unsigned)((N + kForwardWarpsPerBlock - 1) / kForwardWarpsPerBlock);
  if (aligned)
    residual_layernorm_forward_kernel<T, kVec16<T>><<<blocks, kForwardThreads, 0, stream>>>(
        xo, lo, mean, rstd, xi, br, bmap, scale, weight, bias, lmap, N, L, C);
  else
    residual_layernorm_forward_kernel<T, 1><<<blocks, kForwardThreads, 0, stream>>>(
        xo, lo, mean, rstd, xi, br, bmap, scale, weight, bias, lmap, N, L, C);
}

// The backward's multi-pass kernel for T; returns its plan (its blocks hold the partials:
// kResidualParts x C floats each). sums: the dbranch column sums are wanted.
template <typename T>
BackwardPlan launch_residual_backward(float *dres_out, T *dbr, float *scratch, const float *dres_in,
                                      const T *dy, const T *xr, const float *weight,
                                      const float *mean, const float *rstd, RowMap bmap,
                                      const float *scale, RowMap lmap, int64_t N, int64_t L, int C,
                                      bool sums, cudaStream_t stream) {
  BackwardPlan p = backward_plan(N, C, kResidualParts);
  const size_t shared = dy || sums ? p.shared_bytes : 0;
  if (can_vectorize<T>(C, {dbr, dy, xr}) && C % 4 == 0) {
    auto kernel = residual_layernorm_backward_kernel<T, kVec16<T>>;
    allow_shared(kernel, shared);
    kernel<<<(unsigned)p.blocks, p.warps * kWarp, shared, stream>>>(
        dres_out, dbr, scratch, dres_in, dy, xr, weight, mean, rstd, bmap, scale, lmap, N, L, C,
        p.rows_per_block, sums);
  } else {
    auto kernel = residual_layernorm_backward_kernel<T, 1>;
    allow_shared(kernel, shared);
    kernel<<<(unsigned)p.blocks, p.warps * kWarp, shared, stream>>>(
        dres_out, dbr, scratch, dres_in, dy, xr, weight, mean, rstd, bmap, scale, lmap, N, L, C,
        p.rows_per_block, sums);
  }
  return p;
}

// The merge forward's multi-pass kernel for T: 16-byte vectors when aligned, else scalar.
template <typename T>
void launch_merge_forward(T *out, float *mean, float *rstd, const T *tokens, const float *weight,
                          const float *bias, int64_t N, int H, int W, int C, cudaStream_t stream) {
  const unsigned blocks = (unsigned)((N + kForwardWarpsPerBlock - 1) / kForwardWarpsPerBlock);
  if (can_vectorize<T>(C, {out, tokens}))
    merge_layernorm_forward_kernel<T, kVec16<T>>
        <<<blocks, kForwardThreads, 0, stream>>>(out, mean, rstd, tokens, weight, bias, N, H, W, C);
  else
    merge_layernorm_forward_kernel<T, 1>
        <<<blocks, kForwardThreads, 0, stream>>>(out, mean, rstd, tokens, weight, bias, N, H, W, C);
}

// The merge backward's multi-pass kernel for T; returns its plan (its blocks hold the
// parameter-gradient partials).
template <typename T>
BackwardPlan launch_merge_backward(float *dtokens, float *scratch, const T *dout, const T *tokens,
                                   const float *weight, const float *mean, const float *rstd,
                                   int64_t N, int H, int W, int C, cudaStream_t stream) {
  const BackwardPlan p = backward_plan(N, 4 * C);
  if (can_vectorize<T>(C, {dout, tokens}) && C % 4 == 0) {
    auto kernel = merge_layernorm_backward_kernel<T, kVec16<T>>;
    allow_shared(kernel, p.shared_bytes);
    kernel<<<(unsigned)p.blocks, p.warps * kWarp, p.shared_bytes, stream>>>(
        dtokens, scratch, dout, tokens, weight, mean, rstd, N, H, W, C, p.rows_per_block);
  } else {
    auto kernel = merge_layernorm_backward_kernel<T, 1>;
    allow_shared(kernel, p.shared_bytes);
    kernel<<<(unsigned)p.blocks, p.warps * kWarp, p.shared_bytes, stream>>>(
        dtokens, scratch, dout, tokens, weight, mean, rstd, N, H, W, C, p.rows_per_block);
  }
  return p;
}

}  // namespace

BackwardPlan backward_plan(int64_t N, int C, int parts) {
  BackwardPlan p;
  int64_t fit = kDefaultSharedBytes / (parts * (int64_t)C * (int64_t)sizeof(float));
  p.warps = fit < 1 ? 1 : fit > kBackwardMaxWarps ? kBackwardMaxWarps : (int)fit;
  int64_t max_rows = (int64_t)p.warps * backward_max_blocks();
  int64_t rows_per_warp = N > max_rows ? (N + max_rows - 1) / max_rows : 1;
  p.rows_per_block = rows_per_warp * p.warps;
  p.blocks = (N + p.rows_per_block - 1) / p.rows_per_block;
  p.shared_bytes = (size_t)p.warps * parts * (size_t)C * sizeof(float);
  return p;
}

void residual_layernorm_forward_multipass(DType dt, void *x_out, void *ln_out, float *mean,
                                          float *rstd, const void *x_in, const void *branch,
                                          RowMap bmap, const float *scale, const float *weight,
                                          const float *bias, RowMap lmap, int64_t N, int64_t L,
                                          int C, cudaStream_t stream) {
  SWIN_DISPATCH(
      dt, T,
      launch_residual_forward<T>(static_cast<T *>(x_out), static_cast<T *>(ln_out), mean, rstd,
                                 static_cast<const T *>(x_in), static_cast<const T *>(branch), bmap,
                                 scale, weight, bias, lmap, N, L, C, stream));
}

BackwardPlan residual_layernorm_backward_multipass(
    DType dt, float *dres_out, void *dbranch, float *scratch, const float *dres_in, const void *dln,
    const void *x, const float *weight, const float *mean, const float *rstd, RowMap bmap,
    const float *scale, RowMap lmap, int64_t N, int64_t L, int C, bool sums, cudaStream_t stream) {
  BackwardPlan p = {};
  SWIN_DISPATCH(dt, T,
                p = launch_residual_backward<T>(dres_out, static_cast<T *>(dbranch), scratch,
                                                dres_in, static_cast<const T *>(dln),
                                                static_cast<const T *>(x), weight, mean, rstd, bmap,
                                                scale, lmap, N, L, C, sums, stream));
  return p;
}

void merge_layernorm_forward_multipass(DType dt, void *out, float *mean, float *rstd,
                                       const void *tokens, const float *weight, const float *bias,
                                       int64_t N, int H, int W, int C, cudaStream_t stream) {
  SWIN_DISPATCH(
      dt, T,
      launch_merge_forward<T>(static_cast<T *>(out), mean, rstd, static_cast<const T *>(tokens),
                              weight, bias, N, H, W, C, stream));
}

BackwardPlan merge_layernorm_backward_multipass(DType dt, float *dtokens, float *scratch,
                                                const void *dout, const void *tokens,
                                                const float *weight, const float *mean,
                                                const float *rstd, int64_t N, int H, int W, int C,
                                                cudaStream_t stream) {
  BackwardPlan p = {};
  SWIN_DISPATCH(dt, T,
                p = launch_merge_backward<T>(dtokens, scratch, static_cast<const T *>(dout),
                                             static_cast<const T *>(tokens), weight, mean, rstd, N,
                                             H, W, C, stream));
  return p;
}

}  // namespace swin_cuda::layernorm
