// dataset_internal.h: what the dataset files share and nothing else includes: the Dataset
// struct, the path helpers of the kinds that read directories, and the entry points the
// dispatcher (dataset.c) calls in the kinds' own files.
//
// dataset.c        the dispatcher: dataset_open (the checks every kind shares, then the kind's
//                  open), dataset_close, the accessors, sample loading switched on the kind; and
//                  the two kinds too small for a file: tar shards (whose index data/shards.c
//                  keeps) and synthetic
// fashion_mnist.c  Fashion-MNIST's IDX files, gzipped or plain, decoded into memory at open
// imagefolder.c    the ImageFolder scan: root/<split>/<class>/*.{jpg,jpeg,png} into a sorted list
//                  (and dataset_list_images, one directory's images)
// file_samples.c   samples whose image is a file (ImageFolder, shards): read, decode, skip_bad's
//                  replacement (dataset_bad_count), the transform, and the functions of the
//                  loader's nvJPEG path (dataset_sample_file, dataset_load_decoded_sample,
//                  dataset_plan_sample, dataset_plan_colour)
//
// Files including it define _POSIX_C_SOURCE 200809L first (stat).
#pragma once
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>

#include "data/dataset.h"
#include "data/shards.h"
#include "data/transform.h"
#include "src/base/config.h"
#include "src/base/rng.h"
#include "src/base/util.h"

#define PATH_BYTES 4096

typedef enum {
  DATASET_FASHION_MNIST,
  DATASET_IMAGEFOLDER,
  DATASET_SHARDS,
  DATASET_SYNTHETIC
} DatasetKind;

struct Dataset {
  DatasetKind kind;
  TransformParams transform;  // output shape and augmentation settings
  int64_t n;                  // samples used (after train_limit / val_limit)
  int num_classes;
  char describe[PATH_BYTES + 128];

  // Fashion-MNIST: the decoded IDX files, headers included.
  uint8_t *image_file, *label_file;
  const uint8_t *images;  // (n, src_h, src_w) grayscale
  const uint8_t *labels;  // (n)
  int src_h, src_w;

  // ImageFolder: sorted file list, and the class directories' names.
  char **paths;        // (n) image files
  int *class_of;       // (n) labels
  char **class_names;  // (num_classes)

  // Synthetic: the seed that keys its pixels and labels.
  uint64_t synthetic_seed;

  // Shards: the tar index, and the shuffle buffer of training streams.
  ShardSet shards;
  int64_t shuffle_buffer;
  // data.skip_bad: files found not to decode are flagged (so each is named once and not decoded
  // again) and counted. Loader workers share the dataset, hence the lock.
  bool skip_bad;
  uint8_t *known_bad;  // (n) 1 = does not decode
  int64_t bad_count;
  pthread_mutex_t *bad_lock;
};

// a/b into out (PATH_BYTES); -1 with err when it does not fit.
static inline int join_path(char *out, const char *a, const char *b, Error *err) {
  int len = snprintf(out, PATH_BYTES, "%s/%s", a, b);
  if (len < 0 || len >= PATH_BYTES) return error_set(err, "path '%s/%s' is too long", a, b);
  return 0;
}

static inline bool is_dir(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static inline bool is_file(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

// fashion_mnist.c. Opens split's IDX files in cfg->path into ds (n, num_classes, describe and
// the Fashion-MNIST fields); errors name the file.
int fashion_mnist_open(Dataset *ds, const Config *cfg, const char *split, Error *err);
// Sample i (in range) through the train or eval transform, the draws from rng, into pixels
// (out_h, out_w, chans), and its label.
void fashion_mnist_load_sample(const Dataset *ds, int64_t i, bool train, Rng *rng, uint8_t *pixels,
                               int *label);

// imagefolder.c. Scans cfg->path/split into ds (paths, class_of, n, num_classes, describe); the
// val split's classes must be train's.
int imagefolder_open(Dataset *ds, const Config *cfg, const char *split, Error *err);

// file_samples.c. dataset_load_sample_timed for a sample i (in range) of ImageFolder or shards,
// with rng keyed by (seed, epoch, i): decode (or under skip_bad, the next sample that decodes),
// transform, label; counts the image in *times (NULL: no times).
int file_sample_load(const Dataset *ds, int64_t i, bool train, Rng *rng, uint8_t *pixels,
                     int *label, LoaderStageTimes *times, Error *err);
