// test_util.h: what every test shares. Random inputs (never zeros), relative errors, poisoned
// outputs, a failure counter, and a finite-difference gradient check.
//
// A test program prints one line per check and ends with "N passed, N failed"; its exit code is
// 0 only when nothing failed (77 means skipped, for ctest's SKIP_RETURN_CODE).
#pragma once
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  int passed, failed;
} TestStats;

static TestStats test_stats;

// Writes n bytes to path, or ends the test program (exit 2: the test could not set itself up).
static inline void test_write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) {
    fprintf(stderr, "cannot write test file %s\n", path);
    exit(2);
  }
}

// One member of a ustar archive (type '0' a file, 'L' a GNU long name for the next member):
// header with the first 99 bytes of name, data, padding to 512 bytes; ends the test program
// (exit 2) when it cannot write.
static inline void test_tar_member(FILE *f, const char *name, char type, const void *data,
                                   size_t size) {
  unsigned char h[512] = {0};
  snprintf((char *)h, 100, "%s", name);
  memcpy(h + 100, "0000644", 8);
  memcpy(h + 108, "0000000", 8);
  memcpy(h + 116, "0000000", 8);
  snprintf((char *)h + 124, 12, "%011o", (unsigned)size);
  memcpy(h + 136, "00000000000", 12);
  h[156] = (unsigned char)type;
  memcpy(h + 257, "ustar", 6);
  memcpy(h + 263, "00", 2);
  memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (int i = 0; i < 512; i++) sum += h[i];
  snprintf((char *)h + 148, 8, "%06o", sum);
  static const unsigned char zeros[512];
  if (fwrite(h, 1, 512, f) != 512 || fwrite(data, 1, size, f) != size ||
      (size % 512 && fwrite(zeros, 1, 512 - size % 512, f) != 512 - size % 512)) {
    fprintf(stderr, "cannot write a tar member (%s)\n", name);
    exit(2);
  }
}

// splitmix64: a small, seedable generator for test inputs.
typedef struct {
  uint64_t state;
} TestRng;

static inline uint64_t test_rng_u64(TestRng *r) {
  uint64_t z = (r->state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
// Uniform in [lo, hi).
static inline float test_rng_uniform(TestRng *r, float lo, float hi) {
  return lo + (hi - lo) * (float)((test_rng_u64(r) >> 40) * (1.0 / 16777216.0));
}
static inline void test_fill_uniform(TestRng *r, float *x, int64_t n, float lo, float hi) {
  for (int64_t i = 0; i < n; i++) x[i] = test_rng_uniform(r, lo, hi);
}
// Poison: NaN, so that an element a kernel forgets to write fails every comparison.
static inline void test_poison(float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) x[i] = NAN;
}

// n floats (at least one), or exit: a test that cannot get memory has nothing to report.
static inline float *test_alloc_floats(int64_t n) {
  float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
  if (!p) {
    fprintf(stderr, "test: out of memory for %lld floats\n", (long long)n);
    exit(1);
  }
  return p;
}
// A (rows, cols) matrix with row stride ld: uniform in [-1, 1), its padding columns NaN so that a
// kernel reading past a row fails.
static inline float *test_random_matrix(TestRng *r, int64_t rows, int64_t cols, int64_t ld) {
  float *m = test_alloc_floats(rows * ld);
  test_poison(m, rows * ld);
  for (int64_t i = 0; i < rows; i++) test_fill_uniform(r, m + i * ld, cols, -1.0f, 1.0f);
  return m;
}

// ||a - b|| / ||b|| in double; NaN anywhere gives +inf.
static inline double test_rel_err(const float *a, const float *b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    if (!isfinite(a[i]) || !isfinite(b[i])) return INFINITY;
    double d = (double)a[i] - (double)b[i];
    num += d * d;
    den += (double)b[i] * (double)b[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}
static inline double test_rel_err_d(const double *a, const double *b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    if (!isfinite(a[i]) || !isfinite(b[i])) return INFINITY;
    double d = a[i] - b[i];
    num += d * d;
    den += b[i] * b[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

// Records one check: prints "ok" or "FAIL" with the name and the measured error.
static inline int test_check(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline int test_check(int ok, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("%s ", ok ? "ok  " : "FAIL");
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  if (ok)
    test_stats.passed++;
  else
    test_stats.failed++;
  fflush(stdout);
  return ok;
}

// Checks rel_err(got, want) <= tol and names the tensor in the message.
static inline int test_close(const char *what, const float *got, const float *want, int64_t n,
                             double tol) {
  double e = test_rel_err(got, want, n);
  return test_check(e <= tol, "%-48s rel_err %.3e (tol %.1e)", what, e, tol);
}

// ---- finite differences -------------------------------------------------------------------
// A scalar objective L(x) in double, evaluated on the current contents of the input it is
// differentiated against; ctx is the test's case.
typedef double (*TestObjective)(void *ctx);

// Error of <grad, xp - xm> against L(xp) - L(xm), with xp, xm = x +- h V for a random
// direction V. The analytic side uses the perturbation actually stored in fp32, so the
// rounding of x + hV does not count as error. The error is relative to the larger of
// |<grad, dx>| and ||grad * dx||_2, the typical size of a random-sign sum of those terms: the
// inner product alone can cancel by chance, and a wrong gradient still shows up in full
// (a gradient error e gives ~||e * dx||). x (n) and grad (n); x is restored.
static inline double test_fd_directional(TestObjective f, void *ctx, float *x, const float *grad,
                                         int64_t n, float h, TestRng *rng) {
  float *x0 = malloc(n * sizeof(float)), *xp = malloc(n * sizeof(float));
  float *xm = malloc(n * sizeof(float));
  memcpy(x0, x, n * sizeof(float));
  for (int64_t i = 0; i < n; i++) {
    float v = test_rng_uniform(rng, -1.0f, 1.0f);
    xp[i] = x0[i] + h * v;
    xm[i] = x0[i] - h * v;
  }
  memcpy(x, xp, n * sizeof(float));
  double lp = f(ctx);
  memcpy(x, xm, n * sizeof(float));
  double lm = f(ctx);
  memcpy(x, x0, n * sizeof(float));
  double analytic = 0.0, spread = 0.0;
  for (int64_t i = 0; i < n; i++) {
    double term = (double)grad[i] * ((double)xp[i] - (double)xm[i]);
    analytic += term;
    spread += term * term;
  }
  free(x0);
  free(xp);
  free(xm);
  return fabs((lp - lm) - analytic) / fmax(fmax(fabs(analytic), sqrt(spread)), 1e-30);
}

// Largest error over `count` random single elements of x (n), each central difference
// measured against grad (n) relative to the gradient's RMS (a single element may be near zero,
// where a relative error means nothing). NaN anywhere is returned as NaN. x is restored.
static inline double test_fd_elements(TestObjective f, void *ctx, float *x, const float *grad,
                                      int64_t n, float h, int count, TestRng *rng) {
  double rms = 0.0;
  for (int64_t i = 0; i < n; i++) rms += (double)grad[i] * grad[i];
  rms = sqrt(rms / n);
  double worst = 0.0;
  for (int t = 0; t < count; t++) {
    int64_t i = (int64_t)(test_rng_u64(rng) % (uint64_t)n);
    float x0 = x[i];
    x[i] = x0 + h;
    float xp = x[i];
    double lp = f(ctx);
    x[i] = x0 - h;
    float xm = x[i];
    double lm = f(ctx);
    x[i] = x0;
    double numeric = (lp - lm) / ((double)xp - (double)xm);
    double err = fabs(numeric - grad[i]) / fmax(fabs(grad[i]), rms);
    if (!(err <= worst)) worst = err;  // keeps NaN
  }
  return worst;
}

static inline int test_finish(void) {
  printf("%d passed, %d failed\n", test_stats.passed, test_stats.failed);
  return test_stats.failed ? 1 : 0;
}
