// gemm_small_k.cu: a linear layer for small K on tensor cores, with the bias and, optionally,
// the exact GELU in its epilogue (kernels/gemm.h: linear_small_k_forward_cuda). bf16 only.
// Swin-T's stage 0 and 1 linear layers (IC = 96, 192) and Swin-B's stage 0 (IC = 128) are bound
// by their bytes, and elsewhere the MLP's first layer is cuBLASLt (pre = inp W^T + b) followed by
// a GELU pass that reads pre back and writes post; here one kernel writes both.
// scripts/bench_gemm.cu measures it against cuBLASLt (kernels/PERF.md, version 12): faster for
// IC = 96, which the model uses (src/model/backend_cuda.cu, use_small_k), slower for IC = 192,
// which it does not; IC = 128 (Swin-B's stage 0, version 26) is faster for proj but slower for
// fc1 writing pre alone, no gain in the step, and not used.
//
// What the largest shape costs (stage 0 fc1 at batch 128: N = 401408, IC = 96, OC = 384):
//   bytes: inp 2 N IC = 77.1 MB, pre 2 N OC = 308.3 MB, post 308.3 MB (weight 74 KB, bias:
//          nothing): 385.4 MB without post, 693.6 MB with it;
//   FLOPs: 2 N IC OC = 29.6 GFLOP;
//   at 3.6 TB/s: 107 us without post, 193 us with it; at ~450 TFLOP/s (mma.sync's realistic
//   rate on the H200) 66 us: memory-bound, with the products at a third of the byte time.
//   cuBLASLt + the GELU pass move 385.4 + 616.6 MB (the pass reads and writes 2 N OC each):
//   278 us at 3.6 TB/s, so the fused kernel's floor is 31% lower.
//   The GELU itself: ~15 instructions and 2 MUFU operations (a reciprocal, an exponential) per
//   element; 154 M elements need ~74 us of the SMs' MUFU rate (16 per clock per SM), again
//   under the byte time if the warps overlap it with the stores.
//
// Design. A CTA of 4 warps holds one column slice of the weight, BN output features x the
// whole K (BN = 96, 64 or 32, the largest dividing OC), in shared memory for its lifetime, and
// walks row tiles of 64 rows: tiles group, group + groups, ... (one wave of CTAs, blockIdx =
// group * slices + slice, so the CTAs of all slices of a row tile run together and the tile is
// read from DRAM once, then from L2). The next row tile is copied with cp.async while the
// current one is multiplied. Warps are 2 x 2, each 32 rows x BN/2 columns, K in steps of 16 as
// mma.sync m16n8k16 (bf16 in, f32 accumulators), operands through ldmatrix from rows padded by
// 16 bytes (conflict-free). The epilogue adds the bias in f32, rounds once to bf16, stages the
// warp's tile in shared memory (its own region: no block barrier), and writes 16-byte vectors:
// pre as staged, post = GELU of those same bf16 values with gelu_value<__nv_bfloat16>
// (kernels/cuda/gelu.cuh), the function the GELU forward kernel uses, so post is bitwise what
// gelu_forward_cuda gives from this pre.
// Resources (ptxas, sm_90) for the 96-column slices of Swin-T: 128 registers, no spills; shared
// memory 60,928 B per CTA for IC = 96 (3 CTAs, 12 warps per SM), 75,264 B for IC = 128 (3 CTAs),
// 103,936 B for IC = 192 (2 CTAs).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gelu.cuh"
#include "kernels/cuda/layernorm_register.cuh"
#include "kernels/gemm.h"
#include "src/base/cuda_util.h"

namespace {

using namespace swin_cuda;
using bf16 = __nv_bfloat16;

constexpr int kRows = 64;  // rows of a tile
constexpr int kWarps = 4;  // 2 x 2, each 32 rows x BN / 2 columns of the tile
constexpr int kThreads = kWarps * 32;
constexpr int kWarpRows = 32;
constexpr int kPad = 8;  // elements added to every shared row: 16 bytes

// The shared-memory layout of a CTA for K = IC and a slice of BN output columns (elements).
template <int IC, int BN>
struct SmallKLayout {
  static constexpr int kLd = IC + kPad;  // row length of the weight and input tiles
  static constexpr int kWarpCols = BN / 2;
  static constexpr int kNTiles = kWarpCols / 8;  // n-tiles of 8 columns per warp
  static constexpr int kLdStage = kWarpCols + kPad;
  static constexpr int kWeightElems = BN * kLd;             // (BN, IC) padded
  static constexpr int kInputElems = kRows * kLd;           // (64, IC) padded, two of them
  static constexpr int kStageElems = kWarpRows * kLdStage;  // (32, BN / 2) per warp
  static constexpr size_t kSmemBytes =
      sizeof(bf16) * (kWeightElems + 2 * kInputElems + kWarps * kStageElems);
  static_assert(kNTiles % 2 == 0, "ldmatrix.x4 serves n-tiles in pairs: BN a multiple of 32");
  static_assert(IC % 16 == 0, "K runs in steps of 16");
};

// rows x IC elements from src (row stride IC) into tile (row length LD), 16 bytes per cp.async,
// spread over the CTA's threads. Rows at or past `valid` read row valid - 1 instead (the last
// tile's rows past N: computed, never stored), so nothing outside src is read.
template <int IC, int LD>
__device__ __forceinline__ void copy_rows_async(bf16 *tile, const bf16 *__restrict__ src, int rows,
                                                int64_t valid) {
  constexpr int kChunks = IC / 8;
  for (int i = threadIdx.x; i < rows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = (i % kChunks) * 8;
    const int64_t sr = r < valid ? r : valid - 1;
    cp_async16(tile + r * LD + c, src + sr * IC + c);
  }
}

// acc (2 m-tiles of 16 rows, kNTiles n-tiles of 8 columns) = the warp's 32 rows of in (64, IC)
// times its BN / 2 rows of w (BN, IC), transposed.
template <int IC, int BN>
__device__ __forceinline__ void warp_product(float (&acc)[2][SmallKLayout<IC, BN>::kNTiles][4],
                                             const bf16 *in, const bf16 *w, int warp_row,
                                             int warp_col, int lane) {
  using L = SmallKLayout<IC, BN>;
#pragma unroll
  for (int kk = 0; kk < IC; kk += 16) {
    uint32_t a[2][4];
    a_rows<L::kLd>(a[0], in, warp_row, kk, lane);
    a_rows<L::kLd>(a[1], in, warp_row + 16, kk, lane);
#pragma unroll
    for (int np = 0; np < L::kNTiles / 2; np++) {
      uint32_t b[4];
      b_rows<L::kLd>(b, w, warp_col + np * 16, kk, lane);
#pragma unroll
      for (int mi = 0; mi < 2; mi++) {
        mma16816<bf16>(acc[mi][2 * np], a[mi], b[0], b[1]);
        mma16816<bf16>(acc[mi][2 * np + 1], a[mi], b[2], b[3]);
      }
    }
  }
}

// The warp's (32, BN / 2) results: + bias in f32, rounded once to bf16 into its staging tile,
// then written as 16-byte vectors to pre and, when post is not NULL, GELU of the staged bf16
// values to post. row0: the global row of the warp's first row; col0: its first column. Rows at
// or past N are not stored.
template <int IC, int BN>
__device__ __forceinline__ void warp_store(bf16 *__restrict__ pre, bf16 *__restrict__ post,
                                           bf16 *stage,
                                           const float (&acc)[2][SmallKLayout<IC, BN>::kNTiles][4],
                                           const float (&bias)[SmallKLayout<IC, BN>::kNTiles][2],
                                           int64_t row0, int64_t N, int OC, int col0, int lane) {
  using L = SmallKLayout<IC, BN>;
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mi = 0; mi < 2; mi++)
#pragma unroll
    for (int nj = 0; nj < L::kNTiles; nj++) {
      bf16 *s = stage + (mi * 16 + g) * L::kLdStage + nj * 8 + 2 * t;
      const float *c = acc[mi][nj];
      *reinterpret_cast<uint32_t *>(s) = pack2<bf16>(c[0] + bias[nj][0], c[1] + bias[nj][1]);
      *reinterpret_cast<uint32_t *>(s + 8 * L::kLdStage) =
          pack2<bf16>(c[2] + bias[nj][0], c[3] + bias[nj][1]);
    }
  __syncwarp();
  // Lanes run along the rows' 16-byte chunks: a warp store covers whole 32-byte sectors.
  constexpr int kChunks = L::kWarpCols / 8;
#pragma unroll
  for (int i = lane; i < kWarpRows * kChunks; i += 32) {
    const int r = i / kChunks, c = (i % kChunks) * 8;
    const int64_t row = row0 + r;
    if (row >= N) break;  // i grows with r: every later chunk is past N too
    const bf16 *s = stage + r * L::kLdStage + c;
    const int64_t o = row * OC + col0 + c;
    *reinterpret_cast<uint4 *>(pre + o) = *reinterpret_cast<const uint4 *>(s);
    if (post) {
      float x[8];
      load_vec<bf16, 8>(x, s);
#pragma unroll
      for (int k = 0; k < 8; k++) x[k] = gelu_value<bf16>(x[k]);
      store_vec<bf16, 8>(post + o, x);
    }
  }
  __syncwarp();  // the staging tile is rewritten by the next row tile
}

// pre (N, OC) = inp (N, IC) weight (OC, IC)^T + bias (OC or NULL); post (N, OC) = GELU(pre) when
// not NULL. Grid: groups * slices CTAs (see the top of the file), dynamic shared memory
// SmallKLayout<IC, BN>::kSmemBytes.
template <int IC, int BN>
__global__ void __launch_bounds__(kThreads)
    linear_small_k_kernel(bf16 *__restrict__ pre, bf16 *__restrict__ post,
                          const bf16 *__restrict__ inp, const bf16 *__restrict__ weight,
                          const bf16 *__restrict__ bias, int64_t N, int OC, int slices,
                          int64_t groups) {
  using L = SmallKLayout<IC, BN>;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16 *w_tile = reinterpret_cast<bf16 *>(smem);
  bf16 *in_tiles = w_tile + L::kWeightElems;  // two (64, IC) buffers
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  bf16 *stage = in_tiles + 2 * L::kInputElems + warp * L::kStageElems;

  const int slice = (int)(blockIdx.x % slices);
  const int64_t group = blockIdx.x / slices;
  const int64_t tiles = (N + kRows - 1) / kRows;
  const int warp_row = (warp / 2) * kWarpRows, warp_col = (warp % 2) * L::kWarpCols;
  const int col0 = slice * BN + warp_col;  // the warp's first output column

  // The bias of the thread's accumulator columns, 2t and 2t + 1 of each n-tile.
  float bias_v[L::kNTiles][2];
#pragma unroll
  for (int nj = 0; nj < L::kNTiles; nj++)
#pragma unroll
    for (int e = 0; e < 2; e++)
      bias_v[nj][e] = bias ? to_float<bf16>(bias[col0 + nj * 8 + 2 * (lane % 4) + e]) : 0.0f;

  copy_rows_async<IC, L::kLd>(w_tile, weight + (int64_t)slice * BN * IC, BN, BN);
  if (group < tiles)
    copy_rows_async<IC, L::kLd>(in_tiles, inp + group * kRows * IC, kRows, N - group * kRows);
  cp_async_commit();

  int buf = 0;
  for (int64_t tile = group; tile < tiles; tile += groups, buf ^= 1) {
    // This tile (and the weight) has landed, and every warp is done with the other buffer.
    cp_async_wait<0>();
    __syncthreads();
    const int64_t next = tile + groups;
    if (next < tiles)
      copy_rows_async<IC, L::kLd>(in_tiles + (buf ^ 1) * L::kInputElems, inp + next * kRows * IC,
                                  kRows, N - next * kRows);
    cp_async_commit();

    float acc[2][L::kNTiles][4] = {};
    warp_product<IC, BN>(acc, in_tiles + buf * L::kInputElems, w_tile, warp_row, warp_col, lane);
    warp_store<IC, BN>(pre, post, stage, acc, bias_v, tile * kRows + warp_row, N, OC, col0, lane);
  }
}

// ---- the layer with the residual and LayerNorm after it -------------------------------------
// linear_small_k_residual_layernorm_cuda (kernels/gemm.h): a block's proj + [x1 = x + s proj; LN2]
// in stage 0 (C = 96 in Swin-T, 128 in Swin-B). The CTA's tile is 64 tokens in token order x all
// C output features, its input rows gathered from the window order (imap), so the epilogue holds
// whole rows: it stages the tile (+ bias, rounded to bf16: the values the plain layer stores)
// across the CTA, then runs the residual + LayerNorm forward's row code (layernorm_register.cu)
// on them, 4 lanes a row and 3 or 4 vectors a lane, as that kernel does for these widths; the
// same functions in the same order, so
// x_out, ln_out, mean and rstd are bitwise what the layer followed by
// residual_layernorm_forward_cuda gives. The branch never goes to memory: 2 x 77 MB a call less
// at Swin-T's batch 128 (kernels/PERF.md, version 24). Resources (ptxas, sm_90): C = 96 127
// registers, 60,928 B of shared memory, 3 CTAs an SM; C = 128 128 registers, 88,064 B, 2 CTAs;
// no spills.

// The row layout of the residual LayerNorm forward for C = 96 or 128 bf16 features (reg_shape's
// exact fit: 4 lanes a row, 3 or 4 vectors a lane), over the CTA's 64 rows.
template <int C>
struct FusedRows {
  static constexpr int kLanes = 4;                               // lanes a row
  static constexpr int kVecs = C / (8 * kLanes);                 // 16-byte vectors a lane
  static constexpr int kRowsPerPass = 32 / kLanes;               // rows a warp a pass
  static constexpr int kPasses = kRows / kWarps / kRowsPerPass;  // passes a warp a tile
  static constexpr int kLdStage = C + kPad;                      // the CTA's staged rows
  static_assert(kVecs * 8 * kLanes == C && (kVecs == 3 || kVecs == 4), "an exact fit");
  static_assert(kRows * kLdStage <= kWarps * SmallKLayout<C, C>::kStageElems,
                "the CTA's tile fits the warps' staging tiles");
};

// copy_rows_async for the rows first .. first + rows - 1 of a gathered input: row t of the tile
// comes from row mapped_row(imap, t, L) of src; rows at or past N read row N - 1's source.
template <int IC, int LD>
__device__ __forceinline__ void copy_mapped_rows_async(bf16 *tile, const bf16 *__restrict__ src,
                                                       int64_t first, int rows, int64_t N,
                                                       const layernorm::RowMap &imap, int64_t L) {
  constexpr int kChunks = IC / 8;
  for (int i = threadIdx.x; i < rows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = (i % kChunks) * 8;
    const int64_t t = first + r < N ? first + r : N - 1;
    cp_async16(tile + r * LD + c, src + layernorm::mapped_row(imap, t, L) * IC + c);
  }
}

// Grid and shared memory as linear_small_k_kernel<C, C> (one slice).
template <int C>
__global__ void __launch_bounds__(kThreads) linear_small_k_residual_ln_kernel(
    bf16 *__restrict__ x_out, bf16 *__restrict__ ln_out, float *__restrict__ mean,
    float *__restrict__ rstd, const bf16 *__restrict__ x_in, const bf16 *__restrict__ inp,
    layernorm::RowMap imap, const float *__restrict__ scale, const bf16 *__restrict__ weight,
    const bf16 *__restrict__ bias, const float *__restrict__ ln_weight,
    const float *__restrict__ ln_bias, int64_t N, int64_t L, int64_t groups) {
  using Lay = SmallKLayout<C, C>;
  using F = FusedRows<C>;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16 *w_tile = reinterpret_cast<bf16 *>(smem);
  bf16 *in_tiles = w_tile + Lay::kWeightElems;
  bf16 *stage = in_tiles + 2 * Lay::kInputElems;  // (64, C) padded, the whole CTA's
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t4 = lane % 4;
  const int sl = lane % F::kLanes;
  const int64_t tiles = (N + kRows - 1) / kRows;
  const int warp_row = (warp / 2) * kWarpRows, warp_col = (warp % 2) * Lay::kWarpCols;

  float bias_v[Lay::kNTiles][2];
#pragma unroll
  for (int nj = 0; nj < Lay::kNTiles; nj++)
#pragma unroll
    for (int e = 0; e < 2; e++)
      bias_v[nj][e] = bias ? to_float<bf16>(bias[warp_col + nj * 8 + 2 * t4 + e]) : 0.0f;

  const int64_t group = blockIdx.x;
  copy_rows_async<C, Lay::kLd>(w_tile, weight, C, C);
  if (group < tiles)
    copy_mapped_rows_async<C, Lay::kLd>(in_tiles, inp, group * kRows, kRows, N, imap, L);
  cp_async_commit();

  int buf = 0;
  for (int64_t tile = group; tile < tiles; tile += groups, buf ^= 1) {
    cp_async_wait<0>();
    __syncthreads();  // the tile has landed; every warp is done with the other buffer and stage
    const int64_t next = tile + groups;
    if (next < tiles)
      copy_mapped_rows_async<C, Lay::kLd>(in_tiles + (buf ^ 1) * Lay::kInputElems, inp,
                                          next * kRows, kRows, N, imap, L);
    cp_async_commit();

    // The residual rows this lane will need, loaded now so that the products hide their latency.
    int4 xr[F::kPasses][F::kVecs];
#pragma unroll
    for (int p = 0; p < F::kPasses; p++) {
      const int64_t t =
          tile * kRows + warp * (kRows / kWarps) + p * F::kRowsPerPass + lane / F::kLanes;
      const bf16 *xi = x_in + (t < N ? t : 0) * C;
#pragma unroll
      for (int k = 0; k < F::kVecs; k++)
        xr[p][k] = *reinterpret_cast<const int4 *>(xi + (k * F::kLanes + sl) * 8);
    }

    float acc[2][Lay::kNTiles][4] = {};
    warp_product<C, C>(acc, in_tiles + buf * Lay::kInputElems, w_tile, warp_row, warp_col, lane);
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
      for (int nj = 0; nj < Lay::kNTiles; nj++) {
        bf16 *st = stage + (warp_row + mi * 16 + g) * F::kLdStage + warp_col + nj * 8 + 2 * t4;
        const float *c = acc[mi][nj];
        *reinterpret_cast<uint32_t *>(st) = pack2<bf16>(c[0] + bias_v[nj][0], c[1] + bias_v[nj][1]);
        *reinterpret_cast<uint32_t *>(st + 8 * F::kLdStage) =
            pack2<bf16>(c[2] + bias_v[nj][0], c[3] + bias_v[nj][1]);
      }
    __syncthreads();  // the whole tile is staged

#pragma unroll
    for (int p = 0; p < F::kPasses; p++) {
      const int r = warp * (kRows / kWarps) + p * F::kRowsPerPass + lane / F::kLanes;
      const int64_t t = tile * kRows + r;
      const bool active = t < N;  // inactive rows still take part in the shuffles
      const int64_t row = active ? t : 0;
      const float s = scale ? scale[layernorm::image_of(imap, row, L)] : 1.0f;
      layernorm::residual_layernorm_row<bf16, 8, F::kVecs, F::kLanes>(
          xr[p], stage + r * F::kLdStage, s, active, x_out + row * C, ln_out + row * C, mean + row,
          rstd + row, ln_weight, ln_bias, C, sl);
    }
  }
}

// The slice width for OC: the largest of 96, 64, 32 that divides it (every Swin-T width is a
// multiple of 96); 0 when none does.
int slice_columns(int OC) {
  if (OC <= 0) return 0;
  return OC % 96 == 0 ? 96 : OC % 64 == 0 ? 64 : OC % 32 == 0 ? 32 : 0;
}

// One wave of a kernel of this file over N rows in `slices` column slices: as many row groups as
// resident CTAs allow (the kernel's shared memory raised to smem first), at most one per row
// tile.
template <typename Kernel>
int64_t one_wave_groups(Kernel kernel, size_t smem, int slices, int64_t N) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  int device = 0, sms = 0, per_sm = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem));
  const int64_t tiles = (N + kRows - 1) / kRows;
  int64_t groups = (int64_t)sms * (per_sm > 0 ? per_sm : 1) / slices;
  if (groups < 1) groups = 1;
  return groups > tiles ? tiles : groups;
}

template <int IC, int BN>
void launch_small_k(bf16 *pre, bf16 *post, const bf16 *inp, const bf16 *weight, const bf16 *bias,
                    int64_t N, int OC, cudaStream_t stream) {
  using L = SmallKLayout<IC, BN>;
  auto kernel = linear_small_k_kernel<IC, BN>;
  const int slices = OC / BN;
  const int64_t groups = one_wave_groups(kernel, L::kSmemBytes, slices, N);
  kernel<<<(unsigned)(groups * slices), kThreads, L::kSmemBytes, stream>>>(
      pre, post, inp, weight, bias, N, OC, slices, groups);
  CUDA_CHECK_LAUNCH();
}

template <int IC>
void launch_for_ic(bf16 *pre, bf16 *post, const bf16 *inp, const bf16 *weight, const bf16 *bias,
                   int64_t N, int OC, cudaStream_t stream) {
  switch (slice_columns(OC)) {
    case 96:
      launch_small_k<IC, 96>(pre, post, inp, weight, bias, N, OC, stream);
      break;
    case 64:
      launch_small_k<IC, 64>(pre, post, inp, weight, bias, N, OC, stream);
      break;
    default:
      launch_small_k<IC, 32>(pre, post, inp, weight, bias, N, OC, stream);
      break;
  }
}

[[noreturn]] void small_k_refuse(const char *what, long long value) {
  fprintf(stderr,
          "linear_small_k_forward_cuda: unsupported %s = %lld (IC must be 96, 128 or 192, OC a "
          "positive multiple of 32, N >= 0, pointers 16-byte aligned)\n"
          "HINT: the caller must check linear_small_k_supported(IC, OC) and use "
          "linear_forward_cuda otherwise\n",
          what, value);
  abort();
}

}  // namespace

bool linear_small_k_supported(int IC, int OC) {
  return (IC == 96 || IC == 128 || IC == 192) && slice_columns(OC) != 0;
}

bool linear_small_k_residual_layernorm_supported(int IC, int C) {
  return IC == C && (C == 96 || C == 128);
}

void linear_small_k_residual_layernorm_cuda(void *x_out, void *ln_out, float *mean, float *rstd,
                                            const void *x_in, const void *inp,
                                            const WindowMap *inp_map, const float *scale,
                                            const void *weight, const void *bias,
                                            const float *ln_weight, const float *ln_bias, int B,
                                            int64_t L, int IC, int C, cudaStream_t stream) {
  const int64_t N = (int64_t)B * L;
  const void *aligned_ptrs[] = {x_out, ln_out, x_in, inp, weight};
  bool aligned = true;
  for (const void *p : aligned_ptrs) aligned = aligned && aligned16(p);
  if (!linear_small_k_residual_layernorm_supported(IC, C) || N < 0 || !aligned || x_out == x_in ||
      !ln_out) {
    fprintf(stderr,
            "linear_small_k_residual_layernorm_cuda: unsupported call (IC %d, C %d, B * L %lld, "
            "pointers 16-byte aligned: %s, x_out aliasing x_in: %s, ln_out given: %s)\n"
            "HINT: the caller must check linear_small_k_residual_layernorm_supported(IC, C) and "
            "the pointers, and compose the layer and residual_layernorm_forward_cuda otherwise\n",
            IC, C, (long long)N, aligned ? "yes" : "no", x_out == x_in ? "yes" : "no",
            ln_out ? "yes" : "no");
    abort();
  }
  if (N == 0) return;
  auto run = [&](auto width) {
    constexpr int W = decltype(width)::value;
    auto kernel = linear_small_k_residual_ln_kernel<W>;
    const size_t smem = SmallKLayout<W, W>::kSmemBytes;
    const int64_t groups = one_wave_groups(kernel, smem, 1, N);
    kernel<<<(unsigned)groups, kThreads, smem, stream>>>(
        static_cast<bf16 *>(x_out), static_cast<bf16 *>(ln_out), mean, rstd,
        static_cast<const bf16 *>(x_in), static_cast<const bf16 *>(inp),
        layernorm::row_map(inp_map, L, N), scale, static_cast<const bf16 *>(weight),
        static_cast<const bf16 *>(bias), ln_weight, ln_bias, N, L, groups);
    CUDA_CHECK_LAUNCH();
  };
  if (C == 96)
    run(std::integral_constant<int, 96>{});
  else
    run(std::integral_constant<int, 128>{});
}

void linear_small_k_forward_cuda(void *pre, void *post, const void *inp, const void *weight,
                                 const void *bias, int64_t N, int IC, int OC, cudaStream_t stream) {
  if (IC != 96 && IC != 128 && IC != 192) small_k_refuse("IC", IC);
  if (slice_columns(OC) == 0) small_k_refuse("OC", OC);
  if (N < 0) small_k_refuse("N", (long long)N);
  if (N == 0) return;
  if (!aligned16(pre)) small_k_refuse("pre (address)", (long long)(uintptr_t)pre);
  if (post && !aligned16(post)) small_k_refuse("post (address)", (long long)(uintptr_t)post);
  if (!aligned16(inp)) small_k_refuse("inp (address)", (long long)(uintptr_t)inp);
  if (!aligned16(weight)) small_k_refuse("weight (address)", (long long)(uintptr_t)weight);
  bf16 *p = static_cast<bf16 *>(pre), *q = static_cast<bf16 *>(post);
  const bf16 *x = static_cast<const bf16 *>(inp), *w = static_cast<const bf16 *>(weight),
             *b = static_cast<const bf16 *>(bias);
  if (IC == 96)
    launch_for_ic<96>(p, q, x, w, b, N, OC, stream);
  else if (IC == 128)
    launch_for_ic<128>(p, q, x, w, b, N, OC, stream);
  else
    launch_for_ic<192>(p, q, x, w, b, N, OC, stream);
}
