// gemm_hopper.cu: the linear layer's forward on Hopper's own instructions (kernels/gemm.h:
// linear_hopper_forward_cuda), bf16 operands, f32 accumulation: TMA copies the operand tiles
// into shared memory, wgmma multiplies them there, a warp-specialized pipeline keeps both busy.
// It is the first step toward the LayerNorm and the GELU inside the GEMMs (kernels/PERF.md,
// version 18): a GEMM whose operand loads and epilogue are ours, which cuBLASLt cannot offer.
// The same kernel with a second epilogue is the MLP backward's d(hidden) product with the GELU
// pass in it (linear_hopper_dgelu_cuda; version 19): see linear_hopper_kernel. A third keeps
// the tile's slabs of dout and GELU(pre) in shared memory and adds fc2's weight gradient there
// (linear_hopper_dgelu_dweight_cuda; version 22), so GELU(pre) is never stored.
//
// Design. A CTA computes BM x BN tiles of out (BM = 128 rows, BN = 96-256 output features)
// with three warpgroups: the producer (one thread issues the copies) and two consumers, each
// owning 64 rows of the tile. The grid is persistent (one CTA per SM, tiles taken in strides of
// the grid), so the producer loads the next tile's operands while the consumers finish the last.
// K is walked in slabs of BK = 64 elements (128 bytes: one row of the 128-byte swizzle), with
// 3 (BN = 256) or 4 (BN = 128) slabs in flight. Per slab the producer waits until the consumers
// have released the stage (its "empty" barrier), then has TMA copy the A slab (BM x 64 of inp)
// and the B slab (BN x 64 of weight) into it, both K-major with the 128-byte swizzle,
// completing on the stage's "full" barrier (a transaction count of the two boxes' bytes; TMA
// fills what lies outside the matrices with zeros, so ragged M, N and K need no code). Each
// consumer waits on "full", issues four wgmma m64nBNk16 (K = 16 each) reading both operands
// from shared memory through descriptors, commits them as a group, and releases the previous
// slab's stage once that slab's group has finished (one group stays in flight). The epilogue
// adds the bias in f32 to the accumulators, rounds once to bf16, stages the consumer's 64 rows
// in shared memory and writes them as 16-byte vectors, whole rows per warp.
//
// Descriptors (PTX ISA, "matrix descriptor" of wgmma): start address >> 4, the leading-dimension
// byte offset (unused for a K-major swizzled operand whose K step of 32 bytes lies inside one
// 128-byte row), the stride byte offset 1024 (eight rows of 128 bytes: one swizzle atom), and
// the 128-byte swizzle mode. The k-th 16-element step of a slab starts 32 k bytes further: the
// swizzle is applied to the address bits, so the same offset works in every row of the atom
// (tiles start 1024-byte aligned, base offset 0).
//
// The accumulator fragment of wgmma m64nNk16 (f32): thread t of the warpgroup (warp w = t / 32,
// lane l) holds, for each 8-column group j, d[4j + 0, 1] at row 16 w + l / 4 and columns 8 j + 2
// (l % 4) + 0, 1, and d[4j + 2, 3] eight rows further down.
//
// Built only for sm_90a (wgmma and setmaxnreg exist nowhere else): SWIN_HOPPER_GEMM is defined
// by CMake when CMAKE_CUDA_ARCHITECTURES names 90a; otherwise linear_hopper_supported says no.
#include <cuda.h>  // CUtensorMap and cuTensorMapEncodeTiled's types (the function comes from
                   // the runtime's driver entry point: no link to libcuda)
#include <cudaTypedefs.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gelu.cuh"
#include "kernels/cuda/layernorm_register.cuh"
#include "kernels/gemm.h"
#include "src/base/cuda_util.h"

namespace {

using namespace swin_cuda;
using bf16 = __nv_bfloat16;

constexpr int kBM = 128, kBK = 64;
// What the kernel computes around the product (linear_hopper_kernel says what each means).
enum Mode : int { kPlain, kBackwardGelu, kGeluInput, kBackwardGeluDweight, kGeluInputResLn };

// kGeluInputResLn's residual and LayerNorm (linear_hopper_gelu_residual_layernorm_cuda): x_out,
// x_in (bf16, token order), ln_out (bf16, rows in lmap's order, or NULL: the residual alone),
// mean and rstd (token order), scale (per image, or NULL), weight and bias (f32); images of L
// tokens (bmap: token order, for the image of a row).
struct ResLn {
  bf16 *x_out, *ln_out;
  float *mean, *rstd;
  const bf16 *x_in;
  const float *scale, *weight, *bias;
  swin_cuda::layernorm::RowMap bmap, lmap;
  int64_t L;
};

// The LayerNorm forward's row layout for rows of C bf16 elements (layernorm_register.cuh's
// reg_shape with exact_fit): LANES lanes a row, VECS 16-byte vectors a lane; over a consumer's 64
// rows, 4 warps at a time.
template <int C>
struct LnRows {
  static constexpr int kLanes = C == 192 ? 8 : 4;
  static constexpr int kVecs = C / 8 / kLanes;
  static constexpr int kRowsPerWarp = 32 / kLanes;
  static constexpr int kRowsPerPass = 4 * kRowsPerWarp;
  static constexpr int kPasses = 64 / kRowsPerPass;
  static_assert(kVecs * kLanes * 8 == C && (kVecs == 3 || kVecs == 4), "an exact fit");
};
constexpr int kConsumers = 2;                     // warpgroups, 64 rows of the tile each
constexpr int kThreads = (kConsumers + 1) * 128;  // the producer warpgroup first

template <int BN>
struct HopperTile {
  static constexpr int kStages = BN == 256 ? 3 : 4;  // slabs in flight (shared memory allows)
  static constexpr int kABytes = kBM * kBK * 2;      // one stage's A slab
  static constexpr int kBBytes = BN * kBK * 2;
  static constexpr int kStageBytes = kABytes + kBBytes;
  // A consumer's 64 output rows staged for the stores, each padded by 16 bytes so that the
  // fragments' 4-byte writes of a warp fall in 32 different banks.
  static constexpr int kOutPitch = BN + 8;
  static constexpr int kOutBytes = 64 * kOutPitch * 2;
  // kBackwardGeluDweight's tile of GELU(pre) as the weight-gradient product's A operand: BN / 64
  // blocks of 64 columns, each 128 rows of 128 bytes with the 128-byte swizzle.
  static constexpr int kHidBytes = kBM * BN * 2;
  // The slabs, [the tile of GELU(pre)], the staged outputs, the barriers; + 1024 to align the
  // start to a swizzle atom.
  static constexpr int smem_bytes(bool hid) {
    return kStages * kStageBytes + (hid ? kHidBytes : 0) + kConsumers * kOutBytes +
           2 * kStages * 8 + 1024;
  }
};

#if defined(SWIN_HOPPER_GEMM) && (!defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL))

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void bar_init(uint64_t *bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}

__device__ __forceinline__ void bar_expect_tx(uint64_t *bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void bar_arrive(uint64_t *bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ void bar_wait(uint64_t *bar, int parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

// TMA: the box of the 2-D tensor map at (c0 = column, c1 = row) into dst, completing on bar.
__device__ __forceinline__ void tma_load(void *dst, const CUtensorMap *map, int c0, int c1,
                                         uint64_t *bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(smem_addr(dst)),
      "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(smem_addr(bar))
      : "memory");
}

// The wgmma descriptor of a K-major, 128-byte-swizzled operand starting at p (1024-aligned
// atoms; see the top of the file).
__device__ __forceinline__ uint64_t descriptor(const void *p) {
  uint64_t d = 0;
  d |= (uint64_t)((smem_addr(p) & 0x3FFFF) >> 4);
  d |= (uint64_t)1 << 16;            // leading byte offset (unused here)
  d |= (uint64_t)(1024 >> 4) << 32;  // stride byte offset: one 8-row atom
  d |= (uint64_t)1 << 62;            // 128-byte swizzle
  return d;
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
// Waits until at most N of this thread's committed wgmma groups are still running.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// The 128 threads of consumer warpgroup w (named barrier 1 + w; 0 is __syncthreads').
__device__ __forceinline__ void warpgroup_sync(int w) {
  asm volatile("bar.sync %0, 128;" ::"r"(1 + w) : "memory");
}
// The 256 threads of both consumer warpgroups (named barrier 3).
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 3, 256;" ::: "memory");
}

// The operand lists of the wgmma instructions: 8 accumulators each.
#define SWIN_ACC8(i)                                                                          \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])

template <int BN>
struct Wgmma;

// d (64 x 64, f32) += A (64 x 16) B (16 x 64) with both operands MN-major (transposed: A's 64
// rows and B's 64 columns contiguous, each k a 128-byte row of the swizzle atom; a 64-element
// extent is one atom wide, so the descriptor's leading byte offset is unused again).
template <>
struct Wgmma<64> {
  static __device__ __forceinline__ void mma_mn(float (&d)[32], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
        "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 1, 1;\n}\n"
        : SWIN_ACC8(0), SWIN_ACC8(8), SWIN_ACC8(16), SWIN_ACC8(24)
        : "l"(da), "l"(db), "r"(1));
  }
};

// d (64 x BN of the warpgroup, f32) += A (64 x 16) B (16 x BN); accumulate 0 overwrites d.
template <>
struct Wgmma<96> {
  static __device__ __forceinline__ void mma(float (&d)[48], uint64_t da, uint64_t db,
                                             int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %50, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n96k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
        "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, "
        "%34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, "
        "%48, %49, p, 1, 1, 0, 0;\n}\n"
        : SWIN_ACC8(0), SWIN_ACC8(8), SWIN_ACC8(16), SWIN_ACC8(24), SWIN_ACC8(32), SWIN_ACC8(40)
        : "l"(da), "l"(db), "r"(accumulate));
  }
};

template <>
struct Wgmma<128> {
  static __device__ __forceinline__ void mma(float (&d)[64], uint64_t da, uint64_t db,
                                             int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
        "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, "
        "%34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, "
        "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1, 0, 0;\n}\n"
        : SWIN_ACC8(0), SWIN_ACC8(8), SWIN_ACC8(16), SWIN_ACC8(24), SWIN_ACC8(32), SWIN_ACC8(40),
          SWIN_ACC8(48), SWIN_ACC8(56)
        : "l"(da), "l"(db), "r"(accumulate));
  }
};

template <>
struct Wgmma<192> {
  static __device__ __forceinline__ void mma(float (&d)[96], uint64_t da, uint64_t db,
                                             int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
        "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, "
        "%34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, "
        "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, "
        "%66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, "
        "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, "
        "%96, %97, p, 1, 1, 0, 0;\n}\n"
        : SWIN_ACC8(0), SWIN_ACC8(8), SWIN_ACC8(16), SWIN_ACC8(24), SWIN_ACC8(32), SWIN_ACC8(40),
          SWIN_ACC8(48), SWIN_ACC8(56), SWIN_ACC8(64), SWIN_ACC8(72), SWIN_ACC8(80), SWIN_ACC8(88)
        : "l"(da), "l"(db), "r"(accumulate));
  }
};

template <>
struct Wgmma<256> {
  static __device__ __forceinline__ void mma(float (&d)[128], uint64_t da, uint64_t db,
                                             int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
        "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, "
        "%34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, "
        "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, "
        "%66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, "
        "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, "
        "%98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, "
        "%111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, "
        "%124, %125, %126, %127}, "
        "%128, %129, p, 1, 1, 0, 0;\n}\n"
        : SWIN_ACC8(0), SWIN_ACC8(8), SWIN_ACC8(16), SWIN_ACC8(24), SWIN_ACC8(32), SWIN_ACC8(40),
          SWIN_ACC8(48), SWIN_ACC8(56), SWIN_ACC8(64), SWIN_ACC8(72), SWIN_ACC8(80), SWIN_ACC8(88),
          SWIN_ACC8(96), SWIN_ACC8(104), SWIN_ACC8(112), SWIN_ACC8(120)
        : "l"(da), "l"(db), "r"(accumulate));
  }
};
#undef SWIN_ACC8

#endif  // SWIN_HOPPER_GEMM, and sm_90a or the host

// kPlain, the forward: pre (M, N) = A (M, K) B (N, K)^T + bias (N, or NULL); with post not NULL
// also post = GELU(pre as stored in bf16), by the GELU forward's own device function (bitwise
// gelu_forward_cuda of this pre).
// kGeluInput, the MLP's second layer: as kPlain with GELU(A) in place of A, each consumer
// applying the GELU forward's device function to its rows of every A slab in shared memory
// (rounded to bf16: bitwise the GELU pass's output) before its wgmma read them.
// kGeluInputResLn (BN = N: 96, 128 or 192): as kGeluInput, but the output (rounded to bf16, as
// kGeluInput stores it) is a residual branch that never goes to memory: x_out = x_in + scale
// out, and with ln_out LN(x_out) into ln_out's rows, by the residual LayerNorm forward's row
// code (layernorm_register.cuh; bitwise residual_layernorm_forward_cuda of kGeluInput's output).
// kBackwardGelu, the MLP backward (bias NULL): g = A B^T rounded to bf16 (d(hidden)), then from
// x = gelu_in (M, N), the pre-activation: post = GELU(x) and pre = g GELU'(x) (d(pre)), both
// as gelu_recompute_backward_cuda computes them; with partial not NULL, also this CTA's column
// sums of pre as stored, one row of partial per consumer (the grid is then a multiple of the
// column tiles, so a CTA keeps one column tile: blockIdx.x % tiles_n).
// kBackwardGeluDweight (BN 128, CH = the slabs of K, at most 2): as kBackwardGelu, but post goes
// to shared memory instead of memory, and the weight gradient of the layer whose input it is
// comes out of the kernel: dw^T (N, K) += post^T A over the tile's 128 rows, A's slabs still in
// the ring (the consumers release them only after this product). Consumer c multiplies its 64
// columns of post (the A operand, MN-major) by the CH slabs of A (the B operand, MN-major: a slab
// is 128 rows of 64 features), accumulating in registers across its tiles (all in one column
// tile); at the end this CTA's sums go to dw_partial, a (K, N) block per CTA of the column tile
// (blockIdx.x / tiles_n).
template <int BN, int MODE, int CH>
__global__ void __launch_bounds__(kThreads, 1)
    linear_hopper_kernel(const __grid_constant__ CUtensorMap map_a,
                         const __grid_constant__ CUtensorMap map_b, bf16 *__restrict__ pre,
                         bf16 *__restrict__ post, const bf16 *__restrict__ bias,
                         const bf16 *__restrict__ gelu_in, float *__restrict__ partial,
                         float *__restrict__ dw_partial, const ResLn rl, int M, int N, int K) {
#if defined(SWIN_HOPPER_GEMM) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using T = HopperTile<BN>;
  constexpr int S = T::kStages;
  constexpr bool DWEIGHT = MODE == kBackwardGeluDweight;
  constexpr bool DGELU = MODE == kBackwardGelu || DWEIGHT;
  constexpr bool RESLN = MODE == kGeluInputResLn;
  using LR = LnRows<RESLN ? BN : 96>;
  static_assert(!DWEIGHT || (BN == 2 * 64 && CH >= 1 && CH <= S),
                "the weight-gradient product: one 64-column block per consumer, the tile's "
                "slabs all in the ring");
  extern __shared__ uint8_t smem_raw[];
  uint8_t *smem = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
  uint8_t *hid = smem + S * T::kStageBytes;  // kBackwardGeluDweight's GELU(pre), 1024-aligned
  uint8_t *outs = hid + (DWEIGHT ? T::kHidBytes : 0);
  uint64_t *full = (uint64_t *)(outs + kConsumers * T::kOutBytes);
  uint64_t *empty = full + S;
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
  const int tiles_n = (N + BN - 1) / BN, tiles = tiles_n * ((M + kBM - 1) / kBM);
  const int slabs = (K + kBK - 1) / kBK;
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; s++) {
      bar_init(&full[s], 1);
      bar_init(&empty[s], kConsumers * 128);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  // Persistent: CTA b takes tiles b, b + gridDim.x, ...; consecutive tiles share their rows (the
  // column tiles vary fastest), so the CTAs running together read the same A rows, once from
  // DRAM. The slab counter it runs on across tiles: slab it uses stage it % S in its
  // (it / S)-th round, the barriers' phase parity.
  if (wg == 0) {  // the producer: the copies run up to S slabs ahead, across tile boundaries
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (t == 0) {
      int it = 0;
      for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int m0 = tile / tiles_n * kBM, n0 = tile % tiles_n * BN;
        for (int k = 0; k < slabs; k++, it++) {
          const int s = it % S;
          if (it >= S) bar_wait(&empty[s], (it / S - 1) & 1);
          uint8_t *a = smem + s * T::kStageBytes;
          bar_expect_tx(&full[s], T::kStageBytes);
          tma_load(a, &map_a, k * kBK, m0, &full[s]);
          tma_load(a + T::kABytes, &map_b, k * kBK, n0, &full[s]);
        }
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
  const int c = wg - 1, row_slab = c * 64;  // this consumer and its rows of the tile
  bf16 *staged = (bf16 *)(outs + c * T::kOutBytes);
  const int warp = t / 32, lane = t % 32;
  float d[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; i++) d[i] = 0.0f;
  float dw[DWEIGHT ? CH : 1][32];  // the weight gradient's 64 x 64 blocks (columns c * 64 ...)
#pragma unroll
  for (int h = 0; h < (DWEIGHT ? CH : 1); h++)
#pragma unroll
    for (int i = 0; i < 32; i++) dw[h][i] = 0.0f;
  constexpr int kVecs = BN / 8;               // 16-byte vectors of a row
  constexpr int kThreadVecs = BN / 16;        // a thread's vectors of the consumer's 64 rows
  constexpr int kSumCols = (BN + 127) / 128;  // a thread's columns of the column sums
  float colsum[kSumCols] = {};
  int it = 0;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int m0 = tile / tiles_n * kBM, n0 = tile % tiles_n * BN;
    // The backward's pre-activations, loaded now for the epilogue: in flight during the
    // mainloop (thread t's vectors t + 128 i of the consumer's rows, as the epilogue walks them).
    uint4 xin[DGELU ? kThreadVecs : 1];
    if constexpr (DGELU) {
#pragma unroll
      for (int i = 0; i < kThreadVecs; i++) {
        const int v = t + 128 * i, gr = m0 + row_slab + v / kVecs, gc = n0 + v % kVecs * 8;
        xin[i] = gr < M && gc < N ? __ldg((const uint4 *)&gelu_in[(int64_t)gr * N + gc])
                                  : make_uint4(0, 0, 0, 0);
      }
    }
    // The residual's rows, loaded now for the epilogue likewise (the row layout of LnRows).
    int4 xres[RESLN ? LR::kPasses : 1][LR::kVecs];
    if constexpr (RESLN) {
#pragma unroll
      for (int p = 0; p < LR::kPasses; p++) {
        const int gr =
            m0 + row_slab + p * LR::kRowsPerPass + warp * LR::kRowsPerWarp + lane / LR::kLanes;
        const bf16 *xi = rl.x_in + (int64_t)(gr < M ? gr : 0) * BN;
#pragma unroll
        for (int k = 0; k < LR::kVecs; k++)
          xres[p][k] =
              __ldg(reinterpret_cast<const int4 *>(xi + (k * LR::kLanes + lane % LR::kLanes) * 8));
      }
    }
    // The mainloop: a slab's four products are committed as one group; once the group before
    // it has finished, that slab's stage goes back to the producer (with the weight gradient,
    // only after the tile's second product).
    for (int k = 0; k < slabs; k++, it++) {
      const int s = it % S;
      bar_wait(&full[s], (it / S) & 1);
      uint8_t *a = smem + s * T::kStageBytes + row_slab * 128;
      const uint8_t *b = smem + s * T::kStageBytes + T::kABytes;
      if constexpr (MODE == kGeluInput || RESLN) {
        // This consumer's 64 rows of the slab (8 KB, contiguous: the swizzle permutes within
        // rows) through GELU in place; elementwise, so the swizzled order does not matter. The
        // proxy fence makes the writes visible to wgmma's reads (the async proxy).
        uint4 *rows = reinterpret_cast<uint4 *>(a);
#pragma unroll
        for (int i = 0; i < 64 * kBK / 8 / 128; i++) {
          float x[8];
          load_vec<bf16, 8>(x, reinterpret_cast<const bf16 *>(&rows[t + 128 * i]));
#pragma unroll
          for (int e = 0; e < 8; e++) x[e] = gelu_value<bf16>(x[e]);
          store_vec<bf16, 8>(reinterpret_cast<bf16 *>(&rows[t + 128 * i]), x);
        }
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        warpgroup_sync(c);
      }
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; kk++)
        Wgmma<BN>::mma(d, descriptor(a + 32 * kk), descriptor(b + 32 * kk), k > 0 || kk > 0);
      wgmma_commit();
      wgmma_wait<1>();
      if (!DWEIGHT && k > 0) bar_arrive(&empty[(it - 1) % S]);
    }
    wgmma_wait<0>();
    if constexpr (!DWEIGHT) bar_arrive(&empty[(it - 1) % S]);

    // Epilogue: the bias in f32, one rounding to bf16, the rows staged in shared memory, then
    // written as 16-byte vectors, a warp's stores covering whole rows (and post computed from
    // the staged bf16 values). Meanwhile the producer already loads the next tile's slabs.
    const int r = warp * 16 + lane / 4;
#pragma unroll
    for (int j = 0; j < BN / 8; j++) {
      const int col = 8 * j + 2 * (lane % 4);
      float b0 = 0.0f, b1 = 0.0f;
      if (bias && n0 + col < N) {
        b0 = __bfloat162float(bias[n0 + col]);
        b1 = __bfloat162float(bias[n0 + col + 1]);
      }
      *(__nv_bfloat162 *)&staged[r * T::kOutPitch + col] =
          __floats2bfloat162_rn(d[4 * j] + b0, d[4 * j + 1] + b1);
      *(__nv_bfloat162 *)&staged[(r + 8) * T::kOutPitch + col] =
          __floats2bfloat162_rn(d[4 * j + 2] + b0, d[4 * j + 3] + b1);
    }
    warpgroup_sync(c);
    if constexpr (DGELU) {
      // The other consumer has finished the last tile's weight-gradient product (which reads
      // all of hid) before this one writes its rows of hid.
      if constexpr (DWEIGHT) consumers_sync();
      // N is a multiple of 8: a vector is wholly in or out. Vectors outside the matrices are
      // staged as zeros for the column sums (and for the weight gradient).
#pragma unroll
      for (int i = 0; i < kThreadVecs; i++) {
        const int v = t + 128 * i, row = v / kVecs, col = v % kVecs * 8;
        const int gr = m0 + row_slab + row, gc = n0 + col;
        bf16 *st = &staged[row * T::kOutPitch + col];
        // Row row_slab + row of hid's block col / 64, its 16-byte chunk col % 64 / 8 swizzled
        // as TMA would (XOR with the row's place in its 8-row atom).
        const int hr = row_slab + row;
        uint4 *h = reinterpret_cast<uint4 *>(hid + col / 64 * (kBM * 128) + hr * 128 +
                                             ((col % 64 / 8) ^ (hr % 8)) * 16);
        if (gr >= M || gc >= N) {
          *(uint4 *)st = make_uint4(0, 0, 0, 0);
          if constexpr (DWEIGHT) *h = make_uint4(0, 0, 0, 0);
          continue;
        }
        float g[8], x[8], y[8];
        load_vec<bf16, 8>(g, st);
        const bf16 *xe = reinterpret_cast<const bf16 *>(&xin[i]);
#pragma unroll
        for (int e = 0; e < 8; e++) {
          x[e] = __bfloat162float(xe[e]);
          float cdf, pdf;
          normal_cdf_pdf<bf16>(x[e], &cdf, &pdf);
          y[e] = x[e] * cdf;
          g[e] *= fmaf(x[e], pdf, cdf);
        }
        const int64_t o = (int64_t)gr * N + gc;
        if constexpr (DWEIGHT)
          store_vec<bf16, 8>(reinterpret_cast<bf16 *>(h), y);
        else
          store_vec<bf16, 8>(post + o, y);
        store_vec<bf16, 8>(pre + o, g);
        store_vec<bf16, 8>(st, g);  // as stored, for the column sums
      }
      if (partial) {
        warpgroup_sync(c);
#pragma unroll
        for (int q = 0; q < kSumCols; q++) {
          const int col = t + 128 * q;
          if (col >= BN) break;
          float s = 0.0f;
          for (int r = 0; r < 64; r++) s += __bfloat162float(staged[r * T::kOutPitch + col]);
          colsum[q] += s;
        }
      }
      if constexpr (DWEIGHT) {
        // hid complete (both consumers' rows, visible to wgmma's async proxy), then this
        // consumer's columns of it times the tile's slabs, 16 rows per step; then the slabs go
        // back to the producer.
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        consumers_sync();
        const uint8_t *ha = hid + c * (kBM * 128);
        wgmma_fence();
#pragma unroll
        for (int h = 0; h < CH; h++) {
          const uint8_t *slab = smem + (it - slabs + h) % S * T::kStageBytes;
#pragma unroll
          for (int kk = 0; kk < kBM / 16; kk++)
            Wgmma<64>::mma_mn(dw[h], descriptor(ha + 2048 * kk), descriptor(slab + 2048 * kk));
        }
        wgmma_commit();
        wgmma_wait<0>();
        for (int k = 0; k < slabs; k++) bar_arrive(&empty[(it - slabs + k) % S]);
      }
    } else if constexpr (RESLN) {
      namespace ln = swin_cuda::layernorm;
#pragma unroll
      for (int p = 0; p < LR::kPasses; p++) {
        const int r = p * LR::kRowsPerPass + warp * LR::kRowsPerWarp + lane / LR::kLanes;
        const int sl = lane % LR::kLanes;
        const int gr = m0 + row_slab + r;
        const bool active = gr < M;  // inactive rows still take part in the shuffles
        const int64_t row = active ? gr : 0;
        const float sc = rl.scale ? rl.scale[ln::image_of(rl.bmap, row, rl.L)] : 1.0f;
        // Without ln_out (a stage's last residual) the row stops after x_out.
        bf16 *y = rl.ln_out ? rl.ln_out + ln::mapped_row(rl.lmap, row, rl.L) * BN : nullptr;
        ln::residual_layernorm_row<bf16, 8, LR::kVecs, LR::kLanes>(
            xres[p], &staged[r * T::kOutPitch], sc, active, rl.x_out + row * BN, y,
            y ? rl.mean + row : nullptr, y ? rl.rstd + row : nullptr, rl.weight, rl.bias, BN, sl);
      }
    } else {
      for (int v = t; v < 64 * kVecs; v += 128) {
        const int row = v / kVecs, col = v % kVecs * 8;
        const int gr = m0 + row_slab + row, gc = n0 + col;
        if (gr >= M || gc >= N) continue;  // N is a multiple of 8: a vector is wholly in or out
        const bf16 *st = &staged[row * T::kOutPitch + col];
        const int64_t o = (int64_t)gr * N + gc;
        *(uint4 *)&pre[o] = *(const uint4 *)st;
        if (post) {
          float x[8];
          load_vec<bf16, 8>(x, st);
#pragma unroll
          for (int e = 0; e < 8; e++) x[e] = gelu_value<bf16>(x[e]);
          store_vec<bf16, 8>(post + o, x);
        }
      }
    }
    warpgroup_sync(c);  // the rows are out before the next tile stages its own
  }
  if (DGELU && partial) {  // this CTA's sums over its tiles, in their order
    const int n0 = blockIdx.x % tiles_n * BN;
    float *row = partial + (int64_t)(blockIdx.x / tiles_n * kConsumers + c) * N;
#pragma unroll
    for (int q = 0; q < kSumCols; q++) {
      const int col = t + 128 * q;
      if (col < BN && n0 + col < N) row[n0 + col] = colsum[q];
    }
  }
  if constexpr (DWEIGHT) {
    // The accumulator fragment (see the top of the file) with rows = this consumer's columns of
    // the tile and columns = K: dw^T (n, k) goes to (k, n) of this CTA's block.
    const int n = blockIdx.x % tiles_n * BN + c * 64 + warp * 16 + lane / 4;
    float *block = dw_partial + (int64_t)(blockIdx.x / tiles_n) * K * N;
#pragma unroll
    for (int h = 0; h < CH; h++)
#pragma unroll
      for (int j = 0; j < 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int nn = n + (e / 2) * 8, kk = h * 64 + 8 * j + 2 * (lane % 4) + e % 2;
          if (nn < N && kk < K) block[(int64_t)kk * N + nn] = dw[h][4 * j + e];
        }
  }
#else  // not built for sm_90a: linear_hopper_supported is false and nothing launches this
  __trap();
#endif
}

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;  // cache: looked up once
  if (!fn) {
    cudaDriverEntryPointQueryResult q;
    void *p = nullptr;
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                                cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || !p) {
      fprintf(stderr, "linear_hopper: the driver has no cuTensorMapEncodeTiled\n");
      abort();
    }
    fn = (PFN_cuTensorMapEncodeTiled_v12000)p;
  }
  return fn;
}

// The tensor map of a row-major (rows, cols) bf16 matrix, boxes of box_rows x 64 columns with
// the 128-byte swizzle; outside the matrix TMA reads zeros.
CUtensorMap tensor_map(const void *base, int64_t rows, int cols, int box_rows) {
  CUtensorMap m;
  cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
  cuuint64_t strides[1] = {(cuuint64_t)cols * 2};
  cuuint32_t box[2] = {(cuuint32_t)kBK, (cuuint32_t)box_rows};
  cuuint32_t elem_strides[2] = {1, 1};
  CUresult r = encode_tiled()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void *>(base),
                              dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, "linear_hopper: cuTensorMapEncodeTiled failed (%d) for %lld x %d at %p\n",
            (int)r, (long long)rows, cols, base);
    abort();
  }
  return m;
}

int sm_count() {
  static int sms = 0;  // cache: the SMs of the device (every rank has one GPU of one kind)
  if (!sms) {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  }
  return sms;
}

// One product: out (N, OC) from inp (N, K) and weight (OC, K); pre, post, bias, gelu_in,
// partial and dw_partial as linear_hopper_kernel takes them.
struct Product {
  void *pre, *post;
  const void *inp, *weight, *bias, *gelu_in;
  float *partial, *dw_partial;
  int64_t N;
  int K, OC;
  ResLn rl;  // kGeluInputResLn's
};

int64_t column_tiles(int OC, int width) {
  return (OC + width - 1) / width;
}

// The persistent grid: one CTA per SM at most; for the backward's column sums and weight
// gradient a multiple of the column tiles, so that every CTA keeps one column tile (at least one
// CTA per column tile).
unsigned grid_size(const Product &p, int width, bool keeps_column, int sms) {
  const int64_t tiles_n = column_tiles(p.OC, width), tiles_m = (p.N + kBM - 1) / kBM;
  if (keeps_column) {
    int64_t per_column = sms / tiles_n;
    if (per_column < 1) per_column = 1;
    if (per_column > tiles_m) per_column = tiles_m;
    return (unsigned)(tiles_n * per_column);
  }
  const int64_t tiles = tiles_m * tiles_n;
  return (unsigned)(tiles < sms ? tiles : sms);
}

// Whether a product's CTAs each keep one column tile (grid_size): the backward's column sums and
// weight gradient.
bool keeps_column(const Product &p, int mode) {
  return mode == kBackwardGeluDweight || (mode == kBackwardGelu && p.partial);
}

template <int BN, int MODE, int CH = 0>
void launch(const Product &p, cudaStream_t stream) {
  constexpr int smem = HopperTile<BN>::smem_bytes(MODE == kBackwardGeluDweight);
  static bool configured = false;  // cache: the shared-memory limit, raised once per kernel
  if (!configured) {
    CUDA_CHECK(cudaFuncSetAttribute(linear_hopper_kernel<BN, MODE, CH>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    configured = true;
  }
  CUtensorMap a = tensor_map(p.inp, p.N, p.K, kBM), b = tensor_map(p.weight, p.OC, p.K, BN);
  const unsigned grid = grid_size(p, BN, keeps_column(p, MODE), sm_count());
  linear_hopper_kernel<BN, MODE, CH><<<grid, kThreads, smem, stream>>>(
      a, b, static_cast<bf16 *>(p.pre), static_cast<bf16 *>(p.post),
      static_cast<const bf16 *>(p.bias), static_cast<const bf16 *>(p.gelu_in), p.partial,
      p.dw_partial, p.rl, (int)p.N, p.OC, p.K);
  CUDA_CHECK_LAUNCH();
}

// The tile width for a product of N rows and OC output features. A CTA's time is about its
// share of the tiles, ceil(tiles / SMs) (the persistent grid's waves), times a tile's time,
// about proportional to its width plus a fixed 64 (the A slab it loads whatever its width, the
// pipeline's fill, the epilogue's barriers); the width with the least of that, the wider on a
// tie (kernels/PERF.md, version 18, has the widths timed one by one on Swin's layers). The
// backward's epilogue holds a tile's pre-activations in registers beside the accumulators, so
// it stops at max_width 128 (at 192 they spill).
int default_tile(int64_t N, int OC, int sms, int max_width) {
  static const int widths[] = {256, 192, 128, 96};
  int best = 96;
  int64_t best_cost = INT64_MAX;
  for (int w : widths) {
    if (w > max_width) continue;
    const int64_t tiles = (N + kBM - 1) / kBM * column_tiles(OC, w);
    const int64_t cost = (tiles + sms - 1) / sms * (w + 64);
    if (cost < best_cost) best = w, best_cost = cost;
  }
  return best;
}

template <int MODE>
void launch_at_width(const Product &p, int width, const char *fn, cudaStream_t stream) {
  constexpr bool wide = MODE != kBackwardGelu;  // see default_tile
  switch (width) {
    case 96:
      return launch<96, MODE>(p, stream);
    case 128:
      return launch<128, MODE>(p, stream);
    case 192:
      if constexpr (wide) return launch<192, MODE>(p, stream);
      break;
    case 256:
      if constexpr (wide) return launch<256, MODE>(p, stream);
      break;
  }
  fprintf(stderr, "%s: no tile of width %d (96, 128%s)\n", fn, width, wide ? ", 192, 256" : "");
  abort();
}

// The checks both entry points make; aborts with fn's name on a misuse (an internal error).
void check_product(const char *fn, const Product &p) {
  if (!linear_hopper_supported(p.K, p.OC)) {
    fprintf(stderr, "%s: K %d, OC %d not served on this device/build\n", fn, p.K, p.OC);
    abort();
  }
  const uintptr_t ptrs = (uintptr_t)p.pre | (uintptr_t)p.post | (uintptr_t)p.inp |
                         (uintptr_t)p.weight | (uintptr_t)p.gelu_in;
  if (ptrs % 16 != 0) {
    fprintf(stderr, "%s: every pointer but bias must be 16-byte aligned\n", fn);
    abort();
  }
  if (p.N > INT32_MAX / 2) {
    fprintf(stderr, "%s: N %lld too large\n", fn, (long long)p.N);
    abort();
  }
}

// out (cols, rows) = in (rows, cols)^T, bf16, through 32 x 32 tiles in shared memory.
__global__ void transpose_kernel(bf16 *__restrict__ out, const bf16 *__restrict__ in, int rows,
                                 int cols) {
  __shared__ bf16 tile[32][34];
  const int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
  for (int j = threadIdx.y; j < 32; j += blockDim.y)
    if (r0 + j < rows && c0 + threadIdx.x < cols)
      tile[j][threadIdx.x] = in[(int64_t)(r0 + j) * cols + c0 + threadIdx.x];
  __syncthreads();
  for (int j = threadIdx.y; j < 32; j += blockDim.y)
    if (c0 + j < cols && r0 + threadIdx.x < rows)
      out[(int64_t)(c0 + j) * rows + r0 + threadIdx.x] = tile[threadIdx.x][j];
}

// The weight gradient's product keeps its slabs of dout (K = OC <= 128) in the ring: one
// 64-column block of the tile per consumer, so the tile is 128 wide. At most two slabs: with
// three (C = 192) the ring's fourth stage alone prefetches the next tile and ptxas spills, and
// the kernel ran slower than the d(hidden) kernel + cuBLASLt's product (kernels/PERF.md, 22).
constexpr int kDweightTile = 128, kDweightMaxK = 2 * kBK;

// The d(hidden) kernel with the weight gradient, its CH slabs of K a template argument (the
// accumulators' count).
void launch_dweight(const Product &p, cudaStream_t stream) {
  switch ((p.K + kBK - 1) / kBK) {
    case 1:
      return launch<kDweightTile, kBackwardGeluDweight, 1>(p, stream);
    case 2:
      return launch<kDweightTile, kBackwardGeluDweight, 2>(p, stream);
  }
  fprintf(stderr, "linear_hopper_dgelu_dweight_cuda: K %d above %d\n", p.K, kDweightMaxK);
  abort();
}

// out[i] += the sum over b < blocks of partial[b * n + i], in double and in order (the weight
// gradient's blocks of the CTAs of a column tile; n = OC x IC).
__global__ void dweight_partials_reduce_kernel(float *__restrict__ out,
                                               const float *__restrict__ partial, int blocks,
                                               int64_t n) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  double sum = 0.0;
#pragma unroll 8
  for (int b = 0; b < blocks; b++) sum += partial[(int64_t)b * n + i];
  out[i] += (float)sum;
}

// Floats of scratch the transposed weight (OC, IC) takes, rounded up to 16 bytes.
int64_t transposed_floats(int IC, int OC) {
  return ((int64_t)IC * OC + 7) / 8 * 4;
}

// Floats of scratch the column sums' partial rows take: one per consumer of a CTA, whatever N.
int64_t sums_floats(int IC) {
  return (int64_t)kConsumers * sm_count() * IC;
}

// The most CTAs a column tile of the weight gradient's grid gets (grid_size, whatever N).
int64_t dweight_blocks_bound(int IC) {
  const int64_t per_column = sm_count() / column_tiles(IC, kDweightTile);
  return per_column > 1 ? per_column : 1;
}

// Both d(hidden) entry points (linear_hopper_dgelu_tile with dweight NULL, at width tile;
// linear_hopper_dgelu_dweight_cuda). Scratch: weight^T, the column sums' partial rows, the
// weight gradient's blocks.
void dgelu(const char *fn, void *dpre, void *hidden, float *dweight, float *dpre_sums,
           float *scratch, const void *dout, const void *weight, const void *pre, int64_t N,
           int IC, int OC, int tile, cudaStream_t stream) {
  // The product d(hidden) = dout weight has K = OC and IC output features: its B operand is
  // weight^T (IC, OC), K-major, transposed into scratch first.
  bf16 *wt = reinterpret_cast<bf16 *>(scratch);
  float *sums = scratch + transposed_floats(IC, OC), *blocks = sums + sums_floats(IC);
  const Product p = {
      dpre, hidden, dout, wt, nullptr, pre, dpre_sums ? sums : nullptr, dweight ? blocks : nullptr,
      N,    OC,     IC,   {}};
  check_product(fn, p);
  if (!scratch || (uintptr_t)scratch % 16 != 0) {
    fprintf(stderr, "%s: scratch missing or not 16-byte aligned\n", fn);
    abort();
  }
  if (N <= 0) return;
  transpose_kernel<<<dim3((unsigned)((IC + 31) / 32), (unsigned)((OC + 31) / 32)), dim3(32, 8), 0,
                     stream>>>(wt, static_cast<const bf16 *>(weight), OC, IC);
  CUDA_CHECK_LAUNCH();
  const int width = dweight ? kDweightTile : tile ? tile : default_tile(N, IC, sm_count(), 128);
  if (dweight)
    launch_dweight(p, stream);
  else
    launch_at_width<kBackwardGelu>(p, width, fn, stream);
  const int per_column = (int)(grid_size(p, width, true, sm_count()) / column_tiles(IC, width));
  if (dpre_sums) column_partials_reduce_cuda(dpre_sums, sums, per_column * kConsumers, IC, stream);
  if (dweight) {
    const int64_t n = (int64_t)OC * IC;
    dweight_partials_reduce_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(
        dweight, blocks, per_column, n);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

bool linear_hopper_supported(int IC, int OC) {
#if defined(SWIN_HOPPER_GEMM)
  static int cc = -1;  // cache: the device's compute capability, read once
  if (cc < 0) {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
      major = minor = 0;
    cc = 10 * major + minor;
  }
  return cc == 90 && IC > 0 && OC > 0 && IC % 8 == 0 && OC % 8 == 0;
#else
  (void)IC;
  (void)OC;
  return false;
#endif
}

void linear_hopper_forward_tile(void *pre, void *post, const void *inp, const void *weight,
                                const void *bias, int64_t N, int IC, int OC, int tile,
                                cudaStream_t stream) {
  const Product p = {pre, post, inp, weight, bias, nullptr, nullptr, nullptr, N, IC, OC, {}};
  check_product("linear_hopper_forward_cuda", p);
  if (N <= 0) return;
  launch_at_width<kPlain>(p, tile ? tile : default_tile(N, OC, sm_count(), 256),
                          "linear_hopper_forward_tile", stream);
}

void linear_hopper_forward_cuda(void *pre, void *post, const void *inp, const void *weight,
                                const void *bias, int64_t N, int IC, int OC, cudaStream_t stream) {
  linear_hopper_forward_tile(pre, post, inp, weight, bias, N, IC, OC, 0, stream);
}

void linear_hopper_gelu_forward_tile(void *out, const void *pre, const void *weight,
                                     const void *bias, int64_t N, int IC, int OC, int tile,
                                     cudaStream_t stream) {
  const Product p = {out, nullptr, pre, weight, bias, nullptr, nullptr, nullptr, N, IC, OC, {}};
  check_product("linear_hopper_gelu_forward_cuda", p);
  if (N <= 0) return;
  launch_at_width<kGeluInput>(p, tile ? tile : default_tile(N, OC, sm_count(), 256),
                              "linear_hopper_gelu_forward_tile", stream);
}

void linear_hopper_gelu_forward_cuda(void *out, const void *pre, const void *weight,
                                     const void *bias, int64_t N, int IC, int OC,
                                     cudaStream_t stream) {
  linear_hopper_gelu_forward_tile(out, pre, weight, bias, N, IC, OC, 0, stream);
}

bool linear_hopper_gelu_residual_layernorm_supported(int IC, int C) {
  return (C == 96 || C == 128 || C == 192) && linear_hopper_supported(IC, C);
}

void linear_hopper_gelu_residual_layernorm_cuda(void *x_out, void *ln_out, float *mean, float *rstd,
                                                const void *x_in, const void *pre,
                                                const void *weight, const void *bias,
                                                const float *scale, const float *ln_weight,
                                                const float *ln_bias, const WindowMap *ln_map,
                                                int B, int64_t L, int IC, int C,
                                                cudaStream_t stream) {
  const char *fn = "linear_hopper_gelu_residual_layernorm_cuda";
  const int64_t N = (int64_t)B * L;
  Product p = {nullptr, nullptr, pre, weight, bias, nullptr, nullptr, nullptr, N, IC, C, {}};
  check_product(fn, p);
  const bool aligned = aligned16(x_out) && aligned16(x_in) && aligned16(ln_out);
  if (!linear_hopper_gelu_residual_layernorm_supported(IC, C) || !aligned || x_out == x_in ||
      N < 0 || N > INT32_MAX) {
    fprintf(stderr,
            "%s: unsupported call (IC %d, C %d, B * L %lld, x_out / x_in / ln_out 16-byte "
            "aligned: %s, x_out aliasing x_in: %s)\n"
            "HINT: the caller must check linear_hopper_gelu_residual_layernorm_supported and the "
            "pointers, and compose linear_hopper_gelu_forward_cuda and "
            "residual_layernorm_forward_cuda otherwise\n",
            fn, IC, C, (long long)N, aligned ? "yes" : "no", x_out == x_in ? "yes" : "no");
    abort();
  }
  if (N == 0) return;
  ResLn &rl = p.rl;
  rl.x_out = static_cast<bf16 *>(x_out);
  rl.ln_out = static_cast<bf16 *>(ln_out);
  rl.mean = mean;
  rl.rstd = rstd;
  rl.x_in = static_cast<const bf16 *>(x_in);
  rl.scale = scale;
  rl.weight = ln_weight;
  rl.bias = ln_bias;
  rl.bmap = layernorm::row_map(nullptr, L, N);
  rl.lmap = layernorm::row_map(ln_map, L, N);
  rl.L = L;
  switch (C) {
    case 96:
      return launch<96, kGeluInputResLn>(p, stream);
    case 128:
      return launch<128, kGeluInputResLn>(p, stream);
    default:
      return launch<192, kGeluInputResLn>(p, stream);
  }
}

int64_t linear_hopper_dgelu_scratch(int64_t N, int IC, int OC) {
  (void)N;  // the partial sums take a row per consumer of a CTA, whatever N
  return transposed_floats(IC, OC) + sums_floats(IC);
}

int64_t linear_hopper_dgelu_scratch_bound(int max_width) {
  return linear_hopper_dgelu_scratch(0, max_width, max_width);
}

void linear_hopper_dgelu_tile(void *dpre, void *hidden, float *dpre_sums, float *scratch,
                              const void *dout, const void *weight, const void *pre, int64_t N,
                              int IC, int OC, int tile, cudaStream_t stream) {
  dgelu("linear_hopper_dgelu_cuda", dpre, hidden, nullptr, dpre_sums, scratch, dout, weight, pre,
        N, IC, OC, tile, stream);
}

void linear_hopper_dgelu_cuda(void *dpre, void *hidden, float *dpre_sums, float *scratch,
                              const void *dout, const void *weight, const void *pre, int64_t N,
                              int IC, int OC, cudaStream_t stream) {
  linear_hopper_dgelu_tile(dpre, hidden, dpre_sums, scratch, dout, weight, pre, N, IC, OC, 0,
                           stream);
}

bool linear_hopper_dgelu_dweight_supported(int IC, int OC) {
  return linear_hopper_supported(OC, IC) && OC <= kDweightMaxK;
}

int64_t linear_hopper_dgelu_dweight_scratch(int64_t N, int IC, int OC) {
  return linear_hopper_dgelu_scratch(N, IC, OC) + dweight_blocks_bound(IC) * OC * IC;
}

int64_t linear_hopper_dgelu_dweight_scratch_bound(int max_width) {
  // dweight_blocks_bound(IC) IC <= max(SMs x 128, IC): a column tile's CTAs times its width.
  const int64_t width = max_width, wide = (int64_t)sm_count() * kDweightTile;
  return linear_hopper_dgelu_scratch_bound(max_width) +
         (width > wide ? width : wide) * (width < kDweightMaxK ? width : kDweightMaxK);
}

void linear_hopper_dgelu_dweight_cuda(void *dpre, float *dweight, float *dpre_sums, float *scratch,
                                      const void *dout, const void *weight, const void *pre,
                                      int64_t N, int IC, int OC, cudaStream_t stream) {
  const char *fn = "linear_hopper_dgelu_dweight_cuda";
  if (!linear_hopper_dgelu_dweight_supported(IC, OC) || !dweight) {
    fprintf(stderr, "%s: IC %d, OC %d, dweight %p not served (OC <= %d, dweight not NULL)\n", fn,
            IC, OC, (void *)dweight, kDweightMaxK);
    abort();
  }
  dgelu(fn, dpre, nullptr, dweight, dpre_sums, scratch, dout, weight, pre, N, IC, OC, 0, stream);
}
