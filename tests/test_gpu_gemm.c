// test_gpu_gemm.c: gemm_cuda and the CUDA linear layer against the CPU reference
// (kernels/cpu/gemm.c, itself checked against double sums in test_gemm.c): all four transpose
// cases on odd, thin and Swin-sized shapes, leading dimensions wider than the rows (the padding
// of A and B is NaN, that of C a sentinel that must survive), beta = 0 over a poisoned C,
// beta != 0, alpha = 0, K = 0, M = 0 / N = 0, a handle left in TF32 math mode, run-to-run
// bitwise equality, and the linear layer forward / backward with its NULL-gradient paths.
//
// Tolerance: each output is a K-term dot product accumulated in fp32 on both sides, in
// different orders; the rounding error of such a sum grows like sqrt(K) * eps (eps = 6e-8),
// about 2e-6 per side at K = 1000. 1e-5 up to K = 1024, scaled by sqrt(K / 1024) beyond (the
// weight gradient sums over all N rows), still catches any wrong element: one element off by
// 1% in a 1000-element output gives 3e-4. TF32 (10-bit mantissa) would show as ~1e-3.
#include <stdbool.h>

#include "kernels/gemm.h"
#include "tests/test_gpu_util.h"

#ifdef SWIN_HAVE_CUDA
// Written into the columns of C past N (ldc > N): the kernel must leave them alone.
#define SENTINEL 12345.0f

static double gemm_tol(int64_t K) {
  return 1e-5 * fmax(1.0, sqrt((double)K / 1024.0));
}

static void cublas_ok(cublasStatus_t st, const char *what) {
  if (st != CUBLAS_STATUS_SUCCESS) {
    fprintf(stderr, "test_gpu_gemm: %s failed: %s\n", what, cublasGetStatusString(st));
    exit(1);
  }
}

// A (rows, cols) matrix stored with row stride ld >= cols; the padding is NaN, so a kernel that
// reads past a row poisons its result.
static int64_t count_differing(const float *a, const float *b, int64_t n) {
  int64_t differ = 0;
  for (int64_t i = 0; i < n; i++) differ += memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return differ;
}

static void check_same_bits(const char *what, const float *a, const float *b, int64_t n) {
  int64_t differ = count_differing(a, b, n);
  test_check(differ == 0, "%-48s %lld elements differ", what, (long long)differ);
}

typedef struct {
  int64_t M, N, K;
} Shape;

// One gemm_cuda case against gemm_cpu on the same inputs, C with row stride N + pad.
static void check_gemm(TestRng *rng, cublasHandle_t handle, bool ta, bool tb, Shape s, int64_t pad,
                       float alpha, float beta) {
  int64_t M = s.M, N = s.N, K = s.K;
  int64_t a_rows = ta ? K : M, a_cols = ta ? M : K;
  int64_t b_rows = tb ? N : K, b_cols = tb ? K : N;
  int64_t lda = a_cols + pad, ldb = b_cols + pad, ldc = N + pad;
  float *A = test_random_matrix(rng, a_rows, a_cols, lda);
  float *B = test_random_matrix(rng, b_rows, b_cols, ldb);
  float *C = test_alloc_floats(M * ldc), *want = test_alloc_floats(M * ldc);
  float *got = test_alloc_floats(M * ldc), *again = test_alloc_floats(M * ldc);
  for (int64_t i = 0; i < M * ldc; i++) C[i] = SENTINEL;
  for (int64_t i = 0; i < M; i++) {
    // beta == 0 must write C without reading it: NaN would survive any read, even times 0.
    if (beta == 0.0f)
      test_poison(C + i * ldc, N);
    else
      test_fill_uniform(rng, C + i * ldc, N, -1.0f, 1.0f);
  }
  memcpy(want, C, (size_t)(M * ldc) * sizeof(float));
  gemm_cpu(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, want, ldc);

  float *dA = gpu_upload(A, a_rows * lda), *dB = gpu_upload(B, b_rows * ldb);
  float *dC = gpu_upload(C, M * ldc);
  gemm_cuda(handle, ta, tb, M, N, K, alpha, dA, lda, dB, ldb, beta, dC, ldc);
  gpu_download(got, dC, M * ldc);
  CUDA_CHECK(cudaMemcpy(dC, C, (size_t)(M * ldc) * sizeof(float), cudaMemcpyHostToDevice));
  gemm_cuda(handle, ta, tb, M, N, K, alpha, dA, lda, dB, ldb, beta, dC, ldc);
  gpu_download(again, dC, M * ldc);

  // Compare the M x N values; the padding columns separately against the sentinel.
  float *got_v = test_alloc_floats(M * N), *want_v = test_alloc_floats(M * N);
  int64_t pad_changed = 0;
  for (int64_t i = 0; i < M; i++) {
    memcpy(got_v + i * N, got + i * ldc, (size_t)N * sizeof(float));
    memcpy(want_v + i * N, want + i * ldc, (size_t)N * sizeof(float));
    for (int64_t j = N; j < ldc; j++) pad_changed += got[i * ldc + j] != SENTINEL;
  }
  char what[128];
  snprintf(what, sizeof what, "gemm(%d,%d) %lldx%lldx%lld ld+%lld a=%g b=%g vs CPU", ta, tb,
           (long long)M, (long long)N, (long long)K, (long long)pad, alpha, beta);
  test_close(what, got_v, want_v, M * N, gemm_tol(K));
  if (pad > 0)
    test_check(pad_changed == 0, "%-48s %lld elements of C past column N changed", what,
               (long long)pad_changed);
  int64_t differ = count_differing(got, again, M * ldc);
  if (differ)  // one line per failure only: the shapes table is long
    test_check(0, "%-48s run twice: %lld elements differ", what, (long long)differ);

  CUDA_CHECK(cudaFree(dA));
  CUDA_CHECK(cudaFree(dB));
  CUDA_CHECK(cudaFree(dC));
  free(A);
  free(B);
  free(C);
  free(want);
  free(got);
  free(again);
  free(got_v);
  free(want_v);
}

static void test_gemm_shapes(TestRng *rng, cublasHandle_t handle) {
  // The CPU test's edge shapes (1x1x1, primes, thin, K near 1000), K = 1024, and Swin-T
  // stage-0 products at batch 1 (3136 tokens: qkv 96 -> 288, fc1 96 -> 384, fc2 384 -> 96).
  static const Shape shapes[] = {
      {1, 1, 1},        {37, 53, 19},    {7, 17, 257},    {1, 70, 5},
      {70, 1, 5},       {5, 3, 1000},    {45, 67, 999},   {150, 33, 520},
      {9, 2100, 5},     {301, 203, 97},  {13, 31, 1},     {40, 1000, 300},
      {256, 512, 1024}, {3136, 288, 96}, {3136, 384, 96}, {3136, 96, 384}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    for (int t = 0; t < 4; t++) {
      bool ta = t & 2, tb = t & 1;
      check_gemm(rng, handle, ta, tb, shapes[i], 0, 1.0f, 0.0f);
      check_gemm(rng, handle, ta, tb, shapes[i], 3 + (int64_t)i % 5, -0.7f, 0.5f);
    }
  }
  check_gemm(rng, handle, true, false, (Shape){48, 96, 777}, 16, 1.0f, 1.0f);  // accumulate
  check_gemm(rng, handle, false, true, (Shape){23, 41, 17}, 2, 0.0f, 0.25f);   // alpha = 0
}

// K = 0: C = beta C (zeros over the NaN for beta = 0); M = 0 or N = 0: C untouched.
static void test_gemm_empty(TestRng *rng, cublasHandle_t handle) {
  for (int t = 0; t < 4; t++) {
    bool ta = t & 2, tb = t & 1;
    check_gemm(rng, handle, ta, tb, (Shape){11, 29, 0}, 0, 1.0f, 0.0f);
    check_gemm(rng, handle, ta, tb, (Shape){11, 29, 0}, 4, 1.0f, 1.0f);
    check_gemm(rng, handle, ta, tb, (Shape){11, 29, 0}, 4, 2.0f, -0.5f);
  }
  float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, c = SENTINEL;
  float *da = gpu_upload(a, 4), *db = gpu_upload(b, 4), *dc = gpu_upload(&c, 1);
  gemm_cuda(handle, false, false, 0, 1, 4, 1.0f, da, 4, db, 1, 0.0f, dc, 1);
  gemm_cuda(handle, false, false, 1, 0, 4, 1.0f, da, 4, db, 1, 0.0f, dc, 1);
  gpu_download(&c, dc, 1);
  test_check(c == SENTINEL, "%-48s C[0] = %g", "gemm M = 0 and N = 0 leave C alone", c);
  CUDA_CHECK(cudaFree(da));
  CUDA_CHECK(cudaFree(db));
  CUDA_CHECK(cudaFree(dc));
}

// A handle someone left in TF32 mode: gemm_cuda must still compute in fp32 (TF32 would miss
// the tolerance by two orders of magnitude at this size).
static void test_gemm_tf32_handle(TestRng *rng, cublasHandle_t handle) {
  cublas_ok(cublasSetMathMode(handle, CUBLAS_TF32_TENSOR_OP_MATH), "cublasSetMathMode");
  printf("-- handle set to CUBLAS_TF32_TENSOR_OP_MATH before the call\n");
  check_gemm(rng, handle, false, true, (Shape){512, 384, 768}, 0, 1.0f, 0.0f);
  cublasMath_t mode;
  cublas_ok(cublasGetMathMode(handle, &mode), "cublasGetMathMode");
  test_check(mode == CUBLAS_DEFAULT_MATH, "gemm_cuda leaves the handle in CUBLAS_DEFAULT_MATH (%d)",
             (int)mode);
}

// ---------------------------------------------------------------------------------------------
// Linear layer

typedef struct {
  int64_t N;
  int IC, OC;
  float *inp, *weight, *bias, *dout;          // host: (N, IC), (OC, IC), (OC), (N, OC)
  float *d_inp, *d_weight, *d_bias, *d_dout;  // the same on the device
} Linear;

static Linear linear_new(TestRng *rng, int64_t N, int IC, int OC) {
  Linear l = {.N = N, .IC = IC, .OC = OC};
  l.inp = test_random_matrix(rng, N, IC, IC);
  l.weight = test_random_matrix(rng, OC, IC, IC);
  l.bias = test_random_matrix(rng, 1, OC, OC);
  l.dout = test_random_matrix(rng, N, OC, OC);
  l.d_inp = gpu_upload(l.inp, N * IC);
  l.d_weight = gpu_upload(l.weight, (int64_t)OC * IC);
  l.d_bias = gpu_upload(l.bias, OC);
  l.d_dout = gpu_upload(l.dout, N * OC);
  return l;
}

static void linear_free(Linear *l) {
  free(l->inp);
  free(l->weight);
  free(l->bias);
  free(l->dout);
  CUDA_CHECK(cudaFree(l->d_inp));
  CUDA_CHECK(cudaFree(l->d_weight));
  CUDA_CHECK(cudaFree(l->d_bias));
  CUDA_CHECK(cudaFree(l->d_dout));
}

static void test_linear_forward(TestRng *rng, cublasHandle_t handle, int64_t N, int IC, int OC) {
  Linear l = linear_new(rng, N, IC, OC);
  float *want = test_alloc_floats(N * OC), *got = test_alloc_floats(N * OC);
  float *again = test_alloc_floats(N * OC), *d_out = gpu_alloc(N * OC * sizeof(float));
  char what[128];
  for (int with_bias = 1; with_bias >= 0; with_bias--) {
    linear_forward_cpu(want, l.inp, l.weight, with_bias ? l.bias : NULL, N, IC, OC);
    gpu_poison(d_out, N * OC);
    linear_forward_cuda(handle, d_out, l.d_inp, l.d_weight, with_bias ? l.d_bias : NULL, N, IC, OC);
    gpu_download(got, d_out, N * OC);
    snprintf(what, sizeof what, "linear_forward out (%lld, %d<-%d)%s vs CPU", (long long)N, OC, IC,
             with_bias ? "" : " bias NULL");
    test_close(what, got, want, N * OC, gemm_tol(IC));
    gpu_poison(d_out, N * OC);
    linear_forward_cuda(handle, d_out, l.d_inp, l.d_weight, with_bias ? l.d_bias : NULL, N, IC, OC);
    gpu_download(again, d_out, N * OC);
    snprintf(what, sizeof what, "linear_forward (%lld, %d<-%d)%s run twice", (long long)N, OC, IC,
             with_bias ? "" : " bias NULL");
    check_same_bits(what, got, again, N * OC);
  }
  CUDA_CHECK(cudaFree(d_out));
  free(want);
  free(got);
  free(again);
  linear_free(&l);
}

// Gradients vs the CPU: dinp overwritten (poisoned first), dweight and dbias accumulated onto
// the same random initial values on both sides; the scratch starts poisoned (pass 1 must write
// every partial pass 2 reads). Then run-to-run bits, and the NULL dinp / dbias / dweight paths.
static void test_linear_backward(TestRng *rng, cublasHandle_t handle, int64_t N, int IC, int OC) {
  Linear l = linear_new(rng, N, IC, OC);
  int64_t n_inp = N * IC, n_w = (int64_t)OC * IC;
  float *dw0 = test_alloc_floats(n_w), *db0 = test_alloc_floats(OC);
  test_fill_uniform(rng, dw0, n_w, -1.0f, 1.0f);
  test_fill_uniform(rng, db0, OC, -1.0f, 1.0f);
  float *want_dinp = test_alloc_floats(n_inp), *want_dw = test_alloc_floats(n_w);
  float *want_db = test_alloc_floats(OC);
  memcpy(want_dw, dw0, (size_t)n_w * sizeof(float));
  memcpy(want_db, db0, (size_t)OC * sizeof(float));
  linear_backward_cpu(want_dinp, want_dw, want_db, l.dout, l.inp, l.weight, N, IC, OC);

  int64_t n_scratch = linear_backward_cuda_scratch(N, OC);
  float *d_scratch = gpu_alloc(n_scratch * sizeof(float));
  float *d_dinp = gpu_alloc(n_inp * sizeof(float)), *d_dw = gpu_alloc(n_w * sizeof(float));
  float *d_db = gpu_alloc(OC * sizeof(float));
  float *dinp[2] = {test_alloc_floats(n_inp), test_alloc_floats(n_inp)};
  float *dw[2] = {test_alloc_floats(n_w), test_alloc_floats(n_w)},
        *db[2] = {test_alloc_floats(OC), test_alloc_floats(OC)};
  for (int run = 0; run < 2; run++) {
    gpu_poison(d_dinp, n_inp);
    gpu_poison(d_scratch, n_scratch);
    CUDA_CHECK(cudaMemcpy(d_dw, dw0, n_w * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_db, db0, OC * sizeof(float), cudaMemcpyHostToDevice));
    linear_backward_cuda(handle, d_dinp, d_dw, d_db, l.d_dout, l.d_inp, l.d_weight, N, IC, OC,
                         d_scratch);
    gpu_download(dinp[run], d_dinp, n_inp);
    gpu_download(dw[run], d_dw, n_w);
    gpu_download(db[run], d_db, OC);
  }
  char shape[64], what[128];
  snprintf(shape, sizeof shape, "(%lld, %d<-%d)", (long long)N, OC, IC);
  snprintf(what, sizeof what, "linear_backward dinp %s", shape);
  test_close(what, dinp[0], want_dinp, n_inp, gemm_tol(OC));
  snprintf(what, sizeof what, "linear_backward dweight (accumulated) %s", shape);
  test_close(what, dw[0], want_dw, n_w, gemm_tol(N));
  snprintf(what, sizeof what, "linear_backward dbias (accumulated) %s", shape);
  test_close(what, db[0], want_db, OC, gemm_tol(N));
  int64_t differ = count_differing(dinp[0], dinp[1], n_inp) + count_differing(dw[0], dw[1], n_w) +
                   count_differing(db[0], db[1], OC);
  snprintf(what, sizeof what, "linear_backward %s run twice", shape);
  test_check(differ == 0, "%-48s %lld gradient elements differ", what, (long long)differ);

  // NULL dinp: the parameter gradients alone.
  CUDA_CHECK(cudaMemcpy(d_dw, dw0, n_w * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_db, db0, OC * sizeof(float), cudaMemcpyHostToDevice));
  linear_backward_cuda(handle, NULL, d_dw, d_db, l.d_dout, l.d_inp, l.d_weight, N, IC, OC,
                       d_scratch);
  gpu_download(dw[1], d_dw, n_w);
  gpu_download(db[1], d_db, OC);
  snprintf(what, sizeof what, "linear_backward dinp NULL: same dweight, dbias %s", shape);
  differ = count_differing(dw[0], dw[1], n_w) + count_differing(db[0], db[1], OC);
  test_check(differ == 0, "%-48s %lld elements differ", what, (long long)differ);

  // NULL dbias (no scratch needed) and NULL dweight (a CUDA-only allowance).
  gpu_poison(d_dinp, n_inp);
  CUDA_CHECK(cudaMemcpy(d_dw, dw0, n_w * sizeof(float), cudaMemcpyHostToDevice));
  linear_backward_cuda(handle, d_dinp, d_dw, NULL, l.d_dout, l.d_inp, l.d_weight, N, IC, OC, NULL);
  gpu_download(dinp[1], d_dinp, n_inp);
  gpu_download(dw[1], d_dw, n_w);
  snprintf(what, sizeof what, "linear_backward dbias NULL: same dinp, dweight %s", shape);
  differ = count_differing(dinp[0], dinp[1], n_inp) + count_differing(dw[0], dw[1], n_w);
  test_check(differ == 0, "%-48s %lld elements differ", what, (long long)differ);
  gpu_poison(d_dinp, n_inp);
  CUDA_CHECK(cudaMemcpy(d_db, db0, OC * sizeof(float), cudaMemcpyHostToDevice));
  linear_backward_cuda(handle, d_dinp, NULL, d_db, l.d_dout, l.d_inp, l.d_weight, N, IC, OC,
                       d_scratch);
  gpu_download(dinp[1], d_dinp, n_inp);
  gpu_download(db[1], d_db, OC);
  snprintf(what, sizeof what, "linear_backward dweight NULL: same dinp, dbias %s", shape);
  differ = count_differing(dinp[0], dinp[1], n_inp) + count_differing(db[0], db[1], OC);
  test_check(differ == 0, "%-48s %lld elements differ", what, (long long)differ);

  CUDA_CHECK(cudaFree(d_scratch));
  CUDA_CHECK(cudaFree(d_dinp));
  CUDA_CHECK(cudaFree(d_dw));
  CUDA_CHECK(cudaFree(d_db));
  for (int run = 0; run < 2; run++) {
    free(dinp[run]);
    free(dw[run]);
    free(db[run]);
  }
  free(dw0);
  free(db0);
  free(want_dinp);
  free(want_dw);
  free(want_db);
  linear_free(&l);
}
#endif

int main(void) {
  GPU_TEST_MAIN_BEGIN();
#ifdef SWIN_HAVE_CUDA
  TestRng rng = {0x5eed6e34ull};
  cublasHandle_t handle;
  cudaStream_t stream;
  cublas_ok(cublasCreate(&handle), "cublasCreate");
  CUDA_CHECK(cudaStreamCreate(&stream));
  cublas_ok(cublasSetStream(handle, stream), "cublasSetStream");

  test_gemm_shapes(&rng, handle);
  test_gemm_empty(&rng, handle);
  test_gemm_tf32_handle(&rng, handle);
  test_linear_forward(&rng, handle, 97, 37, 53);
  test_linear_forward(&rng, handle, 1000, 64, 192);
  test_linear_forward(&rng, handle, 6272, 96, 288);  // Swin-T qkv at batch 2
  test_linear_forward(&rng, handle, 7, 0, 5);        // no input features: out = bias
  test_linear_backward(&rng, handle, 97, 37, 53);
  test_linear_backward(&rng, handle, 1, 5, 3);
  test_linear_backward(&rng, handle, 5000, 48, 80);
  test_linear_backward(&rng, handle, 2000, 512, 8);
  test_linear_backward(&rng, handle, 7, 0, 5);  // no input features: dbias still gets the sums
  // Column sums with many row chunks, a partial last chunk and empty trailing ones (Swin-T
  // stage 0 at batch 8: 25088 rows, 341 chunks of 74), and with OC > 32 column groups (head).
  test_linear_backward(&rng, handle, 25088, 16, 96);
  test_linear_backward(&rng, handle, 4096, 64, 1000);
  test_linear_backward(&rng, handle, 6272, 384, 96);  // Swin-T fc2 at batch 2

  CUDA_CHECK(cudaStreamDestroy(stream));
  cublas_ok(cublasDestroy(handle), "cublasDestroy");
  return test_finish();
#endif
}
