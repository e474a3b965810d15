// gemm.h: single-precision matrix products for the CPU trainer, and the linear layer on top.
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
#ifdef SWIN_HAVE_CUDA
// Outside the extern "C" block: cuda_runtime.h declares C++ templates.
#include <cublas_v2.h>
#include <cuda_runtime.h>
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

#ifdef SWIN_HAVE_CUDA
// CUDA forms, on cuBLAS. Differences from the CPU contract:
// - They take a cublasHandle_t first instead of a trailing stream. The caller creates the
//   handle and binds it to its stream with cublasSetStream; every launch here (cuBLAS and our
//   own small kernels) goes to that stream (cublasGetStream), with no synchronization. The
//   handle must be in CUBLAS_POINTER_MODE_HOST (cublasCreate's default): alpha, beta are host
//   values.
// - fp32 reference path: gemm_cuda sets the handle's math mode to CUBLAS_DEFAULT_MATH before
//   each product, so fp32 products never run on TF32 tensor cores.
// - Pointers are device pointers; sizes and leading dimensions must fit in int (cuBLAS's
//   32-bit API); the process aborts with a message otherwise.
// - Determinism: cuBLAS gives the same bits run after run on the same GPU model and toolkit
//   only while one stream uses the handle's workspace at a time; with concurrent streams give
//   each stream its own handle (or cublasSetWorkspace). Our bias-gradient reduction is a fixed
//   two-pass partition.

// gemm_cpu's row-major contract, computed as the column-major C^T = op(B)^T op(A)^T with
// cublasSgemm. beta == 0 writes C without reading it; K == 0 gives C = beta C.
void gemm_cuda(cublasHandle_t handle, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
               float alpha, const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
               float *C, int64_t ldc);
// out (N, OC) = inp (N, IC) weight^T + bias: the bias is broadcast into out, then the product
// is added with beta = 1 (bias (OC) or NULL).
void linear_forward_cuda(cublasHandle_t handle, float *out, const float *inp, const float *weight,
                         const float *bias, int64_t N, int IC, int OC);
// Floats of scratch linear_backward_cuda needs to add dout's column sums to dbias.
int64_t linear_backward_cuda_scratch(int64_t N, int OC);
// dinp (N, IC) overwritten (skipped when NULL); dweight (OC, IC) and dbias (OC) accumulated
// (+=), each skipped when NULL (unlike the CPU, dweight may be NULL). dbias += the column sums
// of dout (N, OC), deterministically in two passes through scratch
// (linear_backward_cuda_scratch(N, OC) floats of device memory; NULL when dbias is NULL).
void linear_backward_cuda(cublasHandle_t handle, float *dinp, float *dweight, float *dbias,
                          const float *dout, const float *inp, const float *weight, int64_t N,
                          int IC, int OC, float *scratch);
#endif

#ifdef __cplusplus
}
#endif
