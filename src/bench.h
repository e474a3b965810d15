// bench.h: the benchmark mode of swin_train (bench=1): the training step's throughput, MFU,
// memory and per-op GPU time on the configured device, with a resident synthetic batch.
#pragma once
#include "src/config.h"
#include "src/util.h"

int bench_run(const Config *cfg, Error *err);
