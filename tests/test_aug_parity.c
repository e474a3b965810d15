#define _POSIX_C_SOURCE 200809L  // strtok_r
// test_aug_parity.c: swin.c's augmentations against timm, torchvision and Pillow, on the fixtures
// of scripts/make_aug_fixtures.py (tests/fixtures/augment/aug_parity.safetensors): real
// Fashion-MNIST pixels and synthetic photo-like RGB images.
//
// Tolerances, and why they are what they are:
//   uint8 image ops (RandAugment's 15 ops, RandomResizedCrop's resize, the eval resize + center
//   crop, ColorJitter's adjustments): 0 differing bytes. image_ops.c repeats Pillow's integer and
//   fixed-point arithmetic (22-bit resampling coefficients, 16-bit luma, LUTs) and its float/double
//   expressions in Pillow's order, so rounding is the same, not merely close; a single byte off is
//   a bug. RandAugment's level functions: the argument equal to timm's double exactly. Random
//   erasing, mixup, cutmix, soft targets: bitwise (the same fp32 operations as PyTorch's, and the
//   erase fill is swin.c's generator, ported to numpy fp32 by the fixture script). Soft-target
//   cross entropy: fp32 logits, double sums, gradient rounded to fp32: rel err <= 1e-6 for the
//   gradient, |loss - ref| <= 1e-6 * loss against timm in float64.
#include <stdlib.h>

#include "data/batch_augment.h"
#include "data/image_ops.h"
#include "data/randaugment.h"
#include "data/transform.h"
#include "kernels/augment.h"
#include "kernels/loss.h"
#include "src/io/safetensors.h"
#include "tests/util/test_util.h"

#ifndef SWIN_SOURCE_DIR
#define SWIN_SOURCE_DIR "."
#endif

static const void *find(const SafeTensors *st, const char *name, DType dtype, int64_t *numel) {
  const SafeTensorEntry *e = safetensors_find(st, name);
  if (!e || e->dtype != dtype) {
    test_check(0, "fixture tensor '%s' missing or of the wrong type", name);
    return NULL;
  }
  int64_t n = 1;
  for (int i = 0; i < e->ndim; i++) n *= e->shape[i];
  if (numel) *numel = n;
  return safetensors_entry_data(st, e);
}

// The input image img/<name>: (h, w, chans).
static const uint8_t *image(const SafeTensors *st, const char *name, int *h, int *w, int *chans) {
  char key[128];
  snprintf(key, sizeof key, "img/%s", name);
  const SafeTensorEntry *e = safetensors_find(st, key);
  if (!e || e->ndim != 3) return NULL;
  *h = (int)e->shape[0], *w = (int)e->shape[1], *chans = (int)e->shape[2];
  return safetensors_entry_data(st, e);
}

static int64_t bytes_differ(const uint8_t *a, const uint8_t *b, int64_t n, int *max_diff) {
  int64_t differ = 0;
  for (int64_t i = 0; i < n; i++) {
    int d = abs((int)a[i] - (int)b[i]);
    differ += d != 0;
    if (d > *max_diff) *max_diff = d;
  }
  return differ;
}

static bool parse_op(const char *name, RandAugmentOp *op, bool *increasing) {
  for (int inc = 1; inc >= 0; inc--)
    for (int o = 0; o < RA_NUM_OPS; o++)
      if (strcmp(randaugment_op_name((RandAugmentOp)o, inc), name) == 0) {
        *op = (RandAugmentOp)o;
        *increasing = inc;
        return true;
      }
  return false;
}

typedef struct {
  int cases, arg_bad;
  int64_t bytes, differ;
  int max_diff;
} OpStats;

// One ra/<img>/<Op>/<m>/<sign>/<interp> case into stats[op].
static void randaugment_case(const SafeTensors *st, const SafeTensorEntry *e, OpStats *stats,
                             const uint8_t *fill_rgb, uint8_t fill_l) {
  char name[256], *save = NULL;
  snprintf(name, sizeof name, "%s", e->name);
  strtok_r(name, "/", &save);
  const char *img_name = strtok_r(NULL, "/", &save), *op_name = strtok_r(NULL, "/", &save);
  const char *mag = strtok_r(NULL, "/", &save), *sign = strtok_r(NULL, "/", &save);
  const char *interp = strtok_r(NULL, "/", &save);
  RandAugmentOp op;
  bool inc;
  int h, w, C;
  const uint8_t *src = img_name ? image(st, img_name, &h, &w, &C) : NULL;
  if (!interp || !src || !parse_op(op_name, &op, &inc)) {
    test_check(0, "fixture case '%s' not understood", e->name);
    return;
  }
  double arg = randaugment_op_arg(op, inc, strtod(mag, NULL), strcmp(sign, "neg") == 0);
  const char *want_arg = safetensors_meta_get(st, e->name);
  OpStats *s = &stats[op * 2 + inc];
  if (want_arg && strcmp(want_arg, "none") != 0 && strtod(want_arg, NULL) != arg) {
    s->arg_bad++;
    printf("     %s: argument %.17g, timm %s\n", e->name, arg, want_arg);
  }
  int64_t n = (int64_t)h * w * C;
  uint8_t *img = malloc_check((size_t)n), *scratch = malloc_check((size_t)n);
  memcpy(img, src, (size_t)n);
  uint8_t fill[3] = {fill_l, fill_l, fill_l};
  if (C == 3) memcpy(fill, fill_rgb, 3);
  randaugment_apply(op, arg, strcmp(interp, "bicubic") == 0 ? INTERP_BICUBIC : INTERP_BILINEAR,
                    fill, img, h, w, C, scratch);
  const uint8_t *want = safetensors_entry_data(st, e);
  int64_t d = bytes_differ(img, want, n, &s->max_diff);
  if (d) printf("     %s: %lld of %lld bytes differ\n", e->name, (long long)d, (long long)n);
  s->cases++;
  s->bytes += n;
  s->differ += d;
  free(img);
  free(scratch);
}

static void test_randaugment(const SafeTensors *st) {
  OpStats stats[RA_NUM_OPS * 2];
  memset(stats, 0, sizeof stats);
  uint8_t fill_rgb[3] = {0};
  const char *f = safetensors_meta_get(st, "fill_rgb"), *fl = safetensors_meta_get(st, "fill_l");
  if (!f || !fl || sscanf(f, "%hhu,%hhu,%hhu", &fill_rgb[0], &fill_rgb[1], &fill_rgb[2]) != 3) {
    test_check(0, "fixture metadata fill_rgb / fill_l missing");
    return;
  }
  for (int i = 0; i < st->count; i++)
    if (strncmp(st->entries[i].name, "ra/", 3) == 0)
      randaugment_case(st, &st->entries[i], stats, fill_rgb, (uint8_t)atoi(fl));
  int total = 0;
  for (int k = 0; k < RA_NUM_OPS * 2; k++) {
    OpStats *s = &stats[k];
    if (!s->cases) continue;
    total += s->cases;
    test_check(s->differ == 0 && s->arg_bad == 0,
               "RandAugment %-21s %2d cases: %lld of %lld bytes differ (max %d, tol 0), "
               "%d arguments differ from timm",
               randaugment_op_name((RandAugmentOp)(k / 2), k % 2), s->cases, (long long)s->differ,
               (long long)s->bytes, s->max_diff, s->arg_bad);
  }
  test_check(total >= 200, "RandAugment: %d fixture cases (every op of both sets)", total);
}

static void test_resize(const SafeTensors *st) {
  for (int i = 0; i < st->count; i++) {
    const SafeTensorEntry *e = &st->entries[i];
    bool rrc = strncmp(e->name, "rrc/", 4) == 0, eval = strncmp(e->name, "eval/", 5) == 0;
    if (!rrc && !eval) continue;
    char img_name[32], interp[16];
    int t, l, bh, bw, oh, ow, h, w, C;
    double crop_pct = 1;
    bool parsed = rrc ? sscanf(e->name, "rrc/%31[^/]/%15[^/]/%d,%d,%d,%d/%dx%d", img_name, interp,
                               &t, &l, &bh, &bw, &oh, &ow) == 8
                      : sscanf(e->name, "eval/%31[^/]/%15[^/]/%dx%d/%lf", img_name, interp, &oh,
                               &ow, &crop_pct) == 5;
    const uint8_t *src = parsed ? image(st, img_name, &h, &w, &C) : NULL;
    if (!src) {
      test_check(0, "fixture case '%s' not understood", e->name);
      continue;
    }
    bool bicubic = strcmp(interp, "bicubic") == 0;
    int64_t n = (int64_t)oh * ow * C;
    uint8_t *got = malloc_check((size_t)n);
    memset(got, 0xA5, (size_t)n);
    if (rrc) {
      ImageView crop = {src + ((int64_t)t * w + l) * C, bh, bw, C, (int64_t)w * C};
      image_resize(crop, oh, ow, 0, 0, oh, ow, bicubic ? INTERP_BICUBIC : INTERP_BILINEAR, got);
    } else {
      TransformParams p = {.out_h = oh,
                           .out_w = ow,
                           .chans = C,
                           .crop_pct = (float)crop_pct,
                           .resample = bicubic ? RESAMPLE_BICUBIC : RESAMPLE_BILINEAR};
      transform_eval(&p, src, h, w, got);
    }
    int max_diff = 0;
    int64_t d = bytes_differ(got, safetensors_entry_data(st, e), n, &max_diff);
    test_check(d == 0, "%-44s %lld of %lld bytes differ (max %d, tol 0)", e->name, (long long)d,
               (long long)n, max_diff);
    free(got);
  }
}

static void test_jitter(const SafeTensors *st) {
  int cases = 0;
  for (int i = 0; i < st->count; i++) {
    const SafeTensorEntry *e = &st->entries[i];
    if (strncmp(e->name, "jitter/", 7) != 0) continue;
    char img_name[32], order_s[8];
    double f[3];
    int h, w, C;
    const uint8_t *src = NULL;
    if (sscanf(e->name, "jitter/%31[^/]/%4[0-9]/%lf,%lf,%lf", img_name, order_s, &f[0], &f[1],
               &f[2]) == 5)
      src = image(st, img_name, &h, &w, &C);
    if (!src) {
      test_check(0, "fixture case '%s' not understood", e->name);
      continue;
    }
    int order[4];
    for (int k = 0; k < 4; k++) order[k] = order_s[k] - '0';
    int64_t n = (int64_t)h * w * C;
    uint8_t *got = malloc_check((size_t)n);
    memcpy(got, src, (size_t)n);
    color_jitter_apply(order, f, got, h, w, C);
    int max_diff = 0;
    int64_t d = bytes_differ(got, safetensors_entry_data(st, e), n, &max_diff);
    test_check(d == 0, "%-44s %lld of %lld bytes differ (max %d, tol 0)", e->name, (long long)d,
               (long long)n, max_diff);
    free(got);
    cases++;
  }
  test_check(cases >= 4, "ColorJitter: %d fixture cases", cases);
}

static int64_t floats_differ(const float *a, const float *b, int64_t n) {
  int64_t d = 0;
  for (int64_t i = 0; i < n; i++) d += memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return d;
}

static void test_erase(const SafeTensors *st) {
  int64_t n, nb;
  const float *x = find(st, "erase/x", DTYPE_F32, &n),
              *want = find(st, "erase/out", DTYPE_F32, NULL);
  const int32_t *boxes = find(st, "erase/boxes", DTYPE_I32, &nb);
  const SafeTensorEntry *e = safetensors_find(st, "erase/x");
  const char *key = safetensors_meta_get(st, "erase/key");
  unsigned long long seed, epoch, first;
  if (!x || !want || !boxes || !key || sscanf(key, "%llu,%llu,%llu", &seed, &epoch, &first) != 3)
    return;
  int B = (int)e->shape[0], H = (int)e->shape[1], W = (int)e->shape[2], C = (int)e->shape[3];
  EraseBox eb[8];
  for (int b = 0; b < B && b < 8; b++)
    eb[b] = (EraseBox){boxes[4 * b], boxes[4 * b + 1], boxes[4 * b + 2], boxes[4 * b + 3],
                       rng_make(seed, RNG_STREAM_ERASE_FILL, epoch, first + (uint64_t)b)};
  BatchAugment p = {.erase = eb, .mix = {.mode = MIX_NONE, .lam = 1}};
  float *got = test_alloc_floats(n);
  memcpy(got, x, sizeof(float) * (size_t)n);
  batch_augment_cpu(got, &p, B, H, W, C);
  int64_t d = floats_differ(got, want, n);
  test_check(d == 0, "random erasing (timm 'pixel', given boxes): %lld of %lld elements differ",
             (long long)d, (long long)n);
  free(got);
}

static void test_mix(const SafeTensors *st) {
  int64_t n, nl;
  const float *x = find(st, "mix/x", DTYPE_F32, &n);
  const int32_t *labels = find(st, "mix/labels", DTYPE_I32, &nl);
  const char *smoothing = safetensors_meta_get(st, "smoothing");
  if (!x || !labels || !smoothing) return;
  const SafeTensorEntry *e = safetensors_find(st, "mix/x");
  int B = (int)e->shape[0], H = (int)e->shape[1], W = (int)e->shape[2], C = (int)e->shape[3];
  int lab[16];
  for (int b = 0; b < B && b < 16; b++) lab[b] = labels[b];
  const char *kinds[2] = {"mixup", "cutmix"};
  for (int k = 0; k < 2; k++) {
    char name[64];
    snprintf(name, sizeof name, "%s/out", kinds[k]);
    const float *want = find(st, name, DTYPE_F32, NULL);
    snprintf(name, sizeof name, "%s/target", kinds[k]);
    int64_t nt;
    const float *want_t = find(st, name, DTYPE_F32, &nt);
    snprintf(name, sizeof name, "%s/lam", kinds[k]);
    const char *lam_s = safetensors_meta_get(st, name);
    if (!want || !want_t || !lam_s) return;
    double lam = strtod(lam_s, NULL);
    BatchAugment p = {.erase = NULL, .mix = {.mode = MIX_MIXUP, .lam = lam}};
    if (k == 1) {
      int cy, cx, bt, bl, bh, bw;
      snprintf(name, sizeof name, "%s/center", kinds[k]);
      const char *c = safetensors_meta_get(st, name);
      snprintf(name, sizeof name, "%s/box", kinds[k]);
      const char *box = safetensors_meta_get(st, name);
      snprintf(name, sizeof name, "%s/lam_corrected", kinds[k]);
      const char *lc = safetensors_meta_get(st, name);
      if (!c || !box || !lc || sscanf(c, "%d,%d", &cy, &cx) != 2 ||
          sscanf(box, "%d,%d,%d,%d", &bt, &bl, &bh, &bw) != 4)
        return;
      p.mix = batch_augment_cutmix_box(lam, H, W, cy, cx);
      test_check(p.mix.top == bt && p.mix.left == bl && p.mix.h == bh && p.mix.w == bw &&
                     p.mix.lam == strtod(lc, NULL),
                 "cutmix box (%d,%d %dx%d) and corrected lam %.17g equal timm's (%s, %s)",
                 p.mix.top, p.mix.left, p.mix.h, p.mix.w, p.mix.lam, box, lc);
    }
    float *got = test_alloc_floats(n);
    memcpy(got, x, sizeof(float) * (size_t)n);
    batch_augment_cpu(got, &p, B, H, W, C);
    int64_t d = floats_differ(got, want, n);
    test_check(d == 0, "%-6s lam %-6s images: %lld of %lld elements differ", kinds[k], lam_s,
               (long long)d, (long long)n);
    int K = (int)(nt / B);
    float *targets = test_alloc_floats(nt);
    batch_augment_soft_targets_fill(targets, lab, B, K, p.mix.lam, strtof(smoothing, NULL));
    d = floats_differ(targets, want_t, nt);
    test_check(d == 0, "%-6s soft targets (smoothing %s): %lld of %lld differ", kinds[k], smoothing,
               (long long)d, (long long)nt);
    free(targets);
    free(got);
  }
}

static void test_soft_loss(const SafeTensors *st) {
  int64_t n, nt;
  const float *logits = find(st, "loss/logits", DTYPE_F32, &n);
  const float *grad = find(st, "loss/grad", DTYPE_F32, NULL);
  const float *targets = find(st, "cutmix/target", DTYPE_F32, &nt);
  const char *value = safetensors_meta_get(st, "loss/value");
  if (!logits || !grad || !targets || !value) return;
  const SafeTensorEntry *e = safetensors_find(st, "loss/logits");
  int B = (int)e->shape[0], K = (int)e->shape[1];
  float *dlogits = test_alloc_floats(n);
  test_poison(dlogits, n);
  double loss = cross_entropy_forward_backward_cpu(dlogits, logits, NULL, targets, 0.0f, B, K, B);
  double want = strtod(value, NULL);
  test_check(fabs(loss - want) <= 1e-6 * fabs(want),
             "soft-target cross entropy: loss %.9f vs timm %.9f (tol 1e-6 relative)", loss, want);
  test_close("soft-target cross entropy: dlogits vs timm autograd", dlogits, grad, n, 1e-6);
  free(dlogits);
}

// ---- image_resize against a direct transcription of Pillow's Resample.c loops ----
// image_resize sums its fixed-point taps in a vectorizable order; this is Pillow's order (per
// output, per channel, tap by tap), written as plainly as possible. Integer sums do not depend on
// the order, so the two must agree to the byte on any input; the fixtures above tie this
// transcription to Pillow itself.

static double ref_filter(double x, bool bicubic) {
  if (x < 0.0) x = -x;
  if (!bicubic) return x < 1.0 ? 1.0 - x : 0.0;
  const double a = -0.5;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// Pillow's precompute_coeffs for output xx of in_size -> out_size: first tap, count, 22-bit k.
static int ref_taps(int in_size, int out_size, int xx, bool bicubic, int *first, int32_t *k) {
  double scale = (double)(float)in_size / out_size;
  double filterscale = scale < 1.0 ? 1.0 : scale;
  double support = (bicubic ? 2.0 : 1.0) * filterscale, center = (xx + 0.5) * scale, w[64], ww = 0;
  int xmin = (int)(center - support + 0.5), xmax = (int)(center + support + 0.5);
  if (xmin < 0) xmin = 0;
  if (xmax > in_size) xmax = in_size;
  xmax -= xmin;
  for (int x = 0; x < xmax; x++)
    ww += w[x] = ref_filter((x + xmin - center + 0.5) / filterscale, bicubic);
  for (int x = 0; x < xmax; x++) {
    double v = ww != 0.0 ? w[x] / ww : w[x];
    k[x] = v < 0 ? (int32_t)(-0.5 + v * (1 << 22)) : (int32_t)(0.5 + v * (1 << 22));
  }
  *first = xmin;
  return xmax;
}

static uint8_t ref_clip(int32_t ss) {
  int32_t v = ss >> 22;
  return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

// The whole resize (horizontal pass over every row into uint8, then vertical), then the window.
static void ref_resize(const uint8_t *src, int h, int w, int C, int oh, int ow, int top, int left,
                       int wh, int ww, bool bicubic, uint8_t *dst) {
  uint8_t *tmp = malloc_check((size_t)h * ow * C);
  int32_t k[64];
  int first;
  for (int x = 0; x < ow; x++) {
    int n = ref_taps(w, ow, x, bicubic, &first, k);
    for (int y = 0; y < h; y++)
      for (int c = 0; c < C; c++) {
        int32_t ss = 1 << 21;
        for (int j = 0; j < n; j++) ss += src[((size_t)y * w + first + j) * C + c] * k[j];
        tmp[((size_t)y * ow + x) * C + c] = ref_clip(ss);
      }
  }
  for (int y = top; y < top + wh; y++) {
    int n = ref_taps(h, oh, y, bicubic, &first, k);
    for (int x = left; x < left + ww; x++)
      for (int c = 0; c < C; c++) {
        int32_t ss = 1 << 21;
        for (int j = 0; j < n; j++) ss += tmp[((size_t)(first + j) * ow + x) * C + c] * k[j];
        dst[((size_t)(y - top) * ww + x - left) * C + c] = ref_clip(ss);
      }
  }
  free(tmp);
}

static void test_resize_random(void) {
  TestRng r = {20261201};
  int cases = 0;
  int64_t differ = 0, bytes = 0;
  for (int t = 0; t < 300; t++) {
    int C = 1 + (int)(test_rng_u64(&r) % 4);
    int h = 1 + (int)(test_rng_u64(&r) % 300), w = 1 + (int)(test_rng_u64(&r) % 300);
    // Shrinking by up to 8x (the scales whose taps fit ref_taps' 64) and growing by up to 4x.
    int oh = h / 8 + 1 + (int)(test_rng_u64(&r) % (uint64_t)(4 * h)),
        ow = w / 8 + 1 + (int)(test_rng_u64(&r) % (uint64_t)(4 * w));
    int wh = 1 + (int)(test_rng_u64(&r) % (uint64_t)oh),
        ww = 1 + (int)(test_rng_u64(&r) % (uint64_t)ow);
    int top = (int)(test_rng_u64(&r) % (uint64_t)(oh - wh + 1)),
        left = (int)(test_rng_u64(&r) % (uint64_t)(ow - ww + 1));
    bool bicubic = test_rng_u64(&r) & 1;
    size_t n_in = (size_t)h * w * C, n_out = (size_t)wh * ww * C;
    uint8_t *src = malloc_check(n_in), *got = malloc_check(n_out), *want = malloc_check(n_out);
    for (size_t i = 0; i < n_in; i++) src[i] = (uint8_t)test_rng_u64(&r);
    memset(got, 0xA5, n_out);
    image_resize(image_view(src, h, w, C), oh, ow, top, left, wh, ww,
                 bicubic ? INTERP_BICUBIC : INTERP_BILINEAR, got);
    ref_resize(src, h, w, C, oh, ow, top, left, wh, ww, bicubic, want);
    int max_diff = 0;
    int64_t d = bytes_differ(got, want, (int64_t)n_out, &max_diff);
    if (d)
      test_check(0, "resize %dx%dx%d -> %dx%d window %d,%d %dx%d %s: %lld bytes differ", h, w, C,
                 oh, ow, top, left, wh, ww, bicubic ? "bicubic" : "bilinear", (long long)d);
    differ += d, bytes += (int64_t)n_out, cases++;
    free(src), free(got), free(want);
  }
  test_check(differ == 0,
             "image_resize vs the plain Pillow transcription: %d random cases (1-4 channels, "
             "x1/8 to x4, windows), %lld of %lld bytes differ (tol 0)",
             cases, (long long)differ, (long long)bytes);
}

// image_affine samples 3-channel images with AVX2 lanes for the channels where every tap is
// inside the image, and with the scalar sampler elsewhere and for 1 channel. Pillow computes
// each channel on its own, so an RGB result must equal the three channels transformed as gray
// images (the scalar path) to the byte: random images, sizes and matrices (rotation, shear,
// translation, scale), both interpolations.
static void test_affine_channels(void) {
  TestRng r = {20261202};
  int cases = 0;
  int64_t differ = 0, bytes = 0;
  for (int t = 0; t < 200; t++) {
    int h = 1 + (int)(test_rng_u64(&r) % 80), w = 1 + (int)(test_rng_u64(&r) % 80);
    double angle = test_rng_uniform(&r, -3.2f, 3.2f), scale = test_rng_uniform(&r, 0.5f, 2.0f);
    double a[6] = {scale * cos(angle),
                   test_rng_uniform(&r, -0.4f, 0.4f) + scale * sin(angle),
                   test_rng_uniform(&r, -10, 10),
                   -scale * sin(angle),
                   scale * cos(angle),
                   test_rng_uniform(&r, -10, 10)};
    Interp interp = test_rng_u64(&r) & 1 ? INTERP_BICUBIC : INTERP_BILINEAR;
    size_t n = (size_t)h * w;
    uint8_t *rgb = malloc_check(3 * n), *got = malloc_check(3 * n), *plane = malloc_check(n),
            *plane_out = malloc_check(n);
    uint8_t fill[3] = {(uint8_t)test_rng_u64(&r), (uint8_t)test_rng_u64(&r),
                       (uint8_t)test_rng_u64(&r)};
    for (size_t i = 0; i < 3 * n; i++) rgb[i] = (uint8_t)test_rng_u64(&r);
    memset(got, 0xA5, 3 * n);
    image_affine(image_view(rgb, h, w, 3), a, interp, fill, got);
    for (int c = 0; c < 3; c++) {
      for (size_t i = 0; i < n; i++) plane[i] = rgb[3 * i + (size_t)c];
      image_affine(image_view(plane, h, w, 1), a, interp, &fill[c], plane_out);
      for (size_t i = 0; i < n; i++) differ += got[3 * i + (size_t)c] != plane_out[i];
    }
    bytes += (int64_t)(3 * n), cases++;
    free(rgb), free(got), free(plane), free(plane_out);
  }
  test_check(differ == 0,
             "image_affine RGB vs its channels as gray images: %d random cases (1-80 px sides, "
             "both interpolations), %lld of %lld bytes differ (tol 0)",
             cases, (long long)differ, (long long)bytes);
}

int main(void) {
  const char *path = SWIN_SOURCE_DIR "/tests/fixtures/augment/aug_parity.safetensors";
  SafeTensors st;
  Error err;
  if (safetensors_read(&st, path, &err) != 0) {
    test_check(0, "cannot read the fixtures: %s", err.msg);
    return test_finish();
  }
  printf("fixtures: %s (timm %s, Pillow %s, torch %s)\n", path,
         safetensors_meta_get(&st, "timm_version"), safetensors_meta_get(&st, "pillow_version"),
         safetensors_meta_get(&st, "torch_version"));
  test_randaugment(&st);
  test_resize(&st);
  test_resize_random();
  test_affine_channels();
  test_jitter(&st);
  test_erase(&st);
  test_mix(&st);
  test_soft_loss(&st);
  safetensors_free(&st);
  return test_finish();
}
