// loader.h: the threaded batch loader over a Dataset (data/dataset.h).
//
// Its workers load samples with dataset_load_sample (stb_image), or decode their files with the
// GPU's nvJPEG (gpu_decode, data/jpeg_gpu.h), which then runs the transform on the device too
// (only the draws stay on the CPU). The Loader runs `workers` threads that fill a ring of
// `prefetch` batch buffers ahead of the trainer: host buffers, or with device_batch (gpu_decode)
// device buffers the batch never leaves (Batch.device_pixels). Global batch k of epoch e holds
// samples perm_e[k*G .. (k+1)*G), G = batch_size * world (train: a permutation drawn from (seed,
// epoch), last partial batch dropped; eval: in order, last batch partial), and rank r takes its
// contiguous slice [r*batch_size, (r+1)*batch_size) of it (in eval's last batch a rank's slice may
// be short or empty). Training on shards instead takes rank r's batch k from its own stream order
// (dataset_stream_order): samples [k*batch_size, (k+1)*batch_size), with min over ranks of
// dataset_stream_samples / batch_size batches per epoch, so every rank makes the same number of
// steps. Host buffers come from an allocator hook, so the CUDA backend can make them page-locked.
// The per-stage times it sums (LoaderStageTimes) are declared in data/dataset.h, which fills them.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data/dataset.h"
#include "src/base/config.h"
#include "src/base/util.h"

// The checks of the data keys that need the data code, after config_validate (src/base/config.h):
// data.decoder = nvjpeg needs a build with nvJPEG and a gray or RGB model, data.randaugment parses
// (data/randaugment.h), RandAugment and colour jitter need gray or RGB. Messages start with
// where the values came from, as config_validate's do.
int data_config_validate(const Config *cfg, Error *err);

// data.workers = 0 and data.prefetch = 0 (auto), resolved. A process may run on `cores` cores
// (its CPU affinity: what a launcher's binding or taskset leaves it) of a node whose `online`
// cores are shared by `local_world` processes; it takes min(cores, online / local_world), at
// least 1, less one for the trainer's own thread, as workers (at least 1), and a ring of
// workers + 2 batch buffers: every worker can fill a batch while the trainer holds one and the
// next one waits ready, so the ring never caps the parallelism. A key > 0 is taken as given.
typedef struct {
  int workers, prefetch;
  int cores;                         // the cores counted for this process
  bool auto_workers, auto_prefetch;  // which of the two were chosen here
} LoaderSizing;

LoaderSizing loader_sizing(int workers_key, int prefetch_key, int cores, int online,
                           int local_world);
// The cores this process may run on (sched_getaffinity), and *online those of the machine.
int loader_process_cores(int *online);
// "15 workers (auto: 16 cores for this process, one for the trainer's thread), a ring of 17
// batches (auto: workers + 2)", or with "(data.workers)" where a key set it.
void loader_sizing_describe(const LoaderSizing *s, char *buf, size_t size);

typedef struct {
  uint8_t *pixels;  // (count, img_h, img_w, in_chans) host memory
  // The same in device memory when the loader decodes on the GPU (gpu_decode with files), else
  // NULL; with device_batch only this one holds the batch's pixels (host pixels then hold only
  // the samples stb decoded).
  uint8_t *device_pixels;
  int *labels;       // (count)
  int64_t *samples;  // (count) dataset indices of the samples (per-sample augmentation keys)
  int count;         // samples in this batch (eval's last batch may be short)
  int64_t epoch;     // which epoch and which batch of that epoch this is
  int64_t index;
} Batch;

typedef struct {
  int batch_size;  // per rank
  bool train;      // shuffle + augment, drop the last partial batch
  uint64_t seed;
  int workers, prefetch;
  LoaderSizing sizing;  // how workers and prefetch were chosen (for the start-up line)
  int rank, world;
  int64_t start_epoch, start_batch;  // resume position: the first batch to produce
  // Decode each batch's JPEG files with nvJPEG, one decoder per worker (data/jpeg_gpu.h), on
  // the CUDA device current when loader_create runs, and crop + resize + flip and colour them
  // there (the same bytes as the CPU's transform of nvJPEG's pixels); PNGs and what nvJPEG does
  // not take go to stb_image. Only ImageFolder and shards have files; other datasets ignore it.
  bool gpu_decode;
  // With gpu_decode: the batch is handed over in device memory (Batch.device_pixels), the
  // pixels never cross to the host; else it comes back to Batch.pixels as on the stb path.
  bool device_batch;
  // Buffer allocator (NULL: malloc/free); the CUDA backend passes cudaHostAlloc/cudaFreeHost.
  void *(*alloc)(size_t bytes);
  void (*release)(void *ptr);
} LoaderOptions;

typedef struct Loader Loader;

int loader_create(Loader **loader, const Dataset *ds, const LoaderOptions *opt, Error *err);
// Batches per epoch for this rank.
int64_t loader_batches_per_epoch(const Loader *loader);
// The decoder the workers run: "stb", or "nvjpeg, hardware backend" / "nvjpeg, gpu backend"
// (data/jpeg_gpu.h; the first worker's, which every worker shares with the same device).
const char *loader_decoder(const Loader *loader);
// Blocks until the next batch (in order) is ready; returns 0, or -1 with err (e.g. a corrupt
// image, naming it). The batch stays valid until loader_release_batch.
int loader_next(Loader *loader, Batch **batch, Error *err);
void loader_release_batch(Loader *loader, Batch *batch);
// The stage times of the batches finished so far (a copy, taken under the loader's lock).
void loader_stage_times(Loader *loader, LoaderStageTimes *times);
void loader_destroy(Loader *loader);
