// train.h: the training run: backend, data, model and optimizer from a Config; the step loop
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
