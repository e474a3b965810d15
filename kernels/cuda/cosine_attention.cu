// cosine_attention.cu: CUDA scaled-cosine q, k and continuous position bias (the spec is
// kernels/cpu/cosine_attention.c; declared in kernels/cosine_attention.h).
//
// cosine q, k: a warp per (row, head), the head's channels strided over its lanes, the norms and
// dot products as butterfly warp sums (f32, a fixed order). The backward's sums over rows (the
// q/v bias and logit-scale gradients) go through per-block partials: block (part, head) serves
// the rows part * 8 + warp + k * 8 * parts, its warps sum in f32 in row order, the block adds
// its 8 warps in order, and column_partials_reduce_cuda adds the parts in order (double): the
// bits depend on the shapes only.
//
// CPB: the MLP is tiny (T <= 2209 rows, heads <= 48 at window 24), so simple kernels in double:
// a thread per hidden element and per table element (the same double sums, in the same order, as
// the CPU: hidden and out come out bitwise equal to it); the backward's dw2 a thread per (head,
// unit) over the rows in order, dw1 and db1 a block per hidden unit whose threads take fixed rows
// and add up in a fixed tree.
#include <cstdio>
#include <cstdlib>

#include "kernels/cosine_attention.h"
#include "kernels/cuda/common.cuh"
#include "kernels/gemm.h"
#include "src/base/cuda_util.h"

namespace {

using namespace swin_cuda;

constexpr int kWarps = 8;  // warps per block of the cosine kernels
constexpr int kThreads = 32 * kWarps;
constexpr int kPerLane = COSINE_CUDA_MAX_HEAD_DIM / 32;  // channels a lane holds
constexpr int kMaxParts = 256;                           // row blocks of the backward
constexpr int kCpbThreads = 256;

void check_shape(const char *fn, int64_t rows, int C, int heads) {
  if (rows >= 0 && heads >= 1 && C >= heads && C % heads == 0 &&
      C / heads <= COSINE_CUDA_MAX_HEAD_DIM)
    return;
  fprintf(stderr,
          "%s (%s:%d): unsupported shape rows=%lld C=%d heads=%d (need C %% heads == 0, "
          "C / heads <= %d)\n"
          "HINT: use at most %d channels per head\n",
          fn, __FILE__, __LINE__, (long long)rows, C, heads, COSINE_CUDA_MAX_HEAD_DIM,
          COSINE_CUDA_MAX_HEAD_DIM);
  abort();
}

// exp(min(l, ln 100)) rounded once, as the CPU computes it.
__device__ __forceinline__ float logit_multiplier(float logit_scale) {
  return (float)exp((double)fminf(logit_scale, COSINE_LOGIT_MAX));
}

// Row blocks of the backward: a function of rows only, so the summation order is too.
int backward_parts(int64_t rows) {
  int64_t parts = (rows + kWarps - 1) / kWarps;
  return (int)(parts < 1 ? 1 : parts > kMaxParts ? kMaxParts : parts);
}

// x (hd, this lane's channels lane + 32 i) <- x / max(|x|, eps) * mul; returns |x|.
template <int PER>
__device__ __forceinline__ float normalize_lanes(float (&x)[PER], float mul) {
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < PER; i++) ss += x[i] * x[i];
  float norm = sqrtf(warp_sum(ss));
  float den = fmaxf(norm, COSINE_NORM_EPS);
#pragma unroll
  for (int i = 0; i < PER; i++) x[i] = x[i] / den * mul;
  return norm;
}

// A warp per (row, head): q, k normalized (q times the logit multiplier), v biased, in place.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    cosine_qk_forward_kernel(T *__restrict__ qkv, float *__restrict__ norms,
                             const float *__restrict__ q_bias, const float *__restrict__ v_bias,
                             const float *__restrict__ logit_scale, int64_t rows, int C,
                             int heads) {
  const int lane = threadIdx.x % 32;
  const int64_t p = (int64_t)blockIdx.x * kWarps + threadIdx.x / 32;
  if (p >= rows * heads) return;
  const int64_t r = p / heads;
  const int h = (int)(p % heads), hd = C / heads;
  T *q = qkv + r * 3 * C + h * hd, *k = q + C, *v = k + C;
  const int c0 = h * hd;
  float xq[kPerLane], xk[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; i++) {
    const int d = lane + 32 * i;
    xq[i] = d < hd ? to_float<T>(q[d]) + (q_bias ? q_bias[c0 + d] : 0.0f) : 0.0f;
    xk[i] = d < hd ? to_float<T>(k[d]) : 0.0f;
  }
  const float nq = normalize_lanes<kPerLane>(xq, logit_multiplier(logit_scale[h]));
  const float nk = normalize_lanes<kPerLane>(xk, 1.0f);
#pragma unroll
  for (int i = 0; i < kPerLane; i++) {
    const int d = lane + 32 * i;
    if (d < hd) {
      q[d] = from_float<T>(xq[i]);
      k[d] = from_float<T>(xk[i]);
      if (v_bias) v[d] = from_float<T>(to_float<T>(v[d]) + v_bias[c0 + d]);
    }
  }
  if (lane == 0) {
    norms[(r * 2 + 0) * heads + h] = nq;
    norms[(r * 2 + 1) * heads + h] = nk;
  }
}

// dy (this lane's channels) <- the gradient of x from that of y = x / max(|x|, eps) * mul, y as
// saved; returns y . dy (the same on every lane).
template <int PER>
__device__ __forceinline__ float normalize_backward_lanes(float (&dy)[PER], const float (&y)[PER],
                                                          float norm, float mul) {
  float dot = 0.0f;
#pragma unroll
  for (int i = 0; i < PER; i++) dot += y[i] * dy[i];
  dot = warp_sum(dot);
  if (norm > COSINE_NORM_EPS) {
#pragma unroll
    for (int i = 0; i < PER; i++) dy[i] = (dy[i] * mul - y[i] / mul * dot) / norm;
  } else {
#pragma unroll
    for (int i = 0; i < PER; i++) dy[i] = dy[i] * mul / COSINE_NORM_EPS;
  }
  return dot;
}

// Block (part, head): the backward of the rows part * kWarps + warp + k * kWarps * parts, in
// place on dqkv; the block's column sums of dq, dv (as computed, before the rounding to T) to
// q_partial, v_partial (parts, C), its sum of q' . dq' to l_partial (parts, heads): 0 where the
// clamp passes no gradient.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    cosine_qk_backward_kernel(T *__restrict__ dqkv, float *__restrict__ q_partial,
                              float *__restrict__ v_partial, float *__restrict__ l_partial,
                              const T *__restrict__ qkv, const float *__restrict__ norms,
                              const float *__restrict__ logit_scale, int64_t rows, int C,
                              int heads) {
  extern __shared__ float smem[];  // (kWarps, 2, hd) column sums, then kWarps dot sums
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int h = blockIdx.y, hd = C / heads, c0 = h * hd, parts = gridDim.x;
  const float mul = logit_multiplier(logit_scale[h]);
  float sq[kPerLane] = {}, sv[kPerLane] = {}, sl = 0.0f;
  for (int64_t r = (int64_t)blockIdx.x * kWarps + warp; r < rows; r += (int64_t)kWarps * parts) {
    T *dq = dqkv + r * 3 * C + c0, *dk = dq + C, *dv = dk + C;
    const T *q = qkv + r * 3 * C + c0, *k = q + C;
    float gq[kPerLane], yq[kPerLane], gk[kPerLane], yk[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; i++) {
      const int d = lane + 32 * i;
      const bool in = d < hd;
      gq[i] = in ? to_float<T>(dq[d]) : 0.0f;
      yq[i] = in ? to_float<T>(q[d]) : 0.0f;
      gk[i] = in ? to_float<T>(dk[d]) : 0.0f;
      yk[i] = in ? to_float<T>(k[d]) : 0.0f;
      sv[i] += in ? to_float<T>(dv[d]) : 0.0f;
    }
    sl += normalize_backward_lanes<kPerLane>(gq, yq, norms[(r * 2 + 0) * heads + h], mul);
    normalize_backward_lanes<kPerLane>(gk, yk, norms[(r * 2 + 1) * heads + h], 1.0f);
#pragma unroll
    for (int i = 0; i < kPerLane; i++) {
      const int d = lane + 32 * i;
      if (d < hd) {
        dq[d] = from_float<T>(gq[i]);
        dk[d] = from_float<T>(gk[i]);
      }
      sq[i] += gq[i];
    }
  }
  float *wq = smem + warp * 2 * hd, *wv = wq + hd, *wl = smem + kWarps * 2 * hd;
#pragma unroll
  for (int i = 0; i < kPerLane; i++) {
    const int d = lane + 32 * i;
    if (d < hd) {
      wq[d] = sq[i];
      wv[d] = sv[i];
    }
  }
  if (lane == 0) wl[warp] = sl;
  __syncthreads();
  for (int d = threadIdx.x; d < hd; d += kThreads) {
    float a = 0.0f, b = 0.0f;
    for (int w = 0; w < kWarps; w++) {
      a += smem[w * 2 * hd + d];
      b += smem[w * 2 * hd + hd + d];
    }
    q_partial[(int64_t)blockIdx.x * C + c0 + d] = a;
    v_partial[(int64_t)blockIdx.x * C + c0 + d] = b;
  }
  if (threadIdx.x == 0) {
    float a = 0.0f;
    for (int w = 0; w < kWarps; w++) a += wl[w];
    // torch.clamp passes the gradient where logit_scale <= max: elsewhere the sum is 0.
    l_partial[(int64_t)blockIdx.x * heads + h] = logit_scale[h] <= COSINE_LOGIT_MAX ? a : 0.0f;
  }
}

// ---- CPB --------------------------------------------------------------------------------------

// hidden[t][j] = relu(c0 w1[j][0] + c1 w1[j][1] + b1[j]) in double (the CPU's sum).
__global__ void cpb_hidden_kernel(float *__restrict__ hidden, const float *__restrict__ coords,
                                  const float *__restrict__ w1, const float *__restrict__ b1,
                                  int T) {
  const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= (int64_t)T * CPB_HIDDEN) return;
  const int t = (int)(e / CPB_HIDDEN), j = (int)(e % CPB_HIDDEN);
  const double a =
      (double)coords[2 * t] * w1[2 * j] + (double)coords[2 * t + 1] * w1[2 * j + 1] + (double)b1[j];
  hidden[e] = a > 0 ? (float)a : 0.0f;
}

// table[t][h] = 16 sigmoid(hidden[t] . w2[h]), the dot in double over j in order.
__global__ void cpb_table_kernel(float *__restrict__ table, const float *__restrict__ hidden,
                                 const float *__restrict__ w2, int T, int heads) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= T * heads) return;
  const int t = e / heads, h = e % heads;
  const float *hid = hidden + (int64_t)t * CPB_HIDDEN, *w = w2 + (int64_t)h * CPB_HIDDEN;
  double out = 0.0;
  for (int j = 0; j < CPB_HIDDEN; j++) out += (double)hid[j] * w[j];
  table[e] = (float)(16.0 / (1.0 + exp(-out)));
}

// The sigmoid's gradient: dout = dtable table (1 - table / 16).
__device__ __forceinline__ double cpb_dout(const float *dtable, const float *table, int64_t e) {
  return (double)dtable[e] * table[e] * (1.0 - table[e] / 16.0);
}

// dw2[h][j] += sum over t in order of dout[t][h] hidden[t][j].
__global__ void cpb_dw2_kernel(float *__restrict__ dw2, const float *__restrict__ dtable,
                               const float *__restrict__ table, const float *__restrict__ hidden,
                               int T, int heads) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= heads * CPB_HIDDEN) return;
  const int h = e / CPB_HIDDEN, j = e % CPB_HIDDEN;
  double s = 0.0;
  for (int t = 0; t < T; t++)
    s += cpb_dout(dtable, table, (int64_t)t * heads + h) * hidden[(int64_t)t * CPB_HIDDEN + j];
  dw2[e] += (float)s;
}

// Block j: dhidden[t][j] = (dout[t] . w2[:, j]) (hidden > 0) over the rows t = tid + k *
// kCpbThreads, then dw1[j] += dhidden^T coords and db1[j] += sum dhidden, the block's threads
// added in a fixed tree.
__global__ void __launch_bounds__(kCpbThreads)
    cpb_dw1_kernel(float *__restrict__ dw1, float *__restrict__ db1,
                   const float *__restrict__ dtable, const float *__restrict__ table,
                   const float *__restrict__ hidden, const float *__restrict__ coords,
                   const float *__restrict__ w2, int T, int heads) {
  __shared__ double sums[3][kCpbThreads];
  const int j = blockIdx.x, tid = threadIdx.x;
  double a0 = 0.0, a1 = 0.0, ab = 0.0;
  for (int t = tid; t < T; t += kCpbThreads) {
    if (!(hidden[(int64_t)t * CPB_HIDDEN + j] > 0)) continue;
    double dh = 0.0;
    for (int h = 0; h < heads; h++)
      dh += cpb_dout(dtable, table, (int64_t)t * heads + h) * w2[(int64_t)h * CPB_HIDDEN + j];
    a0 += dh * coords[2 * t];
    a1 += dh * coords[2 * t + 1];
    ab += dh;
  }
  sums[0][tid] = a0;
  sums[1][tid] = a1;
  sums[2][tid] = ab;
  __syncthreads();
  for (int s = kCpbThreads / 2; s > 0; s >>= 1) {
    if (tid < s)
      for (int k = 0; k < 3; k++) sums[k][tid] += sums[k][tid + s];
    __syncthreads();
  }
  if (tid == 0) {
    dw1[2 * j] += (float)sums[0][0];
    dw1[2 * j + 1] += (float)sums[1][0];
    db1[j] += (float)sums[2][0];
  }
}

}  // namespace

void cosine_qk_forward_cuda(DType dt, void *qkv, float *norms, const float *q_bias,
                            const float *v_bias, const float *logit_scale, int64_t rows, int C,
                            int heads, cudaStream_t s) {
  check_shape("cosine_qk_forward_cuda", rows, C, heads);
  if (rows == 0) return;
  SWIN_DISPATCH(dt, T, {
    cosine_qk_forward_kernel<T><<<blocks_for(rows * heads, kWarps), kThreads, 0, s>>>(
        static_cast<T *>(qkv), norms, q_bias, v_bias, logit_scale, rows, C, heads);
  });
  CUDA_CHECK_LAUNCH();
}

int64_t cosine_qk_backward_cuda_scratch(int64_t rows, int C, int heads) {
  // l_partial (parts, heads), then q_partial and v_partial (parts, C) each
  return (int64_t)backward_parts(rows) * (heads + 2 * (int64_t)C);
}

void cosine_qk_backward_cuda(DType dt, void *dqkv, float *dq_bias, float *dv_bias,
                             float *dlogit_scale, const void *qkv, const float *norms,
                             const float *logit_scale, int64_t rows, int C, int heads,
                             float *scratch, cudaStream_t s) {
  check_shape("cosine_qk_backward_cuda", rows, C, heads);
  if (rows == 0) return;
  const int parts = backward_parts(rows), hd = C / heads;
  float *l_partial = scratch, *q_partial = l_partial + (int64_t)parts * heads;
  float *v_partial = q_partial + (int64_t)parts * C;
  const size_t smem = sizeof(float) * (size_t)(kWarps * (2 * hd + 1));
  SWIN_DISPATCH(dt, T, {
    cosine_qk_backward_kernel<T><<<dim3((unsigned)parts, (unsigned)heads), kThreads, smem, s>>>(
        static_cast<T *>(dqkv), q_partial, v_partial, l_partial, static_cast<const T *>(qkv), norms,
        logit_scale, rows, C, heads);
  });
  CUDA_CHECK_LAUNCH();
  if (dq_bias) column_partials_reduce_cuda(dq_bias, q_partial, parts, C, s);
  if (dv_bias) column_partials_reduce_cuda(dv_bias, v_partial, parts, C, s);
  if (dlogit_scale) column_partials_reduce_cuda(dlogit_scale, l_partial, parts, heads, s);
}

void cpb_forward_cuda(float *table, float *hidden, const float *coords, const float *w1,
                      const float *b1, const float *w2, int T, int heads, cudaStream_t s) {
  if (T <= 0 || heads <= 0) return;
  cpb_hidden_kernel<<<blocks_for((int64_t)T * CPB_HIDDEN, kCpbThreads), kCpbThreads, 0, s>>>(
      hidden, coords, w1, b1, T);
  CUDA_CHECK_LAUNCH();
  cpb_table_kernel<<<blocks_for((int64_t)T * heads, 128), 128, 0, s>>>(table, hidden, w2, T, heads);
  CUDA_CHECK_LAUNCH();
}

void cpb_backward_cuda(float *dw1, float *db1, float *dw2, const float *dtable, const float *table,
                       const float *hidden, const float *coords, const float *w2, int T, int heads,
                       cudaStream_t s) {
  if (T <= 0 || heads <= 0) return;
  cpb_dw2_kernel<<<blocks_for((int64_t)heads * CPB_HIDDEN, 128), 128, 0, s>>>(dw2, dtable, table,
                                                                              hidden, T, heads);
  CUDA_CHECK_LAUNCH();
  cpb_dw1_kernel<<<CPB_HIDDEN, kCpbThreads, 0, s>>>(dw1, db1, dtable, table, hidden, coords, w2, T,
                                                    heads);
  CUDA_CHECK_LAUNCH();
}
