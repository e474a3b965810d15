// backend_cpu.c: the CPU backend: backend memory is host memory, queued ops run at once, and each
// op is the reference kernel of kernels/cpu/ (fused ops composed of their pieces). f32 only: it is
// the reference the CUDA backend's f32, bf16 and f16 are measured against. The bias gradients the
// GPU sums in the kernel that writes a gradient (the *_bias outputs of src/model/backend.h) are a
// column_sums_cpu pass over that gradient here: one thread, rows in order, so the bits do not
// depend on the thread count.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/augment.h"
#include "kernels/cosine_attention.h"
#include "kernels/gelu.h"
#include "kernels/gemm.h"
#include "kernels/layernorm.h"
#include "kernels/loss.h"
#include "kernels/patch.h"
#include "kernels/residual.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/ema.h"
#include "src/base/rng.h"
#include "src/model/backend.h"

typedef struct {
  float *scratch;  // 2 * max_elements floats: the fused ops' intermediates
  int64_t scratch_floats;
} CpuState;

static CpuState *cpu_state(Backend *be) {
  return (CpuState *)be->impl;
}

// Scratch of at least n floats; the model reserves enough before the first op.
static float *cpu_scratch(Backend *be, int64_t n) {
  CpuState *st = cpu_state(be);
  if (n > st->scratch_floats) {
    fprintf(stderr, "internal error: CPU backend scratch of %lld floats, %lld needed\n",
            (long long)st->scratch_floats, (long long)n);
    abort();
  }
  return st->scratch;
}

// ---- memory ---------------------------------------------------------------------------------

static void *cpu_alloc(Backend *be, size_t bytes) {
  void *p = aligned_alloc_check(bytes ? bytes : 64);
  memset(p, 0, bytes);
  be->bytes_in_use += bytes;
  return p;
}

static void cpu_release(Backend *be, void *ptr) {
  (void)be;
  free(ptr);
}

static void *cpu_host_alloc(size_t bytes) {
  return malloc(bytes ? bytes : 1);
}

static void cpu_host_release(void *ptr) {
  free(ptr);
}

static void cpu_copy(Backend *be, void *dst, const void *src, size_t bytes) {
  (void)be;
  if (dst != src) memcpy(dst, src, bytes);
}

static void cpu_download(Backend *be, void *dst, const void *src, size_t bytes) {
  be->host_waits++;
  cpu_copy(be, dst, src, bytes);
}

static void cpu_zero(Backend *be, void *ptr, size_t bytes) {
  (void)be;
  memset(ptr, 0, bytes);
}

static void cpu_synchronize(Backend *be) {
  be->host_waits++;
}

static void cpu_reserve(Backend *be, const BackendNeeds *needs) {
  CpuState *st = cpu_state(be);
  int64_t n = 2 * needs->max_elements;
  if (n <= st->scratch_floats) return;
  free(st->scratch);
  st->scratch = aligned_alloc_check(sizeof(float) * (size_t)n);
  st->scratch_floats = n;
}

static void cpu_stage_upload(Backend *be, int slot, int count, void *const *dst,
                             const void *const *src, const size_t *bytes) {
  (void)slot;
  for (int i = 0; i < count; i++) cpu_copy(be, dst[i], src[i], bytes[i]);
}

static void cpu_stage_nothing(Backend *be, int slot) {
  (void)be;
  (void)slot;
}

static void cpu_event_nothing(Backend *be, void *event) {
  (void)be;
  (void)event;
}

static void *cpu_mark_create(Backend *be) {
  (void)be;
  return calloc_check(1, sizeof(double));
}

static void cpu_mark_destroy(Backend *be, void *mark) {
  (void)be;
  free(mark);
}

static void cpu_mark_record(Backend *be, void *mark) {
  (void)be;
  *(double *)mark = time_now_s();
}

static double cpu_mark_seconds(Backend *be, void *a, void *b) {
  (void)be;
  return *(const double *)b - *(const double *)a;
}

// Backend memory is host memory, and the ops that read it run when they are called.
static void cpu_step_params_set(Backend *be, StepParams *params, const StepParams *values) {
  (void)be;
  *params = *values;
}

// ---- model ops ------------------------------------------------------------------------------

static void cpu_to_compute(Backend *be, void *dst, const float *src, int64_t n) {
  cpu_copy(be, dst, src, sizeof(float) * (size_t)n);
}

static void cpu_patch_embed_input(Backend *be, void *patches, const void *input, DType input_dtype,
                                  Normalize norm, int B, int H, int W, int Cin, int p) {
  const float *images = input;
  if (input_dtype == DTYPE_U8) {
    float *normalized = cpu_scratch(be, (int64_t)B * H * W * Cin);
    images_normalize_cpu(normalized, input, B, H, W, Cin, norm.mean, norm.std);
    images = normalized;
  }
  patch_gather_cpu(patches, images, B, H, W, Cin, p);
}

static void cpu_drop_path_scales(Backend *be, float *scales, const float *rates, int units, int B,
                                 uint64_t seed, const StepParams *params) {
  (void)be;
  const int64_t step = params->step, first_sample = params->first_sample;
  for (int u = 0; u < units; u++) {
    // timm drop_path: keep with probability 1 - rate, kept samples scaled by 1 / keep.
    float keep = 1.0f - rates[u / 2];
    for (int b = 0; b < B; b++) {
      float r = rng_u32_to_uniform(rng_u32_at(seed, RNG_STREAM_DROP_PATH, (uint64_t)step,
                                              (uint64_t)u, (uint32_t)(first_sample + b)));
      scales[(int64_t)u * B + b] = r < keep ? 1.0f / keep : 0.0f;
    }
  }
}

static void cpu_images_normalize(Backend *be, float *images, const uint8_t *pixels, Normalize norm,
                                 int B, int H, int W, int Cin) {
  (void)be;
  images_normalize_cpu(images, pixels, B, H, W, Cin, norm.mean, norm.std);
}

static void cpu_batch_augment(Backend *be, float *images, const BatchAugment *p, EraseBox *boxes,
                              int B, int H, int W, int C) {
  (void)be;
  (void)boxes;  // the CPU reads the host boxes p->erase directly
  batch_augment_cpu(images, p, B, H, W, C);
}

static void cpu_linear_forward(Backend *be, void *out, const void *inp, const void *weight,
                               const void *bias, int64_t N, int IC, int OC, Activation act,
                               void *pre) {
  (void)be;
  if (act == ACTIVATION_GELU) {
    linear_forward_cpu(pre, inp, weight, bias, N, IC, OC);
    gelu_forward_cpu(out, pre, N * OC);
  } else {
    linear_forward_cpu(out, inp, weight, bias, N, IC, OC);
  }
}

// The CPU composes the MLP from the reference pieces, whose fc2 reads GELU(pre) from memory.
static int64_t cpu_mlp_hidden_elements(Backend *be, int64_t N, int C, int H) {
  (void)be;
  (void)C;
  return N * H;
}

static void cpu_mlp_forward(Backend *be, void *out, void *pre, void *hidden, const void *inp,
                            const void *w1, const void *b1, const void *w2, const void *b2,
                            int64_t N, int C, int H) {
  (void)be;
  linear_forward_cpu(pre, inp, w1, b1, N, C, H);
  if (!out) return;
  gelu_forward_cpu(hidden, pre, N * H);
  linear_forward_cpu(out, hidden, w2, b2, N, H, C);
}

static void cpu_linear_backward(Backend *be, void *dinp, float *dweight, float *dbias,
                                const void *dout, const void *inp, const void *weight, int64_t N,
                                int IC, int OC) {
  (void)be;
  linear_backward_cpu(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
}

static void cpu_gelu_linear_backward(Backend *be, void *dpre, void *hidden, float *dweight,
                                     float *dpre_bias, const void *dout, const void *pre,
                                     const void *weight, int64_t N, int IC, int OC) {
  (void)be;
  gelu_forward_cpu(hidden, pre, N * IC);
  linear_backward_cpu(dpre, dweight, NULL, dout, hidden, weight, N, IC, OC);
  gelu_backward_cpu(dpre, pre, dpre, N * IC);
  if (dpre_bias) column_sums_cpu(dpre_bias, dpre, N, IC);
}

static void cpu_residual_layernorm_forward(Backend *be, void *x_out, void *ln_out, float *mean,
                                           float *rstd, const void *x_in, const void *branch,
                                           const WindowMap *branch_map, const float *scale,
                                           const float *weight, const float *bias,
                                           const WindowMap *ln_map, int B, int64_t L, int C) {
  residual_layernorm_forward_cpu(x_out, ln_out, mean, rstd, x_in, branch, branch_map, scale, weight,
                                 bias, ln_map, B, L, C, cpu_scratch(be, 2 * (int64_t)B * L * C));
}

static void cpu_mlp_residual_layernorm_forward(Backend *be, void *x_out, void *ln_out, float *mean,
                                               float *rstd, void *branch, void *pre, void *hidden,
                                               const void *x_in, const void *inp, const void *w1,
                                               const void *b1, const void *w2, const void *b2,
                                               const float *scale, const float *ln_weight,
                                               const float *ln_bias, const WindowMap *ln_map, int B,
                                               int64_t L, int C, int H) {
  cpu_mlp_forward(be, branch, pre, hidden, inp, w1, b1, w2, b2, (int64_t)B * L, C, H);
  cpu_residual_layernorm_forward(be, x_out, ln_out, mean, rstd, x_in, branch, NULL, scale,
                                 ln_weight, ln_bias, ln_map, B, L, C);
}

static void cpu_linear_residual_layernorm_forward(Backend *be, void *x_out, void *ln_out,
                                                  float *mean, float *rstd, void *branch,
                                                  const void *x_in, const void *inp,
                                                  const void *weight, const void *lin_bias,
                                                  const WindowMap *branch_map, const float *scale,
                                                  const float *ln_weight, const float *ln_bias,
                                                  int B, int64_t L, int IC, int C) {
  linear_forward_cpu(branch, inp, weight, lin_bias, (int64_t)B * L, IC, C);
  cpu_residual_layernorm_forward(be, x_out, ln_out, mean, rstd, x_in, branch, branch_map, scale,
                                 ln_weight, ln_bias, NULL, B, L, C);
}

static void cpu_residual_layernorm_backward(Backend *be, float *dres_out, void *dbranch,
                                            float *dbranch_bias, float *dweight, float *dbias,
                                            const float *dres_in, const void *dln, const void *x,
                                            const float *weight, const float *mean,
                                            const float *rstd, const WindowMap *branch_map,
                                            const float *scale, const WindowMap *ln_map, int B,
                                            int64_t L, int C) {
  residual_layernorm_backward_cpu(dres_out, dbranch, dweight, dbias, dres_in, dln, x, weight, mean,
                                  rstd, branch_map, scale, ln_map, B, L, C,
                                  cpu_scratch(be, 2 * (int64_t)B * L * C));
  if (dbranch_bias) column_sums_cpu(dbranch_bias, dbranch, (int64_t)B * L, C);
}

static void cpu_linear_residual_layernorm_backward(
    Backend *be, float *dres_out, void *dbranch, float *dbranch_bias, float *dweight,
    float *ln_dweight, float *ln_dbias, void *dln, const float *dres_in, const void *dout,
    const void *inp, const void *weight, const void *x, const float *ln_weight, const float *mean,
    const float *rstd, const WindowMap *branch_map, const float *scale, const WindowMap *ln_map,
    int B, int64_t L, int IC, int OC) {
  cpu_linear_backward(be, dln, dweight, NULL, dout, inp, weight, (int64_t)B * L, IC, OC);
  cpu_residual_layernorm_backward(be, dres_out, dbranch, dbranch_bias, ln_dweight, ln_dbias,
                                  dres_in, dln, x, ln_weight, mean, rstd, branch_map, scale, ln_map,
                                  B, L, IC);
}

static void cpu_merge_layernorm_forward(Backend *be, void *out, float *mean, float *rstd,
                                        const void *tokens, const float *weight, const float *bias,
                                        int B, int H, int W, int C) {
  merge_layernorm_forward_cpu(out, mean, rstd, tokens, weight, bias, B, H, W, C,
                              cpu_scratch(be, 2 * (int64_t)B * H * W * C));
}

static void cpu_merge_layernorm_backward(Backend *be, float *dtokens, float *dweight, float *dbias,
                                         const void *dout, const void *tokens, const float *weight,
                                         const float *mean, const float *rstd, int B, int H, int W,
                                         int C) {
  merge_layernorm_backward_cpu(dtokens, dweight, dbias, dout, tokens, weight, mean, rstd, B, H, W,
                               C, cpu_scratch(be, 2 * (int64_t)B * H * W * C));
}

static void cpu_postnorm_residual_forward(Backend *be, void *x_out, void *xw_out, float *mean,
                                          float *rstd, const void *x_in, const void *branch,
                                          const WindowMap *branch_map, const float *scale,
                                          const float *weight, const float *bias,
                                          const WindowMap *out_map, int B, int64_t L, int C) {
  (void)be;
  postnorm_residual_forward_cpu(x_out, xw_out, mean, rstd, x_in, branch, branch_map, scale, weight,
                                bias, out_map, B, L, C);
}

static void cpu_postnorm_residual_backward(Backend *be, float *dres_out, void *dbranch,
                                           float *dbranch_bias, float *dweight, float *dbias,
                                           const float *dres_in, const void *dx,
                                           const WindowMap *x_map, const void *branch,
                                           const float *weight, const float *mean,
                                           const float *rstd, const WindowMap *branch_map,
                                           const float *scale, int B, int64_t L, int C) {
  (void)be;
  postnorm_residual_backward_cpu(dres_out, dbranch, dweight, dbias, dres_in, dx, x_map, branch,
                                 weight, mean, rstd, branch_map, scale, B, L, C);
  if (dbranch_bias) column_sums_cpu(dbranch_bias, dbranch, (int64_t)B * L, C);
}

static void cpu_patch_merge_forward(Backend *be, void *merged, const void *tokens, int B, int H,
                                    int W, int C) {
  (void)be;
  patch_merge_forward_cpu(merged, tokens, B, H, W, C);
}

static void cpu_patch_merge_backward(Backend *be, float *dtokens, const void *dmerged, int B, int H,
                                     int W, int C) {
  (void)be;
  patch_merge_backward_cpu(dtokens, dmerged, B, H, W, C);
}

// The CPU keeps the softmax probabilities (BW, heads, N, N).
static int64_t cpu_attention_saved_floats(Backend *be, int BW, int N, int C, int heads) {
  (void)be;
  (void)C;
  return (int64_t)BW * heads * N * N;
}

static void cpu_attention_forward(Backend *be, void *out, float *saved, const void *qkv,
                                  const float *table, const int *index, const float *mask, int BW,
                                  int nW, int N, int C, int heads, float scale) {
  (void)be;
  window_attention_forward_cpu(out, saved, qkv, table, index, mask, BW, nW, N, C, heads, scale);
}

static void cpu_attention_backward(Backend *be, void *dqkv, float *dqkv_bias, float *dtable,
                                   const void *dout, const void *qkv, const void *out,
                                   const float *table, const int *index, const float *mask,
                                   float *saved, int BW, int nW, int N, int C, int heads,
                                   float scale) {
  (void)be;
  (void)out;
  (void)table;
  (void)mask;
  (void)nW;
  window_attention_backward_cpu(dqkv, dtable, dout, qkv, saved, index, BW, N, C, heads, scale);
  if (dqkv_bias) column_sums_cpu(dqkv_bias, dqkv, (int64_t)BW * N, 3 * C);
}

static void cpu_cosine_qk_forward(Backend *be, void *qkv, float *norms, const float *q_bias,
                                  const float *v_bias, const float *logit_scale, int64_t rows,
                                  int C, int heads) {
  (void)be;
  cosine_qk_forward_cpu(qkv, norms, q_bias, v_bias, logit_scale, rows, C, heads);
}

static void cpu_cosine_qk_backward(Backend *be, void *dqkv, float *dq_bias, float *dv_bias,
                                   float *dlogit_scale, const void *qkv, const float *norms,
                                   const float *logit_scale, int64_t rows, int C, int heads) {
  (void)be;
  cosine_qk_backward_cpu(dqkv, dq_bias, dv_bias, dlogit_scale, qkv, norms, logit_scale, rows, C,
                         heads);
}

static void cpu_cpb_forward(Backend *be, float *table, float *hidden, const float *coords,
                            const float *w1, const float *b1, const float *w2, int T, int heads) {
  (void)be;
  cpb_forward_cpu(table, hidden, coords, w1, b1, w2, T, heads);
}

static void cpu_cpb_backward(Backend *be, float *dw1, float *db1, float *dw2, const float *dtable,
                             const float *table, const float *hidden, const float *coords,
                             const float *w2, int T, int heads) {
  (void)be;
  cpb_backward_cpu(dw1, db1, dw2, dtable, table, hidden, coords, w2, T, heads);
}

static void cpu_head_forward(Backend *be, float *logits, float *pooled, const void *tokens,
                             const float *weight, const float *bias, int B, int L, int C, int K) {
  (void)be;
  mean_pool_forward_cpu(pooled, tokens, B, L, C);
  linear_forward_cpu(logits, pooled, weight, bias, B, C, K);
}

static void cpu_head_backward(Backend *be, void *dtokens, float *dweight, float *dbias,
                              const float *dlogits, const float *pooled, const float *weight, int B,
                              int L, int C, int K) {
  float *dpooled = cpu_scratch(be, (int64_t)B * C);
  linear_backward_cpu(dpooled, dweight, dbias, dlogits, pooled, weight, B, C, K);
  mean_pool_backward_cpu(dtokens, dpooled, B, L, C);
}

// ---- loss, metrics, optimizer ---------------------------------------------------------------

static void cpu_train_loss(Backend *be, float *dlogits, const float *logits, const int *labels,
                           const float *soft_targets, float smoothing, int B, int K, int grad_count,
                           OptimState *state) {
  (void)be;
  double loss = cross_entropy_forward_backward_cpu(dlogits, logits, soft_targets ? NULL : labels,
                                                   soft_targets, soft_targets ? 0.0f : smoothing, B,
                                                   K, grad_count);
  if (state->loss_scale != 1.0f)
    for (int64_t i = 0; i < (int64_t)B * K; i++) dlogits[i] *= state->loss_scale;
  if (isfinite(loss)) {
    state->loss_sum += loss;
    state->loss_steps++;
  } else {
    state->bad_losses++;
  }
}

static void cpu_eval_metrics(Backend *be, EvalSums *sums, const float *logits, const int *labels,
                             int B, int K) {
  (void)be;
  int top1, top5;
  topk_correct_cpu(logits, labels, B, K, &top1, &top5);
  double loss = cross_entropy_forward_backward_cpu(NULL, logits, labels, NULL, 0.0f, B, K, B);
  sums->loss_sum += loss * B;
  sums->top1 += top1;
  sums->top5 += top5;
  sums->count += B;
}

static void cpu_optimizer_step(Backend *be, float *params, void *compute, const float *grads,
                               float *m, float *v, int64_t n, const AdamWChunk *chunks,
                               int num_chunks, OptimizerStep hyper, const StepParams *step,
                               OptimState *state) {
  (void)be;
  (void)compute;  // f32 only: the master is the compute copy
  StepDecision d = optimizer_decide(state, grad_sum_squares_cpu(grads, n), hyper);
  if (d.skip) return;
  // Runs of adjacent chunks with the same decay and lr scale go in one call (one parallel
  // region each). The chunk's learning rate: optim/optimizer.h's AdamWChunk.
  for (int i = 0; i < num_chunks;) {
    int k = i + 1;
    while (k < num_chunks && chunks[k].weight_decay == chunks[i].weight_decay &&
           chunks[k].lr_scale == chunks[i].lr_scale &&
           chunks[k].offset == chunks[k - 1].offset + chunks[k - 1].count)
      k++;
    int64_t off = chunks[i].offset;
    int64_t count = chunks[k - 1].offset + chunks[k - 1].count - off;
    AdamWHyper h = {.lr = step->lr * chunks[i].lr_scale,
                    .beta1 = hyper.beta1,
                    .beta2 = hyper.beta2,
                    .eps = hyper.eps,
                    .weight_decay = chunks[i].weight_decay};
    adamw_update_cpu(params + off, grads + off, m + off, v + off, count, h, d.t, d.grad_scale);
    i = k;
  }
}

static void cpu_ema_update(Backend *be, float *ema, const float *params, int64_t n, EmaSettings s,
                           const OptimState *state) {
  (void)be;
  float w;
  if (ema_step_weight(state, s, &w)) ema_update_cpu(ema, params, n, w);
}

static void cpu_weights_swap(Backend *be, float *a, float *b, int64_t n) {
  (void)be;
  weights_swap_cpu(a, b, n);
}

static void cpu_profile(Backend *be, bool on) {
  (void)be;
  (void)on;
}

static void cpu_profile_report(Backend *be, double *ms) {
  (void)be;
  for (int f = 0; f < OP_FAMILIES; f++) ms[f] = 0;
}

static const BackendOps cpu_ops = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .release = cpu_release,
    .host_alloc = cpu_host_alloc,
    .host_release = cpu_host_release,
    .upload = cpu_copy,
    .download = cpu_download,
    .zero = cpu_zero,
    .copy = cpu_copy,
    .synchronize = cpu_synchronize,
    .reserve = cpu_reserve,
    .stage_upload = cpu_stage_upload,
    .stage_consume = cpu_stage_nothing,
    .stage_release = cpu_stage_nothing,
    .stage_wait = cpu_stage_nothing,
    .record_event = cpu_event_nothing,
    .wait_event = cpu_event_nothing,
    .mark_create = cpu_mark_create,
    .mark_destroy = cpu_mark_destroy,
    .mark_record = cpu_mark_record,
    .mark_seconds = cpu_mark_seconds,
    .step_params_set = cpu_step_params_set,
    .to_compute = cpu_to_compute,
    .patch_embed_input = cpu_patch_embed_input,
    .drop_path_scales = cpu_drop_path_scales,
    .images_normalize = cpu_images_normalize,
    .batch_augment = cpu_batch_augment,
    .linear_forward = cpu_linear_forward,
    .mlp_hidden_elements = cpu_mlp_hidden_elements,
    .mlp_forward = cpu_mlp_forward,
    .mlp_residual_layernorm_forward = cpu_mlp_residual_layernorm_forward,
    .linear_backward = cpu_linear_backward,
    .gelu_linear_backward = cpu_gelu_linear_backward,
    .residual_layernorm_forward = cpu_residual_layernorm_forward,
    .linear_residual_layernorm_forward = cpu_linear_residual_layernorm_forward,
    .residual_layernorm_backward = cpu_residual_layernorm_backward,
    .linear_residual_layernorm_backward = cpu_linear_residual_layernorm_backward,
    .merge_layernorm_forward = cpu_merge_layernorm_forward,
    .merge_layernorm_backward = cpu_merge_layernorm_backward,
    .postnorm_residual_forward = cpu_postnorm_residual_forward,
    .postnorm_residual_backward = cpu_postnorm_residual_backward,
    .patch_merge_forward = cpu_patch_merge_forward,
    .patch_merge_backward = cpu_patch_merge_backward,
    .attention_saved_floats = cpu_attention_saved_floats,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .cosine_qk_forward = cpu_cosine_qk_forward,
    .cosine_qk_backward = cpu_cosine_qk_backward,
    .cpb_forward = cpu_cpb_forward,
    .cpb_backward = cpu_cpb_backward,
    .head_forward = cpu_head_forward,
    .head_backward = cpu_head_backward,
    .train_loss = cpu_train_loss,
    .eval_metrics = cpu_eval_metrics,
    .optimizer_step = cpu_optimizer_step,
    .ema_update = cpu_ema_update,
    .weights_swap = cpu_weights_swap,
    // graph_begin, graph_end, graph_launch, graph_destroy: NULL, the CPU captures nothing
    .profile = cpu_profile,
    .profile_report = cpu_profile_report,
};

int backend_cpu_init(Backend *be, DType act, Error *err) {
  if (act != DTYPE_F32)
    return error_set(err,
                     "the CPU backend computes in fp32 only (precision=%s was asked for)\n"
                     "HINT: set precision=fp32, or device=cuda for bf16/fp16",
                     act == DTYPE_BF16 ? "bf16" : "fp16");
  *be = (Backend){.ops = &cpu_ops, .device = DEVICE_CPU, .act = DTYPE_F32};
  be->impl = calloc_check(1, sizeof(CpuState));
  return 0;
}

void backend_cpu_destroy(Backend *be) {
  CpuState *st = cpu_state(be);
  if (st) free(st->scratch);
  free(st);
  be->impl = NULL;
}
