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
// its algorithm once and keeps it: cuBLASLt is then deterministic on one stream (its split-K
// reductions are fixed-order), so a run's bits do not change from step to step. The algorithm is
// the heuristic's first answer or, with tuning on (gemm_context_set_tuning), the fastest of its
// first kCandidates answers, timed on the problem's own operands at its first call outside a
// graph capture (C saved and restored around the trials when the product accumulates into it).
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
#include "src/base/util.h"

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
constexpr int kCandidates = 16;  // heuristic answers timed per product when tuning
constexpr int kTuneRuns = 5;     // timed runs per candidate (their median), after an untimed one

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
  cublasLtMatrixLayout_t a, b, c;                // cuBLASLt's A (our B), B (our A), C = D
  cublasLtMatmulAlgo_t algo;                     // what every call runs: candidates[chosen]
  cublasLtMatmulAlgo_t candidates[kCandidates];  // the heuristic's answers, its best first
  int num_candidates, chosen;
  bool tune_pending;                // to be timed at the first call outside a capture
  float candidate_ms[kCandidates];  // median time of each once timed; < 0: failed to run
  int64_t calls;
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
  sums[ty][tx] =
      col < cols ? ordered_strided_sum(partial + col, ty, parts, kReduceRows, cols) : 0.0;
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
  bool tune;            // time the candidates of each new product (gemm_context_set_tuning)
  double tune_seconds;  // host time spent timing them
  int tuned_unwritten;  // products timed since gemm_context_write_choices last wrote
  // Choices read back (gemm_context_read_choices): a product of one of these keys runs its
  // algorithm without being timed.
  GemmKey preset_keys[kMaxPlans];
  cublasLtMatmulAlgo_t preset_algos[kMaxPlans];
  int num_presets;
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

void gemm_context_set_tuning(GemmContext *g, bool on) {
  g->tune = on;
}

// The file of choices: a header naming what the algorithms are valid for (the cuBLASLt version
// and the GPU), then one line per timed product: its key's fields and the algorithm's 8 words.
static void choices_header(char *buf, size_t size) {
  int dev = 0;
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  char name[sizeof prop.name];
  snprintf(name, sizeof name, "%s", prop.name);
  for (char *c = name; *c; c++)
    if (*c == ' ') *c = '_';
  snprintf(buf, size, "swin.c gemm choices 1 cublasLt %zu %s sm%d", cublasLtGetVersion(), name,
           prop.multiProcessorCount);
}

int gemm_context_write_choices(GemmContext *g, FILE *f) {
  if (!f) return g->tuned_unwritten;
  char header[384];
  choices_header(header, sizeof header);
  if (fprintf(f, "%s\n", header) < 0) return -1;
  for (int i = 0; i < g->num_plans; i++) {
    const GemmPlan *p = &g->plans[i];
    if (!p->usable || p->tune_pending || !(p->chosen < 0 || p->num_candidates > 1)) continue;
    const GemmKey &k = p->key;
    if (fprintf(f, "%d %d %d %d %lld %lld %lld %lld %lld %lld %d %d %d %d %d", k.ab, k.cd,
                k.trans_a, k.trans_b, (long long)k.M, (long long)k.N, (long long)k.K,
                (long long)k.lda, (long long)k.ldb, (long long)k.ldc, k.epilogue, k.align_a,
                k.align_b, k.align_c, k.align_bias) < 0)
      return -1;
    for (int w = 0; w < 8; w++)
      if (fprintf(f, " %016llx", (unsigned long long)p->algo.data[w]) < 0) return -1;
    if (fputc('\n', f) == EOF) return -1;
  }
  g->tuned_unwritten = 0;
  return 0;
}

int gemm_context_read_choices(GemmContext *g, const char *text, char *why, size_t why_size) {
  char header[384];
  choices_header(header, sizeof header);
  size_t n = strlen(header);
  if (strncmp(text, header, n) != 0 || (text[n] != '\n' && text[n] != 0)) {
    snprintf(why, why_size, "written for another GPU or cuBLASLt (this one: %s)", header);
    return -1;
  }
  int count = 0;
  for (const char *line = strchr(text, '\n'); line && line[1]; line = strchr(line + 1, '\n')) {
    GemmKey k;
    memset(&k, 0, sizeof k);
    long long M, N, K, lda, ldb, ldc;
    unsigned long long w[8];
    if (sscanf(line + 1,
               "%d %d %d %d %lld %lld %lld %lld %lld %lld %d %d %d %d %d %llx %llx %llx %llx %llx "
               "%llx %llx %llx",
               &k.ab, &k.cd, &k.trans_a, &k.trans_b, &M, &N, &K, &lda, &ldb, &ldc, &k.epilogue,
               &k.align_a, &k.align_b, &k.align_c, &k.align_bias, &w[0], &w[1], &w[2], &w[3], &w[4],
               &w[5], &w[6], &w[7]) != 23) {
      snprintf(why, why_size, "line %d does not read as a product and an algorithm", count + 2);
      return -1;
    }
    if (g->num_presets == kMaxPlans) break;
    k.M = M, k.N = N, k.K = K, k.lda = lda, k.ldb = ldb, k.ldc = ldc;
    g->preset_keys[g->num_presets] = k;
    for (int i = 0; i < 8; i++) g->preset_algos[g->num_presets].data[i] = (uint64_t)w[i];
    g->num_presets++;
    count++;
  }
  return count;
}

static int algo_config(const cublasLtMatmulAlgo_t *algo, cublasLtMatmulAlgoConfigAttributes_t a) {
  uint32_t v = 0;  // every attribute read here is 32 bits or narrower, little-endian
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(algo, a, &v, sizeof v, &written) !=
      CUBLAS_STATUS_SUCCESS)
    return -1;
  return (int)v;
}

void gemm_context_report(const GemmContext *g, FILE *out) {
  int tuned = 0;
  double first_ms = 0.0, chosen_ms = 0.0;  // summed over the calls so far
  for (int i = 0; i < g->num_plans; i++) {
    const GemmPlan *p = &g->plans[i];
    if (p->usable && p->chosen >= 0 && !p->tune_pending && p->num_candidates > 1 &&
        p->candidate_ms[0] >= 0.0f) {
      tuned++;
      first_ms += (double)p->calls * p->candidate_ms[0];
      chosen_ms += (double)p->calls * p->candidate_ms[p->chosen];
    }
  }
  int read_back = 0;
  for (int i = 0; i < g->num_plans; i++) read_back += g->plans[i].chosen < 0;
  fprintf(out,
          "gemm: %d products, %d read back, %d timed (%.2f s; up to %d cuBLASLt candidates each)",
          g->num_plans, read_back, tuned, g->tune_seconds, kCandidates);
  if (tuned > 0)
    fprintf(out,
            "; over the calls so far the heuristic's first answers take %.2f ms, the chosen %.2f",
            first_ms, chosen_ms);
  fprintf(out, "\n  %-22s %-9s %-2s %-5s %6s %9s %9s %4s  %s\n", "M x N x K", "types", "tr", "epi",
          "calls", "first ms", "chosen ms", "#", "algo id/tile/stages/splitK/cluster");
  for (int i = 0; i < g->num_plans; i++) {
    const GemmPlan *p = &g->plans[i];
    const GemmKey &k = p->key;
    char dims[48], types[24];
    snprintf(dims, sizeof dims, "%lldx%lldx%lld", (long long)k.M, (long long)k.N, (long long)k.K);
    snprintf(types, sizeof types, "%s/%s", dtype_name((DType)k.ab), dtype_name((DType)k.cd));
    const char *epi = k.epilogue == EPILOGUE_BIAS        ? "bias"
                      : k.epilogue == EPILOGUE_BIAS_GRAD ? "bgrad"
                                                         : "-";
    fprintf(out, "  %-22s %-9s %d%d %-5s %6lld", dims, types, k.trans_a, k.trans_b, epi,
            (long long)p->calls);
    if (!p->usable) {
      fprintf(out, "  (no algorithm)\n");
      continue;
    }
    bool timed = g->tune && p->chosen >= 0 && !p->tune_pending && p->num_candidates > 1;
    if (p->chosen < 0)
      fprintf(out, " %9s %9s %4s", "-", "-", "file");
    else if (timed)
      fprintf(out, " %9.4f %9.4f %4d", p->candidate_ms[0], p->candidate_ms[p->chosen], p->chosen);
    else
      fprintf(out, " %9s %9s %4d", "-", "-", p->chosen);
    const cublasLtMatmulAlgo_t *a = &p->algo;
    fprintf(out, "  %d/%d/%d/%d/%d\n", algo_config(a, CUBLASLT_ALGO_CONFIG_ID),
            algo_config(a, CUBLASLT_ALGO_CONFIG_TILE_ID),
            algo_config(a, CUBLASLT_ALGO_CONFIG_STAGES_ID),
            algo_config(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
            algo_config(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID));
  }
}

// The plan of a problem: found in the cache, or made (descriptors + heuristic) and kept, usable
// or not. bias: the pointer of the first call (the heuristic reads its alignment from the
// descriptor; the key holds that alignment, so every later call with this plan has a bias as
// aligned).
static GemmPlan *gemm_plan(GemmContext *g, const GemmKey &key, const void *bias) {
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
  cublasLtMatmulHeuristicResult_t results[kCandidates];
  int found = 0;
  CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(g->lt, p->desc, p->a, p->b, p->c, p->c, pref,
                                              g->tune ? kCandidates : 1, results, &found));
  cublasLtMatmulPreferenceDestroy(pref);
  g->num_plans++;
  for (int i = 0; i < found; i++)
    if (results[i].state == CUBLAS_STATUS_SUCCESS)
      p->candidates[p->num_candidates++] = results[i].algo;
  p->usable = p->num_candidates >= 1;
  if (p->usable) p->algo = p->candidates[0];
  p->tune_pending = g->tune && p->num_candidates > 1;
  for (int i = 0; p->tune_pending && i < g->num_presets; i++) {
    cublasLtMatmulHeuristicResult_t check;
    if (memcmp(&g->preset_keys[i], &key, sizeof key) == 0 &&
        cublasLtMatmulAlgoCheck(g->lt, p->desc, p->a, p->b, p->c, p->c, &g->preset_algos[i],
                                &check) == CUBLAS_STATUS_SUCCESS &&
        check.workspaceSize <= kWorkspaceBytes) {
      p->algo = g->preset_algos[i];
      p->chosen = -1;  // read back, not timed here
      p->tune_pending = false;
    }
  }
  return p;
}

// gemm_plan for a problem cuBLASLt must serve.
static GemmPlan *gemm_plan_needed(GemmContext *g, const GemmKey &key, const void *bias) {
  GemmPlan *p = gemm_plan(g, key, bias);
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

static cublasStatus_t gemm_launch(GemmContext *g, const GemmPlan *p,
                                  const cublasLtMatmulAlgo_t *algo, float alpha, const void *A,
                                  const void *B, float beta, void *C) {
  return cublasLtMatmul(g->lt, p->desc, &alpha, B, p->a, A, p->b, &beta, C, p->c, C, p->c, algo,
                        g->workspace, kWorkspaceBytes, g->stream);
}

// Times each candidate of p on this call's operands and keeps the fastest. The trials write C
// (and a BGRADB epilogue's bias, which the call overwrites anyway); a C the product accumulates
// into (beta != 0) is saved first and put back before every trial and before the call itself.
static void gemm_tune(GemmContext *g, GemmPlan *p, float alpha, const void *A, const void *B,
                      float beta, void *C) {
  double t0 = time_now_s();
  const GemmKey &k = p->key;
  size_t c_bytes = (size_t)((k.M - 1) * k.ldc + k.N) * dtype_size((DType)k.cd);
  void *saved = nullptr;
  if (beta != 0.0f) {
    CUDA_CHECK(cudaMalloc(&saved, c_bytes));
    CUDA_CHECK(cudaMemcpyAsync(saved, C, c_bytes, cudaMemcpyDeviceToDevice, g->stream));
  }
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  int best = 0;
  for (int i = 0; i < p->num_candidates; i++) {
    float ms[kTuneRuns];
    int runs = 0;
    for (int r = -1; r < kTuneRuns; r++) {  // r = -1: untimed (first use of a kernel loads it)
      if (saved)
        CUDA_CHECK(cudaMemcpyAsync(C, saved, c_bytes, cudaMemcpyDeviceToDevice, g->stream));
      CUDA_CHECK(cudaEventRecord(start, g->stream));
      if (gemm_launch(g, p, &p->candidates[i], alpha, A, B, beta, C) != CUBLAS_STATUS_SUCCESS)
        break;
      CUDA_CHECK(cudaEventRecord(stop, g->stream));
      CUDA_CHECK(cudaEventSynchronize(stop));
      if (r >= 0) CUDA_CHECK(cudaEventElapsedTime(&ms[runs++], start, stop));
    }
    if (runs < kTuneRuns) {
      p->candidate_ms[i] = -1.0f;
      continue;
    }
    for (int a = 1; a < runs; a++)  // insertion sort for the median
      for (int b = a; b > 0 && ms[b] < ms[b - 1]; b--) {
        float t = ms[b];
        ms[b] = ms[b - 1];
        ms[b - 1] = t;
      }
    p->candidate_ms[i] = ms[runs / 2];
    if (p->candidate_ms[best] < 0.0f || p->candidate_ms[i] < p->candidate_ms[best]) best = i;
  }
  CUDA_CHECK(cudaGetLastError());
  if (p->candidate_ms[best] < 0.0f) best = 0;  // none ran: the heuristic's answer, as untuned
  p->chosen = best;
  p->algo = p->candidates[best];
  if (saved) {
    CUDA_CHECK(cudaMemcpyAsync(C, saved, c_bytes, cudaMemcpyDeviceToDevice, g->stream));
    CUDA_CHECK(cudaStreamSynchronize(g->stream));
    CUDA_CHECK(cudaFree(saved));
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  p->tune_pending = false;
  g->tune_seconds += time_now_s() - t0;
  g->tuned_unwritten++;
}

static bool stream_capturing(cudaStream_t s) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(s, &status));
  return status != cudaStreamCaptureStatusNone;
}

static void gemm_run(GemmContext *g, GemmPlan *p, float alpha, const void *A, const void *B,
                     float beta, void *C, const void *bias) {
  if (bias)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                sizeof bias));
  if (p->tune_pending && !stream_capturing(g->stream)) gemm_tune(g, p, alpha, A, B, beta, C);
  p->calls++;
  CUBLAS_CHECK(gemm_launch(g, p, &p->algo, alpha, A, B, beta, C));
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
    GemmPlan *p = gemm_plan(g, key, scratch);
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
