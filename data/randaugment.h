// randaugment.h: timm's RandAugment and torchvision's ColorJitter on uint8 HWC images (1 or 3
// channels), built from the Pillow-exact operations of image_ops.h.
//
// RandAugment (timm rand_augment_transform, e.g. "rand-m9-mstd0.5-inc1"): num_ops operations are
// chosen uniformly with replacement from the 15-op set (the "increasing" set with inc1: posterize,
// solarize and the enhancers grow stronger with the magnitude); each is applied with probability
// prob at a magnitude drawn from N(m, mstd) (uniform in [0, m] when mstd > 100), clamped to
// [0, mmax]; signed ops take a random sign; geometric ops fill with the mean pixel and resample
// bilinear, bicubic or, with data.interpolation = random, either at random.
//
// ColorJitter(b, c, s) as timm builds it when RandAugment is off: brightness, contrast and
// saturation factors uniform in [max(0, 1 - j), 1 + j], applied in a random order (Pillow's
// ImageEnhance Brightness, Contrast and Color).
//
// The random draws come from the sample's Rng (seed, epoch, sample index), so they differ from
// Python's but have the same distributions; for fixed choices (op, magnitude, sign) the output
// bytes equal timm's (tests/test_aug_parity.c).
//
// Drawing and applying are apart: randaugment_draw and color_jitter_draw turn a sample's draws
// into steps (kernels/image_aug.h), which image_apply_step runs on the CPU and
// image_aug_batch_cuda on a batch on the GPU, to the same bytes; randaugment_image and
// color_jitter_image are the two in sequence.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "data/image_ops.h"
#include "kernels/image_aug.h"
#include "src/base/rng.h"
#include "src/base/util.h"

// The steps color_jitter_draw makes: brightness, contrast and saturation. (The most a spec's n
// may ask of randaugment_draw is IMAGE_AUG_MAX_STEPS.)
#define COLOR_JITTER_STEPS 3

typedef enum { RESAMPLE_BILINEAR = 0, RESAMPLE_BICUBIC = 1, RESAMPLE_RANDOM = 2 } ResampleChoice;

typedef struct {
  bool enabled;
  bool increasing;       // inc1: the increasing-severity op set
  int num_ops;           // n (default 2)
  double magnitude;      // m (default 10)
  double magnitude_std;  // mstd (default 0; INFINITY: uniform in [0, m])
  double magnitude_max;  // mmax (default 10)
  double prob;           // p: probability of applying each chosen op (default 0.5)
} RandAugmentPolicy;

// Parses a timm spec ("rand-m9-mstd0.5-inc1"; sections m, n, mstd, mmax, inc, p). "" gives a
// disabled policy. Errors name the spec and the bad section.
int randaugment_parse(RandAugmentPolicy *p, const char *spec, Error *err);

typedef enum {
  RA_AUTOCONTRAST,
  RA_EQUALIZE,
  RA_INVERT,
  RA_ROTATE,
  RA_POSTERIZE,
  RA_SOLARIZE,
  RA_SOLARIZE_ADD,
  RA_COLOR,
  RA_CONTRAST,
  RA_BRIGHTNESS,
  RA_SHARPNESS,
  RA_SHEAR_X,
  RA_SHEAR_Y,
  RA_TRANSLATE_X_REL,
  RA_TRANSLATE_Y_REL,
  RA_NUM_OPS
} RandAugmentOp;

// timm's op name ("Rotate", "PosterizeIncreasing", ...) for the chosen set.
const char *randaugment_op_name(RandAugmentOp op, bool increasing);
// timm's level function: the op's argument at the (already clamped) magnitude, with the random
// sign applied when negate. Unsigned ops ignore negate.
double randaugment_op_arg(RandAugmentOp op, bool increasing, double magnitude, bool negate);
// The step of op with argument arg (as randaugment_op_arg returns) on an (h, w) image: the
// geometric ops as an affine matrix (shear, translate: timm's; rotate: image_rotation's, or its
// quarter-turn transpose) resampled with interp, the rest with their argument.
ImageAugStep randaugment_step(RandAugmentOp op, double arg, Interp interp, int h, int w);
// Applies that step to img (h, w, chans) in place; fill (chans) is the geometric ops' outside
// colour; scratch holds h * w * chans bytes.
void randaugment_apply(RandAugmentOp op, double arg, Interp interp, const uint8_t *fill,
                       uint8_t *img, int h, int w, int chans, uint8_t *scratch);

// A RandAugment pass's draws for an (h, w) image, from rng: for each of p->num_ops ops, the op,
// whether it is applied, its magnitude, its sign and (geometric ops) its interpolation, in that
// order; each applied op becomes a step in steps, in order. Returns the step count (at most
// p->num_ops; skipped ops make none). max_steps >= p->num_ops (IMAGE_AUG_MAX_STEPS always is):
// the draws past it are still made, so rng ends in the same place, but their steps are dropped.
int randaugment_draw(const RandAugmentPolicy *p, ResampleChoice resample, int h, int w, Rng *rng,
                     ImageAugStep *steps, int max_steps);
// A full RandAugment pass over img (h, w, chans), draws from rng: randaugment_draw, then each
// step by image_apply_step.
void randaugment_image(const RandAugmentPolicy *p, ResampleChoice resample, const uint8_t *fill,
                       uint8_t *img, int h, int w, int chans, Rng *rng);

// ColorJitter(j, j, j)'s draws from rng (j > 0): torchvision's random order of the adjustments,
// then the three factors; returns the COLOR_JITTER_STEPS steps written to steps (the first
// max_steps of them, as randaugment_draw).
int color_jitter_draw(float jitter, Rng *rng, ImageAugStep *steps, int max_steps);
// ColorJitter(j, j, j) over img (h, w, chans), draws from rng; j > 0.
void color_jitter_image(float jitter, uint8_t *img, int h, int w, int chans, Rng *rng);
// The deterministic part as COLOR_JITTER_STEPS steps: the adjustments in `order` (a permutation
// of 0..3: brightness, contrast, saturation, hue; hue does nothing) with factors factor[0..2], as
// torchvision's adjust_brightness / adjust_contrast / adjust_saturation do on PIL images.
void color_jitter_steps(const int order[4], const double factor[3], ImageAugStep *steps);
// Those steps applied to img (h, w, chans) in place.
void color_jitter_apply(const int order[4], const double factor[3], uint8_t *img, int h, int w,
                        int chans);

// The interpolation a resize or op uses: fixed, or drawn from rng for RESAMPLE_RANDOM.
Interp resample_pick(ResampleChoice choice, Rng *rng);
