// test_data.c: the data pipeline: IDX and gzip reading (real Fashion-MNIST when installed, and
// files written here), ImageFolder decoding and its errors, the transforms, and the threaded
// loader's determinism, resume, eval pass, error path and shutdown. Ends with a throughput
// measurement of Fashion-MNIST training batches.
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>  // mallopt(M_PERTURB): test_png_forbidden_distance
#endif

#include "data/dataset.h"
#include "data/image.h"
#include "data/jpeg_gpu.h"
#include "data/loader.h"
#include "data/transform.h"
#include "src/base/rng.h"
#include "src/base/util.h"
#include "tests/util/test_util.h"

#define STB_IMAGE_WRITE_IMPLEMENTATION
#include "stb_image_write.h"

#define FASHION_DIR "/usr/share/datasets/fashion-mnist"

static char tmp_root[256];  // this run's scratch directory

// ---- helpers ----

static Config make_config(const char *dataset, const char *path, int h, int w, int chans) {
  Config c;
  memset(&c, 0, sizeof c);
  snprintf(c.dataset, sizeof c.dataset, "%s", dataset);
  snprintf(c.path, sizeof c.path, "%s", path);
  c.img_h = h;
  c.img_w = w;
  c.in_chans = chans;
  c.scale_min = 0.08f;
  c.scale_max = 1.0f;
  c.ratio_min = 3.0f / 4.0f;
  c.ratio_max = 4.0f / 3.0f;
  c.hflip = 0.5f;
  c.crop_pct = 1.0f;
  return c;
}

static void make_dir(const char *fmt, const char *a, const char *b) {
  char path[1024];
  snprintf(path, sizeof path, fmt, a, b);
  if (mkdir(path, 0755) != 0) {
    fprintf(stderr, "cannot create test directory %s\n", path);
    exit(2);
  }
}

static void put_be32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24);
  p[1] = (uint8_t)(v >> 16);
  p[2] = (uint8_t)(v >> 8);
  p[3] = (uint8_t)v;
}

static void put_le32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

// Bit-at-a-time CRC-32, written independently of data/gzip.c's table version.
static uint32_t crc32_ref(const uint8_t *p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; i++) {
    c ^= p[i];
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1)));
  }
  return ~c;
}

// IDX image file bytes: magic 0x803, n, h, w (big-endian), then the pixels (n, h, w).
static uint8_t *idx_images(const uint8_t *pixels, int n, int h, int w, size_t *size) {
  *size = 16 + (size_t)n * h * w;
  uint8_t *b = malloc_check(*size);
  put_be32(b, 0x803);
  put_be32(b + 4, (uint32_t)n);
  put_be32(b + 8, (uint32_t)h);
  put_be32(b + 12, (uint32_t)w);
  memcpy(b + 16, pixels, (size_t)n * h * w);
  return b;
}

static uint8_t *idx_labels(const uint8_t *labels, int n, size_t *size) {
  *size = 8 + (size_t)n;
  uint8_t *b = malloc_check(*size);
  put_be32(b, 0x801);
  put_be32(b + 4, (uint32_t)n);
  memcpy(b + 8, labels, (size_t)n);
  return b;
}

// A gzip member with every optional header field (FEXTRA, FNAME, FCOMMENT, FHCRC) and the data
// in stored (uncompressed) deflate blocks of at most 1000 bytes, so a reader must skip the
// fields and walk several blocks.
static uint8_t *gzip_stored(const uint8_t *data, size_t n, size_t *size) {
  uint8_t *g = malloc_check(64 + n + (n / 1000 + 1) * 5);
  const uint8_t head[10] = {0x1F, 0x8B, 8, 2 | 4 | 8 | 16, 0x12, 0x34, 0x56, 0x78, 0, 3};
  memcpy(g, head, 10);
  size_t p = 10;
  g[p++] = 3;  // XLEN = 3
  g[p++] = 0;
  g[p++] = 'A';
  g[p++] = 'B';
  g[p++] = 0;  // extra bytes may be zero: they must not be read as a terminator
  memcpy(g + p, "name.idx", 9);
  p += 9;
  memcpy(g + p, "a comment", 10);
  p += 10;
  uint32_t hcrc = crc32_ref(g, p) & 0xFFFF;
  g[p++] = (uint8_t)hcrc;
  g[p++] = (uint8_t)(hcrc >> 8);
  size_t done = 0;
  do {
    size_t len = n - done < 1000 ? n - done : 1000;
    g[p++] = done + len == n ? 1 : 0;  // BFINAL, BTYPE 00 (stored), then byte-aligned
    g[p++] = (uint8_t)len;
    g[p++] = (uint8_t)(len >> 8);
    g[p++] = (uint8_t)~len;
    g[p++] = (uint8_t)(~len >> 8);
    memcpy(g + p, data + done, len);
    p += len;
    done += len;
  } while (done < n);
  put_le32(g + p, crc32_ref(data, n));
  put_le32(g + p + 4, (uint32_t)n);
  *size = p + 8;
  return g;
}

// Writes an IDX pair as dir/<prefix>-{images-idx3,labels-idx1}-ubyte (gz: stored gzip + ".gz").
static void write_idx_pair(const char *dir, const char *prefix, const uint8_t *pixels,
                           const uint8_t *labels, int n, int h, int w, bool gz) {
  char path[1024];
  size_t is, ls;
  uint8_t *img = idx_images(pixels, n, h, w, &is), *lab = idx_labels(labels, n, &ls);
  if (gz) {
    size_t gs;
    uint8_t *g = gzip_stored(img, is, &gs);
    snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte.gz", dir, prefix);
    test_write_file(path, g, gs);
    free(g);
    g = gzip_stored(lab, ls, &gs);
    snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte.gz", dir, prefix);
    test_write_file(path, g, gs);
    free(g);
  } else {
    snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte", dir, prefix);
    test_write_file(path, img, is);
    snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte", dir, prefix);
    test_write_file(path, lab, ls);
  }
  free(img);
  free(lab);
}

static void fill_random(TestRng *r, uint8_t *p, size_t n, int lo, int hi) {
  for (size_t i = 0; i < n; i++)
    p[i] = (uint8_t)(lo + (int)(test_rng_u64(r) % (uint64_t)(hi - lo + 1)));
}

// Loads sample i with the eval transform into a poisoned buffer; returns the first differing
// byte against want (n bytes), or -1 when identical. -2 when the load failed.
static int64_t load_and_compare(const Dataset *ds, int64_t i, const uint8_t *want, size_t n,
                                int *label) {
  uint8_t *got = malloc_check(n);
  memset(got, 0xA5, n);  // poison: an unwritten byte almost surely differs from want
  Error err = {{0}};
  int64_t diff = -1;
  if (dataset_load_sample(ds, i, false, 1, 0, got, label, &err)) {
    printf("     load failed: %s\n", err.msg);
    diff = -2;
  } else {
    for (size_t k = 0; k < n && diff < 0; k++)
      if (got[k] != want[k]) diff = (int64_t)k;
  }
  free(got);
  return diff;
}

// Expects rc == -1 and a message containing needle1 and, unless NULL, needle2.
static void check_error(int rc, const Error *err, const char *what, const char *needle1,
                        const char *needle2) {
  bool ok = rc == -1 && strstr(err->msg, needle1) && (!needle2 || strstr(err->msg, needle2));
  test_check(ok, "%s: error names '%s'%s%s", what, needle1, needle2 ? " and " : "",
             needle2 ? needle2 : "");
  if (!ok) printf("     rc %d, message: %s\n", rc, err->msg);
}

// ---- Fashion-MNIST (real files, when installed) ----

static void test_fashion_mnist(void) {
  struct stat st;
  if (stat(FASHION_DIR, &st) != 0) {
    printf("SKIP Fashion-MNIST checks: %s not found (apt-get install dataset-fashion-mnist)\n",
           FASHION_DIR);
    return;
  }
  Error err = {{0}};
  Config cfg = make_config("fashion_mnist", FASHION_DIR, 28, 28, 1);
  Dataset *train = NULL, *val = NULL;
  double t0 = time_now_s();
  int rc = dataset_open(&train, &cfg, "train", &err);
  double t_open = time_now_s() - t0;
  if (!test_check(rc == 0, "fashion-mnist: open train (%.2f s to inflate 26 MB)", t_open)) {
    printf("     %s\n", err.msg);
    return;
  }
  rc = dataset_open(&val, &cfg, "val", &err);
  if (!test_check(rc == 0, "fashion-mnist: open val")) {
    printf("     %s\n", err.msg);
    dataset_close(train);
    return;
  }
  test_check(dataset_size(train) == 60000 && dataset_size(val) == 10000,
             "fashion-mnist: sizes %lld / %lld (want 60000 / 10000)",
             (long long)dataset_size(train), (long long)dataset_size(val));
  test_check(dataset_num_classes(train) == 10, "fashion-mnist: 10 classes (got %d)",
             dataset_num_classes(train));
  test_check(strcmp(dataset_describe(train), "fashion-mnist train: 60000 images, 10 classes") == 0,
             "fashion-mnist: describe '%s'", dataset_describe(train));

  // Reference values read with Python's gzip module, independently of this code:
  //   d = gzip.open('train-images-idx3-ubyte.gz').read(); sum(d[16:16 + 784])  -> 76247
  //   l = gzip.open('train-labels-idx1-ubyte.gz').read(); list(l[8:18])
  //   -> [9, 0, 0, 3, 0, 2, 7, 2, 5, 5]; 6000 samples of each class
  //   t10k: sum of the first image 33456, first label 9
  // With img 28x28 and crop_pct 1 the eval transform is the identity, so sums are exact.
  uint8_t img[28 * 28 * 3];
  int label = -1, counts[10] = {0}, bad_label = 0;
  const int want_first[10] = {9, 0, 0, 3, 0, 2, 7, 2, 5, 5};
  int first_ok = 1;
  for (int64_t i = 0; i < 60000; i++) {
    if (dataset_load_sample(train, i, false, 0, 0, img, &label, &err)) {
      test_check(0, "fashion-mnist: load sample %lld: %s", (long long)i, err.msg);
      break;
    }
    if (label < 0 || label > 9)
      bad_label++;
    else
      counts[label]++;
    if (i < 10 && label != want_first[i]) first_ok = 0;
    if (i == 0) {
      long sum = 0;
      for (int k = 0; k < 784; k++) sum += img[k];
      test_check(sum == 76247, "fashion-mnist: train image 0 pixel sum %ld (python: 76247)", sum);
    }
  }
  test_check(bad_label == 0, "fashion-mnist: every train label in [0, 10) (%d outside)", bad_label);
  test_check(first_ok, "fashion-mnist: first 10 train labels match python's");
  int balanced = 1;
  for (int c = 0; c < 10; c++) balanced &= counts[c] == 6000;
  test_check(balanced, "fashion-mnist: 6000 train samples per class");
  if (dataset_load_sample(val, 0, false, 0, 0, img, &label, &err) == 0) {
    long sum = 0;
    for (int k = 0; k < 784; k++) sum += img[k];
    test_check(sum == 33456 && label == 9,
               "fashion-mnist: val image 0 sum %ld label %d (python: "
               "33456, 9)",
               sum, label);
  }
  dataset_close(train);
  dataset_close(val);

  // in_chans 3 replicates the gray channel; train_limit keeps the first N in file order.
  cfg = make_config("fashion_mnist", FASHION_DIR, 28, 28, 3);
  cfg.val_limit = 100;
  rc = dataset_open(&val, &cfg, "val", &err);
  if (test_check(rc == 0 && dataset_size(val) == 100, "fashion-mnist: val_limit 100 -> %lld",
                 rc == 0 ? (long long)dataset_size(val) : -1LL)) {
    memset(img, 0xA5, sizeof img);
    dataset_load_sample(val, 0, false, 0, 0, img, &label, &err);
    long sum = 0;
    int same = 1;
    for (int k = 0; k < 784; k++) {
      sum += img[3 * k];
      same &= img[3 * k] == img[3 * k + 1] && img[3 * k] == img[3 * k + 2];
    }
    test_check(same && sum == 33456, "fashion-mnist: in_chans 3 replicates gray (sum %ld)", sum);
  } else {
    printf("     %s\n", err.msg);
  }
  dataset_close(val);
}

// ---- IDX and gzip files written here ----

static void test_idx_files(TestRng *r) {
  enum { N = 7, H = 5, W = 6 };
  uint8_t pixels[N * H * W], labels[N];
  fill_random(r, pixels, sizeof pixels, 0, 255);
  fill_random(r, labels, sizeof labels, 0, 9);
  const char *kinds[3] = {"plain", "stored-gzip", "gzip-cmd"};
  for (int kind = 0; kind < 3; kind++) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/idx_%s", tmp_root, kinds[kind]);
    make_dir("%s%s", dir, "");
    write_idx_pair(dir, "train", pixels, labels, N, H, W, kind == 1);
    if (kind == 2) {
      // Real deflate (Huffman blocks) from the system's gzip, when it exists.
      char cmd[1200];
      snprintf(cmd, sizeof cmd,
               "gzip -9 '%s/train-images-idx3-ubyte' '%s/train-labels-idx1-ubyte' "
               "2>/dev/null",
               dir, dir);
      if (system(cmd) != 0) {
        printf("SKIP gzip-cmd IDX check: no working gzip command\n");
        continue;
      }
    }
    Config cfg = make_config("fashion_mnist", dir, H, W, 1);
    Dataset *ds = NULL;
    Error err = {{0}};
    if (!test_check(dataset_open(&ds, &cfg, "train", &err) == 0, "idx %s: open", kinds[kind])) {
      printf("     %s\n", err.msg);
      continue;
    }
    int64_t first_diff = -1;
    int labels_ok = 1;
    for (int i = 0; i < N && first_diff == -1; i++) {
      int label = -1;
      first_diff = load_and_compare(ds, i, pixels + i * H * W, H * W, &label);
      labels_ok &= label == labels[i];
    }
    test_check(dataset_size(ds) == N && first_diff == -1 && labels_ok,
               "idx %s: %d images read back exactly (first diff %lld), labels %s", kinds[kind], N,
               (long long)first_diff, labels_ok ? "ok" : "WRONG");
    dataset_close(ds);
  }

  // Damaged files: each error must name the file.
  size_t is, ls, gs;
  uint8_t *img = idx_images(pixels, N, H, W, &is), *lab = idx_labels(labels, N, &ls);
  uint8_t *gz = gzip_stored(img, is, &gs);
  struct {
    const char *name, *needle;
  } cases[] = {{"bad-crc", "CRC"},
               {"truncated", "gzip"},
               {"bad-magic", "magic"},
               {"short-idx", "needs"},
               {"count-mismatch", "labels"}};
  for (int c = 0; c < 5; c++) {
    char dir[512], path[1024];
    snprintf(dir, sizeof dir, "%s/idx_%s", tmp_root, cases[c].name);
    make_dir("%s%s", dir, "");
    snprintf(path, sizeof path, "%s/train-labels-idx1-ubyte", dir);
    test_write_file(path, lab, ls);
    snprintf(path, sizeof path, "%s/train-images-idx3-ubyte%s", dir, c < 2 ? ".gz" : "");
    uint8_t *copy = malloc_check(gs > is ? gs : is);
    if (c == 0) {  // one flipped bit in the stored data: inflates fine, the CRC catches it
      memcpy(copy, gz, gs);
      copy[gs - 20] ^= 0x10;
      test_write_file(path, copy, gs);
    } else if (c == 1) {  // cut in the middle of the deflate stream
      test_write_file(path, gz, gs / 2);
    } else if (c == 2) {
      memcpy(copy, img, is);
      copy[3] = 0x04;
      test_write_file(path, copy, is);
    } else if (c == 3) {
      test_write_file(path, img, is - 1);
    } else {  // 7 images but 6 labels
      test_write_file(path, img, is);
      uint8_t *lab6 = idx_labels(labels, N - 1, &ls);
      snprintf(path, sizeof path, "%s/train-labels-idx1-ubyte", dir);
      test_write_file(path, lab6, ls);
      free(lab6);
      snprintf(path, sizeof path, "%s/train-images-idx3-ubyte", dir);
    }
    free(copy);
    Config cfg = make_config("fashion_mnist", dir, H, W, 1);
    Dataset *ds = NULL;
    Error err = {{0}};
    char what[64];
    snprintf(what, sizeof what, "idx %s", cases[c].name);
    check_error(dataset_open(&ds, &cfg, "train", &err), &err, what, path, cases[c].needle);
    dataset_close(ds);
  }
  free(img);
  free(lab);
  free(gz);

  // A directory without the files: the message names what is missing and hints at the package.
  Config cfg = make_config("fashion_mnist", tmp_root, H, W, 1);
  Dataset *ds = NULL;
  Error err = {{0}};
  check_error(dataset_open(&ds, &cfg, "val", &err), &err, "idx missing files",
              "t10k-images-idx3-ubyte", "HINT");
}

// ---- ImageFolder ----

typedef struct {
  int h, w, chans;
  uint8_t *pixels;
} TestImage;

static TestImage write_png(const char *path, TestRng *r, int h, int w, int chans) {
  TestImage t = {h, w, chans, malloc_check((size_t)h * w * chans)};
  fill_random(r, t.pixels, (size_t)h * w * chans, 0, 255);
  if (!stbi_write_png(path, w, h, chans, t.pixels, w * chans)) {
    fprintf(stderr, "cannot write %s\n", path);
    exit(2);
  }
  return t;
}

// Smooth content, so the lossy JPEG stays close to what was written.
static TestImage write_jpg(const char *path, int h, int w, int chans) {
  TestImage t = {h, w, chans, malloc_check((size_t)h * w * chans)};
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++)
      for (int c = 0; c < chans; c++)
        t.pixels[((size_t)y * w + x) * chans + c] = (uint8_t)(40 + 4 * y + 3 * x + 30 * c);
  if (!stbi_write_jpg(path, w, h, chans, t.pixels, 95)) {
    fprintf(stderr, "cannot write %s\n", path);
    exit(2);
  }
  return t;
}

static void test_imagefolder(TestRng *r) {
  char root[512], path[1024];
  snprintf(root, sizeof root, "%s/folder", tmp_root);
  make_dir("%s%s", root, "");
  make_dir("%s/%s", root, "train");
  make_dir("%s/%s", root, "val");
  const char *classes[3] = {"Emu", "cat", "dog"};  // strcmp order: uppercase first
  for (int c = 0; c < 3; c++) {
    make_dir("%s/train/%s", root, classes[c]);
    make_dir("%s/val/%s", root, classes[c]);
  }
  make_dir("%s/train/%s", root, ".hidden");  // not a class
  // Odd sizes; gray, RGB and RGBA files; an uppercase extension; non-images that are ignored.
  snprintf(path, sizeof path, "%s/train/cat/a.png", root);
  TestImage a = write_png(path, r, 23, 37, 3);
  snprintf(path, sizeof path, "%s/train/cat/b.JPG", root);
  TestImage b = write_jpg(path, 31, 20, 3);
  snprintf(path, sizeof path, "%s/train/cat/c.png", root);
  TestImage c = write_png(path, r, 23, 37, 1);
  snprintf(path, sizeof path, "%s/train/dog/d.png", root);
  TestImage d = write_png(path, r, 23, 37, 4);
  snprintf(path, sizeof path, "%s/train/Emu/e.jpeg", root);
  TestImage e = write_jpg(path, 23, 37, 1);
  snprintf(path, sizeof path, "%s/train/dog/notes.txt", root);
  test_write_file(path, "not an image", 12);
  snprintf(path, sizeof path, "%s/train/readme.txt", root);
  test_write_file(path, "not a class", 11);
  for (int k = 0; k < 3; k++) {
    snprintf(path, sizeof path, "%s/val/%s/v.png", root, classes[k]);
    TestImage v = write_png(path, r, 9, 11, 3);
    free(v.pixels);
  }

  Error err = {{0}};
  Dataset *ds = NULL;
  Config cfg = make_config("imagefolder", root, 23, 37, 3);
  if (!test_check(dataset_open(&ds, &cfg, "train", &err) == 0, "imagefolder: open train")) {
    printf("     %s\n", err.msg);
    return;
  }
  // Sorted classes Emu=0, cat=1, dog=2; files sorted in each: e.jpeg, a.png b.JPG c.png, d.png.
  const int want_labels[5] = {0, 1, 1, 1, 2};
  int labels_ok = dataset_size(ds) == 5 && dataset_num_classes(ds) == 3;
  size_t n3 = 23 * 37 * 3;
  uint8_t *want = malloc_check(n3), *got = malloc_check(n3 + 64);
  int label;
  for (int i = 0; i < 5 && labels_ok; i++) {
    labels_ok &=
        dataset_load_sample(ds, i, false, 0, 0, got, &label, &err) == 0 && label == want_labels[i];
  }
  test_check(labels_ok, "imagefolder: 5 images, 3 classes, labels in sorted class order (%s)",
             dataset_describe(ds));
  char *joined = dataset_class_names_joined(ds);
  test_check(joined && strcmp(joined, "Emu\ncat\ndog") == 0 &&
                 strcmp(dataset_class_name(ds, 1), "cat") == 0 && !dataset_class_name(ds, 3),
             "imagefolder: class names are the directories, sorted: %s", joined ? joined : "NULL");
  free(joined);
  char **listed, class_dir[1100];
  int listed_count = 0;
  snprintf(class_dir, sizeof class_dir, "%s/train/cat", root);
  int rc = dataset_list_images(class_dir, &listed, &listed_count, &err);
  test_check(rc == 0 && listed_count == 3 && strstr(listed[0], "/cat/a.png") &&
                 strstr(listed[1], "/cat/b.JPG") && strstr(listed[2], "/cat/c.png"),
             "dataset_list_images: a class directory's images, sorted, as the dataset lists them");
  if (rc == 0) dataset_paths_free(listed, listed_count);

  // PNG is lossless and the eval transform at the image's own size is the identity, so decoded
  // pixels must equal what was written: RGB as is, gray replicated, RGBA without alpha.
  int64_t diff = load_and_compare(ds, 1, a.pixels, n3, &label);
  test_check(diff == -1, "imagefolder: RGB png 37x23 -> in_chans 3 exact (first diff %lld)",
             (long long)diff);
  for (size_t k = 0; k < 23 * 37; k++)
    for (int ch = 0; ch < 3; ch++) want[3 * k + ch] = c.pixels[k];
  diff = load_and_compare(ds, 3, want, n3, &label);
  test_check(diff == -1, "imagefolder: gray png -> in_chans 3 replicated (first diff %lld)",
             (long long)diff);
  for (size_t k = 0; k < 23 * 37; k++)
    for (int ch = 0; ch < 3; ch++) want[3 * k + ch] = d.pixels[4 * k + ch];
  diff = load_and_compare(ds, 4, want, n3, &label);
  test_check(diff == -1, "imagefolder: RGBA png -> in_chans 3 drops alpha (first diff %lld)",
             (long long)diff);

  // b.JPG is 20x31, resized to 37x23: compare with the eval transform of the written pixels;
  // JPEG at quality 95 on a smooth ramp stays within a few levels (mean abs error <= 3).
  TransformParams tp = {.out_h = 23, .out_w = 37, .chans = 3, .crop_pct = 1};
  transform_eval(&tp, b.pixels, b.h, b.w, want);
  memset(got, 0xA5, n3 + 64);
  dataset_load_sample(ds, 2, false, 0, 0, got, &label, &err);
  double mae = 0;
  for (size_t k = 0; k < n3; k++) mae += fabs((double)got[k] - want[k]);
  mae /= (double)n3;
  int guard_ok = 1;
  for (int k = 0; k < 64; k++) guard_ok &= got[n3 + k] == 0xA5;
  test_check(mae <= 3 && guard_ok,
             "imagefolder: jpg 20x31 -> 37x23x3, mean abs err %.2f vs "
             "resized original (tol 3), nothing written past the image",
             mae);
  dataset_close(ds);

  // in_chans 1: gray files exactly, RGB converted to luminance (a convex mix of r, g, b).
  cfg.in_chans = 1;
  if (test_check(dataset_open(&ds, &cfg, "train", &err) == 0, "imagefolder: open in_chans 1")) {
    diff = load_and_compare(ds, 3, c.pixels, 23 * 37, &label);
    test_check(diff == -1, "imagefolder: gray png -> in_chans 1 exact (first diff %lld)",
               (long long)diff);
    dataset_load_sample(ds, 1, false, 0, 0, got, &label, &err);
    int in_range = 1;
    for (size_t k = 0; k < 23 * 37; k++) {
      const uint8_t *p = a.pixels + 3 * k;
      int lo = p[0] < p[1] ? p[0] : p[1], hi = p[0] > p[1] ? p[0] : p[1];
      lo = lo < p[2] ? lo : p[2];
      hi = hi > p[2] ? hi : p[2];
      in_range &= got[k] >= lo - 1 && got[k] <= hi + 1;
    }
    test_check(in_range, "imagefolder: RGB png -> in_chans 1 is a luminance within [min, max]");
    dataset_load_sample(ds, 0, false, 0, 0, got, &label, &err);
    mae = 0;
    for (size_t k = 0; k < 23 * 37; k++) mae += fabs((double)got[k] - e.pixels[k]);
    mae /= 23 * 37;
    test_check(mae <= 3, "imagefolder: gray jpeg -> in_chans 1, mean abs err %.2f (tol 3)", mae);
    dataset_close(ds);
  } else {
    printf("     %s\n", err.msg);
  }

  // A limit takes files round-robin over classes: e.jpeg (Emu), a.png (cat), d.png (dog).
  cfg.in_chans = 3;
  cfg.train_limit = 3;
  if (dataset_open(&ds, &cfg, "train", &err) == 0) {
    int ok = dataset_size(ds) == 3;
    for (int i = 0; i < 3 && ok; i++) {
      ok &= dataset_load_sample(ds, i, false, 0, 0, got, &label, &err) == 0 && label == i;
    }
    diff = load_and_compare(ds, 1, a.pixels, n3, &label);
    test_check(ok && diff == -1, "imagefolder: train_limit 3 keeps one file of each class");
    dataset_close(ds);
  } else {
    test_check(0, "imagefolder: train_limit open: %s", err.msg);
  }
  cfg.train_limit = 0;
  test_check(dataset_open(&ds, &cfg, "val", &err) == 0 && dataset_size(ds) == 3,
             "imagefolder: open val with the same classes");
  dataset_close(ds);
  free(a.pixels), free(b.pixels), free(c.pixels), free(d.pixels), free(e.pixels);
  free(want);
  free(got);
}

static void test_imagefolder_errors(TestRng *r) {
  char root[512], path[1024];
  Error err = {{0}};
  Dataset *ds = NULL;
  uint8_t px[8 * 8 * 3];
  int label;

  // Corrupt files are found when they are decoded, and the error names them.
  snprintf(root, sizeof root, "%s/bad", tmp_root);
  make_dir("%s%s", root, "");
  make_dir("%s/%s", root, "train");
  make_dir("%s/%s", root, "train/a");
  snprintf(path, sizeof path, "%s/train/a/good.png", root);
  TestImage g = write_png(path, r, 8, 8, 3);
  free(g.pixels);
  size_t png_size = 0;
  uint8_t *png = read_file(path, &png_size, &err);
  snprintf(path, sizeof path, "%s/train/a/trunc.png", root);
  test_write_file(path, png, png_size / 2);
  free(png);
  uint8_t noise[300];
  fill_random(r, noise, sizeof noise, 0, 255);
  snprintf(path, sizeof path, "%s/train/a/x.png", root);
  test_write_file(path, noise, sizeof noise);
  Config cfg = make_config("imagefolder", root, 8, 8, 3);
  if (test_check(dataset_open(&ds, &cfg, "train", &err) == 0, "imagefolder errors: open")) {
    // Sorted: good.png, trunc.png, x.png
    test_check(dataset_load_sample(ds, 0, true, 1, 0, px, &label, &err) == 0,
               "imagefolder errors: the good file loads");
    snprintf(path, sizeof path, "%s/train/a/trunc.png", root);
    check_error(dataset_load_sample(ds, 1, true, 1, 0, px, &label, &err), &err,
                "imagefolder truncated png", path, NULL);
    snprintf(path, sizeof path, "%s/train/a/x.png", root);
    check_error(dataset_load_sample(ds, 2, false, 1, 0, px, &label, &err), &err,
                "imagefolder random-bytes png", path, NULL);
    dataset_close(ds);
  } else {
    printf("     %s\n", err.msg);
  }

  // Layout errors.
  snprintf(root, sizeof root, "%s/missing", tmp_root);
  cfg = make_config("imagefolder", root, 8, 8, 3);
  check_error(dataset_open(&ds, &cfg, "train", &err), &err, "imagefolder missing path",
              "does not exist", "HINT");
  cfg = make_config("imagefolder", "", 8, 8, 3);
  check_error(dataset_open(&ds, &cfg, "train", &err), &err, "imagefolder empty path",
              "data.path is not set", "HINT: set data.path, e.g.");
  snprintf(root, sizeof root, "%s/empty", tmp_root);
  make_dir("%s%s", root, "");
  cfg = make_config("imagefolder", root, 8, 8, 3);
  snprintf(path, sizeof path, "%s/train", root);
  check_error(dataset_open(&ds, &cfg, "train", &err), &err, "imagefolder no split dir", path,
              "does not exist");
  make_dir("%s/%s", root, "train");
  check_error(dataset_open(&ds, &cfg, "train", &err), &err, "imagefolder no class dirs", path,
              "no class directories");
  make_dir("%s/%s", root, "train/zebra");
  snprintf(path, sizeof path, "%s/train/zebra", root);
  check_error(dataset_open(&ds, &cfg, "train", &err), &err, "imagefolder empty class dir", path,
              "no .jpg/.jpeg/.png images");

  // val's classes must be train's: here val has "c" where train has "b".
  snprintf(root, sizeof root, "%s/mismatch", tmp_root);
  make_dir("%s%s", root, "");
  const char *dirs[] = {"train", "val", "train/a", "train/b", "val/a", "val/c"};
  for (int i = 0; i < 6; i++) make_dir("%s/%s", root, dirs[i]);
  for (int i = 2; i < 6; i++) {
    snprintf(path, sizeof path, "%s/%s/img.png", root, dirs[i]);
    TestImage t = write_png(path, r, 4, 4, 3);
    free(t.pixels);
  }
  cfg = make_config("imagefolder", root, 8, 8, 3);
  check_error(dataset_open(&ds, &cfg, "val", &err), &err, "imagefolder val class mismatch",
              "class 'c'", "HINT");
  test_check(dataset_open(&ds, &cfg, "train", &err) == 0, "imagefolder: its train split opens");
  dataset_close(ds);
}

// ---- transforms ----

static void test_transforms(TestRng *r) {
  enum { H = 23, W = 37, C = 3 };
  uint8_t src[H * W * C], dst[H * W * C], want[H * W * C];
  fill_random(r, src, sizeof src, 40, 200);

  // eval at the image's own size with crop_pct 1: identity.
  TransformParams p = {.out_h = H,
                       .out_w = W,
                       .chans = C,
                       .crop_pct = 1,
                       .scale_min = 1,
                       .scale_max = 1,
                       .ratio_min = (float)W / H,
                       .ratio_max = (float)W / H};
  memset(dst, 0xA5, sizeof dst);
  transform_eval(&p, src, H, W, dst);
  test_check(memcmp(dst, src, sizeof src) == 0,
             "transform: eval at own size, crop_pct 1 = identity");

  // RRC with scale 1 and the image's own aspect picks the whole image: hflip 0 -> identity,
  // hflip 1 -> the mirror image.
  Rng rng = rng_make(7, RNG_STREAM_AUGMENT, 0, 0);
  p.hflip = 0;
  memset(dst, 0xA5, sizeof dst);
  transform_train(&p, src, H, W, &rng, dst);
  test_check(memcmp(dst, src, sizeof src) == 0, "transform: RRC full box, hflip 0 = identity");
  p.hflip = 1;
  memset(dst, 0xA5, sizeof dst);
  transform_train(&p, src, H, W, &rng, dst);
  for (int y = 0; y < H; y++)
    for (int x = 0; x < W; x++)
      for (int c = 0; c < C; c++) want[(y * W + x) * C + c] = src[(y * W + (W - 1 - x)) * C + c];
  test_check(memcmp(dst, want, sizeof want) == 0, "transform: hflip 1 mirrors every row");

  // RRC boxes stay inside the image, and their area and aspect lie in the requested ranges up
  // to the rounding of w and h to whole pixels (each within 0.5 of the drawn real value).
  p = (TransformParams){.out_h = 16,
                        .out_w = 16,
                        .chans = C,
                        .scale_min = 0.08f,
                        .scale_max = 1,
                        .ratio_min = 0.75f,
                        .ratio_max = 4.0f / 3,
                        .hflip = 0.5f,
                        .crop_pct = 1};
  int inside = 1, ranges = 1, distinct = 0;
  CropBox prev = {0};
  for (int i = 0; i < 2000; i++) {
    rng = rng_make(3, RNG_STREAM_AUGMENT, 0, (uint64_t)i);
    CropBox b = transform_rrc_box(&p, H, W, &rng);
    inside &=
        b.top >= 0 && b.left >= 0 && b.h >= 1 && b.w >= 1 && b.top + b.h <= H && b.left + b.w <= W;
    double area = (double)H * W;
    ranges &= (b.w + 0.5) * (b.h + 0.5) >= p.scale_min * area &&
              (b.w - 0.5) * (b.h - 0.5) <= p.scale_max * area &&
              (b.w + 0.5) / (b.h - 0.5) >= p.ratio_min && (b.w - 0.5) / (b.h + 0.5) <= p.ratio_max;
    distinct += b.top != prev.top || b.left != prev.left || b.h != prev.h || b.w != prev.w;
    prev = b;
  }
  test_check(inside && ranges && distinct > 1500,
             "transform: 2000 RRC boxes inside, area/aspect in range, %d changes", distinct);

  // Interpolation weights are non-negative and sum to 1: outputs stay within the input range.
  uint8_t out16[16 * 16 * C];
  int lo = 255, hi = 0;
  for (int i = 0; i < 200; i++) {
    rng = rng_make(3, RNG_STREAM_AUGMENT, 1, (uint64_t)i);
    transform_train(&p, src, H, W, &rng, out16);
    for (size_t k = 0; k < sizeof out16; k++) {
      lo = out16[k] < lo ? out16[k] : lo;
      hi = out16[k] > hi ? out16[k] : hi;
    }
  }
  test_check(lo >= 40 && hi <= 200,
             "transform: RRC outputs within the input range [40, 200] "
             "(got [%d, %d])",
             lo, hi);

  // Upscaling is bilinear with pixel centers aligned (align_corners=False, edges clamped):
  // 2x2 -> 4x4 samples the source at -0.25, 0.25, 0.75, 1.25 on each axis.
  const uint8_t s2[4] = {0, 100, 200, 40};
  uint8_t d4[16];
  TransformParams up = {.out_h = 4, .out_w = 4, .chans = 1, .crop_pct = 1};
  transform_eval(&up, s2, 2, 2, d4);
  const double frac[4] = {0, 0.25, 0.75, 1};
  double worst = 0;
  for (int y = 0; y < 4; y++)
    for (int x = 0; x < 4; x++) {
      double top = s2[0] + frac[x] * (s2[1] - s2[0]), bot = s2[2] + frac[x] * (s2[3] - s2[2]);
      double v = top + frac[y] * (bot - top);
      worst = fmax(worst, fabs(d4[y * 4 + x] - v));
    }
  // Rounding to uint8 costs at most 0.5, float weights a little more.
  test_check(worst <= 0.51, "transform: 2x upscale matches bilinear (max err %.3f, tol 0.51)",
             worst);

  // Downscaling averages the area: columns [255, 0, 0, 0] repeated, shrunk 8x, must come out
  // at their mean 63.75; plain bilinear would read two neighbours and give 127.5 or 0. Away
  // from the borders (where the filter is cut and renormalized) the triangle's weights on the
  // 255 columns sum to exactly 1/4: tol 1 for rounding to uint8.
  enum { S = 64 };
  static uint8_t stripes[S * S];
  for (int y = 0; y < S; y++)
    for (int x = 0; x < S; x++) stripes[y * S + x] = x % 4 == 0 ? 255 : 0;
  uint8_t d8[8 * 8];
  TransformParams down = {.out_h = 8, .out_w = 8, .chans = 1, .crop_pct = 1};
  transform_eval(&down, stripes, S, S, d8);
  worst = 0;
  for (int y = 0; y < 8; y++)
    for (int x = 1; x < 7; x++) worst = fmax(worst, fabs(d8[y * 8 + x] - 63.75));
  test_check(worst <= 1, "transform: 8x downscale averages (max |v - 63.75| = %.2f, tol 1)", worst);

  // eval with crop_pct 0.875 on a non-square image: resize the short side to round(16 /
  // 0.875) = 18, then the center 16x16. A horizontal ramp must stay monotone and centered.
  uint8_t ramp[20 * 40], e16[16 * 16];
  for (int y = 0; y < 20; y++)
    for (int x = 0; x < 40; x++) ramp[y * 40 + x] = (uint8_t)(x * 6);
  TransformParams ev = {.out_h = 16, .out_w = 16, .chans = 1, .crop_pct = 0.875f};
  transform_eval(&ev, ramp, 20, 40, e16);
  // Resized 18x36: the crop's columns 10..25 map to source x = (10 + i + 0.5) * 40/36 - 0.5.
  // The ramp is linear there, but a tent sampled at whole pixels and renormalized has its
  // centroid up to ~0.1 px off the exact position at this 1.11x shrink (6 levels per pixel):
  // tol 0.7 for that plus 0.5 for rounding. A wrong crop offset or scale is off by >= 6.
  worst = 0;
  for (int x = 0; x < 16; x++)
    worst = fmax(worst, fabs(e16[x] - ((10 + x + 0.5) * 40 / 36 - 0.5) * 6));
  test_check(worst <= 1.2,
             "transform: eval crop_pct 0.875 crops the center of the resize "
             "(max err %.3f, tol 1.2)",
             worst);
}

// Augmentation is keyed by (seed, epoch, index): identical images loaded at the same key must
// match, at another index or epoch they must not.
static void test_augment_keys(TestRng *r) {
  enum { N = 4, H = 28, W = 28 };
  char dir[512];
  snprintf(dir, sizeof dir, "%s/same", tmp_root);
  make_dir("%s%s", dir, "");
  uint8_t pixels[N * H * W], labels[N] = {1, 2, 3, 4};
  fill_random(r, pixels, H * W, 0, 255);
  for (int i = 1; i < N; i++) memcpy(pixels + i * H * W, pixels, H * W);
  write_idx_pair(dir, "train", pixels, labels, N, H, W, false);
  Config cfg = make_config("fashion_mnist", dir, 16, 16, 3);
  Dataset *ds = NULL;
  Error err = {{0}};
  if (!test_check(dataset_open(&ds, &cfg, "train", &err) == 0, "augment: open")) {
    printf("     %s\n", err.msg);
    return;
  }
  uint8_t a[16 * 16 * 3], b[16 * 16 * 3], c[16 * 16 * 3], d[16 * 16 * 3];
  int label;
  dataset_load_sample(ds, 1, true, 42, 3, a, &label, &err);
  dataset_load_sample(ds, 1, true, 42, 3, b, &label, &err);
  dataset_load_sample(ds, 2, true, 42, 3, c, &label, &err);
  dataset_load_sample(ds, 1, true, 42, 4, d, &label, &err);
  test_check(memcmp(a, b, sizeof a) == 0, "augment: same (seed, epoch, index) -> same pixels");
  test_check(memcmp(a, c, sizeof a) != 0, "augment: another index -> other pixels");
  test_check(memcmp(a, d, sizeof a) != 0, "augment: another epoch -> other pixels");
  dataset_close(ds);
}

// The colour stage of the train transform: RandAugment with p0 (every op skipped) equals no
// RandAugment bit for bit (its draws come after the geometric ones), while the real policy and
// colour jitter change most samples and repeat exactly for the same key.
static void test_color_stage(TestRng *r) {
  enum { N = 24, H = 28, W = 28, OUT = 24 };
  char dir[512];
  snprintf(dir, sizeof dir, "%s/color", tmp_root);
  make_dir("%s%s", dir, "");
  uint8_t pixels[N * H * W], labels[N];
  fill_random(r, pixels, sizeof pixels, 0, 255);
  for (int i = 0; i < N; i++) labels[i] = (uint8_t)(i % 10);
  write_idx_pair(dir, "train", pixels, labels, N, H, W, false);
  const char *specs[4] = {"", "rand-m9-mstd0.5-inc1-p0", "rand-m9-mstd0.5-inc1", ""};
  float jitter[4] = {0, 0, 0, 0.4f};
  static uint8_t out[4][N][OUT * OUT * 3], again[OUT * OUT * 3];
  int label, repeat_ok = 1;
  Error err = {{0}};
  for (int v = 0; v < 4; v++) {
    Config cfg = make_config("fashion_mnist", dir, OUT, OUT, 3);
    snprintf(cfg.randaugment, sizeof cfg.randaugment, "%s", specs[v]);
    cfg.color_jitter = jitter[v];
    snprintf(cfg.interpolation, sizeof cfg.interpolation, "random");
    cfg.num_mean = 1;
    cfg.mean[0] = 0.5f;
    Dataset *ds = NULL;
    if (dataset_open(&ds, &cfg, "train", &err)) {
      test_check(0, "color stage: open: %s", err.msg);
      return;
    }
    for (int i = 0; i < N; i++) {
      dataset_load_sample(ds, i, true, 9, 1, out[v][i], &label, &err);
      dataset_load_sample(ds, i, true, 9, 1, again, &label, &err);
      repeat_ok &= memcmp(out[v][i], again, sizeof again) == 0;
    }
    dataset_close(ds);
  }
  int p0_same = 0, ra_changed = 0, jitter_changed = 0;
  for (int i = 0; i < N; i++) {
    p0_same += memcmp(out[1][i], out[0][i], sizeof again) == 0;
    ra_changed += memcmp(out[2][i], out[0][i], sizeof again) != 0;
    jitter_changed += memcmp(out[3][i], out[0][i], sizeof again) != 0;
  }
  test_check(p0_same == N, "color stage: RandAugment p0 = no RandAugment (%d of %d identical)",
             p0_same, N);
  // Two ops at p 0.5 leave an image alone with probability 1/4 (plus the rare op that is
  // the identity here): about 18 of 24 change; 12 is 3 sd below.
  test_check(ra_changed >= 12 && jitter_changed >= 20 && repeat_ok,
             "color stage: RandAugment changes %d of %d samples, jitter %d; the same key repeats",
             ra_changed, N, jitter_changed);
}

// ---- loader ----

// Synthetic dataset for the loader: image i carries its index in its first two pixels, so a
// batch that is an identity crop tells which samples it holds.
enum { LN = 103, LH = 8, LW = 8 };
static uint8_t loader_pixels[LN * LH * LW], loader_labels[LN];

static int sample_id(const uint8_t *img) {
  return img[0] | img[1] << 8;
}

static int alloc_calls, release_calls;
static void *counting_alloc(size_t bytes) {
  alloc_calls++;
  void *p = malloc(bytes);
  if (p) memset(p, 0xA5, bytes);  // poison
  return p;
}
static void counting_release(void *p) {
  release_calls++;
  free(p);
}

static LoaderOptions loader_options(int batch, bool train, int workers, int prefetch) {
  return (LoaderOptions){.batch_size = batch,
                         .train = train,
                         .seed = 1234,
                         .workers = workers,
                         .prefetch = prefetch,
                         .rank = 0,
                         .world = 1};
}

// Reads `count` batches into one flat record (pixels, labels, count, epoch, index per batch).
typedef struct {
  uint8_t *pixels;
  int *labels, *counts;
  int64_t *epochs, *indices;
  int n;
} Run;

static int run_loader(const Dataset *ds, LoaderOptions opt, int count, Run *run, Error *err) {
  Loader *L = NULL;
  if (loader_create(&L, ds, &opt, err)) return -1;
  size_t sb = (size_t)dataset_sample_bytes(ds);
  run->pixels = calloc_check((size_t)count * opt.batch_size, sb);
  run->labels = calloc_check((size_t)count * opt.batch_size, sizeof(int));
  run->counts = calloc_check((size_t)count, sizeof(int));
  run->epochs = calloc_check((size_t)count, sizeof(int64_t));
  run->indices = calloc_check((size_t)count, sizeof(int64_t));
  run->n = 0;
  for (int k = 0; k < count; k++) {
    Batch *b = NULL;
    if (loader_next(L, &b, err)) {
      loader_destroy(L);
      return -1;
    }
    if (!b) break;
    memcpy(run->pixels + (size_t)k * opt.batch_size * sb, b->pixels, (size_t)b->count * sb);
    memcpy(run->labels + (size_t)k * opt.batch_size, b->labels, sizeof(int) * (size_t)b->count);
    run->counts[k] = b->count;
    run->epochs[k] = b->epoch;
    run->indices[k] = b->index;
    run->n++;
    loader_release_batch(L, b);
  }
  loader_destroy(L);
  return 0;
}

static void run_free(Run *r) {
  free(r->pixels);
  free(r->labels);
  free(r->counts);
  free(r->epochs);
  free(r->indices);
}

static bool runs_equal(const Run *a, int a0, const Run *b, int b0, int n, size_t batch_bytes,
                       int batch) {
  for (int k = 0; k < n; k++) {
    if (a->counts[a0 + k] != b->counts[b0 + k] || a->epochs[a0 + k] != b->epochs[b0 + k] ||
        a->indices[a0 + k] != b->indices[b0 + k] ||
        memcmp(a->pixels + (size_t)(a0 + k) * batch_bytes,
               b->pixels + (size_t)(b0 + k) * batch_bytes, batch_bytes) != 0 ||
        memcmp(a->labels + (size_t)(a0 + k) * batch, b->labels + (size_t)(b0 + k) * batch,
               sizeof(int) * (size_t)batch) != 0) {
      return false;
    }
  }
  return true;
}

static void test_loader(TestRng *r) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/loader", tmp_root);
  make_dir("%s%s", dir, "");
  fill_random(r, loader_pixels, sizeof loader_pixels, 0, 255);
  for (int i = 0; i < LN; i++) {
    loader_pixels[i * LH * LW] = (uint8_t)i;
    loader_pixels[i * LH * LW + 1] = (uint8_t)(i >> 8);
    loader_labels[i] = (uint8_t)(test_rng_u64(r) % 10);
  }
  write_idx_pair(dir, "train", loader_pixels, loader_labels, LN, LH, LW, false);
  Error err = {{0}};

  // Real augmentation (RRC + flip): batch contents must not depend on workers or prefetch.
  Config cfg = make_config("fashion_mnist", dir, LH, LW, 1);
  Dataset *aug = NULL, *ident = NULL;
  if (dataset_open(&aug, &cfg, "train", &err)) {
    test_check(0, "loader: open synthetic dataset: %s", err.msg);
    return;
  }
  // Identity transform (RRC box = the whole square image, no flip): samples are identifiable.
  cfg.scale_min = cfg.scale_max = 1;
  cfg.ratio_min = cfg.ratio_max = 1;
  cfg.hflip = 0;
  dataset_open(&ident, &cfg, "train", &err);
  const int B = 8, BATCHES = 30;  // 103 / 8 = 12 batches per epoch: 30 crosses two epochs
  size_t sb = LH * LW, bb = sb * B;
  Run r1, r4;
  LoaderOptions o1 = loader_options(B, true, 1, 2), o4 = loader_options(B, true, 4, 5);
  if (run_loader(aug, o1, BATCHES, &r1, &err) || run_loader(aug, o4, BATCHES, &r4, &err)) {
    test_check(0, "loader: run: %s", err.msg);
    return;
  }
  test_check(r1.n == BATCHES && r4.n == BATCHES && runs_equal(&r1, 0, &r4, 0, BATCHES, bb, B),
             "loader: workers 1/prefetch 2 and workers 4/prefetch 5 bit-identical over %d "
             "batches (epochs %lld..%lld)",
             BATCHES, (long long)r1.epochs[0], (long long)r1.epochs[BATCHES - 1]);
  test_check(
      r1.epochs[11] == 0 && r1.indices[11] == 11 && r1.epochs[12] == 1 && r1.indices[12] == 0,
      "loader: 12 batches per epoch, then the epoch increments");

  // Resume: starting at (epoch 1, batch 3) yields exactly what a fresh loader yields there.
  Run rr;
  LoaderOptions ores = loader_options(B, true, 2, 3);
  ores.start_epoch = 1;
  ores.start_batch = 3;
  if (run_loader(aug, ores, 14, &rr, &err) == 0) {
    test_check(runs_equal(&rr, 0, &r1, 15, 14, bb, B),
               "loader: resume at (1, 3) = batches 15..28 of a fresh run");
    run_free(&rr);
  }
  run_free(&r1);
  run_free(&r4);

  // Order: epoch e's batch k holds perm_e[8k .. 8k+8), perm_e from Fisher-Yates with draws
  // from (seed, SHUFFLE, e, 0); pixels and labels are the samples'.
  Run ri;
  if (run_loader(ident, o4, 24, &ri, &err) == 0) {
    bool order_ok = true, content_ok = true, differs = false;
    for (int e = 0; e < 2; e++) {
      int perm[LN];
      for (int i = 0; i < LN; i++) perm[i] = i;
      Rng rng = rng_make(o4.seed, RNG_STREAM_SHUFFLE, (uint64_t)e, 0);
      for (int i = LN - 1; i > 0; i--) {
        int j = (int)rng_below(&rng, (uint32_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
      }
      for (int k = 0; k < 12; k++)
        for (int j = 0; j < B; j++) {
          const uint8_t *img = ri.pixels + (size_t)(e * 12 + k) * bb + (size_t)j * sb;
          int id = sample_id(img);
          order_ok &= id == perm[k * B + j];
          content_ok &= id < LN && memcmp(img, loader_pixels + (size_t)id * sb, sb) == 0 &&
                        ri.labels[(e * 12 + k) * B + j] == loader_labels[id];
          if (e == 1) differs |= id != sample_id(ri.pixels + (size_t)k * bb + (size_t)j * sb);
        }
    }
    test_check(order_ok, "loader: batches follow the Fisher-Yates permutation of (seed, epoch)");
    test_check(content_ok, "loader: every sample's pixels and label are its own");
    test_check(differs, "loader: epoch 1's order differs from epoch 0's");
    run_free(&ri);
  }

  // Sharding: rank r of world 2 with batch 4 gets [4r, 4r+4) of the world-1 batch of 8.
  Run whole, shard[2];
  if (run_loader(ident, loader_options(8, true, 2, 2), 14, &whole, &err) == 0) {
    bool ok = true;
    for (int rank = 0; rank < 2; rank++) {
      LoaderOptions o = loader_options(4, true, 2, 2);
      o.rank = rank;
      o.world = 2;
      if (run_loader(ident, o, 14, &shard[rank], &err)) {
        ok = false;
        break;
      }
      for (int k = 0; k < 14; k++) {
        ok &= memcmp(shard[rank].pixels + (size_t)k * 4 * sb,
                     whole.pixels + (size_t)k * 8 * sb + (size_t)rank * 4 * sb, 4 * sb) == 0;
      }
      run_free(&shard[rank]);
    }
    test_check(ok, "loader: world 2 ranks take contiguous halves of the world-1 batch");
    run_free(&whole);
  }

  // Eval: one pass in order, the last batch partial, then NULL (and NULL again).
  Loader *L = NULL;
  LoaderOptions oe = loader_options(10, false, 3, 4);
  alloc_calls = release_calls = 0;
  oe.alloc = counting_alloc;
  oe.release = counting_release;
  if (loader_create(&L, ident, &oe, &err) == 0) {
    int seen = 0, batches = 0, last_count = -1;
    bool in_order = true;
    Batch *b = NULL;
    while (loader_next(L, &b, &err) == 0 && b) {
      for (int j = 0; j < b->count; j++) {
        in_order &=
            sample_id(b->pixels + (size_t)j * sb) == seen && b->labels[j] == loader_labels[seen];
        seen++;
      }
      last_count = b->count;
      batches++;
      loader_release_batch(L, b);
    }
    Batch *again = (Batch *)1;
    int rc = loader_next(L, &again, &err);
    test_check(in_order && seen == LN && batches == 11 && last_count == 3 && rc == 0 && !again &&
                   loader_batches_per_epoch(L) == 11 && strcmp(loader_decoder(L), "stb") == 0,
               "loader: eval returns %d samples once in order in %d batches, last %d, then NULL",
               seen, batches, last_count);
    loader_destroy(L);
    test_check(alloc_calls == 2 * oe.prefetch && release_calls == alloc_calls,
               "loader: buffers from the alloc hook (%d allocs, %d releases)", alloc_calls,
               release_calls);
  } else {
    test_check(0, "loader: eval create: %s", err.msg);
  }

  // Eval over 2 ranks: together they see every sample once (a rank's last batch may be empty).
  int seen_count[LN] = {0};
  bool shards_ok = true;
  for (int rank = 0; rank < 2; rank++) {
    LoaderOptions o = loader_options(8, false, 2, 2);
    o.rank = rank;
    o.world = 2;
    Run run;
    if (run_loader(ident, o, 100, &run, &err)) {
      shards_ok = false;
      break;
    }
    shards_ok &= run.n == 7;
    for (int k = 0; k < run.n; k++)
      for (int j = 0; j < run.counts[k]; j++)
        seen_count[sample_id(run.pixels + (size_t)k * 8 * sb + (size_t)j * sb)]++;
    run_free(&run);
  }
  for (int i = 0; i < LN; i++) shards_ok &= seen_count[i] == 1;
  test_check(shards_ok, "loader: eval over 2 ranks covers each sample exactly once");

  // A caller that holds all prefetch buffers gets an error, not a deadlock.
  if (loader_create(&L, aug, &o1, &err) == 0) {
    Batch *b1 = NULL, *b2 = NULL, *b3 = NULL;
    loader_next(L, &b1, &err);
    loader_next(L, &b2, &err);
    int rc = loader_next(L, &b3, &err);
    test_check(b1 && b2 && rc == -1 && strstr(err.msg, "loader_release_batch"),
               "loader: asking for more than prefetch held batches is an error");
    loader_release_batch(L, b1);
    rc = loader_next(L, &b3, &err);
    test_check(rc == 0 && b3 && b3->index == 2, "loader: after a release the next batch comes");
    loader_destroy(L);
  }

  // Shutdown while workers wait for a free slot, and right after creation: must not hang.
  if (loader_create(&L, aug, &o4, &err) == 0) {
    Batch *b = NULL;
    loader_next(L, &b, &err);
    nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);  // workers fill the ring, block
    loader_destroy(L);
    test_check(1, "loader: destroy with a held batch and blocked workers returns");
  }
  if (loader_create(&L, aug, &o4, &err) == 0) {
    loader_destroy(L);
    test_check(1, "loader: destroy right after create returns");
  }

  // Invalid options.
  LoaderOptions bad = loader_options(200, true, 1, 1);
  check_error(loader_create(&L, aug, &bad, &err), &err, "loader batch larger than dataset",
              "fewer samples than one batch", "HINT");
  dataset_close(aug);
  dataset_close(ident);
}

static void test_loader_error_path(void) {
  // The "bad" tree from test_imagefolder_errors: good.png, trunc.png, x.png.
  char root[512];
  snprintf(root, sizeof root, "%s/bad", tmp_root);
  Config cfg = make_config("imagefolder", root, 8, 8, 3);
  Dataset *ds = NULL;
  Error err = {{0}};
  if (dataset_open(&ds, &cfg, "train", &err)) {
    test_check(0, "loader error path: open: %s", err.msg);
    return;
  }
  Loader *L = NULL;
  LoaderOptions o = loader_options(2, false, 2, 2);
  if (loader_create(&L, ds, &o, &err) == 0) {
    Batch *b = NULL;
    int rc = loader_next(L, &b, &err);
    char path[1024];
    snprintf(path, sizeof path, "%s/train/a/trunc.png", root);
    check_error(rc, &err, "loader corrupt image", path, "batch 0");
    rc = loader_next(L, &b, &err);
    test_check(rc == -1 && !b, "loader: the error repeats on the next call");
    loader_destroy(L);
  }
  dataset_close(ds);
}

// LoaderOptions.gpu_decode: datasets without files ignore it (synthetic: the same bytes); with
// files, a build without nvJPEG refuses it at loader_create and says why. The nvJPEG path itself
// is tests/test_gpu_jpeg.c's.
static void test_gpu_decode_option(void) {
  Config cfg = make_config("synthetic", "", 8, 8, 3);
  cfg.train_limit = 32;
  cfg.num_classes = 10;
  Dataset *ds = NULL;
  Error err = {{0}};
  if (dataset_open(&ds, &cfg, "train", &err)) {
    test_check(0, "gpu_decode: open synthetic: %s", err.msg);
    return;
  }
  LoaderOptions o = loader_options(4, true, 2, 2);
  Run plain = {0}, gpu = {0};
  int rc = run_loader(ds, o, 3, &plain, &err);
  o.gpu_decode = true;
  if (rc == 0) rc = run_loader(ds, o, 3, &gpu, &err);
  test_check(rc == 0 && plain.n == 3 && gpu.n == 3 &&
                 memcmp(plain.pixels, gpu.pixels, (size_t)3 * 4 * 8 * 8 * 3) == 0,
             "gpu_decode: a dataset without files ignores it (same bytes) %s", rc ? err.msg : "");
  run_free(&plain);
  run_free(&gpu);
  dataset_close(ds);

  char root[512];
  snprintf(root, sizeof root, "%s/folder", tmp_root);
  cfg = make_config("imagefolder", root, 8, 8, 3);
  if (dataset_open(&ds, &cfg, "train", &err)) {
    test_check(0, "gpu_decode: open imagefolder: %s", err.msg);
    return;
  }
  Loader *L = NULL;
  rc = loader_create(&L, ds, &o, &err);
  if (!jpeg_gpu_built())
    check_error(rc, &err, "gpu_decode in a build without nvJPEG", "this build has no nvJPEG",
                "HINT: set data.decoder=stb");
  else if (rc != 0)  // an nvJPEG build on a machine without a GPU
    check_error(rc, &err, "gpu_decode without a GPU", "loader: worker 1 of 2", "HINT");
  else
    test_check(1, "gpu_decode: the loader starts with nvJPEG");
  loader_destroy(L);
  dataset_close(ds);
}

// data.skip_bad on the "bad" tree (good.png, trunc.png, x.png) plus a PNG whose header claims
// 9000x8000 pixels: every bad sample becomes the next one in split order that decodes (wrapping),
// each bad file is counted once, and batches do not depend on the number of workers.
static void test_skip_bad(void) {
  char root[512], path[1024];
  snprintf(root, sizeof root, "%s/bad", tmp_root);
  // A valid signature and IHDR (CRCs are not checked when only the header is read) for a
  // 9000x8000 gray image: 72 Mpixel, over the 64 Mpixel limit.
  const uint8_t huge[] = {0x89, 'P',  'N', 'G', '\r', '\n', 0x1A, '\n', 0,    0, 0,
                          13,   'I',  'H', 'D', 'R',  0,    0,    0x23, 0x28, 0, 0,
                          0x1F, 0x40, 8,   0,   0,    0,    0,    0,    0,    0, 0};
  snprintf(path, sizeof path, "%s/train/a/y_huge.png", root);
  test_write_file(path, huge, sizeof huge);
  Config cfg = make_config("imagefolder", root, 8, 8, 3);
  Dataset *ds = NULL;
  Error err = {{0}};
  uint8_t px[8 * 8 * 3], want[8 * 8 * 3];
  int label = -1;
  if (dataset_open(&ds, &cfg, "train", &err)) {
    test_check(0, "skip_bad: open without it: %s", err.msg);
    return;
  }
  check_error(dataset_load_sample(ds, 3, false, 1, 0, px, &label, &err), &err,
              "imagefolder png over 64 Mpixel", "y_huge.png", "9000x8000");
  check_error(dataset_load_sample(ds, 1, false, 1, 0, px, &label, &err), &err,
              "without skip_bad a bad file stops", "trunc.png", "data.skip_bad=true");
  dataset_close(ds);

  cfg.skip_bad = true;
  if (dataset_open(&ds, &cfg, "train", &err)) {
    test_check(0, "skip_bad: open: %s", err.msg);
    return;
  }
  // Sorted: good.png (0), trunc.png (1), x.png (2), y_huge.png (3): 1, 2 and 3 all wrap to 0.
  bool ok = dataset_load_sample(ds, 0, false, 1, 0, want, &label, &err) == 0 && label == 0;
  for (int i = 1; i < 4 && ok; i++) {
    memset(px, 0xA5, sizeof px);
    ok = dataset_load_sample(ds, i, false, 1, 0, px, &label, &err) == 0 && label == 0 &&
         memcmp(px, want, sizeof px) == 0;
  }
  test_check(ok && dataset_bad_count(ds) == 3,
             "skip_bad: the 3 bad samples become good.png (eval pixels equal), %lld counted",
             (long long)dataset_bad_count(ds));
  dataset_load_sample(ds, 2, true, 1, 5, px, &label, &err);
  test_check(dataset_bad_count(ds) == 3, "skip_bad: a bad file met again is not counted again");

  LoaderOptions o1 = loader_options(2, true, 1, 2), o3 = loader_options(2, true, 3, 3);
  Run r1, r3;
  if (run_loader(ds, o1, 6, &r1, &err) || run_loader(ds, o3, 6, &r3, &err)) {
    test_check(0, "skip_bad: loader: %s", err.msg);
  } else {
    test_check(r1.n == 6 && r3.n == 6 && runs_equal(&r1, 0, &r3, 0, 6, 2 * sizeof px, 2),
               "skip_bad: 6 train batches with 1 and 3 workers are identical");
    run_free(&r1);
    run_free(&r3);
  }
  dataset_close(ds);

  // A split in which nothing decodes is an error, not an endless search.
  snprintf(root, sizeof root, "%s/allbad", tmp_root);
  make_dir("%s%s", root, "");
  make_dir("%s/%s", root, "train");
  make_dir("%s/%s", root, "train/a");
  snprintf(path, sizeof path, "%s/train/a/x.png", root);
  test_write_file(path, "not a png", 9);
  cfg = make_config("imagefolder", root, 8, 8, 3);
  cfg.skip_bad = true;
  if (dataset_open(&ds, &cfg, "train", &err) == 0) {
    check_error(dataset_load_sample(ds, 0, true, 1, 0, px, &label, &err), &err,
                "skip_bad with no decodable image", "no image of", "decodes");
    check_error(dataset_load_sample(ds, 0, true, 1, 1, px, &label, &err), &err,
                "skip_bad with no decodable image, asked again", "no image of",
                "found not to decode before");
    dataset_close(ds);
  }
}

// ---- throughput ----

static void measure_fashion_throughput(void) {
  struct stat st;
  if (stat(FASHION_DIR, &st) != 0) {
    printf("SKIP throughput: %s not found\n", FASHION_DIR);
    return;
  }
  Config cfg = make_config("fashion_mnist", FASHION_DIR, 32, 32, 1);
  Dataset *ds = NULL;
  Error err = {{0}};
  if (dataset_open(&ds, &cfg, "train", &err)) {
    test_check(0, "throughput: open: %s", err.msg);
    return;
  }
  for (int workers = 1; workers <= 2; workers++) {
    Loader *L = NULL;
    LoaderOptions o = loader_options(128, true, workers, 4);
    if (loader_create(&L, ds, &o, &err)) break;
    Batch *b = NULL;
    int batches = 0;
    double t0 = time_now_s(), t = t0;
    while (t - t0 < 0.5 && loader_next(L, &b, &err) == 0 && b) {
      loader_release_batch(L, b);
      batches++;
      t = time_now_s();
    }
    printf(
        "info throughput: fashion-mnist train, batch 128 at 32x32x1, RRC + flip, %d worker%s: "
        "%.0f batches/s (%.0f img/s)\n",
        workers, workers > 1 ? "s" : "", batches / (t - t0), 128 * batches / (t - t0));
    loader_destroy(L);
  }
  dataset_close(ds);
}

// image_decode refuses what stb mishandles, with a reason, on the inputs the fuzzers found
// (tests/fuzz/corpus/fuzz_decode/regress-*), and still decodes the seed images.
static void test_image_refusals(void) {
  struct {
    const char *file, *want;  // want NULL: decodes
  } cases[] = {
      {"regress-jpeg-truncated-62-megapixels",
       "truncated JPEG: a 4105x15111 image needs at least 121153 bytes, the file has 726"},
      {"regress-jpeg-truncated-16-megapixels", "truncated JPEG: a 65528x249 image needs"},
      {"regress-jpeg-huffman-table-over-256-codes", "a Huffman table has more than 256 codes"},
      {"regress-png-chunk-claims-800mb", "a chunk runs past the end of the file"},
      {"regress-png-empty-first-idat", "an empty IDAT chunk before the image data"},
      {"regress-jpeg-huffman-table-after-fill-stuffing", "a Huffman table has more than 256 codes"},
      {"regress-jpeg-truncated-behind-fill-byte", "truncated JPEG: a 4105x15111 image needs"},
      {"regress-png-88-bytes-claim-267mb",
       "truncated PNG: a 4x16711684 image needs at least 259096 bytes of compressed data, the "
       "file has 31"},
      {"seed-rgb.jpg", NULL},
      {"seed-rgba.png", NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char path[512], why[256] = "";
    snprintf(path, sizeof path, "%s/tests/fuzz/corpus/fuzz_decode/%s", SWIN_SOURCE_DIR,
             cases[i].file);
    size_t size;
    Error err;
    unsigned char *file = read_file(path, &size, &err);
    if (!file) {
      test_check(false, "%s", err.msg);
      continue;
    }
    int h = 0, w = 0;
    uint8_t *pixels = image_decode(file, size, 3, &h, &w, why, sizeof why);
    if (cases[i].want)
      test_check(!pixels && strstr(why, cases[i].want), "%s refused: %s", cases[i].file, why);
    else
      test_check(pixels && h > 0 && w > 0, "%s decodes (%dx%d) %s", cases[i].file, w, h, why);
    if (pixels) image_free(pixels);
    free(file);
  }
}

// A PNG whose deflate stream uses a forbidden distance code (30 or 31): stb copies unwritten
// bytes of its growing output buffer. Its pixels must not depend on what the heap held: decode
// with glibc filling fresh and freed memory with a pattern (M_PERTURB), then with other patterns
// and freed blocks of the sizes stb grows through, and compare; with the growth zeroed every
// pixel is 0. Without the fix the ASan build fails here (its fresh memory holds 0xbe, which
// made stb refuse the file), while glibc often grows the buffer into never-used, zero pages.
static void test_png_forbidden_distance(void) {
#ifdef __GLIBC__
  mallopt(M_PERTURB, 0x5A);
#endif
  char path[512], why[256] = "";
  snprintf(path, sizeof path,
           "%s/tests/fuzz/corpus/fuzz_decode/regress-png-deflate-distance-code-30",
           SWIN_SOURCE_DIR);
  size_t size;
  Error err;
  unsigned char *file = read_file(path, &size, &err);
  if (!file) {
    test_check(false, "%s", err.msg);
    return;
  }
  int h = 0, w = 0, h2 = 0, w2 = 0;
  uint8_t *first = image_decode(file, size, 1, &h, &w, why, sizeof why);
  bool zero = first != NULL;
  for (int64_t i = 0; first && i < (int64_t)h * w; i++) zero = zero && first[i] == 0;
  test_check(zero, "forbidden deflate distance: decodes to zeros (%dx%d) %s", w, h, why);
  for (int round = 0; round < 4; round++) {
#ifdef __GLIBC__
    mallopt(M_PERTURB, 0x21 + round);
#endif
    void *blocks[64];
    for (int i = 0; i < 64; i++) {
      size_t bytes = (size_t)16 << (i % 10);
      blocks[i] = malloc(bytes);
      if (blocks[i]) memset(blocks[i], 0xA5 + round, bytes);
    }
    for (int i = 63; i >= 0; i--) free(blocks[i]);
    uint8_t *again = image_decode(file, size, 1, &h2, &w2, why, sizeof why);
    bool same = (first == NULL) == (again == NULL) &&
                (!first || (h == h2 && w == w2 && memcmp(first, again, (size_t)h * w) == 0));
    test_check(same, "forbidden deflate distance: decode %d equals the first (%dx%d) %s", round + 2,
               w2, h2, why);
    if (again) image_free(again);
  }
#ifdef __GLIBC__
  mallopt(M_PERTURB, 0);
#endif
  if (first) image_free(first);
  free(file);
}

int main(void) {
  snprintf(tmp_root, sizeof tmp_root, "/tmp/swin_test_data_XXXXXX");
  if (!mkdtemp(tmp_root)) {
    perror("mkdtemp");
    return 2;
  }
  TestRng r = {20240611};
  test_fashion_mnist();
  test_idx_files(&r);
  test_imagefolder(&r);
  test_imagefolder_errors(&r);
  test_transforms(&r);
  test_augment_keys(&r);
  test_color_stage(&r);
  test_loader(&r);
  test_loader_error_path();
  test_gpu_decode_option();
  test_skip_bad();
  test_image_refusals();
  test_png_forbidden_distance();
  measure_fashion_throughput();
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_root);
  if (system(cmd) != 0) printf("note: could not remove %s\n", tmp_root);
  return test_finish();
}
