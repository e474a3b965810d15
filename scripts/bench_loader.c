// bench_loader.c: images per second of swin.c's loader with the training recipe's per-image
// half: decode (stb_image) + RandomResizedCrop 224 (bicubic) + flip + RandAugment
// rand-m9-mstd0.5-inc1, into uint8 batches (the per-batch half, erasing and mixup, runs on the
// normalized batch in the training step, on the GPU).
//
// Build (repo root, after cmake --build build; not part of the CMake build of a CPU tree):
//   gcc -std=c11 -O3 -march=native -fopenmp -I. -I/usr/include/stb scripts/bench_loader.c
//       build/libswincore.a -lm -lpthread -o /tmp/bench_loader
// A build with nvJPEG makes it itself (BUILD/bench_loader), linked with the CUDA libraries.
// Run:
//   /tmp/bench_loader ROOT imagefolder|shards WORKERS [BATCHES=40] [full|plain] [BATCH=128]
//                     [stb|nvjpeg]
// ROOT holds train/ (an ImageFolder, or *.tar shards); "plain" leaves out RandAugment; nvjpeg
// decodes each batch's JPEGs on the GPU (data/jpeg_gpu.h). Prints one line: the decoder, the
// workers, the recipe and img/s in the steady state: the loader fills up to WORKERS + 2 batches
// ahead, so the clock starts only after twice that many have come out (every worker has
// finished batches, the ring has drained), and runs over max(BATCHES, 20 x WORKERS) batches:
// batches in flight when the clock starts are at most WORKERS, so they inflate the rate by at
// most 1/20. (Counting from the second batch, as this once did, credited the batches the
// workers had decoded before the clock started: ~2x too high when WORKERS ~ BATCHES / 2.)
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/dataset.h"
#include "data/jpeg_gpu.h"
#include "data/loader.h"
#include "src/base/config.h"
#include "src/base/util.h"

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr,
            "usage: %s ROOT imagefolder|shards WORKERS [BATCHES] [full|plain] [BATCH] "
            "[stb|nvjpeg]\n",
            argv[0]);
    return 2;
  }
  int workers = atoi(argv[3]), batches = argc > 4 ? atoi(argv[4]) : 40;
  bool full = argc <= 5 || strcmp(argv[5], "plain") != 0;
  int batch = argc > 6 ? atoi(argv[6]) : 128;
  bool nvjpeg = argc > 7 && strcmp(argv[7], "nvjpeg") == 0;
  if (nvjpeg && !jpeg_gpu_built()) {
    fprintf(stderr,
            "error: this build has no nvJPEG (use BUILD/bench_loader of a build that has)\n");
    return 1;
  }
  Config cfg;
  config_defaults(&cfg);
  snprintf(cfg.path, sizeof cfg.path, "%s", argv[1]);
  snprintf(cfg.dataset, sizeof cfg.dataset, "%s", argv[2]);
  snprintf(cfg.interpolation, sizeof cfg.interpolation, "bicubic");
  if (full) snprintf(cfg.randaugment, sizeof cfg.randaugment, "rand-m9-mstd0.5-inc1");
  Error err;
  Dataset *ds;
  if (dataset_open(&ds, &cfg, "train", &err) != 0) {
    fprintf(stderr, "error: %s\n", err.msg);
    return 1;
  }
  LoaderOptions opt = {.batch_size = batch,
                       .train = true,
                       .seed = 0,
                       .workers = workers,
                       .prefetch = workers + 2,
                       .rank = 0,
                       .world = 1,
                       .gpu_decode = nvjpeg};
  Loader *L;
  if (loader_create(&L, ds, &opt, &err) != 0) {
    fprintf(stderr, "error: %s\n", err.msg);
    return 1;
  }
  const int warmup = 2 * opt.prefetch, measured = batches > 20 * workers ? batches : 20 * workers;
  double t0 = 0;
  int done = 0;
  for (int i = 0; i < warmup + measured; i++) {
    Batch *b;
    if (loader_next(L, &b, &err) != 0 || !b) {
      fprintf(stderr, "error: %s\n", err.msg);
      return 1;
    }
    loader_release_batch(L, b);
    if (i == warmup - 1) t0 = time_now_s();
    if (i >= warmup) done += b->count;
  }
  double dt = time_now_s() - t0;
  printf("swin.c loader  %-11s %-6s workers %2d  %s  %5d images  %8.1f img/s%s%s\n", argv[2],
         nvjpeg ? "nvjpeg" : "stb", workers,
         full ? "RRC+flip+RandAugment (bicubic)" : "RRC+flip (bicubic)", done, done / dt,
         nvjpeg ? "  " : "", nvjpeg ? loader_decoder(L) : "");
  loader_destroy(L);
  dataset_close(ds);
  return 0;
}
