// test_shards.c: data.dataset = shards (data/shards.h): tar files written here (ustar headers,
// a GNU long name, a directory prefix, an extra member a sample may carry), their index and
// decoding, the per-rank stream order (a permutation of the rank's own shards, deterministic
// per (seed, epoch), another order each epoch, the shuffle buffer), the loader on them (ranks
// disjoint, output independent of the worker count) and the errors for broken shards.
#define _POSIX_C_SOURCE 200809L
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/dataset.h"
#include "data/loader.h"
#include "data/shards.h"
#include "src/base/config.h"
#include "tests/util/test_util.h"

#define STB_IMAGE_WRITE_IMPLEMENTATION
#include "stb_image_write.h"

enum { IMG_H = 5, IMG_W = 6 };

static char root[256];

static void write_png_cb(void *ctx, void *data, int size) {
  FILE *f = ctx;
  fwrite(data, 1, (size_t)size, f);
}

// A PNG whose first two bytes carry id (lossless, so decoding gives the id back).
static unsigned char *png_bytes(int id, size_t *size) {
  unsigned char px[IMG_H * IMG_W * 3];
  for (int i = 0; i < IMG_H * IMG_W * 3; i++) px[i] = (unsigned char)(i * 7 + id);
  px[0] = (unsigned char)(id & 255);
  px[1] = (unsigned char)(id >> 8);
  char *buf = NULL;
  FILE *mem = open_memstream(&buf, size);
  stbi_write_png_to_func(write_png_cb, mem, IMG_W, IMG_H, 3, px, IMG_W * 3);
  fclose(mem);
  return (unsigned char *)buf;
}

// Writes dir/name.tar with samples first..first+count-1 (label id % 4). Shard 1 names its keys
// with a directory prefix, shard 2 gives one sample a GNU long name, every sample of shard 3
// carries an extra .json member.
static void write_shard(const char *dir, int index, int first, int count) {
  char path[512];
  snprintf(path, sizeof path, "%s/shard-%03d.tar", dir, index);
  FILE *f = fopen(path, "wb");
  if (!f) exit(2);
  for (int id = first; id < first + count; id++) {
    char key[300], name[320], cls[16];
    if (index == 1)
      snprintf(key, sizeof key, "part/%06d", id);
    else if (index == 2 && id == first + 1)
      snprintf(key, sizeof key, "%0150d", id);  // longer than a header's 100-byte name
    else
      snprintf(key, sizeof key, "%06d", id);
    size_t size;
    unsigned char *png = png_bytes(id, &size);
    snprintf(name, sizeof name, "%s.png", key);
    if (strlen(name) >= 100) test_tar_member(f, "././@LongLink", 'L', name, strlen(name) + 1);
    test_tar_member(f, name, '0', png, size);
    free(png);
    snprintf(name, sizeof name, "%s.cls", key);
    if (strlen(name) >= 100) test_tar_member(f, "././@LongLink", 'L', name, strlen(name) + 1);
    snprintf(cls, sizeof cls, "%d\n", id % 4);
    test_tar_member(f, name, '0', cls, strlen(cls));
    if (index == 3) {
      snprintf(name, sizeof name, "%s.json", key);
      test_tar_member(f, name, '0', "{}", 2);
    }
  }
  static const unsigned char end[1024];
  fwrite(end, 1, sizeof end, f);
  fclose(f);
}

static Config shard_config(const char *path) {
  Config c;
  config_defaults(&c);
  snprintf(c.dataset, sizeof c.dataset, "shards");
  snprintf(c.path, sizeof c.path, "%s", path);
  c.img_h = IMG_H;
  c.img_w = IMG_W;
  c.in_chans = 3;
  c.crop_pct = 1;
  c.scale_min = c.scale_max = 1;
  c.ratio_min = c.ratio_max = (float)IMG_W / IMG_H;
  c.hflip = 0;
  c.shuffle_buffer = 4;
  return c;
}

static int decoded_id(const uint8_t *px) {
  return px[0] | px[1] << 8;
}

static int compare_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

// Shards 0..4 hold samples [0,7) [7,14) [14,21) [21,28) [28,33).
static const int shard_first[5] = {0, 7, 14, 21, 28}, shard_count[5] = {7, 7, 7, 7, 5};

static void test_index(Dataset *ds) {
  test_check(dataset_size(ds) == 33 && dataset_num_classes(ds) == 4 && dataset_is_stream(ds),
             "shards: %s", dataset_describe(ds));
  uint8_t px[IMG_H * IMG_W * 3];
  int label, bad = 0;
  Error err;
  for (int i = 0; i < 33; i++) {
    memset(px, 0xA5, sizeof px);
    if (dataset_load_sample(ds, i, false, 1, 0, px, &label, &err) != 0) {
      printf("     %s\n", err.msg);
      bad++;
      continue;
    }
    bad += decoded_id(px) != i || label != i % 4;
  }
  test_check(bad == 0,
             "shards: all 33 samples decode in shard order with their .cls labels "
             "(prefix, long name, extra member): %d wrong",
             bad);
}

static void test_stream_order(Dataset *ds) {
  int64_t a[64], b[64], c[64];
  for (int rank = 0; rank < 2; rank++) {
    int64_t n = dataset_stream_samples(ds, rank, 2);
    dataset_stream_order(ds, 7, 3, rank, 2, a);
    dataset_stream_order(ds, 7, 3, rank, 2, b);
    dataset_stream_order(ds, 7, 4, rank, 2, c);
    memcpy(b + 32, a, sizeof(int64_t) * (size_t)n);
    qsort(b + 32, (size_t)n, sizeof(int64_t), compare_i64);
    // Rank r owns shards r, r + 2, ...: its sorted order is exactly their samples.
    int64_t k = 0;
    bool perm = true;
    for (int s = rank; s < 5; s += 2)
      for (int i = 0; i < shard_count[s]; i++) perm &= b[32 + k++] == shard_first[s] + i;
    dataset_stream_order(ds, 7, 3, rank, 2, b);
    bool same = memcmp(a, b, sizeof(int64_t) * (size_t)n) == 0;
    bool other_epoch = memcmp(a, c, sizeof(int64_t) * (size_t)n) != 0;
    test_check(n == (rank == 0 ? 19 : 14) && k == n && perm && same && other_epoch,
               "stream order rank %d of 2: a permutation of its %lld samples (shards %s), "
               "deterministic, another one next epoch",
               rank, (long long)n, rank == 0 ? "0,2,4" : "1,3");
  }
}

// Buffer 1: no shuffle inside shards, so the order is whole shards in a shuffled order.
static void test_buffer_one(const char *dir) {
  ShardSet s;
  Error err;
  if (shards_open(&s, dir, &err) != 0) {
    test_check(0, "shards_open: %s", err.msg);
    return;
  }
  int64_t order[64];
  shards_epoch_order(&s, 1, 0, 0, 1, 1, order);
  bool runs = true;
  for (int64_t i = 0; i < 33;) {
    int shard = s.shard[order[i]];
    for (int64_t j = 0; j < s.count[shard]; j++, i++) runs &= order[i] == s.first[shard] + j;
  }
  test_check(runs, "stream order with a buffer of 1 reads whole shards sequentially");
  shards_close(&s);
}

typedef struct {
  int ids[64];
  int count;
} Seen;

static void run_loader(Dataset *ds, int rank, int world, int workers, Seen *seen) {
  LoaderOptions o = {.batch_size = 3,
                     .train = true,
                     .seed = 5,
                     .workers = workers,
                     .prefetch = 2,
                     .rank = rank,
                     .world = world};
  Loader *L;
  Error err;
  seen->count = 0;
  if (loader_create(&L, ds, &o, &err) != 0) {
    test_check(0, "loader_create: %s", err.msg);
    return;
  }
  int64_t per_epoch = loader_batches_per_epoch(L);
  for (int64_t k = 0; k < per_epoch; k++) {
    Batch *b;
    if (loader_next(L, &b, &err) != 0 || !b) break;
    for (int j = 0; j < b->count; j++)
      seen->ids[seen->count++] = decoded_id(b->pixels + (size_t)j * IMG_H * IMG_W * 3);
    loader_release_batch(L, b);
  }
  loader_destroy(L);
}

static void test_loader_on_shards(Dataset *ds) {
  Seen r0, r1, r0_three;
  run_loader(ds, 0, 2, 1, &r0);
  run_loader(ds, 1, 2, 2, &r1);
  run_loader(ds, 0, 2, 3, &r0_three);
  // min(19, 14) / 3 = 4 batches per rank.
  bool disjoint = true;
  for (int i = 0; i < r0.count; i++)
    for (int j = 0; j < r1.count; j++) disjoint &= r0.ids[i] != r1.ids[j];
  bool owned = true;
  for (int i = 0; i < r0.count; i++)
    owned &= (r0.ids[i] < 7 || (r0.ids[i] >= 14 && r0.ids[i] < 21) || r0.ids[i] >= 28);
  test_check(r0.count == 12 && r1.count == 12 && disjoint && owned,
             "loader on shards: 4 batches of 3 per rank, ranks disjoint, rank 0 reads only "
             "its shards");
  test_check(r0_three.count == r0.count &&
                 memcmp(r0.ids, r0_three.ids, sizeof(int) * (size_t)r0.count) == 0,
             "loader on shards: 1 and 3 workers give the same batches");
}

static void expect_open_error(const char *what, const char *path, const char *needle) {
  Config c = shard_config(path);
  Dataset *ds = NULL;
  Error err = {{0}};
  int rc = dataset_open(&ds, &c, "train", &err);
  test_check(rc != 0 && strstr(err.msg, needle) && strstr(err.msg, "HINT"), "%s: error names '%s'",
             what, needle);
  if (rc != 0 && !strstr(err.msg, needle)) printf("     got: %s\n", err.msg);
  dataset_close(ds);
}

static void test_errors(void) {
  char dir[512], path[600];
  snprintf(dir, sizeof dir, "%s/bad", root);
  mkdir(dir, 0755);
  snprintf(path, sizeof path, "%s/train", dir);
  mkdir(path, 0755);
  expect_open_error("a split without tar files", dir, "has no .tar files");

  snprintf(path, sizeof path, "%s/train/a.tar", dir);
  FILE *f = fopen(path, "wb");
  size_t size;
  unsigned char *png = png_bytes(1, &size);
  test_tar_member(f, "000001.png", '0', png, size);
  fclose(f);
  expect_open_error("an image without .cls", dir, "has an image but no .cls");

  f = fopen(path, "wb");
  test_tar_member(f, "000001.png", '0', png, size);
  test_tar_member(f, "000001.cls", '0', "cat", 3);
  fclose(f);
  expect_open_error("a .cls that is not a number", dir, "not a class index");

  f = fopen(path, "wb");
  test_tar_member(f, "000001.png", '0', png, size);
  fclose(f);
  // Flip a byte of the header's name: its checksum no longer matches.
  f = fopen(path, "r+b");
  fputc('X', f);
  fclose(f);
  expect_open_error("a corrupt tar header", dir, "corrupt tar header at byte 0");
  free(png);
}

int main(void) {
  snprintf(root, sizeof root, "/tmp/swin_test_shards_XXXXXX");
  if (!mkdtemp(root)) return 2;
  char train[300], val[300];
  snprintf(train, sizeof train, "%s/train", root);
  snprintf(val, sizeof val, "%s/val", root);
  mkdir(train, 0755);
  mkdir(val, 0755);
  for (int s = 0; s < 5; s++) write_shard(train, s, shard_first[s], shard_count[s]);
  write_shard(val, 0, 100, 6);

  Config c = shard_config(root);
  Dataset *ds = NULL;
  Error err;
  if (!test_check(dataset_open(&ds, &c, "train", &err) == 0, "shards: the train split opens")) {
    printf("     %s\n", err.msg);
    return test_finish();
  }
  test_index(ds);
  test_stream_order(ds);
  test_buffer_one(train);
  test_loader_on_shards(ds);
  dataset_close(ds);
  Dataset *v = NULL;
  test_check(dataset_open(&v, &c, "val", &err) == 0 && dataset_size(v) == 6,
             "shards: the val split opens (6 samples)");
  dataset_close(v);
  test_errors();

  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  if (system(cmd) != 0) printf("note: could not remove %s\n", root);
  return test_finish();
}
