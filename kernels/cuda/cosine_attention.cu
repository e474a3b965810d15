// cosine_attention.cu: CUDA scaled-cosine q, k and continuous position bias (the spec is
// kernels/cpu/cosine_attention.c; declared in kernels/cosine_attention.h).
//
// cosine q, k: a few lanes per (row, head) pair, enough for one 16-byte vector each of the head's
// channels where the layout allows (head_dim 32 in bf16: 4 lanes; else one element a lane over a
// warp), so a warp's accesses cover whole runs of a row and each element is read and written once
// from registers. The norms and dot products are f32 sums over each lane's channels, then the
// lanes' shuffle tree. (A warp per pair spent its time on per-pair overhead, a thread per pair on
// scattered accesses: kernels/PERF.md.) The backward's sums over rows go through fixed orders: the
// logit-scale gradient per block of 256 pairs (its pairs in order), then
// column_partials_reduce_cuda over the blocks (double); the q / v bias gradients are
// column_sums_cuda of dqkv as stored (as the attention's SIMT and flash paths sum theirs): the
// bits depend on the shapes only.
//
// CPB: the MLP is tiny (T <= 2209 rows, heads <= 48 at window 24), so simple kernels in double:
// a thread per hidden element and per table element (the same double sums, in the same order, as
// the CPU: hidden and out come out bitwise equal to it); the backward's dw2 a thread per (head,
// unit) over the rows in order, dw1 and db1 a block per hidden unit whose threads take fixed rows
// and add up in a fixed tree.
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <type_traits>

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

// Lanes a (row, head) pair takes for `vectors` vectors of its head: the smallest power of two
// covering them, at most a warp. Vector j of lane l covers channels (j * LANES + l) * VEC ...;
// a lane holds one vector, more only at 32 lanes (up to COSINE_CUDA_MAX_HEAD_DIM channels).
inline int pair_lanes(int vectors) {
  int lanes = 1;
  while (lanes < vectors && lanes < 32) lanes *= 2;
  return lanes;
}
template <int VEC, int LANES>
constexpr int kLaneVectors =
    LANES < 32 ? 1 : (COSINE_CUDA_MAX_HEAD_DIM + 32 * VEC - 1) / (32 * VEC);

// The (row, head) pair p's q in qkv (rows, 3C) (k and v follow at C and 2C), its row and head.
template <typename T>
__device__ __forceinline__ T *pair_q(T *qkv, int64_t p, int C, int heads, int64_t *r, int *h) {
  *r = p / heads;
  *h = (int)(p - *r * heads);
  return qkv + *r * 3 * C + (int64_t)*h * (C / heads);
}

// LANES lanes per (row, head) pair, each with its vectors of q (plus q_bias) and k in registers:
// the sums of squares in f32 (each lane's channels in order, then the group's shuffle tree), then
// q, k normalized (q times the logit multiplier) and v biased in place.
template <typename T, int VEC, int LANES>
__global__ void __launch_bounds__(kThreads)
    cosine_qk_forward_kernel(T *__restrict__ qkv, float *__restrict__ norms,
                             const float *__restrict__ q_bias, const float *__restrict__ v_bias,
                             const float *__restrict__ logit_scale, int64_t pairs, int C,
                             int heads) {
  constexpr int NV = kLaneVectors<VEC, LANES>;
  const int64_t g = (int64_t)blockIdx.x * kThreads + threadIdx.x, p = g / LANES;
  const int sl = (int)(g % LANES);
  const bool active = p < pairs;  // inactive lanes still take part in the shuffles
  int64_t r;
  int h;
  T *q = pair_q(qkv, active ? p : 0, C, heads, &r, &h), *k = q + C, *v = k + C;
  const int hd = C / heads, c0 = h * hd;
  float a[NV][VEC], b[NV][VEC];
  float sq = 0.0f, sk = 0.0f;
#pragma unroll
  for (int j = 0; j < NV; j++) {
    const int d = (j * LANES + sl) * VEC;
    if (d >= hd) continue;
    load_vec<T, VEC>(a[j], q + d);
    load_vec<T, VEC>(b[j], k + d);
    if (q_bias) {
      float qb[VEC];
      load_vec<float, VEC>(qb, q_bias + c0 + d);
#pragma unroll
      for (int i = 0; i < VEC; i++) a[j][i] += qb[i];
    }
#pragma unroll
    for (int i = 0; i < VEC; i++) {
      sq += a[j][i] * a[j][i];
      sk += b[j][i] * b[j][i];
    }
  }
  const float nq = sqrtf(group_sum<LANES>(sq)), nk = sqrtf(group_sum<LANES>(sk));
  if (!active) return;
  const float mul = logit_multiplier(logit_scale[h]);
  const float dq = fmaxf(nq, COSINE_NORM_EPS), dk = fmaxf(nk, COSINE_NORM_EPS);
#pragma unroll
  for (int j = 0; j < NV; j++) {
    const int d = (j * LANES + sl) * VEC;
    if (d >= hd) continue;
#pragma unroll
    for (int i = 0; i < VEC; i++) {
      a[j][i] = a[j][i] / dq * mul;
      b[j][i] = b[j][i] / dk;
    }
    store_vec<T, VEC>(q + d, a[j]);
    store_vec<T, VEC>(k + d, b[j]);
    if (v_bias) {
      float c[VEC], vb[VEC];
      load_vec<T, VEC>(c, v + d);
      load_vec<float, VEC>(vb, v_bias + c0 + d);
#pragma unroll
      for (int i = 0; i < VEC; i++) c[i] += vb[i];
      store_vec<T, VEC>(v + d, c);
    }
  }
  if (sl == 0) {
    norms[(r * 2 + 0) * heads + h] = nq;
    norms[(r * 2 + 1) * heads + h] = nk;
  }
}

// The gradient of x from that of y = x / max(|x|, eps) * mul, y as saved, dot = y . dy:
// (dy mul - y / mul dot) / |x|, or dy mul / eps where |x| <= eps.
__device__ __forceinline__ float normalize_backward(float dy, float y, float dot, float norm,
                                                    float mul) {
  return norm > COSINE_NORM_EPS ? (dy * mul - y / mul * dot) / norm : dy * mul / COSINE_NORM_EPS;
}

// Block b owns pairs [256 b, 256 b + 256), LANES lanes a pair, 256 / LANES pairs at a time: dq,
// dk in place on dqkv (dv is the incoming gradient as it is), from q', dq', k', dk' in registers
// and their dot products (f32, each lane's channels in order, then the group's shuffle tree). The
// block's sums of q' . dq' per head, its pairs added in order, go to l_partial (blocks, heads): 0
// where the clamp passes no gradient.
template <typename T, int VEC, int LANES>
__global__ void __launch_bounds__(kThreads)
    cosine_qk_backward_kernel(T *__restrict__ dqkv, float *__restrict__ l_partial,
                              const T *__restrict__ qkv, const float *__restrict__ norms,
                              const float *__restrict__ logit_scale, int64_t pairs, int C,
                              int heads) {
  constexpr int NV = kLaneVectors<VEC, LANES>, kPairsAtOnce = kThreads / LANES;
  __shared__ float dots[kThreads];
  const int64_t p0 = (int64_t)blockIdx.x * kThreads;
  const int sl = threadIdx.x % LANES, hd = C / heads;
  for (int it = 0; it < LANES; it++) {
    const int local = it * kPairsAtOnce + threadIdx.x / LANES;
    const int64_t p = p0 + local;
    const bool active = p < pairs;  // inactive lanes still take part in the shuffles
    int64_t r;
    int h;
    T *dq = pair_q(dqkv, active ? p : 0, C, heads, &r, &h), *dk = dq + C;
    const T *q = qkv + (dq - dqkv), *k = q + C;
    float y[NV][VEC], gy[NV][VEC], z[NV][VEC], gz[NV][VEC];
    float dot_q = 0.0f, dot_k = 0.0f;
#pragma unroll
    for (int j = 0; j < NV; j++) {
      const int d = (j * LANES + sl) * VEC;
      if (d >= hd) continue;
      load_vec<T, VEC>(y[j], q + d);
      load_vec<T, VEC>(gy[j], dq + d);
      load_vec<T, VEC>(z[j], k + d);
      load_vec<T, VEC>(gz[j], dk + d);
#pragma unroll
      for (int i = 0; i < VEC; i++) {
        dot_q += y[j][i] * gy[j][i];
        dot_k += z[j][i] * gz[j][i];
      }
    }
    dot_q = group_sum<LANES>(dot_q);
    dot_k = group_sum<LANES>(dot_k);
    if (sl == 0) dots[local] = active ? dot_q : 0.0f;
    if (!active) continue;
    const float mul = logit_multiplier(logit_scale[h]);
    const float nq = norms[(r * 2 + 0) * heads + h], nk = norms[(r * 2 + 1) * heads + h];
#pragma unroll
    for (int j = 0; j < NV; j++) {
      const int d = (j * LANES + sl) * VEC;
      if (d >= hd) continue;
#pragma unroll
      for (int i = 0; i < VEC; i++) {
        gy[j][i] = normalize_backward(gy[j][i], y[j][i], dot_q, nq, mul);
        gz[j][i] = normalize_backward(gz[j][i], z[j][i], dot_k, nk, 1.0f);
      }
      store_vec<T, VEC>(dq + d, gy[j]);
      store_vec<T, VEC>(dk + d, gz[j]);
    }
  }
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

// 16-byte accesses when every head's channels start 16-byte aligned in rows of 3C, and so do
// the biases (VEC floats at a time).
template <typename T>
bool vec16_ok(std::initializer_list<const void *> ptrs, int C, int heads) {
  const int v = kVec16<T>;
  bool ok = (C / heads) % v == 0 && (3 * C) % v == 0;
  for (const void *p : ptrs) ok = ok && ((uintptr_t)p % 16) == 0;
  return ok;
}

// Calls f(integral_constant<VEC>, integral_constant<LANES>) for the pair layout: 16-byte vectors
// over the lanes pair_lanes gives them where vec16_ok holds, else one element a lane over a warp.
template <typename T, typename F>
void with_pair_layout(bool vec16, int hd, F f) {
  using std::integral_constant;
  constexpr int V = kVec16<T>;
  if (!vec16) return f(integral_constant<int, 1>{}, integral_constant<int, 32>{});
  switch (pair_lanes(hd / V)) {
    case 1: return f(integral_constant<int, V>{}, integral_constant<int, 1>{});
    case 2: return f(integral_constant<int, V>{}, integral_constant<int, 2>{});
    case 4: return f(integral_constant<int, V>{}, integral_constant<int, 4>{});
    case 8: return f(integral_constant<int, V>{}, integral_constant<int, 8>{});
    case 16: return f(integral_constant<int, V>{}, integral_constant<int, 16>{});
    default: return f(integral_constant<int, V>{}, integral_constant<int, 32>{});
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
  const int64_t pairs = rows * heads;
  SWIN_DISPATCH(dt, T, {
    T *x = static_cast<T *>(qkv);
    const bool vec16 = vec16_ok<T>({qkv, q_bias, v_bias}, C, heads);
    with_pair_layout<T>(vec16, C / heads, [&](auto VEC, auto LANES) {
      constexpr int kV = decltype(VEC)::value, kL = decltype(LANES)::value;
      cosine_qk_forward_kernel<T, kV, kL><<<blocks_for(pairs * kL, kThreads), kThreads, 0, s>>>(
          x, norms, q_bias, v_bias, logit_scale, pairs, C, heads);
    });
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
    with_pair_layout<T>(vec16_ok<T>({dqkv, qkv}, C, heads), C / heads, [&](auto VEC, auto LANES) {
      constexpr int kV = decltype(VEC)::value, kL = decltype(LANES)::value;
      cosine_qk_backward_kernel<T, kV, kL><<<(unsigned)blocks, kThreads, 0, s>>>(
          d, l_partial, x, norms, logit_scale, pairs, C, heads);
    });
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
