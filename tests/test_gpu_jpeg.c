// test_gpu_jpeg.c: the nvJPEG decode path (data/jpeg_gpu.h, data.decoder = nvjpeg) against
// stb_image, the reference: JPEGs written by stb_image_write of several sizes, gray and RGB,
// 4:2:0 and 4:4:4, decoded in one batch by both; PNGs and damaged JPEGs left to stb; and whole
// loader epochs, whose bytes must not depend on the number of workers. The crop + resize + flip
// on the GPU (kernels/resize.h) must give the CPU transform's bytes on the same decoded pixels,
// exactly: on random plans, through the kernels alone and through the decoder, and over whole
// loader epochs (ImageFolder and shards, train with RandAugment and eval, gray and RGB) against
// the per-sample CPU transform of nvJPEG's whole decoded images. Skips (77) without nvJPEG in
// the build or without a GPU.
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/dataset.h"
#include "data/image.h"
#include "data/jpeg_gpu.h"
#include "data/loader.h"
#include "data/transform.h"
#include "kernels/resize.h"
#include "src/base/config.h"
#include "src/base/util.h"
#include "tests/util/test_plans.h"
#include "tests/util/test_util.h"

#ifdef SWIN_HAVE_NVJPEG
#include "src/base/cuda_util.h"

#define STB_IMAGE_WRITE_IMPLEMENTATION
#include "stb_image_write.h"

// Bounds of nvJPEG against stb on the same file. Both decoders read the same quantized
// coefficients; they differ only in the inverse steps: the IDCT (stb: 12-bit fixed point,
// nvJPEG: its own rounding), YCbCr -> RGB (stb: 20-bit fixed point), and chroma upsampling of
// 4:2:0 (both interpolate: data/jpeg_gpu.c asks nvJPEG for it). Each step rounds to within 1
// level of the exact value, so the two results stay within a few levels: 6 allows two levels of
// IDCT difference carried through the colour matrix (Cr -> R weighs 1.402). Most pixels agree
// or differ by 1, hence a mean below 1 level. These smooth test images keep the upsampling of
// either decoder close to exact, so the bound tests the IDCT and colour rounding.
#define MAX_LEVELS 6
#define MEAN_LEVELS 1.0

static char tmp_root[256];

// Smooth content with a little noise: (h, w, chans), values well inside [0, 255].
static uint8_t *smooth_image(TestRng *r, int h, int w, int chans) {
  uint8_t *p = malloc_check((size_t)h * w * chans);
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++)
      for (int c = 0; c < chans; c++) {
        double v =
            128 + 60 * sin(x / 9.0 + 2 * c) * cos(y / 13.0 - c) + test_rng_uniform(r, -6.0f, 6.0f);
        p[((size_t)y * w + x) * chans + c] = (uint8_t)lrint(v);
      }
  return p;
}

// stb_image_write subsamples chroma 4:2:0 at quality <= 90 and keeps 4:4:4 above.
static void write_jpeg(const char *path, TestRng *r, int h, int w, int chans, int quality) {
  uint8_t *p = smooth_image(r, h, w, chans);
  if (!stbi_write_jpg(path, w, h, chans, p, quality)) {
    fprintf(stderr, "cannot write %s\n", path);
    exit(2);
  }
  free(p);
}

static uint8_t *read_whole(const char *path, size_t *size) {
  Error err;
  uint8_t *f = read_file(path, size, &err);
  if (!f) {
    fprintf(stderr, "%s\n", err.msg);
    exit(2);
  }
  return f;
}

// Damages a JPEG the way stb's checks catch it (image_check): the first Huffman table claims
// 16 x 255 codes, over the 256 a table may hold.
static void break_huffman(uint8_t *f, size_t size) {
  for (size_t i = 0; i + 21 < size; i++)
    if (f[i] == 0xFF && f[i + 1] == 0xC4) {
      memset(f + i + 5, 255, 16);  // FF C4, length (2 bytes), class/id, then the 16 counts
      return;
    }
  fprintf(stderr, "test: no DHT segment in the JPEG\n");
  exit(2);
}

typedef struct {
  int h, w, chans, quality;
} JpegCase;

// Every case decoded by nvJPEG in one batch (to 1 and to 3 channels) and by stb, compared.
static void test_decode_against_stb(TestRng *r) {
  const JpegCase cases[] = {{17, 23, 3, 90},   {64, 64, 3, 90},   {224, 160, 3, 95},
                            {375, 500, 3, 90}, {333, 500, 3, 95}, {9, 8, 1, 90},
                            {64, 48, 1, 95},   {375, 500, 1, 90}};
  enum { N = sizeof cases / sizeof cases[0] };
  uint8_t *files[N];
  size_t sizes[N];
  for (int k = 0; k < N; k++) {
    char path[512];
    snprintf(path, sizeof path, "%s/case%d.jpg", tmp_root, k);
    write_jpeg(path, r, cases[k].h, cases[k].w, cases[k].chans, cases[k].quality);
    files[k] = read_whole(path, &sizes[k]);
  }
  for (int out_chans = 1; out_chans <= 3; out_chans += 2) {
    Error err = {{0}};
    JpegGpu *dec = NULL;
    if (jpeg_gpu_create(&dec, N, out_chans, &err) != 0) {
      test_check(0, "jpeg_gpu_create(%d channels): %s", out_chans, err.msg);
      continue;
    }
    printf("nvJPEG backend: %s\n", jpeg_gpu_backend(dec));
    JpegGpuImage out[N];
    // Twice: the second batch reuses the buffers and the initialized state.
    for (int round = 0; round < 2; round++) {
      if (jpeg_gpu_decode(dec, (const uint8_t *const *)files, sizes, N, out, &err) != 0) {
        test_check(0, "jpeg_gpu_decode: %s", err.msg);
        break;
      }
      for (int k = 0; k < N; k++) {
        const JpegCase *c = &cases[k];
        int h = 0, w = 0;
        char why[256] = "";
        uint8_t *ref = image_decode(files[k], sizes[k], out_chans, &h, &w, why, sizeof why);
        // The hardware backend may refuse tiny images (nvjpegDecodeBatchedSupported); stb
        // then decodes them, which is the design, not a failure.
        bool hardware = strcmp(jpeg_gpu_backend(dec), "hardware") == 0;
        if (ref && !out[k].pixels && hardware && (c->h < 64 || c->w < 64)) {
          printf("note: the hardware backend left %dx%d to stb\n", c->h, c->w);
          image_free(ref);
          continue;
        }
        if (!ref || !out[k].pixels || out[k].h != h || out[k].w != w) {
          test_check(0, "case %dx%dx%d q%d -> %d channels: nvJPEG %s %dx%d, stb %dx%d %s", c->h,
                     c->w, c->chans, c->quality, out_chans, out[k].pixels ? "decoded" : "left it",
                     out[k].h, out[k].w, h, w, why);
          if (ref) image_free(ref);
          continue;
        }
        size_t n = (size_t)h * w * out_chans;
        int worst = 0;
        double sum = 0;
        for (size_t i = 0; i < n; i++) {
          int d = abs((int)out[k].pixels[i] - (int)ref[i]);
          worst = d > worst ? d : worst;
          sum += d;
        }
        double mean = sum / (double)n;
        test_check(worst <= MAX_LEVELS && mean < MEAN_LEVELS,
                   "round %d: %3dx%3dx%d q%d -> %d ch: nvJPEG vs stb max |d| %d (<= %d), mean "
                   "%.3f (< %.1f)",
                   round, c->h, c->w, c->chans, c->quality, out_chans, worst, MAX_LEVELS, mean,
                   MEAN_LEVELS);
        image_free(ref);
      }
    }
    jpeg_gpu_destroy(dec);
  }
  for (int k = 0; k < N; k++) free(files[k]);
}

// What nvJPEG must leave to stb: a PNG, a corrupt JPEG (a Huffman table stb refuses), bytes that
// are no image, a missing file (NULL); the good JPEG beside them is still decoded.
static void test_left_to_stb(TestRng *r) {
  char path[512];
  snprintf(path, sizeof path, "%s/good.jpg", tmp_root);
  write_jpeg(path, r, 96, 128, 3, 90);
  size_t good_size;
  uint8_t *good = read_whole(path, &good_size);
  snprintf(path, sizeof path, "%s/plain.png", tmp_root);
  uint8_t *pixels = smooth_image(r, 30, 20, 3);
  stbi_write_png(path, 20, 30, 3, pixels, 20 * 3);
  free(pixels);
  size_t png_size;
  uint8_t *png = read_whole(path, &png_size);
  uint8_t junk[300];
  for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)test_rng_u64(r);
  uint8_t *broken = malloc_check(good_size);
  memcpy(broken, good, good_size);
  break_huffman(broken, good_size);
  const uint8_t *files[5] = {good, png, broken, junk, NULL};
  size_t sizes[5] = {good_size, png_size, good_size, sizeof junk, 0};
  const char *names[5] = {"JPEG", "PNG", "corrupt JPEG", "junk", "no file"};
  JpegGpu *dec = NULL;
  Error err = {{0}};
  if (jpeg_gpu_create(&dec, 5, 3, &err) != 0) {
    test_check(0, "jpeg_gpu_create: %s", err.msg);
  } else {
    JpegGpuImage out[5];
    int rc = jpeg_gpu_decode(dec, files, sizes, 5, out, &err);
    test_check(rc == 0, "a batch of a JPEG, a PNG, a truncated JPEG, junk, no file: %s",
               rc ? err.msg : "decoded");
    for (int j = 0; rc == 0 && j < 5; j++)
      test_check((out[j].pixels != NULL) == (j == 0), "%-15s %s", names[j],
                 out[j].pixels ? "decoded by nvJPEG" : "left to stb");
    jpeg_gpu_destroy(dec);
  }
  free(good);
  free(png);
  free(broken);
}

// ---- crop + resize + flip on the GPU ----

// nvJPEG's whole decoded images of one batch, copied out of the decoder (its buffer is reused).
typedef struct {
  int n;         // images nvJPEG took
  int file[16];  // which file each is
  int h[16], w[16];
  int64_t at[16];   // byte offsets in pixels
  uint8_t *pixels;  // all of them, packed
  int64_t bytes;
} Decoded;

static Decoded decode_whole(JpegGpu *dec, uint8_t *const *files, const size_t *sizes, int count,
                            int chans) {
  Decoded d = {0};
  JpegGpuImage out[16];
  Error err = {{0}};
  if (jpeg_gpu_decode(dec, (const uint8_t *const *)files, sizes, count, out, &err) != 0) {
    test_check(0, "jpeg_gpu_decode: %s", err.msg);
    return d;
  }
  for (int j = 0; j < count; j++)
    if (out[j].pixels) d.bytes += (int64_t)out[j].h * out[j].w * chans;
  d.pixels = malloc_check((size_t)d.bytes + 1);
  int64_t at = 0;
  for (int j = 0; j < count; j++) {
    if (!out[j].pixels) continue;
    int k = d.n++;
    d.file[k] = j, d.h[k] = out[j].h, d.w[k] = out[j].w, d.at[k] = at;
    memcpy(d.pixels + at, out[j].pixels, (size_t)out[j].h * out[j].w * chans);
    at += (int64_t)out[j].h * out[j].w * chans;
  }
  return d;
}

// The CPU reference of plans[k] on decoded image k, packed as transform_plans_pack packs.
static uint8_t *reference_outputs(const Decoded *d, const TransformPlan *plans, const TestPacked *p,
                                  int chans) {
  uint8_t *want = malloc_check((size_t)p->batch.dst_bytes);
  for (int k = 0; k < d->n; k++)
    transform_apply(&plans[k], d->pixels + d->at[k], chans, want + test_desc(p, k)->dst);
  return want;
}

// resize_batch_cuda alone: the decoded images uploaded, the plans packed and uploaded, the
// intermediate rows and the outputs poisoned with 0x00 and then 0xFF before the kernels run (a
// byte never written fails one of the two). Returns the bytes that differ from want.
static int64_t run_kernels(const Decoded *d, const TestPacked *p, const uint8_t *want,
                           int64_t *compared) {
  uint8_t *src, *tmp, *dst;
  void *packed;
  CUDA_CHECK(cudaMalloc((void **)&src, (size_t)d->bytes + 1));
  CUDA_CHECK(cudaMalloc((void **)&tmp, (size_t)p->batch.tmp_bytes));
  CUDA_CHECK(cudaMalloc((void **)&dst, (size_t)p->batch.dst_bytes));
  CUDA_CHECK(cudaMalloc(&packed, (size_t)p->batch.packed_bytes));
  CUDA_CHECK(cudaMemcpy(src, d->pixels, (size_t)d->bytes, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(packed, p->packed, (size_t)p->batch.packed_bytes, cudaMemcpyHostToDevice));
  uint8_t *got = malloc_check((size_t)p->batch.dst_bytes);
  int64_t differ = 0;
  for (int poison = 0x00; poison <= 0xFF; poison += 0xFF) {
    CUDA_CHECK(cudaMemset(tmp, poison, (size_t)p->batch.tmp_bytes));
    CUDA_CHECK(cudaMemset(dst, poison, (size_t)p->batch.dst_bytes));
    CUDA_CHECK(resize_batch_cuda(src, packed, &p->batch, tmp, dst, 0));
    CUDA_CHECK(cudaMemcpy(got, dst, (size_t)p->batch.dst_bytes, cudaMemcpyDeviceToHost));
    differ += test_bytes_differ(got, want, p->batch.dst_bytes);
    *compared += p->batch.dst_bytes;
  }
  free(got);
  CUDA_CHECK(cudaFree(src));
  CUDA_CHECK(cudaFree(tmp));
  CUDA_CHECK(cudaFree(dst));
  CUDA_CHECK(cudaFree(packed));
  return differ;
}

// The decoder's own path: jpeg_gpu_parse, then jpeg_gpu_decode_parsed with plans (indexed by
// file, as the loader passes them). Returns the bytes that differ from want.
static int64_t run_decoder(JpegGpu *dec, uint8_t *const *files, const size_t *sizes, int count,
                           const Decoded *d, const TransformPlan *plans, const TestPacked *p,
                           const uint8_t *want, int chans, int64_t *compared) {
  JpegGpuImage out[16];
  TransformPlan by_file[16];
  Error err = {{0}};
  memset(by_file, 0, sizeof by_file);  // a file the whole decode left out fails check_plan
  for (int k = 0; k < d->n; k++) by_file[d->file[k]] = plans[k];
  if (jpeg_gpu_parse(dec, (const uint8_t *const *)files, sizes, count, out, &err) != 0 ||
      jpeg_gpu_decode_parsed(dec, by_file, out, &err) != 0) {
    test_check(0, "jpeg_gpu_parse / jpeg_gpu_decode_parsed with plans: %s", err.msg);
    return 1;
  }
  int64_t differ = 0;
  for (int k = 0; k < d->n; k++) {
    const JpegGpuImage *im = &out[d->file[k]];
    int64_t len = (int64_t)plans[k].out_h * plans[k].out_w * chans;
    if (!im->pixels || im->h != d->h[k] || im->w != d->w[k]) {
      test_check(0, "file %d: decoded whole (%dx%d), but not with a plan (%s, %dx%d)", d->file[k],
                 d->h[k], d->w[k], im->pixels ? "decoded" : "left to stb", im->h, im->w);
      differ += len;
      continue;
    }
    differ += test_bytes_differ(im->pixels, want + test_desc(p, k)->dst, len);
    *compared += len;
  }
  return differ;
}

// Random JPEGs (gray and RGB files, 4:2:0 and 4:4:4, 48 to 400 a side) decoded to 1 and to 3
// channels; per batch, random plans of every kind (test_plans.h) run by the kernels and by the
// decoder must give transform_apply's bytes on the decoded pixels: 0 may differ, the weights
// being the same integers and the sums exact.
static void test_resize_against_cpu(TestRng *r) {
  enum { N = 10, ROUNDS = 8 };
  uint8_t *files[N];
  size_t sizes[N];
  for (int k = 0; k < N; k++) {
    char path[512];
    snprintf(path, sizeof path, "%s/resize%d.jpg", tmp_root, k);
    int h = 48 + test_below(r, 353), w = 48 + test_below(r, 353);
    write_jpeg(path, r, h, w, k % 3 == 2 ? 1 : 3, k % 2 ? 90 : 95);
    files[k] = read_whole(path, &sizes[k]);
  }
  for (int chans = 1; chans <= 3; chans += 2) {
    JpegGpu *dec = NULL;
    Error err = {{0}};
    if (jpeg_gpu_create(&dec, N, chans, &err) != 0) {
      test_check(0, "jpeg_gpu_create(%d channels): %s", chans, err.msg);
      continue;
    }
    Decoded d = decode_whole(dec, files, sizes, N, chans);
    if (d.n < N)
      printf("note: nvJPEG left %d of %d files to stb (the hardware backend's limits)\n", N - d.n,
             N);
    int64_t kernel_differ = 0, kernel_bytes = 0, decoder_differ = 0, decoder_bytes = 0;
    int kinds[TEST_PLAN_KINDS] = {0};
    for (int round = 0; round < ROUNDS && d.n > 0; round++) {
      TransformPlan plans[N];
      for (int k = 0; k < d.n; k++) {
        int kind = (round + k) % TEST_PLAN_KINDS;
        plans[k] = test_random_plan(r, d.h[k], d.w[k], kind);
        kinds[kind]++;
      }
      TestPacked p = test_pack(plans, d.n, chans, d.at);
      uint8_t *want = reference_outputs(&d, plans, &p, chans);
      kernel_differ += run_kernels(&d, &p, want, &kernel_bytes);
      decoder_differ +=
          run_decoder(dec, files, sizes, N, &d, plans, &p, want, chans, &decoder_bytes);
      free(want);
      free(p.packed);
    }
    test_check(kernel_differ == 0 && kernel_bytes > 0,
               "resize_batch_cuda vs transform_apply on nvJPEG's pixels, %d channel%s: %d plans "
               "(%d train, %d eval, %d copy-sized, %d arbitrary), two poisons: %lld of %lld "
               "bytes differ (tol 0)",
               chans, chans > 1 ? "s" : "", kinds[0] + kinds[1] + kinds[2] + kinds[3], kinds[0],
               kinds[1], kinds[2], kinds[3], (long long)kernel_differ, (long long)kernel_bytes);
    test_check(decoder_differ == 0 && decoder_bytes > 0,
               "jpeg_gpu_decode_parsed with plans vs transform_apply on its whole decode, %d "
               "channel%s: %lld of %lld bytes differ (tol 0)",
               chans, chans > 1 ? "s" : "", (long long)decoder_differ, (long long)decoder_bytes);
    free(d.pixels);
    jpeg_gpu_destroy(dec);
  }
  for (int k = 0; k < N; k++) free(files[k]);
}

// ---- the loader ----

static void make_dir(const char *path) {
  if (mkdir(path, 0755) != 0) {
    fprintf(stderr, "cannot create test directory %s\n", path);
    exit(2);
  }
}

// root/{train,val}/{a,b}/: 11 JPEGs of varied sizes (64 pixels a side or more) per class, one PNG
// in a/, and, when corrupt, one damaged JPEG in b/ (break_huffman).
static void make_folder(TestRng *r, const char *root, bool corrupt) {
  char path[1024];
  make_dir(root);
  const char *splits[2] = {"train", "val"}, *classes[2] = {"a", "b"};
  for (int s = 0; s < 2; s++) {
    snprintf(path, sizeof path, "%s/%s", root, splits[s]);
    make_dir(path);
    for (int c = 0; c < 2; c++) {
      snprintf(path, sizeof path, "%s/%s/%s", root, splits[s], classes[c]);
      make_dir(path);
      for (int k = 0; k < 11; k++) {
        snprintf(path, sizeof path, "%s/%s/%s/img%02d.jpg", root, splits[s], classes[c], k);
        write_jpeg(path, r, 64 + 13 * k, 120 - 5 * k, 3, k % 2 ? 90 : 95);
      }
    }
    snprintf(path, sizeof path, "%s/%s/a/zz.png", root, splits[s]);
    uint8_t *pixels = smooth_image(r, 50, 70, 3);
    stbi_write_png(path, 70, 50, 3, pixels, 70 * 3);
    free(pixels);
    if (corrupt) {
      snprintf(path, sizeof path, "%s/%s/b/bad.jpg", root, splits[s]);
      write_jpeg(path, r, 64, 64, 3, 90);
      size_t size;
      uint8_t *f = read_whole(path, &size);
      break_huffman(f, size);
      test_write_file(path, f, size);
      free(f);
    }
  }
}

typedef struct {
  uint8_t *pixels;  // (batches * batch, sample bytes)
  int *labels;
  int64_t *samples;
  int batches;
} Epoch;

static void free_epoch(Epoch *e) {
  free(e->pixels);
  free(e->labels);
  free(e->samples);
}

// An epoch of the loader into e. prefetch 0: workers + 1. device_batch: the batches stay on the
// device (the trainer's path) and are copied back here to compare.
static int run_epoch_ring(const Dataset *ds, int workers, int prefetch, bool device_batch, bool gpu,
                          bool train, int batch, Epoch *e, Error *err) {
  LoaderOptions o = {.batch_size = batch,
                     .train = train,
                     .seed = 7,
                     .workers = workers,
                     .prefetch = prefetch > 0 ? prefetch : workers + 1,
                     .device_batch = device_batch,
                     .rank = 0,
                     .world = 1,
                     .gpu_decode = gpu};
  Loader *L;
  if (loader_create(&L, ds, &o, err) != 0) return -1;
  const char *decoder = loader_decoder(L);
  if (strncmp(decoder, gpu ? "nvjpeg, " : "stb", gpu ? 8 : 4) != 0) {
    error_set(err, "loader_decoder says '%s' for a loader with gpu_decode %s", decoder,
              gpu ? "on" : "off");
    loader_destroy(L);
    return -1;
  }
  int64_t per = loader_batches_per_epoch(L);
  size_t bytes = (size_t)dataset_sample_bytes(ds);
  *e = (Epoch){calloc_check((size_t)(per * batch) * bytes, 1),
               calloc_check((size_t)(per * batch), sizeof(int)),
               calloc_check((size_t)(per * batch), sizeof(int64_t)), (int)per};
  int rc = 0;
  for (int64_t k = 0; k < per && rc == 0; k++) {
    Batch *b;
    rc = loader_next(L, &b, err);
    if (rc != 0) break;
    uint8_t *dst = e->pixels + (size_t)k * batch * bytes;
    if (device_batch) {
      cudaError_t ce =
          b->device_pixels
              ? cudaMemcpy(dst, b->device_pixels, (size_t)b->count * bytes, cudaMemcpyDeviceToHost)
              : cudaErrorInvalidValue;
      if (ce != cudaSuccess) {
        rc = error_set(err, "device batch %lld: %s", (long long)k,
                       b->device_pixels ? cudaGetErrorString(ce) : "no device_pixels");
        loader_release_batch(L, b);
        break;
      }
      // Poisoned before the slot goes back: a byte the next fill of it misses shows.
      if (ce == cudaSuccess) ce = cudaMemset(b->device_pixels, 0xA5, (size_t)b->count * bytes);
      if (ce != cudaSuccess) {
        rc = error_set(err, "device batch %lld: poisoning: %s", (long long)k,
                       cudaGetErrorString(ce));
        loader_release_batch(L, b);
        break;
      }
    } else {
      memcpy(dst, b->pixels, (size_t)b->count * bytes);
    }
    memcpy(e->labels + k * batch, b->labels, sizeof(int) * (size_t)b->count);
    memcpy(e->samples + k * batch, b->samples, sizeof(int64_t) * (size_t)b->count);
    loader_release_batch(L, b);
  }
  loader_destroy(L);
  if (rc != 0) free_epoch(e);
  return rc;
}

static int run_epoch(const Dataset *ds, int workers, bool gpu, bool train, int batch, Epoch *e,
                     Error *err) {
  return run_epoch_ring(ds, workers, 0, false, gpu, train, batch, e, err);
}

static Config folder_config(const char *root, bool skip_bad) {
  Config cfg;
  config_defaults(&cfg);
  snprintf(cfg.dataset, sizeof cfg.dataset, "imagefolder");
  snprintf(cfg.path, sizeof cfg.path, "%s", root);
  cfg.img_h = cfg.img_w = 32;
  cfg.in_chans = 3;
  cfg.skip_bad = skip_bad;
  return cfg;
}

// decoder=nvjpeg: an epoch with 1 and with 4 workers gives the same bytes (train and eval); the
// PNG's sample is the same as with stb (stb decodes it either way), and the JPEGs' within the
// decoders' difference.
static void test_loader_epochs(TestRng *r) {
  char root[512];
  snprintf(root, sizeof root, "%s/folder", tmp_root);
  make_folder(r, root, false);
  Config cfg = folder_config(root, false);
  for (int train = 1; train >= 0; train--) {
    Dataset *ds = NULL;
    Error err = {{0}};
    if (dataset_open(&ds, &cfg, train ? "train" : "val", &err) != 0) {
      test_check(0, "dataset_open: %s", err.msg);
      return;
    }
    Epoch one, four, stb;
    int batch = 5;
    if (run_epoch(ds, 1, true, train, batch, &one, &err) != 0 ||
        run_epoch(ds, 4, true, train, batch, &four, &err) != 0 ||
        run_epoch(ds, 2, false, train, batch, &stb, &err) != 0) {
      test_check(0, "loader epoch: %s", err.msg);
      dataset_close(ds);
      return;
    }
    size_t bytes = (size_t)dataset_sample_bytes(ds), count = (size_t)one.batches * batch;
    // Eval's last batch is partial: compare only the samples produced.
    if (!train) count = (size_t)dataset_size(ds);
    bool same = memcmp(one.pixels, four.pixels, count * bytes) == 0 &&
                memcmp(one.labels, four.labels, count * sizeof(int)) == 0;
    test_check(same, "%s epoch, decoder=nvjpeg: 1 and 4 workers give identical bytes (%zu images)",
               train ? "train" : "eval", count);
    // The PNG is the last file of class a: dataset index 11 (a/img00..img10, then zz.png).
    int64_t png = 11;
    int worst_png = -1;
    double sum = 0;
    for (size_t s = 0; s < count; s++) {
      const uint8_t *p = one.pixels + s * bytes, *q = stb.pixels + s * bytes;
      for (size_t i = 0; i < bytes; i++) {
        int d = abs((int)p[i] - (int)q[i]);
        sum += d;
        if (one.samples[s] == png && d > worst_png) worst_png = d;
      }
      if (one.samples[s] == png && worst_png < 0) worst_png = 0;
    }
    if (worst_png >= 0)
      test_check(worst_png == 0, "%s epoch: the PNG's sample equals stb's (max |d| %d)",
                 train ? "train" : "eval", worst_png);
    else  // training drops the last partial batch, which may hold it
      printf("note: the PNG is not in this train epoch's full batches\n");
    double mean = sum / (double)(count * bytes);
    test_check(mean < MEAN_LEVELS, "%s epoch: nvjpeg vs stb batches, mean |d| %.3f (< %.1f)",
               train ? "train" : "eval", mean, MEAN_LEVELS);
    free_epoch(&one);
    free_epoch(&four);
    free_epoch(&stb);
    dataset_close(ds);
  }
}

// A damaged JPEG with decoder=nvjpeg: without skip_bad the error names the file as the stb path
// does; with skip_bad it is replaced and counted, and the epoch still does not depend on workers.
static void test_loader_bad_file(TestRng *r) {
  char root[512];
  snprintf(root, sizeof root, "%s/bad_folder", tmp_root);
  make_folder(r, root, true);
  for (int skip = 0; skip <= 1; skip++) {
    Config cfg = folder_config(root, skip);
    Dataset *ds = NULL;
    Error err = {{0}};
    if (dataset_open(&ds, &cfg, "val", &err) != 0) {
      test_check(0, "dataset_open: %s", err.msg);
      return;
    }
    Epoch one, four;
    int rc1 = run_epoch(ds, 1, true, false, 4, &one, &err);
    if (!skip) {
      test_check(rc1 != 0 && strstr(err.msg, "bad.jpg") && strstr(err.msg, "data.skip_bad"),
                 "damaged JPEG, skip_bad=false: %s", rc1 ? err.msg : "no error");
    } else {
      int rc4 = rc1 == 0 ? run_epoch(ds, 4, true, false, 4, &four, &err) : -1;
      size_t n = (size_t)dataset_size(ds), bytes = (size_t)dataset_sample_bytes(ds);
      test_check(rc1 == 0 && rc4 == 0 && dataset_bad_count(ds) == 1 &&
                     memcmp(one.pixels, four.pixels, n * bytes) == 0,
                 "damaged JPEG, skip_bad=true: replaced, %lld bad, 1 and 4 workers equal %s",
                 (long long)dataset_bad_count(ds), rc1 || rc4 ? err.msg : "");
      if (rc4 == 0) free_epoch(&four);
    }
    if (rc1 == 0) free_epoch(&one);
    dataset_close(ds);
  }
}

// ---- whole epochs against the CPU transform of nvJPEG's whole images ----

// root/{train,val}/shard-00{0,1}.tar: 12 JPEGs each (NNNNNN.jpg + NNNNNN.cls, 3 classes) of
// varied sizes.
static void make_shards(TestRng *r, const char *root) {
  char path[1024];
  make_dir(root);
  const char *splits[2] = {"train", "val"};
  for (int s = 0; s < 2; s++) {
    snprintf(path, sizeof path, "%s/%s", root, splits[s]);
    make_dir(path);
    for (int t = 0; t < 2; t++) {
      snprintf(path, sizeof path, "%s/%s/shard-%03d.tar", root, splits[s], t);
      FILE *f = fopen(path, "wb");
      if (!f) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
      }
      for (int k = 0; k < 12; k++) {
        int id = t * 12 + k;
        char jpg[600], name[32], cls[16];
        snprintf(jpg, sizeof jpg, "%s/shard_sample.jpg", root);
        write_jpeg(jpg, r, 70 + 9 * k, 130 - 6 * k, 3, k % 2 ? 90 : 95);
        size_t size;
        uint8_t *bytes = read_whole(jpg, &size);
        snprintf(name, sizeof name, "%06d.jpg", id);
        test_tar_member(f, name, '0', bytes, size);
        free(bytes);
        snprintf(name, sizeof name, "%06d.cls", id);
        snprintf(cls, sizeof cls, "%d\n", id % 3);
        test_tar_member(f, name, '0', cls, strlen(cls));
      }
      static const unsigned char end[1024];
      if (fwrite(end, 1, sizeof end, f) != sizeof end || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
      }
    }
  }
}

// The previous nvJPEG path, per sample, as the reference: each of the epoch's batches (the
// same samples, in the same batch, as the loader's) decoded whole by nvJPEG in one call, then
// the CPU transform of each decoded image (dataset_load_decoded_sample), or stb's path for what
// nvJPEG leaves (dataset_load_sample).
static int reference_epoch(const Dataset *ds, bool train, int batch, const Epoch *e, int64_t count,
                           Epoch *ref, Error *err) {
  size_t bytes = (size_t)dataset_sample_bytes(ds);
  *ref = (Epoch){calloc_check((size_t)count, bytes), calloc_check((size_t)count, sizeof(int)), NULL,
                 e->batches};
  JpegGpu *dec = NULL;
  if (jpeg_gpu_create(&dec, batch, dataset_channels(ds), err) != 0) return -1;
  int rc = 0;
  for (int64_t first = 0; first < count && rc == 0; first += batch) {
    int n = (int)(count - first < batch ? count - first : batch);
    uint8_t *files[16];
    size_t sizes[16];
    JpegGpuImage out[16];
    for (int j = 0; j < n; j++)
      files[j] = dataset_sample_file(ds, e->samples[first + j], &sizes[j]);
    rc = jpeg_gpu_decode(dec, (const uint8_t *const *)files, sizes, n, out, err);
    for (int j = 0; j < n && rc == 0; j++) {
      int64_t i = e->samples[first + j];
      uint8_t *px = ref->pixels + (size_t)(first + j) * bytes;
      int *label = &ref->labels[first + j];
      rc = out[j].pixels ? dataset_load_decoded_sample(ds, i, train, 7, 0, out[j].pixels, out[j].h,
                                                       out[j].w, px, label, err)
                         : dataset_load_sample(ds, i, train, 7, 0, px, label, err);
    }
    for (int j = 0; j < n; j++) free(files[j]);
  }
  jpeg_gpu_destroy(dec);
  if (rc != 0) free_epoch(ref);
  return rc;
}

// decoder=nvjpeg with the crop + resize + flip on the GPU: epochs with 1 and 3 workers equal
// each other and, byte for byte, the previous path (reference_epoch): ImageFolder (with a PNG,
// which stb decodes) and shards; train with RandAugment and a random filter per sample (the
// colour part continues the plan's draws) and eval; RGB at 36x36 and gray at 40x48 (eval's
// non-square resize).
static void test_loader_exact(TestRng *r) {
  char folder[512], shards[512];
  snprintf(folder, sizeof folder, "%s/exact_folder", tmp_root);
  snprintf(shards, sizeof shards, "%s/exact_shards", tmp_root);
  make_folder(r, folder, false);
  make_shards(r, shards);
  for (int chans = 3; chans >= 1; chans -= 2) {
    for (int kind = 0; kind < 2; kind++) {
      Config cfg = folder_config(kind == 0 ? folder : shards, false);
      snprintf(cfg.dataset, sizeof cfg.dataset, "%s", kind == 0 ? "imagefolder" : "shards");
      cfg.in_chans = chans;
      cfg.img_h = chans == 3 ? 36 : 40;
      cfg.img_w = chans == 3 ? 36 : 48;
      snprintf(cfg.randaugment, sizeof cfg.randaugment, "rand-m9-mstd0.5-inc1");
      snprintf(cfg.interpolation, sizeof cfg.interpolation, "random");
      for (int train = 1; train >= 0; train--) {
        Dataset *ds = NULL;
        Error err = {{0}};
        if (dataset_open(&ds, &cfg, train ? "train" : "val", &err) != 0) {
          test_check(0, "dataset_open: %s", err.msg);
          return;
        }
        int batch = 5;
        Epoch one, three, ref;
        if (run_epoch(ds, 1, true, train, batch, &one, &err) != 0) {
          test_check(0, "loader epoch: %s", err.msg);
          dataset_close(ds);
          return;
        }
        int64_t count = train ? (int64_t)one.batches * batch : dataset_size(ds);
        if (run_epoch(ds, 3, true, train, batch, &three, &err) != 0) {
          test_check(0, "loader epoch: %s", err.msg);
          free_epoch(&one);
          dataset_close(ds);
          return;
        }
        if (reference_epoch(ds, train, batch, &one, count, &ref, &err) != 0) {
          test_check(0, "reference epoch: %s", err.msg);
          free_epoch(&one);
          free_epoch(&three);
          dataset_close(ds);
          return;
        }
        // The trainer's path: batches left on the device, two workers sharing a ring of one.
        Epoch dev;
        if (run_epoch_ring(ds, 2, 1, true, true, train, batch, &dev, &err) != 0) {
          test_check(0, "loader epoch into device batches: %s", err.msg);
          free_epoch(&one);
          free_epoch(&three);
          free_epoch(&ref);
          dataset_close(ds);
          return;
        }
        size_t bytes = (size_t)dataset_sample_bytes(ds);
        int64_t dev_differ =
            test_bytes_differ(one.pixels, dev.pixels, (int64_t)count * (int64_t)bytes);
        test_check(
            dev_differ == 0 && memcmp(one.labels, dev.labels, sizeof(int) * (size_t)count) == 0,
            "%s %s epoch, %dx%dx%d: device batches (2 workers, a ring of 1) against host "
            "batches (1 worker, a ring of 2): %lld of %lld bytes differ (tol 0)",
            kind == 0 ? "imagefolder" : "shards", train ? "train" : "eval", cfg.img_h, cfg.img_w,
            chans, (long long)dev_differ, (long long)count * (long long)bytes);
        free_epoch(&dev);
        bool workers_same =
            memcmp(one.pixels, three.pixels, (size_t)count * bytes) == 0 &&
            memcmp(one.labels, three.labels, sizeof(int) * (size_t)count) == 0 &&
            memcmp(one.samples, three.samples, sizeof(int64_t) * (size_t)count) == 0;
        int64_t differ = test_bytes_differ(one.pixels, ref.pixels, (int64_t)count * (int64_t)bytes);
        bool labels_same = memcmp(one.labels, ref.labels, sizeof(int) * (size_t)count) == 0;
        test_check(workers_same && differ == 0 && labels_same,
                   "%s %s epoch, %dx%dx%d, GPU resize: 1 and 3 workers %s; vs the CPU transform "
                   "of nvJPEG's whole images, %lld of %lld bytes differ (tol 0), labels %s",
                   kind == 0 ? "imagefolder" : "shards", train ? "train" : "eval", cfg.img_h,
                   cfg.img_w, chans, workers_same ? "identical" : "DIFFER", (long long)differ,
                   (long long)count * (long long)bytes, labels_same ? "equal" : "DIFFER");
        free_epoch(&one);
        free_epoch(&three);
        free_epoch(&ref);
        dataset_close(ds);
      }
    }
  }
}

int main(void) {
  if (!cuda_device_available()) {
    printf("SKIP: no CUDA device\n");
    return 77;
  }
  snprintf(tmp_root, sizeof tmp_root, "/tmp/swin_test_gpu_jpeg_XXXXXX");
  if (!mkdtemp(tmp_root)) {
    perror("mkdtemp");
    return 2;
  }
  TestRng r = {20261201};
  test_decode_against_stb(&r);
  test_left_to_stb(&r);
  test_resize_against_cpu(&r);
  test_loader_epochs(&r);
  test_loader_bad_file(&r);
  test_loader_exact(&r);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_root);
  if (system(cmd) != 0) printf("note: could not remove %s\n", tmp_root);
  return test_finish();
}

#else

int main(void) {
  printf("SKIP: this build has no nvJPEG (data/jpeg_gpu.h)\n");
  return 77;
}

#endif
