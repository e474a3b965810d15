// learner.h: the training step as one queued sequence on a backend (forward, loss, backward,
// optimizer) and the optimizer memory it needs: AdamW moments, the chunk table, the step state
// and, with train.ema_decay, the moving average of the weights, in backend memory, with host
// copies of the moments and the average for checkpoints. The trainer (src/app/train.c) feeds it
// batches from the loader; the benchmark (src/app/bench.c) feeds it one resident batch.
//
// What changes from one step to the next reaches the step through backend memory only: the
// step's index and learning rate (learner_set_step, before the step), the batch's contents (in
// the caller's fixed buffers), the optimizer state (which the step updates itself). So the
// queued sequence of learner_step is the same from step to step, for a given batch buffer and
// batch size, and can be captured once and replayed (src/app/step_graph.h).
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

// Queues the values of the step about to run into o->step_params: its index `step` (the key of
// drop path's draws) and learning rate lr, read by the learner_backward and learner_update
// queued after it. Queued; the host moves on at once.
void learner_set_step(Model *m, Optimizer *o, int64_t step, float lr);
// The gradient of one training step on batch: forward (drop path keyed by the step index of
// o->step_params and the global index first_sample of the batch's first image), loss
// (label-smoothed, or against the soft targets), backward into m->grads. Queued; nothing waits.
void learner_backward(Model *m, Optimizer *o, const Config *cfg, Normalize norm,
                      const StepBatch *batch, int B, int64_t first_sample);
// The optimizer update from m->grads at the learning rate of o->step_params (gradient norm,
// clip, AdamW, compute copy, loss scale), then the average's update when there is one. Queued.
void learner_update(Model *m, Optimizer *o, const Config *cfg);
// Both, with nothing between them (no gradient all-reduce): one process. Captured and replayed
// by src/step_graph.h.
void learner_step(Model *m, Optimizer *o, const Config *cfg, Normalize norm, const StepBatch *batch,
                  int B, int64_t first_sample);
