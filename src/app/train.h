// train.h: the training run: backend, data, model and optimizer from a Config; the step loop
// (forward, loss, backward, gradient all-reduce, clip, AdamW), evaluation, logging, checkpoints,
// resume and signals, in one process or as one rank of a data-parallel job.
//
// In a job (comm->mpi), train.batch_size is the global batch: each rank trains on its share and
// the gradients are averaged over the ranks (dist/reducer.h), so N ranks compute the step one
// process computes for the same global batch. Rank 0 alone resumes, imports init_from, writes
// metrics.jsonl and checkpoints; the others start from its weights. Every number printed or acted
// on (loss, gradient norm, skipped steps, evaluation, a stop request) is agreed over the ranks, so
// they all take the same decisions. What a rank prints on stdout is the caller's choice
// (swin_train gives only rank 0 a stdout).
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "data/loader.h"
#include "dist/comm.h"
#include "src/base/config.h"
#include "src/base/util.h"
#include "src/model/model.h"

// Runs training to the end (or until SIGINT/SIGTERM/SIGUSR1, after which it checkpoints and
// returns 0). comm: the job (comm_init); a process started alone is rank 0 of 1. Collective over
// every rank; after a failure in a job the caller ends the job (comm_abort) at once.
int train_run(const Config *cfg, Comm *comm, Error *err);

// Installs SIGINT/SIGTERM/SIGUSR1 handlers that ask the running loop to stop after the current
// step.
void train_install_signal_handlers(void);

// This rank's loader options for training (train) or evaluation, without the resume position or
// the buffer allocator: batch_size is the rank's share (train.batch_size / world; the evaluation
// batch, train.eval_batch_size or train.batch_size, divided by world rounded up), rank and world
// are comm's. Fails, naming the keys and values, when train.batch_size does not divide by world.
int train_loader_options(const Config *cfg, const Comm *comm, bool train, LoaderOptions *opt,
                         Error *err);

// Fails on every rank when the ranks of a job are not all on the same kind of device (be's): the
// reductions of the CPU (MPI) and of the GPU (NCCL) do not mix. Collective over every rank.
int train_check_same_device(Comm *comm, const Backend *be, Error *err);
