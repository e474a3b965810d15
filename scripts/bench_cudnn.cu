// bench_cudnn.cu: cuDNN 9 against our kernels on Swin-T's shapes at batch 128, bf16 activations
// (kernels/PERF.md): does cuDNN win anywhere, with its LayerNorm engines or its fusions? cuDNN is
// driven through its backend graph API alone (cudnn_graph.h): each row builds an operation graph,
// takes the first engine config of heuristics mode A (else FALLBACK) that finalizes into an
// execution plan, and times that plan. Four tables:
// 1. ln: LayerNorm forward, training (y bf16; mean, rstd f32; eps 1e-5) on each stage's (M, C):
//    residual_layernorm_forward_cuda without a branch against a NORM_FORWARD graph, whose scale
//    and bias are f32 (as ours) in one row and bf16 in the next: cuDNN offers other engines for
//    each. The parameters' values are exact in bf16, so both compute the same. TB/s = the bytes
//    read and written (x, y, mean, rstd, scale, bias) / time.
// 2. ln_bwd: the LayerNorm backward from a random x, dy and the saved statistics (dx bf16;
//    dscale, dbias f32 in ours, of the scale's type in cuDNN's two rows):
//    residual_layernorm_backward_cuda (dln given, dbranch = dx, no residual gradient) against a
//    NORM_BACKWARD graph. cuDNN overwrites dscale and dbias where ours adds to them; the traffic
//    is the same.
// 3. gelu: the MLP's fc1, pre (M, 4C) = x (M, C) W^T + b and post = GELU(pre), the exact (erf)
//    GELU, both stored (our backward reads pre): linear_forward_cuda (cuBLASLt) +
//    gelu_forward_cuda, and our fused kernels (linear_small_k_forward_cuda in stage 0,
//    linear_hopper_forward_cuda in stages 1-3, where they serve the shape), against MATMUL -> ADD
//    bias -> GELU_FWD. Before the table, the same graph with f32 outputs on a small shape tells
//    whether cuDNN's GELU_FWD is the erf form or the tanh one (cudnn_graph.h does not say).
// 4. prologue: LayerNorm as the product's prologue, out = LN(x) W^T + b, on stages 1 and 2's qkv
//    and fc1: residual_layernorm_forward_cuda + linear_forward_cuda against (x - mean) * rstd *
//    gamma + beta as four POINTWISE ops on the MATMUL's A, then ADD bias. cuDNN is handed mean and
//    rstd, a pass over x that ours includes, so its time is a lower bound on the fusion's.
// Each time is the median of 20 runs, each between its own pair of events, after 3 warm-ups.
// Inputs are fixed-seed random values made on the host; every output is poisoned (NaN) before a
// side's first run. rel err = max |cuDNN - ours| / max |ours| over a tensor (inf where either holds
// a non-finite value). ours / cuDNN > 1: cuDNN is faster. Where cuDNN refuses a graph, the row
// names the cudnnStatus_t and the step that failed, cuDNN's own message follows the table, and the
// table goes on.
//
// Build: cmake --build build-gpu --target bench_cudnn (CUDA builds where CMake finds cuDNN). Run:
// build-gpu/bench_cudnn [ln] [ln_bwd] [gelu] [prologue] (all when none is named); it exits 77
// without a GPU.
#include <cuda_bf16.h>
#include <cudnn_graph.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/gelu.h"
#include "kernels/gemm.h"
#include "kernels/layernorm.h"
#include "scripts/bench_common.cuh"
#include "src/base/cuda_util.h"

namespace {

using bench::kRepeats;
using bench::kWarmups;
using bench::median_us;
using bench::tb_per_s;
constexpr int kBatch = 128, kStages = 4;

// Swin-T: stage s has 56 x 56 / 4^s tokens an image and 96 x 2^s channels.
int64_t stage_tokens(int s) {
  return (int64_t)kBatch * ((56 * 56) >> (2 * s));
}
int stage_channels(int s) {
  return 96 << s;
}

// ---- Text: table rows and notes, built by appending ---------------------------------------------

void append(char *buf, size_t size, const char *fmt, ...) {
  const size_t len = strlen(buf);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf + len, size - len, fmt, ap);
  va_end(ap);
}

// One number cell, "-" for NAN (not measured).
void add_num(char *buf, size_t size, const char *fmt, double v) {
  if (std::isnan(v))
    append(buf, size, " - |");
  else
    append(buf, size, fmt, v);
}

// ---- Device memory ------------------------------------------------------------------------------

// A row's device buffers, freed together.
struct Buffers {
  std::vector<void *> ptrs;
};

void *device_alloc(Buffers *b, size_t bytes) {
  void *p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, bytes));
  b->ptrs.push_back(p);
  return p;
}

// An output: all bits set (NaN in bf16 and f32), so that an element nobody writes shows in rel err.
void *output_alloc(Buffers *b, size_t bytes) {
  void *p = device_alloc(b, bytes);
  CUDA_CHECK(cudaMemset(p, 0xFF, bytes));
  return p;
}

void buffers_free(Buffers *b) {
  for (void *p : b->ptrs) CUDA_CHECK(cudaFree(p));
  b->ptrs.clear();
}

// Uniform values in [lo, hi) from a fixed seed (splitmix64), made on the host.
float next_uniform(uint64_t *state, float lo, float hi) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return lo + (hi - lo) * (float)(z >> 40) * (1.0f / 16777216.0f);
}

void *random_bf16(Buffers *b, int64_t n, uint64_t seed, float lo, float hi) {
  std::vector<__nv_bfloat16> h((size_t)n);
  for (__nv_bfloat16 &v : h) v = __float2bfloat16_rn(next_uniform(&seed, lo, hi));
  void *d = device_alloc(b, h.size() * sizeof h[0]);
  CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof h[0], cudaMemcpyHostToDevice));
  return d;
}

// LayerNorm parameters: values exact in bf16, uploaded as f32 (ours) and as bf16.
struct Param {
  float *f32;
  void *bf16;
};

Param random_param(Buffers *b, int64_t n, uint64_t seed, float lo, float hi) {
  std::vector<float> h((size_t)n);
  std::vector<__nv_bfloat16> hb((size_t)n);
  for (size_t i = 0; i < h.size(); i++) {
    hb[i] = __float2bfloat16_rn(next_uniform(&seed, lo, hi));
    h[i] = __bfloat162float(hb[i]);
  }
  Param p = {(float *)device_alloc(b, h.size() * sizeof h[0]),
             device_alloc(b, hb.size() * sizeof hb[0])};
  CUDA_CHECK(cudaMemcpy(p.f32, h.data(), h.size() * sizeof h[0], cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(p.bf16, hb.data(), hb.size() * sizeof hb[0], cudaMemcpyHostToDevice));
  return p;
}

float *random_f32(Buffers *b, int64_t n, uint64_t seed, float lo, float hi) {
  std::vector<float> h((size_t)n);
  for (float &v : h) v = next_uniform(&seed, lo, hi);
  void *d = device_alloc(b, h.size() * sizeof h[0]);
  CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof h[0], cudaMemcpyHostToDevice));
  return (float *)d;
}

// ---- Timing and comparison ----------------------------------------------------------------------

__device__ float to_f32(float v) {
  return v;
}
__device__ float to_f32(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

// out[0] = max |a - b|, out[1] = max |b|; a NaN or inf counts as inf (fmaxf would skip a NaN).
template <typename TA, typename TB>
__global__ void max_diff_kernel(const TA *a, const TB *b, int64_t n, float *out) {
  float d = 0.0f, m = 0.0f;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const float x = to_f32(a[i]), y = to_f32(b[i]);
    const float e = fabsf(x - y), r = fabsf(y);
    d = fmaxf(d, e <= FLT_MAX ? e : INFINITY);
    m = fmaxf(m, r <= FLT_MAX ? r : INFINITY);
  }
  atomicMax((int *)&out[0], __float_as_int(d));  // non-negative floats order as ints
  atomicMax((int *)&out[1], __float_as_int(m));
}

// What every table shares: the stream everything runs on, cuDNN's handle (on that stream), our
// cuBLASLt context, and 2 floats for max_diff_kernel.
struct Bench {
  cudaStream_t stream;
  cudnnHandle_t cudnn;
  GemmContext *gemm;
  float *diff;
};

// max |a - ref| / max |ref| over n elements, a of type TA, ref of type TB (device pointers).
template <typename TA, typename TB = TA>
double rel_err(Bench *b, const void *a, const void *ref, int64_t n) {
  CUDA_CHECK(cudaMemsetAsync(b->diff, 0, 2 * sizeof(float), b->stream));
  max_diff_kernel<TA, TB><<<264, 256, 0, b->stream>>>((const TA *)a, (const TB *)ref, n, b->diff);
  CUDA_CHECK_LAUNCH();
  float h[2];
  CUDA_CHECK(cudaMemcpyAsync(h, b->diff, sizeof h, cudaMemcpyDeviceToHost, b->stream));
  CUDA_CHECK(cudaStreamSynchronize(b->stream));
  if (std::isinf(h[0]) || std::isinf(h[1])) return INFINITY;
  return h[0] / (h[1] > 0 ? h[1] : 1.0f);
}

// ---- cuDNN graphs -------------------------------------------------------------------------------

// The status's name, from the library itself (its list grows from version to version).
const char *status_name(cudnnStatus_t s) {
  return cudnnGetErrorString(s);
}

// The first step of a graph that failed: its status, the step, and cuDNN's own message.
struct Failure {
  cudnnStatus_t status;
  char step[256];
  char message[1024];
};

void record(Failure *f, cudnnStatus_t status, const char *fmt, ...) {
  f->status = status;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(f->step, sizeof f->step, fmt, ap);
  va_end(ap);
  cudnnGetLastErrorString(f->message, sizeof f->message);
}

enum TensorKind { kDevice, kVirtual, kByValue };

// One cuDNN graph: every descriptor it made (destroyed together, in reverse), its operations, the
// data of its non-virtual tensors by unique id, and once built its plan, workspace and variant
// pack. The builders below do nothing once a step has failed; the row then prints the failure.
struct Graph {
  cudnnHandle_t handle = nullptr;
  std::vector<cudnnBackendDescriptor_t> owned, ops;
  std::vector<int64_t> uids;
  std::vector<void *> data;
  cudnnBackendDescriptor_t plan = nullptr, pack = nullptr;
  void *workspace = nullptr;
  int64_t engine = -1;   // CUDNN_ATTR_ENGINE_GLOBAL_INDEX of the plan's engine (-1: not known)
  char config[96] = "";  // heuristics mode, the config's rank among its results, engine notes
  Failure fail = {};     // status CUDNN_STATUS_SUCCESS while no step has failed
};

bool failed(const Graph *g) {
  return g->fail.status != CUDNN_STATUS_SUCCESS;
}

// Records a failed call as the graph's failure; true when s is success.
bool check(Graph *g, cudnnStatus_t s, const char *what, const char *step) {
  if (s != CUDNN_STATUS_SUCCESS) record(&g->fail, s, "%s: %s", what, step);
  return s == CUDNN_STATUS_SUCCESS;
}

cudnnBackendDescriptor_t make(Graph *g, cudnnBackendDescriptorType_t type, const char *what) {
  cudnnBackendDescriptor_t d = nullptr;
  if (failed(g) || !check(g, cudnnBackendCreateDescriptor(type, &d), what, "create"))
    return nullptr;
  g->owned.push_back(d);
  return d;
}

void set_attr(Graph *g, const char *what, cudnnBackendDescriptor_t d,
              cudnnBackendAttributeName_t attr, cudnnBackendAttributeType_t type, int64_t count,
              const void *value, const char *attr_name) {
  if (!failed(g)) check(g, cudnnBackendSetAttribute(d, attr, type, count, value), what, attr_name);
}
// The attribute's name is the step's.
#define SET(g, what, d, attr, type, count, value) \
  set_attr(g, what, d, attr, type, count, value, #attr)

void finalize(Graph *g, const char *what, cudnnBackendDescriptor_t d) {
  if (!failed(g)) check(g, cudnnBackendFinalize(d), what, "finalize");
}

void add_op(Graph *g, cudnnBackendDescriptor_t op) {
  if (!failed(g)) g->ops.push_back(op);
}

// A tensor: dims and strides in elements, 16-byte aligned data; a kDevice tensor is bound to
// data (a device pointer) and a kByValue one to a host scalar, under a fresh unique id.
cudnnBackendDescriptor_t tensor(Graph *g, const char *name, cudnnDataType_t dt, int rank,
                                const int64_t *dims, const int64_t *strides, TensorKind kind,
                                void *data) {
  char what[64];
  snprintf(what, sizeof what, "tensor %s", name);
  cudnnBackendDescriptor_t t = make(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, what);
  const int64_t uid = (int64_t)g->owned.size(), alignment = 16;  // one id per descriptor made
  const bool is_virtual = kind == kVirtual, by_value = kind == kByValue;
  SET(g, what, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
  SET(g, what, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, rank, dims);
  SET(g, what, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, rank, strides);
  SET(g, what, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
  SET(g, what, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
  SET(g, what, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
  if (by_value) SET(g, what, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
  finalize(g, what, t);
  if (!failed(g) && !is_virtual) {
    g->uids.push_back(uid);
    g->data.push_back(data);
  }
  return t;
}

// A row-major (rows, cols) tensor as the normalizations take it, (rows, cols, 1, 1): statistics
// over all dimensions but the first. Scale and bias are (1, C), the statistics (M, 1), epsilon
// (1, 1).
cudnnBackendDescriptor_t norm_tensor(Graph *g, const char *name, cudnnDataType_t dt, int64_t rows,
                                     int64_t cols, TensorKind kind, void *data) {
  const int64_t dims[4] = {rows, cols, 1, 1}, strides[4] = {cols, 1, cols, cols};
  return tensor(g, name, dt, 4, dims, strides, kind, data);
}

// A (rows, cols) matrix as the matmul takes it, (1, rows, cols), element (r, c) at
// r * row_stride + c * col_stride: a row-major (N, K) weight read as (K, N) has strides (1, K).
// Broadcast operands have a dimension of 1: a bias (1, N), per-row statistics (M, 1).
cudnnBackendDescriptor_t matrix(Graph *g, const char *name, cudnnDataType_t dt, int64_t rows,
                                int64_t cols, int64_t row_stride, int64_t col_stride,
                                TensorKind kind, void *data) {
  const int64_t dims[3] = {1, rows, cols}, strides[3] = {rows * cols, row_stride, col_stride};
  return tensor(g, name, dt, 3, dims, strides, kind, data);
}

// y = mode(x) or mode(x, b), computed in f32.
void pointwise(Graph *g, const char *name, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
               cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t y) {
  char what[64];
  snprintf(what, sizeof what, "pointwise %s", name);
  const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
  cudnnBackendDescriptor_t pw = make(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, what);
  SET(g, what, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
  SET(g, what, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
  finalize(g, what, pw);
  cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, what);
  const cudnnBackendAttributeType_t desc = CUDNN_TYPE_BACKEND_DESCRIPTOR;
  SET(g, what, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, desc, 1, &pw);
  SET(g, what, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, desc, 1, &x);
  if (b) SET(g, what, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, desc, 1, &b);
  SET(g, what, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, desc, 1, &y);
  finalize(g, what, op);
  add_op(g, op);
}

// c = a b, accumulated in f32.
void matmul(Graph *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
            cudnnBackendDescriptor_t c) {
  const char *what = "matmul";
  const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
  cudnnBackendDescriptor_t mm = make(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR, what);
  SET(g, what, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
  finalize(g, what, mm);
  cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, what);
  const cudnnBackendAttributeType_t desc = CUDNN_TYPE_BACKEND_DESCRIPTOR;
  SET(g, what, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, desc, 1, &a);
  SET(g, what, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, desc, 1, &b);
  SET(g, what, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, desc, 1, &c);
  SET(g, what, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, desc, 1, &mm);
  finalize(g, what, op);
  add_op(g, op);
}

// LayerNorm forward, training: y, mean and inv_variance (1 / sqrt(var + eps), our rstd) from x.
void layernorm_forward(Graph *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t scale,
                       cudnnBackendDescriptor_t bias, cudnnBackendDescriptor_t eps,
                       cudnnBackendDescriptor_t y, cudnnBackendDescriptor_t mean,
                       cudnnBackendDescriptor_t inv_variance) {
  const char *what = "norm forward";
  const cudnnBackendNormMode_t mode = CUDNN_LAYER_NORM;
  const cudnnBackendNormFwdPhase_t phase = CUDNN_NORM_FWD_TRAINING;
  const cudnnBackendAttributeType_t desc = CUDNN_TYPE_BACKEND_DESCRIPTOR;
  cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR, what);
  SET(g, what, op, CUDNN_ATTR_OPERATION_NORM_FWD_MODE, CUDNN_TYPE_NORM_MODE, 1, &mode);
  SET(g, what, op, CUDNN_ATTR_OPERATION_NORM_FWD_PHASE, CUDNN_TYPE_NORM_FWD_PHASE, 1, &phase);
  SET(g, what, op, CUDNN_ATTR_OPERATION_NORM_FWD_XDESC, desc, 1, &x);
  SET(g, what, op, CUDNN_ATTR_OPERATION_NORM_FWD_SCALE_DESC, desc, 1, &scale);
  SET(g, what, op, CUDNN_ATTR_OPERATION_NORM_FWD_BIAS_DESC, desc, 1, &bias);
  SET(g, what, op, CUDNN_ATTR_OPERATION_NORM_FWD_EPSILON_DESC, desc, 1, &eps);
  SET(g, what, op, CUDNN_ATTR_OPERATION_NORM_FWD_YDESC, desc, 1, &y);
  SET(g, what, op, CUDNN_ATTR_OPERATION_NORM_FWD_MEAN_DESC, desc, 1, &mean);
  SET(g, what, op, CUDNN_ATTR_OPERATION_NORM_FWD_INV_VARIANCE_DESC, desc, 1, &inv_variance);
  finalize(g, what, op);
  add_op(g, op);
}

// LayerNorm backward: dx, dscale, dbias from x, dy, scale and the saved statistics (cuDNN 9 takes
// no epsilon here).
void layernorm_backward(Graph *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t dy,
                        cudnnBackendDescriptor_t scale, cudnnBackendDescriptor_t mean,
                        cudnnBackendDescriptor_t inv_variance, cudnnBackendDescriptor_t dx,
                        cudnnBackendDescriptor_t dscale, cudnnBackendDescriptor_t dbias) {
  const char *what = "norm backward";
  const cudnnBackendNormMode_t mode = CUDNN_LAYER_NORM;
  const cudnnBackendAttributeType_t desc = CUDNN_TYPE_BACKEND_DESCRIPTOR;
  cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR, what);
  SET(g, what, op, CUDNN_ATTR_OPERATION_NORM_BWD_MODE, CUDNN_TYPE_NORM_MODE, 1, &mode);
  SET(g, what, op, CUDNN_ATTR_OPERATION_NORM_BWD_XDESC, desc, 1, &x);
  SET(g, what, op, CUDNN_ATTR_OPERATION_NORM_BWD_DYDESC, desc, 1, &dy);
  SET(g, what, op, CUDNN_ATTR_OPERATION_NORM_BWD_SCALE_DESC, desc, 1, &scale);
  SET(g, what, op, CUDNN_ATTR_OPERATION_NORM_BWD_MEAN_DESC, desc, 1, &mean);
  SET(g, what, op, CUDNN_ATTR_OPERATION_NORM_BWD_INV_VARIANCE_DESC, desc, 1, &inv_variance);
  SET(g, what, op, CUDNN_ATTR_OPERATION_NORM_BWD_DXDESC, desc, 1, &dx);
  SET(g, what, op, CUDNN_ATTR_OPERATION_NORM_BWD_DSCALE_DESC, desc, 1, &dscale);
  SET(g, what, op, CUDNN_ATTR_OPERATION_NORM_BWD_DBIAS_DESC, desc, 1, &dbias);
  finalize(g, what, op);
  add_op(g, op);
}

// The plan's engine: its global index, and in config its behaviour notes that matter here
// (runtime-compiled). Left at -1 and unnoted where cuDNN does not say.
void describe_engine(Graph *g, cudnnBackendDescriptor_t cfg) {
  cudnnBackendDescriptor_t engine = make(g, CUDNN_BACKEND_ENGINE_DESCRIPTOR, "engine");
  int64_t n = 0;
  if (!engine ||
      cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                               &n, &engine) != CUDNN_STATUS_SUCCESS ||
      cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n,
                               &g->engine) != CUDNN_STATUS_SUCCESS)
    return;
  cudnnBackendBehaviorNote_t notes[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
  std::fill(notes, notes + CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, CUDNN_BEHAVIOR_NOTE_TYPE_COUNT);
  if (cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                               CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &n, notes) != CUDNN_STATUS_SUCCESS)
    return;
  for (int64_t i = 0; i < n; i++) {
    if (notes[i] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION)
      append(g->config, sizeof g->config, ", runtime-compiled");
  }
}

// The plan: the first engine config of heuristics mode A that finalizes, else the first of
// FALLBACK's. Where none does, the failure's step tells what each mode gave.
void find_plan(Graph *g, cudnnBackendDescriptor_t graph) {
  static const struct {
    cudnnBackendHeurMode_t mode;
    const char *name;
  } modes[] = {{CUDNN_HEUR_MODE_A, "A"}, {CUDNN_HEUR_MODE_FALLBACK, "FALLBACK"}};
  const cudnnBackendAttributeType_t desc = CUDNN_TYPE_BACKEND_DESCRIPTOR;
  Failure last = {};
  char trail[sizeof g->fail.step] = "";  // what each mode gave
  for (const auto &m : modes) {
    cudnnBackendDescriptor_t heur = make(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
    SET(g, "heuristics", heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, desc, 1, &graph);
    SET(g, "heuristics", heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &m.mode);
    if (failed(g)) return;
    int64_t n = 0;
    cudnnStatus_t s = cudnnBackendFinalize(heur);
    if (s == CUDNN_STATUS_SUCCESS)
      s = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, desc, 0, &n, nullptr);
    if (s != CUDNN_STATUS_SUCCESS) {
      record(&last, s, "heuristics %s", m.name);
      append(trail, sizeof trail, "%sheuristics %s: %s", trail[0] ? "; " : "", m.name,
             status_name(s));
      continue;
    }
    std::vector<cudnnBackendDescriptor_t> cfgs((size_t)n);
    for (cudnnBackendDescriptor_t &c : cfgs) c = make(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "cfg");
    if (failed(g)) return;
    if (n > 0)
      s = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, desc, n, &n, cfgs.data());
    if (s != CUDNN_STATUS_SUCCESS || n == 0) {
      if (s == CUDNN_STATUS_SUCCESS) s = CUDNN_STATUS_NOT_SUPPORTED;
      record(&last, s, "heuristics %s", m.name);
      append(trail, sizeof trail, "%sheuristics %s: %s", trail[0] ? "; " : "", m.name,
             n == 0 ? "no engine config" : status_name(s));
      continue;
    }
    for (int64_t i = 0; i < n; i++) {
      cudnnBackendDescriptor_t plan = make(g, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "plan");
      SET(g, "plan", plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &g->handle);
      SET(g, "plan", plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, desc, 1, &cfgs[(size_t)i]);
      if (failed(g)) return;
      s = cudnnBackendFinalize(plan);
      if (s == CUDNN_STATUS_SUCCESS) {
        g->plan = plan;
        snprintf(g->config, sizeof g->config, "%s %lld/%lld", m.name, (long long)i + 1,
                 (long long)n);
        describe_engine(g, cfgs[(size_t)i]);
        return;
      }
      record(&last, s, "execution plan");
    }
    append(trail, sizeof trail,
           "%sheuristics %s: %lld configs, none finalized into a plan (the last: %s)",
           trail[0] ? "; " : "", m.name, (long long)n, status_name(s));
  }
  g->fail = last;
  memcpy(g->fail.step, trail, sizeof trail);
}

// Finalizes the operation graph, finds a plan, allocates its workspace and packs the tensors'
// data: false, with the failure recorded, when a step fails.
bool build(Graph *g) {
  const char *what = "operation graph";
  cudnnBackendDescriptor_t graph = make(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, what);
  SET(g, what, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
      (int64_t)g->ops.size(), g->ops.data());
  SET(g, what, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &g->handle);
  finalize(g, what, graph);
  if (failed(g)) return false;
  find_plan(g, graph);
  if (failed(g)) return false;
  int64_t bytes = 0, n = 0;
  if (!check(g,
             cudnnBackendGetAttribute(g->plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                      CUDNN_TYPE_INT64, 1, &n, &bytes),
             "plan", "CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE"))
    return false;
  if (bytes > 0) CUDA_CHECK(cudaMalloc(&g->workspace, (size_t)bytes));
  what = "variant pack";
  g->pack = make(g, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, what);
  SET(g, what, g->pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
      (int64_t)g->uids.size(), g->uids.data());
  SET(g, what, g->pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
      (int64_t)g->data.size(), g->data.data());
  SET(g, what, g->pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &g->workspace);
  finalize(g, what, g->pack);
  return !failed(g);
}

bool execute(Graph *g) {
  return !failed(g) &&
         check(g, cudnnBackendExecute(g->handle, g->plan, g->pack), "plan", "execute");
}

void graph_destroy(Graph *g) {
  for (size_t i = g->owned.size(); i-- > 0;) cudnnBackendDestroyDescriptor(g->owned[i]);
  g->owned.clear();
  if (g->workspace) CUDA_CHECK(cudaFree(g->workspace));
  g->workspace = nullptr;
}

// Builds g, runs it once, then times it: the median in us, or NAN when a step failed.
double time_graph(Bench *b, Graph *g) {
  if (!build(g) || !execute(g)) return NAN;
  const double us = median_us(b->stream, [&] { execute(g); });
  return failed(g) ? NAN : us;
}

// The engine cell: the global index (heuristics mode, rank / configs), or why there is none.
void add_engine(char *t, size_t size, const Graph *g) {
  if (failed(g))
    append(t, size, " %s (%d) at %s |", status_name(g->fail.status), (int)g->fail.status,
           g->fail.step);
  else
    append(t, size, " %lld (%s) |", (long long)g->engine, g->config);
}

// ---- Tables -------------------------------------------------------------------------------------

// A table's tally for the summary, and cuDNN's messages for its failed rows.
struct Family {
  const char *name;
  int rows, ran, faster;  // rows; those cuDNN ran; those where it was faster than ours
  double best;            // the largest ours / cuDNN
  char best_row[24];
  char faster_rows[256];  // the rows where cuDNN was faster, with ours / cuDNN
  char notes[8192];
};

void tally(Family *f, const char *row, const Graph *g, double ours, double cudnn) {
  f->rows++;
  if (failed(g)) {
    append(f->notes, sizeof f->notes, "- %s: cuDNN said: %s\n", row,
           g->fail.message[0] ? g->fail.message : "(no message)");
    return;
  }
  f->ran++;
  const double ratio = ours / cudnn;
  if (ratio > 1.0) {
    f->faster++;
    append(f->faster_rows, sizeof f->faster_rows, "%s%s %.3f", f->faster > 1 ? "; " : "", row,
           ratio);
  }
  if (f->ran == 1 || ratio > f->best) {
    f->best = ratio;
    snprintf(f->best_row, sizeof f->best_row, "%s", row);
  }
}

void print_notes(const Family *f) {
  if (f->notes[0]) printf("\n%s", f->notes);
}

void print_summary(const Family *f) {
  if (f->rows == 0) return;
  if (f->ran == 0)
    printf("%s: cuDNN ran none of the %d rows: it wins nowhere\n", f->name, f->rows);
  else if (f->faster == 0)
    printf("%s: cuDNN ran %d of %d rows and was faster in none (best ours / cuDNN %.3f, %s)\n",
           f->name, f->ran, f->rows, f->best, f->best_row);
  else
    printf("%s: cuDNN ran %d of %d rows and was faster in %d (ours / cuDNN: %s)\n", f->name, f->ran,
           f->rows, f->faster, f->faster_rows);
}

// cuDNN's LayerNorm runs twice a row: scale and bias (and their gradients) in f32, as ours take
// them, and in bf16, the activations' type; the engines it offers differ between the two.
const struct {
  cudnnDataType_t type;
  const char *name;
} kParamTypes[] = {{CUDNN_DATA_FLOAT, "f32"}, {CUDNN_DATA_BFLOAT16, "bf16"}};

// Table 1 (see the top of the file).
void ln_forward_table(Bench *b, Family *f) {
  printf(
      "\n## LayerNorm forward, training: x, y bf16; mean, rstd f32; scale, bias f32 (ours) and f32 "
      "or bf16 (cuDNN); eps %g\n\n"
      "| stage, cuDNN scale type | M x C | ours us | TB/s | cuDNN us | TB/s | ours / cuDNN | cuDNN "
      "engine (heur) | rel err y | mean | rstd |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
      (double)LAYERNORM_EPS);
  for (int s = 0; s < kStages; s++) {
    const int64_t M = stage_tokens(s);
    const int C = stage_channels(s);
    Buffers mem;
    void *x = random_bf16(&mem, M * C, 10 + s, -2.0f, 2.0f);
    const Param weight = random_param(&mem, C, 20 + s, 0.5f, 1.5f);
    const Param bias = random_param(&mem, C, 30 + s, -0.5f, 0.5f);
    const size_t act = sizeof(__nv_bfloat16) * (size_t)(M * C), stat = sizeof(float) * (size_t)M;
    void *y = output_alloc(&mem, act);
    float *mean = (float *)output_alloc(&mem, stat), *rstd = (float *)output_alloc(&mem, stat);
    const double ours = median_us(b->stream, [&] {
      residual_layernorm_forward_cuda(DTYPE_BF16, nullptr, y, mean, rstd, x, nullptr, nullptr,
                                      nullptr, weight.f32, bias.f32, nullptr, 1, M, C, b->stream);
    });

    for (const auto &pt : kParamTypes) {
      const bool f32_params = pt.type == CUDNN_DATA_FLOAT;
      void *y_cudnn = output_alloc(&mem, act);
      float *mean_cudnn = (float *)output_alloc(&mem, stat);
      float *rstd_cudnn = (float *)output_alloc(&mem, stat);
      float eps = LAYERNORM_EPS;  // passed by value: cuDNN reads it through this host pointer
      Graph g;
      g.handle = b->cudnn;
      const cudnnDataType_t bf16 = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
      layernorm_forward(
          &g, norm_tensor(&g, "x", bf16, M, C, kDevice, x),
          norm_tensor(&g, "scale", pt.type, 1, C, kDevice, f32_params ? weight.f32 : weight.bf16),
          norm_tensor(&g, "bias", pt.type, 1, C, kDevice, f32_params ? bias.f32 : bias.bf16),
          norm_tensor(&g, "epsilon", f32, 1, 1, kByValue, &eps),
          norm_tensor(&g, "y", bf16, M, C, kDevice, y_cudnn),
          norm_tensor(&g, "mean", f32, M, 1, kDevice, mean_cudnn),
          norm_tensor(&g, "inv_variance", f32, M, 1, kDevice, rstd_cudnn));
      const double cudnn = time_graph(b, &g);
      const bool ran = !failed(&g);

      char row[24];
      snprintf(row, sizeof row, "s%d %s", s, pt.name);
      const double ours_bytes = 4.0 * M * C + 8.0 * M + 8.0 * C;
      const double cudnn_bytes = ours_bytes - (f32_params ? 0.0 : 4.0 * C);
      char t[2048] = "";
      append(t, sizeof t, "| %s | %lld x %d |", row, (long long)M, C);
      add_num(t, sizeof t, " %.1f |", ours);
      add_num(t, sizeof t, " %.2f |", tb_per_s(ours_bytes, ours));
      add_num(t, sizeof t, " %.1f |", cudnn);
      add_num(t, sizeof t, " %.2f |", tb_per_s(cudnn_bytes, cudnn));
      add_num(t, sizeof t, " %.3f |", ours / cudnn);
      add_engine(t, sizeof t, &g);
      add_num(t, sizeof t, " %.1e |", ran ? rel_err<__nv_bfloat16>(b, y_cudnn, y, M * C) : NAN);
      add_num(t, sizeof t, " %.1e |", ran ? rel_err<float>(b, mean_cudnn, mean, M) : NAN);
      add_num(t, sizeof t, " %.1e |", ran ? rel_err<float>(b, rstd_cudnn, rstd, M) : NAN);
      puts(t);
      tally(f, row, &g, ours, cudnn);
      graph_destroy(&g);
    }
    buffers_free(&mem);
  }
  print_notes(f);
}

// Table 2 (see the top of the file).
void ln_backward_table(Bench *b, Family *f) {
  printf(
      "\n## LayerNorm backward: x, dy, dx bf16; mean, rstd f32; scale, dscale, dbias f32 (ours) "
      "and f32 or bf16 (cuDNN)\n\n"
      "| stage, cuDNN scale type | M x C | ours us | TB/s | cuDNN us | TB/s | ours / cuDNN | cuDNN "
      "engine (heur) | rel err dx | dscale | dbias "
      "|\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int s = 0; s < kStages; s++) {
    const int64_t M = stage_tokens(s);
    const int C = stage_channels(s);
    Buffers mem;
    void *x = random_bf16(&mem, M * C, 40 + s, -2.0f, 2.0f);
    void *dy = random_bf16(&mem, M * C, 50 + s, -1.0f, 1.0f);
    const Param weight = random_param(&mem, C, 60 + s, 0.5f, 1.5f);
    const Param bias = random_param(&mem, C, 70 + s, -0.5f, 0.5f);
    const size_t act = sizeof(__nv_bfloat16) * (size_t)(M * C), stat = sizeof(float) * (size_t)M;
    const size_t param = sizeof(float) * (size_t)C;
    // The saved statistics, from our forward (its y is not used).
    float *mean = (float *)device_alloc(&mem, stat), *rstd = (float *)device_alloc(&mem, stat);
    residual_layernorm_forward_cuda(DTYPE_BF16, nullptr, device_alloc(&mem, act), mean, rstd, x,
                                    nullptr, nullptr, nullptr, weight.f32, bias.f32, nullptr, 1, M,
                                    C, b->stream);
    void *dx = output_alloc(&mem, act);
    float *dscale = (float *)device_alloc(&mem, param), *dbias = (float *)device_alloc(&mem, param);
    float *scratch = (float *)device_alloc(
        &mem, sizeof(float) * (size_t)residual_layernorm_backward_cuda_scratch(M, C));
    auto ours_backward = [&] {
      residual_layernorm_backward_cuda(DTYPE_BF16, nullptr, dx, nullptr, dscale, dbias, nullptr, dy,
                                       x, weight.f32, mean, rstd, nullptr, nullptr, nullptr, 1, M,
                                       C, scratch, b->stream);
    };
    const double ours = median_us(b->stream, ours_backward);
    // Ours adds to dscale and dbias: once more from zero for the comparison.
    CUDA_CHECK(cudaMemsetAsync(dscale, 0, param, b->stream));
    CUDA_CHECK(cudaMemsetAsync(dbias, 0, param, b->stream));
    ours_backward();

    for (const auto &pt : kParamTypes) {
      const bool f32_params = pt.type == CUDNN_DATA_FLOAT;
      const size_t param_cudnn = (f32_params ? sizeof(float) : sizeof(__nv_bfloat16)) * (size_t)C;
      void *dx_cudnn = output_alloc(&mem, act);
      void *dscale_cudnn = output_alloc(&mem, param_cudnn);
      void *dbias_cudnn = output_alloc(&mem, param_cudnn);
      Graph g;
      g.handle = b->cudnn;
      const cudnnDataType_t bf16 = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
      layernorm_backward(
          &g, norm_tensor(&g, "x", bf16, M, C, kDevice, x),
          norm_tensor(&g, "dy", bf16, M, C, kDevice, dy),
          norm_tensor(&g, "scale", pt.type, 1, C, kDevice, f32_params ? weight.f32 : weight.bf16),
          norm_tensor(&g, "mean", f32, M, 1, kDevice, mean),
          norm_tensor(&g, "inv_variance", f32, M, 1, kDevice, rstd),
          norm_tensor(&g, "dx", bf16, M, C, kDevice, dx_cudnn),
          norm_tensor(&g, "dscale", pt.type, 1, C, kDevice, dscale_cudnn),
          norm_tensor(&g, "dbias", pt.type, 1, C, kDevice, dbias_cudnn));
      const double cudnn = time_graph(b, &g);
      const bool ran = !failed(&g);

      char row[24];
      snprintf(row, sizeof row, "s%d %s", s, pt.name);
      const double ours_bytes = 6.0 * M * C + 8.0 * M + 12.0 * C;
      const double cudnn_bytes = ours_bytes - (f32_params ? 0.0 : 6.0 * C);
      double err_dscale = NAN, err_dbias = NAN;
      if (ran && f32_params) {
        err_dscale = rel_err<float>(b, dscale_cudnn, dscale, C);
        err_dbias = rel_err<float>(b, dbias_cudnn, dbias, C);
      } else if (ran) {
        err_dscale = rel_err<__nv_bfloat16, float>(b, dscale_cudnn, dscale, C);
        err_dbias = rel_err<__nv_bfloat16, float>(b, dbias_cudnn, dbias, C);
      }
      char t[2048] = "";
      append(t, sizeof t, "| %s | %lld x %d |", row, (long long)M, C);
      add_num(t, sizeof t, " %.1f |", ours);
      add_num(t, sizeof t, " %.2f |", tb_per_s(ours_bytes, ours));
      add_num(t, sizeof t, " %.1f |", cudnn);
      add_num(t, sizeof t, " %.2f |", tb_per_s(cudnn_bytes, cudnn));
      add_num(t, sizeof t, " %.3f |", ours / cudnn);
      add_engine(t, sizeof t, &g);
      add_num(t, sizeof t, " %.1e |", ran ? rel_err<__nv_bfloat16>(b, dx_cudnn, dx, M * C) : NAN);
      add_num(t, sizeof t, " %.1e |", err_dscale);
      add_num(t, sizeof t, " %.1e |", err_dbias);
      puts(t);
      tally(f, row, &g, ours, cudnn);
      graph_destroy(&g);
    }
    buffers_free(&mem);
  }
  print_notes(f);
}

// fc1 as a cuDNN graph: pre (M, N) = x (M, K) weight (N, K)^T + bias (N), post = GELU_FWD(pre),
// pre and post of type out (pre virtual, in f32, unless store_pre).
void fc1_graph(Graph *g, int64_t M, int K, int N, void *x, void *weight, void *bias, void *pre,
               void *post, bool store_pre, cudnnDataType_t out) {
  const cudnnDataType_t bf16 = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
  cudnnBackendDescriptor_t a = matrix(g, "x", bf16, M, K, K, 1, kDevice, x);
  cudnnBackendDescriptor_t w = matrix(g, "weight^T", bf16, K, N, 1, K, kDevice, weight);
  cudnnBackendDescriptor_t prod = matrix(g, "x weight^T", f32, M, N, N, 1, kVirtual, nullptr);
  cudnnBackendDescriptor_t b = matrix(g, "bias", bf16, 1, N, N, 1, kDevice, bias);
  cudnnBackendDescriptor_t p = store_pre ? matrix(g, "pre", out, M, N, N, 1, kDevice, pre)
                                         : matrix(g, "pre", f32, M, N, N, 1, kVirtual, nullptr);
  cudnnBackendDescriptor_t y = matrix(g, "post", out, M, N, N, 1, kDevice, post);
  matmul(g, a, w, prod);
  pointwise(g, "ADD (bias)", CUDNN_POINTWISE_ADD, prod, b, p);
  pointwise(g, "GELU_FWD", CUDNN_POINTWISE_GELU_FWD, p, nullptr, y);
}

// Whether cuDNN's GELU_FWD is the erf form: fc1's graph with f32 pre and post on a small shape,
// post against both forms of GELU(pre) in double (they differ by up to ~2e-4, far above f32's
// rounding).
void gelu_form_check(Bench *b) {
  const int64_t M = 4096;
  const int K = 96, N = 384;
  Buffers mem;
  void *x = random_bf16(&mem, M * K, 80, -1.0f, 1.0f);
  void *weight = random_bf16(&mem, (int64_t)N * K, 81, -0.3f, 0.3f);
  void *bias = random_bf16(&mem, N, 82, -0.5f, 0.5f);
  const size_t bytes = sizeof(float) * (size_t)(M * N);
  float *pre = (float *)output_alloc(&mem, bytes), *post = (float *)output_alloc(&mem, bytes);
  Graph g;
  g.handle = b->cudnn;
  fc1_graph(&g, M, K, N, x, weight, bias, pre, post, true, CUDNN_DATA_FLOAT);
  if (build(&g) && execute(&g)) {
    std::vector<float> hp((size_t)(M * N)), hy((size_t)(M * N));
    CUDA_CHECK(cudaMemcpyAsync(hp.data(), pre, bytes, cudaMemcpyDeviceToHost, b->stream));
    CUDA_CHECK(cudaMemcpyAsync(hy.data(), post, bytes, cudaMemcpyDeviceToHost, b->stream));
    CUDA_CHECK(cudaStreamSynchronize(b->stream));
    double dev_erf = 0.0, dev_tanh = 0.0, largest = 0.0;
    for (size_t i = 0; i < hp.size(); i++) {
      const double p = hp[i], y = hy[i];
      const double erf_form = 0.5 * p * (1.0 + std::erf(p / std::sqrt(2.0)));
      const double tanh_form =  // 0.79788... = sqrt(2 / pi)
          0.5 * p * (1.0 + std::tanh(0.7978845608028654 * (p + 0.044715 * p * p * p)));
      dev_erf = std::max(dev_erf, std::fabs(y - erf_form));  // NaN (unwritten) is caught below
      dev_tanh = std::max(dev_tanh, std::fabs(y - tanh_form));
      largest = std::max(largest, std::fabs(p));
      if (std::isnan(y) || std::isnan(p)) dev_erf = dev_tanh = INFINITY;
    }
    printf(
        "cuDNN's GELU_FWD (f32 graph, engine %lld, |pre| <= %.1f): max |post - erf form| %.1e, "
        "max |post - tanh form| %.1e: %s\n",
        (long long)g.engine, largest, dev_erf, dev_tanh,
        dev_erf < dev_tanh ? "the erf form, as ours" : "NOT the erf form (ours is erf)");
  } else {
    printf("cuDNN's GELU_FWD form not checked: the f32 graph failed, %s (%d) at %s: %s\n",
           status_name(g.fail.status), (int)g.fail.status, g.fail.step, g.fail.message);
  }
  graph_destroy(&g);
  buffers_free(&mem);
}

// Table 3 (see the top of the file).
void gelu_table(Bench *b, Family *f) {
  printf(
      "\n## fc1 + bias + GELU (erf), pre and post stored: bf16 in and out, f32 accumulation\n\n");
  gelu_form_check(b);
  printf(
      "\n| layer | M x K -> N | cuBLASLt+GELU us | fused us | cuDNN us | best ours / cuDNN | "
      "cuDNN engine (heur) | rel err pre | post |\n|---|---|---|---|---|---|---|---|---|\n");
  for (int s = 0; s < kStages; s++) {
    const int64_t M = stage_tokens(s);
    const int K = stage_channels(s), N = 4 * K;
    const float w_bound = 3.0f / std::sqrt((float)K);  // pre ~ unit variance: GELU's curved part
    Buffers mem;
    void *x = random_bf16(&mem, M * K, 90 + s, -1.0f, 1.0f);
    void *weight = random_bf16(&mem, (int64_t)N * K, 100 + s, -w_bound, w_bound);
    void *bias = random_bf16(&mem, N, 110 + s, -0.5f, 0.5f);
    const size_t out = sizeof(__nv_bfloat16) * (size_t)(M * N);
    void *pre = output_alloc(&mem, out), *post = output_alloc(&mem, out);
    void *pre_fused = output_alloc(&mem, out), *post_fused = output_alloc(&mem, out);
    void *pre_cudnn = output_alloc(&mem, out), *post_cudnn = output_alloc(&mem, out);

    const double cublaslt = median_us(b->stream, [&] {
      linear_forward_cuda(b->gemm, DTYPE_BF16, pre, x, weight, bias, M, K, N);
      gelu_forward_cuda(DTYPE_BF16, post, pre, M * N, b->stream);
    });
    // The model's fused fc1: the small-K kernel in stage 0, the Hopper GEMM after.
    const bool small_k = s == 0;
    double fused = NAN;
    if (small_k ? linear_small_k_supported(K, N) : linear_hopper_supported(K, N))
      fused = median_us(b->stream, [&] {
        if (small_k)
          linear_small_k_forward_cuda(pre_fused, post_fused, x, weight, bias, M, K, N, b->stream);
        else
          linear_hopper_forward_cuda(pre_fused, post_fused, x, weight, bias, M, K, N, b->stream);
      });

    Graph g;
    g.handle = b->cudnn;
    fc1_graph(&g, M, K, N, x, weight, bias, pre_cudnn, post_cudnn, true, CUDNN_DATA_BFLOAT16);
    double cudnn = time_graph(b, &g);
    char row[24];
    snprintf(row, sizeof row, "s%d fc1", s);
    bool post_only = false;
    if (failed(&g)) {  // both outputs refused: post alone, and a note saying why
      append(f->notes, sizeof f->notes, "- %s: pre and post refused, %s (%d) at %s: %s\n", row,
             status_name(g.fail.status), (int)g.fail.status, g.fail.step, g.fail.message);
      graph_destroy(&g);
      g = Graph();
      g.handle = b->cudnn;
      fc1_graph(&g, M, K, N, x, weight, bias, nullptr, post_cudnn, false, CUDNN_DATA_BFLOAT16);
      cudnn = time_graph(b, &g);
      post_only = !failed(&g);
    }
    const bool ran = !failed(&g);
    const double ours = std::isnan(fused) ? cublaslt : std::min(cublaslt, fused);

    char t[2048] = "";
    append(t, sizeof t, "| %s | %lld x %d -> %d |", row, (long long)M, K, N);
    add_num(t, sizeof t, " %.1f |", cublaslt);
    add_num(t, sizeof t, " %.1f |", fused);
    add_num(t, sizeof t, " %.1f |", cudnn);
    add_num(t, sizeof t, " %.3f |", ours / cudnn);
    add_engine(t, sizeof t, &g);
    if (post_only)
      append(t, sizeof t, " post only: cuDNN does not store pre |");
    else
      add_num(t, sizeof t, " %.1e |", ran ? rel_err<__nv_bfloat16>(b, pre_cudnn, pre, M * N) : NAN);
    add_num(t, sizeof t, " %.1e |", ran ? rel_err<__nv_bfloat16>(b, post_cudnn, post, M * N) : NAN);
    puts(t);
    tally(f, row, &g, ours, cudnn);
    graph_destroy(&g);
    buffers_free(&mem);
  }
  print_notes(f);
}

// The LayerNorm-prologue product as a cuDNN graph: A' = (x - mean) rstd gamma + beta (virtual,
// bf16) -> A' weight^T -> + bias -> out (M, N); x (M, K), out bf16; mean, rstd (M) and gamma, beta
// (K) f32; every intermediate virtual, in f32 but A'.
void prologue_graph(Graph *g, int64_t M, int K, int N, void *x, float *mean, float *rstd,
                    float *gamma, float *beta, void *weight, void *bias, void *out) {
  const cudnnDataType_t bf16 = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
  cudnnBackendDescriptor_t tx = matrix(g, "x", bf16, M, K, K, 1, kDevice, x);
  cudnnBackendDescriptor_t tmean = matrix(g, "mean", f32, M, 1, 1, 1, kDevice, mean);
  cudnnBackendDescriptor_t trstd = matrix(g, "rstd", f32, M, 1, 1, 1, kDevice, rstd);
  cudnnBackendDescriptor_t tgamma = matrix(g, "gamma", f32, 1, K, K, 1, kDevice, gamma);
  cudnnBackendDescriptor_t tbeta = matrix(g, "beta", f32, 1, K, K, 1, kDevice, beta);
  cudnnBackendDescriptor_t centered = matrix(g, "x - mean", f32, M, K, K, 1, kVirtual, nullptr);
  cudnnBackendDescriptor_t xhat = matrix(g, "xhat", f32, M, K, K, 1, kVirtual, nullptr);
  cudnnBackendDescriptor_t scaled = matrix(g, "xhat gamma", f32, M, K, K, 1, kVirtual, nullptr);
  cudnnBackendDescriptor_t a = matrix(g, "LN(x)", bf16, M, K, K, 1, kVirtual, nullptr);
  cudnnBackendDescriptor_t w = matrix(g, "weight^T", bf16, K, N, 1, K, kDevice, weight);
  cudnnBackendDescriptor_t prod = matrix(g, "LN(x) weight^T", f32, M, N, N, 1, kVirtual, nullptr);
  cudnnBackendDescriptor_t tbias = matrix(g, "bias", bf16, 1, N, N, 1, kDevice, bias);
  cudnnBackendDescriptor_t tout = matrix(g, "out", bf16, M, N, N, 1, kDevice, out);
  pointwise(g, "SUB (mean)", CUDNN_POINTWISE_SUB, tx, tmean, centered);
  pointwise(g, "MUL (rstd)", CUDNN_POINTWISE_MUL, centered, trstd, xhat);
  pointwise(g, "MUL (gamma)", CUDNN_POINTWISE_MUL, xhat, tgamma, scaled);
  pointwise(g, "ADD (beta)", CUDNN_POINTWISE_ADD, scaled, tbeta, a);
  matmul(g, a, w, prod);
  pointwise(g, "ADD (bias)", CUDNN_POINTWISE_ADD, prod, tbias, tout);
}

// Table 4 (see the top of the file).
void prologue_table(Bench *b, Family *f) {
  printf(
      "\n## LayerNorm as the product's prologue: out = LN(x) W^T + b, bf16 in and out; cuDNN "
      "is given mean and rstd\n\n"
      "| layer | M x K -> N | ours LN + cuBLASLt us | cuDNN us | ours / cuDNN | cuDNN engine "
      "(heur) | rel err out |\n|---|---|---|---|---|---|---|\n");
  for (int s = 1; s <= 2; s++)
    for (int layer = 0; layer < 2; layer++) {
      const int64_t M = stage_tokens(s);
      const int K = stage_channels(s), N = (layer == 0 ? 3 : 4) * K;
      const float w_bound = 3.0f / std::sqrt((float)K);
      Buffers mem;
      void *x = random_bf16(&mem, M * K, 120 + s, -2.0f, 2.0f);
      float *gamma = random_f32(&mem, K, 130 + s, 0.5f, 1.5f);
      float *beta = random_f32(&mem, K, 140 + s, -0.5f, 0.5f);
      void *weight = random_bf16(&mem, (int64_t)N * K, 150 + s, -w_bound, w_bound);
      void *bias = random_bf16(&mem, N, 160 + s, -0.5f, 0.5f);
      const size_t act = sizeof(__nv_bfloat16) * (size_t)(M * K);
      const size_t out_bytes = sizeof(__nv_bfloat16) * (size_t)(M * N);
      const size_t stat = sizeof(float) * (size_t)M;
      void *ln_out = output_alloc(&mem, act);
      float *mean = (float *)output_alloc(&mem, stat), *rstd = (float *)output_alloc(&mem, stat);
      void *out = output_alloc(&mem, out_bytes), *out_cudnn = output_alloc(&mem, out_bytes);

      const double ours = median_us(b->stream, [&] {
        residual_layernorm_forward_cuda(DTYPE_BF16, nullptr, ln_out, mean, rstd, x, nullptr,
                                        nullptr, nullptr, gamma, beta, nullptr, 1, M, K, b->stream);
        linear_forward_cuda(b->gemm, DTYPE_BF16, out, ln_out, weight, bias, M, K, N);
      });

      Graph g;
      g.handle = b->cudnn;
      prologue_graph(&g, M, K, N, x, mean, rstd, gamma, beta, weight, bias, out_cudnn);
      const double cudnn = time_graph(b, &g);
      const bool ran = !failed(&g);

      char row[24];
      snprintf(row, sizeof row, "s%d %s", s, layer == 0 ? "qkv" : "fc1");
      char t[2048] = "";
      append(t, sizeof t, "| %s | %lld x %d -> %d |", row, (long long)M, K, N);
      add_num(t, sizeof t, " %.1f |", ours);
      add_num(t, sizeof t, " %.1f |", cudnn);
      add_num(t, sizeof t, " %.3f |", ours / cudnn);
      add_engine(t, sizeof t, &g);
      add_num(t, sizeof t, " %.1e |", ran ? rel_err<__nv_bfloat16>(b, out_cudnn, out, M * N) : NAN);
      puts(t);
      tally(f, row, &g, ours, cudnn);
      graph_destroy(&g);
      buffers_free(&mem);
    }
  print_notes(f);
}

}  // namespace

int main(int argc, char **argv) {
  bool ln = argc == 1, ln_bwd = argc == 1, gelu = argc == 1, prologue = argc == 1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "ln"))
      ln = true;
    else if (!strcmp(argv[i], "ln_bwd"))
      ln_bwd = true;
    else if (!strcmp(argv[i], "gelu"))
      gelu = true;
    else if (!strcmp(argv[i], "prologue"))
      prologue = true;
    else {
      fprintf(stderr, "bench_cudnn: unknown table %s (ln, ln_bwd, gelu, prologue)\n", argv[i]);
      return 2;
    }
  }
  if (!cuda_device_available()) {
    fprintf(stderr, "bench_cudnn: no CUDA device, nothing measured (it needs a GPU)\n");
    return 77;
  }
  Bench b = {};
  CUDA_CHECK(cudaStreamCreate(&b.stream));
  const cudnnStatus_t s = cudnnCreate(&b.cudnn);
  if (s != CUDNN_STATUS_SUCCESS) {
    char message[1024] = "";
    cudnnGetLastErrorString(message, sizeof message);
    fprintf(stderr,
            "bench_cudnn: cudnnCreate failed: %s (%d): %s\n"
            "HINT: cuDNN 9 must match the CUDA driver and runtime; see its support matrix\n",
            status_name(s), (int)s, message);
    return 1;
  }
  if (cudnnSetStream(b.cudnn, b.stream) != CUDNN_STATUS_SUCCESS) {
    fprintf(stderr, "bench_cudnn: cudnnSetStream failed\n");
    return 1;
  }
  b.gemm = gemm_context_create(b.stream);
  CUDA_CHECK(cudaMalloc(&b.diff, 2 * sizeof(float)));
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  printf(
      "# cuDNN %zu (headers %d.%d.%d) against swin.c's kernels, Swin-T at batch 128, %s\n"
      "us = median of %d runs after %d warm-ups; ours / cuDNN > 1: cuDNN is faster; rel err = "
      "max |cuDNN - ours| / max |ours|; engine: global index (heuristics mode, rank / configs)\n",
      cudnnGetVersion(), CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL, prop.name, kRepeats, kWarmups);

  Family families[4] = {};
  const char *names[4] = {"ln", "ln_bwd", "gelu", "prologue"};
  for (int i = 0; i < 4; i++) families[i].name = names[i];
  if (ln) ln_forward_table(&b, &families[0]);
  if (ln_bwd) ln_backward_table(&b, &families[1]);
  if (gelu) gelu_table(&b, &families[2]);
  if (prologue) prologue_table(&b, &families[3]);
  printf("\n## Summary: does cuDNN win anywhere?\n\n");
  for (const Family &f : families) print_summary(&f);

  CUDA_CHECK(cudaFree(b.diff));
  gemm_context_destroy(b.gemm);
  cudnnDestroy(b.cudnn);
  CUDA_CHECK(cudaStreamDestroy(b.stream));
  return 0;
}
