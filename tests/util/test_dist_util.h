// test_dist_util.h: helpers of the tests that run as a job (test_dist, test_gpu_nccl): checks
// every rank agrees on, and per-rank random data.
#pragma once
#include <stdarg.h>
#include <stdio.h>

#include "dist/comm.h"
#include "tests/util/test_util.h"

static inline void must(Comm *c, int rc, const Error *err) {
  if (rc != 0) comm_abort(c, err->msg);
}

// One check agreed by every rank: it passes only if it passed everywhere. Rank 0 prints it.
static inline void check_all(Comm *c, int ok, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline void check_all(Comm *c, int ok, const char *fmt, ...) {
  double failed = ok ? 0 : 1;
  Error err;
  must(c, comm_allreduce_doubles(c, &failed, 1, COMM_MAX, &err), &err);
  char text[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  if (c->rank == 0)
    test_check(failed == 0, "%s", text);
  else if (failed)
    test_stats.failed++;
  else
    test_stats.passed++;
}

static inline double max_over_ranks(Comm *c, double v) {
  Error err;
  must(c, comm_allreduce_doubles(c, &v, 1, COMM_MAX, &err), &err);
  return v;
}

// The data rank r contributes to case `id` of a test (seed): uniform in [-1, 1), different on
// every rank and every case. Drawn in double and rounded, so small values carry all 24 bits of
// mantissa and sums really round (test_fill_uniform's values lie on a 2^-23 grid, where sums of
// a few are exact).
static inline void rank_data(float *x, int64_t n, int r, int id, uint64_t seed) {
  TestRng rng = {.state = seed + 7919ull * (uint64_t)r + 104729ull * (uint64_t)id};
  for (int64_t i = 0; i < n; i++)
    x[i] = (float)((double)(test_rng_u64(&rng) >> 11) * 0x1p-52 - 1.0);
}
