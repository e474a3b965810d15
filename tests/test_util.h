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
  if (ok) test_stats.passed++;
  else test_stats.failed++;
  fflush(stdout);
  return ok;
}

// Checks rel_err(got, want) <= tol and names the tensor in the message.
static inline int test_close(const char *what, const float *got, const float *want, int64_t n,
                             double tol) {
  double e = test_rel_err(got, want, n);
  return test_check(e <= tol, "%-48s rel_err %.3e (tol %.1e)", what, e, tol);
}

static inline int test_finish(void) {
  printf("%d passed, %d failed\n", test_stats.passed, test_stats.failed);
  return test_stats.failed ? 1 : 0;
}
