// randaugment.c: timm's RandAugment policy and ColorJitter over the Pillow-exact ops of
// image_ops.c (see randaugment.h). The level functions copy timm's arithmetic (in double, in its
// order), so a magnitude maps to the same argument.
#define _POSIX_C_SOURCE 200809L  // strtok_r
#include "data/randaugment.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LEVEL_DENOM 10.0
_Static_assert(COLOR_JITTER_STEPS <= IMAGE_AUG_MAX_STEPS, "a ColorJitter pass fits a step list");
#define PI_DOUBLE 3.14159265358979323846

int randaugment_parse(RandAugmentPolicy *p, const char *spec, Error *err) {
  *p = (RandAugmentPolicy){.enabled = false,
                           .increasing = false,
                           .num_ops = 2,
                           .magnitude = LEVEL_DENOM,
                           .magnitude_std = 0,
                           .magnitude_max = LEVEL_DENOM,
                           .prob = 0.5};
  if (spec[0] == '\0') return 0;
  const char *hint =
      "HINT: a RandAugment spec is 'rand' followed by -m<int> (magnitude), -n<int> (ops per "
      "image), -mstd<float>, -mmax<int>, -inc<0|1>, -p<float>, e.g. rand-m9-mstd0.5-inc1";
  char buf[128];
  if (strlen(spec) >= sizeof buf)
    return error_set(err, "data.randaugment '%s' is too long\n%s", spec, hint);
  snprintf(buf, sizeof buf, "%s", spec);
  char *save = NULL, *section = strtok_r(buf, "-", &save);
  if (!section || strcmp(section, "rand") != 0)
    return error_set(err, "data.randaugment '%s' does not start with 'rand'\n%s", spec, hint);
  while ((section = strtok_r(NULL, "-", &save)) != NULL) {
    // timm splits each section at its first digit: key, then the number.
    size_t key_len = strcspn(section, "0123456789");
    const char *val = section + key_len;
    char *end;
    double v = strtod(val, &end);
    if (key_len == 0 || *val == '\0' || *end != '\0' || !isfinite(v) || v < 0)
      return error_set(err, "data.randaugment '%s': bad section '%s'\n%s", spec, section, hint);
    if (strncmp(section, "mstd", key_len) == 0 && key_len == 4)
      p->magnitude_std = v > 100 ? INFINITY : v;  // timm: > 100 means uniform in [0, m]
    else if (strncmp(section, "mmax", key_len) == 0 && key_len == 4)
      p->magnitude_max = (int)v;
    else if (strncmp(section, "inc", key_len) == 0 && key_len == 3)
      p->increasing = v != 0;
    else if (strncmp(section, "m", key_len) == 0 && key_len == 1)
      p->magnitude = (int)v;
    else if (strncmp(section, "n", key_len) == 0 && key_len == 1)
      p->num_ops = (int)v;
    else if (strncmp(section, "p", key_len) == 0 && key_len == 1)
      p->prob = v;
    else
      return error_set(err, "data.randaugment '%s': unknown section '%s'\n%s", spec, section, hint);
  }
  if (p->num_ops < 1 || p->num_ops > IMAGE_AUG_MAX_STEPS || p->prob > 1)
    return error_set(err, "data.randaugment '%s': need 1 <= n <= %d and p <= 1\n%s", spec,
                     IMAGE_AUG_MAX_STEPS, hint);
  p->enabled = true;
  return 0;
}

const char *randaugment_op_name(RandAugmentOp op, bool increasing) {
  static const char *const plain[RA_NUM_OPS] = {
      "AutoContrast", "Equalize",    "Invert", "Rotate",        "Posterize",
      "Solarize",     "SolarizeAdd", "Color",  "Contrast",      "Brightness",
      "Sharpness",    "ShearX",      "ShearY", "TranslateXRel", "TranslateYRel"};
  static const char *const inc[RA_NUM_OPS] = {"AutoContrast",
                                              "Equalize",
                                              "Invert",
                                              "Rotate",
                                              "PosterizeIncreasing",
                                              "SolarizeIncreasing",
                                              "SolarizeAdd",
                                              "ColorIncreasing",
                                              "ContrastIncreasing",
                                              "BrightnessIncreasing",
                                              "SharpnessIncreasing",
                                              "ShearX",
                                              "ShearY",
                                              "TranslateXRel",
                                              "TranslateYRel"};
  return op >= 0 && op < RA_NUM_OPS ? (increasing ? inc : plain)[op] : "?";
}

double randaugment_op_arg(RandAugmentOp op, bool increasing, double magnitude, bool negate) {
  double level;
  switch (op) {
    case RA_ROTATE:  // [-30, 30] degrees
      level = (magnitude / LEVEL_DENOM) * 30.;
      return negate ? -level : level;
    case RA_SHEAR_X:
    case RA_SHEAR_Y:  // [-0.3, 0.3]
      level = (magnitude / LEVEL_DENOM) * 0.3;
      return negate ? -level : level;
    case RA_TRANSLATE_X_REL:
    case RA_TRANSLATE_Y_REL:  // [-0.45, 0.45] of the side
      level = (magnitude / LEVEL_DENOM) * 0.45;
      return negate ? -level : level;
    case RA_POSTERIZE: {  // bits kept: 4 -> 0 (increasing) or 0 -> 4
      int bits = (int)((magnitude / LEVEL_DENOM) * 4);
      return increasing ? 4 - bits : bits;
    }
    case RA_SOLARIZE: {  // threshold: 256 -> 0 (increasing) or 0 -> 256
      int t = (int)((magnitude / LEVEL_DENOM) * 256);
      t = t < 256 ? t : 256;
      return increasing ? 256 - t : t;
    }
    case RA_SOLARIZE_ADD: {  // [0, 110]
      int add = (int)((magnitude / LEVEL_DENOM) * 110);
      return add < 128 ? add : 128;
    }
    case RA_COLOR:
    case RA_CONTRAST:
    case RA_BRIGHTNESS:
    case RA_SHARPNESS:
      if (!increasing) return (magnitude / LEVEL_DENOM) * 1.8 + 0.1;  // [0.1, 1.9]
      level = (magnitude / LEVEL_DENOM) * .9;
      level = 1.0 + (negate ? -level : level);
      return level > 0.1 ? level : 0.1;
    default:
      return 0;
  }
}

ImageAugStep randaugment_step(RandAugmentOp op, double arg, Interp interp, int h, int w) {
  ImageAugStep s = {.op = IMAGE_AUG_NONE,
                    .bicubic = interp == INTERP_BICUBIC,
                    .factor = arg,
                    .matrix = {1, 0, 0, 0, 1, 0}};
  switch (op) {
    case RA_AUTOCONTRAST:
      s.op = IMAGE_AUG_AUTOCONTRAST;
      return s;
    case RA_EQUALIZE:
      s.op = IMAGE_AUG_EQUALIZE;
      return s;
    case RA_INVERT:
      s.op = IMAGE_AUG_INVERT;
      return s;
    case RA_POSTERIZE: {
      // Fewer than 0 bits (an mmax above 10) keeps none, as 0 does; 8 or more keeps all.
      int bits = (int)arg;
      s.op = IMAGE_AUG_POSTERIZE;
      s.level = bits < 0 ? 0 : bits > 8 ? 8 : bits;
      return s;
    }
    case RA_SOLARIZE:
      s.op = IMAGE_AUG_SOLARIZE;
      s.level = (int)arg;
      return s;
    case RA_SOLARIZE_ADD:
      s.op = IMAGE_AUG_SOLARIZE_ADD;
      s.level = (int)arg;
      return s;
    case RA_COLOR:
      s.op = IMAGE_AUG_COLOR;
      return s;
    case RA_CONTRAST:
      s.op = IMAGE_AUG_CONTRAST;
      return s;
    case RA_BRIGHTNESS:
      s.op = IMAGE_AUG_BRIGHTNESS;
      return s;
    case RA_SHARPNESS:
      s.op = IMAGE_AUG_SHARPNESS;
      return s;
    case RA_ROTATE: {
      ImageRotation rot = image_rotation(h, w, arg);
      if (rot.quarters >= 0) {
        s.op = IMAGE_AUG_TRANSPOSE;
        s.level = rot.quarters;
      } else {
        s.op = IMAGE_AUG_AFFINE;
        memcpy(s.matrix, rot.matrix, sizeof s.matrix);
      }
      return s;
    }
    case RA_SHEAR_X:
      s.matrix[1] = arg;
      break;
    case RA_SHEAR_Y:
      s.matrix[3] = arg;
      break;
    case RA_TRANSLATE_X_REL:
      s.matrix[2] = arg * w;
      break;
    case RA_TRANSLATE_Y_REL:
      s.matrix[5] = arg * h;
      break;
    default:
      return s;
  }
  s.op = IMAGE_AUG_AFFINE;
  return s;
}

void randaugment_apply(RandAugmentOp op, double arg, Interp interp, const uint8_t *fill,
                       uint8_t *img, int h, int w, int chans, uint8_t *scratch) {
  ImageAugStep s = randaugment_step(op, arg, interp, h, w);
  image_apply_step(&s, fill, img, h, w, chans, scratch);
}

Interp resample_pick(ResampleChoice choice, Rng *rng) {
  if (choice == RESAMPLE_RANDOM) return rng_uniform(rng) < 0.5f ? INTERP_BILINEAR : INTERP_BICUBIC;
  return choice == RESAMPLE_BICUBIC ? INTERP_BICUBIC : INTERP_BILINEAR;
}

// A standard normal from two 53-bit uniforms (Box-Muller; host only, libm is fine here).
static double normal_double(Rng *rng) {
  double u = 1.0 - rng_uniform_double(rng), v = rng_uniform_double(rng);
  return sqrt(-2.0 * log(u)) * cos(2.0 * PI_DOUBLE * v);
}

static bool op_is_geometric(RandAugmentOp op) {
  return op == RA_ROTATE || op == RA_SHEAR_X || op == RA_SHEAR_Y || op == RA_TRANSLATE_X_REL ||
         op == RA_TRANSLATE_Y_REL;
}

int randaugment_draw(const RandAugmentPolicy *p, ResampleChoice resample, int h, int w, Rng *rng,
                     ImageAugStep *steps, int max_steps) {
  int n = 0;
  for (int i = 0; i < p->num_ops; i++) {
    RandAugmentOp op = (RandAugmentOp)rng_below(rng, RA_NUM_OPS);
    // timm: skipped when random() > prob.
    if (p->prob < 1.0 && rng_uniform_double(rng) > p->prob) continue;
    double magnitude = p->magnitude;
    if (isinf(p->magnitude_std))
      magnitude = rng_uniform_double(rng) * magnitude;
    else if (p->magnitude_std > 0)
      magnitude += p->magnitude_std * normal_double(rng);
    double upper = p->magnitude_max > 0 ? p->magnitude_max : LEVEL_DENOM;
    magnitude = magnitude < upper ? magnitude : upper;
    magnitude = magnitude > 0 ? magnitude : 0;
    bool negate = rng_uniform_double(rng) > 0.5;  // timm's _randomly_negate
    Interp interp = op_is_geometric(op) ? resample_pick(resample, rng) : INTERP_BILINEAR;
    double arg = randaugment_op_arg(op, p->increasing, magnitude, negate);
    if (n < max_steps) steps[n++] = randaugment_step(op, arg, interp, h, w);
  }
  return n;
}

void randaugment_image(const RandAugmentPolicy *p, ResampleChoice resample, const uint8_t *fill,
                       uint8_t *img, int h, int w, int chans, Rng *rng) {
  ImageAugStep steps[IMAGE_AUG_MAX_STEPS];
  int n = randaugment_draw(p, resample, h, w, rng, steps, IMAGE_AUG_MAX_STEPS);
  image_apply_steps(steps, n, fill, img, h, w, chans);
}

int color_jitter_draw(float jitter, Rng *rng, ImageAugStep *steps, int max_steps) {
  // torchvision's get_params: a random order of the four adjustments, then the factors; hue is
  // off (timm passes 0), so its slot does nothing.
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
  ImageAugStep all[COLOR_JITTER_STEPS];
  color_jitter_steps(order, factor, all);
  int n = max_steps < COLOR_JITTER_STEPS ? max_steps : COLOR_JITTER_STEPS;
  memcpy(steps, all, sizeof(ImageAugStep) * (size_t)(n > 0 ? n : 0));
  return n > 0 ? n : 0;
}

void color_jitter_image(float jitter, uint8_t *img, int h, int w, int chans, Rng *rng) {
  ImageAugStep steps[COLOR_JITTER_STEPS];
  int n = color_jitter_draw(jitter, rng, steps, COLOR_JITTER_STEPS);
  image_apply_steps(steps, n, NULL, img, h, w, chans);
}

void color_jitter_steps(const int order[4], const double factor[3], ImageAugStep *steps) {
  static const int32_t ops[3] = {IMAGE_AUG_BRIGHTNESS, IMAGE_AUG_CONTRAST, IMAGE_AUG_COLOR};
  int n = 0;
  for (int i = 0; i < 4; i++)
    if (order[i] < 3) steps[n++] = (ImageAugStep){.op = ops[order[i]], .factor = factor[order[i]]};
}

void color_jitter_apply(const int order[4], const double factor[3], uint8_t *img, int h, int w,
                        int chans) {
  ImageAugStep steps[COLOR_JITTER_STEPS];
  color_jitter_steps(order, factor, steps);
  image_apply_steps(steps, COLOR_JITTER_STEPS, NULL, img, h, w, chans);
}
