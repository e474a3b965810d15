// backend.h: the ops the model, the loss and the optimizer are written against, and the table of
// function pointers each backend fills (the way ggml dispatches per backend): the CPU reference
// kernels of kernels/cpu/ (src/model/backend_cpu.c) or the CUDA kernels of kernels/cuda/
// (src/model/backend_cuda.cu). The model's forward and backward exist once (src/model/model.c) and
// run on either.
//
// Ops sit at the granularity the GPU fuses (residual + LayerNorm with the window partition or
// reverse folded into its loads and stores, patch merging + LayerNorm, linear + GELU, mean pool +
// head, the whole optimizer update); the CPU backend composes them from the reference pieces.
//
// Memory: every pointer an op takes is backend memory (host memory on the CPU, device memory on
// CUDA) from ops->alloc, planned before the first step. Tensors marked `act` are in the compute
// type be->act (f32, bf16 or f16; the CPU supports f32 only); the rest are f32 unless said.
// Ops are queued in order on the backend's compute queue (a CUDA stream) and never wait for the
// host; only download and synchronize wait.
//
// Checked at the boundary: backend_create puts a checking layer (src/model/backend_check.h) in
// front of the backend's own table, always on. Every model op (to_compute ... weights_swap)
// first computes from its own shape arguments the extent of each pointer it touches (elements of
// the dtype given below) and, for a pointer inside memory its owner registered (the model's
// activations, parameters, gradients and geometry tables; the optimizer's moments and state),
// checks that the whole extent lies inside that one tensor and that the tensor has the expected
// dtype; a violation aborts naming the op, the argument and the tensor. Memory nobody registered
// (the batch staging, a test's buffers) passes unchecked.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kernels/augment.h"
#include "kernels/window.h"
#include "optim/ema.h"
#include "optim/optimizer.h"
#include "src/base/tensor.h"
#include "src/base/util.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct Backend Backend;
typedef struct BackendCheck BackendCheck;

typedef enum { ACTIVATION_NONE, ACTIVATION_GELU } Activation;

// Input normalization of uint8 pixels: (pixel / 255 - mean[c]) / std[c], c < 4.
typedef struct {
  float mean[4], std[4];
} Normalize;

// Evaluation sums over batches (backend memory, read once at the end).
typedef struct {
  double loss_sum;  // cross-entropy without smoothing, summed over images
  int64_t top1, top5, count;
} EvalSums;

// The values of a training step that change from one step (or micro-batch) to the next. The
// step's ops read them from backend memory, never as arguments, so that a step captured once into
// a CUDA graph (src/app/step_graph.h) replays with each step's own values; step_params_set writes
// them.
typedef struct {
  int64_t step;  // the optimizer step's index: a key of drop path's draws
  // The global index in the step's batch of this forward's sample 0: rank * (batch_size / world)
  // under data parallelism, plus k * micro-batch size for micro-batch k of gradient accumulation
  // (train.accum_steps), so every image draws what it draws in one batch on one process.
  int64_t first_sample;
  float lr;  // the optimizer's learning rate
  int32_t unused;
} StepParams;

// Op families of the benchmark's per-op table (GPU time per family as a share of the step).
// Window partition and reverse have no row: they are folded into the LayerNorm kernels.
typedef enum {
  OP_GEMM,         // linear layers and the head (cuBLASLt), bias gradients not fused elsewhere
  OP_ATTENTION,    // window attention, forward and backward
  OP_LAYERNORM,    // residual + LayerNorm (+ window maps), patch merging + LayerNorm, res-post-norm
  OP_ELEMENTWISE,  // GELU, patch-embedding input, the plain patch merge, drop path, mean pool,
                   // compute copy
  OP_LOSS,         // cross-entropy, metrics
  OP_OPTIMIZER,    // gradient norm, AdamW
  OP_MEMORY,       // zeroing, device copies
  OP_FAMILIES
} OpFamily;

const char *op_family_name(OpFamily f);

// Scratch sizes a backend needs, given by the model once it knows its shapes.
typedef struct {
  int64_t max_elements;  // largest (rows x width) operand of a LayerNorm or merge op
  int64_t max_rows;      // largest row count of any op
  int max_width;         // largest row width (channels) of any op
  int max_batch;
  int64_t num_params;                // the flat parameter buffer's length
  int max_window_tokens, max_heads;  // of the window attention
} BackendNeeds;

typedef struct {
  const char *name;  // "cpu", "cuda"
  // The largest window (tokens) and head width (channels) its attention serves; 0: no limit.
  // model_create refuses a model beyond them with a config error.
  int max_window_tokens, max_head_dim;

  // ---- memory ----
  // Backend memory, zero-filled; the process aborts with the size if it cannot be had (memory
  // is planned up front, so this happens only at startup).
  void *(*alloc)(Backend *be, size_t bytes);
  void (*release)(Backend *be, void *ptr);
  // Host memory the backend copies from fastest (page-locked on CUDA); for the loader's ring.
  void *(*host_alloc)(size_t bytes);
  void (*host_release)(void *ptr);
  void (*upload)(Backend *be, void *dst, const void *src, size_t bytes);    // synchronous
  void (*download)(Backend *be, void *dst, const void *src, size_t bytes);  // waits for the queue
  void (*zero)(Backend *be, void *ptr, size_t bytes);                       // queued
  // dst = src, bytes of backend memory each, queued on the compute queue (a micro-batch's slice
  // of the staged batch into the fixed buffers a captured step reads).
  void (*copy)(Backend *be, void *dst, const void *src, size_t bytes);
  void (*synchronize)(Backend *be);
  // Sizes the backend's private scratch for the model (called once, before the first op).
  void (*reserve)(Backend *be, const BackendNeeds *needs);

  // ---- batch staging: two slots, so batch k+1 uploads while step k computes ----
  // Queue copies of host buffers (from host_alloc) or device memory (the loader's device batch,
  // data/loader.h) into slot `slot`'s backend buffers, after the
  // step that last used the slot has released it.
  void (*stage_upload)(Backend *be, int slot, int count, void *const *dst, const void *const *src,
                       const size_t *bytes);
  void (*stage_consume)(Backend *be, int slot);  // the compute queue waits for slot's uploads
  void (*stage_release)(Backend *be, int slot);  // the slot's buffers may be overwritten after
                                                 // the work queued so far
  void (*stage_wait)(Backend *be, int slot);     // host waits until slot's uploads have run

  // ---- ordering against a queue of the caller's (the gradient all-reduce, dist/reducer.h) ----
  // event is a cudaEvent_t (passed as void *) that the caller created on the backend's device.
  // record_event: the event completes when the work queued so far on the compute queue has run.
  // wait_event: work queued later on the compute queue waits until the event (recorded on
  // another stream) has completed. Neither waits on the host, and both may be captured into a
  // graph (graph_begin): there they fork the caller's stream off the compute queue and join it
  // back, and an event recorded inside a capture is nothing a host can wait for. The CPU's do
  // nothing: its ops have run when they return, and its all-reduce is a blocking call.
  void (*record_event)(Backend *be, void *event);
  void (*wait_event)(Backend *be, void *event);

  // ---- time marks on the compute queue (the trainer's data wait, src/app/train.c) ----
  // mark_record: the mark's time is when the work queued so far on the compute queue has run
  // (a CUDA event; on the CPU, whose ops have run when they return, the host clock). Never
  // inside a graph capture. mark_seconds: seconds from mark a to mark b, both recorded; waits
  // until b has its time.
  void *(*mark_create)(Backend *be);
  void (*mark_destroy)(Backend *be, void *mark);
  void (*mark_record)(Backend *be, void *mark);
  double (*mark_seconds)(Backend *be, void *a, void *b);

  // ---- per-step values ----
  // Queues the write of *values into params (backend memory, read by the ops queued after it);
  // *values may change as soon as it returns. The CPU copies at once; CUDA queues a copy on the
  // compute queue from one of a ring of page-locked slots, and the host waits only if the copy
  // that last read that slot (the ring's length of writes ago) has not run yet.
  void (*step_params_set)(Backend *be, StepParams *params, const StepParams *values);

  // ---- model ops (shapes as in kernels/*.h) ----
  // dst (n, act) = src (n, f32) in the compute type (a plain copy in f32).
  void (*to_compute)(Backend *be, void *dst, const float *src, int64_t n);
  // patches (B, H/p, W/p, Cin*p*p, act) from input (B, H, W, Cin): uint8 pixels normalized with
  // norm (input_dtype U8), or already normalized floats (F32).
  void (*patch_embed_input)(Backend *be, void *patches, const void *input, DType input_dtype,
                            Normalize norm, int B, int H, int W, int Cin, int p);
  // Drop-path scales (units, B): unit u uses rate rates[u / 2]; 0 for a dropped sample, 1/keep
  // for a kept one, drawn from (seed, step->step, unit, step->first_sample + b) exactly as the
  // CPU draws them (step: backend memory). step->first_sample is the global index in the step's
  // batch of this call's sample 0, so N ranks (or N micro-batches) draw what one process draws
  // for the whole batch.
  void (*drop_path_scales)(Backend *be, float *scales, const float *rates, int units, int B,
                           uint64_t seed, const StepParams *step);
  // images (B, H, W, Cin, f32) = (pixels / 255 - mean[c]) / std[c], from uint8 pixels: the
  // input of the per-batch augmentations, which work on normalized images.
  void (*images_normalize)(Backend *be, float *images, const uint8_t *pixels, Normalize norm, int B,
                           int H, int W, int Cin);
  // Random erasing then mixup or cutmix on images (B, H, W, C, f32) in place, with parameters
  // drawn on the host (kernels/augment.h); boxes: room for B EraseBox in backend memory.
  void (*batch_augment)(Backend *be, float *images, const BatchAugment *p, EraseBox *boxes, int B,
                        int H, int W, int C);
  // out (N, OC, act) = act(inp (N, IC, act) weight^T (OC, IC, act) + bias (OC, act) or none);
  // with GELU the pre-activation goes to pre (N, OC, act).
  void (*linear_forward)(Backend *be, void *out, const void *inp, const void *weight,
                         const void *bias, int64_t N, int IC, int OC, Activation act, void *pre);
  // The elements of hidden that mlp_forward and gelu_linear_backward need for an MLP of N rows,
  // C features and H hidden units: N * H where either op may write GELU(pre) into hidden, 0 where
  // neither touches it (the model may then pass hidden NULL to both and plan no room for it).
  int64_t (*mlp_hidden_elements)(Backend *be, int64_t N, int C, int H);
  // An MLP's two layers: pre (N, H, act) = inp (N, C, act) w1^T (H, C, act) + b1 (H, act), out
  // (N, C, act) = GELU(pre) w2^T (C, H, act) + b2 (C, act). hidden (N, H, act) is room for
  // GELU(pre), which the op may or may not write; it may be NULL exactly where
  // mlp_hidden_elements(N, C, H) is 0. out NULL computes pre alone (a block's rebuild for the
  // backward), with the same bits as with out.
  void (*mlp_forward)(Backend *be, void *out, void *pre, void *hidden, const void *inp,
                      const void *w1, const void *b1, const void *w2, const void *b2, int64_t N,
                      int C, int H);
  // An MLP whose output is residual_layernorm_forward's branch, branch_map NULL (a block's MLP
  // and the residual that ends the block, with the next block's LN1 or a stage's last residual):
  // mlp_forward(branch, pre, hidden, inp, w1, b1, w2, b2, B*L, C, H), then
  // residual_layernorm_forward(x_out, ln_out, mean, rstd, x_in, branch, NULL, scale, ln_weight,
  // ln_bias, ln_map, B, L, C). branch (B*L, C, act) is scratch as in
  // linear_residual_layernorm_forward; x_out may not alias x_in.
  void (*mlp_residual_layernorm_forward)(Backend *be, void *x_out, void *ln_out, float *mean,
                                         float *rstd, void *branch, void *pre, void *hidden,
                                         const void *x_in, const void *inp, const void *w1,
                                         const void *b1, const void *w2, const void *b2,
                                         const float *scale, const float *ln_weight,
                                         const float *ln_bias, const WindowMap *ln_map, int B,
                                         int64_t L, int C, int H);
  // dinp (N, IC, act) = dout weight; dinp NULL skips. dweight (OC, IC, f32) and dbias (OC, f32,
  // or NULL) accumulated. The model passes dbias NULL wherever the op that wrote dout summed its
  // columns already (the *_bias outputs below): the GPU then runs the dweight product alone.
  void (*linear_backward)(Backend *be, void *dinp, float *dweight, float *dbias, const void *dout,
                          const void *inp, const void *weight, int64_t N, int IC, int OC);
  // The backward of linear(GELU(pre)), an MLP's second layer, whose input the forward did not
  // keep: hidden (N, IC, act) receives GELU(pre (N, IC, act)) (recomputed; the op overwrites
  // it) wherever mlp_hidden_elements(N, OC, IC) is not 0 (the MLP's C is OC, its H is IC), and
  // may be NULL where that is 0; dpre (N, IC, act) = (dout weight) * GELU'(pre); dweight
  // accumulated as in linear_backward. dpre_bias (IC, f32, or NULL) += the column sums of dpre
  // as stored: the bias gradient of the MLP's first layer (pre's producer), from the pass that
  // writes dpre. This layer's own bias gradient (the column sums of dout) is the caller's, from
  // dout's producer.
  void (*gelu_linear_backward)(Backend *be, void *dpre, void *hidden, float *dweight,
                               float *dpre_bias, const void *dout, const void *pre,
                               const void *weight, int64_t N, int IC, int OC);
  // kernels/layernorm.h's residual_layernorm_{forward,backward}: x_out, ln_out, x_in, branch,
  // dbranch, dln, x act; dres_in, dres_out f32. The backward's dbranch_bias (C, f32, or NULL) +=
  // the column sums of dbranch as written (scaled by the drop-path scale when there is one, in
  // whatever row order bmap gives), also without dln: the bias gradient of the linear layer whose
  // output the branch is (a block's proj or fc2, the patch embedding).
  void (*residual_layernorm_forward)(Backend *be, void *x_out, void *ln_out, float *mean,
                                     float *rstd, const void *x_in, const void *branch,
                                     const WindowMap *branch_map, const float *scale,
                                     const float *weight, const float *bias,
                                     const WindowMap *ln_map, int B, int64_t L, int C);
  // A linear layer whose output is residual_layernorm_forward's branch, ln_map NULL (a block's
  // proj and LN2): branch (B*L, C, act) = inp (B*L, IC, act, in branch_map's order) weight^T
  // (C, IC, act) + lin_bias (C, act), then residual_layernorm_forward(x_out, ln_out, mean, rstd,
  // x_in, branch, branch_map, scale, ln_weight, ln_bias, NULL, B, L, C). branch is scratch: a
  // backend that fuses the two may leave it untouched, so nothing may read it afterwards. x_out
  // may not alias x_in.
  void (*linear_residual_layernorm_forward)(Backend *be, void *x_out, void *ln_out, float *mean,
                                            float *rstd, void *branch, const void *x_in,
                                            const void *inp, const void *weight,
                                            const void *lin_bias, const WindowMap *branch_map,
                                            const float *scale, const float *ln_weight,
                                            const float *ln_bias, int B, int64_t L, int IC, int C);
  void (*residual_layernorm_backward)(Backend *be, float *dres_out, void *dbranch,
                                      float *dbranch_bias, float *dweight, float *dbias,
                                      const float *dres_in, const void *dln, const void *x,
                                      const float *weight, const float *mean, const float *rstd,
                                      const WindowMap *branch_map, const float *scale,
                                      const WindowMap *ln_map, int B, int64_t L, int C);
  // A linear layer's backward whose input was a LayerNorm's output (a block's fc1 after LN2, its
  // qkv after LN1 into the windows), then that LayerNorm's residual backward:
  // linear_backward(dln, dweight, NULL, dout, inp, weight, B*L, IC, OC), then
  // residual_layernorm_backward(dres_out, dbranch, dbranch_bias, ln_dweight, ln_dbias, dres_in,
  // dln, x, ln_weight, mean, rstd, branch_map, scale, ln_map, B, L, IC). dln (B*L, IC, act, in
  // ln_map's order) is scratch as branch is in linear_residual_layernorm_forward: a backend that
  // fuses the two may leave it untouched, so nothing may read it afterwards.
  void (*linear_residual_layernorm_backward)(
      Backend *be, float *dres_out, void *dbranch, float *dbranch_bias, float *dweight,
      float *ln_dweight, float *ln_dbias, void *dln, const float *dres_in, const void *dout,
      const void *inp, const void *weight, const void *x, const float *ln_weight, const float *mean,
      const float *rstd, const WindowMap *branch_map, const float *scale, const WindowMap *ln_map,
      int B, int64_t L, int IC, int OC);
  // kernels/patch.h's merge_layernorm: out, tokens, dout act; dtokens f32 (overwritten).
  void (*merge_layernorm_forward)(Backend *be, void *out, float *mean, float *rstd,
                                  const void *tokens, const float *weight, const float *bias, int B,
                                  int H, int W, int C);
  void (*merge_layernorm_backward)(Backend *be, float *dtokens, float *dweight, float *dbias,
                                   const void *dout, const void *tokens, const float *weight,
                                   const float *mean, const float *rstd, int B, int H, int W,
                                   int C);
  // kernels/layernorm.h's postnorm_residual_{forward,backward} (Swin V2's res-post-norm): x_out,
  // xw_out, x_in, branch, dx, dbranch act; dres_in, dres_out f32. The backward's dbranch_bias
  // (C, f32, or NULL) += the column sums of dbranch as written: the bias gradient of the linear
  // layer whose output the branch is (proj, fc2, the patch embedding).
  void (*postnorm_residual_forward)(Backend *be, void *x_out, void *xw_out, float *mean,
                                    float *rstd, const void *x_in, const void *branch,
                                    const WindowMap *branch_map, const float *scale,
                                    const float *weight, const float *bias,
                                    const WindowMap *out_map, int B, int64_t L, int C);
  void (*postnorm_residual_backward)(Backend *be, float *dres_out, void *dbranch,
                                     float *dbranch_bias, float *dweight, float *dbias,
                                     const float *dres_in, const void *dx, const WindowMap *x_map,
                                     const void *branch, const float *weight, const float *mean,
                                     const float *rstd, const WindowMap *branch_map,
                                     const float *scale, int B, int64_t L, int C);
  // kernels/patch.h's plain patch merge (Swin V2 normalizes after the reduction): merged (B, H/2,
  // W/2, 4C, act) from tokens (B, H, W, C, act); the backward overwrites dtokens (B, H, W, C,
  // f32) in full from dmerged (act).
  void (*patch_merge_forward)(Backend *be, void *merged, const void *tokens, int B, int H, int W,
                              int C);
  void (*patch_merge_backward)(Backend *be, float *dtokens, const void *dmerged, int B, int H,
                               int W, int C);
  // Window attention (kernels/attention.h): out, qkv, dout, dqkv act; table, dtable f32;
  // saved (attention_saved_floats of them) is whatever the backend keeps for the backward, which
  // may overwrite it. scale multiplies q k^T: attention_head_dim_scale(head_dim) for Swin V1, 1
  // for V2. The backward's dqkv_bias (3C, f32, or NULL) += the column sums of dqkv (BW * N rows)
  // as stored: the qkv layer's bias gradient.
  int64_t (*attention_saved_floats)(Backend *be, int BW, int N, int C, int heads);
  void (*attention_forward)(Backend *be, void *out, float *saved, const void *qkv,
                            const float *table, const int *index, const float *mask, int BW, int nW,
                            int N, int C, int heads, float scale);
  void (*attention_backward)(Backend *be, void *dqkv, float *dqkv_bias, float *dtable,
                             const void *dout, const void *qkv, const void *out, const float *table,
                             const int *index, const float *mask, float *saved, int BW, int nW,
                             int N, int C, int heads, float scale);
  // Swin V2's attention pieces (kernels/cosine_attention.h): scaled-cosine q and k in place on
  // qkv (rows, 3C, act), norms (rows, 2, heads) saved, q_bias, v_bias (C, or both NULL) and
  // logit_scale (heads); the backward in place on dqkv (rows, 3C, act), from qkv as the forward
  // left it, dq_bias, dv_bias (C, or NULL) and dlogit_scale (heads) accumulated. The continuous
  // position bias: table (T, heads) and hidden (T, CPB_HIDDEN) from coords (T, 2), w1
  // (CPB_HIDDEN, 2), b1 (CPB_HIDDEN), w2 (heads, CPB_HIDDEN); the backward from dtable (T, heads)
  // accumulates dw1, db1, dw2. All f32 but qkv and dqkv.
  void (*cosine_qk_forward)(Backend *be, void *qkv, float *norms, const float *q_bias,
                            const float *v_bias, const float *logit_scale, int64_t rows, int C,
                            int heads);
  void (*cosine_qk_backward)(Backend *be, void *dqkv, float *dq_bias, float *dv_bias,
                             float *dlogit_scale, const void *qkv, const float *norms,
                             const float *logit_scale, int64_t rows, int C, int heads);
  void (*cpb_forward)(Backend *be, float *table, float *hidden, const float *coords,
                      const float *w1, const float *b1, const float *w2, int T, int heads);
  void (*cpb_backward)(Backend *be, float *dw1, float *db1, float *dw2, const float *dtable,
                       const float *table, const float *hidden, const float *coords,
                       const float *w2, int T, int heads);
  // Head: pooled (B, C, f32) = mean over L tokens of tokens (B, L, C, act); logits (B, K, f32) =
  // pooled weight^T + bias, in f32 with the f32 weights. The backward writes dtokens (B, L, C,
  // act) and accumulates dweight, dbias.
  void (*head_forward)(Backend *be, float *logits, float *pooled, const void *tokens,
                       const float *weight, const float *bias, int B, int L, int C, int K);
  void (*head_backward)(Backend *be, void *dtokens, float *dweight, float *dbias,
                        const float *dlogits, const float *pooled, const float *weight, int B,
                        int L, int C, int K);

  // ---- loss and metrics ----
  // Label-smoothed cross-entropy of logits (B, K) against labels (B): dlogits = (softmax -
  // target) / grad_count * state->loss_scale, the gradient of the mean loss over grad_count
  // images (B for a whole batch; B x train.accum_steps for a micro-batch, so that the gradients
  // of a step's micro-batches add up to its batch's); the B rows' mean loss is added to
  // state->loss_sum (and 1 to loss_steps) when finite, else counted in state->bad_losses.
  // With soft_targets (B, K) (mixup / cutmix) they are the targets as given (smoothing unused)
  // and labels is ignored.
  void (*train_loss)(Backend *be, float *dlogits, const float *logits, const int *labels,
                     const float *soft_targets, float smoothing, int B, int K, int grad_count,
                     OptimState *state);
  // Adds the batch's unsmoothed loss sum, top-1/top-5 hits and count to sums.
  void (*eval_metrics)(Backend *be, EvalSums *sums, const float *logits, const int *labels, int B,
                       int K);

  // ---- optimizer ----
  // One update: the global norm of grads (n) scaled back by the loss scale; if it is not finite
  // the step is skipped (parameters and moments untouched, counted in state, and with
  // dynamic_scale the scale halves); else clipped AdamW at learning rate step->lr (backend
  // memory) times each chunk's lr_scale over the chunks (AdamW's bias corrections from
  // state->adam_steps + 1), the compute copy refreshed (compute NULL when the compute type is
  // f32), and with dynamic_scale the scale doubles after scale_window clean steps. chunks:
  // backend memory (optim/optimizer.h); each chunk's offset a multiple of 4 (the GPU updates 16
  // bytes at a time; model_adamw_chunks guarantees it).
  void (*optimizer_step)(Backend *be, float *params, void *compute, const float *grads, float *m,
                         float *v, int64_t n, const AdamWChunk *chunks, int num_chunks,
                         OptimizerStep hyper, const StepParams *step, OptimState *state);
  // The moving average of the weights (optim/ema.h), queued after an optimizer_step on the same
  // state: when that step was applied, ema (n) = lerp(ema, params (n), 1 - decay) with timm's
  // decay after state->adam_steps updates; a skipped step leaves ema as it is. The decision and
  // the decay come from state in backend memory, so a captured step replays with its own.
  void (*ema_update)(Backend *be, float *ema, const float *params, int64_t n, EmaSettings s,
                     const OptimState *state);
  // Exchanges a (n) and b (n), f32: the master weights and their average, so the average can be
  // evaluated in the weights' place and put back, bit for bit, without another copy.
  void (*weights_swap)(Backend *be, float *a, float *b, int64_t n);

  // ---- captured work (CUDA graphs; NULL on the CPU, which has none) ----
  // graph_begin: from now on the work queued on the compute queue is recorded instead of run,
  // until graph_end makes the recording a graph to replay: NULL with err set when the capture or
  // its instantiation failed (nothing recorded has run; the queue is as before graph_begin);
  // *nodes, when given, gets the graph's node count. Between them nothing may wait for the queue,
  // allocate, upload, stage a batch or profile: the backend aborts naming the call. graph_launch
  // queues one replay on the compute queue: the recorded ops again, with the same arguments
  // (pointers, sizes; whatever they read from memory is read anew); graph_destroy frees a graph
  // (replays already queued still run).
  int (*graph_begin)(Backend *be, Error *err);
  void *(*graph_end)(Backend *be, int64_t *nodes, Error *err);
  void (*graph_launch)(Backend *be, void *graph);
  void (*graph_destroy)(Backend *be, void *graph);

  // ---- profiling (benchmarks) ----
  // While on, each op's GPU time is measured (events around it) and added to its family;
  // profile_report waits for the queue, writes the milliseconds per family since the last report
  // and clears them. The CPU backend measures nothing (zeros).
  void (*profile)(Backend *be, bool on);
  void (*profile_report)(Backend *be, double *ms /* OP_FAMILIES */);

  // ---- the GPU's matrix products (NULL on the CPU) ----
  // gemm_tuning: for products not planned yet, the fastest of cuBLASLt's candidates timed at
  // first use (on) or the heuristic's first answer (off, the default); gemm_report writes every
  // product planned so far with its choice; gemm_choices_write / gemm_choices_read save the timed
  // choices as text and take them back (kernels/gemm.h: gemm_context_write_choices and
  // gemm_context_read_choices).
  void (*gemm_tuning)(Backend *be, bool on);
  void (*gemm_report)(Backend *be, FILE *out);
  int (*gemm_choices_write)(Backend *be, FILE *f);
  int (*gemm_choices_read)(Backend *be, const char *text, char *why, size_t why_size);
} BackendOps;

struct Backend {
  // The table callers use. From backend_create it is the checking layer's, whose model ops check
  // their pointers and call the backend's own op (backend_check_inner); the other entries are
  // the backend's own.
  const BackendOps *ops;
  Device device;
  DType act;            // compute type of activations and of the weights the GEMMs read
  size_t bytes_in_use;  // backend memory handed out by ops->alloc
  int64_t host_waits;   // times the host waited for the backend (download, synchronize)
  void *impl;           // the backend's private state
  BackendCheck *check;  // the checking layer's regions, counts and the backend's own table
};

// device: "cpu", "cuda" or "auto" (cuda when a GPU is usable, else cpu); precision: "fp32",
// "bf16" or "fp16". Errors say why a device cannot be used and what to set instead. The table
// be->ops is the checking layer's over the backend's own (src/model/backend_check.h).
int backend_create(Backend *be, const char *device, const char *precision, Error *err);
void backend_destroy(Backend *be);
// True when this build has the CUDA backend and a CUDA device is usable.
bool backend_cuda_usable(void);
// "cpu" or "cuda (NVIDIA H200, 139.8 GiB)" and the precision, for the start-up banner.
void backend_describe(const Backend *be, char *buf, size_t size);

// The CPU table and the CUDA one (src/model/backend_cpu.c, src/model/backend_cuda.cu).
int backend_cpu_init(Backend *be, DType act, Error *err);
void backend_cpu_destroy(Backend *be);
#ifdef SWIN_HAVE_CUDA
int backend_cuda_init(Backend *be, DType act, Error *err);
void backend_cuda_destroy(Backend *be);
bool backend_cuda_device_usable(char *name, size_t size, double *gib);
#endif

#ifdef __cplusplus
}
#endif
