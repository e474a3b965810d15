// cosine_attention.cu: CUDA scaled-cosine q, k and continuous position bias (the spec is
// kernels/cpu/cosine_attention.c; declared in kernels/cosine_attention.h).
//
// cosine q, k: a thread per (row, head), its channels read 16 bytes at a time where the layout
// allows, the norms and dot products summed in f32 over the channels in order (a warp per pair
// spent its time on per-pair overhead: 27 ms of a 54 ms Swin V2-T step, kernels/PERF.md). The
// backward's sums over rows go through fixed orders: the logit-scale gradient per block of 256
// pairs (its threads in order), then column_partials_reduce_cuda over the blocks (double); the
// q / v bias gradients are column_sums_cuda of dqkv as stored (as the attention's SIMT and flash
// paths sum theirs): the bits depend on the shapes only.
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

constexpr int kThreads = 256;  // (row, head) pairs per block of the cosine kernels
constexpr int kCpbThreads = 256;

void check_shape(const char *fn, int64_t rows, int C, int heads) {
  if (rows >= 0 && heads >= 1 && heads <= kThreads && C >= heads && C % heads == 0 &&
      C / heads <= COSINE_CUDA_MAX_HEAD_DIM)
    return;
  fprintf(stderr,
          "%s (%s:%d): unsupported shape rows=%lld C=%d heads=%d (need C %% heads == 0, "
          "C / heads <= %d, heads <= %d)\n"
          "HINT: use at most %d channels per head\n",
          fn, __FILE__, __LINE__, (long long)rows, C, heads, COSINE_CUDA_MAX_HEAD_DIM, kThreads,
          COSINE_CUDA_MAX_HEAD_DIM);
  abort();
}

// exp(min(l, ln 100)) rounded once, as the CPU computes it.
__device__ __forceinline__ float logit_multiplier(float logit_scale) {
  return (float)exp((double)fminf(logit_scale, COSINE_LOGIT_MAX));
}

// The (row, head) pair of thread p, and its q (k, v follow at C and 2C) in qkv (rows, 3C).
template <typename T>
__device__ __forceinline__ T *pair_q(T *qkv, int64_t p, int C, int heads, int64_t *r, int *h) {
  *r = p / heads;
  *h = (int)(p - *r * heads);
  return qkv + *r * 3 * C + (int64_t)*h * (C / heads);
}

// A thread per (row, head), VEC channels per access: the sums of squares in f32 over the
// channels in order, then q, k normalized (q times the logit multiplier) and v biased in place.
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads)
    cosine_qk_forward_kernel(T *__restrict__ qkv, float *__restrict__ norms,
                             const float *__restrict__ q_bias, const float *__restrict__ v_bias,
                             const float *__restrict__ logit_scale, int64_t pairs, int C,
                             int heads) {
  const int64_t p = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  if (p >= pairs) return;
  int64_t r;
  int h;
  T *q = pair_q(qkv, p, C, heads, &r, &h), *k = q + C, *v = k + C;
  const int hd = C / heads, c0 = h * hd;
  float sq = 0.0f, sk = 0.0f;
  for (int d = 0; d < hd; d += VEC) {
    float a[VEC], b[VEC];
    load_vec<T, VEC>(a, q + d);
    load_vec<T, VEC>(b, k + d);
#pragma unroll
    for (int i = 0; i < VEC; i++) {
      const float x = a[i] + (q_bias ? q_bias[c0 + d + i] : 0.0f);
      sq += x * x;
      sk += b[i] * b[i];
    }
  }
  const float nq = sqrtf(sq), nk = sqrtf(sk), mul = logit_multiplier(logit_scale[h]);
  const float dq = fmaxf(nq, COSINE_NORM_EPS), dk = fmaxf(nk, COSINE_NORM_EPS);
  for (int d = 0; d < hd; d += VEC) {
    float a[VEC], b[VEC];
    load_vec<T, VEC>(a, q + d);
    load_vec<T, VEC>(b, k + d);
#pragma unroll
    for (int i = 0; i < VEC; i++) {
      a[i] = (a[i] + (q_bias ? q_bias[c0 + d + i] : 0.0f)) / dq * mul;
      b[i] = b[i] / dk;
    }
    store_vec<T, VEC>(q + d, a);
    store_vec<T, VEC>(k + d, b);
    if (v_bias) {
      float c[VEC];
      load_vec<T, VEC>(c, v + d);
#pragma unroll
      for (int i = 0; i < VEC; i++) c[i] += v_bias[c0 + d + i];
      store_vec<T, VEC>(v + d, c);
    }
  }
  norms[(r * 2 + 0) * heads + h] = nq;
  norms[(r * 2 + 1) * heads + h] = nk;
}

// y . dy over the head's channels (f32, in order), y and dy as stored.
template <typename T, int VEC>
__device__ __forceinline__ float head_dot(const T *y, const T *dy, int hd) {
  float dot = 0.0f;
  for (int d = 0; d < hd; d += VEC) {
    float a[VEC], b[VEC];
    load_vec<T, VEC>(a, y + d);
    load_vec<T, VEC>(b, dy + d);
#pragma unroll
    for (int i = 0; i < VEC; i++) dot += a[i] * b[i];
  }
  return dot;
}

// dy (in place) <- the gradient of x from that of y = x / max(|x|, eps) * mul, y as saved:
// (dy mul - y / mul (y . dy)) / |x|, or dy mul / eps where |x| <= eps.
template <typename T, int VEC>
__device__ __forceinline__ void normalize_backward(T *dy, const T *y, float dot, float norm,
                                                   float mul, int hd) {
  for (int d = 0; d < hd; d += VEC) {
    float g[VEC], a[VEC];
    load_vec<T, VEC>(g, dy + d);
    load_vec<T, VEC>(a, y + d);
#pragma unroll
    for (int i = 0; i < VEC; i++)
      g[i] = norm > COSINE_NORM_EPS ? (g[i] * mul - a[i] / mul * dot) / norm
                                    : g[i] * mul / COSINE_NORM_EPS;
    store_vec<T, VEC>(dy + d, g);
  }
}

// A thread per (row, head): dq, dk in place on dqkv (dv is the incoming gradient as it is); the
// block's sums of q' . dq' per head, its threads added in order, to l_partial (blocks, heads): 0
// where the clamp passes no gradient.
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads)
    cosine_qk_backward_kernel(T *__restrict__ dqkv, float *__restrict__ l_partial,
                              const T *__restrict__ qkv, const float *__restrict__ norms,
                              const float *__restrict__ logit_scale, int64_t pairs, int C,
                              int heads) {
  __shared__ float dots[kThreads];
  const int64_t p0 = (int64_t)blockIdx.x * kThreads, p = p0 + threadIdx.x;
  float dot_q = 0.0f;
  if (p < pairs) {
    int64_t r;
    int h;
    T *dq = pair_q(dqkv, p, C, heads, &r, &h), *dk = dq + C;
    const T *q = qkv + (dq - dqkv), *k = q + C;
    const int hd = C / heads;
    const float mul = logit_multiplier(logit_scale[h]);
    dot_q = head_dot<T, VEC>(q, dq, hd);
    const float dot_k = head_dot<T, VEC>(k, dk, hd);
    normalize_backward<T, VEC>(dq, q, dot_q, norms[(r * 2 + 0) * heads + h], mul, hd);
    normalize_backward<T, VEC>(dk, k, dot_k, norms[(r * 2 + 1) * heads + h], 1.0f, hd);
  }
  dots[threadIdx.x] = dot_q;
  __syncthreads();
  if (threadIdx.x < heads) {  // head h: the block's pairs p0 + t with (p0 + t) % heads == h
    const int h = (int)threadIdx.x;
    int t = (int)(((h - p0 % heads) % heads + heads) % heads);
    float sum = 0.0f;
    for (; t < kThreads && p0 + t < pairs; t += heads) sum += dots[t];
    l_partial[(int64_t)blockIdx.x * heads + h] = logit_scale[h] <= COSINE_LOGIT_MAX ? sum : 0.0f;
  }
}

// out_q (C) += sums[0, C), out_v (C) += sums[2C, 3C): the q and v parts of dqkv's column sums.
__global__ void add_qv_columns(float *__restrict__ out_q, float *__restrict__ out_v,
                               const float *__restrict__ sums, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  if (out_q) out_q[c] += sums[c];
  if (out_v) out_v[c] += sums[2 * C + c];
}

// 16-byte accesses when every head's channels start 16-byte aligned in rows of 3C.
template <typename T>
bool vec16_ok(const void *qkv, int C, int heads) {
  const int v = kVec16<T>;
  return (C / heads) % v == 0 && (3 * C) % v == 0 && ((uintptr_t)qkv % 16) == 0;
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
  const int64_t pairs = rows * heads;
  SWIN_DISPATCH(dt, T, {
    T *x = static_cast<T *>(qkv);
    if (vec16_ok<T>(qkv, C, heads))
      cosine_qk_forward_kernel<T, kVec16<T>><<<blocks_for(pairs, kThreads), kThreads, 0, s>>>(
          x, norms, q_bias, v_bias, logit_scale, pairs, C, heads);
    else
      cosine_qk_forward_kernel<T, 1><<<blocks_for(pairs, kThreads), kThreads, 0, s>>>(
          x, norms, q_bias, v_bias, logit_scale, pairs, C, heads);
  });
  CUDA_CHECK_LAUNCH();
}

int64_t cosine_qk_backward_cuda_scratch(int64_t rows, int C, int heads) {
  // l_partial (blocks, heads); dqkv's column sums (3C) and their partials
  const int64_t blocks = (rows * heads + kThreads - 1) / kThreads;
  return blocks * heads + 3 * (int64_t)C + column_sums_cuda_scratch(rows, 3 * C);
}

void cosine_qk_backward_cuda(DType dt, void *dqkv, float *dq_bias, float *dv_bias,
                             float *dlogit_scale, const void *qkv, const float *norms,
                             const float *logit_scale, int64_t rows, int C, int heads,
                             float *scratch, cudaStream_t s) {
  check_shape("cosine_qk_backward_cuda", rows, C, heads);
  if (rows == 0) return;
  const int64_t pairs = rows * heads, blocks = (pairs + kThreads - 1) / kThreads;
  float *l_partial = scratch, *sums = l_partial + blocks * heads, *partials = sums + 3 * C;
  SWIN_DISPATCH(dt, T, {
    T *d = static_cast<T *>(dqkv);
    const T *x = static_cast<const T *>(qkv);
    if (vec16_ok<T>(dqkv, C, heads) && vec16_ok<T>(qkv, C, heads))
      cosine_qk_backward_kernel<T, kVec16<T>><<<(unsigned)blocks, kThreads, 0, s>>>(
          d, l_partial, x, norms, logit_scale, pairs, C, heads);
    else
      cosine_qk_backward_kernel<T, 1><<<(unsigned)blocks, kThreads, 0, s>>>(
          d, l_partial, x, norms, logit_scale, pairs, C, heads);
  });
  CUDA_CHECK_LAUNCH();
  if (dq_bias || dv_bias) {  // the column sums of dq and dv as stored, in a fixed order
    CUDA_CHECK(cudaMemsetAsync(sums, 0, sizeof(float) * 3 * (size_t)C, s));
    column_sums_cuda(dt, sums, dqkv, rows, 3 * C, partials, s);
    add_qv_columns<<<blocks_for(C, 128), 128, 0, s>>>(dq_bias, dv_bias, sums, C);
    CUDA_CHECK_LAUNCH();
  }
  if (dlogit_scale) column_partials_reduce_cuda(dlogit_scale, l_partial, blocks, heads, s);
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
