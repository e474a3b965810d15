// layernorm.cu: the entry points of the fused residual + LayerNorm and patch merging + LayerNorm
// on CUDA (kernels/layernorm.h, kernels/patch.h), which run the register or the multi-pass
// kernels, and the second pass that sums the backward's parameter-gradient partials (which the
// res-post-norm backward, kernels/cuda/layernorm_postnorm.cu, also uses).
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/layernorm.cuh"
#include "kernels/patch.h"

// Forward and backward, for f32, bf16 and f16 tensors with f32 statistics. kernels/cpu/layernorm.c
// and kernels/cpu/patch.c compose the same ops from their reference pieces and are the spec.
//
// Two strategies, each op in both. The register kernels (layernorm_register.cu), the fast path
// for 16-byte-aligned rows that fit a lane's registers, give a row 4 to 32 lanes of a warp, read
// it from global memory once into registers and write it once. The multi-pass kernels
// (layernorm_multipass.cu) serve every other row (C not a multiple of the 16-byte vector,
// misaligned bases, rows too wide): one warp per row, re-read from L1/L2 for each pass. In both,
// the lanes of a row stride over its C values, 16 bytes at a time where the layout allows, so
// every access is coalesced, and the row statistics are shuffle sums, the same on every lane of
// the row. The window partition and reverse around the attention are folded into the row
// addressing (window_rows_row, or window_row in 64 bits: kernels/window.h): the residual reads the
// attention branch from its window row, and LN1 writes its output to the window row, so no
// separate permutation pass exists.
//
// The backward's parameter gradients are sums over all rows. Floating-point atomics would make
// their last bits depend on timing, so each block instead owns a fixed range of rows, each of its
// warps (multi-pass) or row slots (register kernels) accumulates its rows' dout * xhat and dout
// in its own copy (shared memory, or the merge's registers: no races), the block adds those in a
// fixed order into its slot of scratch, and a second kernel adds the blocks' slots in block order
// (in double). The partition depends only on (rows, C) and the device's SM count, so the
// gradients are bitwise the same run after run on one kind of GPU. The residual backward sums the
// branch gradient it writes the same way (the bias gradient of the linear layer that produced
// the branch: a third C-wide part of each block's slot), with or without the LayerNorm term.

using namespace swin_cuda::layernorm;

namespace swin_cuda::layernorm {

// The reduction of the partials: 32 columns per block, 32 thread rows splitting the partials.
constexpr int kReduceRows = 32;
constexpr int kReduceThreads = kWarp * kReduceRows;

RowMap row_map(const WindowMap *m, int64_t L, int64_t rows) {
  RowMap r;
  r.on = m != nullptr;
  WindowMap plain = {1, 1, 1, 1, 0, 0};
  r.w = window_rows_make(m ? m : &plain);
  r.fast = rows < ((int64_t)1 << 31) && L < ((int64_t)1 << 31);
  r.L = fast_div_make(r.fast ? (uint32_t)L : 1u);
  return r;
}

namespace {

// The sums over blocks of each block's slot of partial (parts x C floats): part k's columns go
// to out[k] (+=; parts without an output are skipped), in double and in a fixed order: thread
// row ty adds blocks ty, ty + 32, ... in order, then thread row 0 adds the 32 thread rows in
// order. Block (32, 32), one block per 32 of the columns [first * C, end * C).
__global__ void __launch_bounds__(kReduceThreads)
    param_grad_reduce_kernel(PartOutputs outs, const float *__restrict__ partial, int64_t blocks,
                             int C, int parts, int first, int end) {
  __shared__ double rows[kReduceRows][kWarp];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t col = (int64_t)first * C + (int64_t)blockIdx.x * kWarp + tx;
  const int part = (int)(col / C);
  // A select, not outs.out[part]: a dynamic index into a parameter array costs a stack copy.
  float *out = part == 0 ? outs.out[0] : part == 1 ? outs.out[1] : outs.out[2];
  const bool live = col < (int64_t)end * C && out != nullptr;
  const int64_t width = (int64_t)parts * C;
  rows[ty][tx] = live ? ordered_strided_sum(partial + col, ty, blocks, kReduceRows, width) : 0.0;
  __syncthreads();
  if (ty == 0 && live) {
    double total = 0.0;
    for (int y = 0; y < kReduceRows; y++) total += rows[y][tx];
    out[col - (int64_t)part * C] += (float)total;
  }
}

}  // namespace

void launch_part_reduce(PartOutputs outs, const float *partial, int64_t blocks, int C, int parts,
                        int first, int end, cudaStream_t stream) {
  const unsigned reduce_blocks = (unsigned)(((int64_t)(end - first) * C + kWarp - 1) / kWarp);
  param_grad_reduce_kernel<<<reduce_blocks, dim3(kWarp, kReduceRows), 0, stream>>>(
      outs, partial, blocks, C, parts, first, end);
  CUDA_CHECK_LAUNCH();
}

}  // namespace swin_cuda::layernorm

namespace {

// dweight, dbias += the sums of slots of [dweight terms | dbias terms] (2C each).
void launch_param_grad_reduce(float *dweight, float *dbias, const float *partial, int64_t blocks,
                              int C, cudaStream_t stream) {
  launch_part_reduce(PartOutputs{{dweight, dbias, nullptr}}, partial, blocks, C, 2, 0, 2, stream);
}

void check_even(const char *fn, int H, int W) {
  if (H % 2 == 0 && W % 2 == 0) return;
  fprintf(stderr, "%s: patch merging needs an even map, got %dx%d\n", fn, H, W);
  abort();
}

}  // namespace

void residual_layernorm_forward_cuda(DType dt, void *x_out, void *ln_out, float *mean, float *rstd,
                                     const void *x_in, const void *branch,
                                     const WindowMap *branch_map, const float *scale,
                                     const float *weight, const float *bias,
                                     const WindowMap *ln_map, int B, int64_t L, int C,
                                     cudaStream_t stream) {
  int64_t N = (int64_t)B * L;
  if (N <= 0 || C <= 0 || (!branch && !ln_out)) return;
  if (branch && !x_out) {
    fprintf(stderr, "residual_layernorm_forward_cuda: a branch needs x_out\n");
    abort();
  }
  const RowMap bmap = row_map(branch_map, L, N), lmap = row_map(ln_map, L, N);
  if (!residual_layernorm_forward_reg(dt, x_out, ln_out, mean, rstd, x_in, branch, bmap, scale,
                                      weight, bias, lmap, N, L, C, stream))
    residual_layernorm_forward_multipass(dt, x_out, ln_out, mean, rstd, x_in, branch, bmap, scale,
                                         weight, bias, lmap, N, L, C, stream);
  CUDA_CHECK_LAUNCH();
}

// Also covers the merge backward (backward_plan with 2 parts of its 4C: blocks x 2 x 4C floats).
int64_t residual_layernorm_backward_cuda_scratch(int64_t rows, int C) {
  if (rows <= 0 || C <= 0) return 0;
  int64_t blocks = backward_plan(rows, C).blocks;
  int64_t k = backward_plan(rows, C, kResidualParts).blocks;
  blocks = k > blocks ? k : blocks;
  for (int lanes = 4; lanes <= 32; lanes *= 2)  // any register shape the dispatch may pick
    for (int maxv = 1; maxv <= 16; maxv *= 2) {
      k = reg_backward_plan(rows, C, lanes, maxv).blocks;
      blocks = k > blocks ? k : blocks;
    }
  return blocks * kResidualParts * (int64_t)C;
}

void residual_layernorm_backward_cuda(DType dt, float *dres_out, void *dbranch, float *dbranch_bias,
                                      float *dweight, float *dbias, const float *dres_in,
                                      const void *dln, const void *x, const float *weight,
                                      const float *mean, const float *rstd,
                                      const WindowMap *branch_map, const float *scale,
                                      const WindowMap *ln_map, int B, int64_t L, int C,
                                      float *scratch, cudaStream_t stream) {
  int64_t N = (int64_t)B * L;
  if (N <= 0 || C <= 0) return;
  const bool sums = dbranch_bias != nullptr;
  if (sums && !dbranch) {
    fprintf(stderr, "residual_layernorm_backward_cuda: dbranch_bias without dbranch to sum\n");
    abort();
  }
  if ((dln || sums) && !scratch) {
    fprintf(stderr,
            "residual_layernorm_backward_cuda: dln or dbranch_bias needs scratch (%lld floats)\n"
            "HINT: allocate residual_layernorm_backward_cuda_scratch(B * L, C) floats on the "
            "device\n",
            (long long)residual_layernorm_backward_cuda_scratch(N, C));
    abort();
  }
  const RowMap bmap = row_map(branch_map, L, N), lmap = row_map(ln_map, L, N);
  BackwardPlan p = {};
  if (!residual_layernorm_backward_reg(dt, dres_out, dbranch, scratch, dres_in, dln, x, weight,
                                       mean, rstd, bmap, scale, lmap, N, L, C, sums, &p, stream))
    p = residual_layernorm_backward_multipass(dt, dres_out, dbranch, scratch, dres_in, dln, x,
                                              weight, mean, rstd, bmap, scale, lmap, N, L, C, sums,
                                              stream);
  CUDA_CHECK_LAUNCH();
  // Parts 0 and 1 (dweight, dbias) with the LayerNorm term, part 2 (dbranch) with its sums.
  if (dln || sums)
    launch_part_reduce(PartOutputs{{dweight, dbias, dbranch_bias}}, scratch, p.blocks, C,
                       kResidualParts, dln ? 0 : 2, sums ? 3 : 2, stream);
}

void merge_layernorm_forward_cuda(DType dt, void *out, float *mean, float *rstd, const void *tokens,
                                  const float *weight, const float *bias, int B, int H, int W,
                                  int C, cudaStream_t stream) {
  check_even("merge_layernorm_forward_cuda", H, W);
  int64_t N = (int64_t)B * (H / 2) * (W / 2);
  if (N <= 0 || C <= 0) return;
  if (!merge_layernorm_forward_reg(dt, out, mean, rstd, tokens, weight, bias, N, H, W, C, stream))
    merge_layernorm_forward_multipass(dt, out, mean, rstd, tokens, weight, bias, N, H, W, C,
                                      stream);
  CUDA_CHECK_LAUNCH();
}

// Partials for whichever backward the dispatch picks: the multi-pass plan or a register shape's.
int64_t merge_layernorm_backward_cuda_scratch(int B, int H, int W, int C) {
  const int64_t N = (int64_t)B * (H / 2) * (W / 2);
  if (N <= 0 || C <= 0) return 0;
  int64_t blocks = backward_plan(N, 4 * C).blocks;
  for (int lanes = 8; lanes <= 32; lanes *= 2) {
    const int64_t b = merge_backward_plan(N, 4 * C, lanes).blocks;
    blocks = b > blocks ? b : blocks;
  }
  return blocks * 2 * 4 * (int64_t)C;
}

void merge_layernorm_backward_cuda(DType dt, float *dtokens, float *dweight, float *dbias,
                                   const void *dout, const void *tokens, const float *weight,
                                   const float *mean, const float *rstd, int B, int H, int W, int C,
                                   float *scratch, cudaStream_t stream) {
  check_even("merge_layernorm_backward_cuda", H, W);
  int64_t N = (int64_t)B * (H / 2) * (W / 2);
  if (N <= 0 || C <= 0) return;
  BackwardPlan p = {};
  if (!merge_layernorm_backward_reg(dt, dtokens, scratch, dout, tokens, weight, mean, rstd, N, H, W,
                                    C, &p, stream))
    p = merge_layernorm_backward_multipass(dt, dtokens, scratch, dout, tokens, weight, mean, rstd,
                                           N, H, W, C, stream);
  CUDA_CHECK_LAUNCH();
  launch_param_grad_reduce(dweight, dbias, scratch, p.blocks, 4 * C, stream);
}
