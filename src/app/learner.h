// learner.h: the training step as one queued sequence on a backend (forward, loss, backward,
// optimizer) and the optimizer memory it needs: AdamW moments, the chunk table, the step state
// and, with train.ema_decay, the moving average of the weights, in backend memory, with host
// copies of the moments and the average for checkpoints. The trainer (src/app/train.c) feeds it
// batches from the loader; the benchmark (src/app/bench.c) feeds it one resident batch.
//
// With gradient accumulation (train.accum_steps = N > 1) an optimizer step is N parts, one per
// micro-batch: the caller zeroes the gradients (model_zero_grads), then N - 1 STEP_ACCUMULATE
// parts add their micro-batches' gradients, and a STEP_FINISH part adds the last one's (reported
// to the gradient reducer as backward goes, so that under a launcher only it all-reduces) and
// updates. Each micro-batch's loss gradient is the mean over B x N images, so the N gradients add
// up to the gradient of one batch of B x N images; the learning rate, clipping, the fp16 loss
// scaler's overflow check and AdamW act once, in the update. N = 1 is the STEP_WHOLE part.
//
// What changes from one step (or micro-batch) to the next reaches the step through backend memory
// only: the step's index, learning rate and first sample (learner_set_step, before each part),
// the batch's contents (in the caller's fixed buffers), the optimizer state (which the step
// updates itself). So the queued sequence of a part is the same from step to step, for a given
// batch buffer and batch size, and can be captured once and replayed (src/app/step_graph.h).
#pragma once
#include <stdint.h>

#include "src/base/config.h"
#include "src/model/backend.h"
#include "src/model/model.h"

typedef struct {
  float *exp_avg, *exp_avg_sq;            // AdamW moments in backend memory (num_floats each)
  float *host_exp_avg, *host_exp_avg_sq;  // their host copies (the same arrays on the CPU)
  AdamWChunk *chunks;                     // backend memory
  int num_chunks;
  OptimState *state;        // backend memory
  StepParams *step_params;  // backend memory: the step's index and learning rate
  // The moving average of the master weights (train.ema_decay > 0; else all NULL): fp32,
  // num_floats, laid out as the weights, in backend memory, and its host copy (the same array on
  // the CPU).
  float *ema, *host_ema;
  EmaSettings ema_settings;
} Optimizer;

// Allocates the optimizer memory for model m (on m->be) with the config's weight decay and
// layer decay (the chunk table's lr scales) and, with cfg->ema_decay > 0, the average; zero
// moments, a zero average and a zero state (the caller uploads an OptimState into o->state to
// set it: the trainer's upload_optim_state, the benchmark's setup; and starts the average with
// optimizer_ema_from_weights or an upload). The memory is registered with the backend's op
// checks (src/model/backend_check.h) until optimizer_destroy.
void optimizer_create(Optimizer *o, const Model *m, const Config *cfg);
void optimizer_destroy(Optimizer *o, Backend *be);
// Backend memory the optimizer holds, in bytes, and the part of it that is the average.
size_t optimizer_bytes(const Optimizer *o, const Model *m);
size_t optimizer_ema_bytes(const Optimizer *o, const Model *m);
// Moments between host copies and backend (no-ops on the CPU, where they are the same).
void optimizer_upload_moments(Optimizer *o, const Model *m);
void optimizer_download_moments(Optimizer *o, const Model *m);
// The average between its host copy and the backend, likewise (no-ops without one).
void optimizer_upload_ema(Optimizer *o, const Model *m);
void optimizer_download_ema(Optimizer *o, const Model *m);
// Starts the average at the host weights m->weights (host copy and backend).
void optimizer_ema_from_weights(Optimizer *o, const Model *m);
// Exchanges the master weights and the average and refreshes the compute copy, so that the model
// computes with the average; a second call puts everything back bit for bit (the compute copy
// is a function of the master weights). Queued; no memory is taken.
void optimizer_swap_ema(Optimizer *o, Model *m);

// What a step reads, in backend memory: the images (B, H, W, Cin), uint8 pixels (U8, normalized
// by the model's input op) or normalized f32 images (F32: after the per-batch augmentations),
// and the targets: labels (B), or soft targets (B, classes) when mixup / cutmix made them.
typedef struct {
  const void *images;
  DType images_dtype;
  const int *labels;
  const float *soft_targets;  // or NULL
} StepBatch;

// What one call of learner_run queues (see the top of this file).
typedef enum {
  STEP_WHOLE,       // accum_steps 1: zero the gradients, forward, loss, backward, update
  STEP_ACCUMULATE,  // a micro-batch before the last: forward, loss, backward adding to m->grads
  STEP_FINISH,      // the last micro-batch: forward, loss, backward (reported), update
} StepPart;

// The part micro-batch k (0-based) of a step of `accum` micro-batches runs as.
StepPart learner_part(int k, int accum);

// Queues the values of the part about to run into o->step_params: the step's index `step` (a key
// of drop path's draws), its learning rate lr, and first_sample, the global index in the step's
// batch of the micro-batch's first image (the other key of drop path's draws), read by the ops
// queued after it. Queued; the host moves on at once.
void learner_set_step(Model *m, Optimizer *o, int64_t step, float lr, int64_t first_sample);
// The gradient of batch (B images, one of cfg->accum_steps micro-batches of a step) added into
// m->grads: forward (drop path keyed by o->step_params), loss (label-smoothed, or against the soft
// targets; its gradient the mean over B x cfg->accum_steps images), backward, which with report
// tells the gradient reducer (m->grads_ready) of each finished bucket. Queued; nothing waits.
void learner_accumulate(Model *m, Optimizer *o, const Config *cfg, Normalize norm,
                        const StepBatch *batch, int B, bool report);
// The gradient of one whole step on batch (cfg->accum_steps 1): the gradients zeroed, then
// learner_accumulate with report. Queued.
void learner_backward(Model *m, Optimizer *o, const Config *cfg, Normalize norm,
                      const StepBatch *batch, int B);
// The optimizer update from m->grads at the learning rate of o->step_params (gradient norm,
// clip, AdamW, compute copy, loss scale), then the average's update when there is one. Queued.
void learner_update(Model *m, Optimizer *o, const Config *cfg);
// One part of a step on batch, with nothing between backward and update (no host wait for the
// gradient all-reduce, which the compute queue waits for): STEP_WHOLE is learner_backward then
// learner_update, STEP_ACCUMULATE learner_accumulate without report, STEP_FINISH with report then
// learner_update. Captured and replayed by src/app/step_graph.h.
void learner_run(Model *m, Optimizer *o, const Config *cfg, Normalize norm, const StepBatch *batch,
                 int B, StepPart part);
