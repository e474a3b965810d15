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
