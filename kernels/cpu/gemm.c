// gemm.c: single-precision GEMM for the CPU trainer and the linear layer built on it.
//
// The classic blocked scheme: op(B) is packed in (KC, NC) blocks of NR-wide panels, op(A) in
// (MC, KC) blocks of MR-high panels, and a micro-kernel keeps an MR x NR tile of C in registers
// while it streams one panel of each (k-major, contiguous, zero-padded to full width). Packing
// turns all four transpose cases into the same inner loop and lets edge tiles run the full
// kernel on zeros. When A is not transposed its rows are already contiguous along k and the
// kernel reads them in place, which matters when N is small and A is read only a few times.
// Threads split C into disjoint rectangles, each computed by one thread with its own pack
// buffers: no races, no barriers, and every element of C is summed in the same order whatever
// the thread count, so results are bitwise independent of OMP_NUM_THREADS.
//
// The linear layer uses two fusions the public gemm_cpu does not expose: the forward adds the
// bias as C is stored, and the backward sums dout for dbias while it packs dout^T for dweight,
// so that neither needs another pass over a large activation.
#include "kernels/gemm.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define GEMM_AVX2 1
#endif

#include "src/base/util.h"

// MR x NR = 6 x 16 is 12 ymm accumulators, leaving 4 of the 16 registers for two B vectors
// and an A broadcast. KC * NR * 4 bytes = 16 KiB keeps the B panel in L1 (32 KiB) while the
// A block, MC * KC * 4 bytes = 144 KiB, stays in L2 (512 KiB). NC bounds the packed B block
// (KC * NC * 4 bytes = 2 MiB per thread) so that it stays in L3.
enum { GEMM_MR = 6, GEMM_NR = 16, GEMM_KC = 256, GEMM_MC = 144, GEMM_NC = 2048 };

// Below this many flops per thread, starting another thread costs more than it saves.
#define GEMM_MIN_FLOPS_PER_THREAD (4.0 * 1024 * 1024)
// Packing one float costs about this many flops of micro-kernel time; used to pick the split.
#define GEMM_PACK_COST_FLOPS 32.0

// One product C = alpha op(A) op(B) + beta C + bias, with op() folded into strides so that
// packing reads every layout the same way.
typedef struct {
  int64_t M, N, K;
  float alpha, beta;
  const float *A;
  int64_t a_rs, a_cs;  // op(A)(i, k) = A[i * a_rs + k * a_cs]
  const float *B;
  int64_t b_rs, b_cs;  // op(B)(k, j) = B[k * b_rs + j * b_cs]
  const float *bias;   // (N) added to every row of C together with the beta term, or NULL
  float *a_row_sums;   // (M) += row sums of op(A), or NULL: the bias gradient, taken while packing
  float *C;            // (M, N), row stride ldc
  int64_t ldc;
} GemmProblem;

static inline int64_t min_i64(int64_t a, int64_t b) {
  return a < b ? a : b;
}
static inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Whether the micro-kernel reads full panels of op(A) in place: its rows must be contiguous
// along k, and row sums need the packed copy.
static inline bool a_in_place(const GemmProblem *p) {
  return p->a_cs == 1 && !p->a_row_sums;
}

// ---------------------------------------------------------------------------------------------
// Packing

// Packs `w` lines of length kc into ceil(w / W) panels of (kc, W), the one holding line l at
// dst + (l - l % W) * kc: element k of line l, src[l * l_stride + k * k_stride], goes to
// [k * W + l % W] of its panel. Lines past w in the last panel are zero, so that edge tiles run
// the full micro-kernel.
static inline void pack_block(float *restrict dst, const float *restrict src, int64_t l_stride,
                              int64_t k_stride, int64_t w, int W, int64_t kc) {
  int64_t full = w / W * W, tail = w - full;  // lines in full panels, lines in the last one
  if (l_stride == 1) {
    // At each k the lines are adjacent in memory: read one contiguous segment per k, in
    // memory order, and deal it out to the panels.
    for (int64_t k = 0; k < kc; k++) {
      const float *s = src + k * k_stride;
      for (int64_t l = 0; l < full; l += W)
        for (int r = 0; r < W; r++) dst[l * kc + k * W + r] = s[l + r];
      if (tail) {
        float *d = dst + full * kc + k * W;
        for (int r = 0; r < W; r++) d[r] = r < tail ? s[full + r] : 0.0f;
      }
    }
    return;
  }
  // Each line is contiguous along k (the transposed layouts): copy it line by line.
  for (int64_t l = 0; l < w; l++) {
    const float *s = src + l * l_stride;
    float *d = dst + (l - l % W) * kc + l % W;
    for (int64_t k = 0; k < kc; k++) d[k * W] = s[k * k_stride];
  }
  for (int64_t l = w; l < full + (tail ? W : 0); l++) {
    float *d = dst + full * kc + l % W;
    for (int64_t k = 0; k < kc; k++) d[k * W] = 0.0f;
  }
}

// sums (w) += the row sums of a packed (kc, MR) panel, read while it is still in L1. The panel
// is summed as a flat array in chunks of 24 floats (4 k steps, 3 vectors) so that the adds
// vectorize; each row then collects its 4 lanes. The order is fixed, hence deterministic.
static void panel_row_sums(float *sums, const float *panel, int64_t kc, int64_t w) {
  enum { CHUNK = 4 * GEMM_MR };
  float part[CHUNK] = {0};
  int64_t n = kc * GEMM_MR, full = n / CHUNK * CHUNK;
  for (int64_t i = 0; i < full; i += CHUNK)
    for (int j = 0; j < CHUNK; j++) part[j] += panel[i + j];
  for (int64_t i = full; i < n; i++) part[i - full] += panel[i];
  for (int64_t r = 0; r < w; r++)
    sums[r] += (part[r] + part[r + GEMM_MR]) + (part[r + 2 * GEMM_MR] + part[r + 3 * GEMM_MR]);
}

// dst (ceil(mc / MR) panels of (kc, MR)) <- op(A)[i0 : i0 + mc, p0 : p0 + kc]; row_sums (mc)
// += the row sums of that block when not NULL.
static void pack_a(float *dst, const GemmProblem *p, int64_t i0, int64_t mc, int64_t p0, int64_t kc,
                   float *row_sums) {
  pack_block(dst, p->A + i0 * p->a_rs + p0 * p->a_cs, p->a_rs, p->a_cs, mc, GEMM_MR, kc);
  if (row_sums)
    for (int64_t ir = 0; ir < mc; ir += GEMM_MR)
      panel_row_sums(row_sums + ir, dst + ir * kc, kc, min_i64(GEMM_MR, mc - ir));
}

// dst (ceil(nc / NR) panels of (kc, NR)) <- op(B)[p0 : p0 + kc, j0 : j0 + nc]
static void pack_b(float *dst, const GemmProblem *p, int64_t p0, int64_t kc, int64_t j0,
                   int64_t nc) {
  pack_block(dst, p->B + p0 * p->b_rs + j0 * p->b_cs, p->b_cs, p->b_rs, nc, GEMM_NR, kc);
}

// ---------------------------------------------------------------------------------------------
// Micro-kernel: C[0:m, 0:n] = alpha * a b + beta * C + bias for an MR x kc block of op(A), read
// as a[r * a_rs + k * a_ks], and a packed (kc, NR) panel b; m <= MR, n <= NR. a is either a
// packed panel (a_rs = 1, a_ks = MR) or A itself when its rows are contiguous (a_rs = lda,
// a_ks = 1), which saves packing the operand that is read least often. beta == 0 never reads
// C; bias (n) may be NULL.

// Writes an MR x NR tile computed into `tile` (MR, NR) to C, the slow path for edge tiles.
static void store_tile_edge(const float *tile, float *c, int64_t ldc, int m, int n, float beta,
                            const float *bias) {
  for (int r = 0; r < m; r++) {
    for (int j = 0; j < n; j++) {
      float v = tile[r * GEMM_NR + j];
      if (beta != 0.0f) v += beta * c[r * ldc + j];
      if (bias) v += bias[j];
      c[r * ldc + j] = v;
    }
  }
}

#ifdef GEMM_AVX2
static void micro_kernel(int64_t kc, const float *restrict a, int64_t a_rs, int64_t a_ks,
                         const float *restrict b, float *restrict c, int64_t ldc, int m, int n,
                         float alpha, float beta, const float *bias) {
  __m256 acc[GEMM_MR][2];
  for (int r = 0; r < GEMM_MR; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t k = 0; k < kc; k++) {
    __m256 b0 = _mm256_load_ps(b + k * GEMM_NR);
    __m256 b1 = _mm256_load_ps(b + k * GEMM_NR + 8);
    const float *ak = a + k * a_ks;
    for (int r = 0; r < GEMM_MR; r++) {
      __m256 ar = _mm256_broadcast_ss(ak + r * a_rs);
      acc[r][0] = _mm256_fmadd_ps(ar, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(ar, b1, acc[r][1]);
    }
  }
  __m256 va = _mm256_set1_ps(alpha);
  if (m == GEMM_MR && n == GEMM_NR) {
    __m256 vb = _mm256_set1_ps(beta);
    for (int r = 0; r < GEMM_MR; r++) {
      float *cr = c + r * ldc;
      __m256 x0 = _mm256_mul_ps(va, acc[r][0]);
      __m256 x1 = _mm256_mul_ps(va, acc[r][1]);
      if (beta != 0.0f) {
        x0 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(cr), x0);
        x1 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(cr + 8), x1);
      }
      if (bias) {
        x0 = _mm256_add_ps(x0, _mm256_loadu_ps(bias));
        x1 = _mm256_add_ps(x1, _mm256_loadu_ps(bias + 8));
      }
      _mm256_storeu_ps(cr, x0);
      _mm256_storeu_ps(cr + 8, x1);
    }
    return;
  }
  float tile[GEMM_MR * GEMM_NR] __attribute__((aligned(32)));
  for (int r = 0; r < GEMM_MR; r++) {
    _mm256_store_ps(tile + r * GEMM_NR, _mm256_mul_ps(va, acc[r][0]));
    _mm256_store_ps(tile + r * GEMM_NR + 8, _mm256_mul_ps(va, acc[r][1]));
  }
  store_tile_edge(tile, c, ldc, m, n, beta, bias);
}
#else
// Portable fallback: the same tile in plain C, which compilers vectorize for whatever SIMD
// the target has.
static void micro_kernel(int64_t kc, const float *restrict a, int64_t a_rs, int64_t a_ks,
                         const float *restrict b, float *restrict c, int64_t ldc, int m, int n,
                         float alpha, float beta, const float *bias) {
  float tile[GEMM_MR * GEMM_NR] = {0};
  for (int64_t k = 0; k < kc; k++)
    for (int r = 0; r < GEMM_MR; r++)
      for (int j = 0; j < GEMM_NR; j++)
        tile[r * GEMM_NR + j] += a[r * a_rs + k * a_ks] * b[k * GEMM_NR + j];
  for (int i = 0; i < GEMM_MR * GEMM_NR; i++) tile[i] *= alpha;
  store_tile_edge(tile, c, ldc, m, n, beta, bias);
}
#endif

// ---------------------------------------------------------------------------------------------
// Blocked product over one rectangle of C, run by one thread.

// C[m0:m1, n0:n1] of problem p; pa holds MC * KC floats (MR * KC when op(A) is read in place),
// pb KC * NC, 32-byte aligned.
static void gemm_rect(const GemmProblem *p, int64_t m0, int64_t m1, int64_t n0, int64_t n1,
                      float *pa, float *pb) {
  for (int64_t jc = n0; jc < n1; jc += GEMM_NC) {
    int64_t nc = min_i64(GEMM_NC, n1 - jc);
    for (int64_t pc = 0; pc < p->K; pc += GEMM_KC) {
      int64_t kc = min_i64(GEMM_KC, p->K - pc);
      // The first K block applies beta and the bias; later ones accumulate onto it.
      float beta = pc == 0 ? p->beta : 1.0f;
      const float *bias = pc == 0 ? p->bias : NULL;
      pack_b(pb, p, pc, kc, jc, nc);
      for (int64_t ic = m0; ic < m1; ic += GEMM_MC) {
        int64_t mc = min_i64(GEMM_MC, m1 - ic);
        // With op(A) read in place only a last, partial panel is packed, since its missing rows
        // lie outside A. Row sums are added by the thread whose rectangle holds column 0.
        int64_t direct = a_in_place(p) ? mc / GEMM_MR * GEMM_MR : 0;
        float *row_sums = p->a_row_sums && jc == 0 ? p->a_row_sums + ic : NULL;
        pack_a(pa, p, ic + direct, mc - direct, pc, kc, row_sums);
        for (int64_t jr = 0; jr < nc; jr += GEMM_NR) {
          int n = (int)min_i64(GEMM_NR, nc - jr);
          for (int64_t ir = 0; ir < mc; ir += GEMM_MR) {
            int m = (int)min_i64(GEMM_MR, mc - ir);
            float *c = p->C + (ic + ir) * p->ldc + jc + jr;
            const float *cbias = bias ? bias + jc + jr : NULL;
            if (ir < direct)
              micro_kernel(kc, p->A + (ic + ir) * p->a_rs + pc, p->a_rs, 1, pb + jr * kc, c, p->ldc,
                           m, n, p->alpha, beta, cbias);
            else
              micro_kernel(kc, pa + (ir - direct) * kc, 1, GEMM_MR, pb + jr * kc, c, p->ldc, m, n,
                           p->alpha, beta, cbias);
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Splitting C among threads

// How many threads are worth starting for this problem.
static int gemm_thread_count(const GemmProblem *p) {
#ifdef _OPENMP
  if (omp_in_parallel()) return 1;
  double flops = 2.0 * (double)p->M * (double)p->N * (double)p->K;
  double useful = flops / GEMM_MIN_FLOPS_PER_THREAD;
  int threads = omp_get_max_threads();
  if (useful < threads) threads = useful < 1 ? 1 : (int)useful;
  return threads;
#else
  (void)p;
  return 1;
#endif
}

// Chooses a grid tm x tn = threads of C rectangles (cut at MR / NR tile boundaries) that
// minimizes the busiest thread's micro-kernel work plus its packing, counted in flops.
static void choose_grid(const GemmProblem *p, int threads, int *tm_out, int *tn_out) {
  int64_t tiles_m = ceil_div(p->M, GEMM_MR), tiles_n = ceil_div(p->N, GEMM_NR);
  double best = -1;
  for (int tm = 1; tm <= threads; tm++) {
    if (threads % tm) continue;
    int tn = threads / tm;
    double rows = (double)ceil_div(tiles_m, tm) * GEMM_MR;
    double cols = (double)ceil_div(tiles_n, tn) * GEMM_NR;
    double a_packs = (double)ceil_div((int64_t)cols, GEMM_NC);  // A is repacked per NC block
    double cost =
        (double)p->K * (2.0 * rows * cols + GEMM_PACK_COST_FLOPS * (rows * a_packs + cols));
    if (best < 0 || cost < best) {
      best = cost;
      *tm_out = tm;
      *tn_out = tn;
    }
  }
}

// Start of part `i` of `parts` when `tiles` tiles of `tile` elements (n in all) are shared out.
static int64_t split_at(int64_t i, int64_t parts, int64_t tiles, int64_t tile, int64_t n) {
  return min_i64(n, i * tiles / parts * tile);
}

static void gemm_thread(const GemmProblem *p, int thread, int threads) {
  int tm = 1, tn = 1;
  choose_grid(p, threads, &tm, &tn);
  int64_t tiles_m = ceil_div(p->M, GEMM_MR), tiles_n = ceil_div(p->N, GEMM_NR);
  int64_t im = thread / tn, in = thread % tn;
  int64_t m0 = split_at(im, tm, tiles_m, GEMM_MR, p->M);
  int64_t m1 = split_at(im + 1, tm, tiles_m, GEMM_MR, p->M);
  int64_t n0 = split_at(in, tn, tiles_n, GEMM_NR, p->N);
  int64_t n1 = split_at(in + 1, tn, tiles_n, GEMM_NR, p->N);
  if (m0 >= m1 || n0 >= n1) return;
  // Pack buffers sized for this rectangle (A needs one edge panel when read in place). Small
  // products, such as attention's per-window ones, pack on the stack and skip the allocator.
  int64_t kc = min_i64(GEMM_KC, p->K);
  int64_t mc = min_i64(GEMM_MC, ceil_div(m1 - m0, GEMM_MR) * GEMM_MR);
  if (a_in_place(p)) mc = GEMM_MR;
  int64_t nc = min_i64(GEMM_NC, ceil_div(n1 - n0, GEMM_NR) * GEMM_NR);
  enum { STACK_FLOATS = 8192 };  // 32 KiB
  float stack[STACK_FLOATS] __attribute__((aligned(64)));
  bool small = (mc + nc) * kc <= STACK_FLOATS;
  float *buf = small ? stack : aligned_alloc_check((size_t)((mc + nc) * kc) * sizeof(float));
  // B's panels come first and nc is a multiple of 16 floats, so both parts are 64-byte aligned.
  gemm_rect(p, m0, m1, n0, n1, buf + nc * kc, buf);
  if (!small) free(buf);
}

// C = beta * C + bias without a product (K == 0 or alpha == 0); beta == 0 does not read C.
static void gemm_scale_c(const GemmProblem *p) {
  for (int64_t i = 0; i < p->M; i++) {
    float *c = p->C + i * p->ldc;
    for (int64_t j = 0; j < p->N; j++) {
      float v = p->beta != 0.0f ? p->beta * c[j] : 0.0f;
      c[j] = p->bias ? v + p->bias[j] : v;
    }
  }
}

// a_row_sums += row sums of op(A) when there is no product to fuse them into (N == 0 or
// alpha == 0); K == 0 adds nothing.
static void gemm_row_sums(const GemmProblem *p) {
  for (int64_t i = 0; i < p->M; i++) {
    float s = 0;
    for (int64_t k = 0; k < p->K; k++) s += p->A[i * p->a_rs + k * p->a_cs];
    p->a_row_sums[i] += s;
  }
}

static void gemm_run(const GemmProblem *p) {
  if (p->M <= 0) return;
  if (p->N <= 0 || p->K <= 0 || p->alpha == 0.0f) {
    gemm_scale_c(p);
    if (p->a_row_sums) gemm_row_sums(p);
    return;
  }
  int threads = gemm_thread_count(p);
  if (threads == 1) {
    gemm_thread(p, 0, 1);
    return;
  }
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
  gemm_thread(p, omp_get_thread_num(), omp_get_num_threads());
#endif
}

static GemmProblem gemm_problem(bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                                float alpha, const float *A, int64_t lda, const float *B,
                                int64_t ldb, float beta, float *C, int64_t ldc) {
  GemmProblem p = {
      .M = M, .N = N, .K = K, .alpha = alpha, .beta = beta, .A = A, .B = B, .C = C, .ldc = ldc};
  p.a_rs = transA ? 1 : lda;
  p.a_cs = transA ? lda : 1;
  p.b_rs = transB ? 1 : ldb;
  p.b_cs = transB ? ldb : 1;
  return p;
}

void gemm_cpu(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
              const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
              int64_t ldc) {
  GemmProblem p = gemm_problem(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  gemm_run(&p);
}

// ---------------------------------------------------------------------------------------------
// Linear layer

void linear_forward_cpu(float *out, const float *inp, const float *weight, const float *bias,
                        int64_t N, int IC, int OC) {
  // out (N, OC) = inp (N, IC) weight^T + bias, the bias added as the tiles are stored, so out
  // is written once and never read.
  GemmProblem p = gemm_problem(false, true, N, OC, IC, 1.0f, inp, IC, weight, IC, 0.0f, out, OC);
  p.bias = bias;
  gemm_run(&p);
}

void linear_backward_cpu(float *dinp, float *dweight, float *dbias, const float *dout,
                         const float *inp, const float *weight, int64_t N, int IC, int OC) {
  // dinp (N, IC) = dout (N, OC) weight (OC, IC)
  if (dinp) gemm_cpu(false, false, N, IC, OC, 1.0f, dout, OC, weight, IC, 0.0f, dinp, IC);
  // dweight (OC, IC) += dout^T (OC, N) inp (N, IC), and dbias (OC) += the row sums of dout^T,
  // taken as dout^T is packed, which saves a pass over dout.
  GemmProblem p = gemm_problem(true, false, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dweight, IC);
  p.a_row_sums = dbias;
  gemm_run(&p);
}

void column_sums_cpu(float *sums, const float *x, int64_t rows, int cols) {
  // Whole rows (up to 1024 columns at a time) into double accumulators that stay in L1: x is
  // read once, in order.
  enum { GROUP = 1024 };
  double acc[GROUP];
  for (int c0 = 0; c0 < cols; c0 += GROUP) {
    int n = cols - c0 < GROUP ? cols - c0 : GROUP;
    for (int c = 0; c < n; c++) acc[c] = 0.0;
    for (int64_t r = 0; r < rows; r++) {
      const float *row = x + r * cols + c0;
      for (int c = 0; c < n; c++) acc[c] += row[c];
    }
    for (int c = 0; c < n; c++) sums[c0 + c] += (float)acc[c];
  }
}
