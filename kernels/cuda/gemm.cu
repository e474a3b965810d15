// gemm.cu: single-precision matrix products on cuBLAS, and the linear layer on top
// (kernels/gemm.h).
//
// cuBLAS is column-major; a row-major (R, S) matrix with row stride ld is the column-major
// (S, R) matrix with the same ld, its transpose. So the row-major C = op(A) op(B) is computed as
// the column-major C^T = op(B)^T op(A)^T: swap the operands and M with N, keep each operand's
// transpose flag. The fp32 product runs in CUBLAS_DEFAULT_MATH (no TF32): this is the reference
// path the reduced-precision modes are measured against.
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/common.cuh"
#include "kernels/gemm.h"
#include "src/cuda_util.h"

#define CUBLAS_CHECK(call)                                                                    \
  do {                                                                                        \
    cublasStatus_t st_ = (call);                                                              \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                       \
      fprintf(stderr, "cuBLAS error %s at %s:%d: %s\n", cublasGetStatusString(st_), __FILE__, \
              __LINE__, #call);                                                               \
      abort();                                                                                \
    }                                                                                         \
  } while (0)

namespace {

using namespace swin_cuda;

// (rows, cols) elementwise kernels: a warp along a row (coalesced), 8 rows per block, the
// rows beyond gridDim.y's limit covered by a loop.
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

// C (rows, cols; row stride ldc) = beta C, with beta == 0 writing zeros without reading C.
__global__ void scale_kernel(float *C, int64_t rows, int64_t cols, int64_t ldc, float beta) {
  int64_t j = (int64_t)blockIdx.x * kColsPerBlock + threadIdx.x;
  if (j >= cols) return;
  for (int64_t i = (int64_t)blockIdx.y * kRowsPerBlock + threadIdx.y; i < rows;
       i += (int64_t)gridDim.y * kRowsPerBlock) {
    float *c = C + i * ldc + j;
    *c = beta == 0.0f ? 0.0f : beta * *c;
  }
}

// out (rows, cols) = bias (cols) on every row.
__global__ void broadcast_rows_kernel(float *__restrict__ out, const float *__restrict__ bias,
                                      int64_t rows, int64_t cols) {
  int64_t j = (int64_t)blockIdx.x * kColsPerBlock + threadIdx.x;
  if (j >= cols) return;
  float v = bias[j];
  for (int64_t i = (int64_t)blockIdx.y * kRowsPerBlock + threadIdx.y; i < rows;
       i += (int64_t)gridDim.y * kRowsPerBlock)
    out[i * cols + j] = v;
}

// ---- deterministic column sums ------------------------------------------------------------
// Pass 1 splits the rows into `chunks` fixed ranges; block (column group, chunk) sums its range
// for 32 columns (8 thread rows, each a strided subset, then the 8 added in order) into
// partial (chunks, cols). Pass 2 sums each column's partials in a fixed tree and adds the total
// to the output. The partition depends only on (rows, cols), never on the device.
constexpr int kMaxPass1Blocks = 1024;  // enough to fill an H200; bounds pass 2's work
constexpr int kMinRowsPerChunk = 64;

int64_t column_sum_chunks(int64_t rows, int64_t cols) {
  int64_t col_blocks = (cols + kColsPerBlock - 1) / kColsPerBlock;
  int64_t chunks = col_blocks > 0 ? kMaxPass1Blocks / col_blocks : 1;
  int64_t by_rows = (rows + kMinRowsPerChunk - 1) / kMinRowsPerChunk;
  if (chunks > by_rows) chunks = by_rows;
  return chunks > 1 ? chunks : 1;
}

__global__ void column_sums_partial_kernel(float *__restrict__ partial, const float *__restrict__ x,
                                           int64_t rows, int cols, int64_t rows_per_chunk) {
  __shared__ float sums[kRowsPerBlock][kColsPerBlock + 1];
  int64_t col = (int64_t)blockIdx.x * kColsPerBlock + threadIdx.x;
  int64_t r0 = (int64_t)blockIdx.y * rows_per_chunk;
  int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  float acc = 0.0f;
  if (col < cols)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowsPerBlock) acc += x[r * cols + col];
  sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float total = 0.0f;
    for (int i = 0; i < kRowsPerBlock; i++) total += sums[i][threadIdx.x];
    partial[(int64_t)blockIdx.y * cols + col] = total;
  }
}

constexpr int kFinishWarps = 8;  // columns (one per warp) per pass-2 block

// out[col] += sum over chunks of partial[chunk][col]; lane 0's butterfly result is used (all
// lanes hold the same bits, since a + b == b + a exactly).
__global__ void column_sums_finish_kernel(float *__restrict__ out,
                                          const float *__restrict__ partial, int64_t chunks,
                                          int cols) {
  int64_t col = (int64_t)blockIdx.x * kFinishWarps + (threadIdx.x >> 5);
  int lane = threadIdx.x & 31;
  if (col >= cols) return;  // whole warps: no barrier below
  float acc = 0.0f;
  for (int64_t c = lane; c < chunks; c += 32) acc += partial[c * cols + col];
  acc = warp_sum(acc);
  if (lane == 0) out[col] += acc;
}

void check_fits_int(const char *fn, const char *what, int64_t v) {
  if (v > INT_MAX) {
    fprintf(stderr, "%s: %s = %lld exceeds cuBLAS's 32-bit sizes\n", fn, what, (long long)v);
    abort();
  }
}

cudaStream_t handle_stream(cublasHandle_t handle) {
  cudaStream_t stream = nullptr;
  CUBLAS_CHECK(cublasGetStream(handle, &stream));
  return stream;
}

}  // namespace

void gemm_cuda(cublasHandle_t handle, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
               float alpha, const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
               float *C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    // A sum of no terms; handled here since cuBLAS rejects the leading dimensions a row-major
    // caller may pass for empty operands (lda = K = 0).
    MatrixLaunch l = matrix_launch(M, N);
    scale_kernel<<<l.grid, l.block, 0, handle_stream(handle)>>>(C, M, N, ldc, beta);
    CUDA_CHECK_LAUNCH();
    return;
  }
  check_fits_int("gemm_cuda", "M", M);
  check_fits_int("gemm_cuda", "N", N);
  check_fits_int("gemm_cuda", "K", K);
  check_fits_int("gemm_cuda", "lda", lda);
  check_fits_int("gemm_cuda", "ldb", ldb);
  check_fits_int("gemm_cuda", "ldc", ldc);
  CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));
  CUBLAS_CHECK(cublasSgemm(handle, transB ? CUBLAS_OP_T : CUBLAS_OP_N,
                           transA ? CUBLAS_OP_T : CUBLAS_OP_N, (int)N, (int)M, (int)K, &alpha, B,
                           (int)ldb, A, (int)lda, &beta, C, (int)ldc));
}

void linear_forward_cuda(cublasHandle_t handle, float *out, const float *inp, const float *weight,
                         const float *bias, int64_t N, int IC, int OC) {
  if (N <= 0 || OC <= 0) return;
  float beta = 0.0f;
  if (bias) {
    // out = bias, then out = inp weight^T + 1 * out: cuBLAS adds the bias in its epilogue.
    MatrixLaunch l = matrix_launch(N, OC);
    broadcast_rows_kernel<<<l.grid, l.block, 0, handle_stream(handle)>>>(out, bias, N, OC);
    CUDA_CHECK_LAUNCH();
    beta = 1.0f;
  }
  gemm_cuda(handle, false, true, N, OC, IC, 1.0f, inp, IC, weight, IC, beta, out, OC);
}

int64_t linear_backward_cuda_scratch(int64_t N, int OC) {
  return column_sum_chunks(N, OC) * (OC > 0 ? OC : 0);
}

void linear_backward_cuda(cublasHandle_t handle, float *dinp, float *dweight, float *dbias,
                          const float *dout, const float *inp, const float *weight, int64_t N,
                          int IC, int OC, float *scratch) {
  // dinp (N, IC) = dout (N, OC) weight (OC, IC)
  if (dinp) gemm_cuda(handle, false, false, N, IC, OC, 1.0f, dout, OC, weight, IC, 0.0f, dinp, IC);
  // dweight (OC, IC) += dout^T (OC, N) inp (N, IC)
  if (dweight)
    gemm_cuda(handle, true, false, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dweight, IC);
  if (!dbias || N <= 0 || OC <= 0) return;
  if (!scratch) {
    fprintf(stderr,
            "linear_backward_cuda: dbias needs scratch (%lld floats)\n"
            "HINT: allocate linear_backward_cuda_scratch(N, OC) floats on the device\n",
            (long long)linear_backward_cuda_scratch(N, OC));
    abort();
  }
  // dbias (OC) += column sums of dout (N, OC), in two fixed-order passes.
  cudaStream_t stream = handle_stream(handle);
  int64_t chunks = column_sum_chunks(N, OC);
  int64_t rows_per_chunk = (N + chunks - 1) / chunks;
  dim3 grid1((unsigned)((OC + kColsPerBlock - 1) / kColsPerBlock), (unsigned)chunks);
  column_sums_partial_kernel<<<grid1, dim3(kColsPerBlock, kRowsPerBlock), 0, stream>>>(
      scratch, dout, N, OC, rows_per_chunk);
  CUDA_CHECK_LAUNCH();
  unsigned grid2 = (unsigned)((OC + kFinishWarps - 1) / kFinishWarps);
  column_sums_finish_kernel<<<grid2, kFinishWarps * 32, 0, stream>>>(dbias, scratch, chunks, OC);
  CUDA_CHECK_LAUNCH();
}
