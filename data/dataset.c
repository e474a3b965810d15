// dataset.c: the Dataset API's dispatcher (data/dataset.h): dataset_open's checks shared by
// every kind, then the kind's open (data.dataset: fashion_mnist, data/fashion_mnist.c;
// imagefolder, data/imagefolder.c; shards; synthetic); close, the accessors, and sample loading
// switched on the kind (file images: data/file_samples.c). The two kinds too small for a file of
// their own live here: tar shards, whose index and stream order data/shards.c keeps, and
// synthetic random pixels, computed from (seed, split, index), which read nothing.
#define _POSIX_C_SOURCE 200809L  // stat (data/dataset_internal.h)
#include <stdlib.h>
#include <string.h>

#include "data/dataset_internal.h"

static const char *HINT_PATH_EXAMPLE =
    "HINT: set data.path, e.g. data.path=/usr/share/datasets/fashion-mnist (fashion_mnist) or "
    "data.path=/data/imagenet (imagefolder: <path>/train/<class>/*.jpg, <path>/val/<class>/*.jpg)";

static bool path_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

// ---- tar shards ----

static int open_shards(Dataset *ds, const Config *cfg, const char *split, Error *err) {
  char split_dir[PATH_BYTES];
  if (join_path(split_dir, cfg->path, split, err)) return -1;
  if (!is_dir(split_dir))
    return error_set(err,
                     "shards split directory '%s' does not exist\n"
                     "HINT: data.dataset=shards reads <data.path>/train/*.tar and "
                     "<data.path>/val/*.tar (scripts/make_shards.py writes them)",
                     split_dir);
  if (shards_open(&ds->shards, split_dir, err) != 0) return -1;
  int limit = strcmp(split, "train") == 0 ? cfg->train_limit : cfg->val_limit;
  shards_limit(&ds->shards, limit);
  ds->n = ds->shards.n;
  ds->num_classes = ds->shards.max_label + 1;
  ds->shuffle_buffer = cfg->shuffle_buffer > 0 ? cfg->shuffle_buffer : 1;
  snprintf(ds->describe, sizeof ds->describe,
           "shards %s (%s): %lld images in %d tar files, %d classes", split, split_dir,
           (long long)ds->n, ds->shards.num_shards, ds->num_classes);
  return 0;
}

bool dataset_is_stream(const Dataset *ds) {
  return ds->kind == DATASET_SHARDS;
}

int64_t dataset_stream_samples(const Dataset *ds, int rank, int world) {
  return shards_rank_samples(&ds->shards, rank, world);
}

void dataset_stream_order(const Dataset *ds, uint64_t seed, int64_t epoch, int rank, int world,
                          int64_t *order) {
  shards_epoch_order(&ds->shards, seed, epoch, rank, world, ds->shuffle_buffer, order);
}

// ---- synthetic ----

// Random pixels and labels, a pure function of (seed, split, index): no files, for benchmarks
// and tests of the trainer itself. data.train_limit / data.val_limit give the sizes.
static int open_synthetic(Dataset *ds, const Config *cfg, const char *split) {
  bool train = strcmp(split, "train") == 0;
  int limit = train ? cfg->train_limit : cfg->val_limit;
  ds->n = limit > 0 ? limit : (train ? 12800 : 1280);
  ds->num_classes = cfg->num_classes;
  ds->synthetic_seed = cfg->seed * 2 + (train ? 0 : 1);
  snprintf(ds->describe, sizeof ds->describe, "synthetic %s: %lld random images, %d classes", split,
           (long long)ds->n, ds->num_classes);
  return 0;
}

// Fills a synthetic sample: 4 pixels per Philox word, the label from the first draw after them.
static void load_synthetic(const Dataset *ds, int64_t i, uint8_t *pixels, int *label) {
  int64_t bytes = dataset_sample_bytes(ds);
  Rng r = rng_make(ds->synthetic_seed, RNG_STREAM_AUGMENT, (uint64_t)i, UINT32_MAX);
  for (int64_t k = 0; k < bytes; k += 4) {
    uint32_t u = rng_u32(&r);
    for (int64_t j = k; j < k + 4 && j < bytes; j++, u >>= 8) pixels[j] = (uint8_t)u;
  }
  *label = (int)rng_below(&r, (uint32_t)ds->num_classes);
}

// ---- the API ----

int dataset_open(Dataset **out, const Config *cfg, const char *split, Error *err) {
  *out = NULL;
  if (strcmp(split, "train") != 0 && strcmp(split, "val") != 0) {
    return error_set(err, "dataset split '%s' is unknown (want \"train\" or \"val\")", split);
  }
  bool synthetic = strcmp(cfg->dataset, "synthetic") == 0;  // no files
  if (!synthetic && cfg->path[0] == '\0')
    return error_set(err, "data.path is not set\n%s", HINT_PATH_EXAMPLE);
  if (!synthetic && !is_dir(cfg->path)) {
    return error_set(err, "data.path '%s' %s\n%s", cfg->path,
                     path_exists(cfg->path) ? "is not a directory" : "does not exist",
                     HINT_PATH_EXAMPLE);
  }
  TransformParams transform;
  if (transform_params_from_config(&transform, cfg, err) != 0) return -1;
  Dataset *ds = calloc_check(1, sizeof *ds);
  ds->transform = transform;
  int rc;
  if (strcmp(cfg->dataset, "fashion_mnist") == 0) {
    ds->kind = DATASET_FASHION_MNIST;
    rc = fashion_mnist_open(ds, cfg, split, err);
  } else if (strcmp(cfg->dataset, "imagefolder") == 0) {
    ds->kind = DATASET_IMAGEFOLDER;
    rc = imagefolder_open(ds, cfg, split, err);
  } else if (strcmp(cfg->dataset, "shards") == 0) {
    ds->kind = DATASET_SHARDS;
    rc = open_shards(ds, cfg, split, err);
  } else if (strcmp(cfg->dataset, "synthetic") == 0) {
    ds->kind = DATASET_SYNTHETIC;
    rc = open_synthetic(ds, cfg, split);
  } else {
    rc = error_set(err,
                   "data.dataset '%s' is unknown\nHINT: use fashion_mnist, imagefolder, shards or "
                   "synthetic",
                   cfg->dataset);
  }
  if (rc == 0 && ds->n == 0) {
    rc = error_set(err, "%s: the split is empty", ds->describe);
  }
  if (rc == 0 && (ds->kind == DATASET_IMAGEFOLDER || ds->kind == DATASET_SHARDS) && cfg->skip_bad) {
    ds->skip_bad = true;
    ds->known_bad = calloc_check((size_t)ds->n, 1);
    ds->bad_lock = malloc_check(sizeof *ds->bad_lock);
    pthread_mutex_init(ds->bad_lock, NULL);
  }
  if (rc != 0) {
    dataset_close(ds);
    return -1;
  }
  *out = ds;
  return 0;
}

void dataset_close(Dataset *ds) {
  if (!ds) return;
  free(ds->image_file);
  free(ds->label_file);
  if (ds->paths) {
    for (int64_t i = 0; i < ds->n; i++) free(ds->paths[i]);
    free(ds->paths);
  }
  free(ds->class_of);
  if (ds->class_names) {
    for (int c = 0; c < ds->num_classes; c++) free(ds->class_names[c]);
    free(ds->class_names);
  }
  shards_close(&ds->shards);
  free(ds->known_bad);
  if (ds->bad_lock) {
    pthread_mutex_destroy(ds->bad_lock);
    free(ds->bad_lock);
  }
  free(ds);
}

int64_t dataset_size(const Dataset *ds) {
  return ds->n;
}
int dataset_num_classes(const Dataset *ds) {
  return ds->num_classes;
}
const char *dataset_describe(const Dataset *ds) {
  return ds->describe;
}

// Fashion-MNIST's labels 0..9, as its authors name them.
static const char *const FASHION_MNIST_CLASSES[10] = {
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

const char *dataset_class_name(const Dataset *ds, int c) {
  if (c < 0 || c >= ds->num_classes) return NULL;
  if (ds->class_names) return ds->class_names[c];
  if (ds->kind == DATASET_FASHION_MNIST && c < 10) return FASHION_MNIST_CLASSES[c];
  return NULL;
}

char *dataset_class_names_joined(const Dataset *ds) {
  size_t bytes = 1;
  for (int c = 0; c < ds->num_classes; c++) {
    const char *name = dataset_class_name(ds, c);
    if (!name || strchr(name, '\n')) return NULL;
    bytes += strlen(name) + 1;
  }
  if (ds->num_classes == 0) return NULL;
  char *joined = malloc_check(bytes), *at = joined;
  for (int c = 0; c < ds->num_classes; c++) {
    size_t len = strlen(dataset_class_name(ds, c));
    memcpy(at, dataset_class_name(ds, c), len);
    at += len;
    *at++ = c + 1 < ds->num_classes ? '\n' : '\0';
  }
  return joined;
}

int64_t dataset_sample_bytes(const Dataset *ds) {
  const TransformParams *p = &ds->transform;
  return (int64_t)p->out_h * p->out_w * p->chans;
}

int dataset_load_sample(const Dataset *ds, int64_t i, bool train, uint64_t seed, int64_t epoch,
                        uint8_t *pixels, int *label, Error *err) {
  return dataset_load_sample_timed(ds, i, train, seed, epoch, pixels, label, NULL, err);
}

int dataset_load_sample_timed(const Dataset *ds, int64_t i, bool train, uint64_t seed,
                              int64_t epoch, uint8_t *pixels, int *label, LoaderStageTimes *times,
                              Error *err) {
  if (i < 0 || i >= ds->n) {
    return error_set(err, "%s: sample %lld is out of range", ds->describe, (long long)i);
  }
  if (ds->kind == DATASET_SYNTHETIC) {
    load_synthetic(ds, i, pixels, label);
    return 0;
  }
  Rng rng = rng_make(seed, RNG_STREAM_AUGMENT, (uint64_t)epoch, (uint64_t)i);
  if (ds->kind == DATASET_FASHION_MNIST) {
    fashion_mnist_load_sample(ds, i, train, &rng, pixels, label);
    return 0;
  }
  return file_sample_load(ds, i, train, &rng, pixels, label, times, err);
}

bool dataset_has_files(const Dataset *ds) {
  return ds->kind == DATASET_IMAGEFOLDER || ds->kind == DATASET_SHARDS;
}

int dataset_channels(const Dataset *ds) {
  return ds->transform.chans;
}

ImageAugFill dataset_colour_fill(const Dataset *ds) {
  ImageAugFill fill = {{0}};
  memcpy(fill.v, ds->transform.fill, sizeof ds->transform.fill);
  return fill;
}
