// bench.h: the benchmark mode of swin_train (bench=1): the training step's throughput, MFU,
// memory and per-op GPU time on the configured device, with a resident synthetic batch; under a
// launcher, the data-parallel step with the gradient all-reduce's time and how much of it the
// step does not hide.
#pragma once
#include "dist/comm.h"
#include "src/base/config.h"
#include "src/base/util.h"

// Runs the benchmark and prints its table and JSON line on stdout. comm: the job (comm_init); a
// process started alone (rank 0 of 1, no MPI) measures the single-device step, as before the
// data-parallel mode existed. Under a launcher (comm->mpi, any world size) every rank takes part:
// the GPU of its local rank, its share of train.batch_size, the trainer's GradReducer. Collective
// over every rank; after a failure in a job the caller ends the job (comm_abort) at once.
int bench_run(const Config *cfg, Comm *comm, Error *err);
