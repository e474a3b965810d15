// bench_gemm.c: GFLOP/s of gemm_cpu and the linear layer on the shapes a small Swin trains with.
//
// Build and run (from the repo root; not part of the CMake build):
//   gcc -std=c11 -O3 -march=native -fopenmp -I. scripts/bench_gemm.c kernels/cpu/gemm.c
//       src/base/util.c -lm -o /tmp/bench_gemm
//   OMP_NUM_THREADS=2 /tmp/bench_gemm          # the standard table
//   OMP_NUM_THREADS=1 /tmp/bench_gemm 0 1 8192 256 64   # one shape: transA transB M N K
// Each figure is the best of several runs after a warm-up, so it measures the kernel, not page
// faults or a neighbour's burst on a shared machine; 2 M N K flops per product, and 4 M N K for
// a layer's backward (dinp and dweight).
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/gemm.h"
#include "src/base/util.h"

static void fill(float *x, int64_t n, uint32_t seed) {
  for (int64_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = (float)(seed >> 8) * (1.0f / 16777216.0f) - 0.5f;
  }
}

// Best seconds of one gemm_cpu call over about 0.3 s of repeats (at least 3, after a warm-up).
static double best_time_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float *A,
                             const float *B, float beta, float *C) {
  int64_t lda = ta ? M : K, ldb = tb ? K : N;
  gemm_cpu(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, N);
  double best = 1e30, start = time_now_s();
  for (int rep = 0; rep < 3 || time_now_s() - start < 0.3; rep++) {
    double t0 = time_now_s();
    gemm_cpu(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, N);
    double t = time_now_s() - t0;
    if (t < best) best = t;
  }
  return best;
}

// GFLOP/s of gemm_cpu on fresh (M, K) x (K, N) operands in the given layout.
static double bench_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float beta) {
  float *A = aligned_alloc_check((size_t)(M * K) * sizeof(float));
  float *B = aligned_alloc_check((size_t)(K * N) * sizeof(float));
  float *C = aligned_alloc_check((size_t)(M * N) * sizeof(float));
  fill(A, M * K, 1);
  fill(B, K * N, 2);
  fill(C, M * N, 3);
  double t = best_time_gemm(ta, tb, M, N, K, A, B, beta, C);
  free(A);
  free(B);
  free(C);
  return 2.0 * (double)M * N * K / t * 1e-9;
}

// One linear layer (rows, IC -> OC): forward, backward and the three products inside it.
static void bench_linear(int64_t rows, int IC, int OC) {
  float *inp = aligned_alloc_check((size_t)(rows * IC) * sizeof(float));
  float *dinp = aligned_alloc_check((size_t)(rows * IC) * sizeof(float));
  float *out = aligned_alloc_check((size_t)(rows * OC) * sizeof(float));
  float *dout = aligned_alloc_check((size_t)(rows * OC) * sizeof(float));
  float *w = aligned_alloc_check((size_t)OC * IC * sizeof(float));
  float *dw = aligned_alloc_check((size_t)OC * IC * sizeof(float));
  float *b = aligned_alloc_check((size_t)OC * sizeof(float));
  float *db = aligned_alloc_check((size_t)OC * sizeof(float));
  fill(inp, rows * IC, 1);
  fill(dout, rows * OC, 2);
  fill(w, (int64_t)OC * IC, 3);
  fill(b, OC, 4);
  fill(dw, (int64_t)OC * IC, 5);
  fill(db, OC, 6);
  double flops = 2.0 * (double)rows * IC * OC;
  double fwd = 1e30, bwd = 1e30;
  linear_forward_cpu(out, inp, w, b, rows, IC, OC);
  linear_backward_cpu(dinp, dw, db, dout, inp, w, rows, IC, OC);
  double start = time_now_s();
  for (int rep = 0; rep < 3 || time_now_s() - start < 0.5; rep++) {
    double t0 = time_now_s();
    linear_forward_cpu(out, inp, w, b, rows, IC, OC);
    double t1 = time_now_s();
    linear_backward_cpu(dinp, dw, db, dout, inp, w, rows, IC, OC);
    double t2 = time_now_s();
    if (t1 - t0 < fwd) fwd = t1 - t0;
    if (t2 - t1 < bwd) bwd = t2 - t1;
  }
  double g_fwd = bench_gemm(false, true, rows, OC, IC, 0.0f);
  double g_dinp = bench_gemm(false, false, rows, IC, OC, 0.0f);
  double g_dw = bench_gemm(true, false, OC, IC, rows, 1.0f);
  printf("%6lld %5d %5d | %7.1f %7.1f %7.1f | %7.2f %7.1f | %7.2f %7.1f\n", (long long)rows, IC, OC,
         g_fwd, g_dinp, g_dw, fwd * 1e3, flops / fwd * 1e-9, bwd * 1e3, 2 * flops / bwd * 1e-9);
  free(inp);
  free(dinp);
  free(out);
  free(dout);
  free(w);
  free(dw);
  free(b);
  free(db);
}

int main(int argc, char **argv) {
  int threads = 1;
#ifdef _OPENMP
  threads = omp_get_max_threads();
#endif
  if (argc == 6) {
    bool ta = atoi(argv[1]), tb = atoi(argv[2]);
    int64_t M = atoll(argv[3]), N = atoll(argv[4]), K = atoll(argv[5]);
    printf("threads %d  gemm(%d,%d) M %lld N %lld K %lld: %.1f GFLOP/s\n", threads, ta, tb,
           (long long)M, (long long)N, (long long)K, bench_gemm(ta, tb, M, N, K, 0.0f));
    return 0;
  }
  if (argc != 1) {
    fprintf(stderr, "usage: %s [transA transB M N K]\n", argv[0]);
    return 2;
  }
  printf("threads %d\n\n", threads);
  printf("gemm GFLOP/s, M = 8192, N = 256 (beta 0)\n");
  printf("    K |  (0,1) fwd  (0,0) dinp  (1,0) dW-layout\n");
  for (int K = 64; K <= 256; K *= 2)
    printf("%5d | %10.1f %11.1f %11.1f\n", K, bench_gemm(false, true, 8192, 256, K, 0.0f),
           bench_gemm(false, false, 8192, 256, K, 0.0f),
           bench_gemm(true, false, 8192, 256, K, 0.0f));

  printf("\nlinear layers: gemm GFLOP/s of the three products, then the whole layer\n");
  printf("  rows    IC    OC |     fwd    dinp      dW |  fwd ms  GFLOP/s |  bwd ms  GFLOP/s\n");
  // configs/fashion_mnist.ini (batch 128, embed 48, 8x8 then 4x4 tokens): patch embedding,
  // qkv, proj, fc1, fc2 of stage 0; merging, qkv, proj, fc1, fc2 of stage 1; the head.
  static const int fashion[][3] = {{8192, 16, 48},  {8192, 48, 144}, {8192, 48, 48},
                                   {8192, 48, 192}, {8192, 192, 48}, {2048, 192, 96},
                                   {2048, 96, 288}, {2048, 96, 96},  {2048, 96, 384},
                                   {2048, 384, 96}, {128, 96, 10}};
  for (size_t s = 0; s < sizeof fashion / sizeof fashion[0]; s++)
    bench_linear(fashion[s][0], fashion[s][1], fashion[s][2]);
  printf("\n");
  // Wider layers (Swin-T-like widths at training batch sizes).
  static const int wide[][3] = {
      {8192, 64, 192},  {8192, 64, 256},   {8192, 256, 64},   {8192, 128, 384}, {8192, 128, 512},
      {8192, 512, 128}, {8192, 256, 1024}, {8192, 1024, 256}, {32768, 64, 256}, {32768, 256, 64}};
  for (size_t s = 0; s < sizeof wide / sizeof wide[0]; s++)
    bench_linear(wide[s][0], wide[s][1], wide[s][2]);
  return 0;
}
