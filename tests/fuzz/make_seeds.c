// make_seeds.c: writes the seed corpus of the fuzz harnesses (tests/fuzz/corpus/fuzz_<name>/
// seed-*): small valid inputs of every kind each harness reads, so that fuzzing starts from
// the formats' real structure. The files are committed; this program says how they were made.
//   fuzz_make_seeds SOURCE_DIR OUT_DIR      (OUT_DIR/fuzz_<name>/ must exist)
#define _XOPEN_SOURCE 700
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/config.h"
#include "src/io/checkpoint.h"
#include "src/io/import.h"
#include "src/io/safetensors.h"
#include "src/model/model.h"
#include "tests/fuzz/fuzz.h"

#define STB_IMAGE_WRITE_IMPLEMENTATION
#include "stb_image_write.h"

static const char *out_dir;

static void put(const char *harness, const char *name, const void *data, size_t size) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s/seed-%s", out_dir, harness, name);
  FILE *f = fopen(path, "wb");
  if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
    perror(path);
    exit(1);
  }
}

static unsigned char *slurp(const char *path, size_t *size) {
  Error err;
  unsigned char *data = read_file(path, size, &err);
  if (!data) {
    fprintf(stderr, "%s\n", err.msg);
    exit(1);
  }
  return data;
}

// Renames the checksum key in place (same length, so nothing moves): the reader verifies only
// a key named swin.checksum, so mutations of this copy reach the checks behind the checksum.
static void drop_checksum(unsigned char *data, size_t size) {
  static const char key[] = "\"swin.checksum\"";
  for (size_t i = 0; i + sizeof key - 1 <= size; i++)
    if (memcmp(data + i, key, sizeof key - 1) == 0) {
      memcpy(data + i, "\"swin.nochecks\"", sizeof key - 1);
      return;
    }
  fprintf(stderr, "no checksum key to drop\n");
  exit(1);
}

// Puts a file written by the library into both safetensors corpora, with and without its
// checksum.
static void put_weights_file(const char *path, const char *name) {
  size_t size;
  unsigned char *data = slurp(path, &size);
  char unchecked[128];
  snprintf(unchecked, sizeof unchecked, "%s-unchecked", name);
  put("fuzz_safetensors", name, data, size);
  put("fuzz_checkpoint", name, data, size);
  drop_checksum(data, size);
  put("fuzz_safetensors", unchecked, data, size);
  put("fuzz_checkpoint", unchecked, data, size);
  free(data);
}

static void seed_weights(const char *tmp) {
  Config cfg;
  Error err;
  Model m;
  fuzz_tiny_config(&cfg);
  if (config_validate(&cfg, &err) != 0 || model_create(&m, &cfg, NULL, 0, &err) != 0) {
    fprintf(stderr, "%s\n", err.msg);
    exit(1);
  }
  model_init_weights(&m, 1);
  float *exp_avg = malloc_check(sizeof(float) * (size_t)m.num_floats);
  float *exp_avg_sq = malloc_check(sizeof(float) * (size_t)m.num_floats);
  for (int64_t i = 0; i < m.num_floats; i++) {
    exp_avg[i] = 0.01f * m.weights[i];
    exp_avg_sq[i] = 1e-4f * m.weights[i] * m.weights[i];
  }
  TrainState state = {.step = 3, .epoch = 1, .batch = 1, .seed = 0, .loss_scale = 1};
  char path[1024];
  if (checkpoint_save(tmp, &m, exp_avg, exp_avg_sq, NULL, &state, NULL, 1, path, sizeof path,
                      &err) != 0) {
    fprintf(stderr, "%s\n", err.msg);
    exit(1);
  }
  put_weights_file(path, "checkpoint");
  remove(path);
  const char *dtypes[3] = {"f32", "bf16", "f16"};
  const DType types[3] = {DTYPE_F32, DTYPE_BF16, DTYPE_F16};
  for (int d = 0; d < 3; d++) {
    char name[64];
    snprintf(path, sizeof path, "%s/export.safetensors", tmp);
    snprintf(name, sizeof name, "export-%s", dtypes[d]);
    if (export_weights(&m, path, types[d], NULL, &err) != 0) {
      fprintf(stderr, "%s\n", err.msg);
      exit(1);
    }
    put_weights_file(path, name);
    remove(path);
  }

  // The official layout: downsample at the end of the previous stage, head.{weight,bias}.
  SafeTensorWriter w;
  safetensors_writer_init(&w);
  char(*names)[128] = malloc_check(sizeof *names * (size_t)m.num_params);
  for (int i = 0; i < m.num_params; i++) {
    const Param *p = &m.params[i];
    int stage, n = 0;
    if (sscanf(p->t.name, "layers.%d.downsample.%n", &stage, &n) == 1 && n > 0)
      snprintf(names[i], sizeof names[i], "layers.%d.downsample.%s", stage - 1, p->t.name + n);
    else if (strncmp(p->t.name, "head.fc.", 8) == 0)
      snprintf(names[i], sizeof names[i], "head.%s", p->t.name + 8);
    else
      snprintf(names[i], sizeof names[i], "%s", p->t.name);
    safetensors_writer_add(&w, names[i], DTYPE_F32, p->t.ndim, p->t.shape, m.weights + p->offset);
  }
  snprintf(path, sizeof path, "%s/official.safetensors", tmp);
  if (safetensors_writer_save(&w, path, &err) != 0) exit(1);
  safetensors_writer_free(&w);
  free(names);
  put_weights_file(path, "official");
  remove(path);

  // swin_predict inputs of 1 and 2 images (B, H, W, C).
  float pixels[2 * 8 * 8];
  for (int i = 0; i < 2 * 8 * 8; i++) pixels[i] = (float)(i % 17) / 8.0f - 1.0f;
  for (int b = 1; b <= 2; b++) {
    safetensors_writer_init(&w);
    safetensors_writer_add(&w, "input", DTYPE_F32, 4, (int64_t[]){b, 8, 8, 1}, pixels);
    snprintf(path, sizeof path, "%s/input.safetensors", tmp);
    if (safetensors_writer_save(&w, path, &err) != 0) exit(1);
    safetensors_writer_free(&w);
    char name[32];
    snprintf(name, sizeof name, "input-%d", b);
    put_weights_file(path, name);
    remove(path);
  }
  // The smallest files: no tensors, metadata only.
  static const char empty[] = "\x08\0\0\0\0\0\0\0{}      ";
  put("fuzz_safetensors", "empty", empty, 16);
  static const char meta[] = "\x18\0\0\0\0\0\0\0{\"__metadata__\":{\"a\":\"b\"}}";
  put("fuzz_safetensors", "metadata-only", meta, 8 + 24);
  free(exp_avg);
  free(exp_avg_sq);
  model_destroy(&m);
}

static void seed_configs(const char *source) {
  const char *names[] = {"fashion_mnist", "swin_tiny", "swin_base"};
  for (int i = 0; i < 3; i++) {
    char path[1024];
    snprintf(path, sizeof path, "%s/configs/%s.ini", source, names[i]);
    size_t size;
    unsigned char *text = slurp(path, &size);
    put("fuzz_config", names[i], text, size);
    free(text);
  }
  static const char with_overrides[] =
      "run_dir = \"runs/x # y\"\n[model]\nimg_size = 32,64\ndepths = 2,2\nnum_heads = 2,4\n"
      "window_size = 4\n[data]\nmean = 0.5\nstd = 0.25\nskip_bad = yes\n"
      "\0train.lr=1e-3\0model.embed_dim=32\0data.hflip=0\0ckpt.keep=2";
  put("fuzz_config", "overrides", with_overrides, sizeof with_overrides - 1);
}

// IDX: 3 images of 5x4 and their labels, plain and as gzip files.
static void put_le32(unsigned char *p, unsigned v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void put_be32(unsigned char *p, unsigned v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * (3 - i)));
}

static unsigned crc32_of(const unsigned char *p, size_t n) {
  unsigned crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; i++) {
    crc ^= p[i];
    for (int k = 0; k < 8; k++) crc = (crc & 1) ? 0xEDB88320u ^ (crc >> 1) : crc >> 1;
  }
  return crc ^ 0xFFFFFFFFu;
}

// A gzip member around deflate data from stb (zlib format: 2 header bytes and a 4-byte Adler
// trailer stripped). flags: FNAME (8) adds a file name, FEXTRA (4) an extra field, FHCRC (2) a
// header CRC.
static unsigned char *gzip(const unsigned char *data, int n, int flags, size_t *size) {
  int zlen = 0;
  unsigned char *z = stbi_zlib_compress((unsigned char *)data, n, &zlen, 8);
  unsigned char *out = malloc_check((size_t)zlen + 64);
  size_t pos = 0;
  const unsigned char head[10] = {0x1F, 0x8B, 8, (unsigned char)flags, 0, 0, 0, 0, 0, 3};
  memcpy(out, head, 10), pos = 10;
  if (flags & 4) {
    memcpy(out + pos, "\x04\0ab\x01\x02", 6);
    pos += 6;
  }
  if (flags & 8) {
    memcpy(out + pos, "idx\0", 4);
    pos += 4;
  }
  if (flags & 2) {
    unsigned c = crc32_of(out, pos);
    out[pos++] = (unsigned char)c;
    out[pos++] = (unsigned char)(c >> 8);
  }
  memcpy(out + pos, z + 2, (size_t)zlen - 6);
  pos += (size_t)zlen - 6;
  put_le32(out + pos, crc32_of(data, (size_t)n));
  put_le32(out + pos + 4, (unsigned)n);
  *size = pos + 8;
  STBIW_FREE(z);
  return out;
}

static void put_idx_pair(const char *name, const unsigned char *images, size_t image_size,
                         const unsigned char *labels, size_t label_size) {
  size_t size = 4 + image_size + label_size;
  unsigned char *input = malloc_check(size);
  put_le32(input, (unsigned)image_size);
  memcpy(input + 4, images, image_size);
  memcpy(input + 4 + image_size, labels, label_size);
  put("fuzz_idx", name, input, size);
  free(input);
}

static void seed_idx(void) {
  enum { N = 3, H = 5, W = 4 };
  unsigned char images[16 + N * H * W], labels[8 + N];
  put_be32(images, 0x803), put_be32(images + 4, N), put_be32(images + 8, H),
      put_be32(images + 12, W);
  for (int i = 0; i < N * H * W; i++) images[16 + i] = (unsigned char)(i * 37);
  put_be32(labels, 0x801), put_be32(labels + 4, N);
  for (int i = 0; i < N; i++) labels[8 + i] = (unsigned char)(i * 4);
  put_idx_pair("plain", images, sizeof images, labels, sizeof labels);
  const int flag_sets[3] = {0, 8, 4 | 2};
  const char *names[3] = {"gzip", "gzip-name", "gzip-extra-hcrc"};
  for (int k = 0; k < 3; k++) {
    size_t gi, gl;
    unsigned char *zi = gzip(images, sizeof images, flag_sets[k], &gi);
    unsigned char *zl = gzip(labels, sizeof labels, flag_sets[k], &gl);
    put_idx_pair(names[k], zi, gi, zl, gl);
    free(zi);
    free(zl);
  }
}

// An encoded image (the seeds are tiny).
typedef struct {
  unsigned char bytes[16384];
  size_t len;
} Encoded;

static void append_bytes(void *context, void *data, int size) {
  Encoded *e = context;
  if (e->len + (size_t)size > sizeof e->bytes) exit(1);
  memcpy(e->bytes + e->len, data, (size_t)size);
  e->len += (size_t)size;
}

static void seed_images(void) {
  unsigned char pixels[9 * 7 * 4];
  for (size_t i = 0; i < sizeof pixels; i++) pixels[i] = (unsigned char)(i * 29 + 7);
  struct {
    const char *name;
    bool jpeg;
    int w, h, chans;
  } images[] = {{"gray.png", false, 5, 7, 1},
                {"rgb.png", false, 6, 5, 3},
                {"rgba.png", false, 4, 4, 4},
                {"rgb.jpg", true, 9, 7, 3},
                {"gray.jpg", true, 8, 8, 1}};
  for (size_t k = 0; k < sizeof images / sizeof images[0]; k++) {
    static Encoded e;
    e.len = 0;
    int ok = images[k].jpeg
                 ? stbi_write_jpg_to_func(append_bytes, &e, images[k].w, images[k].h,
                                          images[k].chans, pixels, 90)
                 : stbi_write_png_to_func(append_bytes, &e, images[k].w, images[k].h,
                                          images[k].chans, pixels, images[k].w * images[k].chans);
    if (!ok) exit(1);
    put("fuzz_image", images[k].name, e.bytes, e.len);
    put("fuzz_decode", images[k].name, e.bytes, e.len);
  }
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: fuzz_make_seeds SOURCE_DIR OUT_DIR\n");
    return 2;
  }
  out_dir = argv[2];
  char tmp[] = "/tmp/swin_seeds_XXXXXX";
  if (!mkdtemp(tmp)) return 1;
  seed_weights(tmp);
  seed_configs(argv[1]);
  seed_idx();
  seed_images();
  remove(tmp);
  printf("seeds written to %s\n", out_dir);
  return 0;
}
