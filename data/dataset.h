// dataset.h: datasets, and the loading of one sample as a transformed image.
//
// A Dataset is a list of samples (an image source and a label): Fashion-MNIST from gzipped IDX
// files, an ImageFolder (root/<class>/*.{jpg,jpeg,png}, classes sorted by name), tar shards
// (root/<split>/*.tar of NNNNNN.jpg + NNNNNN.cls, data/shards.h) or synthetic random pixels.
// Files are decoded with stb_image (data/image.h). Every sample becomes an img_h x img_w x
// in_chans uint8 image:
//   train: RandomResizedCrop(scale, ratio) + horizontal flip, then RandAugment or ColorJitter
//          when set (data/transform.h), every draw from the counter-based RNG keyed by (seed,
//          epoch, sample index), so results never depend on threads;
//   eval:  resize so the shorter side is img / crop_pct, then center crop img.
// The threaded batch loader over a Dataset is data/loader.h; what it alone needs from one
// (sample sizes, the nvJPEG path's draws) is in data/transform.h.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "src/base/config.h"
#include "src/base/util.h"

typedef struct Dataset Dataset;

// split: "train" or "val". Errors name the directory or file and hint at the fix.
int dataset_open(Dataset **ds, const Config *cfg, const char *split, Error *err);
void dataset_close(Dataset *ds);
int64_t dataset_size(const Dataset *ds);
int dataset_num_classes(const Dataset *ds);
const char *dataset_describe(const Dataset *ds);  // "fashion-mnist train: 60000 images, 10 classes"
int64_t dataset_bad_count(const Dataset *ds);     // data.skip_bad: distinct bad files met so far
// The name of class c (0 <= c < dataset_num_classes): an ImageFolder's class directory,
// Fashion-MNIST's label ("T-shirt/top", ..., "Ankle boot"); NULL where the dataset has none
// (shards, synthetic) or c is out of range.
const char *dataset_class_name(const Dataset *ds, int c);
// The image files (*.jpg, *.jpeg, *.png in any case, not hidden) directly in dir, as an
// ImageFolder class directory lists them: sorted by name (strcmp), not recursive; *paths gets
// *count malloc'ed paths "dir/name" (free with dataset_paths_free). Errors name dir.
int dataset_list_images(const char *dir, char ***paths, int *count, Error *err);
void dataset_paths_free(char **paths, int count);
// Every class name joined with '\n', in class order (malloc'ed; checkpoints and exports store it
// as metadata "class_names"), or NULL when the dataset has no names or one holds a '\n'.
char *dataset_class_names_joined(const Dataset *ds);

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

// Where a loader's time goes, per stage, summed over its workers (loader_stage_times,
// data/loader.h): read (files), parse (headers, and the draws of the nvJPEG path), decode,
// geometric (crop, resize, flip), colour (RandAugment or colour jitter) and upload (into the
// device batch). Host time on the CPU path, device time for the stages the nvJPEG path runs on
// the GPU. Declared here because loading a sample (dataset_load_sample_timed) adds to them.
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
