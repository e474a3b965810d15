// fashion_mnist.c: the Fashion-MNIST dataset: its IDX files (gzipped or plain; data/gzip.h)
// read and checked at open, decoded into memory once (60000 x 28 x 28 bytes), and a sample's
// transform of its gray image.
#define _POSIX_C_SOURCE 200809L  // stat (data/dataset_internal.h)
#include <stdlib.h>
#include <string.h>

#include "data/dataset_internal.h"
#include "data/gzip.h"

static uint32_t read_be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

// Reads dir/name, or dir/name.gz when the plain file is absent; gzip is recognized by its magic
// bytes. path gets the file actually read.
static uint8_t *read_idx_file(const char *dir, const char *name, char *path, size_t *size,
                              Error *err) {
  if (join_path(path, dir, name, err)) return NULL;
  if (!is_file(path)) {
    size_t len = strlen(path);
    if (len + 3 >= PATH_BYTES) {
      error_set(err, "path '%s.gz' is too long", path);
      return NULL;
    }
    memcpy(path + len, ".gz", 4);
    if (!is_file(path)) {
      error_set(err,
                "Fashion-MNIST file '%s/%s' (or '%s.gz') not found\n"
                "HINT: data.path must hold train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
                "t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz (Debian: apt-get install "
                "dataset-fashion-mnist puts them in /usr/share/datasets/fashion-mnist)",
                dir, name, name);
      return NULL;
    }
  }
  size_t raw_size = 0;
  uint8_t *raw = read_file(path, &raw_size, err);
  if (!raw) return NULL;
  if (gzip_detect(raw, raw_size)) {
    uint8_t *out = gzip_inflate(raw, raw_size, path, size, err);
    free(raw);
    return out;
  }
  *size = raw_size;
  return raw;
}

int fashion_mnist_open(Dataset *ds, const Config *cfg, const char *split, Error *err) {
  bool train = strcmp(split, "train") == 0;
  const char *prefix = train ? "train" : "t10k";
  char image_name[64], label_name[64], image_path[PATH_BYTES], label_path[PATH_BYTES];
  snprintf(image_name, sizeof image_name, "%s-images-idx3-ubyte", prefix);
  snprintf(label_name, sizeof label_name, "%s-labels-idx1-ubyte", prefix);
  if (cfg->in_chans != 1 && cfg->in_chans != 3) {
    error_set(err,
              "model.in_chans = %d, but Fashion-MNIST images are grayscale\n"
              "HINT: set model.in_chans=1 (or 3 to replicate the gray channel)",
              cfg->in_chans);
    return config_error_where(cfg, err);
  }
  size_t image_size = 0, label_size = 0;
  ds->image_file = read_idx_file(cfg->path, image_name, image_path, &image_size, err);
  if (!ds->image_file) return -1;
  ds->label_file = read_idx_file(cfg->path, label_name, label_path, &label_size, err);
  if (!ds->label_file) return -1;

  const char *hint = "HINT: the file is damaged or not a Fashion-MNIST IDX file; reinstall it";
  if (image_size < 16 || read_be32(ds->image_file) != 0x803) {
    return error_set(err, "'%s': not an IDX image file (magic 0x%x, want 0x803)\n%s", image_path,
                     image_size >= 4 ? read_be32(ds->image_file) : 0, hint);
  }
  if (label_size < 8 || read_be32(ds->label_file) != 0x801) {
    return error_set(err, "'%s': not an IDX label file (magic 0x%x, want 0x801)\n%s", label_path,
                     label_size >= 4 ? read_be32(ds->label_file) : 0, hint);
  }
  uint32_t count = read_be32(ds->image_file + 4), rows = read_be32(ds->image_file + 8),
           cols = read_be32(ds->image_file + 12), label_count = read_be32(ds->label_file + 4);
  if (rows == 0 || cols == 0 || rows > 65536 || cols > 65536) {
    return error_set(err, "'%s': bad image size %ux%u\n%s", image_path, rows, cols, hint);
  }
  uint64_t want_size = 16 + (uint64_t)count * rows * cols;
  if (image_size != want_size) {
    return error_set(err, "'%s': %zu bytes, but its header (%u images of %ux%u) needs %llu\n%s",
                     image_path, image_size, count, rows, cols, (unsigned long long)want_size,
                     hint);
  }
  if (label_size != 8 + (uint64_t)label_count) {
    return error_set(err, "'%s': %zu bytes, but its header (%u labels) needs %llu\n%s", label_path,
                     label_size, label_count, 8 + (unsigned long long)label_count, hint);
  }
  if (count != label_count) {
    return error_set(err, "'%s' has %u images but '%s' has %u labels\n%s", image_path, count,
                     label_path, label_count, hint);
  }
  ds->images = ds->image_file + 16;
  ds->labels = ds->label_file + 8;
  ds->src_h = (int)rows;
  ds->src_w = (int)cols;
  ds->n = count;
  ds->num_classes = 10;
  for (int64_t i = 0; i < ds->n; i++) {
    if (ds->labels[i] >= ds->num_classes) {
      return error_set(err, "'%s': label %d of sample %lld is outside [0, %d)\n%s", label_path,
                       ds->labels[i], (long long)i, ds->num_classes, hint);
    }
  }
  int limit = train ? cfg->train_limit : cfg->val_limit;
  if (limit > 0 && limit < ds->n) ds->n = limit;  // the first `limit` in file order
  snprintf(ds->describe, sizeof ds->describe, "fashion-mnist %s: %lld images, %d classes", split,
           (long long)ds->n, ds->num_classes);
  return 0;
}

// Copies gray (h*w bytes at the start of img) to every channel, in place, from the back so that
// no gray value is overwritten before it is read.
static void replicate_gray(uint8_t *img, int64_t pixels, int chans) {
  for (int64_t i = pixels - 1; i >= 0; i--) {
    uint8_t g = img[i];
    for (int c = 0; c < chans; c++) img[i * chans + c] = g;
  }
}

void fashion_mnist_load_sample(const Dataset *ds, int64_t i, bool train, Rng *rng, uint8_t *pixels,
                               int *label) {
  // Transform the single gray channel, then replicate: 3x less resampling work.
  // RandAugment's fill is per channel, so colour ops run after the expansion.
  TransformParams gray = ds->transform;
  gray.chans = 1;
  const uint8_t *src = ds->images + i * ds->src_h * ds->src_w;
  if (train)
    transform_train(&gray, src, ds->src_h, ds->src_w, rng, pixels);
  else
    transform_eval(&gray, src, ds->src_h, ds->src_w, pixels);
  if (ds->transform.chans > 1) {
    replicate_gray(pixels, (int64_t)gray.out_h * gray.out_w, ds->transform.chans);
  }
  if (train) transform_train_color(&ds->transform, pixels, ds->transform.chans, rng);
  *label = ds->labels[i];
}
