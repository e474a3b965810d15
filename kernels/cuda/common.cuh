// common.cuh: the small device-side helpers every CUDA kernel file shares: alignment checks for
// 16-byte vector access, warp reductions, and the row launch shape of the permutation kernels.
#pragma once
#include <cstdint>

namespace swin_cuda {

constexpr unsigned kFullMask = 0xffffffffu;

// 16-byte aligned: float4 loads and stores are allowed at p.
inline bool aligned16(const void *p) {
  return ((uintptr_t)p & 15u) == 0;
}

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
// or float4 chunks) and each of the `rows` thread rows takes one row. Lanes are the smallest power
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

}  // namespace swin_cuda
