// layernorm_register.cuh: what the register-resident LayerNorm kernels share
// (layernorm_register.cu: residual + LayerNorm and patch merging + LayerNorm;
// layernorm_postnorm.cu: Swin V2's res-post-norm residual): the shared-memory accumulation of
// parameter-gradient terms, and the row shapes (lanes per row, vectors per lane) with the
// dispatch over the instantiated ones. layernorm_register.cu's opening comment describes
// the layout: vector k of lane l of a row covers elements ((k * LANES + l) * VEC ...).
#pragma once
#include <type_traits>

#include "kernels/cuda/layernorm.cuh"

namespace swin_cuda::layernorm {

// The mean and 1 / sqrt(variance + eps) of a row of C elements held as v (lane sl's vectors of
// the row layout): two passes over the registers (the mean, then the squared deviations), each a
// lane's sum in order, then the row's shuffle tree; IEEE sqrt and division, as the other
// LayerNorm kernels. Every lane of the warp calls it.
template <int VEC, int MAXV, int LANES>
__device__ __forceinline__ void row_stats(const float (&v)[MAXV][VEC], int C, int sl, float *mean,
                                          float *rstd) {
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < MAXV; k++)
    if ((k * LANES + sl) * VEC < C)
#pragma unroll
      for (int e = 0; e < VEC; e++) sum += v[k][e];
  const float m = group_sum<LANES>(sum) / C;
  float sq = 0.0f;
#pragma unroll
  for (int k = 0; k < MAXV; k++)
    if ((k * LANES + sl) * VEC < C)
#pragma unroll
      for (int e = 0; e < VEC; e++) sq += (v[k][e] - m) * (v[k][e] - m);
  *mean = m;
  *rstd = 1.0f / sqrtf(group_sum<LANES>(sq) / C + LAYERNORM_EPS);
}

// A register backward block's rows: slots of LANES lanes (32 / LANES a warp), slot `slot` of
// `slots` taking rows begin + slot, begin + slot + slots, ... of the block's [begin, end); sl is
// the lane within the slot.
template <int LANES>
struct RowSlots {
  int sl, slot, slots;
  int64_t begin, end;
  __device__ RowSlots(int64_t rows_per_block, int64_t N) {
    const int lane = threadIdx.x % 32;
    sl = lane % LANES;
    slots = blockDim.x / 32 * (32 / LANES);
    slot = threadIdx.x / 32 * (32 / LANES) + lane / LANES;
    begin = (int64_t)blockIdx.x * rows_per_block;
    end = begin + rows_per_block < N ? begin + rows_per_block : N;
  }
};

// The row slots' shared-memory sums, `floats` in all (a multiple of 4, 16-byte aligned), set to 0
// by the whole block; every thread calls it (a barrier).
__device__ __forceinline__ void zero_slot_sums(float *acc_all, int floats) {
  for (int e = threadIdx.x * 4; e < floats; e += blockDim.x * 4)
    *reinterpret_cast<float4 *>(acc_all + e) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  __syncthreads();
}

// The block's partial (`width` floats at out): the slots' sums (slot-major, `width` floats each)
// added in slot order; every thread calls it (a barrier first).
__device__ __forceinline__ void store_slot_sums(float *out, const float *acc_all, int width,
                                                int slots) {
  __syncthreads();
  for (int c = threadIdx.x; c < width; c += blockDim.x) {
    float total = 0.0f;
    for (int w = 0; w < slots; w++) total += acc_all[(size_t)w * width + c];
    out[c] = total;
  }
}

// acc[e] = a[e] * b[e] + acc[e] (one rounding, as a register accumulator's += a * b compiles),
// or with b NULL acc[e] += a[e], for the VEC floats at acc (shared memory, 16-byte aligned: VEC
// is 4 or 8).
template <int VEC>
__device__ __forceinline__ void shared_fma(float *acc, const float (&a)[VEC], const float *b) {
#pragma unroll
  for (int q = 0; q < VEC / 4; q++) {
    float4 v = reinterpret_cast<float4 *>(acc)[q];
    float *f = reinterpret_cast<float *>(&v);
#pragma unroll
    for (int e = 0; e < 4; e++)
      f[e] = b ? fmaf(a[4 * q + e], b[4 * q + e], f[e]) : f[e] + a[4 * q + e];
    reinterpret_cast<float4 *>(acc)[q] = v;
  }
}

// VEC elements of T from 16 raw bytes (kVec16<T> == VEC).
template <typename T, int VEC>
__device__ __forceinline__ void unpack_vec(float (&v)[VEC], const int4 &raw) {
  static_assert(VEC * sizeof(T) == 16, "one 16-byte vector");
  const T *e = reinterpret_cast<const T *>(&raw);
#pragma unroll
  for (int i = 0; i < VEC; i++) v[i] = to_float<T>(e[i]);
}

// The 16 raw bytes of VEC values already representable in T (rounded to T before), the inverse
// of unpack_vec.
template <typename T, int VEC>
__device__ __forceinline__ int4 pack_vec(const float (&v)[VEC]) {
  static_assert(VEC * sizeof(T) == 16, "one 16-byte vector");
  int4 raw;
  T *e = reinterpret_cast<T *>(&raw);
#pragma unroll
  for (int i = 0; i < VEC; i++) e[i] = from_float<T>(v[i]);
  return raw;
}

// The residual add of the forwards, one vector: v = x + s * branch, rounded to T element by
// element (v holds x on entry).
template <typename T, int VEC>
__device__ __forceinline__ void residual_add_vec(float (&v)[VEC], const float (&branch)[VEC],
                                                 float s) {
#pragma unroll
  for (int e = 0; e < VEC; e++) v[e] = round_to<T>(v[e] + s * branch[e]);
}

// The LayerNorm output of one vector of a row: y = (v - mean) rstd weight + bias, weight and bias
// the vector's VEC floats.
template <int VEC>
__device__ __forceinline__ void normalize_vec(float (&y)[VEC], const float (&v)[VEC], float m,
                                              float r, const float *__restrict__ weight,
                                              const float *__restrict__ bias) {
  float wv[VEC], bv[VEC];
  load_vec<float, VEC>(wv, weight);
  load_vec<float, VEC>(bv, bias);
#pragma unroll
  for (int e = 0; e < VEC; e++) y[e] = (v[e] - m) * r * wv[e] + bv[e];
}

// f(v) for each of lane sl's vectors of a row held as loaded (raw, see unpack_vec), unpacked.
template <typename T, int VEC, int MAXV, int LANES, typename F>
__device__ __forceinline__ void for_each_unpacked(const int4 (&raw)[MAXV], int C, int sl, F f) {
#pragma unroll
  for (int k = 0; k < MAXV; k++)
    if ((k * LANES + sl) * VEC < C) {
      float v[VEC];
      unpack_vec<T, VEC>(v, raw[k]);
      f(v);
    }
}

// row_stats of a row held as loaded: the same sums in the same order, the vectors unpacked in
// each of the two passes.
template <typename T, int VEC, int MAXV, int LANES>
__device__ __forceinline__ void row_stats_raw(const int4 (&raw)[MAXV], int C, int sl, float *mean,
                                              float *rstd) {
  float sum = 0.0f;
  for_each_unpacked<T, VEC, MAXV, LANES>(raw, C, sl, [&](const float(&v)[VEC]) {
#pragma unroll
    for (int e = 0; e < VEC; e++) sum += v[e];
  });
  const float m = group_sum<LANES>(sum) / C;
  float sq = 0.0f;
  for_each_unpacked<T, VEC, MAXV, LANES>(raw, C, sl, [&](const float(&v)[VEC]) {
#pragma unroll
    for (int e = 0; e < VEC; e++) sq += (v[e] - m) * (v[e] - m);
  });
  *mean = m;
  *rstd = 1.0f / sqrtf(group_sum<LANES>(sq) / C + LAYERNORM_EPS);
}

// The residual + LayerNorm forward of one row for a kernel that holds the branch itself (a GEMM's
// staged output tile: kernels/cuda/gemm_small_k.cu, gemm_hopper.cu), lane sl of the row's LANES,
// the row held as loaded in raw (x on entry): x + s * branch rounded to T into raw and, when
// active, x_row; then with y_row not NULL (uniform over the warp) the row's statistics and
// LN(x) into y_row and mean, rstd (lane 0), when active. The operations of
// residual_layernorm_forward_reg_kernel in its order: the same bits. Inactive rows take part in
// the shuffles; every lane of the warp calls it.
template <typename T, int VEC, int MAXV, int LANES>
__device__ __forceinline__ void residual_layernorm_row(
    int4 (&raw)[MAXV], const T *branch, float s, bool active, T *x_row, T *y_row, float *mean,
    float *rstd, const float *__restrict__ weight, const float *__restrict__ bias, int C, int sl) {
#pragma unroll
  for (int k = 0; k < MAXV; k++) {
    const int c = (k * LANES + sl) * VEC;
    if (c >= C) continue;
    float v[VEC], bv[VEC];
    unpack_vec<T, VEC>(v, raw[k]);
    load_vec<T, VEC>(bv, branch + c);
    residual_add_vec<T, VEC>(v, bv, s);
    raw[k] = pack_vec<T, VEC>(v);
    if (active) *reinterpret_cast<int4 *>(x_row + c) = raw[k];
  }
  if (!y_row) return;
  float m, r;
  row_stats_raw<T, VEC, MAXV, LANES>(raw, C, sl, &m, &r);
  if (!active) return;
#pragma unroll
  for (int k = 0; k < MAXV; k++) {
    const int c = (k * LANES + sl) * VEC;
    if (c >= C) continue;
    float v[VEC], y[VEC];
    unpack_vec<T, VEC>(v, raw[k]);
    normalize_vec<VEC>(y, v, m, r, weight + c, bias + c);
    store_vec<T, VEC>(y_row + c, y);
  }
  if (sl == 0) {
    *mean = m;
    *rstd = r;
  }
}

// The register kernels' shape for rows of C elements of T: LANES lanes per row, MAXV vectors per
// lane; lanes == 0 when a row does not fit (the multi-pass kernels then serve it).
struct RegShape {
  int lanes, maxv;
};

// The forwards and the res-post-norm backward (exact_fit) take rows of 3 or 4 vectors per lane
// over 4..32 lanes where they fit exactly (every Swin width: 96 = 12 vectors of 8 bf16 is 4 lanes
// x 3, 128 is 4 x 4, 384 is 16 x 3, ...): no idle lanes, and the per-row work (statistics,
// addressing) is shared by few lanes. The residual + LayerNorm backward, which holds three values
// per element and the parameter-gradient terms, would need ~150 registers for 3 vectors: it and
// other widths take the smallest power-of-two count of vectors over up to 32 lanes.
template <typename T>
RegShape reg_shape(int C, bool exact_fit) {
  RegShape r = {0, 0};
  if (C % kVec16<T> != 0) return r;
  int nvec = C / kVec16<T>;
  for (int maxv = 3; maxv <= 4 && exact_fit; maxv++)
    for (int lanes = 4; lanes <= 32; lanes *= 2)
      if (nvec == maxv * lanes) return RegShape{lanes, maxv};
  // Up to 32 vectors: one per lane (8, 16 or 32 lanes); more: 32 lanes with several each, the
  // only lane count with_reg_shape instantiates for MAXV > 1 (rows of 17-31 vectors once got 16
  // lanes here but ran on 32 with two vectors' registers, the second never used).
  r.lanes = nvec > 16 ? 32 : nvec > 8 ? 16 : 8;
  int need = (nvec + r.lanes - 1) / r.lanes;
  for (r.maxv = 1; r.maxv < need;) r.maxv *= 2;
  if (r.maxv > 16) r.lanes = 0;
  return r;
}

// Calls f(integral_constant<MAXV>, integral_constant<LANES>) for the instantiated shapes: the
// power-of-two ones (both kernels) here, the exact fits of the forward in with_exact_reg_shape.
template <typename F>
void with_reg_shape(RegShape r, F f) {
  using std::integral_constant;
  if (r.maxv == 1 && r.lanes == 8)
    f(integral_constant<int, 1>{}, integral_constant<int, 8>{});
  else if (r.maxv == 1 && r.lanes == 16)
    f(integral_constant<int, 1>{}, integral_constant<int, 16>{});
  else if (r.maxv == 1)
    f(integral_constant<int, 1>{}, integral_constant<int, 32>{});
  else if (r.maxv == 2)
    f(integral_constant<int, 2>{}, integral_constant<int, 32>{});
  else if (r.maxv == 4)
    f(integral_constant<int, 4>{}, integral_constant<int, 32>{});
  else if (r.maxv == 8)
    f(integral_constant<int, 8>{}, integral_constant<int, 32>{});
  else
    f(integral_constant<int, 16>{}, integral_constant<int, 32>{});
}

template <typename F>
void with_exact_reg_shape(RegShape r, F f) {
  using std::integral_constant;
  if (r.maxv != 3 && r.maxv != 4) return with_reg_shape(r, f);
  auto lanes = [&](auto MAXV) {
    if (r.lanes == 4)
      f(MAXV, integral_constant<int, 4>{});
    else if (r.lanes == 8)
      f(MAXV, integral_constant<int, 8>{});
    else if (r.lanes == 16)
      f(MAXV, integral_constant<int, 16>{});
    else
      f(MAXV, integral_constant<int, 32>{});
  };
  if (r.maxv == 3)
    lanes(integral_constant<int, 3>{});
  else
    lanes(integral_constant<int, 4>{});
}

}  // namespace swin_cuda::layernorm
