// layernorm.cuh: what the CUDA LayerNorm files (kernels/cuda/layernorm*.cu) share: launch
// constants, the row maps that fold the window partition in, the backward's partition and its
// parameter-gradient sums, and the launchers of both strategies, between which the entry points
// in layernorm.cu choose.
#pragma once
#include <cstdint>
#include <initializer_list>

#include "kernels/cuda/common.cuh"
#include "kernels/layernorm.h"
#include "src/base/cuda_util.h"

namespace swin_cuda::layernorm {

constexpr int kWarp = 32;
constexpr int kForwardWarpsPerBlock = 8;
constexpr int kForwardThreads = kForwardWarpsPerBlock * kWarp;
// Shared memory a block may use without opting in.
constexpr int kDefaultSharedBytes = 48 * 1024;
// The backward's warps per block: at most 8, fewer when 8 warps' accumulators (2C floats each)
// would not fit in the default shared memory (C > 768).
constexpr int kBackwardMaxWarps = 8;
constexpr int kBackwardMaxThreads = kBackwardMaxWarps * kWarp;

// A map passed by value: `on` false means plain token order. `fast`: every token index of the
// launch is below 2^31, so rows are addressed with the precomputed divisions of kernels/window.h
// (WindowRows, FastDiv); else in 64 bits. The divisions of every row index by runtime values,
// as real (64-bit) divisions, made these kernels instruction-bound (kernels/PERF.md).
struct RowMap {
  WindowRows w;
  FastDiv L;  // tokens per image
  bool on, fast;
};

// The image of token t: t / L.
__device__ __forceinline__ int64_t image_of(const RowMap &map, int64_t t, int64_t L) {
  return map.fast ? (int64_t)fast_div(map.L, (uint32_t)t) : t / L;
}

// Row of token t (image b = t / L) in the order of map (t itself when the map is off).
__device__ __forceinline__ int64_t mapped_row(const RowMap &map, int64_t t, int64_t L) {
  if (!map.on) return t;
  if (map.fast) return (int64_t)window_rows_row(&map.w, (uint32_t)t);
  int64_t b = t / L, yx = t - b * L;
  int y = (int)(yx / map.w.m.W), x = (int)(yx - (int64_t)y * map.w.m.W);
  return window_row(&map.w.m, b, y, x);
}

// The fixed partition of a backward: `warps` warps per block, `rows_per_block` consecutive rows
// per block, `blocks` blocks. Everything is a function of (rows, C) and the number of C-wide
// sums a block keeps (`parts`: dweight and dbias; the residual backward's third, dbranch) alone.
struct BackwardPlan {
  int warps;
  int64_t rows_per_block, blocks;
  size_t shared_bytes;  // per block: `warps` accumulator sets of parts x C floats
};

// The C-wide sums of the residual backward's blocks: dweight, dbias, dbranch (kernels/layernorm.h
// calls the last one dbranch_bias).
constexpr int kResidualParts = 3;

// The RowMap of m (NULL: token order) for a launch over `rows` tokens, L per image.
RowMap row_map(const WindowMap *m, int64_t L, int64_t rows);

// The second pass of a backward's parameter-gradient sums (layernorm.cu): parts [first, end) of
// the blocks' slots of partial (blocks x parts x C floats) added in block order, in double, into
// the outputs (+=; a part whose output is NULL is skipped).
struct PartOutputs {
  float *out[kResidualParts];
};
void launch_part_reduce(PartOutputs outs, const float *partial, int64_t blocks, int C, int parts,
                        int first, int end, cudaStream_t stream);

// One warp's accumulators (parts x C floats) zeroed by its lanes.
__device__ __forceinline__ void zero_accumulators(float *acc, int C, int parts = 2) {
  for (int c = threadIdx.x % kWarp; c < parts * C; c += kWarp) acc[c] = 0.0f;
}

// After the row loop (every thread of the block reaches it): the block's warps' accumulators
// (parts x C each) added in warp order into the block's slot of partial (parts x C).
__device__ __forceinline__ void store_block_partial(float *partial, const float *acc_all, int C,
                                                    int parts = 2) {
  __syncthreads();
  const int warps = blockDim.x / kWarp, width = parts * C;
  float *slot = partial + (int64_t)blockIdx.x * width;
  for (int c = threadIdx.x; c < width; c += blockDim.x) {
    float s = 0.0f;
    for (int w = 0; w < warps; w++) s += acc_all[(size_t)w * width + c];
    slot[c] = s;
  }
}

template <typename Kernel>
void allow_shared(Kernel kernel, size_t bytes) {
  if (bytes > (size_t)kDefaultSharedBytes)
    CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

// 16-byte vectors when every row start is 16-byte aligned (width a multiple of the vector and
// aligned bases), else one element at a time.
template <typename T>
bool can_vectorize(int width, std::initializer_list<const void *> ptrs) {
  if (width % kVec16<T> != 0) return false;
  for (const void *p : ptrs)
    if (p && !aligned16(p)) return false;
  return true;
}

// ---- multi-pass kernels (layernorm_multipass.cu): any row, one warp per row -------------------
// Each launches the multi-pass kernel for any C and alignment (16-byte vectors where the rows
// allow). The backwards return the plan they used: its blocks hold the parameter-gradient
// partials in scratch (parts x C floats each: kResidualParts for the residual, 2 of 4C for the
// merge).
// The multi-pass backwards' partition of N rows of C with `parts` C-wide sums per block.
BackwardPlan backward_plan(int64_t N, int C, int parts = 2);
void residual_layernorm_forward_multipass(DType dt, void *x_out, void *ln_out, float *mean,
                                          float *rstd, const void *x_in, const void *branch,
                                          RowMap bmap, const float *scale, const float *weight,
                                          const float *bias, RowMap lmap, int64_t N, int64_t L,
                                          int C, cudaStream_t stream);
BackwardPlan residual_layernorm_backward_multipass(
    DType dt, float *dres_out, void *dbranch, float *scratch, const float *dres_in, const void *dln,
    const void *x, const float *weight, const float *mean, const float *rstd, RowMap bmap,
    const float *scale, RowMap lmap, int64_t N, int64_t L, int C, bool sums, cudaStream_t stream);
void merge_layernorm_forward_multipass(DType dt, void *out, float *mean, float *rstd,
                                       const void *tokens, const float *weight, const float *bias,
                                       int64_t N, int H, int W, int C, cudaStream_t stream);
BackwardPlan merge_layernorm_backward_multipass(DType dt, float *dtokens, float *scratch,
                                                const void *dout, const void *tokens,
                                                const float *weight, const float *mean,
                                                const float *rstd, int64_t N, int H, int W, int C,
                                                cudaStream_t stream);

// ---- register kernels (layernorm_register.cu): 16-byte-aligned rows that fit a lane's registers
// Each launches the register kernel and returns true when the rows fit one of its shapes and
// every row start is 16-byte aligned; else it returns false and launches nothing. The backwards
// set *plan to the partition they used, as the multi-pass ones return it.
// The register backwards' partitions: the residual's for a row shape (lanes, maxv), the merge's
// for merged rows of C4 = 4C over `lanes` lanes.
BackwardPlan reg_backward_plan(int64_t N, int C, int lanes, int maxv);
BackwardPlan merge_backward_plan(int64_t N, int C4, int lanes);
bool residual_layernorm_forward_reg(DType dt, void *x_out, void *ln_out, float *mean, float *rstd,
                                    const void *x_in, const void *branch, RowMap bmap,
                                    const float *scale, const float *weight, const float *bias,
                                    RowMap lmap, int64_t N, int64_t L, int C, cudaStream_t stream);
bool residual_layernorm_backward_reg(DType dt, float *dres_out, void *dbranch, float *scratch,
                                     const float *dres_in, const void *dln, const void *x,
                                     const float *weight, const float *mean, const float *rstd,
                                     RowMap bmap, const float *scale, RowMap lmap, int64_t N,
                                     int64_t L, int C, bool sums, BackwardPlan *plan,
                                     cudaStream_t stream);
bool merge_layernorm_forward_reg(DType dt, void *out, float *mean, float *rstd, const void *tokens,
                                 const float *weight, const float *bias, int64_t N, int H, int W,
                                 int C, cudaStream_t stream);
bool merge_layernorm_backward_reg(DType dt, float *dtokens, float *scratch, const void *dout,
                                  const void *tokens, const float *weight, const float *mean,
                                  const float *rstd, int64_t N, int H, int W, int C,
                                  BackwardPlan *plan, cudaStream_t stream);

}  // namespace swin_cuda::layernorm
