// dataset.c: the four datasets (data.dataset: Fashion-MNIST IDX files, gzipped or plain;
// ImageFolder trees of JPEG/PNG files; tar shards of such files, data/shards.h; synthetic random
// pixels) and sample loading: decode, transform, label.
//
// Fashion-MNIST is decoded into memory once (60000 x 28 x 28 bytes); gzip is parsed here (RFC 1952)
// and inflated with stb_image's zlib decoder, so the project needs no zlib. ImageFolder keeps only
// the file list and shards only their tar index; each image is read and decoded when it is
// loaded. Synthetic samples are computed from (seed, split, index) and read nothing.
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "data/batch_augment.h"
#include "data/image.h"
#include "data/loader.h"
#include "data/shards.h"
#include "data/transform.h"
#include "src/rng.h"
#include "stb_image.h"  // its zlib decoder inflates gzip; data/image.c compiles the implementation

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

  // ImageFolder: sorted file list.
  char **paths;   // (n) image files
  int *class_of;  // (n) labels

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

static const char *HINT_PATH_EXAMPLE =
    "HINT: set data.path, e.g. data.path=/usr/share/datasets/fashion-mnist (fashion_mnist) or "
    "data.path=/data/imagenet (imagefolder: <path>/train/<class>/*.jpg, <path>/val/<class>/*.jpg)";

static int join_path(char *out, const char *a, const char *b, Error *err) {
  int len = snprintf(out, PATH_BYTES, "%s/%s", a, b);
  if (len < 0 || len >= PATH_BYTES) return error_set(err, "path '%s/%s' is too long", a, b);
  return 0;
}

static bool is_dir(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool path_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

static bool is_file(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

// ---- gzip (RFC 1952) ----

// CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320) as gzip's trailer uses it. The table is
// built per call: 256 entries cost nothing next to the inflate, and no global state is needed.
static uint32_t crc32_bytes(const uint8_t *data, size_t n) {
  uint32_t table[256];
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    table[i] = c;
  }
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; i++) crc = table[(crc ^ data[i]) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

static uint32_t read_le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint32_t read_be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

// Inflates a single-member gzip file held in buf (size bytes); returns a malloc'ed buffer of
// *out_size bytes, or NULL with err naming path.
static uint8_t *gunzip(const uint8_t *buf, size_t size, const char *path, size_t *out_size,
                       Error *err) {
  enum { FTEXT = 1, FHCRC = 2, FEXTRA = 4, FNAME = 8, FCOMMENT = 16 };
  const char *hint = "HINT: the file is damaged or incomplete; download or reinstall it";
  if (size < 18) {
    error_set(err, "'%s': truncated gzip file (%zu bytes)\n%s", path, size, hint);
    return NULL;
  }
  if (buf[2] != 8 || (buf[3] & 0xE0)) {
    error_set(err, "'%s': unsupported gzip header (method %d, flags 0x%02x; only deflate)", path,
              buf[2], buf[3]);
    return NULL;
  }
  uint8_t flags = buf[3];
  size_t pos = 10;  // magic, method, flags, mtime, xfl, os
  size_t body_end = size - 8;
  if (flags & FEXTRA) {
    if (pos + 2 > body_end) goto truncated;
    pos += 2 + (size_t)(buf[pos] | buf[pos + 1] << 8);
  }
  for (int field = FNAME; field <= FCOMMENT; field <<= 1) {
    if (!(flags & field)) continue;
    while (pos < body_end && buf[pos] != 0) pos++;
    pos++;  // the terminating zero
  }
  if (flags & FHCRC) {
    if (pos + 2 > body_end) goto truncated;
    uint32_t want = (uint32_t)(buf[pos] | buf[pos + 1] << 8);
    if ((crc32_bytes(buf, pos) & 0xFFFF) != want) {
      error_set(err, "'%s': gzip header CRC mismatch\n%s", path, hint);
      return NULL;
    }
    pos += 2;
  }
  if (pos > body_end) goto truncated;
  if (size - pos > INT_MAX) {
    error_set(err, "'%s': gzip file too large (%zu bytes) for the built-in inflater", path, size);
    return NULL;
  }
  // The input runs to the end of the file, trailer included: stb_image 2.27's inflater fails
  // ("bad huffman code") when a code's last bits sit in the final 2 bytes of its input, and the
  // 8 trailer bytes are lookahead it reads but never decodes (it stops at the final block).
  int out_len = 0;
  uint8_t *out = (uint8_t *)stbi_zlib_decode_noheader_malloc((const char *)buf + pos,
                                                             (int)(size - pos), &out_len);
  if (!out) {
    const char *why = stbi_failure_reason();
    error_set(err, "'%s': corrupt gzip data (inflate failed: %s)\n%s", path, why ? why : "unknown",
              hint);
    return NULL;
  }
  uint32_t want_crc = read_le32(buf + body_end), want_size = read_le32(buf + body_end + 4);
  if ((uint32_t)out_len != want_size) {
    error_set(err,
              "'%s': gzip size mismatch: inflated %d bytes, trailer says %u (a damaged file, or "
              "a multi-member gzip, which is not supported)\n%s",
              path, out_len, want_size, hint);
    free(out);
    return NULL;
  }
  uint32_t got_crc = crc32_bytes(out, (size_t)out_len);
  if (got_crc != want_crc) {
    error_set(err, "'%s': gzip CRC mismatch (data 0x%08x, trailer 0x%08x)\n%s", path, got_crc,
              want_crc, hint);
    free(out);
    return NULL;
  }
  *out_size = (size_t)out_len;
  return out;
truncated:
  error_set(err, "'%s': truncated gzip header\n%s", path, hint);
  return NULL;
}

// ---- Fashion-MNIST ----

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
  if (raw_size >= 2 && raw[0] == 0x1F && raw[1] == 0x8B) {
    uint8_t *out = gunzip(raw, raw_size, path, size, err);
    free(raw);
    return out;
  }
  *size = raw_size;
  return raw;
}

static int open_fashion_mnist(Dataset *ds, const Config *cfg, const char *split, Error *err) {
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

// ---- ImageFolder ----

typedef struct {
  char **items;
  int count, cap;
} NameList;

static void names_push(NameList *l, const char *s) {
  if (l->count == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 64;
    char **grown = malloc_check(sizeof(char *) * (size_t)l->cap);
    if (l->count) memcpy(grown, l->items, sizeof(char *) * (size_t)l->count);
    free(l->items);
    l->items = grown;
  }
  size_t len = strlen(s) + 1;
  l->items[l->count] = malloc_check(len);
  memcpy(l->items[l->count++], s, len);
}

static void names_free(NameList *l) {
  for (int i = 0; i < l->count; i++) free(l->items[i]);
  free(l->items);
  *l = (NameList){0};
}

static int compare_names(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static bool is_image_name(const char *name) {
  const char *dot = strrchr(name, '.');
  if (!dot || dot == name) return false;
  return strcasecmp(dot, ".jpg") == 0 || strcasecmp(dot, ".jpeg") == 0 ||
         strcasecmp(dot, ".png") == 0;
}

// Lists dir's subdirectories (want_dirs) or image files, sorted with strcmp; hidden entries
// (starting with '.') are skipped.
static int list_dir(const char *dir, bool want_dirs, NameList *out, Error *err) {
  DIR *d = opendir(dir);
  if (!d) return error_set(err, "cannot list directory '%s': %s", dir, strerror(errno));
  struct dirent *e;
  char path[PATH_BYTES];
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    if (join_path(path, dir, e->d_name, err)) {
      closedir(d);
      return -1;
    }
    // stat rather than d_type: some filesystems report DT_UNKNOWN, and links should count.
    if (want_dirs ? is_dir(path) : (is_image_name(e->d_name) && is_file(path))) {
      names_push(out, e->d_name);
    }
  }
  closedir(d);
  if (out->count > 1) qsort(out->items, (size_t)out->count, sizeof(char *), compare_names);
  return 0;
}

static const char *HINT_IMAGEFOLDER =
    "HINT: an imagefolder dataset is <data.path>/train/<class>/*.{jpg,jpeg,png} and "
    "<data.path>/val/<class>/*.{jpg,jpeg,png}, the same class directory names in both";

// The val split must use the same class names as train, or labels would silently differ.
static int check_classes_match(const char *root, const NameList *val, Error *err) {
  char train_dir[PATH_BYTES];
  if (join_path(train_dir, root, "train", err)) return -1;
  if (!is_dir(train_dir)) {
    return error_set(err,
                     "imagefolder: the val split's labels come from the train split's class "
                     "list, but '%s' does not exist\n%s",
                     train_dir, HINT_IMAGEFOLDER);
  }
  NameList train = {0};
  if (list_dir(train_dir, true, &train, err)) return -1;
  int rc = 0;
  for (int i = 0; i < val->count && rc == 0; i++) {
    if (!bsearch(&val->items[i], train.items, (size_t)train.count, sizeof(char *), compare_names)) {
      rc = error_set(err, "imagefolder '%s': class '%s' is in val/ but not in train/\n%s", root,
                     val->items[i], HINT_IMAGEFOLDER);
    }
  }
  for (int i = 0; i < train.count && rc == 0; i++) {
    if (!bsearch(&train.items[i], val->items, (size_t)val->count, sizeof(char *), compare_names)) {
      rc = error_set(err, "imagefolder '%s': class '%s' is in train/ but not in val/\n%s", root,
                     train.items[i], HINT_IMAGEFOLDER);
    }
  }
  names_free(&train);
  return rc;
}

static int open_imagefolder(Dataset *ds, const Config *cfg, const char *split, Error *err) {
  if (cfg->in_chans < 1 || cfg->in_chans > 4) {
    error_set(err,
              "model.in_chans = %d, but images decode to 1 (gray), 2 (gray+alpha), 3 (RGB) "
              "or 4 (RGBA) channels\nHINT: set model.in_chans=3",
              cfg->in_chans);
    return config_error_where(cfg, err);
  }
  char split_dir[PATH_BYTES];
  if (join_path(split_dir, cfg->path, split, err)) return -1;
  if (!is_dir(split_dir)) {
    return error_set(err, "imagefolder split directory '%s' does not exist\n%s", split_dir,
                     HINT_IMAGEFOLDER);
  }
  NameList classes = {0}, files = {0}, all = {0};
  int rc = -1;
  int *per_class = NULL, *take = NULL;
  if (list_dir(split_dir, true, &classes, err)) goto done;
  if (classes.count == 0) {
    error_set(err, "imagefolder split directory '%s' has no class directories\n%s", split_dir,
              HINT_IMAGEFOLDER);
    goto done;
  }
  if (strcmp(split, "val") == 0 && check_classes_match(cfg->path, &classes, err)) goto done;

  // All files, class by class, each class's files sorted.
  per_class = calloc_check((size_t)classes.count, sizeof(int));
  for (int c = 0; c < classes.count; c++) {
    char class_dir[PATH_BYTES], path[PATH_BYTES];
    if (join_path(class_dir, split_dir, classes.items[c], err)) goto done;
    if (list_dir(class_dir, false, &files, err)) goto done;
    if (files.count == 0) {
      error_set(err,
                "imagefolder class directory '%s' has no .jpg/.jpeg/.png images\n"
                "HINT: every subdirectory of '%s' is a class; add images or remove it",
                class_dir, split_dir);
      goto done;
    }
    for (int f = 0; f < files.count; f++) {
      if (join_path(path, class_dir, files.items[f], err)) goto done;
      names_push(&all, path);
    }
    per_class[c] = files.count;
    names_free(&files);
  }

  // A limit takes files round-robin over the classes (the first file of every class, then the
  // second, ...), so a quick run still sees every class; the kept files stay in sorted order.
  take = calloc_check((size_t)classes.count, sizeof(int));
  int limit = strcmp(split, "train") == 0 ? cfg->train_limit : cfg->val_limit;
  int64_t kept = all.count;
  if (limit > 0 && limit < all.count) {
    kept = 0;
    for (int round = 0; kept < limit; round++) {
      for (int c = 0; c < classes.count && kept < limit; c++) {
        if (round < per_class[c]) {
          take[c]++;
          kept++;
        }
      }
    }
  } else {
    memcpy(take, per_class, sizeof(int) * (size_t)classes.count);
  }
  ds->paths = malloc_check(sizeof(char *) * (size_t)kept);
  ds->class_of = malloc_check(sizeof(int) * (size_t)kept);
  int64_t n = 0, first = 0;
  for (int c = 0; c < classes.count; c++) {
    for (int f = 0; f < per_class[c]; f++) {
      char *path = all.items[first + f];
      all.items[first + f] = NULL;
      if (f < take[c]) {
        ds->paths[n] = path;
        ds->class_of[n++] = c;
      } else {
        free(path);
      }
    }
    first += per_class[c];
  }
  ds->n = n;
  ds->num_classes = classes.count;
  snprintf(ds->describe, sizeof ds->describe, "imagefolder %s (%s): %lld images, %d classes", split,
           split_dir, (long long)ds->n, ds->num_classes);
  rc = 0;
done:
  free(per_class);
  free(take);
  names_free(&classes);
  names_free(&files);
  names_free(&all);
  return rc;
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

// ---- public ----

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

static ResampleChoice resample_choice(const char *name) {
  if (strcmp(name, "bicubic") == 0) return RESAMPLE_BICUBIC;
  if (strcmp(name, "random") == 0) return RESAMPLE_RANDOM;
  return RESAMPLE_BILINEAR;
}

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
  if (cfg->img_h < 1 || cfg->img_w < 1) {
    return error_set(err, "model.img_size %dx%d is not a valid image size", cfg->img_h, cfg->img_w);
  }
  if (!(cfg->scale_min > 0 && cfg->scale_min <= cfg->scale_max) ||
      !(cfg->ratio_min > 0 && cfg->ratio_min <= cfg->ratio_max) ||
      !(cfg->crop_pct > 0 && cfg->crop_pct <= 1)) {
    error_set(err,
              "data augmentation settings out of range: scale [%g, %g], ratio [%g, %g], "
              "crop_pct %g\nHINT: need 0 < data.scale_min <= data.scale_max, "
              "0 < data.ratio_min <= data.ratio_max and 0 < data.crop_pct <= 1",
              cfg->scale_min, cfg->scale_max, cfg->ratio_min, cfg->ratio_max, cfg->crop_pct);
    return config_error_where(cfg, err);
  }
  RandAugmentPolicy randaugment;
  if (randaugment_parse(&randaugment, cfg->randaugment, err) != 0) return -1;
  Dataset *ds = calloc_check(1, sizeof *ds);
  ds->transform = (TransformParams){.out_h = cfg->img_h,
                                    .out_w = cfg->img_w,
                                    .chans = cfg->in_chans,
                                    .scale_min = cfg->scale_min,
                                    .scale_max = cfg->scale_max,
                                    .ratio_min = cfg->ratio_min,
                                    .ratio_max = cfg->ratio_max,
                                    .hflip = cfg->hflip,
                                    .crop_pct = cfg->crop_pct,
                                    .resample = resample_choice(cfg->interpolation),
                                    .randaugment = randaugment,
                                    .color_jitter = cfg->color_jitter};
  // timm's img_mean: min(255, round(255 * mean)) per channel, RandAugment's fill colour.
  for (int c = 0; c < cfg->in_chans && c < 4; c++) {
    double v = nearbyint(255.0 * cfg->mean[cfg->num_mean == 1 ? 0 : c]);
    ds->transform.fill[c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
  }
  int rc;
  if (strcmp(cfg->dataset, "fashion_mnist") == 0) {
    ds->kind = DATASET_FASHION_MNIST;
    rc = open_fashion_mnist(ds, cfg, split, err);
  } else if (strcmp(cfg->dataset, "imagefolder") == 0) {
    ds->kind = DATASET_IMAGEFOLDER;
    rc = open_imagefolder(ds, cfg, split, err);
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
  shards_close(&ds->shards);
  free(ds->known_bad);
  if (ds->bad_lock) {
    pthread_mutex_destroy(ds->bad_lock);
    free(ds->bad_lock);
  }
  free(ds);
}

int64_t dataset_bad_count(const Dataset *ds) {
  if (!ds->bad_lock) return 0;
  pthread_mutex_lock(ds->bad_lock);
  int64_t count = ds->bad_count;
  pthread_mutex_unlock(ds->bad_lock);
  return count;
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

int64_t dataset_sample_bytes(const Dataset *ds) {
  const TransformParams *p = &ds->transform;
  return (int64_t)p->out_h * p->out_w * p->chans;
}

// Copies gray (h*w bytes at the start of img) to every channel, in place, from the back so that
// no gray value is overwritten before it is read.
static void replicate_gray(uint8_t *img, int64_t pixels, int chans) {
  for (int64_t i = pixels - 1; i >= 0; i--) {
    uint8_t g = img[i];
    for (int c = 0; c < chans; c++) img[i * chans + c] = g;
  }
}

// Where sample i's image lives, for messages: its file, or its shard and offset.
static void sample_where(const Dataset *ds, int64_t i, char *buf, size_t size) {
  if (ds->kind == DATASET_SHARDS)
    snprintf(buf, size, "%s, bytes %lld..", ds->shards.paths[ds->shards.shard[i]],
             (long long)ds->shards.offset[i]);
  else
    snprintf(buf, size, "%s", ds->paths[i]);
}

// Adds the time since *t0 to stage s of times (when there are times) and moves *t0 to now.
static void stage_time(LoaderStageTimes *times, LoaderStage s, double *t0) {
  if (!times) return;
  double now = time_now_s();
  times->seconds[s] += now - *t0;
  *t0 = now;
}

// Decodes sample i's file to (h, w, transform.chans) pixels; NULL with why (a buffer of
// why_size) when it cannot be read or decoded, or is too large.
static uint8_t *decode_image(const Dataset *ds, int64_t i, int *h, int *w, char *why,
                             size_t why_size, LoaderStageTimes *times) {
  Error read_err;
  size_t size = 0;
  double t0 = times ? time_now_s() : 0;
  uint8_t *file = ds->kind == DATASET_SHARDS ? shards_read(&ds->shards, i, &size, &read_err)
                                             : read_file(ds->paths[i], &size, &read_err);
  stage_time(times, LOADER_READ, &t0);
  if (!file) {
    snprintf(why, why_size, "%.*s", (int)why_size - 1, read_err.msg);
    return NULL;
  }
  uint8_t *img = image_decode(file, size, ds->transform.chans, h, w, why, why_size);
  free(file);
  stage_time(times, LOADER_DECODE, &t0);
  return img;
}

static bool is_known_bad(const Dataset *ds, int64_t i) {
  pthread_mutex_lock(ds->bad_lock);
  bool bad = ds->known_bad[i];
  pthread_mutex_unlock(ds->bad_lock);
  return bad;
}

// Flags sample i as bad; the first time, names it in the log (stderr) with the running count.
static void note_bad(const Dataset *ds, int64_t i, const char *why) {
  Dataset *mutable = (Dataset *)ds;  // the flags are a cache of facts about the files
  pthread_mutex_lock(ds->bad_lock);
  if (!ds->known_bad[i]) {
    mutable->known_bad[i] = 1;
    mutable->bad_count++;
    char where[PATH_BYTES + 64];
    sample_where(ds, i, where, sizeof where);
    fprintf(stderr,
            "warning: data.skip_bad: skipping '%s' (sample %lld), which does not decode: %s "
            "(bad images so far: %lld)\n",
            where, (long long)i, why, (long long)ds->bad_count);
  }
  pthread_mutex_unlock(ds->bad_lock);
}

// Decodes sample i. Without skip_bad a failure is an error naming the file; with it, a bad
// sample is replaced by the next one in split order (i+1, i+2, ..., wrapping) that decodes, so
// the replacement depends only on the files, never on threads or timing. *source gets the
// sample used.
static int load_image_or_next(const Dataset *ds, int64_t i, int64_t *source, uint8_t **img, int *h,
                              int *w, LoaderStageTimes *times, Error *err) {
  char why[512] = "each was found not to decode before";
  for (int64_t tries = 0, j = i; tries < ds->n; tries++, j = (j + 1) % ds->n) {
    if (ds->skip_bad && is_known_bad(ds, j)) continue;
    *img = decode_image(ds, j, h, w, why, sizeof why, times);
    if (*img) {
      *source = j;
      return 0;
    }
    if (!ds->skip_bad) {
      char where[PATH_BYTES + 64];
      sample_where(ds, j, where, sizeof where);
      return error_set(err,
                       "cannot decode image '%s' (sample %lld of %s): %s\n"
                       "HINT: the file is corrupt or not a JPEG/PNG; remove or replace it, or "
                       "set data.skip_bad=true to skip such files",
                       where, (long long)j, ds->describe, why);
    }
    note_bad(ds, j, why);
  }
  return error_set(err,
                   "data.skip_bad: no image of %s decodes (last reason: %s)\n"
                   "HINT: check data.path and the files",
                   ds->describe, why);
}

// A file image's transform in its three steps: the plan, drawn from rng (keyed by the sample
// asked for, so a replaced sample is as deterministic as any); the plan run on the decoded image
// (h, w, chans); the colour part, with the draws that follow the plan's, and the label of sample
// source. The loader's nvJPEG path runs them apart: the draws here (dataset_plan_sample,
// dataset_plan_colour), the plan and the colour steps on the GPU.
static TransformPlan plan_image(const Dataset *ds, int h, int w, bool train, Rng *rng) {
  return train ? transform_plan_train(&ds->transform, h, w, rng)
               : transform_plan_eval(&ds->transform, h, w);
}

static void finish_image(const Dataset *ds, int64_t source, bool train, Rng *rng, uint8_t *pixels,
                         int *label) {
  if (train) transform_train_color(&ds->transform, pixels, ds->transform.chans, rng);
  *label = ds->kind == DATASET_SHARDS ? ds->shards.label[source] : ds->class_of[source];
}

const char *const loader_stage_names[LOADER_STAGES] = {"read",      "parse",  "decode",
                                                       "geometric", "colour", "upload"};

static void transform_image(const Dataset *ds, int64_t source, const uint8_t *img, int h, int w,
                            bool train, Rng *rng, uint8_t *pixels, int *label,
                            LoaderStageTimes *times) {
  double t0 = times ? time_now_s() : 0;
  TransformPlan plan = plan_image(ds, h, w, train, rng);
  transform_apply(&plan, img, ds->transform.chans, pixels);
  stage_time(times, LOADER_GEOMETRIC, &t0);
  finish_image(ds, source, train, rng, pixels, label);
  stage_time(times, LOADER_COLOUR, &t0);
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
    // Transform the single gray channel, then replicate: 3x less resampling work.
    // RandAugment's fill is per channel, so colour ops run after the expansion.
    TransformParams gray = ds->transform;
    gray.chans = 1;
    const uint8_t *src = ds->images + i * ds->src_h * ds->src_w;
    if (train)
      transform_train(&gray, src, ds->src_h, ds->src_w, &rng, pixels);
    else
      transform_eval(&gray, src, ds->src_h, ds->src_w, pixels);
    if (ds->transform.chans > 1) {
      replicate_gray(pixels, (int64_t)gray.out_h * gray.out_w, ds->transform.chans);
    }
    if (train) transform_train_color(&ds->transform, pixels, ds->transform.chans, &rng);
    *label = ds->labels[i];
    return 0;
  }
  int64_t source = i;  // the sample whose image is used: i, or its replacement under skip_bad
  int w = 0, h = 0;
  uint8_t *img = NULL;
  if (load_image_or_next(ds, i, &source, &img, &h, &w, times, err) != 0) return -1;
  transform_image(ds, source, img, h, w, train, &rng, pixels, label, times);
  if (times) times->images++;
  image_free(img);
  return 0;
}

bool dataset_has_files(const Dataset *ds) {
  return ds->kind == DATASET_IMAGEFOLDER || ds->kind == DATASET_SHARDS;
}

int dataset_channels(const Dataset *ds) {
  return ds->transform.chans;
}

uint8_t *dataset_sample_file(const Dataset *ds, int64_t i, size_t *size) {
  *size = 0;
  if (i < 0 || i >= ds->n || !dataset_has_files(ds)) return NULL;
  if (ds->skip_bad && is_known_bad(ds, i)) return NULL;
  Error read_err;
  return ds->kind == DATASET_SHARDS ? shards_read(&ds->shards, i, size, &read_err)
                                    : read_file(ds->paths[i], size, &read_err);
}

// Sample i with its own file decoded: the checks of the loader's decoded paths.
static int check_decoded(const Dataset *ds, int64_t i, Error *err) {
  if (i < 0 || i >= ds->n || !dataset_has_files(ds))
    return error_set(err, "%s: sample %lld has no image file to have been decoded", ds->describe,
                     (long long)i);
  return 0;
}

int dataset_load_decoded_sample(const Dataset *ds, int64_t i, bool train, uint64_t seed,
                                int64_t epoch, const uint8_t *img, int h, int w, uint8_t *pixels,
                                int *label, Error *err) {
  if (check_decoded(ds, i, err) != 0) return -1;
  Rng rng = rng_make(seed, RNG_STREAM_AUGMENT, (uint64_t)epoch, (uint64_t)i);
  transform_image(ds, i, img, h, w, train, &rng, pixels, label, NULL);
  return 0;
}

int dataset_plan_sample(const Dataset *ds, int64_t i, bool train, uint64_t seed, int64_t epoch,
                        int h, int w, TransformPlan *plan, Rng *rng, Error *err) {
  if (check_decoded(ds, i, err) != 0) return -1;
  *rng = rng_make(seed, RNG_STREAM_AUGMENT, (uint64_t)epoch, (uint64_t)i);
  *plan = plan_image(ds, h, w, train, rng);
  return 0;
}

int dataset_plan_colour(const Dataset *ds, int64_t i, bool train, Rng *rng, ImageAugStep *steps,
                        int max_steps, int *nsteps, int *label, Error *err) {
  if (check_decoded(ds, i, err) != 0) return -1;
  *nsteps = train ? transform_color_draw(&ds->transform, rng, steps, max_steps) : 0;
  *label = ds->kind == DATASET_SHARDS ? ds->shards.label[i] : ds->class_of[i];
  return 0;
}

ImageAugFill dataset_colour_fill(const Dataset *ds) {
  ImageAugFill fill = {{0}};
  memcpy(fill.v, ds->transform.fill, sizeof ds->transform.fill);
  return fill;
}
