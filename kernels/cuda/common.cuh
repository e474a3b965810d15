// common.cuh: the small device-side helpers every CUDA kernel file shares: the element types of
// the compute precisions (f32, bf16, f16) with their conversions and a dispatch from DType,
// 16-byte vector access, warp reductions, and the row launch shape of the row kernels.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "src/tensor.h"

namespace swin_cuda {

constexpr unsigned kFullMask = 0xffffffffu;

// 16-byte aligned: 16-byte loads and stores are allowed at p.
inline bool aligned16(const void *p) {
  return ((uintptr_t)p & 15u) == 0;
}

// ---- element types ----------------------------------------------------------------------------
// Activations and GEMM weights are stored as T (float, __nv_bfloat16 or __half); arithmetic is
// in float. Conversions to the 16-bit types round to nearest even.
template <typename T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <>
__device__ __forceinline__ float to_float<__half>(__half v) {
  return __half2float(v);
}

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}

// v as it reads back after a store as T.
template <typename T>
__device__ __forceinline__ float round_to(float v) {
  return to_float<T>(from_float<T>(v));
}

// Elements of T in one 16-byte access.
template <typename T>
constexpr int kVec16 = 16 / (int)sizeof(T);

// VEC consecutive elements at p as floats, and the store back: 16-byte accesses when the VEC
// elements are a whole number of 16-byte vectors (VEC == kVec16<T>, or 8 floats next to 8 bf16
// values), which needs p 16-byte aligned; else one element at a time.
template <typename T, int VEC>
__device__ __forceinline__ void load_vec(float (&v)[VEC], const T *p) {
  if constexpr (VEC * sizeof(T) % 16 == 0) {
    constexpr int kPer = 16 / (int)sizeof(T);
#pragma unroll
    for (int q = 0; q < VEC / kPer; q++) {
      int4 raw = reinterpret_cast<const int4 *>(p)[q];
      const T *e = reinterpret_cast<const T *>(&raw);
#pragma unroll
      for (int k = 0; k < kPer; k++) v[q * kPer + k] = to_float<T>(e[k]);
    }
  } else {
#pragma unroll
    for (int k = 0; k < VEC; k++) v[k] = to_float<T>(p[k]);
  }
}
template <typename T, int VEC>
__device__ __forceinline__ void store_vec(T *p, const float (&v)[VEC]) {
  if constexpr (VEC * sizeof(T) % 16 == 0) {
    constexpr int kPer = 16 / (int)sizeof(T);
#pragma unroll
    for (int q = 0; q < VEC / kPer; q++) {
      int4 raw;
      T *e = reinterpret_cast<T *>(&raw);
#pragma unroll
      for (int k = 0; k < kPer; k++) e[k] = from_float<T>(v[q * kPer + k]);
      reinterpret_cast<int4 *>(p)[q] = raw;
    }
  } else {
#pragma unroll
    for (int k = 0; k < VEC; k++) p[k] = from_float<T>(v[k]);
  }
}

[[noreturn]] inline void unsupported_dtype(const char *fn, DType dt) {
  fprintf(stderr, "%s: unsupported compute type %s (want F32, BF16 or F16)\n", fn, dtype_name(dt));
  abort();
}

// Runs the statement with T bound to the element type of dt.
#define SWIN_DISPATCH(dt, T, ...)                 \
  switch (dt) {                                   \
    case DTYPE_F32: {                             \
      using T = float;                            \
      __VA_ARGS__;                                \
    } break;                                      \
    case DTYPE_BF16: {                            \
      using T = __nv_bfloat16;                    \
      __VA_ARGS__;                                \
    } break;                                      \
    case DTYPE_F16: {                             \
      using T = __half;                           \
      __VA_ARGS__;                                \
    } break;                                      \
    default:                                      \
      swin_cuda::unsupported_dtype(__func__, dt); \
  }

// ---- reductions -------------------------------------------------------------------------------
// Butterfly reductions over a full warp: every lane ends with the same value, a fixed function of
// the 32 inputs (so the result is deterministic).
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// A block of (lanes, rows) threads: `lanes` threads stride over one row of `width` items (channels
// or vector chunks) and each of the `rows` thread rows takes one row. Lanes are the smallest power
// of two covering the width (at most a warp), so short rows still fill the warps.
struct RowLaunch {
  dim3 grid, block;
};

inline RowLaunch row_launch(int64_t rows_total, int width, int threads_per_block) {
  int lanes = 1;
  while (lanes < width && lanes < 32) lanes *= 2;
  int rows = threads_per_block / lanes;
  RowLaunch l;
  l.block = dim3(lanes, rows);
  l.grid = dim3((unsigned)((rows_total + rows - 1) / rows));
  return l;
}

// Blocks of `threads` covering n items, one item per thread.
inline unsigned blocks_for(int64_t n, int threads) {
  return (unsigned)((n + threads - 1) / threads);
}

}  // namespace swin_cuda
