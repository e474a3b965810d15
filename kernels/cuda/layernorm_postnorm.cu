// layernorm_postnorm.cu: the res-post-norm residual of Swin V2 on CUDA (kernels/layernorm.h,
// postnorm_residual_{forward,backward}): x_out = x_in + scale * LN(branch), with the branch, the
// windowed copy of the output and the incoming gradient each addressed through its window map.
// kernels/cpu/layernorm.c is the spec.
//
// Two strategies, as the V1 LayerNorms (layernorm.cu). The register kernels, the fast path for
// 16-byte-aligned rows that fit a lane's registers (every Swin width), give a row 4 to 32 lanes
// (layernorm_register.cuh's shapes, exact fits first: C = 96 in bf16 is 4 lanes of 3 vectors),
// read each input once into registers and write each output once. The multi-pass kernels serve
// every other row: one warp per row, which re-reads the row for each pass (from L1/L2), with
// 16-byte vectors where every row start is aligned (else one element at a time). Row statistics
// are shuffle sums in fp32, the same on every lane of the row.
//
// The backward's parameter gradients (dweight, dbias, and dbranch's column sums, the bias
// gradient of the layer that produced the branch) follow a fixed partition: each block owns a
// range of rows, each warp (multi-pass) or row slot (register) accumulates its rows in its own
// shared-memory copy, the block adds those in order into its slot of scratch, and
// launch_part_reduce adds the slots in block order: bitwise the same run after run on one kind
// of GPU. The partitions depend on (rows, C) and the SM count alone.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/layernorm_register.cuh"

using namespace swin_cuda;
using namespace swin_cuda::layernorm;

namespace {

// ---- multi-pass forward -------------------------------------------------------------------------
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

// ---- multi-pass backward ------------------------------------------------------------------------
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

// ---- register-resident rows -------------------------------------------------------------------
// Forward: row t's branch row and x_in row are loaded into registers, the statistics taken in two
// passes over the registers (mean, then squared deviations), then v = x_in + s * LN(branch)
// stored to x_out and, with xw_out, to xw_out[omap(t)]. x_out may be x_in (read first, by the
// same thread).
template <typename T, int VEC, int MAXV, int LANES>
__global__ void __launch_bounds__(kForwardThreads)
    postnorm_forward_reg_kernel(T *x_out, T *__restrict__ xw_out, float *__restrict__ mean,
                                float *__restrict__ rstd, const T *x_in,
                                const T *__restrict__ branch, RowMap bmap,
                                const float *__restrict__ scale, const float *__restrict__ weight,
                                const float *__restrict__ bias, RowMap omap, int64_t N, int64_t L,
                                int C) {
  constexpr int kRowsPerWarp = 32 / LANES;
  const int lane = threadIdx.x % 32, sl = lane % LANES;
  const int64_t t =
      ((int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * kRowsPerWarp + lane / LANES;
  const bool active = t < N;  // inactive rows still take part in the shuffles
  const int64_t row = active ? t : 0;
  const T *br = branch + mapped_row(bmap, row, L) * C;
  const T *xi = x_in ? x_in + row * C : nullptr;
  float v[MAXV][VEC], res[MAXV][VEC];
#pragma unroll
  for (int k = 0; k < MAXV; k++) {
    const int c = (k * LANES + sl) * VEC;
    if (c >= C) continue;
    load_vec<T, VEC>(v[k], br + c);
    if (xi) load_vec<T, VEC>(res[k], xi + c);
  }
  float m, r;
  row_stats<VEC, MAXV, LANES>(v, C, sl, &m, &r);
  if (!active) return;
  const float s = scale ? scale[image_of(bmap, row, L)] : 1.0f;
  T *xo = x_out + row * C;
  T *xw = xw_out ? xw_out + mapped_row(omap, row, L) * C : nullptr;
#pragma unroll
  for (int k = 0; k < MAXV; k++) {
    const int c = (k * LANES + sl) * VEC;
    if (c >= C) continue;
    float wv[VEC], bv[VEC], out[VEC];
    load_vec<float, VEC>(wv, weight + c);
    load_vec<float, VEC>(bv, bias + c);
#pragma unroll
    for (int e = 0; e < VEC; e++) {
      const float n = (v[k][e] - m) * r * wv[e] + bv[e];
      out[e] = xi ? res[k][e] + s * n : s * n;
    }
    store_vec<T, VEC>(xo + c, out);
    if (xw) store_vec<T, VEC>(xw + c, out);
  }
  if (sl == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// Resident 256-thread blocks per SM the register backward's launch bounds hold its registers to,
// by the elements a lane holds (MAXV * VEC: g in fp32 and the branch as loaded, 16 bytes a
// vector): 3 blocks (85 registers) up to 24 elements (every exact bf16 / fp16 shape of 3 vectors,
// fp32's of 3 to 6), 2 up to 32, else 1.
constexpr int postnorm_backward_blocks_per_sm(int elements) {
  return elements <= 24 ? 3 : elements <= 32 ? 2 : 1;
}
// Shared memory of an SM that the register backward's blocks may take together (of the H200's
// 228 KiB, less 1 KiB a block that the hardware reserves), and at most per block.
constexpr int kPostnormSmSharedBytes = 224 * 1024;
constexpr int kPostnormBlockSharedBytes = 112 * 1024;

// Backward: row t's g = dres_in[t] + dx[xmap(t)] (either may be absent) and its branch row are
// loaded into registers once (the branch as 16 raw bytes a vector, x-hat formed from them in each
// of the two passes, the same operations both times); u = s * g is the gradient of LN(branch row);
// dbranch[bmap(t)] = rstd * (gy - mean(gy) - xhat * mean(gy * xhat)) with gy = u * weight (the
// CPU's formula), and dres_out[t] = g (dres_out may be dres_in: loaded before it is stored, by the
// same thread). Each row slot keeps its dweight, dbias (param_sums) and dbranch column sums
// (sum_branch) in shared memory (kResidualParts x C floats, its lanes their columns), added over
// its rows in row order, then over the slots in slot order into the block's partial.
template <typename T, int VEC, int MAXV, int LANES>
__global__ void __launch_bounds__(kBackwardMaxThreads, postnorm_backward_blocks_per_sm(MAXV *VEC))
    postnorm_backward_reg_kernel(float *dres_out, T *__restrict__ dbranch,
                                 float *__restrict__ partial, const float *dres_in,
                                 const T *__restrict__ dx, RowMap xmap,
                                 const T *__restrict__ branch, const float *__restrict__ weight,
                                 const float *__restrict__ mean, const float *__restrict__ rstd,
                                 RowMap bmap, const float *__restrict__ scale, int64_t N,
                                 int64_t L, int C, int64_t rows_per_block, bool param_sums,
                                 bool sum_branch) {
  static_assert(VEC % 4 == 0, "shared_fma works on float4");
  extern __shared__ float4 shared_f4[];
  const RowSlots<LANES> rs(rows_per_block, N);
  const int sl = rs.sl, slot = rs.slot, slots = rs.slots;
  float *acc_all = reinterpret_cast<float *>(shared_f4);  // (slots, kResidualParts, C)
  float *acc = acc_all + (size_t)slot * kResidualParts * C;
  const bool sums = param_sums || sum_branch;
  if (sums) zero_slot_sums(acc_all, slots * kResidualParts * C);

  for (int64_t base = rs.begin; base < rs.end; base += slots) {
    const int64_t t = base + slot;
    const bool active = t < rs.end;  // inactive slots still take part in the shuffles
    const int64_t row = active ? t : rs.begin;
    const float m = mean[row], r = rstd[row];
    const float s = scale ? scale[image_of(bmap, row, L)] : 1.0f;
    const T *xr = branch + mapped_row(bmap, row, L) * C;
    const T *d = dx ? dx + mapped_row(xmap, row, L) * C : nullptr;
    const float *res = dres_in ? dres_in + row * C : nullptr;
    float g[MAXV][VEC];
    int4 x_raw[MAXV];
#pragma unroll
    for (int k = 0; k < MAXV; k++) {
      const int c = (k * LANES + sl) * VEC;
      if (c >= C) continue;
#pragma unroll
      for (int e = 0; e < VEC; e++) g[k][e] = 0.0f;
      if (res) load_vec<float, VEC>(g[k], res + c);
      if (d) {
        float dv[VEC];
        load_vec<T, VEC>(dv, d + c);
#pragma unroll
        for (int e = 0; e < VEC; e++) g[k][e] += dv[e];
      }
      x_raw[k] = *reinterpret_cast<const int4 *>(xr + c);
    }
    float sum_g = 0.0f, sum_gx = 0.0f;
#pragma unroll
    for (int k = 0; k < MAXV; k++) {
      const int c = (k * LANES + sl) * VEC;
      if (c >= C) continue;
      float xh[VEC], u[VEC], wv[VEC];
      unpack_vec<T, VEC>(xh, x_raw[k]);
      load_vec<float, VEC>(wv, weight + c);
#pragma unroll
      for (int e = 0; e < VEC; e++) {
        xh[e] = (xh[e] - m) * r;
        u[e] = s * g[k][e];
        const float gy = u[e] * wv[e];
        sum_g += gy;
        sum_gx += gy * xh[e];
      }
      if (active && param_sums) {
        shared_fma<VEC>(acc + c, u, xh);
        shared_fma<VEC>(acc + C + c, u, nullptr);
      }
    }
    const float mean_g = group_sum<LANES>(sum_g) / C, mean_gx = group_sum<LANES>(sum_gx) / C;
    if (!active) continue;
    T *db = dbranch + mapped_row(bmap, row, L) * C;
#pragma unroll
    for (int k = 0; k < MAXV; k++) {
      const int c = (k * LANES + sl) * VEC;
      if (c >= C) continue;
      float xv[VEC], wv[VEC], out[VEC];
      unpack_vec<T, VEC>(xv, x_raw[k]);
      load_vec<float, VEC>(wv, weight + c);
#pragma unroll
      for (int e = 0; e < VEC; e++) {
        const float xhat = (xv[e] - m) * r;
        out[e] = r * (s * g[k][e] * wv[e] - mean_g - xhat * mean_gx);
      }
      if (dres_out) store_vec<float, VEC>(dres_out + row * C + c, g[k]);
      store_vec<T, VEC>(db + c, out);
      if (sum_branch) {
#pragma unroll
        for (int e = 0; e < VEC; e++) out[e] = round_to<T>(out[e]);
        shared_fma<VEC>(acc + 2 * C + c, out, nullptr);
      }
    }
  }
  // The block's partial (kResidualParts, C): the slots' sums added in slot order.
  if (sums)
    store_slot_sums(partial + (int64_t)blockIdx.x * kResidualParts * C, acc_all,
                    kResidualParts * C, slots);
}

// The register backward's fixed partition for rows of C over `lanes` lanes of `maxv` vectors of
// `vec` elements: 8 warps a block, fewer where their slots' sums (kResidualParts x C floats
// each) pass kPostnormBlockSharedBytes; blocks from the resident count (the launch bound's, and
// what the SM's shared memory holds), rows per slot so that the blocks come to one wave of them.
BackwardPlan postnorm_reg_backward_plan(int64_t N, int C, int lanes, int maxv, int vec) {
  BackwardPlan p;
  const int per_warp = 32 / lanes;
  const int64_t slot_bytes = kResidualParts * (int64_t)C * (int64_t)sizeof(float);
  const int64_t fit = kPostnormBlockSharedBytes / (slot_bytes * per_warp);
  p.warps = fit < 1 ? 1 : fit > kBackwardMaxWarps ? kBackwardMaxWarps : (int)fit;
  const int64_t slots = (int64_t)p.warps * per_warp;
  p.shared_bytes = (size_t)(slots * slot_bytes);
  int64_t resident = kPostnormSmSharedBytes / ((int64_t)p.shared_bytes + 1024);
  const int bound = postnorm_backward_blocks_per_sm(maxv * vec);
  if (resident > bound) resident = bound;
  if (resident < 1) resident = 1;
  const int64_t wave = slots * resident * device_sm_count();
  const int64_t rows_per_slot = N > wave ? (N + wave - 1) / wave : 1;
  p.rows_per_block = rows_per_slot * slots;
  p.blocks = (N + p.rows_per_block - 1) / p.rows_per_block;
  return p;
}

// The register shape of the rows, or lanes == 0 where the multi-pass kernels serve them (a row
// that fits no shape, or a row start or parameter not 16-byte aligned).
template <typename T>
RegShape postnorm_reg_shape(int C, std::initializer_list<const void *> rows,
                            std::initializer_list<const void *> params) {
  RegShape r = reg_shape<T>(C, true);
  bool ok = r.lanes && can_vectorize<T>(C, rows);
  for (const void *q : params) ok = ok && aligned16(q);
  if (!ok) r.lanes = 0;
  return r;
}

// Launch configuration: the register kernels where postnorm_reg_shape finds a shape (the
// forward kForwardWarpsPerBlock warps of 32 / LANES rows each; the backward
// postnorm_reg_backward_plan's partition), else the multi-pass kernels (the forward one warp
// per row, kForwardWarpsPerBlock rows per block; the backward backward_plan's partition).
template <typename T>
void launch_forward(T *xo, T *xw, float *mean, float *rstd, const T *xi, const T *br, RowMap bmap,
                    const float *scale, const float *weight, const float *bias, RowMap omap,
                    int64_t N, int64_t L, int C, cudaStream_t stream) {
  const RegShape r = postnorm_reg_shape<T>(C, {xo, xw, xi, br}, {weight, bias});
  if (r.lanes) {
    with_exact_reg_shape(r, [&](auto MAXV, auto LANES) {
      constexpr int kMaxv = decltype(MAXV)::value, kLanes = decltype(LANES)::value;
      const int64_t rows_per_block = (int64_t)kForwardWarpsPerBlock * (32 / kLanes);
      postnorm_forward_reg_kernel<T, kVec16<T>, kMaxv, kLanes>
          <<<(unsigned)((N + rows_per_block - 1) / rows_per_block), kForwardThreads, 0, stream>>>(
              xo, xw, mean, rstd, xi, br, bmap, scale, weight, bias, omap, N, L, C);
    });
    return;
  }
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
  const bool sums = param_sums || sum_branch;
  const RegShape r = postnorm_reg_shape<T>(C, {dbr, dx, br, dres_in, dres_out}, {weight});
  if (r.lanes) {
    const BackwardPlan p = postnorm_reg_backward_plan(N, C, r.lanes, r.maxv, kVec16<T>);
    const size_t shared = sums ? p.shared_bytes : 0;
    with_exact_reg_shape(r, [&](auto MAXV, auto LANES) {
      constexpr int kMaxv = decltype(MAXV)::value, kLanes = decltype(LANES)::value;
      auto kernel = postnorm_backward_reg_kernel<T, kVec16<T>, kMaxv, kLanes>;
      allow_shared(kernel, shared);
      kernel<<<(unsigned)p.blocks, p.warps * kWarp, shared, stream>>>(
          dres_out, dbr, scratch, dres_in, dx, xmap, br, weight, mean, rstd, bmap, scale, N, L, C,
          p.rows_per_block, param_sums, sum_branch);
    });
    return p;
  }
  const BackwardPlan p = backward_plan(N, C, kResidualParts);
  const size_t shared = sums ? p.shared_bytes : 0;
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
  // Either partition: the multi-pass one, or the register one of any shape the dispatch may
  // pick for C (the element size decides the shape; every one is asked).
  int64_t blocks = backward_plan(rows, C, kResidualParts).blocks;
  const RegShape shapes[] = {reg_shape<float>(C, true), reg_shape<__nv_bfloat16>(C, true)};
  const int vecs[] = {kVec16<float>, kVec16<__nv_bfloat16>};  // f16's shapes are bf16's
  for (int i = 0; i < 2; i++) {
    if (!shapes[i].lanes) continue;
    const int64_t k =
        postnorm_reg_backward_plan(rows, C, shapes[i].lanes, shapes[i].maxv, vecs[i]).blocks;
    if (k > blocks) blocks = k;
  }
  return blocks * kResidualParts * (int64_t)C;
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
