// test_image_aug.h: inputs and checks shared by the tests of the batched augmentation steps
// (kernels/image_aug.h): tests/test_image_aug.c (its CPU form against the CPU path) and
// tests/test_gpu_image_aug.c (the kernels against the CPU form).
//
// Images are textured, not noise alone: gradients, waves and edges (the sharpness filter and the
// resamplers see structure), with per-channel value ranges that are full, narrow (autocontrast
// stretches them), a few levels (equalize's tables step), or nearly constant (its identity case).
// The fixed-argument cases cover every op of both RandAugment sets at several magnitudes, both
// signs and both interpolations, and the edges of each argument's range.
#pragma once
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/image_ops.h"
#include "data/randaugment.h"
#include "kernels/image_aug.h"
#include "tests/util/test_util.h"

static inline int test_aug_below(TestRng *r, int n) {
  return (int)(test_rng_u64(r) % (uint64_t)n);
}
static inline double test_aug_unit(TestRng *r) {
  return (double)(test_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
}

// One textured image (h, w, chans): each channel of its own kind (see the top of the file).
static inline void test_aug_image(TestRng *r, uint8_t *img, int h, int w, int chans) {
  for (int c = 0; c < chans; c++) {
    int kind = test_aug_below(r, 5);  // 0, 1: full range; 2: narrow; 3: a few levels; 4: flat
    double lo = 0, hi = 255;
    if (kind == 2) lo = 20 + test_aug_below(r, 80), hi = lo + 10 + test_aug_below(r, 120);
    int levels = 2 + test_aug_below(r, 8), flat = test_aug_below(r, 256);
    double fx = 0.02 + 0.4 * test_aug_unit(r), fy = 0.02 + 0.4 * test_aug_unit(r);
    double phase = 6.3 * test_aug_unit(r), noise = 0.3 * test_aug_unit(r);
    int cell = 3 + test_aug_below(r, 12);
    for (int y = 0; y < h; y++) {
      for (int x = 0; x < w; x++) {
        double t = 0.5 + 0.2 * sin(x * fx + y * 0.3 * fy + phase) + 0.15 * cos(y * fy) +
                   0.15 * ((x / cell + y / cell) % 2 ? 1 : -1) + noise * (test_aug_unit(r) - 0.5) +
                   0.3 * ((double)x / w - 0.5);
        t = t < 0 ? 0 : t > 1 ? 1 : t;
        double v = lo + (hi - lo) * t;
        if (kind == 3) v = floor(t * (levels - 1) + 0.5) * 255.0 / (levels - 1);
        if (kind == 4) v = test_aug_below(r, 200) ? flat : test_aug_below(r, 256);
        img[((int64_t)y * w + x) * chans + c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
      }
    }
  }
}

static inline const char *test_aug_op_name(int32_t op) {
  static const char *const names[IMAGE_AUG_OPS] = {
      "none",  "autocontrast", "equalize",   "invert",    "posterize", "solarize", "solarize_add",
      "color", "contrast",     "brightness", "sharpness", "affine",    "transpose"};
  return op >= 0 && op < IMAGE_AUG_OPS ? names[op] : "?";
}

typedef struct {
  char what[72];  // e.g. "Rotate m9 neg bicubic", "posterize 3 bits"
  ImageAugStep step;
} TestAugCase;

static inline void test_aug_add(TestAugCase *cases, int *n, int max, ImageAugStep step,
                                const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static inline void test_aug_add(TestAugCase *cases, int *n, int max, ImageAugStep step,
                                const char *fmt, ...) {
  if (*n >= max) {
    fprintf(stderr, "test_aug_add: more than %d cases\n", max);
    exit(2);
  }
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cases[*n].what, sizeof cases[*n].what, fmt, ap);
  va_end(ap);
  cases[(*n)++].step = step;
}

static inline bool test_aug_geometric(RandAugmentOp op) {
  return op == RA_ROTATE || op == RA_SHEAR_X || op == RA_SHEAR_Y || op == RA_TRANSLATE_X_REL ||
         op == RA_TRANSLATE_Y_REL;
}
static inline bool test_aug_signed(RandAugmentOp op, bool inc) {
  return test_aug_geometric(op) || (inc && (op == RA_COLOR || op == RA_CONTRAST ||
                                            op == RA_BRIGHTNESS || op == RA_SHARPNESS));
}
static inline bool test_aug_has_sets(RandAugmentOp op) {
  return op == RA_POSTERIZE || op == RA_SOLARIZE || op == RA_COLOR || op == RA_CONTRAST ||
         op == RA_BRIGHTNESS || op == RA_SHARPNESS;
}

// The fixed-argument cases for an (h, w) image: every RandAugment op (both sets where they
// differ) at each of mags[0..nmags) through randaugment_op_arg and randaugment_step, both signs
// of the signed ops, both interpolations of the geometric ones; then the edges: rotations onto
// the quarter-turn fast paths (and off them on a non-square image), every posterize bit count,
// solarize thresholds and adds at their ends, enhancer factors 0 and 1 (Pillow's shortcuts),
// in between, and extrapolating (clipped) on both sides. Returns the count.
static inline int test_aug_cases(int h, int w, const double *mags, int nmags, TestAugCase *cases,
                                 int max) {
  int n = 0;
  static const char *const interp_name[2] = {"bilinear", "bicubic"};
  for (int op = 0; op < RA_NUM_OPS; op++) {
    RandAugmentOp o = (RandAugmentOp)op;
    for (int inc = test_aug_has_sets(o) ? 0 : 1; inc <= 1; inc++) {
      for (int m = 0; m < nmags; m++) {
        for (int neg = 0; neg <= (test_aug_signed(o, inc) ? 1 : 0); neg++) {
          for (int ip = 0; ip <= (test_aug_geometric(o) ? 1 : 0); ip++) {
            double arg = randaugment_op_arg(o, inc, mags[m], neg);
            test_aug_add(cases, &n, max, randaugment_step(o, arg, (Interp)ip, h, w), "%s m%g%s%s%s",
                         randaugment_op_name(o, inc), mags[m],
                         test_aug_signed(o, inc) ? (neg ? " neg" : " pos") : "",
                         test_aug_geometric(o) ? " " : "",
                         test_aug_geometric(o) ? interp_name[ip] : "");
          }
        }
      }
    }
  }
  static const double angles[] = {0, 90, 180, 270, -90, 450, -180, 360, 45, 30.5, -12.25};
  for (size_t a = 0; a < sizeof angles / sizeof angles[0]; a++)
    for (int ip = 0; ip <= 1; ip++)
      test_aug_add(cases, &n, max, randaugment_step(RA_ROTATE, angles[a], (Interp)ip, h, w),
                   "Rotate %g degrees %s", angles[a], interp_name[ip]);
  for (int bits = -2; bits <= 9; bits++)
    test_aug_add(cases, &n, max, randaugment_step(RA_POSTERIZE, bits, INTERP_BILINEAR, h, w),
                 "Posterize %d bits", bits);
  static const int thresholds[] = {0, 1, 127, 128, 255, 256};
  for (size_t t = 0; t < sizeof thresholds / sizeof thresholds[0]; t++)
    test_aug_add(cases, &n, max,
                 randaugment_step(RA_SOLARIZE, thresholds[t], INTERP_BILINEAR, h, w),
                 "Solarize threshold %d", thresholds[t]);
  static const int adds[] = {0, 1, 64, 110, 128};
  for (size_t t = 0; t < sizeof adds / sizeof adds[0]; t++)
    test_aug_add(cases, &n, max, randaugment_step(RA_SOLARIZE_ADD, adds[t], INTERP_BILINEAR, h, w),
                 "SolarizeAdd %d", adds[t]);
  static const RandAugmentOp enhancers[] = {RA_COLOR, RA_CONTRAST, RA_BRIGHTNESS, RA_SHARPNESS};
  static const double factors[] = {0, 1, 0.1, 0.37, 0.999, 1.3, 1.9, 3.1, -0.6};
  for (int e = 0; e < 4; e++)
    for (size_t f = 0; f < sizeof factors / sizeof factors[0]; f++)
      test_aug_add(cases, &n, max,
                   randaugment_step(enhancers[e], factors[f], INTERP_BILINEAR, h, w),
                   "%s factor %g", randaugment_op_name(enhancers[e], false), factors[f]);
  return n;
}

// Compares image i of a batch (bytes each) with its reference. On a difference, one FAIL line
// names what ran, the image and the first differing byte (its row, column and channel).
// Returns the bytes that differ.
static inline int64_t test_aug_compare(const char *what, int image, const uint8_t *got,
                                       const uint8_t *want, int h, int w, int chans) {
  int64_t n = (int64_t)h * w * chans, differ = 0, first = -1;
  for (int64_t k = 0; k < n; k++) {
    if (got[k] != want[k]) {
      if (first < 0) first = k;
      differ++;
    }
  }
  if (differ)
    test_check(0,
               "%s, image %d (%dx%dx%d): %lld of %lld bytes differ, first at byte %lld (y %lld, "
               "x %lld, channel %lld): %u, want %u",
               what, image, h, w, chans, (long long)differ, (long long)n, (long long)first,
               (long long)(first / chans / w), (long long)(first / chans % w),
               (long long)(first % chans), got[first], want[first]);
  return differ;
}
