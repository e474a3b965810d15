// train.h: the training run: data, model and optimizer from a Config; the step loop
// (forward, loss, backward, clip, AdamW), evaluation, logging, checkpoints, resume and signals.
#pragma once
#include <stdint.h>

#include "src/config.h"
#include "src/model.h"
#include "src/util.h"

// Runs training to the end (or until SIGINT/SIGTERM, after which it checkpoints and returns 0).
int train_run(const Config *cfg, Error *err);

// Installs SIGINT/SIGTERM handlers that ask the running loop to stop after the current step.
void train_install_signal_handlers(void);

// One update of every parameter from m->grads: global gradient norm, clip coefficient, then
// AdamW per tensor (weight decay only where ParamInfo.decay) at learning rate lr for the 0-based
// step. Returns the norm before clipping.
double optimizer_step(Model *m, float *exp_avg, float *exp_avg_sq, const Config *cfg, double lr,
                      int64_t step);
