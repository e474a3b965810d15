// loader.h: datasets, the per-image transforms and the threaded batch loader.
//
// A Dataset is a list of samples (an image source and a label): Fashion-MNIST from gzipped IDX
// files, an ImageFolder (root/<class>/*.{jpg,jpeg,png}, classes sorted by name), tar shards
// (root/<split>/*.tar of NNNNNN.jpg + NNNNNN.cls, data/shards.h) or synthetic random pixels.
// Files are decoded with stb_image, or with the GPU's nvJPEG (gpu_decode, data/jpeg_gpu.h),
// which then runs the transform on the device too (only the draws stay on the CPU). Every
// sample becomes an img_h x img_w x in_chans uint8 image:
//   train: RandomResizedCrop(scale, ratio) + horizontal flip, then RandAugment or ColorJitter
//          when set (data/transform.h), every draw from the counter-based RNG keyed by (seed,
//          epoch, sample index), so results never depend on threads;
//   eval:  resize so the shorter side is img / crop_pct, then center crop img.
// The Loader runs `workers` threads that fill a ring of `prefetch` batch buffers ahead of the
// trainer: host buffers, or with device_batch (gpu_decode) device buffers the batch never leaves
// (Batch.device_pixels). Global batch k of epoch e holds samples perm_e[k*G .. (k+1)*G), G =
// batch_size * world (train: a permutation drawn from (seed, epoch), last partial batch dropped;
// eval: in order, last batch partial), and rank r takes its contiguous slice [r*batch_size,
// (r+1)*batch_size) of it (in eval's last batch a rank's slice may be short or empty). Training
// on shards instead takes rank r's batch k from its own stream order (dataset_stream_order):
// samples [k*batch_size, (k+1)*batch_size), with min over ranks of dataset_stream_samples /
// batch_size batches per epoch, so every rank makes the same number of steps. Host buffers
// come from an allocator hook, so the CUDA backend can make them page-locked.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "src/config.h"
#include "src/util.h"

typedef struct Dataset Dataset;

// split: "train" or "val". Errors name the directory or file and hint at the fix.
int dataset_open(Dataset **ds, const Config *cfg, const char *split, Error *err);
void dataset_close(Dataset *ds);
int64_t dataset_size(const Dataset *ds);
int dataset_num_classes(const Dataset *ds);
const char *dataset_describe(const Dataset *ds);  // "fashion-mnist train: 60000 images, 10 classes"
int64_t dataset_bad_count(const Dataset *ds);     // data.skip_bad: distinct bad files met so far

// Tar shards are read as streams (data/shards.h): training batches of rank r come from r's own
// shards through a shuffle buffer, not from a global permutation. For such a dataset
// dataset_stream_samples gives the samples rank owns, and dataset_stream_order its order in
// epoch (dataset indices, dataset_stream_samples of them), drawn from (seed, epoch, rank).
bool dataset_is_stream(const Dataset *ds);
int64_t dataset_stream_samples(const Dataset *ds, int rank, int world);
void dataset_stream_order(const Dataset *ds, uint64_t seed, int64_t epoch, int rank, int world,
                          int64_t *order);

// Loads sample i into pixels (img_h, img_w, in_chans) with the train or eval transform.
// train draws come from (seed, epoch, i). Errors name the image file. With data.skip_bad an
// ImageFolder image that does not decode (or is over 64 Mpixel) is replaced by the next sample
// in split order that decodes, with that sample's label and i's augmentation draws; each bad
// file is named on stderr once and counted.
int dataset_load_sample(const Dataset *ds, int64_t i, bool train, uint64_t seed, int64_t epoch,
                        uint8_t *pixels, int *label, Error *err);

// Where a loader's time goes, per stage, summed over its workers (loader_stage_times): read
// (files), parse (headers, and the draws of the nvJPEG path), decode, geometric (crop, resize,
// flip), colour (RandAugment or colour jitter) and upload (into the device batch). Host time on
// the CPU path, device time for the stages the nvJPEG path runs on the GPU.
typedef enum {
  LOADER_READ,
  LOADER_PARSE,
  LOADER_DECODE,
  LOADER_GEOMETRIC,
  LOADER_COLOUR,
  LOADER_UPLOAD,
  LOADER_STAGES
} LoaderStage;
typedef struct {
  double seconds[LOADER_STAGES];
  int64_t images;  // images the times cover
} LoaderStageTimes;
extern const char *const loader_stage_names[LOADER_STAGES];  // "read", "parse", ...

// dataset_load_sample that adds its stages' host times to *times (NULL: none) and counts the
// image there.
int dataset_load_sample_timed(const Dataset *ds, int64_t i, bool train, uint64_t seed,
                              int64_t epoch, uint8_t *pixels, int *label, LoaderStageTimes *times,
                              Error *err);

// For the loader's GPU decode (data/jpeg_gpu.h). dataset_sample_file: sample i's file as read
// (malloc'ed, *size bytes), or NULL when there is none to decode (Fashion-MNIST, synthetic, a
// file data.skip_bad knows is bad, a read error: dataset_load_sample then reports it).
// dataset_load_decoded_sample: dataset_load_sample with sample i's own file already decoded to
// img (h, w, in_chans); the transform and its draws are the same. The loader runs it in steps,
// drawn here (dataset_plan_sample, dataset_plan_colour in data/transform.h) and run on the GPU:
// the crop, resize and flip, then the colour steps; this whole form is their reference
// (tests/test_gpu_jpeg.c).
bool dataset_has_files(const Dataset *ds);  // ImageFolder and shards: images as JPEG/PNG files
int dataset_channels(const Dataset *ds);    // channels of every sample (model.in_chans)
uint8_t *dataset_sample_file(const Dataset *ds, int64_t i, size_t *size);
int dataset_load_decoded_sample(const Dataset *ds, int64_t i, bool train, uint64_t seed,
                                int64_t epoch, const uint8_t *img, int h, int w, uint8_t *pixels,
                                int *label, Error *err);

// data.workers = 0 and data.prefetch = 0 (auto), resolved. A process may run on `cores` cores
// (its CPU affinity: what a launcher's binding or taskset leaves it) of a node whose `online`
// cores are shared by `local_world` processes; it takes min(cores, online / local_world), at
// least 1, less one for the trainer's own thread, as workers (at least 1), and a ring of
// workers + 2 batch buffers: every worker can fill a batch while the trainer holds one and the
// next one waits ready, so the ring never caps the parallelism. A key > 0 is taken as given.
typedef struct {
  int workers, prefetch;
  int cores;                        // the cores counted for this process
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
  uint8_t *pixels;   // (count, img_h, img_w, in_chans) host memory
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
