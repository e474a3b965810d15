// image_aug.h: a batch's colour and geometric augmentations (RandAugment's 15 ops, ColorJitter's
// three) on uint8 HWC images (1 or 3 channels), each image with its own list of steps: the
// loader's colour part on the GPU, right after the resize (kernels/resize.h, data/jpeg_gpu.h).
//
// The spec is the CPU path, data/image_ops.c (Pillow-exact; tests/test_aug_parity.c checks it
// against Pillow): the host draws the steps (randaugment_draw, color_jitter_draw in
// data/randaugment.h; shear, translate and rotate become an affine matrix or a quarter-turn
// transpose there, computed once on the host) and image_apply_step (data/image_ops.h) runs one on
// the CPU. The per-pixel code below is a port of image_ops.c's scalar code, each float and double
// expression in its evaluation order, which the CPU compiles with -ffp-contract=off and nvcc with
// --fmad=false (CMakeLists.txt): every operation is then one IEEE rounding on both sides, so the
// bytes are the same. The histograms behind autocontrast, equalize and contrast are integer
// counts (exact in any summation order: shared-memory atomics on the GPU), and their tables are
// computed by the same functions on both sides.
//
// A batch: images (count, h, w, chans), all one size; steps (count * nsteps), step s of image i
// at [i * nsteps + s], IMAGE_AUG_NONE where an image has fewer; one fill colour (the geometric
// ops' outside points); a scratch buffer of the images' size. Step s runs on every image before
// step s + 1 (one or two launches per step on the GPU). image_aug_batch_cpu is the plain form of
// the kernels, with the same per-pixel code; tests/test_image_aug.c checks it against the CPU
// path where no GPU is, tests/test_gpu_image_aug.c the kernels against it.
#pragma once
#include <stdint.h>
#ifdef SWIN_HAVE_CUDA
#include <cuda_runtime.h>  // outside the extern "C" block: it declares C++ templates
#endif

#include "src/base/hostdev.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  IMAGE_AUG_NONE = 0,      // the image is left alone
  IMAGE_AUG_AUTOCONTRAST,  // ImageOps.autocontrast, each channel by its own histogram
  IMAGE_AUG_EQUALIZE,      // ImageOps.equalize, each channel by its own histogram
  IMAGE_AUG_INVERT,
  IMAGE_AUG_POSTERIZE,     // level: the bits kept, 0..8
  IMAGE_AUG_SOLARIZE,      // level: the threshold (v >= level -> 255 - v), 0..256
  IMAGE_AUG_SOLARIZE_ADD,  // level: added to v < IMAGE_AUG_SOLARIZE_ADD_BELOW, clipped at 255
  IMAGE_AUG_COLOR,         // ImageEnhance with factor: saturation (identity on gray)
  IMAGE_AUG_CONTRAST,      //   against the mean of the luma
  IMAGE_AUG_BRIGHTNESS,    //   against black
  IMAGE_AUG_SHARPNESS,     //   against ImageFilter.SMOOTH
  IMAGE_AUG_AFFINE,        // Image.transform(AFFINE, matrix), bilinear or bicubic, fill outside
  IMAGE_AUG_TRANSPOSE,     // level: quarter turns counter-clockwise (Pillow's rotate fast paths:
                           // 0, 2, and 1 or 3 of a square image)
  IMAGE_AUG_OPS
} ImageAugOp;

// The most steps one image takes: RandAugment's ops per image (its spec's n) are capped at this
// (randaugment_parse), and ColorJitter makes 3.
#define IMAGE_AUG_MAX_STEPS 16

// timm's solarize_add threshold.
#define IMAGE_AUG_SOLARIZE_ADD_BELOW 128

// One step of one image.
typedef struct {
  int32_t op;        // ImageAugOp
  int32_t level;     // the integer argument (see ImageAugOp)
  int32_t bicubic;   // AFFINE: 1 bicubic (Pillow's a = -1 cubic), 0 bilinear
  int32_t unused;    // the padding made explicit: the doubles start at byte 16 everywhere
  double factor;     // COLOR, CONTRAST, BRIGHTNESS, SHARPNESS: the enhancement (1 = unchanged)
  double matrix[6];  // AFFINE: output (x, y) reads the source at (m0 (x + .5) + m1 (y + .5) + m2,
                     // m3 (x + .5) + m4 (y + .5) + m5)
} ImageAugStep;

// The geometric ops' outside colour, one value per channel (the batch's mean pixel).
typedef struct {
  uint8_t v[4];
} ImageAugFill;

// ---- per-pixel code, shared by image_aug_batch_cpu and the CUDA kernels ----

// How a step runs: on each pixel in place; after a histogram of the whole image, in place; or
// from a copy of the image (the geometric ops and the 3x3 filter read neighbours).
typedef enum {
  IMAGE_AUG_PASS_NONE,
  IMAGE_AUG_PASS_PIXEL,
  IMAGE_AUG_PASS_HISTOGRAM,
  IMAGE_AUG_PASS_COPY
} ImageAugPass;

static inline SWIN_HOSTDEV ImageAugPass image_aug_pass(int32_t op) {
  switch (op) {
    case IMAGE_AUG_INVERT:
    case IMAGE_AUG_POSTERIZE:
    case IMAGE_AUG_SOLARIZE:
    case IMAGE_AUG_SOLARIZE_ADD:
    case IMAGE_AUG_COLOR:
    case IMAGE_AUG_BRIGHTNESS:
      return IMAGE_AUG_PASS_PIXEL;
    case IMAGE_AUG_AUTOCONTRAST:
    case IMAGE_AUG_EQUALIZE:
    case IMAGE_AUG_CONTRAST:
      return IMAGE_AUG_PASS_HISTOGRAM;
    case IMAGE_AUG_SHARPNESS:
    case IMAGE_AUG_AFFINE:
    case IMAGE_AUG_TRANSPOSE:
      return IMAGE_AUG_PASS_COPY;
    default:
      return IMAGE_AUG_PASS_NONE;
  }
}

// Pillow's convert("L") of RGB: ITU-R 601-2 luma in 16-bit fixed point.
static inline SWIN_HOSTDEV uint8_t image_aug_luma(const uint8_t *rgb) {
  return (uint8_t)((rgb[0] * 19595 + rgb[1] * 38470 + rgb[2] * 7471 + 0x8000) >> 16);
}

// Blend.c's Image.blend(degenerate, image, alpha) of one element: an fp32 lerp, truncated, and
// clipped when extrapolating (alpha outside [0, 1]). The float to int conversion before the
// byte is the one x86 makes of (uint8_t)float (a truncation to int32, then its low byte), stated
// so that the GPU's saturating conversion to a byte cannot differ.
static inline SWIN_HOSTDEV uint8_t image_aug_blend(uint8_t v, uint8_t degenerate, float alpha) {
  if (alpha == 0.0f) return degenerate;
  if (alpha == 1.0f) return v;
  float r = (float)degenerate + alpha * (float)((int)v - (int)degenerate);
  if (alpha >= 0 && alpha <= 1.0) return (uint8_t)(int)r;
  return r <= 0.0f ? 0 : r >= 255.0f ? 255 : (uint8_t)(int)r;
}

// The PIXEL ops on one pixel (chans values at px), in place.
static inline SWIN_HOSTDEV void image_aug_pixel(const ImageAugStep *s, int chans, uint8_t *px) {
  switch (s->op) {
    case IMAGE_AUG_INVERT:
      for (int c = 0; c < chans; c++) px[c] = (uint8_t)(255 - px[c]);
      return;
    case IMAGE_AUG_POSTERIZE: {
      if (s->level >= 8) return;
      uint8_t mask = (uint8_t) ~((1u << (8 - s->level)) - 1);
      for (int c = 0; c < chans; c++) px[c] &= mask;
      return;
    }
    case IMAGE_AUG_SOLARIZE:
      for (int c = 0; c < chans; c++)
        if (px[c] >= s->level) px[c] = (uint8_t)(255 - px[c]);
      return;
    case IMAGE_AUG_SOLARIZE_ADD:
      for (int c = 0; c < chans; c++) {
        if (px[c] < IMAGE_AUG_SOLARIZE_ADD_BELOW) {
          int v = px[c] + s->level;
          px[c] = (uint8_t)(v > 255 ? 255 : v);
        }
      }
      return;
    case IMAGE_AUG_BRIGHTNESS:
      for (int c = 0; c < chans; c++) px[c] = image_aug_blend(px[c], 0, (float)s->factor);
      return;
    case IMAGE_AUG_COLOR: {
      if (chans != 3) return;  // a gray image is its own degenerate
      uint8_t gray = image_aug_luma(px);
      for (int c = 0; c < 3; c++) px[c] = image_aug_blend(px[c], gray, (float)s->factor);
      return;
    }
    default:
      return;
  }
}

// ---- HISTOGRAM ops: counts of the whole image, then a table per channel ----

// The histogram bin of a CONTRAST pixel: its luma (gray: its value).
static inline SWIN_HOSTDEV int image_aug_contrast_bin(const uint8_t *px, int chans) {
  return chans == 3 ? image_aug_luma(px) : px[0];
}

// ImageOps.autocontrast's table from one channel's histogram: the used range [lo, hi] stretched
// to [0, 255] in double, truncated (int()); identity when the channel has one value.
static inline SWIN_HOSTDEV void image_aug_autocontrast_lut(const uint32_t *hist, uint8_t *lut) {
  int lo = 0, hi = 255;
  while (lo < 255 && !hist[lo]) lo++;
  while (hi > 0 && !hist[hi]) hi--;
  for (int i = 0; i < 256; i++) lut[i] = (uint8_t)i;
  if (hi <= lo) return;
  double scale = 255.0 / (hi - lo), offset = -lo * scale;
  for (int i = 0; i < 256; i++) {
    int v = (int)(i * scale + offset);
    lut[i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);  // Pillow clips LUT values
  }
}

// ImageOps.equalize's table from one channel's histogram of `pixels` (< 2^31) values: the
// cumulative counts in steps of (total - last used bin's count) / 255; identity when that step
// is 0. Integer arithmetic throughout.
static inline SWIN_HOSTDEV void image_aug_equalize_lut(const uint32_t *hist, uint8_t *lut) {
  uint32_t total = 0, last = 0;
  int used = 0;
  for (int i = 0; i < 256; i++)
    if (hist[i]) total += hist[i], last = hist[i], used++;
  uint32_t step = used > 1 ? (total - last) / 255 : 0;
  if (step == 0) {
    for (int i = 0; i < 256; i++) lut[i] = (uint8_t)i;
    return;
  }
  uint32_t n = step / 2;
  for (int i = 0; i < 256; i++) {
    uint32_t v = n / step;
    lut[i] = (uint8_t)(v > 255 ? 255 : v);
    n += hist[i];
  }
}

// ImageStat's mean of the luma histogram of `pixels` pixels, summed in double in bin order,
// rounded half up: CONTRAST's degenerate value.
static inline SWIN_HOSTDEV int image_aug_contrast_mean(const uint32_t *hist, int64_t pixels) {
  double sum = 0.0;
  for (int j = 0; j < 256; j++) sum += (double)j * (double)hist[j];
  return (int)(sum / (double)pixels + 0.5);
}

// ---- COPY ops: output pixel (y, x) from the unchanged image src (h, w, chans) ----

// Pillow's FLOOR: truncation, one lower for negative non-integers.
static inline SWIN_HOSTDEV int image_aug_floor(double v) {
  int t = (int)v;
  return v < 0.0 && (double)t != v ? t - 1 : t;
}
static inline SWIN_HOSTDEV int image_aug_clamp(int i, int n) {
  return i < 0 ? 0 : i < n ? i : n - 1;
}

// Pillow's BICUBIC macro: the a = -1 cubic through v1..v4 at d in [0, 1).
static inline SWIN_HOSTDEV double image_aug_cubic(double v1, double v2, double v3, double v4,
                                                  double d) {
  double p1 = v2;
  double p2 = -v1 + v3;
  double p3 = 2 * (v1 - v2) + v3 - v4;
  double p4 = -v1 + v2 - v3 + v4;
  return p1 + d * (p2 + d * (p3 + d * p4));
}

// Geometry.c's bilinear_filter8 / bilinear_filter32RGB at source point (xin, yin) inside the
// image: pixel centres at +.5, the taps clamped into the image, a missing second row replaced by
// the first row's value.
static inline SWIN_HOSTDEV void image_aug_bilinear(const uint8_t *src, int h, int w, int chans,
                                                   double xin, double yin, uint8_t *out) {
  xin -= 0.5;
  yin -= 0.5;
  int x = image_aug_floor(xin), y = image_aug_floor(yin);
  double dx = xin - x, dy = yin - y;
  int64_t row = (int64_t)w * chans;
  int x0 = image_aug_clamp(x, w) * chans, x1 = image_aug_clamp(x + 1, w) * chans;
  const uint8_t *r0 = src + image_aug_clamp(y, h) * row;
  int has_r1 = y + 1 >= 0 && y + 1 < h;
  const uint8_t *r1 = src + (has_r1 ? y + 1 : 0) * row;
  for (int c = 0; c < chans; c++) {
    double v1 = r0[x0 + c] + (r0[x1 + c] - r0[x0 + c]) * dx;
    double v2 = has_r1 ? r1[x0 + c] + (r1[x1 + c] - r1[x0 + c]) * dx : v1;
    v1 = v1 + (v2 - v1) * dy;
    out[c] = (uint8_t)(int)v1;
  }
}

// bicubic_filter8 / bicubic_filter32RGB: a 4x4 neighbourhood from one pixel before; columns
// clamped, rows past the first that fall outside repeat the previous row (Pillow's edge rule);
// a cubic along each row, then one down the four results, clipped to [0, 255].
static inline SWIN_HOSTDEV void image_aug_bicubic(const uint8_t *src, int h, int w, int chans,
                                                  double xin, double yin, uint8_t *out) {
  xin -= 0.5;
  yin -= 0.5;
  int x = image_aug_floor(xin), y = image_aug_floor(yin);
  double dx = xin - x, dy = yin - y;
  x -= 1;
  y -= 1;
  int64_t row = (int64_t)w * chans;
  int xs[4];
  const uint8_t *rows[4];
  for (int i = 0; i < 4; i++) xs[i] = image_aug_clamp(x + i, w) * chans;
  rows[0] = src + image_aug_clamp(y, h) * row;
  for (int r = 1; r < 4; r++) rows[r] = y + r >= 0 && y + r < h ? src + (y + r) * row : rows[r - 1];
  for (int c = 0; c < chans; c++) {
    double v[4];
    for (int r = 0; r < 4; r++) {
      const uint8_t *in = rows[r] + c;
      v[r] = image_aug_cubic(in[xs[0]], in[xs[1]], in[xs[2]], in[xs[3]], dx);
    }
    double v1 = image_aug_cubic(v[0], v[1], v[2], v[3], dy);
    out[c] = v1 <= 0.0 ? 0 : v1 >= 255.0 ? 255 : (uint8_t)(int)v1;
  }
}

// Geometry.c's affine transform of output pixel (x, y): the source point in Python's order
// (a x + b y + c, left to right, in double), the fill colour where it lies outside.
static inline SWIN_HOSTDEV void image_aug_affine_pixel(const ImageAugStep *s, const uint8_t *src,
                                                       int h, int w, int chans, const uint8_t *fill,
                                                       int y, int x, uint8_t *out) {
  const double *a = s->matrix;
  double xo = x + 0.5, yo = y + 0.5;
  double xin = a[0] * xo + a[1] * yo + a[2];
  double yin = a[3] * xo + a[4] * yo + a[5];
  if (xin < 0.0 || xin >= w || yin < 0.0 || yin >= h) {
    for (int c = 0; c < chans; c++) out[c] = fill[c];
  } else if (s->bicubic) {
    image_aug_bicubic(src, h, w, chans, xin, yin, out);
  } else {
    image_aug_bilinear(src, h, w, chans, xin, yin, out);
  }
}

// ImageFilter.SMOOTH (3x3 kernel 1 1 1 / 1 5 1 / 1 1 1, divisor 13) as Filter.c computes one
// element: fp32 taps, rows y+1, y, y-1 in that order, +0.5, clipped and truncated; the border
// (and an image under 3x3) is copied.
static inline SWIN_HOSTDEV uint8_t image_aug_smooth(const uint8_t *src, int h, int w, int chans,
                                                    int y, int x, int c) {
  int64_t row = (int64_t)w * chans, i = (int64_t)x * chans + c;
  const uint8_t *mid = src + y * row;
  if (y == 0 || y == h - 1 || x == 0 || x == w - 1) return mid[i];
  const float k1 = 1.0f / 13.0f, k5 = 5.0f / 13.0f;
  const uint8_t *below = mid + row, *above = mid - row;
  float ss = 0.5f;
  ss += (float)below[i - chans] * k1 + (float)below[i] * k1 + (float)below[i + chans] * k1;
  ss += (float)mid[i - chans] * k1 + (float)mid[i] * k5 + (float)mid[i + chans] * k1;
  ss += (float)above[i - chans] * k1 + (float)above[i] * k1 + (float)above[i + chans] * k1;
  ss = ss < 0.0f ? 0.0f : ss;
  ss = ss > 255.0f ? 255.0f : ss;
  return (uint8_t)(int)ss;
}

// A COPY op's output pixel (y, x) of src (h, w, chans) into out (chans).
static inline SWIN_HOSTDEV void image_aug_copy_pixel(const ImageAugStep *s, const uint8_t *src,
                                                     int h, int w, int chans, const uint8_t *fill,
                                                     int y, int x, uint8_t *out) {
  if (s->op == IMAGE_AUG_AFFINE) {
    image_aug_affine_pixel(s, src, h, w, chans, fill, y, x, out);
  } else if (s->op == IMAGE_AUG_SHARPNESS) {
    const uint8_t *px = src + ((int64_t)y * w + x) * chans;
    for (int c = 0; c < chans; c++)
      out[c] =
          image_aug_blend(px[c], image_aug_smooth(src, h, w, chans, y, x, c), (float)s->factor);
  } else {  // TRANSPOSE: Pillow's Transpose (ROTATE_90 / 180 / 270 of a square image for 1, 3)
    int sy = y, sx = x;
    if (s->level == 2) sy = h - 1 - y, sx = w - 1 - x;
    if (s->level == 1) sy = x, sx = w - 1 - y;
    if (s->level == 3) sy = w - 1 - x, sx = y;
    const uint8_t *px = src + ((int64_t)sy * w + sx) * chans;
    for (int c = 0; c < chans; c++) out[c] = px[c];
  }
}

// ---- the batch ----

// images (count, h, w, chans), augmented in place; scratch (count, h, w, chans) is overwritten;
// steps (count * nsteps), host memory; fill (chans). chans 1 to 4 (the loader's are 1 and 3);
// h * w < 2^31.
void image_aug_batch_cpu(uint8_t *images, uint8_t *scratch, const ImageAugStep *steps, int count,
                         int nsteps, int h, int w, int chans, const uint8_t *fill);

#ifdef SWIN_HAVE_CUDA
// The same on `stream`, images, scratch and d_steps device memory, chans 1 or 3: per step, a
// launch over every image's pixels (the PIXEL ops in place, the HISTOGRAM ops by one block per
// image, the COPY ops' copy to scratch), then one of the COPY ops from scratch back into images.
// Returns the launch error (cudaSuccess when every launch was queued; cudaErrorInvalidValue for
// other channel counts) for the caller to report.
cudaError_t image_aug_batch_cuda(uint8_t *images, uint8_t *scratch, const ImageAugStep *d_steps,
                                 int count, int nsteps, int h, int w, int chans, ImageAugFill fill,
                                 cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
