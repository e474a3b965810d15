// common.cuh: the small device-side helpers every CUDA kernel file shares: the element types of
// the compute precisions (f32, bf16, f16) with their conversions and a dispatch from DType,
// 16-byte vector access, warp reductions, the row launch shape of the row kernels, and the
// tensor-core primitives (mma.sync, ldmatrix, cp.async) of the attention and small-K GEMM kernels.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "src/base/tensor.h"

namespace swin_cuda {

constexpr unsigned kFullMask = 0xffffffffu;

// 16-byte aligned: 16-byte loads and stores are allowed at p.
inline bool aligned16(const void *p) {
  return ((uintptr_t)p & 15u) == 0;
}

// The current device's SM count. Kernels whose partition (and so the order of their float sums)
// is sized in waves take it from here: the same shapes give the same bits on one kind of GPU,
// and a GPU with another SM count gets full waves rather than the H200's 132.
inline int device_sm_count() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      sms < 1) {
    fprintf(stderr, "swin.c: cannot read the CUDA device's SM count\nHINT: check nvidia-smi\n");
    abort();
  }
  return sms;
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
// The sum over a group of LANES consecutive lanes (a power of two up to 32, groups aligned to
// LANES), the same on each of them; every lane of the warp must call it.
template <int LANES>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = LANES / 2; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
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

// ---- deterministic column sums ---------------------------------------------------------------
// The bias gradients are column sums of a row-major (rows, cols) gradient, taken by the kernels
// that write it, without atomics: block (x, y) of a 2-D grid owns group x of a row's vectors (VEC
// consecutive columns each) over row chunk y; thread (tx, ty) adds rows ty, ty + blockDim.y, ...
// of the chunk for its one vector; the block adds its thread rows in order into its chunk's row
// of partial (chunks, cols); a second pass (column_partials_reduce_cuda in kernels/gemm.h) adds
// the chunks in a fixed order. The tiling is a function of (rows, vectors per row) alone.
//
// Blocks have at most kColumnThreads threads: a row of at most 128 vectors is one block row (tx
// = all its vectors, ty = 256 / tx rows at a time, so a block reads one contiguous range), wider
// rows split into equal groups of at most 128 vectors (ty = 2 at least, so that a chunk's rows
// are shared by twice as many threads). Chunks have at least kColumnMinRows rows (the partials
// then cost at most 1/32 of the tensor) and there are at most kColumnMaxChunks of them (the
// second pass stays short).
constexpr int kColumnThreads = 256;
constexpr int kColumnMaxGroup = kColumnThreads / 2;
constexpr int64_t kColumnMaxChunks = 1024;
constexpr int64_t kColumnMinRows = 32;

struct ColumnTiling {
  int tx, ty;              // block shape: vectors of a row, rows at a time
  int col_groups;          // gridDim.x
  int64_t chunks;          // gridDim.y, and the rows of partial
  int64_t rows_per_chunk;  // a multiple of ty
};

inline ColumnTiling column_tiling(int64_t rows, int64_t vecs) {
  ColumnTiling t;
  int64_t groups = vecs <= kColumnMaxGroup ? 1 : (vecs + kColumnMaxGroup - 1) / kColumnMaxGroup;
  t.col_groups = (int)groups;
  t.tx = (int)((vecs + groups - 1) / groups);
  if (t.tx < 1) t.tx = 1;
  t.ty = kColumnThreads / t.tx;
  int64_t r = (rows + kColumnMaxChunks - 1) / kColumnMaxChunks;
  if (r < kColumnMinRows) r = kColumnMinRows;
  t.rows_per_chunk = (r + t.ty - 1) / t.ty * t.ty;
  t.chunks = rows > 0 ? (rows + t.rows_per_chunk - 1) / t.rows_per_chunk : 0;
  return t;
}

// Rows of partial any tiling of `rows` rows needs at most.
inline int64_t column_chunks_bound(int64_t rows) {
  int64_t by_rows = (rows + kColumnMinRows - 1) / kColumnMinRows;
  return rows <= 0 ? 0 : by_rows < kColumnMaxChunks ? by_rows : kColumnMaxChunks;
}

// The end of a column-sum kernel: thread (tx, ty)'s sums acc of the VEC columns of its vector
// added over the block's thread rows in order and stored in row blockIdx.y of partial (chunks,
// cols), at the columns of the block's vectors. Every thread of the block calls it (barrier).
template <int VEC>
__device__ void column_partial_store(float *__restrict__ partial, const float (&acc)[VEC],
                                     int cols) {
  __shared__ float rows[kColumnThreads * VEC];
  const int width = blockDim.x * VEC;  // columns of the block
  const int64_t col0 = (int64_t)blockIdx.x * width;
  float *out = partial + (int64_t)blockIdx.y * cols + col0;
#pragma unroll
  for (int e = 0; e < VEC; e++) rows[threadIdx.y * width + threadIdx.x * VEC + e] = acc[e];
  __syncthreads();
  for (int c = threadIdx.y * blockDim.x + threadIdx.x; c < width && col0 + c < cols;
       c += blockDim.x * blockDim.y) {
    float s = 0.0f;
    for (int y = 0; y < (int)blockDim.y; y++) s += rows[y * width + c];
    out[c] = s;
  }
}

// The second pass's per-thread sum: p[i * stride] for i = first, first + step, ... < count,
// added in double in that order, the loads issued 16 at a time (the compiler's unrolling issued 4,
// a memory round trip per 4 terms). Measured on the LayerNorm partials (kernels/PERF.md, 21):
// 7.1 -> 6.5 us a call on average (H100: 0.226 -> 0.208 ms over 32 calls a step).
__device__ __forceinline__ double ordered_strided_sum(const float *__restrict__ p, int64_t first,
                                                      int64_t count, int64_t step, int64_t stride) {
  constexpr int kBatch = 16;
  double s = 0.0;
  int64_t i = first;
  for (; i + (kBatch - 1) * step < count; i += kBatch * step) {
    float v[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; j++) v[j] = p[(i + j * step) * stride];
#pragma unroll
    for (int j = 0; j < kBatch; j++) s += v[j];
  }
  for (; i < count; i += step) s += p[i * stride];
  return s;
}

// ---- tensor cores: mma.sync m16n8k16, ldmatrix, cp.async -------------------------------------
// Products of 16-bit operands with f32 accumulation. Fragment layouts (PTX ISA, m16n8k16,
// 16-bit A/B), with g = lane / 4 and t = lane % 4:
//   A 16x16: a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
//   B 16x8 (k x n): b0 = (k 2t..2t+1, n g), b1 = (k 2t+8.., n g)
//   C 16x8: c0, c1 = (g, 2t..2t+1), c2, c3 = (g+8, 2t..2t+1)
// Operands come from row-major tiles in shared memory through ldmatrix; padding each row by 8
// elements (16 bytes) puts the 8 row addresses of an 8x8 matrix in distinct banks.

template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t *>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t *>(&v);
}

template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1);
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                        uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                 uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t smem_address(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

// Four 8x8 matrices of 16-bit elements; lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}

__device__ __forceinline__ void cp_async16(void *smem, const void *global) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_address(smem)),
               "l"(global));
}
// cp_async16 that zero-fills the 16 bytes and reads nothing when !valid (global must still be an
// address of the tensor): the rows past a window's last token in a tile.
__device__ __forceinline__ void cp_async16_zfill(void *smem, const void *global, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(smem)),
               "l"(global), "r"(valid ? 16 : 0));
}
// The 4-byte cp.async (through L1), zero-filling when !valid, as cp_async16_zfill.
__device__ __forceinline__ void cp_async4_zfill(void *smem, const void *global, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_address(smem)),
               "l"(global), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int PENDING>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING));
}

// The A operand of rows r0.. and channels kk.. of a row-major tile (row length LD).
template <int LD, typename T>
__device__ __forceinline__ void a_rows(uint32_t (&a)[4], const T *tile, int r0, int kk, int lane) {
  ldsm_x4(a, tile + (r0 + (lane & 15)) * LD + kk + (lane >> 4) * 8);
}
// The A operand (m = columns c0.., k = rows kk..) of a row-major tile read transposed: for
// dS^T q and P^T dO, whose rows are the keys (the tiles' columns).
template <int LD, typename T>
__device__ __forceinline__ void a_cols(uint32_t (&a)[4], const T *tile, int c0, int kk, int lane) {
  const int m = lane >> 3;
  ldsm_x4_trans(a, tile + (kk + (m >> 1) * 8 + (lane & 7)) * LD + c0 + (m & 1) * 8);
}
// B operands (k = channels kk..kk+15, n = rows n0..n0+15: two n-tiles) of a row-major tile: the
// right factor of a product over channels (k^T in q k^T, v^T in dO v^T, a linear layer's weight
// (OC, IC) in inp weight^T). b[0], b[1] serve rows
// n0..n0+7, b[2], b[3] rows n0+8...
template <int LD, typename T>
__device__ __forceinline__ void b_rows(uint32_t (&b)[4], const T *tile, int n0, int kk, int lane) {
  const int m = lane >> 3;
  ldsm_x4(b, tile + (n0 + (m >> 1) * 8 + (lane & 7)) * LD + kk + (m & 1) * 8);
}
// B operands (k = rows kk..kk+15, n = channels n0..n0+15: two n-tiles) of a row-major tile: the
// right factor of a product over tokens (v in P v, k in dS k, q in dS^T q, dO in P^T dO).
template <int LD, typename T>
__device__ __forceinline__ void b_cols(uint32_t (&b)[4], const T *tile, int n0, int kk, int lane) {
  const int m = lane >> 3;
  ldsm_x4_trans(b, tile + (kk + (m & 1) * 8 + (lane & 7)) * LD + n0 + (m >> 1) * 8);
}

}  // namespace swin_cuda
