// test_image_aug.c: the batched augmentation steps (kernels/image_aug.h) where no GPU is: their
// CPU form image_aug_batch_cpu (the per-pixel code, histograms and tables the CUDA kernels run)
// against the CPU path image_apply_step (data/image_ops.c, which tests/test_aug_parity.c checks
// against Pillow), and the split of RandAugment and ColorJitter into draws and steps
// (data/randaugment.h) against the order they were drawn and applied in before.
//
// Tolerance: 0 bytes everywhere. The ported code repeats the CPU path's integer arithmetic and
// its float and double expressions in the same order, each rounded alone (no FMA contraction in
// either), so the bytes are the same, not merely close; one byte off is a bug.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/image_ops.h"
#include "data/randaugment.h"
#include "data/transform.h"
#include "kernels/image_aug.h"
#include "src/base/rng.h"
#include "src/base/util.h"
#include "tests/util/test_image_aug.h"
#include "tests/util/test_util.h"

// The geometric ops' outside colour: a mean pixel, as the loader passes it.
static const uint8_t fill_rgb[3] = {124, 116, 104}, fill_gray[1] = {117};

static const uint8_t *fill_for(int chans) {
  return chans == 3 ? fill_rgb : fill_gray;
}

// Runs steps (count * nsteps) on a copy of images with image_aug_batch_cpu, its scratch
// poisoned with 0x00 and then 0xFF (a result that depended on the scratch's old contents fails
// one of the two), and compares each image with want; names[i] says what image i ran.
static int64_t run_batch(const uint8_t *images, const uint8_t *want, const ImageAugStep *steps,
                         int count, int nsteps, int h, int w, int chans, const char *const *names) {
  size_t bytes = (size_t)count * h * w * chans;
  uint8_t *got = malloc_check(bytes), *scratch = malloc_check(bytes);
  int64_t differ = 0;
  for (int poison = 0x00; poison <= 0xFF; poison += 0xFF) {
    memcpy(got, images, bytes);
    memset(scratch, poison, bytes);
    image_aug_batch_cpu(got, scratch, steps, count, nsteps, h, w, chans, fill_for(chans));
    for (int i = 0; i < count; i++) {
      size_t off = (size_t)i * h * w * chans;
      char what[160];
      snprintf(what, sizeof what, "image_aug_batch_cpu: %s, scratch poison 0x%02x", names[i],
               poison);
      differ += test_aug_compare(what, i, got + off, want + off, h, w, chans);
    }
  }
  free(got);
  free(scratch);
  return differ;
}

// ---- fixed arguments ----

// Every fixed-argument case (tests/util/test_image_aug.h) on a batch of `count` textured images of
// one size, the whole batch running that one step; then mixed batches, image i running three
// cases in a row (each case in some image's list), with NONE padding some lists.
static void test_fixed_size(TestRng *r, int h, int w, int chans, const double *mags, int nmags,
                            int count) {
  enum { MAX_CASES = 512 };
  TestAugCase *cases = malloc_check(sizeof(TestAugCase) * MAX_CASES);
  int ncases = test_aug_cases(h, w, mags, nmags, cases, MAX_CASES);
  size_t one = (size_t)h * w * chans, bytes = one * (size_t)count;
  uint8_t *images = malloc_check(bytes), *want = malloc_check(bytes), *scratch = malloc_check(one);
  ImageAugStep *steps = malloc_check(sizeof(ImageAugStep) * 3 * (size_t)count);
  const char **names = malloc_check(sizeof(char *) * (size_t)count);
  int64_t differ = 0, compared = 0;
  int changed = 0, per_op[IMAGE_AUG_OPS] = {0};
  for (int k = 0; k < ncases; k++) {
    for (int i = 0; i < count; i++) test_aug_image(r, images + i * one, h, w, chans);
    memcpy(want, images, bytes);
    for (int i = 0; i < count; i++) {
      steps[i] = cases[k].step;
      names[i] = cases[k].what;
      image_apply_step(&cases[k].step, fill_for(chans), want + i * one, h, w, chans, scratch);
    }
    changed += memcmp(want, images, bytes) != 0;
    per_op[cases[k].step.op]++;
    differ += run_batch(images, want, steps, count, 1, h, w, chans, names);
    compared += 2 * (int64_t)bytes;
  }
  // Mixed batches: image i runs cases c, c + 1, c + 2 (mod ncases) for its own c; every fourth
  // list is one step shorter (padded with NONE).
  char(*mixed)[256] = malloc_check(sizeof *mixed * (size_t)count);
  for (int first = 0; first < ncases; first += count) {
    for (int i = 0; i < count; i++) {
      int c = (first + i) % ncases, len = i % 4 == 3 ? 2 : 3;
      test_aug_image(r, images + i * one, h, w, chans);
      memcpy(want + i * one, images + i * one, one);
      snprintf(mixed[i], sizeof mixed[i], "steps");
      for (int s = 0; s < 3; s++) {
        const TestAugCase *q = &cases[(c + 7 * s) % ncases];
        steps[i * 3 + s] = s < len ? q->step : (ImageAugStep){.op = IMAGE_AUG_NONE};
        if (s < len) {
          size_t at = strlen(mixed[i]);
          snprintf(mixed[i] + at, sizeof mixed[i] - at, "%s %s", s ? "," : "", q->what);
        }
      }
      image_apply_steps(steps + i * 3, len, fill_for(chans), want + i * one, h, w, chans);
      names[i] = mixed[i];
    }
    differ += run_batch(images, want, steps, count, 3, h, w, chans, names);
    compared += 2 * (int64_t)bytes;
  }
  test_check(
      differ == 0 && changed > ncases / 2,
      "image_aug_batch_cpu = image_apply_step, %dx%dx%d: %d fixed-argument cases (%d "
      "affine, %d transpose, %d histogram, %d enhancer), %d images each, then mixed "
      "3-step lists; %d cases change the image; %lld of %lld bytes differ (tol 0)",
      h, w, chans, ncases, per_op[IMAGE_AUG_AFFINE], per_op[IMAGE_AUG_TRANSPOSE],
      per_op[IMAGE_AUG_AUTOCONTRAST] + per_op[IMAGE_AUG_EQUALIZE] + per_op[IMAGE_AUG_CONTRAST],
      per_op[IMAGE_AUG_COLOR] + per_op[IMAGE_AUG_BRIGHTNESS] + per_op[IMAGE_AUG_SHARPNESS], count,
      changed, (long long)differ, (long long)compared);
  free(mixed);
  free(names);
  free(steps);
  free(scratch);
  free(want);
  free(images);
  free(cases);
}

static void test_fixed(TestRng *r) {
  static const double all_mags[] = {0, 2.5, 5, 9, 10}, m9[] = {9};
  for (int chans = 1; chans <= 3; chans += 2) {
    test_fixed_size(r, 37, 53, chans, all_mags, 5, 3);
    test_fixed_size(r, 53, 53, chans, all_mags, 5, 2);  // square: the 90 / 270 fast paths
    test_fixed_size(r, 224, 224, chans, m9, 1, 2);
  }
  test_fixed_size(r, 2, 5, 3, all_mags, 5, 2);  // under 3x3: sharpness copies every pixel
}

// ---- random draws from the real policies ----

typedef struct {
  const char *spec;  // RandAugment, or NULL: ColorJitter(0.4)
  ResampleChoice resample;
} Policy;

// Draws each image's steps from its own Rng (as the loader keys them), runs the batch, and
// compares each image with the CPU path from the same Rng (randaugment_image or
// color_jitter_image). *seen counts the steps per op.
static int64_t random_batch(TestRng *r, const Policy *pol, int count, int h, int w, int chans,
                            uint64_t epoch, int *seen, int *nsteps_out) {
  RandAugmentPolicy p;
  Error err;
  if (pol->spec && randaugment_parse(&p, pol->spec, &err) != 0) {
    test_check(0, "randaugment_parse '%s': %s", pol->spec, err.msg);
    return 1;
  }
  size_t one = (size_t)h * w * chans, bytes = one * (size_t)count;
  uint8_t *images = malloc_check(bytes), *want = malloc_check(bytes);
  ImageAugStep *drawn = calloc_check((size_t)count * IMAGE_AUG_MAX_STEPS, sizeof *drawn);
  int *counts = malloc_check(sizeof(int) * (size_t)count), nsteps = 0;
  for (int i = 0; i < count; i++) {
    test_aug_image(r, images + i * one, h, w, chans);
    memcpy(want + i * one, images + i * one, one);
    Rng a = rng_make(20261202, RNG_STREAM_AUGMENT, epoch, (uint64_t)i), b = a;
    ImageAugStep *row = drawn + (size_t)i * IMAGE_AUG_MAX_STEPS;
    if (pol->spec) {
      counts[i] = randaugment_draw(&p, pol->resample, h, w, &a, row, IMAGE_AUG_MAX_STEPS);
      randaugment_image(&p, pol->resample, fill_for(chans), want + i * one, h, w, chans, &b);
    } else {
      counts[i] = color_jitter_draw(0.4f, &a, row, IMAGE_AUG_MAX_STEPS);
      color_jitter_image(0.4f, want + i * one, h, w, chans, &b);
    }
    if (counts[i] > nsteps) nsteps = counts[i];
    for (int s = 0; s < counts[i]; s++) seen[row[s].op]++;
  }
  // The batch's lists: nsteps each, shorter ones padded with NONE (calloc: op 0).
  ImageAugStep *steps = calloc_check((size_t)count * (nsteps ? nsteps : 1), sizeof *steps);
  char(*names)[200] = malloc_check(sizeof *names * (size_t)count);
  const char **name_ptrs = malloc_check(sizeof(char *) * (size_t)count);
  for (int i = 0; i < count; i++) {
    int at =
        snprintf(names[i], sizeof names[i], "%s draw %d:", pol->spec ? pol->spec : "jitter", i);
    for (int s = 0; s < counts[i]; s++) {
      steps[(size_t)i * nsteps + s] = drawn[(size_t)i * IMAGE_AUG_MAX_STEPS + s];
      if (at < (int)sizeof names[i])
        at += snprintf(names[i] + at, sizeof names[i] - (size_t)at, " %s",
                       test_aug_op_name(steps[(size_t)i * nsteps + s].op));
    }
    name_ptrs[i] = names[i];
  }
  int64_t differ = run_batch(images, want, steps, count, nsteps, h, w, chans, name_ptrs);
  *nsteps_out = nsteps;
  free(name_ptrs);
  free(names);
  free(steps);
  free(counts);
  free(drawn);
  free(want);
  free(images);
  return differ;
}

static void test_random(TestRng *r) {
  static const Policy policies[] = {{"rand-m9-mstd0.5-inc1", RESAMPLE_RANDOM},
                                    {"rand-m9-mstd0.5", RESAMPLE_BICUBIC},
                                    {"rand-m10-n4-mstd101-p0.8-inc1", RESAMPLE_BILINEAR},
                                    {NULL, RESAMPLE_BILINEAR}};
  static const struct {
    int count, h, w, chans;
  } sizes[] = {{96, 37, 53, 3}, {96, 37, 53, 1}, {16, 224, 224, 3}, {8, 224, 224, 1}};
  for (size_t k = 0; k < sizeof policies / sizeof policies[0]; k++) {
    int seen[IMAGE_AUG_OPS] = {0}, images = 0, most = 0, ops_seen = 0;
    int64_t differ = 0;
    for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++) {
      int nsteps = 0;
      differ += random_batch(r, &policies[k], sizes[z].count, sizes[z].h, sizes[z].w,
                             sizes[z].chans, 3 + z, seen, &nsteps);
      images += sizes[z].count;
      if (nsteps > most) most = nsteps;
    }
    for (int op = 1; op < IMAGE_AUG_OPS; op++) ops_seen += seen[op] > 0;
    // RandAugment's 15 ops make 11 kinds of step (rotate, shear and translate are all affine;
    // the transpose needs an angle of a multiple of 90, which these magnitudes never give).
    int want_ops = policies[k].spec ? IMAGE_AUG_OPS - 2 : 3;
    test_check(differ == 0 && ops_seen == want_ops,
               "image_aug_batch_cpu = %s (%s), random draws: %d images (37x53 and 224x224, RGB "
               "and gray), lists of up to %d steps, %d kinds of step drawn (want %d), 2 scratch "
               "poisons: %lld bytes differ (tol 0)",
               policies[k].spec ? "randaugment_image" : "color_jitter_image",
               policies[k].spec ? policies[k].spec : "ColorJitter 0.4", images, most, ops_seen,
               want_ops, (long long)differ);
  }
}

// ---- the draw split ----

// randaugment.c's Box-Muller, as the old randaugment_image drew it.
static double old_normal(Rng *rng) {
  double u = 1.0 - rng_uniform_double(rng), v = rng_uniform_double(rng);
  return sqrt(-2.0 * log(u)) * cos(2.0 * 3.14159265358979323846 * v);
}

// randaugment_apply before the steps: the op's image_ops call on its argument.
static void old_apply(RandAugmentOp op, double arg, Interp interp, const uint8_t *fill,
                      uint8_t *img, int h, int w, int chans, uint8_t *scratch) {
  int64_t n = (int64_t)h * w * chans;
  ImageView v = image_view(scratch, h, w, chans);
  double m[6] = {1, 0, 0, 0, 1, 0};
  switch (op) {
    case RA_AUTOCONTRAST:
      image_autocontrast(img, h, w, chans);
      return;
    case RA_EQUALIZE:
      image_equalize(img, h, w, chans);
      return;
    case RA_INVERT:
      image_invert(img, n);
      return;
    case RA_POSTERIZE:
      image_posterize(img, n, (int)arg);
      return;
    case RA_SOLARIZE:
      image_solarize(img, n, (int)arg);
      return;
    case RA_SOLARIZE_ADD:
      image_solarize_add(img, n, (int)arg, 128);
      return;
    case RA_COLOR:
      image_enhance_color(img, h, w, chans, arg);
      return;
    case RA_CONTRAST:
      image_enhance_contrast(img, h, w, chans, arg);
      return;
    case RA_BRIGHTNESS:
      image_enhance_brightness(img, h, w, chans, arg);
      return;
    case RA_SHARPNESS:
      image_enhance_sharpness(img, h, w, chans, arg);
      return;
    case RA_ROTATE:
      memcpy(scratch, img, (size_t)n);
      image_rotate(v, arg, interp, fill, img);
      return;
    case RA_SHEAR_X:
      m[1] = arg;
      break;
    case RA_SHEAR_Y:
      m[3] = arg;
      break;
    case RA_TRANSLATE_X_REL:
      m[2] = arg * w;
      break;
    case RA_TRANSLATE_Y_REL:
      m[5] = arg * h;
      break;
    default:
      return;
  }
  memcpy(scratch, img, (size_t)n);
  image_affine(v, m, interp, fill, img);
}

// randaugment_image before the split: each op's draws, then the op, then the next op's draws.
static void old_randaugment_image(const RandAugmentPolicy *p, ResampleChoice resample,
                                  const uint8_t *fill, uint8_t *img, int h, int w, int chans,
                                  Rng *rng) {
  uint8_t *scratch = malloc_check((size_t)h * w * chans);
  for (int i = 0; i < p->num_ops; i++) {
    RandAugmentOp op = (RandAugmentOp)rng_below(rng, RA_NUM_OPS);
    if (p->prob < 1.0 && rng_uniform_double(rng) > p->prob) continue;
    double magnitude = p->magnitude;
    if (isinf(p->magnitude_std))
      magnitude = rng_uniform_double(rng) * magnitude;
    else if (p->magnitude_std > 0)
      magnitude += p->magnitude_std * old_normal(rng);
    double upper = p->magnitude_max > 0 ? p->magnitude_max : 10.0;
    magnitude = magnitude < upper ? magnitude : upper;
    magnitude = magnitude > 0 ? magnitude : 0;
    bool negate = rng_uniform_double(rng) > 0.5;
    Interp interp = test_aug_geometric(op) ? resample_pick(resample, rng) : INTERP_BILINEAR;
    double arg = randaugment_op_arg(op, p->increasing, magnitude, negate);
    old_apply(op, arg, interp, fill, img, h, w, chans, scratch);
  }
  free(scratch);
}

// color_jitter_image before the split.
static void old_color_jitter_image(float jitter, uint8_t *img, int h, int w, int chans, Rng *rng) {
  int order[4] = {0, 1, 2, 3};
  for (int i = 3; i > 0; i--) {
    int j = (int)rng_below(rng, (uint32_t)(i + 1));
    int t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  double lo = 1.0 - jitter > 0 ? 1.0 - jitter : 0, hi = 1.0 + jitter;
  double factor[3];
  for (int k = 0; k < 3; k++) factor[k] = lo + (hi - lo) * rng_uniform_double(rng);
  for (int i = 0; i < 4; i++) {
    if (order[i] == 0) image_enhance_brightness(img, h, w, chans, factor[0]);
    if (order[i] == 1) image_enhance_contrast(img, h, w, chans, factor[1]);
    if (order[i] == 2) image_enhance_color(img, h, w, chans, factor[2]);
  }
}

// randaugment_apply (now randaugment_step + image_apply_step) = the old image_ops calls, for
// every fixed-argument case's op and argument, and past the ends of posterize's bits.
static void test_apply_unchanged(TestRng *r) {
  enum { H = 29, W = 41 };
  int cases = 0;
  int64_t differ = 0;
  static const double mags[] = {0, 3, 9, 10, 14};
  for (int chans = 1; chans <= 3; chans += 2) {
    uint8_t src[H * W * 3], a[H * W * 3], b[H * W * 3], scratch[H * W * 3];
    for (int op = 0; op < RA_NUM_OPS; op++) {
      for (int inc = 0; inc <= 1; inc++) {
        for (int m = 0; m < 5; m++) {
          for (int neg = 0; neg <= 1; neg++) {
            for (int ip = 0; ip <= 1; ip++) {
              test_aug_image(r, src, H, W, chans);
              double arg = randaugment_op_arg((RandAugmentOp)op, inc, mags[m], neg);
              memcpy(a, src, sizeof src);
              memcpy(b, src, sizeof src);
              old_apply((RandAugmentOp)op, arg, (Interp)ip, fill_for(chans), a, H, W, chans,
                        scratch);
              randaugment_apply((RandAugmentOp)op, arg, (Interp)ip, fill_for(chans), b, H, W, chans,
                                scratch);
              char what[96];
              snprintf(what, sizeof what, "randaugment_apply %s m%g%s %s",
                       randaugment_op_name((RandAugmentOp)op, inc), mags[m], neg ? " neg" : "",
                       ip ? "bicubic" : "bilinear");
              differ += test_aug_compare(what, 0, b, a, H, W, chans);
              cases++;
            }
          }
        }
      }
    }
    for (int bits = -20; bits <= 12; bits++) {
      test_aug_image(r, src, H, W, chans);
      memcpy(a, src, sizeof src);
      memcpy(b, src, sizeof src);
      old_apply(RA_POSTERIZE, bits, INTERP_BILINEAR, NULL, a, H, W, chans, scratch);
      randaugment_apply(RA_POSTERIZE, bits, INTERP_BILINEAR, NULL, b, H, W, chans, scratch);
      char what[64];
      snprintf(what, sizeof what, "randaugment_apply Posterize %d bits", bits);
      differ += test_aug_compare(what, 0, b, a, H, W, chans);
      cases++;
    }
  }
  test_check(differ == 0,
             "randaugment_apply through steps = the image_ops calls it made before: %d cases "
             "(every op of both sets, magnitudes 0-14, both signs and interpolations, posterize "
             "-20..12 bits), %lld bytes differ (tol 0)",
             cases, (long long)differ);
}

// randaugment_image and color_jitter_image, now draw + apply, give the old interleaved order's
// bytes and leave the generator where it left it.
static void test_draw_order(TestRng *r) {
  static const char *const specs[] = {"rand-m9-mstd0.5-inc1", "rand-m9-mstd0.5",
                                      "rand-m7-n3-mstd101-p0.6", "rand-m10-n16-p1-inc1",
                                      "rand-m5-n2-mmax20-mstd2-inc1"};
  enum { H = 31, W = 24 };
  int images = 0, rng_bad = 0;
  int64_t differ = 0;
  for (size_t k = 0; k < sizeof specs / sizeof specs[0]; k++) {
    RandAugmentPolicy p;
    Error err;
    if (randaugment_parse(&p, specs[k], &err) != 0) {
      test_check(0, "randaugment_parse '%s': %s", specs[k], err.msg);
      continue;
    }
    for (int i = 0; i < 80; i++) {
      int chans = i % 3 == 0 ? 1 : 3;
      uint8_t src[H * W * 3], a[H * W * 3], b[H * W * 3];
      test_aug_image(r, src, H, W, chans);
      memcpy(a, src, sizeof src);
      memcpy(b, src, sizeof src);
      Rng ra = rng_make(7, RNG_STREAM_AUGMENT, k, (uint64_t)i), rb = ra;
      ResampleChoice rs = (ResampleChoice)(i % 3);
      old_randaugment_image(&p, rs, fill_for(chans), a, H, W, chans, &ra);
      randaugment_image(&p, rs, fill_for(chans), b, H, W, chans, &rb);
      char what[96];
      snprintf(what, sizeof what, "randaugment_image %s, draw %d", specs[k], i);
      differ += test_aug_compare(what, i, b, a, H, W, chans);
      rng_bad += rng_u32(&ra) != rng_u32(&rb);
      images++;
    }
  }
  for (int i = 0; i < 120; i++) {
    int chans = i % 3 == 0 ? 1 : 3;
    uint8_t src[H * W * 3], a[H * W * 3], b[H * W * 3];
    test_aug_image(r, src, H, W, chans);
    memcpy(a, src, sizeof src);
    memcpy(b, src, sizeof src);
    Rng ra = rng_make(7, RNG_STREAM_AUGMENT, 99, (uint64_t)i), rb = ra;
    float jitter = i % 2 ? 0.4f : 1.3f;  // 1.3: the lower bound clamps at 0
    old_color_jitter_image(jitter, a, H, W, chans, &ra);
    color_jitter_image(jitter, b, H, W, chans, &rb);
    char what[64];
    snprintf(what, sizeof what, "color_jitter_image %g, draw %d", jitter, i);
    differ += test_aug_compare(what, i, b, a, H, W, chans);
    rng_bad += rng_u32(&ra) != rng_u32(&rb);
    images++;
  }
  test_check(differ == 0 && rng_bad == 0,
             "randaugment_image / color_jitter_image (draw, then apply) = the old interleaved "
             "draws and ops: %d images, 5 policies and 2 jitters, %lld bytes differ (tol 0), "
             "%d generators left elsewhere",
             images, (long long)differ, rng_bad);
}

// transform_color_draw: RandAugment's draws, else ColorJitter's, else none; transform_train_color
// is those steps on the CPU.
static void test_transform_draw(TestRng *r) {
  enum { S = 20 };
  TransformParams base = {
      .out_h = S, .out_w = S + 3, .chans = 3, .resample = RESAMPLE_RANDOM, .fill = {10, 20, 30}};
  Error err;
  TransformParams ra = base, jit = base, none = base;
  randaugment_parse(&ra.randaugment, "rand-m9-mstd0.5-inc1", &err);
  jit.color_jitter = 0.4f;
  jit.randaugment.enabled = false;
  none.randaugment.enabled = false;
  int bad = 0;
  for (int i = 0; i < 50; i++) {
    const TransformParams *ps[3] = {&ra, &jit, &none};
    for (int k = 0; k < 3; k++) {
      Rng a = rng_make(1, RNG_STREAM_AUGMENT, 0, (uint64_t)i), b = a, c = a;
      ImageAugStep got[IMAGE_AUG_MAX_STEPS], want[IMAGE_AUG_MAX_STEPS];
      memset(got, 0, sizeof got);
      memset(want, 0, sizeof want);
      int n = transform_color_draw(ps[k], &a, got, IMAGE_AUG_MAX_STEPS), m = 0;
      if (k == 0)
        m = randaugment_draw(&ra.randaugment, ra.resample, S, S + 3, &b, want, IMAGE_AUG_MAX_STEPS);
      if (k == 1) m = color_jitter_draw(0.4f, &b, want, IMAGE_AUG_MAX_STEPS);
      bad += n != m || memcmp(got, want, sizeof got) != 0 || rng_u32(&a) != rng_u32(&b);
      uint8_t img[S * (S + 3) * 3], ref[S * (S + 3) * 3];
      test_aug_image(r, img, S, S + 3, 3);
      memcpy(ref, img, sizeof img);
      image_apply_steps(got, n, ps[k]->fill, ref, S, S + 3, 3);
      transform_train_color(ps[k], img, 3, &c);
      bad += memcmp(img, ref, sizeof img) != 0;
    }
  }
  test_check(bad == 0,
             "transform_color_draw = randaugment_draw / color_jitter_draw / no steps, and "
             "transform_train_color = its steps by image_apply_steps (150 samples, %d wrong)",
             bad);
  RandAugmentPolicy p;
  int rc = randaugment_parse(&p, "rand-m9-n17", &err);
  test_check(rc != 0 && strstr(err.msg, "'rand-m9-n17'") && strstr(err.msg, "n <= 16"),
             "randaugment_parse refuses more ops than a step list holds: \"%.80s\"",
             rc ? err.msg : "(accepted)");
}

int main(void) {
  TestRng r = {20261202};
  test_fixed(&r);
  test_random(&r);
  test_apply_unchanged(&r);
  test_draw_order(&r);
  test_transform_draw(&r);
  return test_finish();
}
