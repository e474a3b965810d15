// test_gemm.c: gemm_cpu and the linear layer against double-precision references, on fresh random
// inputs: all four transpose cases, edge shapes (1x1x1, primes, K = 0, sizes that cross the
// kernel's tile and cache-block boundaries), leading dimensions wider than the rows, alpha and
// beta other than 1 and 0, results independent of the thread count, and a finite-difference
// check of the linear layer's gradients; column_sums_cpu (the bias gradients the CPU backend
// takes from a produced gradient) against the plain loop it must equal bit for bit.
//
// Tolerance: every output element is a dot product of K terms accumulated in fp32, whose
// rounding error grows like sqrt(K) * eps (eps = 6e-8), about 2e-6 at K = 1000. The kernel
// accumulates K in blocks of 256 and then adds the blocks, which keeps long sums (the weight
// gradient sums over all rows) in the same range. 1e-5 leaves a margin of 5 over that and still
// catches any wrong element: one element off by 1% in a 1000-element output already gives 3e-4.
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/gemm.h"
#include "tests/util/test_util.h"

#define GEMM_TOL 1e-5
// Written into the columns of C past N (ldc > N): the kernel must leave them alone.
#define SENTINEL 12345.0f

// A (rows, cols) matrix stored with row stride ld >= cols: the padding is NaN, so a kernel that
// reads past a row poisons its result.
// ref (M, N) = alpha op(A) op(B) + beta C0 in double; C0 (M, ldc) is read only when beta != 0.
static void ref_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                     int64_t lda, const float *B, int64_t ldb, float beta, const float *C0,
                     int64_t ldc, float *ref) {
  for (int64_t i = 0; i < M; i++) {
    for (int64_t j = 0; j < N; j++) {
      double s = 0;
      for (int64_t k = 0; k < K; k++) {
        double a = ta ? A[k * lda + i] : A[i * lda + k];
        double b = tb ? B[j * ldb + k] : B[k * ldb + j];
        s += a * b;
      }
      double v = alpha * s;
      if (beta != 0.0f) v += (double)beta * C0[i * ldc + j];
      ref[i * N + j] = (float)v;
    }
  }
}

typedef struct {
  int64_t M, N, K;
} Shape;

// Runs one gemm_cpu case with leading dimensions `pad` wider than the rows and checks C's
// values against the reference and its padding columns against the sentinel.
static void check_gemm(TestRng *rng, bool ta, bool tb, Shape s, int64_t pad, float alpha,
                       float beta) {
  int64_t M = s.M, N = s.N, K = s.K;
  int64_t a_rows = ta ? K : M, a_cols = ta ? M : K;
  int64_t b_rows = tb ? N : K, b_cols = tb ? K : N;
  int64_t lda = a_cols + pad, ldb = b_cols + pad, ldc = N + pad;
  float *A = test_random_matrix(rng, a_rows, a_cols, lda);
  float *B = test_random_matrix(rng, b_rows, b_cols, ldb);
  float *C = test_alloc_floats(M * ldc), *C0 = test_alloc_floats(M * ldc);
  float *got = test_alloc_floats(M * N), *ref = test_alloc_floats(M * N);
  for (int64_t i = 0; i < M * ldc; i++) C[i] = SENTINEL;
  for (int64_t i = 0; i < M; i++) {
    // beta == 0 must write C without reading it: C starts as NaN, which any read (even one
    // multiplied by 0) would carry into the result.
    if (beta == 0.0f)
      test_poison(C + i * ldc, N);
    else
      test_fill_uniform(rng, C + i * ldc, N, -1.0f, 1.0f);
  }
  memcpy(C0, C, (size_t)(M * ldc) * sizeof(float));
  ref_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C0, ldc, ref);

  gemm_cpu(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);

  int64_t pad_changed = 0;
  for (int64_t i = 0; i < M; i++) {
    memcpy(got + i * N, C + i * ldc, (size_t)N * sizeof(float));
    for (int64_t j = N; j < ldc; j++) pad_changed += C[i * ldc + j] != SENTINEL;
  }
  char what[128];
  snprintf(what, sizeof what, "gemm(%d,%d) C %lldx%lldx%lld ld+%lld a=%g b=%g", ta, tb,
           (long long)M, (long long)N, (long long)K, (long long)pad, alpha, beta);
  test_close(what, got, ref, M * N, GEMM_TOL);
  if (pad > 0)
    test_check(pad_changed == 0, "%-48s %lld elements of C past column N changed", what,
               (long long)pad_changed);
  free(A);
  free(B);
  free(C);
  free(C0);
  free(got);
  free(ref);
}

static void test_gemm_shapes(TestRng *rng) {
  // 1x1x1 and thin shapes; primes that leave partial 6x16 tiles; shapes crossing the M block
  // (144 rows), the K block (256) and the N block (2048); K near 1000; and products large
  // enough to be split among threads (>= 4 MFLOP per thread), by rows and (the last) by columns.
  static const Shape shapes[] = {{1, 1, 1},      {37, 53, 19}, {6, 16, 256},   {7, 17, 257},
                                 {1, 70, 5},     {70, 1, 5},   {5, 3, 1000},   {45, 67, 999},
                                 {150, 33, 520}, {9, 2100, 5}, {400, 20, 30},  {301, 203, 97},
                                 {64, 96, 300},  {13, 31, 1},  {40, 1000, 300}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    for (int t = 0; t < 4; t++) {
      bool ta = t & 2, tb = t & 1;
      check_gemm(rng, ta, tb, shapes[i], 0, 1.0f, 0.0f);
      check_gemm(rng, ta, tb, shapes[i], 3 + (int64_t)i % 5, -0.7f, 0.5f);
    }
  }
  // beta = 1 accumulates, as the weight gradient does, with a wide C.
  check_gemm(rng, true, false, (Shape){48, 96, 777}, 16, 1.0f, 1.0f);
  // alpha = 0: C = beta C without touching A and B.
  check_gemm(rng, false, true, (Shape){23, 41, 17}, 2, 0.0f, 0.25f);
}

// K = 0 is a sum of no terms: C = beta C, with beta = 0 writing zeros over the NaN.
static void test_gemm_k0(TestRng *rng) {
  for (int t = 0; t < 4; t++) {
    bool ta = t & 2, tb = t & 1;
    check_gemm(rng, ta, tb, (Shape){11, 29, 0}, 0, 1.0f, 0.0f);
    check_gemm(rng, ta, tb, (Shape){11, 29, 0}, 4, 1.0f, 1.0f);
    check_gemm(rng, ta, tb, (Shape){11, 29, 0}, 4, 2.0f, -0.5f);
  }
  // M = 0 or N = 0: nothing to write; C must not be touched.
  float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, c[1] = {SENTINEL};
  gemm_cpu(false, false, 0, 1, 4, 1.0f, a, 4, b, 1, 0.0f, c, 1);
  gemm_cpu(false, false, 1, 0, 4, 1.0f, a, 4, b, 1, 0.0f, c, 1);
  test_check(c[0] == SENTINEL, "%-48s C[0] = %g", "gemm M = 0 and N = 0 leave C alone", c[0]);
}

// The kernel promises the same bits whatever the thread count: every element of C is summed
// in one order by one thread. The two shapes make the threads split M (tall C) and N (wide C).
static void test_gemm_threads(TestRng *rng) {
#ifdef _OPENMP
  static const Shape shapes[] = {{517, 211, 300}, {40, 1000, 300}};
  int saved = omp_get_max_threads();
  for (int s = 0; s < 2; s++) {
    int64_t M = shapes[s].M, N = shapes[s].N, K = shapes[s].K;
    float *A = test_random_matrix(rng, M, K, K), *B = test_random_matrix(rng, N, K, K);
    float *C1 = test_alloc_floats(M * N), *Cn = test_alloc_floats(M * N);
    omp_set_num_threads(1);
    gemm_cpu(false, true, M, N, K, 1.0f, A, K, B, K, 0.0f, C1, N);
    for (int threads = 2; threads <= 4; threads++) {
      omp_set_num_threads(threads);
      test_poison(Cn, M * N);
      gemm_cpu(false, true, M, N, K, 1.0f, A, K, B, K, 0.0f, Cn, N);
      int64_t differ = 0;
      for (int64_t i = 0; i < M * N; i++) differ += memcmp(&C1[i], &Cn[i], sizeof(float)) != 0;
      char what[96];
      snprintf(what, sizeof what, "gemm %lldx%lldx%lld on %d threads bitwise = 1 thread",
               (long long)M, (long long)N, (long long)K, threads);
      test_check(differ == 0, "%-48s %lld elements of C differ", what, (long long)differ);
    }
    free(A);
    free(B);
    free(C1);
    free(Cn);
  }
  omp_set_num_threads(saved);
#else
  (void)rng;
  test_check(1, "%-48s", "gemm thread-count independence (no OpenMP: skipped)");
#endif
}

// ---------------------------------------------------------------------------------------------
// Linear layer

typedef struct {
  int64_t N;
  int IC, OC;
  float *inp, *weight, *bias, *dout;  // (N, IC), (OC, IC), (OC), (N, OC)
} Linear;

static Linear linear_new(TestRng *rng, int64_t N, int IC, int OC) {
  Linear l = {N, IC, OC, NULL, NULL, NULL, NULL};
  l.inp = test_random_matrix(rng, N, IC, IC);
  l.weight = test_random_matrix(rng, OC, IC, IC);
  l.bias = test_random_matrix(rng, 1, OC, OC);
  l.dout = test_random_matrix(rng, N, OC, OC);
  return l;
}

static void linear_free(Linear *l) {
  free(l->inp);
  free(l->weight);
  free(l->bias);
  free(l->dout);
}

static void test_linear_forward(TestRng *rng, int64_t N, int IC, int OC) {
  Linear l = linear_new(rng, N, IC, OC);
  float *out = test_alloc_floats(N * OC), *ref = test_alloc_floats(N * OC);
  char what[128];
  for (int with_bias = 1; with_bias >= 0; with_bias--) {
    for (int64_t n = 0; n < N; n++) {
      for (int o = 0; o < OC; o++) {
        double s = with_bias ? l.bias[o] : 0.0;
        for (int i = 0; i < IC; i++) s += (double)l.inp[n * IC + i] * l.weight[o * IC + i];
        ref[n * OC + o] = (float)s;
      }
    }
    test_poison(out, N * OC);
    linear_forward_cpu(out, l.inp, l.weight, with_bias ? l.bias : NULL, N, IC, OC);
    snprintf(what, sizeof what, "linear_forward out (%lld, %d<-%d)%s", (long long)N, OC, IC,
             with_bias ? "" : " bias NULL");
    test_close(what, out, ref, N * OC, GEMM_TOL);
  }
  free(out);
  free(ref);
  linear_free(&l);
}

// Gradients against double references: dinp overwritten (poisoned first), dweight and dbias
// accumulated onto random initial values; then the NULL dinp and NULL dbias paths.
static void test_linear_backward(TestRng *rng, int64_t N, int IC, int OC) {
  Linear l = linear_new(rng, N, IC, OC);
  float *dinp = test_alloc_floats(N * IC), *dinp_ref = test_alloc_floats(N * IC);
  float *dw = test_alloc_floats((int64_t)OC * IC), *dw0 = test_alloc_floats((int64_t)OC * IC);
  float *dw_ref = test_alloc_floats((int64_t)OC * IC);
  float *db = test_alloc_floats(OC), *db0 = test_alloc_floats(OC), *db_ref = test_alloc_floats(OC);
  test_fill_uniform(rng, dw0, (int64_t)OC * IC, -1.0f, 1.0f);
  test_fill_uniform(rng, db0, OC, -1.0f, 1.0f);
  for (int64_t n = 0; n < N; n++) {
    for (int i = 0; i < IC; i++) {
      double s = 0;
      for (int o = 0; o < OC; o++) s += (double)l.dout[n * OC + o] * l.weight[o * IC + i];
      dinp_ref[n * IC + i] = (float)s;
    }
  }
  for (int o = 0; o < OC; o++) {
    double sb = db0[o];
    for (int64_t n = 0; n < N; n++) sb += l.dout[n * OC + o];
    db_ref[o] = (float)sb;
    for (int i = 0; i < IC; i++) {
      double s = dw0[o * IC + i];
      for (int64_t n = 0; n < N; n++) s += (double)l.dout[n * OC + o] * l.inp[n * IC + i];
      dw_ref[o * IC + i] = (float)s;
    }
  }
  char shape[64], what[128];
  snprintf(shape, sizeof shape, "(%lld, %d<-%d)", (long long)N, OC, IC);

  test_poison(dinp, N * IC);
  memcpy(dw, dw0, (size_t)OC * IC * sizeof(float));
  memcpy(db, db0, (size_t)OC * sizeof(float));
  linear_backward_cpu(dinp, dw, db, l.dout, l.inp, l.weight, N, IC, OC);
  snprintf(what, sizeof what, "linear_backward dinp %s", shape);
  test_close(what, dinp, dinp_ref, N * IC, GEMM_TOL);
  snprintf(what, sizeof what, "linear_backward dweight (accumulated) %s", shape);
  test_close(what, dw, dw_ref, (int64_t)OC * IC, GEMM_TOL);
  snprintf(what, sizeof what, "linear_backward dbias (accumulated) %s", shape);
  test_close(what, db, db_ref, OC, GEMM_TOL);

  // NULL dinp: the parameter gradients alone (the first layer has no input gradient).
  memcpy(dw, dw0, (size_t)OC * IC * sizeof(float));
  memcpy(db, db0, (size_t)OC * sizeof(float));
  linear_backward_cpu(NULL, dw, db, l.dout, l.inp, l.weight, N, IC, OC);
  snprintf(what, sizeof what, "linear_backward dinp NULL: dweight %s", shape);
  test_close(what, dw, dw_ref, (int64_t)OC * IC, GEMM_TOL);
  snprintf(what, sizeof what, "linear_backward dinp NULL: dbias %s", shape);
  test_close(what, db, db_ref, OC, GEMM_TOL);

  // NULL dbias: a layer without bias.
  test_poison(dinp, N * IC);
  memcpy(dw, dw0, (size_t)OC * IC * sizeof(float));
  linear_backward_cpu(dinp, dw, NULL, l.dout, l.inp, l.weight, N, IC, OC);
  snprintf(what, sizeof what, "linear_backward dbias NULL: dinp %s", shape);
  test_close(what, dinp, dinp_ref, N * IC, GEMM_TOL);
  snprintf(what, sizeof what, "linear_backward dbias NULL: dweight %s", shape);
  test_close(what, dw, dw_ref, (int64_t)OC * IC, GEMM_TOL);

  free(dinp);
  free(dinp_ref);
  free(dw);
  free(dw0);
  free(dw_ref);
  free(db);
  free(db0);
  free(db_ref);
  linear_free(&l);
}

// The linear layer's gradients are also the same bits on any number of threads, dbias included.
static void test_linear_threads(TestRng *rng) {
#ifdef _OPENMP
  static const int shapes[][3] = {{3000, 64, 256}, {2000, 512, 8}};  // rows, IC, OC
  int saved = omp_get_max_threads();
  for (int s = 0; s < 2; s++) {
    int64_t N = shapes[s][0];
    int IC = shapes[s][1], OC = shapes[s][2];
    Linear l = linear_new(rng, N, IC, OC);
    float *dw[2], *db[2], *dinp[2];
    for (int v = 0; v < 2; v++) {
      dw[v] = test_alloc_floats((int64_t)OC * IC);
      db[v] = test_alloc_floats(OC);
      dinp[v] = test_alloc_floats(N * IC);
    }
    for (int threads = 2; threads <= 4; threads++) {
      for (int v = 0; v < 2; v++) {
        omp_set_num_threads(v == 0 ? 1 : threads);
        memset(dw[v], 0, (size_t)OC * IC * sizeof(float));
        memset(db[v], 0, (size_t)OC * sizeof(float));
        test_poison(dinp[v], N * IC);
        linear_backward_cpu(dinp[v], dw[v], db[v], l.dout, l.inp, l.weight, N, IC, OC);
      }
      int64_t differ = 0;
      for (int64_t i = 0; i < (int64_t)OC * IC; i++) differ += memcmp(&dw[0][i], &dw[1][i], 4) != 0;
      for (int64_t i = 0; i < OC; i++) differ += memcmp(&db[0][i], &db[1][i], 4) != 0;
      for (int64_t i = 0; i < N * IC; i++) differ += memcmp(&dinp[0][i], &dinp[1][i], 4) != 0;
      char what[96];
      snprintf(what, sizeof what, "linear_backward (%lld, %d<-%d) %d threads bitwise", (long long)N,
               OC, IC, threads);
      test_check(differ == 0, "%-48s %lld gradient elements differ from 1 thread", what,
                 (long long)differ);
    }
    for (int v = 0; v < 2; v++) {
      free(dw[v]);
      free(db[v]);
      free(dinp[v]);
    }
    linear_free(&l);
  }
  omp_set_num_threads(saved);
#else
  (void)rng;
  test_check(1, "%-48s", "linear thread-count independence (no OpenMP: skipped)");
#endif
}

// ---------------------------------------------------------------------------------------------
// Finite differences: loss L = sum(out * R) with out from linear_forward_cpu, R random, so the
// backward pass with dout = R must give dL/dinp, dL/dweight, dL/dbias. For a random direction V
// the central difference (L(x + hV) - L(x - hV)) / 2h is compared with <grad, V>.
//
// L is linear in each of inp, weight and bias, so the central difference has no truncation
// error at any h, and h = 1 makes the forward pass's fp32 rounding (about sqrt(IC) eps relative
// per output) as small as it can be relative to the change. The error is measured against the
// Cauchy-Schwarz scale ||grad|| ||V||, where a relative gradient error d shows as at most d; the
// remaining noise is fp32 rounding, ~1e-6, so the tolerance is 1e-5. A gradient wrong by 1%
// shows as about 1e-2 / sqrt(number of elements), 3e-4 here.

static double linear_loss(const Linear *l, const float *inp, const float *weight, const float *bias,
                          const float *R, float *out) {
  linear_forward_cpu(out, inp, weight, bias, l->N, l->IC, l->OC);
  double loss = 0;
  for (int64_t i = 0; i < l->N * l->OC; i++) loss += (double)out[i] * R[i];
  return loss;
}

// Which argument of the layer the difference is taken along.
typedef enum { ARG_INP, ARG_WEIGHT, ARG_BIAS } LinearArg;

static void check_fd(TestRng *rng, const Linear *l, LinearArg arg, const float *grad, float *out) {
  static const char *names[] = {"inp", "weight", "bias"};
  int64_t n = arg == ARG_INP ? l->N * l->IC : arg == ARG_WEIGHT ? (int64_t)l->OC * l->IC : l->OC;
  float *x = arg == ARG_INP ? l->inp : arg == ARG_WEIGHT ? l->weight : l->bias;
  float *saved = test_alloc_floats(n), *v = test_alloc_floats(n);
  memcpy(saved, x, (size_t)n * sizeof(float));
  test_fill_uniform(rng, v, n, -1.0f, 1.0f);
  const float h = 1.0f;
  double loss[2];
  for (int side = 0; side < 2; side++) {
    float sign = side == 0 ? 1.0f : -1.0f;
    for (int64_t i = 0; i < n; i++) x[i] = saved[i] + sign * h * v[i];
    loss[side] = linear_loss(l, l->inp, l->weight, l->bias, l->dout, out);
  }
  memcpy(x, saved, (size_t)n * sizeof(float));
  double fd = (loss[0] - loss[1]) / (2.0 * h);
  double dot = 0, g2 = 0, v2 = 0;
  for (int64_t i = 0; i < n; i++) {
    dot += (double)grad[i] * v[i];
    g2 += (double)grad[i] * grad[i];
    v2 += (double)v[i] * v[i];
  }
  double err = fabs(fd - dot) / (sqrt(g2) * sqrt(v2));
  char what[64];
  snprintf(what, sizeof what, "linear finite difference d%s", names[arg]);
  test_check(err <= 1e-5, "%-48s fd %.6e grad.V %.6e err %.2e (tol 1e-5)", what, fd, dot, err);
  free(saved);
  free(v);
}

static void test_linear_fd(TestRng *rng, int64_t N, int IC, int OC) {
  Linear l = linear_new(rng, N, IC, OC);  // l.dout plays R, the loss weights
  float *out = test_alloc_floats(N * OC);
  float *dinp = test_alloc_floats(N * IC), *dw = test_alloc_floats((int64_t)OC * IC);
  float *db = test_alloc_floats(OC);
  test_poison(dinp, N * IC);
  memset(dw, 0, (size_t)OC * IC * sizeof(float));  // accumulated gradients start from zero
  memset(db, 0, (size_t)OC * sizeof(float));
  linear_backward_cpu(dinp, dw, db, l.dout, l.inp, l.weight, N, IC, OC);
  check_fd(rng, &l, ARG_INP, dinp, out);
  check_fd(rng, &l, ARG_WEIGHT, dw, out);
  check_fd(rng, &l, ARG_BIAS, db, out);
  free(out);
  free(dinp);
  free(dw);
  free(db);
  linear_free(&l);
}

// column_sums_cpu adds each column's rows in order in double, then once in fp32 onto sums: the
// plain loop below, bit for bit, for widths across its 64-column groups and no rows at all.
static void test_column_sums(TestRng *rng, int64_t rows, int cols) {
  float *x = test_alloc_floats(rows * cols), *sums = test_alloc_floats(cols);
  float *want = test_alloc_floats(cols);
  test_fill_uniform(rng, x, rows * cols, -1.0f, 1.0f);
  test_fill_uniform(rng, sums, cols, -1.0f, 1.0f);
  for (int c = 0; c < cols; c++) {
    double s = 0;
    for (int64_t r = 0; r < rows; r++) s += x[r * cols + c];
    want[c] = sums[c] + (float)s;
  }
  column_sums_cpu(sums, x, rows, cols);
  test_check(memcmp(sums, want, sizeof(float) * (size_t)cols) == 0,
             "column_sums_cpu (%lld, %d): accumulated, bitwise the in-order double sums",
             (long long)rows, cols);
  free(x);
  free(sums);
  free(want);
}

int main(void) {
  TestRng rng = {0x5eed6e33ull};
  test_column_sums(&rng, 1000, 130);
  test_column_sums(&rng, 3, 64);
  test_column_sums(&rng, 0, 7);
  test_gemm_shapes(&rng);
  test_gemm_k0(&rng);
  test_gemm_threads(&rng);
  test_linear_forward(&rng, 97, 37, 53);
  test_linear_forward(&rng, 1000, 64, 192);
  test_linear_backward(&rng, 97, 37, 53);
  test_linear_backward(&rng, 1, 5, 3);
  // Many rows: the weight and bias gradients sum 5000 terms, with the threads splitting the
  // output features (dbias is summed while dout is packed, by the threads that own them).
  test_linear_backward(&rng, 5000, 48, 80);
  // Few output features, wide input: the threads split the input features instead, and only
  // one of them may add to dbias.
  test_linear_backward(&rng, 2000, 512, 8);
  test_linear_backward(&rng, 7, 0, 5);  // no input features: dbias still gets dout's sums
  test_linear_threads(&rng);
  test_linear_fd(&rng, 64, 37, 29);
  return test_finish();
}
