// layernorm_register.cu: the register-resident LayerNorm kernels, residual + LayerNorm and
// patch merging + LayerNorm, forward and backward: the fast path for 16-byte-aligned rows that
// fit a lane's registers; with their shapes, partitions and launchers.
#include <climits>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/layernorm_register.cuh"

namespace swin_cuda::layernorm {
namespace {

// ---- register-resident rows --------------------------------------------------------------
// The fast path for 16-byte-aligned rows: a row is read from global memory once into registers
// (MAXV vectors of VEC elements per lane) and written once. A row gets LANES lanes (a power of
// two up to 32), so short rows (C = 96 in bf16: 12 vectors) share a warp two or four to a warp;
// row reductions are butterflies within those lanes. Vector k of lane l covers elements
// ((k * LANES + l) * VEC ...), so every access of a warp is contiguous. The backwards keep each
// row slot's dweight / dbias terms over all its rows (a lane always owns the same columns): the
// residual's in shared memory (see residual_layernorm_backward_reg_kernel), the merge's in
// registers; the row slots of a block are combined in a fixed order at the end.

// Resident 256-thread blocks per SM of the register forward, which its launch bound holds the
// registers to: 5 (48 registers: Swin's rows, 3 or 4 vectors a lane, take 46-48 held raw without
// spilling; held as floats they took 50-64, 4 blocks), none for the wider rows of 8 and 16 vectors.
constexpr int reg_forward_blocks_per_sm(int maxv) {
  return maxv <= 4 ? 5 : 1;
}

// The row stays in registers as it reads back from x_out (16 raw bytes a vector: half the
// registers of floats in bf16 / f16), unpacked for the statistics and again for the output.
template <typename T, int VEC, int MAXV, int LANES>
__global__ void __launch_bounds__(kForwardThreads, reg_forward_blocks_per_sm(MAXV))
    residual_layernorm_forward_reg_kernel(T *x_out, T *__restrict__ ln_out,
                                          float *__restrict__ mean, float *__restrict__ rstd,
                                          const T *x_in, const T *__restrict__ branch, RowMap bmap,
                                          const float *__restrict__ scale,
                                          const float *__restrict__ weight,
                                          const float *__restrict__ bias, RowMap lmap, int64_t N,
                                          int64_t L, int C) {
  constexpr int kRowsPerWarp = 32 / LANES;
  const int lane = threadIdx.x % 32, sl = lane % LANES;
  const int64_t t =
      ((int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * kRowsPerWarp + lane / LANES;
  const bool active = t < N;  // inactive rows still take part in the shuffles
  const int64_t row = active ? t : 0;
  int4 raw[MAXV];
  const T *xi = x_in + row * C;
  const T *br = branch ? branch + mapped_row(bmap, row, L) * C : nullptr;
  const float s = branch && scale ? scale[image_of(bmap, row, L)] : 1.0f;
#pragma unroll
  for (int k = 0; k < MAXV; k++) {
    int c = (k * LANES + sl) * VEC;
    if (c < C) {
      raw[k] = *reinterpret_cast<const int4 *>(xi + c);
      if (br) {
        float v[VEC], bv[VEC];
        unpack_vec<T, VEC>(v, raw[k]);
        load_vec<T, VEC>(bv, br + c);
        residual_add_vec<T, VEC>(v, bv, s);
        raw[k] = pack_vec<T, VEC>(v);
        if (active) *reinterpret_cast<int4 *>(x_out + row * C + c) = raw[k];
      }
    }
  }
  if (!ln_out) return;
  float m, r;
  row_stats_raw<T, VEC, MAXV, LANES>(raw, C, sl, &m, &r);
  if (!active) return;
  T *y = ln_out + mapped_row(lmap, row, L) * C;
#pragma unroll
  for (int k = 0; k < MAXV; k++) {
    int c = (k * LANES + sl) * VEC;
    if (c >= C) continue;
    float v[VEC], yv[VEC];
    unpack_vec<T, VEC>(v, raw[k]);
    normalize_vec<VEC>(yv, v, m, r, weight + c, bias + c);
    store_vec<T, VEC>(y + c, yv);
  }
  if (sl == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// The row slots of a block (warps x rows per warp) each hold terms of their columns in
// registers (dweight / dbias, dbranch); they meet in shared memory (slot-major, 2C floats per
// slot) and are added in slot order into the block's partial (parts x C: kResidualParts for the
// residual backward, 2 for the merge's), `count` (1 or 2) C-wide arrays at a time into parts
// [first, first + count). Every thread of the block calls it (barriers); calls may follow each
// other, each reusing the shared memory.
template <int VEC, int MAXV, int LANES>
__device__ void store_slot_partials(float *partial, float *acc_all, const float (&a)[MAXV][VEC],
                                    const float (&b)[MAXV][VEC], int count, int first, int parts,
                                    int C, int slot, int slots) {
  const int sl = threadIdx.x % 32 % LANES;
  const int width = count * C;
  float *acc = acc_all + (size_t)slot * width;
  __syncthreads();  // a previous call's readers are done
#pragma unroll
  for (int k = 0; k < MAXV; k++) {
    int c = (k * LANES + sl) * VEC;
    if (c >= C) continue;
#pragma unroll
    for (int e = 0; e < VEC; e++) {
      acc[c + e] = a[k][e];
      if (count == 2) acc[C + c + e] = b[k][e];
    }
  }
  store_slot_sums(partial + (int64_t)blockIdx.x * parts * C + (int64_t)first * C, acc_all, width,
                  slots);
}

// Resident 256-thread blocks per SM of the register backward's shapes, which its launch bounds
// hold the registers to (ptxas, bf16 / f16 / f32: MAXV 1 64 registers, 2: 61-64, 4: 76-80).
constexpr int reg_backward_blocks_per_sm(int maxv) {
  return maxv == 1 ? 4 : maxv == 2 ? 4 : maxv == 4 ? 3 : 1;
}
// The register backward's shared memory budget per block (opted in above 48 KiB): 8 warps'
// running sums up to C = 1024 with one row per warp.
constexpr int kRegBackwardSharedBytes = 96 * 1024;

// x-hat = (x - mean) rstd and gy = dy * weight of one vector of a backward row held as loaded
// (dy unpacked into dyv too): the one place both passes form them, so that the second pass's
// values are the first's.
template <typename T, int VEC>
__device__ __forceinline__ void backward_terms(float (&xh)[VEC], float (&gy)[VEC],
                                               float (&dyv)[VEC], int4 x_raw, int4 dy_raw,
                                               const float *__restrict__ weight, float m, float r) {
  float wv[VEC];
  unpack_vec<T, VEC>(xh, x_raw);
  unpack_vec<T, VEC>(dyv, dy_raw);
  load_vec<float, VEC>(wv, weight);
#pragma unroll
  for (int e = 0; e < VEC; e++) {
    xh[e] = (xh[e] - m) * r;
    gy[e] = __fmul_rn(dyv[e], wv[e]);
  }
}

// Each row slot (LANES lanes) keeps its running dweight, dbias and dbranch sums in shared
// memory (kResidualParts x C floats per slot, each lane the columns it loads) rather than in
// registers: three sums per element held across the rows would take 3 * MAXV * VEC registers
// (48 for rows of 2 vectors a lane, which take 61-64 in all), and the registers, not the bytes,
// bound the resident warps of this latency-bound loop. The sums are the same operations in the same
// order (per slot in row order, then over the slots in slot order), so the results did not change.
// With EARLY_RES the residual gradient is loaded with x and dy, before the row's reductions,
// so a row costs one memory round trip instead of two, for MAXV * VEC more registers: taken
// where they fit in the launch bound (MAXV 1).
template <typename T, int VEC, int MAXV, int LANES, bool EARLY_RES>
__global__ void __launch_bounds__(kBackwardMaxThreads, reg_backward_blocks_per_sm(MAXV))
    residual_layernorm_backward_reg_kernel(
        float *dres_out, T *__restrict__ dbranch, float *__restrict__ partial, const float *dres_in,
        const T *__restrict__ dln, const T *__restrict__ x, const float *__restrict__ weight,
        const float *__restrict__ mean, const float *__restrict__ rstd, RowMap bmap,
        const float *__restrict__ scale, RowMap lmap, int64_t N, int64_t L, int C,
        int64_t rows_per_block, bool sum_branch) {
  static_assert(VEC % 4 == 0, "shared_fma works on float4");
  extern __shared__ float4 shared_f4[];
  const RowSlots<LANES> rs(rows_per_block, N);
  const int sl = rs.sl, slot = rs.slot, slots = rs.slots;
  float *acc_all = reinterpret_cast<float *>(shared_f4);  // (slots, kResidualParts, C)
  float *acc = acc_all + (size_t)slot * kResidualParts * C;
  const bool sums = dln || sum_branch;
  if (sums) zero_slot_sums(acc_all, slots * kResidualParts * C);

  for (int64_t base = rs.begin; base < rs.end; base += slots) {
    const int64_t t = base + slot;
    const bool active = t < rs.end;  // inactive slots still take part in the shuffles
    const int64_t row = active ? t : rs.begin;
    float rv[EARLY_RES ? MAXV : 1][VEC];
    if constexpr (EARLY_RES) {
      if (dres_in)
#pragma unroll
        for (int k = 0; k < MAXV; k++) {
          int c = (k * LANES + sl) * VEC;
          if (c < C) load_vec<float, VEC>(rv[k], dres_in + row * C + c);
        }
    }
    // The row's x and dy stay in registers as loaded (16 bytes a vector: half the registers of
    // floats in bf16 / f16), and x-hat and gy = dy * weight are formed from them in each of the
    // two passes below, the same operations both times (weight re-read from L1). With one vector
    // a lane (KEEP, registers to spare) the first pass's x-hat and gy are kept instead: the
    // second pass's arithmetic cost stages 0 and 1 3% of their time (kernels/PERF.md, 21).
    constexpr bool KEEP = MAXV == 1;
    int4 x_raw[MAXV], dy_raw[MAXV];
    float xh_kept[KEEP ? MAXV : 1][VEC], gy_kept[KEEP ? MAXV : 1][VEC];
    float m = 0.0f, r = 0.0f, mean_g = 0.0f, mean_gx = 0.0f;
    if (dln) {
      m = mean[row];
      r = rstd[row];
      const T *xr = x + row * C;
      const T *dy = dln + mapped_row(lmap, row, L) * C;
#pragma unroll
      for (int k = 0; k < MAXV; k++) {
        int c = (k * LANES + sl) * VEC;
        if (c >= C) continue;
        x_raw[k] = *reinterpret_cast<const int4 *>(xr + c);
        dy_raw[k] = *reinterpret_cast<const int4 *>(dy + c);
      }
      float sum_g = 0.0f, sum_gx = 0.0f;
#pragma unroll
      for (int k = 0; k < MAXV; k++) {
        int c = (k * LANES + sl) * VEC;
        if (c >= C) continue;
        float xh[VEC], gy[VEC], dyv[VEC];
        backward_terms<T, VEC>(xh, gy, dyv, x_raw[k], dy_raw[k], weight + c, m, r);
#pragma unroll
        for (int e = 0; e < VEC; e++) {
          sum_g += gy[e];
          sum_gx += gy[e] * xh[e];
          if constexpr (KEEP) {
            xh_kept[k][e] = xh[e];
            gy_kept[k][e] = gy[e];
          }
        }
        if (active) {
          shared_fma<VEC>(acc + c, dyv, xh);
          shared_fma<VEC>(acc + C + c, dyv, nullptr);
        }
      }
      mean_g = group_sum<LANES>(sum_g) / C;
      mean_gx = group_sum<LANES>(sum_gx) / C;
    }
    if (!active) continue;
    const float s = scale ? scale[image_of(bmap, row, L)] : 1.0f;
    T *dbr = dbranch ? dbranch + mapped_row(bmap, row, L) * C : nullptr;
#pragma unroll
    for (int k = 0; k < MAXV; k++) {
      int c = (k * LANES + sl) * VEC;
      if (c >= C) continue;
      float g[VEC];
      if (dln && KEEP) {
#pragma unroll
        for (int e = 0; e < VEC; e++)
          g[e] = r * (gy_kept[KEEP ? k : 0][e] - mean_g - xh_kept[KEEP ? k : 0][e] * mean_gx);
      } else if (dln) {
        float xh[VEC], gy[VEC], dyv[VEC];
        backward_terms<T, VEC>(xh, gy, dyv, x_raw[k], dy_raw[k], weight + c, m, r);
#pragma unroll
        for (int e = 0; e < VEC; e++) g[e] = r * (gy[e] - mean_g - xh[e] * mean_gx);
      } else {
#pragma unroll
        for (int e = 0; e < VEC; e++) g[e] = 0.0f;
      }
      if (dres_in) {
        if constexpr (!EARLY_RES) load_vec<float, VEC>(rv[0], dres_in + row * C + c);
        const float(&res)[VEC] = rv[EARLY_RES ? k : 0];
#pragma unroll
        for (int e = 0; e < VEC; e++) g[e] += res[e];
      }
      if (dres_out) store_vec<float, VEC>(dres_out + row * C + c, g);
      if (dbr) {
        float out[VEC];
#pragma unroll
        for (int e = 0; e < VEC; e++) out[e] = s * g[e];
        store_vec<T, VEC>(dbr + c, out);
        if (sum_branch) {
#pragma unroll
          for (int e = 0; e < VEC; e++) out[e] = round_to<T>(out[e]);
          shared_fma<VEC>(acc + 2 * C + c, out, nullptr);
        }
      }
    }
  }
  // The block's partial (kResidualParts, C): the slots' sums added in slot order.
  if (sums)
    store_slot_sums(partial + (int64_t)blockIdx.x * kResidualParts * C, acc_all, kResidualParts * C,
                    slots);
}

// ---- patch merging + LayerNorm, register-resident -----------------------------------------
// The merge's fast path on the register kernels' layout: merged row u (4C elements) is read
// once from its four tokens into registers and written once, and the backward keeps dweight /
// dbias terms per lane in registers and meets in store_slot_partials. A vector lies inside one
// of the four C-element segments (VEC divides C); segment k's token is the merged row's first
// token (b, 2y, 2x) moved by dy * W + dx (merge_source_row's order,
// layernorm_multipass.cu), so the token offset of each
// of a lane's vectors depends only on its columns and is computed once.

// Registers a lane's share of a merged row may take in the backward: per element its dweight
// and dbias terms (f32) and its token and dout values as loaded, 2 + 2 * sizeof(T) / 4
// registers. 144 keep the kernel within a thread's 255 registers without spilling: 48 elements
// (6 vectors) in bf16 / f16, 36 in f32 (8 vectors, 32 elements, the widest shape that fits).
constexpr int kMergeMaxLaneRegs = 144;

template <typename T>
constexpr bool merge_lane_fits(int maxv) {
  return maxv * kVec16<T> * (8 + 2 * (int)sizeof(T)) <= 4 * kMergeMaxLaneRegs;
}

// Token row of merged row u's first neighbour (b, 2y, 2x); N <= INT_MAX on this path.
__device__ __forceinline__ int64_t merge_first_token(int u, int H, int W) {
  const int H2 = H / 2, W2 = W / 2;
  const int b = u / (H2 * W2), yx = u - b * (H2 * W2);
  const int y = yx / W2, x = yx - y * W2;
  return ((int64_t)b * H + 2 * y) * W + 2 * x;
}

// Offset (elements) from the first token's start of merged-row element e: segment k = e / C is
// token (dy, dx) = (k & 1, k >> 1) of the 2x2 neighbourhood. (W + 2) * C <= INT_MAX on this path.
__device__ __forceinline__ int merge_token_offset(int e, int W, int C) {
  const int k = e / C;
  return ((k & 1) * W + (k >> 1)) * C + (e - k * C);
}

// (The bound of 3 resident blocks only steers ptxas's register allocation: with the thread bound
// alone it kept the 3-vector shapes at 48 registers and spilled a pointer; all shapes need < 85.)
template <typename T, int VEC, int MAXV, int LANES>
__global__ void __launch_bounds__(kForwardThreads, 3)
    merge_layernorm_forward_reg_kernel(T *__restrict__ out, float *__restrict__ mean,
                                       float *__restrict__ rstd, const T *__restrict__ tokens,
                                       const float *__restrict__ weight,
                                       const float *__restrict__ bias, int N, int H, int W, int C) {
  constexpr int kRowsPerWarp = 32 / LANES;
  const int lane = threadIdx.x % 32, sl = lane % LANES;
  const int64_t u =
      ((int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * kRowsPerWarp + lane / LANES;
  const bool active = u < N;  // inactive rows still take part in the shuffles
  const int row = active ? (int)u : 0;
  const int C4 = 4 * C;
  const T *first = tokens + merge_first_token(row, H, W) * C;
  float v[MAXV][VEC];
#pragma unroll
  for (int k = 0; k < MAXV; k++) {
    const int e = (k * LANES + sl) * VEC;
    if (e < C4) load_vec<T, VEC>(v[k], first + merge_token_offset(e, W, C));
  }
  float m, r;
  row_stats<VEC, MAXV, LANES>(v, C4, sl, &m, &r);
  if (!active) return;
  T *y = out + (int64_t)row * C4;
#pragma unroll
  for (int k = 0; k < MAXV; k++) {
    const int e = (k * LANES + sl) * VEC;
    if (e >= C4) continue;
    float wv[VEC], bv[VEC], yv[VEC];
    load_vec<float, VEC>(wv, weight + e);
    load_vec<float, VEC>(bv, bias + e);
#pragma unroll
    for (int i = 0; i < VEC; i++) yv[i] = (v[k][i] - m) * r * wv[i] + bv[i];
    store_vec<T, VEC>(y + e, yv);
  }
  if (sl == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// The backward of merged rows [blockIdx.x * rows_per_block, ...): the multi-pass kernel's
// formula, dtokens[token of element e] = rstd * (g - mean(g) - xhat * mean(g * xhat)),
// g = dout * weight. The row's tokens and dout stay in registers as loaded (16 bytes per
// vector, half the registers of floats in bf16 / f16) and x-hat and g are formed from them in
// each of the two passes, the same operations both times; weight is re-read from L1. dtokens
// (f32) is written with 16-byte stores.
template <typename T, int VEC, int MAXV, int LANES>
__global__ void __launch_bounds__(kBackwardMaxThreads)
    merge_layernorm_backward_reg_kernel(float *__restrict__ dtokens, float *__restrict__ partial,
                                        const T *__restrict__ dout, const T *__restrict__ tokens,
                                        const float *__restrict__ weight,
                                        const float *__restrict__ mean,
                                        const float *__restrict__ rstd, int N, int H, int W, int C,
                                        int64_t rows_per_block) {
  extern __shared__ float4 shared_f4[];
  const RowSlots<LANES> rs(rows_per_block, N);
  const int sl = rs.sl, slot = rs.slot, slots = rs.slots;
  const int C4 = 4 * C;
  int offset[MAXV];  // token offsets of this lane's vectors (its columns are fixed)
  float dw[MAXV][VEC], db[MAXV][VEC];
#pragma unroll
  for (int k = 0; k < MAXV; k++) {
    const int e = (k * LANES + sl) * VEC;
    offset[k] = e < C4 ? merge_token_offset(e, W, C) : 0;
#pragma unroll
    for (int i = 0; i < VEC; i++) dw[k][i] = db[k][i] = 0.0f;
  }

  for (int64_t base = rs.begin; base < rs.end; base += slots) {
    const int64_t t = base + slot;
    const bool active = t < rs.end;  // inactive slots still take part in the shuffles
    const int row = (int)(active ? t : rs.begin);
    const float m = mean[row], r = rstd[row];
    const int64_t first = merge_first_token(row, H, W) * C;  // element offset in tokens
    const T *dy = dout + (int64_t)row * C4;
    int4 x_raw[MAXV], dy_raw[MAXV];
#pragma unroll
    for (int k = 0; k < MAXV; k++) {
      const int e = (k * LANES + sl) * VEC;
      if (e >= C4) continue;
      x_raw[k] = *reinterpret_cast<const int4 *>(tokens + first + offset[k]);
      dy_raw[k] = *reinterpret_cast<const int4 *>(dy + e);
    }
    float sum_g = 0.0f, sum_gx = 0.0f;
#pragma unroll
    for (int k = 0; k < MAXV; k++) {
      const int e = (k * LANES + sl) * VEC;
      if (e >= C4) continue;
      float xh[VEC], dyv[VEC], wv[VEC];
      unpack_vec<T, VEC>(xh, x_raw[k]);
      unpack_vec<T, VEC>(dyv, dy_raw[k]);
      load_vec<float, VEC>(wv, weight + e);
#pragma unroll
      for (int i = 0; i < VEC; i++) {
        xh[i] = (xh[i] - m) * r;
        const float g = dyv[i] * wv[i];
        sum_g += g;
        sum_gx += g * xh[i];
        if (active) {
          dw[k][i] += dyv[i] * xh[i];
          db[k][i] += dyv[i];
        }
      }
    }
    const float mean_g = group_sum<LANES>(sum_g) / C4, mean_gx = group_sum<LANES>(sum_gx) / C4;
    if (!active) continue;
#pragma unroll
    for (int k = 0; k < MAXV; k++) {
      const int e = (k * LANES + sl) * VEC;
      if (e >= C4) continue;
      float xv[VEC], dyv[VEC], wv[VEC], dx[VEC];
      unpack_vec<T, VEC>(xv, x_raw[k]);
      unpack_vec<T, VEC>(dyv, dy_raw[k]);
      load_vec<float, VEC>(wv, weight + e);
#pragma unroll
      for (int i = 0; i < VEC; i++) {
        const float xhat = (xv[i] - m) * r;
        dx[i] = r * (dyv[i] * wv[i] - mean_g - xhat * mean_gx);
      }
      store_vec<float, VEC>(dtokens + first + offset[k], dx);
    }
  }
  store_slot_partials<VEC, MAXV, LANES>(partial, reinterpret_cast<float *>(shared_f4), dw, db, 2, 0,
                                        2, C4, slot, slots);
}

// The merge's register shapes (lanes per row, vectors per lane). merge_shape picks the one that
// leaves the fewest vector slots empty (ties: more lanes, fewer registers), e.g. in bf16 Swin-T's
// 4C = 384 / 768 / 1536 (48 / 96 / 192 vectors) as 16 x 3 / 32 x 3 / 32 x 6, every lane full.
struct MergeShape {
  int lanes, maxv;
};
constexpr MergeShape kMergeShapes[] = {{8, 1},  {16, 1}, {32, 1}, {16, 3}, {32, 2},
                                       {32, 3}, {32, 4}, {32, 6}, {32, 8}};
constexpr int kMergeShapeCount = (int)(sizeof kMergeShapes / sizeof kMergeShapes[0]);

// Index into kMergeShapes for merged rows of 4C elements of T, or -1 (the multi-pass kernels).
template <typename T>
int merge_shape(int C) {
  if (C % kVec16<T> != 0) return -1;
  const int nvec = 4 * C / kVec16<T>;
  int best = -1, best_waste = 0;
  for (int i = 0; i < kMergeShapeCount; i++) {
    const MergeShape s = kMergeShapes[i];
    const int waste = s.lanes * s.maxv - nvec;
    if (!merge_lane_fits<T>(s.maxv) || waste < 0) continue;
    if (best < 0 || waste < best_waste ||
        (waste == best_waste && s.lanes > kMergeShapes[best].lanes)) {
      best = i;
      best_waste = waste;
    }
  }
  return best;
}

// Calls f(integral_constant<MAXV>, integral_constant<LANES>) for shape index `shape`; only the
// shapes T may use are instantiated.
template <typename T, int I = 0, typename F>
void with_merge_shape(int shape, F f) {
  if constexpr (I < kMergeShapeCount) {
    constexpr MergeShape s = kMergeShapes[I];
    if (shape != I) return with_merge_shape<T, I + 1>(shape, f);
    if constexpr (merge_lane_fits<T>(s.maxv))
      f(std::integral_constant<int, s.maxv>{}, std::integral_constant<int, s.lanes>{});
  }
}

// The register kernels index merged rows and token offsets in int.
bool merge_indexable(int64_t N, int W, int C) {
  return N <= INT_MAX && ((int64_t)W + 2) * C <= INT_MAX;
}

// The forward's register kernel for T when the row fits and every row start is 16-byte aligned;
// returns false (nothing launched) otherwise.
template <typename T>
bool launch_residual_forward(T *xo, T *lo, float *mean, float *rstd, const T *xi, const T *br,
                             RowMap bmap, const float *scale, const float *weight,
                             const float *bias, RowMap lmap, int64_t N, int64_t L, int C,
                             cudaStream_t stream) {
  const bool aligned = can_vectorize<T>(C, {xo, lo, xi, br});
  RegShape r = reg_shape<T>(C, true);
  if (r.lanes && aligned && aligned16(weight) && aligned16(bias)) {
    with_exact_reg_shape(r, [&](auto MAXV, auto LANES) {
      constexpr int kMaxv = decltype(MAXV)::value, kLanes = decltype(LANES)::value;
      const int64_t rows_per_block = (int64_t)kForwardWarpsPerBlock * (32 / kLanes);
      residual_layernorm_forward_reg_kernel<T, kVec16<T>, kMaxv, kLanes>
          <<<(unsigned)((N + rows_per_block - 1) / rows_per_block), kForwardThreads, 0, stream>>>(
              xo, lo, mean, rstd, xi, br, bmap, scale, weight, bias, lmap, N, L, C);
    });
    return true;
  }
  return false;
}

// The backward's register kernel for T, as the forward chooses; sets *plan to its partition (its
// blocks hold the partials: kResidualParts x C floats each). sums: the dbranch column sums are
// wanted.
template <typename T>
bool launch_residual_backward(float *dres_out, T *dbr, float *scratch, const float *dres_in,
                              const T *dy, const T *xr, const float *weight, const float *mean,
                              const float *rstd, RowMap bmap, const float *scale, RowMap lmap,
                              int64_t N, int64_t L, int C, bool sums, BackwardPlan *plan,
                              cudaStream_t stream) {
  RegShape r = reg_shape<T>(C, false);
  if (r.lanes && can_vectorize<T>(C, {dbr, dy, xr, dres_in, dres_out}) && aligned16(weight)) {
    BackwardPlan p = reg_backward_plan(N, C, r.lanes, r.maxv);
    const size_t shared = dy || sums ? p.shared_bytes : 0;
    with_reg_shape(r, [&](auto MAXV, auto LANES) {
      constexpr int kMaxv = decltype(MAXV)::value, kLanes = decltype(LANES)::value;
      constexpr bool kEarlyRes = kMaxv == 1;
      auto kernel = residual_layernorm_backward_reg_kernel<T, kVec16<T>, kMaxv, kLanes, kEarlyRes>;
      allow_shared(kernel, shared);
      kernel<<<(unsigned)p.blocks, p.warps * kWarp, shared, stream>>>(
          dres_out, dbr, scratch, dres_in, dy, xr, weight, mean, rstd, bmap, scale, lmap, N, L, C,
          p.rows_per_block, sums);
    });
    *plan = p;
    return true;
  }
  return false;
}

// The merge forward's register kernel for T when the merged row fits a shape and every row start
// is 16-byte aligned; returns false (nothing launched) otherwise.
template <typename T>
bool launch_merge_forward(T *out, float *mean, float *rstd, const T *tokens, const float *weight,
                          const float *bias, int64_t N, int H, int W, int C, cudaStream_t stream) {
  const int shape = merge_shape<T>(C);
  if (shape >= 0 && merge_indexable(N, W, C) && can_vectorize<T>(C, {out, tokens, weight, bias})) {
    with_merge_shape<T>(shape, [&](auto MAXV, auto LANES) {
      constexpr int kMaxv = decltype(MAXV)::value, kLanes = decltype(LANES)::value;
      const int64_t rows_per_block = (int64_t)kForwardWarpsPerBlock * (32 / kLanes);
      merge_layernorm_forward_reg_kernel<T, kVec16<T>, kMaxv, kLanes>
          <<<(unsigned)((N + rows_per_block - 1) / rows_per_block), kForwardThreads, 0, stream>>>(
              out, mean, rstd, tokens, weight, bias, (int)N, H, W, C);
    });
    return true;
  }
  return false;
}

// The merge backward's register kernel for T, as the forward chooses; sets *plan to its
// partition (its blocks hold the parameter-gradient partials).
template <typename T>
bool launch_merge_backward(float *dtokens, float *scratch, const T *dout, const T *tokens,
                           const float *weight, const float *mean, const float *rstd, int64_t N,
                           int H, int W, int C, BackwardPlan *plan, cudaStream_t stream) {
  const int shape = merge_shape<T>(C);
  if (shape >= 0 && merge_indexable(N, W, C) &&
      can_vectorize<T>(C, {dtokens, dout, tokens, weight})) {
    const BackwardPlan p = merge_backward_plan(N, 4 * C, kMergeShapes[shape].lanes);
    with_merge_shape<T>(shape, [&](auto MAXV, auto LANES) {
      constexpr int kMaxv = decltype(MAXV)::value, kLanes = decltype(LANES)::value;
      auto kernel = merge_layernorm_backward_reg_kernel<T, kVec16<T>, kMaxv, kLanes>;
      allow_shared(kernel, p.shared_bytes);
      kernel<<<(unsigned)p.blocks, p.warps * kWarp, p.shared_bytes, stream>>>(
          dtokens, scratch, dout, tokens, weight, mean, rstd, (int)N, H, W, C, p.rows_per_block);
    });
    *plan = p;
    return true;
  }
  return false;
}

}  // namespace

// The register backward's fixed partition: slot count per block from the shared memory its
// running sums need (kResidualParts x C floats per slot, within kRegBackwardSharedBytes), rows
// per block from (rows, C) alone, at most two full waves of its resident blocks
// (reg_backward_blocks_per_sm) on the device's SMs.
BackwardPlan reg_backward_plan(int64_t N, int C, int lanes, int maxv) {
  BackwardPlan p;
  int per_warp = 32 / lanes;
  int64_t fit =
      kRegBackwardSharedBytes / (kResidualParts * (int64_t)C * (int64_t)sizeof(float) * per_warp);
  p.warps = fit < 1 ? 1 : fit > kBackwardMaxWarps ? kBackwardMaxWarps : (int)fit;
  int64_t slots = (int64_t)p.warps * per_warp;
  int64_t max_rows = slots * 2 * device_sm_count() * reg_backward_blocks_per_sm(maxv);
  int64_t rows_per_slot = N > max_rows ? (N + max_rows - 1) / max_rows : 1;
  p.rows_per_block = rows_per_slot * slots;
  p.blocks = (N + p.rows_per_block - 1) / p.rows_per_block;
  p.shared_bytes = (size_t)slots * kResidualParts * (size_t)C * sizeof(float);
  return p;
}

// The merge backward's fixed partition: slots per block from its shared memory (2 * 4C floats
// each, within the default 48 KB), and rows per slot so that the blocks come to about
// merge_backward_blocks(): one wave at two resident blocks per SM (264 on the H200's 132; the
// bf16 / fp16 shapes of Swin-T's merges take 115-207 registers a thread and 48 KB of shared
// memory a block, two blocks a SM), each slot walking several rows, so no partial last wave. A
// count fixed per device, so that the partition depends on the shapes and the SM count only.
static int64_t merge_backward_blocks() {
  return 2 * (int64_t)device_sm_count();
}

BackwardPlan merge_backward_plan(int64_t N, int C4, int lanes) {
  BackwardPlan p;
  const int per_warp = 32 / lanes;
  const int64_t fit = kDefaultSharedBytes / (2 * (int64_t)C4 * (int64_t)sizeof(float) * per_warp);
  p.warps = fit < 1 ? 1 : fit > kBackwardMaxWarps ? kBackwardMaxWarps : (int)fit;
  const int64_t slots = (int64_t)p.warps * per_warp;
  const int64_t wave = slots * merge_backward_blocks();
  const int64_t rows_per_slot = N > wave ? (N + wave - 1) / wave : 1;
  p.rows_per_block = rows_per_slot * slots;
  p.blocks = (N + p.rows_per_block - 1) / p.rows_per_block;
  p.shared_bytes = (size_t)slots * 2 * (size_t)C4 * sizeof(float);
  return p;
}

bool residual_layernorm_forward_reg(DType dt, void *x_out, void *ln_out, float *mean, float *rstd,
                                    const void *x_in, const void *branch, RowMap bmap,
                                    const float *scale, const float *weight, const float *bias,
                                    RowMap lmap, int64_t N, int64_t L, int C, cudaStream_t stream) {
  bool launched = false;
  SWIN_DISPATCH(dt, T,
                launched = launch_residual_forward<T>(
                    static_cast<T *>(x_out), static_cast<T *>(ln_out), mean, rstd,
                    static_cast<const T *>(x_in), static_cast<const T *>(branch), bmap, scale,
                    weight, bias, lmap, N, L, C, stream));
  return launched;
}

bool residual_layernorm_backward_reg(DType dt, float *dres_out, void *dbranch, float *scratch,
                                     const float *dres_in, const void *dln, const void *x,
                                     const float *weight, const float *mean, const float *rstd,
                                     RowMap bmap, const float *scale, RowMap lmap, int64_t N,
                                     int64_t L, int C, bool sums, BackwardPlan *plan,
                                     cudaStream_t stream) {
  bool launched = false;
  SWIN_DISPATCH(dt, T,
                launched = launch_residual_backward<T>(
                    dres_out, static_cast<T *>(dbranch), scratch, dres_in,
                    static_cast<const T *>(dln), static_cast<const T *>(x), weight, mean, rstd,
                    bmap, scale, lmap, N, L, C, sums, plan, stream));
  return launched;
}

bool merge_layernorm_forward_reg(DType dt, void *out, float *mean, float *rstd, const void *tokens,
                                 const float *weight, const float *bias, int64_t N, int H, int W,
                                 int C, cudaStream_t stream) {
  bool launched = false;
  SWIN_DISPATCH(dt, T,
                launched = launch_merge_forward<T>(static_cast<T *>(out), mean, rstd,
                                                   static_cast<const T *>(tokens), weight, bias, N,
                                                   H, W, C, stream));
  return launched;
}

bool merge_layernorm_backward_reg(DType dt, float *dtokens, float *scratch, const void *dout,
                                  const void *tokens, const float *weight, const float *mean,
                                  const float *rstd, int64_t N, int H, int W, int C,
                                  BackwardPlan *plan, cudaStream_t stream) {
  bool launched = false;
  SWIN_DISPATCH(dt, T,
                launched = launch_merge_backward<T>(dtokens, scratch, static_cast<const T *>(dout),
                                                    static_cast<const T *>(tokens), weight, mean,
                                                    rstd, N, H, W, C, plan, stream));
  return launched;
}

}  // namespace swin_cuda::layernorm
