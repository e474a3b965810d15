// gemm.h: matrix products (f32 on the CPU; f32, bf16, f16 on CUDA) and the linear layer on top.
//
// gemm_cpu computes C = alpha * op(A) op(B) + beta * C on row-major matrices, where op(A) is
// (M, K) and op(B) is (K, N). A is stored (M, K) with row stride lda, or (K, M) when transA;
// B is stored (K, N) with row stride ldb, or (N, K) when transB. beta == 0 means C is written
// without being read (it may hold NaN). Cache-blocked with packed panels and a 6x16 register-
// tiled micro-kernel (AVX2 FMA intrinsics, a plain-C fallback without AVX2); each thread owns a
// rectangle of C and sums in a fixed order, so results do not depend on the thread count; no
// external BLAS.
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include "kernels/window.h"
#include "src/base/tensor.h"
#ifdef SWIN_HAVE_CUDA
#include <cuda_runtime.h>  // outside the extern "C" block: it declares C++ templates
#endif

#ifdef __cplusplus
extern "C" {
#endif

void gemm_cpu(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
              const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
              int64_t ldc);

// Linear layer, PyTorch convention: out = inp W^T + b.
//   out (N, OC), inp (N, IC), weight (OC, IC), bias (OC) or NULL.
void linear_forward_cpu(float *out, const float *inp, const float *weight, const float *bias,
                        int64_t N, int IC, int OC);
// dinp (N, IC) is overwritten (skipped when NULL); dweight (OC, IC) and dbias (OC) are
// accumulated (+=), since parameter gradients are summed over a step; dbias may be NULL
// (it is summed while dout is packed for the dweight product, so dweight must not be NULL).
void linear_backward_cpu(float *dinp, float *dweight, float *dbias, const float *dout,
                         const float *inp, const float *weight, int64_t N, int IC, int OC);
// A bias gradient on its own: sums (cols) += the column sums of x (rows, cols), each column
// added over the rows in order in double, in one thread: the bits depend on nothing but the
// values. For ops whose output gradient feeds a linear layer's bias (the CPU backend's
// compositions of the GPU's fused bias gradients).
void column_sums_cpu(float *sums, const float *x, int64_t rows, int cols);

#ifdef SWIN_HAVE_CUDA
// CUDA forms, on cuBLASLt, for operands of element type F32, BF16 or F16 with f32 accumulation
// (f32 products run in true fp32, never TF32: the reference path). A GemmContext owns the
// cuBLASLt handle, a 32 MiB workspace, the stream every launch goes to (no synchronization), and
// the algorithm chosen for each distinct problem (picked once, then reused: deterministic).
// Pointers are device pointers; M, N, K must fit in int.
typedef struct GemmContext GemmContext;
GemmContext *gemm_context_create(cudaStream_t stream);
void gemm_context_destroy(GemmContext *g);
size_t gemm_context_bytes(void);  // device memory a context holds (its workspace)
// Tuning: off (the default), each new product runs cuBLASLt's heuristic's first algorithm; on,
// it runs the fastest of the heuristic's first 16, each timed on the product's own operands at
// its first call outside a CUDA graph capture (kernels/PERF.md, version 15). Either way the
// choice is then fixed for the context's life.
void gemm_context_set_tuning(GemmContext *g, bool on);
// Every product so far: shape, types, calls, the first and the chosen candidate's times.
void gemm_context_report(const GemmContext *g, FILE *out);
// The timed choices as text, so that a later context (a resumed run) runs the same algorithms:
// write_choices writes a header (cuBLASLt version, GPU name and SM count) and one line per timed
// product to f and returns 0 (-1 when a write failed); with f NULL it writes nothing and returns
// how many products were timed since it last wrote. read_choices takes such text: every later
// product with one of its keys runs its algorithm untimed (when cuBLASLt still accepts it);
// returns the lines taken, or -1 with why filled (another GPU or cuBLASLt, a malformed line).
int gemm_context_write_choices(GemmContext *g, FILE *f);
int gemm_context_read_choices(GemmContext *g, const char *text, char *why, size_t why_size);

// gemm_cpu's row-major contract with A, B of type ab and C of type cd (ab, or F32 to accumulate
// low-precision products in f32); bias (N, type cd) or NULL is added to every row. beta == 0
// writes C without reading it; K == 0 gives C = beta C.
void gemm_cuda(GemmContext *g, DType ab, DType cd, bool transA, bool transB, int64_t M, int64_t N,
               int64_t K, float alpha, const void *A, int64_t lda, const void *B, int64_t ldb,
               float beta, void *C, int64_t ldc, const void *bias);
// out (N, OC) = inp (N, IC) weight^T + bias, all of type dt (bias (OC) or NULL), the bias added
// in cuBLASLt's epilogue.
void linear_forward_cuda(GemmContext *g, DType dt, void *out, const void *inp, const void *weight,
                         const void *bias, int64_t N, int IC, int OC);
// Floats of scratch linear_backward_cuda needs to add dout's column sums to dbias.
int64_t linear_backward_cuda_scratch(int64_t N, int OC);
// dinp (N, IC, dt) overwritten (skipped when NULL); dweight (OC, IC) and dbias (OC), f32,
// accumulated (+=), each skipped when NULL (unlike the CPU, dweight may be NULL). dbias += the
// column sums of dout (N, OC), deterministically in two passes through scratch
// (linear_backward_cuda_scratch(N, OC) floats; NULL when dbias is NULL).
void linear_backward_cuda(GemmContext *g, DType dt, void *dinp, float *dweight, float *dbias,
                          const void *dout, const void *inp, const void *weight, int64_t N, int IC,
                          int OC, float *scratch);

// A linear layer for small K of our own (kernels/cuda/gemm_small_k.cu), bf16 only, with the
// bias and optionally the exact GELU in its epilogue. The model runs its bf16 layers on 96 input
// features (Swin-T's stage 0: qkv, proj, fc1, with its GELU where fc2 does not apply it) on it
// (src/model/backend_cuda.cu, use_small_k), where it beat linear_forward_cuda + gelu_forward_cuda
// (kernels/PERF.md, version 12; scripts/bench_gemm.cu times the two).
//   pre (N, OC) = inp (N, IC) weight (OC, IC)^T + bias (OC, or NULL), accumulated in f32 on
//   tensor cores and rounded to bf16 once; when post (N, OC) is not NULL, also post = GELU(pre
//   as stored in bf16), computed by the bf16 GELU forward's own device function: bitwise
//   gelu_forward_cuda(DTYPE_BF16, post, pre, N * OC, stream) of this pre.
// All __nv_bfloat16 device pointers, launched on stream (no synchronization).
// Limits: IC 96, 128 or 192 (a tile's whole K sits in shared memory), OC a positive multiple of
// 32, any N >= 0, every pointer but bias 16-byte aligned. linear_small_k_supported(IC, OC) says
// whether a shape is served; callers check it, and the forward aborts with a message naming
// the argument on anything else (an internal error).
bool linear_small_k_supported(int IC, int OC);
void linear_small_k_forward_cuda(void *pre, void *post, const void *inp, const void *weight,
                                 const void *bias, int64_t N, int IC, int OC, cudaStream_t stream);

// The small-K layer followed by the residual + LayerNorm forward, in one kernel (gemm_small_k.cu;
// for a block's proj and LN2 in Swin-T's stage 0, where the backend's
// linear_residual_layernorm_forward calls it: kernels/PERF.md, version 24): for each token t of
// B images of L tokens,
//   branch[t] = inp[imap(t)] weight^T + bias, rounded to bf16 (inp in the order of inp_map: the
//               attention's windows; NULL: token order)
//   x_out[t] = x_in[t] + scale[b] * branch[t] (scale NULL: 1), rounded to bf16
//   ln_out[t] = LN(x_out[t]) with ln_weight, ln_bias; mean[t], rstd[t] its statistics
// bitwise linear_small_k_forward_cuda into a branch buffer followed by
// residual_layernorm_forward_cuda(DTYPE_BF16, x_out, ln_out, mean, rstd, x_in, branch, inp_map,
// scale, ln_weight, ln_bias, NULL, B, L, C); the branch itself is never stored. bf16 device
// pointers but scale, mean, rstd and the LayerNorm parameters (f32), none NULL but scale and
// bias; x_out may not alias x_in.
// linear_small_k_residual_layernorm_supported(IC, C) says which shapes it serves (IC = C = 96 or
// 128);
// every pointer but bias, scale and the f32 ones 16-byte aligned; it aborts on anything else.
bool linear_small_k_residual_layernorm_supported(int IC, int C);
void linear_small_k_residual_layernorm_cuda(void *x_out, void *ln_out, float *mean, float *rstd,
                                            const void *x_in, const void *inp,
                                            const WindowMap *inp_map, const float *scale,
                                            const void *weight, const void *bias,
                                            const float *ln_weight, const float *ln_bias, int B,
                                            int64_t L, int IC, int C, cudaStream_t stream);

// The linear layer's forward on Hopper's wgmma and TMA (kernels/cuda/gemm_hopper.cu), bf16 only,
// with linear_small_k_forward_cuda's contract: pre (N, OC) = inp (N, IC) weight (OC, IC)^T + bias
// (OC, or NULL), accumulated in f32 and rounded to bf16 once; when post (N, OC) is not NULL,
// also post = GELU(pre as stored), bitwise gelu_forward_cuda(DTYPE_BF16) of this pre.
// linear_hopper_supported(IC, OC) says whether this build and device serve the shape (a build
// for sm_90a, a device of compute capability 9.0, IC and OC positive multiples of 8); the
// forward aborts on anything else. Every pointer but bias 16-byte aligned; launched on stream.
bool linear_hopper_supported(int IC, int OC);
void linear_hopper_forward_cuda(void *pre, void *post, const void *inp, const void *weight,
                                const void *bias, int64_t N, int IC, int OC, cudaStream_t stream);
// The same with the tile's width in output features given (96, 128, 192 or 256; 0: the one
// linear_hopper_forward_cuda picks), for scripts/bench_gemm.cu.
void linear_hopper_forward_tile(void *pre, void *post, const void *inp, const void *weight,
                                const void *bias, int64_t N, int IC, int OC, int tile,
                                cudaStream_t stream);
// The MLP's second layer on the same kernel, GELU applied to its input as the kernel loads it:
// out (N, OC) = GELU(pre (N, IC)) weight (OC, IC)^T + bias (OC, or NULL), GELU(pre) rounded to
// bf16 first, so out is bitwise linear_hopper_forward_cuda of gelu_forward_cuda(pre): the hidden
// layer is never stored. Served where linear_hopper_supported(IC, OC); pointers as above.
void linear_hopper_gelu_forward_cuda(void *out, const void *pre, const void *weight,
                                     const void *bias, int64_t N, int IC, int OC,
                                     cudaStream_t stream);
// The same at a given tile width (96, 128, 192 or 256; 0: the one the above picks).
void linear_hopper_gelu_forward_tile(void *out, const void *pre, const void *weight,
                                     const void *bias, int64_t N, int IC, int OC, int tile,
                                     cudaStream_t stream);
// The same layer followed by the residual + LayerNorm forward in one kernel (for a block's fc2
// and the next block's residual + LN1, or a stage's last residual, in Swin-T's stages 0 and 1
// and Swin-B's stage 0, where the backend's mlp_residual_layernorm_forward calls it:
// kernels/PERF.md, version 25), for B images of L tokens, C = OC:
//   x_out (N, C) = x_in + scale[b] * out (out as above, never stored; scale NULL: 1), rounded
//   to bf16; with ln_out not NULL also ln_out[lmap(t)] = LN(x_out[t]) with ln_weight, ln_bias
//   (f32) and mean[t], rstd[t] its statistics (ln_map NULL: token order)
// bitwise linear_hopper_gelu_forward_tile at width C (the width linear_hopper_gelu_forward_cuda
// picks for Swin's row counts) into a buffer followed by
// residual_layernorm_forward_cuda(DTYPE_BF16, x_out, ln_out, mean, rstd, x_in, buffer, NULL,
// scale, ln_weight, ln_bias, ln_map, B, L, C). Served where
// linear_hopper_gelu_residual_layernorm_supported(IC, C) (C 96, 128 or 192: a tile holds whole
// rows); x_out, x_in and ln_out 16-byte aligned, x_out not aliasing x_in, B * L < 2^31.
bool linear_hopper_gelu_residual_layernorm_supported(int IC, int C);
void linear_hopper_gelu_residual_layernorm_cuda(void *x_out, void *ln_out, float *mean, float *rstd,
                                                const void *x_in, const void *pre,
                                                const void *weight, const void *bias,
                                                const float *scale, const float *ln_weight,
                                                const float *ln_bias, const WindowMap *ln_map,
                                                int B, int64_t L, int IC, int C,
                                                cudaStream_t stream);

// The MLP backward's first half on the same kernel (fc2's d(input) with the GELU pass in its
// epilogue), bf16 only: from dout (N, OC), fc2's weight (OC, IC) as stored and pre (N, IC), fc1's
// output before the GELU,
//   dpre (N, IC) = bf16(dout weight) * GELU'(pre), hidden (N, IC) = GELU(pre),
// each rounded to bf16 once, both as gelu_recompute_backward_cuda computes them from that
// product; with dpre_sums (IC, f32) not NULL also dpre_sums += the column sums of dpre as stored
// (fc1's bias gradient): per CTA in a fixed order, then column_partials_reduce_cuda, so the
// bits are the same run after run on one device (they depend on its SM count). scratch holds
// weight^T and the partial sums: linear_hopper_dgelu_scratch(N, IC, OC) floats, 16-byte aligned;
// linear_hopper_dgelu_scratch_bound(w) covers every IC, OC <= w. Served where
// linear_hopper_supported(OC, IC) (K = OC); every pointer but dpre_sums 16-byte aligned; no
// output may alias an input.
int64_t linear_hopper_dgelu_scratch(int64_t N, int IC, int OC);
int64_t linear_hopper_dgelu_scratch_bound(int max_width);
void linear_hopper_dgelu_cuda(void *dpre, void *hidden, float *dpre_sums, float *scratch,
                              const void *dout, const void *weight, const void *pre, int64_t N,
                              int IC, int OC, cudaStream_t stream);
// The same at a given tile width (96 or 128; 0: the one linear_hopper_dgelu_cuda picks).
void linear_hopper_dgelu_tile(void *dpre, void *hidden, float *dpre_sums, float *scratch,
                              const void *dout, const void *weight, const void *pre, int64_t N,
                              int IC, int OC, int tile, cudaStream_t stream);
// The same with fc2's weight gradient in the kernel instead of hidden (kernels/PERF.md, version
// 22): dpre and dpre_sums as above, dweight (OC, IC, f32) += dout^T GELU(pre), where GELU(pre)
// is the bf16 hidden above, kept in shared memory and never stored. Each CTA sums its tiles' rows
// in f32 on the tensor cores; the CTAs' sums are added in a fixed order in double (bits the same
// run after run on one device). Served where linear_hopper_dgelu_dweight_supported(IC, OC): the
// Hopper GEMM serves (OC, IC) and OC <= 128 (the tile's slabs of dout stay in shared memory).
// Scratch: linear_hopper_dgelu_dweight_scratch(N, IC, OC) floats, 16-byte aligned;
// linear_hopper_dgelu_dweight_scratch_bound(w) covers every IC, OC <= w.
bool linear_hopper_dgelu_dweight_supported(int IC, int OC);
int64_t linear_hopper_dgelu_dweight_scratch(int64_t N, int IC, int OC);
int64_t linear_hopper_dgelu_dweight_scratch_bound(int max_width);
void linear_hopper_dgelu_dweight_cuda(void *dpre, float *dweight, float *dpre_sums, float *scratch,
                                      const void *dout, const void *weight, const void *pre,
                                      int64_t N, int IC, int OC, cudaStream_t stream);

// Bias gradients as deterministic column sums (no atomics): out (cols, f32) += the column sums of
// x (rows, cols, dt), in two passes. The first leaves one row of partial sums per chunk of rows
// in scratch (column_sums_cuda_scratch(rows, cols) floats), on a tiling that depends on (rows,
// cols) and on whether x allows 16-byte loads alone (kernels/cuda/common.cuh); the second adds
// the chunks in a fixed order in double.
// Kernels that write a tensor whose column sums are wanted leave such partials themselves and
// call the second pass, column_partials_reduce_cuda: out[c] += sum over p < parts of
// partial[p * cols + c].
int64_t column_sums_cuda_scratch(int64_t rows, int cols);
void column_sums_cuda(DType dt, float *out, const void *x, int64_t rows, int cols, float *scratch,
                      cudaStream_t stream);
void column_partials_reduce_cuda(float *out, const float *partial, int64_t parts, int cols,
                                 cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
