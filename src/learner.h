// learner.h: the training step as one queued sequence on a backend (forward, loss, backward,
// optimizer) and the optimizer memory it needs: AdamW moments, the chunk table and the step state
// in backend memory, with host copies of the moments for checkpoints. The trainer (src/train.c)
// feeds it batches from the loader; the benchmark (src/bench.c) feeds it one resident batch.
#pragma once
#include <stdint.h>

#include "src/backend.h"
#include "src/config.h"
#include "src/model.h"

typedef struct {
  float *exp_avg, *exp_avg_sq;            // AdamW moments in backend memory (num_floats each)
  float *host_exp_avg, *host_exp_avg_sq;  // their host copies (the same arrays on the CPU)
  AdamWChunk *chunks;                     // backend memory
  int num_chunks;
  OptimState *state;  // backend memory
} Optimizer;

// Allocates the optimizer memory for model m (on m->be) with the config's weight decay; zero
// moments and a zero state (call optimizer_upload_state to set it).
void optimizer_create(Optimizer *o, const Model *m, const Config *cfg);
void optimizer_destroy(Optimizer *o, Backend *be);
// Backend memory the optimizer holds, in bytes.
size_t optimizer_bytes(const Optimizer *o, const Model *m);
// Moments between host copies and backend (no-ops on the CPU, where they are the same).
void optimizer_upload_moments(Optimizer *o, const Model *m);
void optimizer_download_moments(Optimizer *o, const Model *m);

// One training step on batch pixels (B, H, W, Cin) uint8 and labels (B), both in backend memory,
// at step `step` (drop-path draws) with learning rate lr: forward, label-smoothed loss, backward,
// then the optimizer update. Everything is queued; nothing waits.
void learner_step(Model *m, Optimizer *o, const Config *cfg, Normalize norm, const uint8_t *pixels,
                  const int *labels, int B, int64_t step, float lr);
