// backend_cuda.cu: the CUDA backend (src/model/backend.h): backend memory is device memory from
// cudaMalloc, taken before the first step (the model plans it; nothing is allocated inside a
// step); every op is queued on one compute stream; batch uploads run on a copy stream, ordered
// against the compute stream by events; the host waits only in download and synchronize.
// Each op is a thin adapter onto the kernels of kernels/cuda/ and optim/*.cu. The compute
// stream's work can be captured into a CUDA graph and replayed (graph_begin .. graph_end; used
// for the training step by src/app/step_graph.c).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/attention.h"
#include "kernels/augment.h"
#include "kernels/cosine_attention.h"
#include "kernels/gelu.h"
#include "kernels/gemm.h"
#include "kernels/layernorm.h"
#include "kernels/loss.h"
#include "kernels/patch.h"
#include "kernels/residual.h"
#include "optim/ema.h"
#include "optim/optimizer.h"
#include "src/base/cuda_util.h"
#include "src/model/backend.h"

namespace {

constexpr int kSlots = 4;  // batch staging slots (the trainer uses 0/1 for training, 2/3 for eval)
// Page-locked slots of per-step values (step_params_set, one write per step, or per micro-batch
// with train.accum_steps): more than the writes the host queues ahead of the GPU (the trainer:
// two steps; the benchmark: a round of 10) up to 3 micro-batches a step, so its wait for a
// slot's previous copy does not happen there; with more micro-batches it waits, rarely, for a
// copy queued 64 writes earlier, with that much work still queued behind it.
constexpr int kStepSlots = 64;

struct CudaState {
  int device;
  cudaStream_t compute, copy;
  cudaEvent_t uploaded[kSlots], released[kSlots];
  StepParams *step_host;                // (kStepSlots) page-locked
  cudaEvent_t step_copied[kStepSlots];  // the copy that last read each slot has run
  int step_next;                        // the slot of the next write
  bool capturing;                       // between graph_begin and graph_end
  GemmContext *gemm;
  float *scratch;  // the ops' scratch (sized by reserve)
  int64_t scratch_floats;
  float *row_losses;  // (max_batch)
  int max_batch;
  // Profiling: a pair of events around each op while on; collected when the pool is full or
  // at a report.
  bool profiling;
  cudaEvent_t *marks;     // (2 * kMaxMarks)
  int mark_family[1024];  // kMaxMarks
  int num_marks;
  double ms[OP_FAMILIES];
};

constexpr int kMaxMarks = 1024;

CudaState *state_of(Backend *be) {
  return static_cast<CudaState *>(be->impl);
}

// The calls that cannot be recorded into a graph (they wait for the device, allocate, or order
// against work outside the recording): made while capturing, they are a bug of the caller's.
void refuse_in_capture(Backend *be, const char *call) {
  if (!state_of(be)->capturing) return;
  fprintf(stderr,
          "internal error: %s while the compute stream is being captured into a CUDA graph\n"
          "HINT: only queued device work may be in a captured step (src/app/step_graph.h); "
          "train.cuda_graphs=off runs without graphs\n",
          call);
  abort();
}

float *scratch_of(Backend *be, int64_t n) {
  CudaState *st = state_of(be);
  if (n > st->scratch_floats) {
    fprintf(stderr, "internal error: CUDA backend scratch of %lld floats, %lld needed\n",
            (long long)st->scratch_floats, (long long)n);
    abort();
  }
  return st->scratch;
}

// ---- profiling --------------------------------------------------------------------------------

// Adds up the measured pairs (waits for the compute stream).
void collect_marks(CudaState *st) {
  CUDA_CHECK(cudaStreamSynchronize(st->compute));
  for (int i = 0; i < st->num_marks; i++) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, st->marks[2 * i], st->marks[2 * i + 1]));
    st->ms[st->mark_family[i]] += ms;
  }
  st->num_marks = 0;
}

// The GPU time of the ops queued in its lifetime goes to one family (when profiling is on).
class OpScope {
 public:
  OpScope(Backend *be, OpFamily family) : st_(state_of(be)) {
    if (!st_->profiling) return;
    if (st_->num_marks == kMaxMarks) collect_marks(st_);
    index_ = st_->num_marks++;
    st_->mark_family[index_] = family;
    CUDA_CHECK(cudaEventRecord(st_->marks[2 * index_], st_->compute));
  }
  ~OpScope() {
    if (index_ >= 0) CUDA_CHECK(cudaEventRecord(st_->marks[2 * index_ + 1], st_->compute));
  }
  OpScope(const OpScope &) = delete;
  OpScope &operator=(const OpScope &) = delete;

 private:
  CudaState *st_;
  int index_ = -1;
};

void cuda_profile(Backend *be, bool on) {
  refuse_in_capture(be, "profile");
  CudaState *st = state_of(be);
  if (on && !st->marks) {
    st->marks = static_cast<cudaEvent_t *>(calloc(2 * kMaxMarks, sizeof(cudaEvent_t)));
    if (!st->marks) abort();
    for (int i = 0; i < 2 * kMaxMarks; i++) CUDA_CHECK(cudaEventCreate(&st->marks[i]));
  }
  if (!on && st->profiling) collect_marks(st);
  st->profiling = on;
}

void cuda_gemm_tuning(Backend *be, bool on) {
  gemm_context_set_tuning(state_of(be)->gemm, on);
}

void cuda_gemm_report(Backend *be, FILE *out) {
  gemm_context_report(state_of(be)->gemm, out);
}

int cuda_gemm_choices_write(Backend *be, FILE *f) {
  return gemm_context_write_choices(state_of(be)->gemm, f);
}

int cuda_gemm_choices_read(Backend *be, const char *text, char *why, size_t why_size) {
  return gemm_context_read_choices(state_of(be)->gemm, text, why, why_size);
}

void cuda_profile_report(Backend *be, double *ms) {
  CudaState *st = state_of(be);
  collect_marks(st);
  for (int f = 0; f < OP_FAMILIES; f++) {
    ms[f] = st->ms[f];
    st->ms[f] = 0;
  }
}

// ---- memory ---------------------------------------------------------------------------------

void *cuda_alloc(Backend *be, size_t bytes) {
  refuse_in_capture(be, "alloc");
  void *p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes ? bytes : 256);
  if (e != cudaSuccess) {
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    fprintf(stderr,
            "error: cannot allocate %.1f MiB of GPU memory (%s); %.1f MiB in use by swin.c, "
            "%.1f of %.1f MiB free on the device\n"
            "HINT: lower train.batch_size (activations grow with it) or use precision=bf16\n",
            bytes / 1048576.0, cudaGetErrorString(e), be->bytes_in_use / 1048576.0,
            free_bytes / 1048576.0, total / 1048576.0);
    exit(1);
  }
  CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, state_of(be)->compute));
  CUDA_CHECK(cudaStreamSynchronize(state_of(be)->compute));
  be->bytes_in_use += bytes;
  return p;
}

void cuda_release(Backend *be, void *ptr) {
  refuse_in_capture(be, "release");
  if (ptr) CUDA_CHECK(cudaFree(ptr));
}

void *cuda_host_alloc(size_t bytes) {
  void *p = nullptr;
  if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault) != cudaSuccess) return nullptr;
  return p;
}

void cuda_host_release(void *ptr) {
  if (ptr) CUDA_CHECK(cudaFreeHost(ptr));
}

void cuda_upload(Backend *be, void *dst, const void *src, size_t bytes) {
  refuse_in_capture(be, "upload");
  CudaState *st = state_of(be);
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st->compute));
  CUDA_CHECK(cudaStreamSynchronize(st->compute));
}

void cuda_download(Backend *be, void *dst, const void *src, size_t bytes) {
  refuse_in_capture(be, "download");
  CudaState *st = state_of(be);
  be->host_waits++;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st->compute));
  CUDA_CHECK(cudaStreamSynchronize(st->compute));
}

void cuda_zero(Backend *be, void *ptr, size_t bytes) {
  OpScope scope(be, OP_MEMORY);
  CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, state_of(be)->compute));
}

void cuda_copy(Backend *be, void *dst, const void *src, size_t bytes) {
  OpScope scope(be, OP_MEMORY);
  if (dst != src && bytes > 0)
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, state_of(be)->compute));
}

void cuda_synchronize(Backend *be) {
  refuse_in_capture(be, "synchronize");
  be->host_waits++;
  CUDA_CHECK(cudaStreamSynchronize(state_of(be)->compute));
}

void cuda_reserve(Backend *be, const BackendNeeds *n) {
  refuse_in_capture(be, "reserve");
  CudaState *st = state_of(be);
  // Upper bounds of what the ops ask for: a LayerNorm backward (residual, merge or res-post-norm)
  // at most ~1024 blocks of 3C partials (kernels/cuda/layernorm*.cu); the attention backward
  // (kernels/cuda/attention.cu); a bias gradient's column sums (GELU's, qkv's, the head's) at most
  // 1024 rows of partials (column_sums_cuda_scratch), plus, for the head, d(pooled); the optimizer
  // its own; the MLP backward on the Hopper GEMM its own.
  int64_t need = 3 * 1024 * (int64_t)n->max_width;
  // The attention backward's window sums of dS and qkv bias sums (kernels/attention.h).
  int64_t k = window_attention_backward_cuda_scratch_bound(n->max_window_tokens, n->max_heads,
                                                           n->max_width);
  if (k > need) need = k;
  // Swin V2's cosine q, k backward: per block of (row, head) pairs, sums per head, and the
  // column sums of dqkv (3C <= max_width, so C = ceil(max_width / 3) bounds it).
  k = cosine_qk_backward_cuda_scratch(n->max_rows, (n->max_width + 2) / 3, n->max_heads);
  if (k > need) need = k;
  k = 64 + column_sums_cuda_scratch(n->max_rows, n->max_width) +
      (int64_t)n->max_batch * n->max_width;
  if (k > need) need = k;
  k = optimizer_step_cuda_scratch(n->num_params);
  if (k > need) need = k;
  // The MLP backward on the Hopper GEMM: fc2's weight transposed, the column-sum partials and
  // (with fc2's weight gradient in the kernel) the CTAs' weight-gradient blocks.
  if (be->act == DTYPE_BF16 && linear_hopper_supported(8, 8)) {
    k = linear_hopper_dgelu_dweight_scratch_bound(n->max_width);
    if (k > need) need = k;
  }
  if (need > st->scratch_floats) {
    cuda_release(be, st->scratch);
    st->scratch = static_cast<float *>(cuda_alloc(be, sizeof(float) * (size_t)need));
    st->scratch_floats = need;
  }
  if (n->max_batch > st->max_batch) {
    cuda_release(be, st->row_losses);
    st->row_losses = static_cast<float *>(cuda_alloc(be, sizeof(float) * (size_t)n->max_batch));
    st->max_batch = n->max_batch;
  }
}

// The batch an op may be given: what reserve planned for.
void check_batch(Backend *be, const char *op, int B) {
  if (B <= state_of(be)->max_batch) return;
  fprintf(stderr, "internal error: %s with batch %d, the backend reserved for %d\n", op, B,
          state_of(be)->max_batch);
  abort();
}

// ---- batch staging --------------------------------------------------------------------------

void cuda_stage_upload(Backend *be, int slot, int count, void *const *dst, const void *const *src,
                       const size_t *bytes) {
  refuse_in_capture(be, "stage_upload");
  CudaState *st = state_of(be);
  // Not before the step that last read this slot is done with it (an event never recorded
  // completes at once).
  CUDA_CHECK(cudaStreamWaitEvent(st->copy, st->released[slot], 0));
  for (int i = 0; i < count; i++)
    CUDA_CHECK(cudaMemcpyAsync(dst[i], src[i], bytes[i], cudaMemcpyDefault, st->copy));
  CUDA_CHECK(cudaEventRecord(st->uploaded[slot], st->copy));
}

void cuda_stage_consume(Backend *be, int slot) {
  refuse_in_capture(be, "stage_consume");
  CudaState *st = state_of(be);
  CUDA_CHECK(cudaStreamWaitEvent(st->compute, st->uploaded[slot], 0));
}

void cuda_stage_release(Backend *be, int slot) {
  refuse_in_capture(be, "stage_release");
  CudaState *st = state_of(be);
  CUDA_CHECK(cudaEventRecord(st->released[slot], st->compute));
}

void cuda_stage_wait(Backend *be, int slot) {
  refuse_in_capture(be, "stage_wait");
  CUDA_CHECK(cudaEventSynchronize(state_of(be)->uploaded[slot]));
}

// ---- ordering against the caller's streams ------------------------------------------------------

// Both may be captured: inside a capture an event recorded here and waited for by another stream
// brings that stream's later work into the graph (a fork), and a wait here for an event that
// stream recorded inside the capture joins it back.
void cuda_record_event(Backend *be, void *event) {
  CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), state_of(be)->compute));
}

void cuda_wait_event(Backend *be, void *event) {
  CUDA_CHECK(cudaStreamWaitEvent(state_of(be)->compute, static_cast<cudaEvent_t>(event), 0));
}

void *cuda_mark_create(Backend *be) {
  (void)be;
  cudaEvent_t e;
  CUDA_CHECK(cudaEventCreate(&e));
  return e;
}

void cuda_mark_destroy(Backend *be, void *mark) {
  (void)be;
  if (mark) CUDA_CHECK(cudaEventDestroy(static_cast<cudaEvent_t>(mark)));
}

void cuda_mark_record(Backend *be, void *mark) {
  refuse_in_capture(be, "mark_record");
  CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(mark), state_of(be)->compute));
}

double cuda_mark_seconds(Backend *be, void *a, void *b) {
  (void)be;
  CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(b)));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(a), static_cast<cudaEvent_t>(b)));
  return ms * 1e-3;
}

// ---- per-step values -------------------------------------------------------------------------

// A copy from page-locked memory reads it when the copy runs, not when it is queued: so each
// write takes the next slot of a ring, and waits (rarely: see kStepSlots) until the copy queued
// from that slot kStepSlots writes ago has read it. An event never recorded counts as complete.
void cuda_step_params_set(Backend *be, StepParams *params, const StepParams *values) {
  refuse_in_capture(be, "step_params_set");
  CudaState *st = state_of(be);
  const int k = st->step_next;
  st->step_next = (k + 1) % kStepSlots;
  cudaError_t ready = cudaEventQuery(st->step_copied[k]);
  if (ready == cudaErrorNotReady) {
    be->host_waits++;
    CUDA_CHECK(cudaEventSynchronize(st->step_copied[k]));
  } else {
    CUDA_CHECK(ready);
  }
  st->step_host[k] = *values;
  CUDA_CHECK(cudaMemcpyAsync(params, &st->step_host[k], sizeof(StepParams), cudaMemcpyHostToDevice,
                             st->compute));
  CUDA_CHECK(cudaEventRecord(st->step_copied[k], st->compute));
}

// ---- captured work (CUDA graphs) -------------------------------------------------------------

// The capture is thread-local: a call of this thread that a capture cannot hold (a host wait,
// cudaMalloc) fails at once instead of being recorded, and the loader's threads, which are not
// capturing, are free to allocate their page-locked buffers meanwhile.
int cuda_graph_begin(Backend *be, Error *err) {
  CudaState *st = state_of(be);
  if (st->capturing) return error_set(err, "a capture is already under way");
  if (st->profiling)
    return error_set(err, "profiling is on (its per-op events and host waits cannot be captured)");
  cudaError_t e = cudaStreamBeginCapture(st->compute, cudaStreamCaptureModeThreadLocal);
  if (e != cudaSuccess) {
    cudaGetLastError();  // leave no error behind for the next launch check
    return error_set(err, "cudaStreamBeginCapture: %s", cudaGetErrorString(e));
  }
  st->capturing = true;
  return 0;
}

// Ends the capture and instantiates the recording; uploads it to the device now, so that the
// first replay costs what the others do.
void *cuda_graph_end(Backend *be, int64_t *nodes, Error *err) {
  CudaState *st = state_of(be);
  if (!st->capturing) {
    error_set(err, "graph_end without graph_begin");
    return nullptr;
  }
  st->capturing = false;
  cudaGraph_t graph = nullptr;
  cudaError_t e = cudaStreamEndCapture(st->compute, &graph);
  if (e != cudaSuccess || !graph) {
    cudaGetLastError();
    if (graph) cudaGraphDestroy(graph);
    error_set(err, "cudaStreamEndCapture: %s",
              e != cudaSuccess ? cudaGetErrorString(e) : "no graph recorded");
    return nullptr;
  }
  size_t count = 0;
  e = cudaGraphGetNodes(graph, nullptr, &count);
  cudaGraphExec_t exec = nullptr;
  if (e == cudaSuccess) e = cudaGraphInstantiateWithFlags(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (e == cudaSuccess) e = cudaGraphUpload(exec, st->compute);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (exec) cudaGraphExecDestroy(exec);
    error_set(err, "instantiating the captured graph (%zu nodes): %s", count,
              cudaGetErrorString(e));
    return nullptr;
  }
  if (nodes) *nodes = (int64_t)count;
  return exec;
}

void cuda_graph_launch(Backend *be, void *graph) {
  refuse_in_capture(be, "graph_launch");
  CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), state_of(be)->compute));
}

void cuda_graph_destroy(Backend *be, void *graph) {
  refuse_in_capture(be, "graph_destroy");
  if (graph) CUDA_CHECK(cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph)));
}

// ---- model ops --------------------------------------------------------------------------------

void cuda_to_compute(Backend *be, void *dst, const float *src, int64_t n) {
  OpScope scope(be, OP_ELEMENTWISE);
  if (be->act == DTYPE_F32) {
    if (dst != src)
      CUDA_CHECK(cudaMemcpyAsync(dst, src, sizeof(float) * (size_t)n, cudaMemcpyDeviceToDevice,
                                 state_of(be)->compute));
    return;
  }
  to_compute_cuda(be->act, dst, src, n, state_of(be)->compute);
}

void cuda_patch_embed_input(Backend *be, void *patches, const void *input, DType input_dtype,
                            Normalize norm, int B, int H, int W, int Cin, int p) {
  OpScope scope(be, OP_ELEMENTWISE);
  patch_embed_input_cuda(be->act, patches, input, input_dtype, norm.mean, norm.std, B, H, W, Cin, p,
                         state_of(be)->compute);
}

void cuda_drop_path_scales(Backend *be, float *scales, const float *rates, int units, int B,
                           uint64_t seed, const StepParams *step) {
  OpScope scope(be, OP_ELEMENTWISE);
  drop_path_scales_cuda(scales, rates, units, B, seed, &step->step, &step->first_sample,
                        state_of(be)->compute);
}

void cuda_images_normalize(Backend *be, float *images, const uint8_t *pixels, Normalize norm, int B,
                           int H, int W, int Cin) {
  OpScope scope(be, OP_ELEMENTWISE);
  images_normalize_cuda(images, pixels, B, H, W, Cin, norm.mean, norm.std, state_of(be)->compute);
}

void cuda_batch_augment(Backend *be, float *images, const BatchAugment *p, EraseBox *boxes, int B,
                        int H, int W, int C) {
  OpScope scope(be, OP_ELEMENTWISE);
  batch_augment_cuda(images, p, boxes, B, H, W, C, state_of(be)->compute);
}

// Layers on 96 input features in bf16 (Swin-T's stage 0) go to our small-K kernel, fc1 with the
// GELU in its epilogue (kernels/PERF.md, version 12; timed as a GEMM).
bool use_small_k(const Backend *be, int IC, int OC, const void *out, const void *inp,
                 const void *weight, const void *pre) {
  auto aligned = [](const void *p) { return p == nullptr || (uintptr_t)p % 16 == 0; };
  return be->act == DTYPE_BF16 && IC == 96 && linear_small_k_supported(IC, OC) && aligned(out) &&
         aligned(inp) && aligned(weight) && aligned(pre);
}

// bf16 layers with the GELU (fc1) of more than 96 input features go to the Hopper GEMM where
// the device and build have it (sm_90a), the GELU in its epilogue: one pass instead of cuBLASLt
// and the GELU pass (kernels/PERF.md, version 18). The other layers stay on cuBLASLt, faster
// there for now.
bool use_hopper(const Backend *be, int IC, int OC, Activation act, const void *out, const void *inp,
                const void *weight, const void *pre) {
  auto aligned = [](const void *p) { return p == nullptr || (uintptr_t)p % 16 == 0; };
  return act == ACTIVATION_GELU && be->act == DTYPE_BF16 && linear_hopper_supported(IC, OC) &&
         aligned(out) && aligned(inp) && aligned(weight) && aligned(pre);
}

void cuda_linear_forward(Backend *be, void *out, const void *inp, const void *weight,
                         const void *bias, int64_t N, int IC, int OC, Activation act, void *pre) {
  CudaState *st = state_of(be);
  // Our kernels take (pre, post): the plain layer's output is their pre, without a post.
  void *k_pre = act == ACTIVATION_GELU ? pre : out,
       *k_post = act == ACTIVATION_GELU ? out : nullptr;
  if (use_small_k(be, IC, OC, out, inp, weight, k_post ? pre : nullptr)) {
    OpScope scope(be, OP_GEMM);
    linear_small_k_forward_cuda(k_pre, k_post, inp, weight, bias, N, IC, OC, st->compute);
    return;
  }
  if (use_hopper(be, IC, OC, act, out, inp, weight, k_post ? pre : nullptr)) {
    OpScope scope(be, OP_GEMM);
    linear_hopper_forward_cuda(k_pre, k_post, inp, weight, bias, N, IC, OC, st->compute);
    return;
  }
  {
    OpScope scope(be, OP_GEMM);
    linear_forward_cuda(st->gemm, be->act, act == ACTIVATION_GELU ? pre : out, inp, weight, bias, N,
                        IC, OC);
  }
  if (act == ACTIVATION_GELU) {
    OpScope scope(be, OP_ELEMENTWISE);
    gelu_forward_cuda(be->act, out, pre, N * OC, st->compute);
  }
}

// bf16 MLPs whose layers the Hopper GEMM serves, of at most kGeluInputMaxC features, run fc2 on
// it with the GELU applied to its input as it loads it: fc1 writes pre alone and the hidden layer
// is never stored. Wider MLPs keep fc1 with its GELU fused and fc2 on cuBLASLt: there fc2 is
// compute-bound and cuBLASLt's mainloop faster than ours by more than the stored layer costs
// (kernels/PERF.md, version 20: the step measured with the limit at 0, 192, 384 and 768).
constexpr int kGeluInputMaxC = 192;

bool use_gelu_input(const Backend *be, int C, int H, const void *out, const void *pre,
                    const void *w2) {
  auto aligned = [](const void *p) { return p == nullptr || (uintptr_t)p % 16 == 0; };
  return be->act == DTYPE_BF16 && C <= kGeluInputMaxC && linear_hopper_supported(H, C) &&
         aligned(out) && aligned(pre) && aligned(w2);
}

// The paths that store GELU(pre) run only where cuda_mlp_hidden_elements asked the model for
// room; a NULL hidden there means the two disagree.
void need_hidden(const void *hidden, const char *op) {
  if (hidden) return;
  fprintf(stderr,
          "internal error: %s needs hidden (GELU(pre)) but the model planned none\n"
          "HINT: cuda_mlp_hidden_elements (mlp_without_hidden) and %s's choice of path disagree "
          "(src/model/backend_cuda.cu)\n",
          op, op);
  abort();
}

void cuda_mlp_forward(Backend *be, void *out, void *pre, void *hidden, const void *inp,
                      const void *w1, const void *b1, const void *w2, const void *b2, int64_t N,
                      int C, int H) {
  if (use_gelu_input(be, C, H, out, pre, w2)) {
    cuda_linear_forward(be, pre, inp, w1, b1, N, C, H, ACTIVATION_NONE, nullptr);
    if (!out) return;
    OpScope scope(be, OP_GEMM);
    linear_hopper_gelu_forward_cuda(out, pre, w2, b2, N, H, C, state_of(be)->compute);
    return;
  }
  need_hidden(hidden, "mlp_forward");
  cuda_linear_forward(be, hidden, inp, w1, b1, N, C, H, ACTIVATION_GELU, pre);
  if (out) cuda_linear_forward(be, out, hidden, w2, b2, N, H, C, ACTIVATION_NONE, nullptr);
}

void cuda_linear_backward(Backend *be, void *dinp, float *dweight, float *dbias, const void *dout,
                          const void *inp, const void *weight, int64_t N, int IC, int OC) {
  CudaState *st = state_of(be);
  float *scratch = dbias ? scratch_of(be, linear_backward_cuda_scratch(N, OC)) : nullptr;
  OpScope scope(be, OP_GEMM);
  linear_backward_cuda(st->gemm, be->act, dinp, dweight, dbias, dout, inp, weight, N, IC, OC,
                       scratch);
}

// d(hidden) first, then one pass over pre gives GELU(pre) (the dweight product's input), dpre
// and dpre's column sums; then the dweight product.
// In bf16 the pass runs in the d(hidden) product's epilogue on the Hopper GEMM where it serves
// the shape and the layer has at most 512 features: there the pass's bytes outweigh the
// product, which runs slower than cuBLASLt's; at 768 and 1024 (Swin-T's and Swin-B's stage 3,
// compute-bound) the pair was faster (kernels/PERF.md, version 19). Where mlp_without_hidden
// also holds, the dweight product runs in that kernel too and hidden is not written.
bool use_hopper_dgelu(const Backend *be, int IC, int OC, const void *dpre, const void *hidden,
                      const void *dout, const void *pre, const void *weight) {
  auto aligned = [](const void *p) { return (uintptr_t)p % 16 == 0; };
  return be->act == DTYPE_BF16 && OC <= 512 && linear_hopper_supported(OC, IC) && aligned(dpre) &&
         aligned(hidden) && aligned(dout) && aligned(pre) && aligned(weight);
}

// Where the MLP's forward and backward never store GELU(pre): the forward applies GELU in fc2's
// operand load (use_gelu_input) and the backward computes fc2's weight gradient inside the
// d(hidden) product (linear_hopper_dgelu_dweight_cuda; kernels/PERF.md, version 22).
bool mlp_without_hidden(const Backend *be, int C, int H) {
  return be->act == DTYPE_BF16 && C <= kGeluInputMaxC && linear_hopper_supported(H, C) &&
         linear_hopper_supported(C, H) && linear_hopper_dgelu_dweight_supported(H, C);
}

int64_t cuda_mlp_hidden_elements(Backend *be, int64_t N, int C, int H) {
  return mlp_without_hidden(be, C, H) ? 0 : N * H;
}

void cuda_gelu_linear_backward(Backend *be, void *dpre, void *hidden, float *dweight,
                               float *dpre_bias, const void *dout, const void *pre,
                               const void *weight, int64_t N, int IC, int OC) {
  CudaState *st = state_of(be);
  if (use_hopper_dgelu(be, IC, OC, dpre, hidden, dout, pre, weight) &&
      mlp_without_hidden(be, OC, IC)) {
    OpScope scope(be, OP_GEMM);
    linear_hopper_dgelu_dweight_cuda(
        dpre, dweight, dpre_bias, scratch_of(be, linear_hopper_dgelu_dweight_scratch(N, IC, OC)),
        dout, weight, pre, N, IC, OC, st->compute);
    return;
  }
  need_hidden(hidden, "gelu_linear_backward");
  if (use_hopper_dgelu(be, IC, OC, dpre, hidden, dout, pre, weight)) {
    {
      OpScope scope(be, OP_GEMM);
      linear_hopper_dgelu_cuda(dpre, hidden, dpre_bias,
                               scratch_of(be, linear_hopper_dgelu_scratch(N, IC, OC)), dout, weight,
                               pre, N, IC, OC, st->compute);
    }
    cuda_linear_backward(be, nullptr, dweight, nullptr, dout, hidden, weight, N, IC, OC);
    return;
  }
  {
    OpScope scope(be, OP_GEMM);
    linear_backward_cuda(st->gemm, be->act, dpre, nullptr, nullptr, dout, nullptr, weight, N, IC,
                         OC, nullptr);
  }
  {
    OpScope scope(be, OP_ELEMENTWISE);
    float *scratch = dpre_bias ? scratch_of(be, column_sums_cuda_scratch(N, IC)) : nullptr;
    gelu_recompute_backward_cuda(be->act, hidden, dpre, pre, dpre, N, IC, dpre_bias, scratch,
                                 st->compute);
  }
  cuda_linear_backward(be, nullptr, dweight, nullptr, dout, hidden, weight, N, IC, OC);
}

void cuda_residual_layernorm_forward(Backend *be, void *x_out, void *ln_out, float *mean,
                                     float *rstd, const void *x_in, const void *branch,
                                     const WindowMap *branch_map, const float *scale,
                                     const float *weight, const float *bias,
                                     const WindowMap *ln_map, int B, int64_t L, int C) {
  OpScope scope(be, OP_LAYERNORM);
  residual_layernorm_forward_cuda(be->act, x_out, ln_out, mean, rstd, x_in, branch, branch_map,
                                  scale, weight, bias, ln_map, B, L, C, state_of(be)->compute);
}

// A layer or an MLP and the residual + LayerNorm after it, in one kernel where ours serve the
// shape (kernels/gemm.h: linear_small_k_residual_layernorm_cuda for a proj on the small-K kernel;
// linear_hopper_gelu_residual_layernorm_cuda for an fc2 with the GELU in its operand load, C
// 96-192), else the two ops. Either way the same bits (kernels/PERF.md, versions 24 and 25).
void cuda_linear_residual_layernorm_forward(Backend *be, void *x_out, void *ln_out, float *mean,
                                            float *rstd, void *branch, const void *x_in,
                                            const void *inp, const void *weight,
                                            const void *lin_bias, const WindowMap *branch_map,
                                            const float *scale, const float *ln_weight,
                                            const float *ln_bias, int B, int64_t L, int IC, int C) {
  if (ln_out && use_small_k(be, IC, C, x_out, inp, weight, ln_out) && (uintptr_t)x_in % 16 == 0 &&
      x_out != x_in && linear_small_k_residual_layernorm_supported(IC, C)) {
    OpScope scope(be, OP_GEMM);
    linear_small_k_residual_layernorm_cuda(x_out, ln_out, mean, rstd, x_in, inp, branch_map, scale,
                                           weight, lin_bias, ln_weight, ln_bias, B, L, IC, C,
                                           state_of(be)->compute);
    return;
  }
  cuda_linear_forward(be, branch, inp, weight, lin_bias, (int64_t)B * L, IC, C, ACTIVATION_NONE,
                      nullptr);
  cuda_residual_layernorm_forward(be, x_out, ln_out, mean, rstd, x_in, branch, branch_map, scale,
                                  ln_weight, ln_bias, nullptr, B, L, C);
}

void cuda_mlp_residual_layernorm_forward(Backend *be, void *x_out, void *ln_out, float *mean,
                                         float *rstd, void *branch, void *pre, void *hidden,
                                         const void *x_in, const void *inp, const void *w1,
                                         const void *b1, const void *w2, const void *b2,
                                         const float *scale, const float *ln_weight,
                                         const float *ln_bias, const WindowMap *ln_map, int B,
                                         int64_t L, int C, int H) {
  auto aligned = [](const void *p) { return (uintptr_t)p % 16 == 0; };
  const int64_t N = (int64_t)B * L;
  if (use_gelu_input(be, C, H, x_out, pre, w2) &&
      linear_hopper_gelu_residual_layernorm_supported(H, C) && aligned(x_in) && aligned(ln_out) &&
      x_out != x_in && N <= INT32_MAX) {
    cuda_linear_forward(be, pre, inp, w1, b1, N, C, H, ACTIVATION_NONE, nullptr);
    OpScope scope(be, OP_GEMM);
    linear_hopper_gelu_residual_layernorm_cuda(x_out, ln_out, mean, rstd, x_in, pre, w2, b2, scale,
                                               ln_weight, ln_bias, ln_map, B, L, H, C,
                                               state_of(be)->compute);
    return;
  }
  cuda_mlp_forward(be, branch, pre, hidden, inp, w1, b1, w2, b2, N, C, H);
  cuda_residual_layernorm_forward(be, x_out, ln_out, mean, rstd, x_in, branch, nullptr, scale,
                                  ln_weight, ln_bias, ln_map, B, L, C);
}

void cuda_residual_layernorm_backward(Backend *be, float *dres_out, void *dbranch,
                                      float *dbranch_bias, float *dweight, float *dbias,
                                      const float *dres_in, const void *dln, const void *x,
                                      const float *weight, const float *mean, const float *rstd,
                                      const WindowMap *branch_map, const float *scale,
                                      const WindowMap *ln_map, int B, int64_t L, int C) {
  OpScope scope(be, OP_LAYERNORM);
  float *scratch = dln || dbranch_bias
                       ? scratch_of(be, residual_layernorm_backward_cuda_scratch((int64_t)B * L, C))
                       : nullptr;
  residual_layernorm_backward_cuda(be->act, dres_out, dbranch, dbranch_bias, dweight, dbias,
                                   dres_in, dln, x, weight, mean, rstd, branch_map, scale, ln_map,
                                   B, L, C, scratch, state_of(be)->compute);
}

// The input-gradient product and the LayerNorm backward after it: the two ops (kernels/PERF.md,
// Next: the LayerNorm's rows in the product's epilogue).
void cuda_linear_residual_layernorm_backward(
    Backend *be, float *dres_out, void *dbranch, float *dbranch_bias, float *dweight,
    float *ln_dweight, float *ln_dbias, void *dln, const float *dres_in, const void *dout,
    const void *inp, const void *weight, const void *x, const float *ln_weight, const float *mean,
    const float *rstd, const WindowMap *branch_map, const float *scale, const WindowMap *ln_map,
    int B, int64_t L, int IC, int OC) {
  cuda_linear_backward(be, dln, dweight, nullptr, dout, inp, weight, (int64_t)B * L, IC, OC);
  cuda_residual_layernorm_backward(be, dres_out, dbranch, dbranch_bias, ln_dweight, ln_dbias,
                                   dres_in, dln, x, ln_weight, mean, rstd, branch_map, scale,
                                   ln_map, B, L, IC);
}

void cuda_merge_layernorm_forward(Backend *be, void *out, float *mean, float *rstd,
                                  const void *tokens, const float *weight, const float *bias, int B,
                                  int H, int W, int C) {
  OpScope scope(be, OP_LAYERNORM);
  merge_layernorm_forward_cuda(be->act, out, mean, rstd, tokens, weight, bias, B, H, W, C,
                               state_of(be)->compute);
}

void cuda_merge_layernorm_backward(Backend *be, float *dtokens, float *dweight, float *dbias,
                                   const void *dout, const void *tokens, const float *weight,
                                   const float *mean, const float *rstd, int B, int H, int W,
                                   int C) {
  OpScope scope(be, OP_LAYERNORM);
  float *scratch = scratch_of(be, merge_layernorm_backward_cuda_scratch(B, H, W, C));
  merge_layernorm_backward_cuda(be->act, dtokens, dweight, dbias, dout, tokens, weight, mean, rstd,
                                B, H, W, C, scratch, state_of(be)->compute);
}

void cuda_postnorm_residual_forward(Backend *be, void *x_out, void *xw_out, float *mean,
                                    float *rstd, const void *x_in, const void *branch,
                                    const WindowMap *branch_map, const float *scale,
                                    const float *weight, const float *bias,
                                    const WindowMap *out_map, int B, int64_t L, int C) {
  OpScope scope(be, OP_LAYERNORM);
  postnorm_residual_forward_cuda(be->act, x_out, xw_out, mean, rstd, x_in, branch, branch_map,
                                 scale, weight, bias, out_map, B, L, C, state_of(be)->compute);
}

void cuda_postnorm_residual_backward(Backend *be, float *dres_out, void *dbranch,
                                     float *dbranch_bias, float *dweight, float *dbias,
                                     const float *dres_in, const void *dx, const WindowMap *x_map,
                                     const void *branch, const float *weight, const float *mean,
                                     const float *rstd, const WindowMap *branch_map,
                                     const float *scale, int B, int64_t L, int C) {
  OpScope scope(be, OP_LAYERNORM);
  float *scratch = dweight || dbias || dbranch_bias
                       ? scratch_of(be, postnorm_residual_backward_cuda_scratch((int64_t)B * L, C))
                       : nullptr;
  postnorm_residual_backward_cuda(be->act, dres_out, dbranch, dbranch_bias, dweight, dbias, dres_in,
                                  dx, x_map, branch, weight, mean, rstd, branch_map, scale, B, L, C,
                                  scratch, state_of(be)->compute);
}

void cuda_patch_merge_forward(Backend *be, void *merged, const void *tokens, int B, int H, int W,
                              int C) {
  OpScope scope(be, OP_ELEMENTWISE);
  patch_merge_forward_cuda(be->act, merged, tokens, B, H, W, C, state_of(be)->compute);
}

void cuda_patch_merge_backward(Backend *be, float *dtokens, const void *dmerged, int B, int H,
                               int W, int C) {
  OpScope scope(be, OP_ELEMENTWISE);
  patch_merge_backward_cuda(be->act, dtokens, dmerged, B, H, W, C, state_of(be)->compute);
}

int64_t cuda_attention_saved_floats(Backend *be, int BW, int N, int C, int heads) {
  return window_attention_saved_floats(be->act, BW, N, C, heads);
}

void cuda_attention_forward(Backend *be, void *out, float *saved, const void *qkv,
                            const float *table, const int *index, const float *mask, int BW, int nW,
                            int N, int C, int heads, float scale) {
  OpScope scope(be, OP_ATTENTION);
  window_attention_forward_cuda(be->act, out, saved, qkv, table, index, mask, BW, nW, N, C, heads,
                                scale, state_of(be)->compute);
}

// The qkv bias gradient comes out of the attention backward (the tensor-core kernel sums dq,
// dk and dv's columns as it writes them; kernels/attention.h).
void cuda_attention_backward(Backend *be, void *dqkv, float *dqkv_bias, float *dtable,
                             const void *dout, const void *qkv, const void *out, const float *table,
                             const int *index, const float *mask, float *saved, int BW, int nW,
                             int N, int C, int heads, float scale) {
  OpScope scope(be, OP_ATTENTION);
  int64_t need = window_attention_backward_cuda_scratch(be->act, BW, N, C, heads);
  float *scratch = scratch_of(be, need);
  window_attention_backward_cuda(be->act, dqkv, dqkv_bias, dtable, dout, qkv, out, saved, table,
                                 index, mask, BW, nW, N, C, heads, scale, scratch,
                                 state_of(be)->compute);
}

void cuda_cosine_qk_forward(Backend *be, void *qkv, float *norms, const float *q_bias,
                            const float *v_bias, const float *logit_scale, int64_t rows, int C,
                            int heads) {
  OpScope scope(be, OP_ATTENTION);
  cosine_qk_forward_cuda(be->act, qkv, norms, q_bias, v_bias, logit_scale, rows, C, heads,
                         state_of(be)->compute);
}

void cuda_cosine_qk_backward(Backend *be, void *dqkv, float *dq_bias, float *dv_bias,
                             float *dlogit_scale, const void *qkv, const float *norms,
                             const float *logit_scale, int64_t rows, int C, int heads) {
  OpScope scope(be, OP_ATTENTION);
  float *scratch = scratch_of(be, cosine_qk_backward_cuda_scratch(rows, C, heads));
  cosine_qk_backward_cuda(be->act, dqkv, dq_bias, dv_bias, dlogit_scale, qkv, norms, logit_scale,
                          rows, C, heads, scratch, state_of(be)->compute);
}

void cuda_cpb_forward(Backend *be, float *table, float *hidden, const float *coords,
                      const float *w1, const float *b1, const float *w2, int T, int heads) {
  OpScope scope(be, OP_ATTENTION);
  cpb_forward_cuda(table, hidden, coords, w1, b1, w2, T, heads, state_of(be)->compute);
}

void cuda_cpb_backward(Backend *be, float *dw1, float *db1, float *dw2, const float *dtable,
                       const float *table, const float *hidden, const float *coords,
                       const float *w2, int T, int heads) {
  OpScope scope(be, OP_ATTENTION);
  cpb_backward_cuda(dw1, db1, dw2, dtable, table, hidden, coords, w2, T, heads,
                    state_of(be)->compute);
}

void cuda_head_forward(Backend *be, float *logits, float *pooled, const void *tokens,
                       const float *weight, const float *bias, int B, int L, int C, int K) {
  CudaState *st = state_of(be);
  OpScope scope(be, OP_GEMM);
  mean_pool_forward_cuda(be->act, pooled, tokens, B, L, C, st->compute);
  linear_forward_cuda(st->gemm, DTYPE_F32, logits, pooled, weight, bias, B, C, K);
}

void cuda_head_backward(Backend *be, void *dtokens, float *dweight, float *dbias,
                        const float *dlogits, const float *pooled, const float *weight, int B,
                        int L, int C, int K) {
  CudaState *st = state_of(be);
  OpScope scope(be, OP_GEMM);
  // d(pooled) lives past the dbias partials in scratch: both are needed by this op alone.
  int64_t offset = (linear_backward_cuda_scratch(B, K) + 63) & ~(int64_t)63;
  float *scratch = scratch_of(be, offset + (int64_t)B * C);
  float *dpooled = scratch + offset;
  linear_backward_cuda(st->gemm, DTYPE_F32, dpooled, dweight, dbias, dlogits, pooled, weight, B, C,
                       K, scratch);
  mean_pool_backward_cuda(be->act, dtokens, dpooled, B, L, C, st->compute);
}

// ---- loss, metrics, optimizer -----------------------------------------------------------------

void cuda_train_loss(Backend *be, float *dlogits, const float *logits, const int *labels,
                     const float *soft_targets, float smoothing, int B, int K, int grad_count,
                     OptimState *state) {
  OpScope scope(be, OP_LOSS);
  CudaState *st = state_of(be);
  check_batch(be, "train_loss", B);
  cross_entropy_forward_backward_cuda(
      st->row_losses, dlogits, logits, soft_targets ? nullptr : labels, soft_targets,
      soft_targets ? 0.0f : smoothing, &state->loss_scale, B, K, grad_count, st->compute);
  losses_accumulate_cuda(&state->loss_sum, &state->loss_steps, &state->bad_losses, st->row_losses,
                         B, true, st->compute);
}

void cuda_eval_metrics(Backend *be, EvalSums *sums, const float *logits, const int *labels, int B,
                       int K) {
  OpScope scope(be, OP_LOSS);
  CudaState *st = state_of(be);
  check_batch(be, "eval_metrics", B);
  cross_entropy_forward_backward_cuda(st->row_losses, nullptr, logits, labels, nullptr, 0.0f,
                                      nullptr, B, K, B, st->compute);
  losses_accumulate_cuda(&sums->loss_sum, &sums->count, nullptr, st->row_losses, B, false,
                         st->compute);
  topk_accumulate_cuda(logits, labels, B, K, &sums->top1, &sums->top5, st->compute);
}

void cuda_optimizer_step(Backend *be, float *params, void *compute, const float *grads, float *m,
                         float *v, int64_t n, const AdamWChunk *chunks, int num_chunks,
                         OptimizerStep hyper, const StepParams *step, OptimState *state) {
  OpScope scope(be, OP_OPTIMIZER);
  optimizer_step_cuda(be->act, params, compute, grads, m, v, n, chunks, num_chunks, hyper,
                      &step->lr, state, scratch_of(be, optimizer_step_cuda_scratch(n)),
                      state_of(be)->compute);
}

void cuda_ema_update(Backend *be, float *ema, const float *params, int64_t n, EmaSettings s,
                     const OptimState *state) {
  OpScope scope(be, OP_OPTIMIZER);
  ema_update_cuda(ema, params, n, s, state, state_of(be)->compute);
}

void cuda_weights_swap(Backend *be, float *a, float *b, int64_t n) {
  OpScope scope(be, OP_MEMORY);
  weights_swap_cuda(a, b, n, state_of(be)->compute);
}

const BackendOps cuda_ops = {
    .name = "cuda",
    .max_window_tokens = WINDOW_ATTENTION_CUDA_MAX_N,
    .max_head_dim = WINDOW_ATTENTION_CUDA_MAX_HEAD_DIM,
    .alloc = cuda_alloc,
    .release = cuda_release,
    .host_alloc = cuda_host_alloc,
    .host_release = cuda_host_release,
    .upload = cuda_upload,
    .download = cuda_download,
    .zero = cuda_zero,
    .copy = cuda_copy,
    .synchronize = cuda_synchronize,
    .reserve = cuda_reserve,
    .stage_upload = cuda_stage_upload,
    .stage_consume = cuda_stage_consume,
    .stage_release = cuda_stage_release,
    .stage_wait = cuda_stage_wait,
    .record_event = cuda_record_event,
    .wait_event = cuda_wait_event,
    .mark_create = cuda_mark_create,
    .mark_destroy = cuda_mark_destroy,
    .mark_record = cuda_mark_record,
    .mark_seconds = cuda_mark_seconds,
    .step_params_set = cuda_step_params_set,
    .to_compute = cuda_to_compute,
    .patch_embed_input = cuda_patch_embed_input,
    .drop_path_scales = cuda_drop_path_scales,
    .images_normalize = cuda_images_normalize,
    .batch_augment = cuda_batch_augment,
    .linear_forward = cuda_linear_forward,
    .mlp_hidden_elements = cuda_mlp_hidden_elements,
    .mlp_forward = cuda_mlp_forward,
    .mlp_residual_layernorm_forward = cuda_mlp_residual_layernorm_forward,
    .linear_backward = cuda_linear_backward,
    .gelu_linear_backward = cuda_gelu_linear_backward,
    .residual_layernorm_forward = cuda_residual_layernorm_forward,
    .linear_residual_layernorm_forward = cuda_linear_residual_layernorm_forward,
    .residual_layernorm_backward = cuda_residual_layernorm_backward,
    .linear_residual_layernorm_backward = cuda_linear_residual_layernorm_backward,
    .merge_layernorm_forward = cuda_merge_layernorm_forward,
    .merge_layernorm_backward = cuda_merge_layernorm_backward,
    .postnorm_residual_forward = cuda_postnorm_residual_forward,
    .postnorm_residual_backward = cuda_postnorm_residual_backward,
    .patch_merge_forward = cuda_patch_merge_forward,
    .patch_merge_backward = cuda_patch_merge_backward,
    .attention_saved_floats = cuda_attention_saved_floats,
    .attention_forward = cuda_attention_forward,
    .attention_backward = cuda_attention_backward,
    .cosine_qk_forward = cuda_cosine_qk_forward,
    .cosine_qk_backward = cuda_cosine_qk_backward,
    .cpb_forward = cuda_cpb_forward,
    .cpb_backward = cuda_cpb_backward,
    .head_forward = cuda_head_forward,
    .head_backward = cuda_head_backward,
    .train_loss = cuda_train_loss,
    .eval_metrics = cuda_eval_metrics,
    .optimizer_step = cuda_optimizer_step,
    .ema_update = cuda_ema_update,
    .weights_swap = cuda_weights_swap,
    .graph_begin = cuda_graph_begin,
    .graph_end = cuda_graph_end,
    .graph_launch = cuda_graph_launch,
    .graph_destroy = cuda_graph_destroy,
    .profile = cuda_profile,
    .profile_report = cuda_profile_report,
    .gemm_tuning = cuda_gemm_tuning,
    .gemm_report = cuda_gemm_report,
    .gemm_choices_write = cuda_gemm_choices_write,
    .gemm_choices_read = cuda_gemm_choices_read,
};

}  // namespace

bool backend_cuda_device_usable(char *name, size_t size, double *gib) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
    cudaGetLastError();  // clear the sticky error of a machine without a driver
    return false;
  }
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return false;
  if (name) snprintf(name, size, "%s", prop.name);
  if (gib) *gib = (double)prop.totalGlobalMem / (1 << 30);
  return true;
}

int backend_cuda_init(Backend *be, DType act, Error *err) {
  *be = Backend{};
  be->ops = &cuda_ops;
  be->device = DEVICE_CUDA;
  be->act = act;
  CudaState *st = static_cast<CudaState *>(calloc(1, sizeof(CudaState)));
  if (!st) return error_set(err, "out of host memory");
  if (cudaGetDevice(&st->device) != cudaSuccess) {
    free(st);
    return error_set(err, "no CUDA device\nHINT: set device=cpu");
  }
  CUDA_CHECK(cudaStreamCreateWithFlags(&st->compute, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&st->copy, cudaStreamNonBlocking));
  for (int i = 0; i < kSlots; i++) {
    CUDA_CHECK(cudaEventCreateWithFlags(&st->uploaded[i], cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&st->released[i], cudaEventDisableTiming));
  }
  CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void **>(&st->step_host),
                           sizeof(StepParams) * kStepSlots, cudaHostAllocDefault));
  for (int i = 0; i < kStepSlots; i++)
    CUDA_CHECK(cudaEventCreateWithFlags(&st->step_copied[i], cudaEventDisableTiming));
  st->gemm = gemm_context_create(st->compute);
  be->impl = st;
  be->bytes_in_use = gemm_context_bytes();
  return 0;
}

void backend_cuda_destroy(Backend *be) {
  CudaState *st = state_of(be);
  if (!st) return;
  cudaStreamSynchronize(st->compute);
  cudaStreamSynchronize(st->copy);
  gemm_context_destroy(st->gemm);
  cudaFree(st->scratch);
  cudaFree(st->row_losses);
  if (st->marks) {
    for (int i = 0; i < 2 * kMaxMarks; i++) cudaEventDestroy(st->marks[i]);
    free(st->marks);
  }
  for (int i = 0; i < kSlots; i++) {
    cudaEventDestroy(st->uploaded[i]);
    cudaEventDestroy(st->released[i]);
  }
  for (int i = 0; i < kStepSlots; i++) cudaEventDestroy(st->step_copied[i]);
  cudaFreeHost(st->step_host);
  cudaStreamDestroy(st->compute);
  cudaStreamDestroy(st->copy);
  free(st);
  be->impl = nullptr;
}
