// gemm.cu: matrix products on cuBLASLt and the linear layer on top (kernels/gemm.h), for f32,
// bf16 and f16 operands with f32 accumulation.
//
// cuBLASLt is column-major; a row-major (R, S) matrix with row stride ld is the column-major
// (S, R) matrix with the same ld, its transpose. So the row-major C = op(A) op(B) is computed as
// the column-major C^T = op(B)^T op(A)^T: swap the operands and M with N, keep each operand's
// transpose flag. The bias epilogue adds a vector along the column-major rows of C^T, which are
// the row-major columns of C: one value per output feature, as a linear layer wants.
//
// f32 runs in CUBLAS_COMPUTE_32F, true fp32 (no TF32): the reference path the reduced precisions
// are measured against. Every distinct problem (types, shape, strides, alignment, epilogue) gets
// its algorithm from the heuristic once and keeps it: cuBLASLt is then deterministic on one stream
// (its split-K reductions are fixed-order), so a run's bits do not change from step to step.
//
// Epilogues: the bias add of the forward, and in the backward the bias gradient (BGRADB: the
// column sums of dout, reduced inside the dweight product that reads dout anyway) for callers
// that ask linear_backward_cuda for one (the head). Where cuBLASLt has no algorithm with BGRADB
// for a problem, the column sums run as two passes of our own instead (column_sums_cuda). The
// model's linear layers ask for none: cuBLASLt often ran BGRADB as a separate small kernel, so
// their bias gradients come from the kernels that write their output gradients, on the tiling
// of kernels/cuda/common.cuh, with column_partials_reduce_cuda as the second pass. cuBLASLt's GELU
// epilogues are not used: they compute the tanh approximation, and the models here use the exact
// (erf) GELU (kernels/cuda/gelu.cu).
#include <cublasLt.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/common.cuh"
#include "kernels/gemm.h"
#include "src/base/cuda_util.h"

#define CUBLAS_CHECK(call)                                                                      \
  do {                                                                                          \
    cublasStatus_t st_ = (call);                                                                \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                         \
      fprintf(stderr, "cuBLAS error %s at %s:%d: %s\n", cublasLtGetStatusString(st_), __FILE__, \
              __LINE__, #call);                                                                 \
      abort();                                                                                  \
    }                                                                                           \
  } while (0)

namespace {

using namespace swin_cuda;

constexpr size_t kWorkspaceBytes = 32u << 20;
constexpr int kMaxPlans = 256;

// What decides the algorithm of one product.
struct GemmKey {
  int ab, cd;  // DType of A and B, of C and D
  int trans_a, trans_b;
  int64_t M, N, K, lda, ldb, ldc;
  int epilogue;                               // Epilogue
  int align_a, align_b, align_c, align_bias;  // bytes, powers of two up to 256
};

enum Epilogue { EPILOGUE_NONE, EPILOGUE_BIAS, EPILOGUE_BIAS_GRAD };

struct GemmPlan {
  GemmKey key;
  bool usable;  // cuBLASLt has an algorithm for it
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t a, b, c;  // cuBLASLt's A (our B), B (our A), C = D
  cublasLtMatmulAlgo_t algo;
};

int pointer_alignment(const void *p) {
  uintptr_t v = (uintptr_t)p;
  int a = 1;
  while (a < 256 && (v & (uintptr_t)(2 * a - 1)) == 0) a *= 2;
  return p ? a : 256;
}

cudaDataType_t cuda_type(int dt) {
  switch (dt) {
    case DTYPE_F32:
      return CUDA_R_32F;
    case DTYPE_BF16:
      return CUDA_R_16BF;
    case DTYPE_F16:
      return CUDA_R_16F;
    default:
      unsupported_dtype("gemm_cuda", (DType)dt);
  }
}

void check_fits_int(const char *what, int64_t v) {
  if (v > INT_MAX) {
    fprintf(stderr, "gemm_cuda: %s = %lld exceeds 32-bit sizes\n", what, (long long)v);
    abort();
  }
}

// (rows, cols) elementwise kernels: a warp along a row (coalesced), 8 rows per block, the rows
// beyond gridDim.y's limit covered by a loop.
constexpr int kColsPerBlock = 32, kRowsPerBlock = 8;

struct MatrixLaunch {
  dim3 grid, block;
};

MatrixLaunch matrix_launch(int64_t rows, int64_t cols) {
  int64_t row_blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  MatrixLaunch l;
  l.block = dim3(kColsPerBlock, kRowsPerBlock);
  l.grid = dim3((unsigned)((cols + kColsPerBlock - 1) / kColsPerBlock),
                (unsigned)(row_blocks < 65535 ? row_blocks : 65535));
  return l;
}

// C (rows, cols; row stride ldc) = beta C, with beta == 0 writing zeros without reading C: the
// product with K == 0, which cuBLASLt does not take.
template <typename T>
__global__ void scale_kernel(T *C, int64_t rows, int64_t cols, int64_t ldc, float beta) {
  int64_t j = (int64_t)blockIdx.x * kColsPerBlock + threadIdx.x;
  if (j >= cols) return;
  for (int64_t i = (int64_t)blockIdx.y * kRowsPerBlock + threadIdx.y; i < rows;
       i += (int64_t)gridDim.y * kRowsPerBlock) {
    T *c = C + i * ldc + j;
    *c = from_float<T>(beta == 0.0f ? 0.0f : beta * to_float<T>(*c));
  }
}

// ---- deterministic column sums ------------------------------------------------------------
// Pass 1 (column_sums_partial_kernel) leaves each row chunk's column sums in partial on the
// tiling of kernels/cuda/common.cuh; pass 2 (column_partials_reduce_kernel) adds the chunks.

template <typename T, int VEC>
__global__ void __launch_bounds__(kColumnThreads)
    column_sums_partial_kernel(float *__restrict__ partial, const T *__restrict__ x, int64_t rows,
                               int cols, int64_t rows_per_chunk) {
  const int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t r0 = (int64_t)blockIdx.y * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  float acc[VEC] = {};
  if (v * VEC < cols) {
#pragma unroll 4
    for (int64_t r = r0 + threadIdx.y; r < r1; r += blockDim.y) {
      float xv[VEC];
      load_vec<T, VEC>(xv, x + r * cols + v * VEC);
#pragma unroll
      for (int e = 0; e < VEC; e++) acc[e] += xv[e];
    }
  }
  column_partial_store<VEC>(partial, acc, cols);
}

// The reduction of the partials: 32 columns per block, 32 thread rows splitting the parts.
constexpr int kWarp = 32, kReduceRows = 32;

// out[col] += sum over p < parts of partial[p * cols + col], in double and in a fixed order:
// thread row ty adds parts ty, ty + 32, ... in order, then thread row 0 adds the 32 thread rows
// in order. Block (32, 32) per 32 columns: the loads of a warp are one row's 32 columns.
__global__ void __launch_bounds__(kWarp *kReduceRows)
    column_partials_reduce_kernel(float *__restrict__ out, const float *__restrict__ partial,
                                  int64_t parts, int cols) {
  __shared__ double sums[kReduceRows][kWarp];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t col = (int64_t)blockIdx.x * kWarp + tx;
  double s = 0.0;
  if (col < cols) {
#pragma unroll 4
    for (int64_t p = ty; p < parts; p += kReduceRows) s += partial[p * cols + col];
  }
  sums[ty][tx] = s;
  __syncthreads();
  if (ty == 0 && col < cols) {
    double total = 0.0;
    for (int y = 0; y < kReduceRows; y++) total += sums[y][tx];
    out[col] += (float)total;
  }
}

}  // namespace

struct GemmContext {
  cublasLtHandle_t lt;
  cudaStream_t stream;
  void *workspace;
  GemmPlan plans[kMaxPlans];
  int num_plans;
};

GemmContext *gemm_context_create(cudaStream_t stream) {
  GemmContext *g = (GemmContext *)calloc(1, sizeof(GemmContext));
  if (!g) abort();
  g->stream = stream;
  CUBLAS_CHECK(cublasLtCreate(&g->lt));
  CUDA_CHECK(cudaMalloc(&g->workspace, kWorkspaceBytes));
  return g;
}

void gemm_context_destroy(GemmContext *g) {
  if (!g) return;
  for (int i = 0; i < g->num_plans; i++) {
    GemmPlan *p = &g->plans[i];
    cublasLtMatrixLayoutDestroy(p->a);
    cublasLtMatrixLayoutDestroy(p->b);
    cublasLtMatrixLayoutDestroy(p->c);
    cublasLtMatmulDescDestroy(p->desc);
  }
  cudaFree(g->workspace);
  cublasLtDestroy(g->lt);
  free(g);
}

size_t gemm_context_bytes(void) {
  return kWorkspaceBytes;
}

// The plan of a problem: found in the cache, or made (descriptors + heuristic) and kept, usable
// or not. bias: the pointer of the first call (the heuristic reads its alignment from the
// descriptor; the key holds that alignment, so every later call with this plan has a bias as
// aligned).
static const GemmPlan *gemm_plan(GemmContext *g, const GemmKey &key, const void *bias) {
  for (int i = 0; i < g->num_plans; i++)
    if (memcmp(&g->plans[i].key, &key, sizeof key) == 0) return &g->plans[i];
  if (g->num_plans == kMaxPlans) {
    fprintf(stderr, "gemm_cuda: more than %d distinct products\n", kMaxPlans);
    abort();
  }
  GemmPlan *p = &g->plans[g->num_plans];
  p->key = key;
  cudaDataType_t ab = cuda_type(key.ab), cd = cuda_type(key.cd);
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // cuBLASLt's A is our B, its B our A (see the top of the file).
  cublasOperation_t op_a = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t op_b = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  cublasLtEpilogue_t epilogue = key.epilogue == EPILOGUE_BIAS        ? CUBLASLT_EPILOGUE_BIAS
                                : key.epilogue == EPILOGUE_BIAS_GRAD ? CUBLASLT_EPILOGUE_BGRADB
                                                                     : CUBLASLT_EPILOGUE_DEFAULT;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                              sizeof epilogue));
  if (bias)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                sizeof bias));
  if (key.epilogue == EPILOGUE_BIAS_GRAD) {  // the gradient in f32, whatever C's type
    cudaDataType_t f32 = CUDA_R_32F;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &f32,
                                                sizeof f32));
  }
  // Stored shapes, column-major: our B is (N, K) or, transposed, (K, N); our A (K, M) or (M, K).
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, ab, key.trans_b ? key.K : key.N,
                                          key.trans_b ? key.N : key.K, key.ldb));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, ab, key.trans_a ? key.M : key.K,
                                          key.trans_a ? key.K : key.M, key.lda));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, cd, key.N, key.M, key.ldc));

  cublasLtMatmulPreference_t pref;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = kWorkspaceBytes;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &ws, sizeof ws));
  uint32_t align_a = (uint32_t)key.align_b, align_b = (uint32_t)key.align_a,
           align_c = (uint32_t)key.align_c;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof align_a));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof align_b));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof align_c));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof align_c));
  cublasLtMatmulHeuristicResult_t result;
  int found = 0;
  CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(g->lt, p->desc, p->a, p->b, p->c, p->c, pref, 1,
                                              &result, &found));
  cublasLtMatmulPreferenceDestroy(pref);
  g->num_plans++;
  p->usable = found >= 1;
  if (p->usable) p->algo = result.algo;
  return p;
}

// gemm_plan for a problem cuBLASLt must serve.
static const GemmPlan *gemm_plan_needed(GemmContext *g, const GemmKey &key, const void *bias) {
  const GemmPlan *p = gemm_plan(g, key, bias);
  if (!p->usable) {
    fprintf(stderr,
            "gemm_cuda: cuBLASLt has no algorithm for M=%lld N=%lld K=%lld (types %s/%s, trans "
            "%d%d, epilogue %d)\n",
            (long long)key.M, (long long)key.N, (long long)key.K, dtype_name((DType)key.ab),
            dtype_name((DType)key.cd), key.trans_a, key.trans_b, key.epilogue);
    abort();
  }
  return p;
}

static GemmKey gemm_key(DType ab, DType cd, bool transA, bool transB, int64_t M, int64_t N,
                        int64_t K, const void *A, int64_t lda, const void *B, int64_t ldb,
                        const void *C, int64_t ldc, Epilogue epilogue, const void *bias) {
  check_fits_int("M", M);
  check_fits_int("N", N);
  check_fits_int("K", K);
  GemmKey key;
  memset(&key, 0, sizeof key);  // padding too: keys are compared bytewise
  key.ab = ab;
  key.cd = cd;
  key.trans_a = transA;
  key.trans_b = transB;
  key.M = M, key.N = N, key.K = K, key.lda = lda, key.ldb = ldb, key.ldc = ldc;
  key.epilogue = epilogue;
  key.align_a = pointer_alignment(A);
  key.align_b = pointer_alignment(B);
  key.align_c = pointer_alignment(C);
  key.align_bias = pointer_alignment(bias);
  return key;
}

static void gemm_run(GemmContext *g, const GemmPlan *p, float alpha, const void *A, const void *B,
                     float beta, void *C, const void *bias) {
  if (bias)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                sizeof bias));
  CUBLAS_CHECK(cublasLtMatmul(g->lt, p->desc, &alpha, B, p->a, A, p->b, &beta, C, p->c, C, p->c,
                              &p->algo, g->workspace, kWorkspaceBytes, g->stream));
}

void gemm_cuda(GemmContext *g, DType ab, DType cd, bool transA, bool transB, int64_t M, int64_t N,
               int64_t K, float alpha, const void *A, int64_t lda, const void *B, int64_t ldb,
               float beta, void *C, int64_t ldc, const void *bias) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    // A sum of no terms (bias ignored: no caller asks for one here).
    MatrixLaunch l = matrix_launch(M, N);
    SWIN_DISPATCH(cd, T,
                  scale_kernel<T>
                  <<<l.grid, l.block, 0, g->stream>>>(static_cast<T *>(C), M, N, ldc, beta));
    CUDA_CHECK_LAUNCH();
    return;
  }
  GemmKey key = gemm_key(ab, cd, transA, transB, M, N, K, A, lda, B, ldb, C, ldc,
                         bias ? EPILOGUE_BIAS : EPILOGUE_NONE, bias);
  gemm_run(g, gemm_plan_needed(g, key, bias), alpha, A, B, beta, C, bias);
}

void linear_forward_cuda(GemmContext *g, DType dt, void *out, const void *inp, const void *weight,
                         const void *bias, int64_t N, int IC, int OC) {
  gemm_cuda(g, dt, dt, false, true, N, OC, IC, 1.0f, inp, IC, weight, IC, 0.0f, out, OC, bias);
}

int64_t column_sums_cuda_scratch(int64_t rows, int cols) {
  return column_chunks_bound(rows) * (cols > 0 ? cols : 0);
}

void column_partials_reduce_cuda(float *out, const float *partial, int64_t parts, int cols,
                                 cudaStream_t stream) {
  if (parts <= 0 || cols <= 0) return;
  column_partials_reduce_kernel<<<(unsigned)((cols + kWarp - 1) / kWarp), dim3(kWarp, kReduceRows),
                                  0, stream>>>(out, partial, parts, cols);
  CUDA_CHECK_LAUNCH();
}

void column_sums_cuda(DType dt, float *out, const void *x, int64_t rows, int cols, float *scratch,
                      cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  SWIN_DISPATCH(dt, T, {
    const T *xt = static_cast<const T *>(x);
    const bool vec = cols % kVec16<T> == 0 && aligned16(x);
    const int V = vec ? kVec16<T> : 1;
    ColumnTiling t = column_tiling(rows, cols / V);
    dim3 grid((unsigned)t.col_groups, (unsigned)t.chunks), block(t.tx, t.ty);
    if (vec)
      column_sums_partial_kernel<T, kVec16<T>>
          <<<grid, block, 0, stream>>>(scratch, xt, rows, cols, t.rows_per_chunk);
    else
      column_sums_partial_kernel<T, 1>
          <<<grid, block, 0, stream>>>(scratch, xt, rows, cols, t.rows_per_chunk);
    CUDA_CHECK_LAUNCH();
    column_partials_reduce_cuda(out, scratch, t.chunks, cols, stream);
  });
}

int64_t linear_backward_cuda_scratch(int64_t N, int OC) {
  return column_sums_cuda_scratch(N, OC);
}

void linear_backward_cuda(GemmContext *g, DType dt, void *dinp, float *dweight, float *dbias,
                          const void *dout, const void *inp, const void *weight, int64_t N, int IC,
                          int OC, float *scratch) {
  // dinp (N, IC) = dout (N, OC) weight (OC, IC)
  if (dinp)
    gemm_cuda(g, dt, dt, false, false, N, IC, OC, 1.0f, dout, OC, weight, IC, 0.0f, dinp, IC,
              nullptr);
  if (!dbias && dweight)
    // dweight (OC, IC) += dout^T (OC, N) inp (N, IC), accumulated in f32
    gemm_cuda(g, dt, DTYPE_F32, true, false, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dweight, IC,
              nullptr);
  if (!dbias || N <= 0 || OC <= 0) return;
  if (!scratch) {
    fprintf(stderr,
            "linear_backward_cuda: dbias needs scratch (%lld floats)\n"
            "HINT: allocate linear_backward_cuda_scratch(N, OC) floats on the device\n",
            (long long)linear_backward_cuda_scratch(N, OC));
    abort();
  }
  if (dweight && IC > 0) {
    // The same product with dout's column sums from the epilogue into scratch (OC floats), then
    // added to dbias; when cuBLASLt cannot, the product alone and the two passes below.
    check_fits_int("IC", IC);
    GemmKey key = gemm_key(dt, DTYPE_F32, true, false, OC, IC, N, dout, OC, inp, IC, dweight, IC,
                           EPILOGUE_BIAS_GRAD, scratch);
    const GemmPlan *p = gemm_plan(g, key, scratch);
    if (p->usable) {
      gemm_run(g, p, 1.0f, dout, inp, 1.0f, dweight, scratch);
      column_partials_reduce_cuda(dbias, scratch, 1, OC, g->stream);
      return;
    }
    gemm_cuda(g, dt, DTYPE_F32, true, false, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dweight, IC,
              nullptr);
  }
  // dbias (OC) += column sums of dout (N, OC), in two fixed-order passes.
  column_sums_cuda(dt, dbias, dout, N, OC, scratch, g->stream);
}
