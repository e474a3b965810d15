// attention.c: CPU reference of windowed multi-head self-attention with relative position bias
// and shift mask, forward and backward (kernels/attention.h).
//
// One (window, head) pair is one unit of work: its q, k, v slices are gathered into contiguous
// per-thread scratch so that every inner loop is a unit-stride axpy the compiler vectorizes
// (dot products are written as rows of axpys over a transposed operand). The operation order
// follows timm: q is scaled first (by the caller's fp32 scale), S = q k^T + bias + mask, softmax
// in fp32 with the row max subtracted. The bias-table gradient is a sum over all windows: pairs
// are cut into a fixed number of chunks (independent of the thread count), each chunk sums into
// its own double buffer, and the buffers are added in chunk order, so dtable is bitwise
// reproducible.
#include "kernels/attention.h"

#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/fastmath.h"
#include "src/base/util.h"

// Upper bound on the (window, head) chunks of the backward; fixed so results never depend on
// the thread count.
#define ATTENTION_GRAD_CHUNKS 64

// Copies head h of one window's qkv (N, 3C) into q (N, hd) scaled by `scale`, k (N, hd) when
// not NULL, kT (hd, N) when not NULL, v (N, hd) when not NULL and vT (hd, N) when not NULL.
static void gather_head(float *q, float *k, float *kT, float *v, float *vT, const float *qkv_win,
                        int N, int C, int hd, int h, float scale) {
  for (int i = 0; i < N; i++) {
    const float *row = qkv_win + (int64_t)i * 3 * C + h * hd;
    for (int d = 0; d < hd; d++) {
      q[i * hd + d] = row[d] * scale;
      if (k) k[i * hd + d] = row[C + d];
      if (kT) kT[d * N + i] = row[C + d];
      if (v) v[i * hd + d] = row[2 * C + d];
      if (vT) vT[d * N + i] = row[2 * C + d];
    }
  }
}

void window_attention_forward_cpu(float *out, float *att, const float *qkv, const float *table,
                                  const int *index, const float *mask, int BW, int nW, int N, int C,
                                  int heads, float scale) {
  int hd = C / heads;
#pragma omp parallel
  {
    float *q = malloc_check((size_t)3 * N * hd * sizeof(float));
    float *kT = q + N * hd, *v = kT + N * hd;
#pragma omp for schedule(static)
    for (int64_t p = 0; p < (int64_t)BW * heads; p++) {
      int b = (int)(p / heads), h = (int)(p % heads);
      gather_head(q, NULL, kT, v, NULL, qkv + (int64_t)b * N * 3 * C, N, C, hd, h, scale);
      float *P = att + p * N * N;  // att (BW, heads, N, N): pair p = b * heads + h
      const float *m = mask ? mask + (int64_t)(b % nW) * N * N : NULL;
      for (int i = 0; i < N; i++) {
        float *s = P + (int64_t)i * N;
        for (int j = 0; j < N; j++) s[j] = 0.0f;
        for (int d = 0; d < hd; d++) {
          float qd = q[i * hd + d];
          const float *kd = kT + d * N;
          for (int j = 0; j < N; j++) s[j] += qd * kd[j];
        }
        for (int j = 0; j < N; j++) s[j] += table[index[i * N + j] * heads + h];
        if (m)
          for (int j = 0; j < N; j++) s[j] += m[i * N + j];
        // fast_expf is plain arithmetic, so these loops run 8 lanes wide (libm's expf is a call
        // per element). The simd reductions fix the summation order for a given build, so a row
        // is the same for any thread count. Scores more than 87 below the row max (masked pairs
        // sit at -100) give exactly 0, not a subnormal that would slow down the backward.
        float mx = s[0];
#pragma omp simd reduction(max : mx)
        for (int j = 1; j < N; j++) mx = s[j] > mx ? s[j] : mx;
        double sum = 0.0;
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < N; j++) {
          s[j] = fast_expf(s[j] - mx);
          sum += s[j];
        }
        float inv = (float)(1.0 / sum);
        for (int j = 0; j < N; j++) s[j] *= inv;

        // out[b][i][h*hd + d] = sum_j P[i][j] v[j][d]
        float *o = out + ((int64_t)b * N + i) * C + h * hd;
        for (int d = 0; d < hd; d++) o[d] = 0.0f;
        for (int j = 0; j < N; j++) {
          float pij = s[j];
          const float *vj = v + j * hd;
          for (int d = 0; d < hd; d++) o[d] += pij * vj[d];
        }
      }
    }
    free(q);
  }
}

void window_attention_backward_cpu(float *dqkv, float *dtable, const float *dout, const float *qkv,
                                   const float *att, const int *index, int BW, int N, int C,
                                   int heads, float scale) {
  int hd = C / heads;
  int64_t pairs = (int64_t)BW * heads;
  if (pairs == 0) return;
  // The table has (2wh-1)(2ww-1) rows; wh and ww are not passed, but the largest index is the
  // last row, so the table extent follows from index itself.
  int table_rows = 0;
  for (int64_t e = 0; e < (int64_t)N * N; e++)
    table_rows = index[e] + 1 > table_rows ? index[e] + 1 : table_rows;
  int64_t table_size = (int64_t)table_rows * heads;
  int64_t chunks = pairs < ATTENTION_GRAD_CHUNKS ? pairs : ATTENTION_GRAD_CHUNKS;
  int64_t pairs_per_chunk = (pairs + chunks - 1) / chunks;
  double *partial = malloc_check((size_t)(chunks * table_size) * sizeof(double));

#pragma omp parallel
  {
    // q is scaled (as in the forward), k and v are row-major, vT is v transposed.
    float *q = malloc_check(((size_t)8 * N * hd + (size_t)N * N) * sizeof(float));
    float *k = q + N * hd, *vT = k + N * hd, *dO = vT + N * hd;
    float *dq = dO + N * hd, *dk = dq + N * hd, *dv = dk + N * hd, *v = dv + N * hd;
    float *dS = v + N * hd;
#pragma omp for schedule(static)
    for (int64_t chunk = 0; chunk < chunks; chunk++) {
      double *dtab = partial + chunk * table_size;
      for (int64_t t = 0; t < table_size; t++) dtab[t] = 0.0;
      int64_t p_end = (chunk + 1) * pairs_per_chunk < pairs ? (chunk + 1) * pairs_per_chunk : pairs;
      for (int64_t p = chunk * pairs_per_chunk; p < p_end; p++) {
        int b = (int)(p / heads), h = (int)(p % heads);
        const float *qkv_win = qkv + (int64_t)b * N * 3 * C;
        gather_head(q, k, NULL, v, vT, qkv_win, N, C, hd, h, scale);
        for (int i = 0; i < N; i++)
          for (int d = 0; d < hd; d++) dO[i * hd + d] = dout[((int64_t)b * N + i) * C + h * hd + d];
        const float *P = att + p * N * N;
        for (int e = 0; e < N * hd; e++) dq[e] = dk[e] = dv[e] = 0.0f;

        for (int i = 0; i < N; i++) {
          const float *Pi = P + i * N, *dOi = dO + i * hd;
          // dV[j] += P[i][j] dO[i]
          for (int j = 0; j < N; j++) {
            float pij = Pi[j];
            float *dvj = dv + j * hd;
            for (int d = 0; d < hd; d++) dvj[d] += pij * dOi[d];
          }
          // dP[i][j] = dO[i] . v[j], then dS = P * (dP - sum_j P dP)
          float *dSi = dS + i * N;
          for (int j = 0; j < N; j++) dSi[j] = 0.0f;
          for (int d = 0; d < hd; d++) {
            float g = dOi[d];
            const float *vd = vT + d * N;
            for (int j = 0; j < N; j++) dSi[j] += g * vd[j];
          }
          double rowsum = 0.0;
#pragma omp simd reduction(+ : rowsum)
          for (int j = 0; j < N; j++) rowsum += (double)Pi[j] * dSi[j];
          float rs = (float)rowsum;
          for (int j = 0; j < N; j++) dSi[j] = Pi[j] * (dSi[j] - rs);
          // S = q_scaled k^T: dq_scaled[i] = sum_j dS[i][j] k[j], dk[j] += dS[i][j] q_scaled[i].
          float *dqi = dq + i * hd;
          const float *qi = q + i * hd;
          for (int j = 0; j < N; j++) {
            float s = dSi[j];
            const float *kj = k + j * hd;
            float *dkj = dk + j * hd;
            for (int d = 0; d < hd; d++) {
              dqi[d] += s * kj[d];
              dkj[d] += s * qi[d];
            }
          }
          for (int j = 0; j < N; j++) dtab[index[i * N + j] * heads + h] += dSi[j];
        }

        for (int i = 0; i < N; i++) {
          float *row = dqkv + ((int64_t)b * N + i) * 3 * C + h * hd;
          for (int d = 0; d < hd; d++) {
            row[d] = dq[i * hd + d] * scale;
            row[C + d] = dk[i * hd + d];
            row[2 * C + d] = dv[i * hd + d];
          }
        }
      }
    }
    free(q);
  }

  // Chunk order is fixed, so the sum is the same for any thread count.
  for (int64_t t = 0; t < table_size; t++) {
    double s = 0.0;
    for (int64_t chunk = 0; chunk < chunks; chunk++) s += partial[chunk * table_size + t];
    dtable[t] += (float)s;
  }
  free(partial);
}
