// image_ops.h: Pillow-exact operations on uint8 HWC images (1 or 3 channels), the building
// blocks of the training and eval transforms and of RandAugment / colour jitter.
//
// "Exact" means the same bytes as Pillow (checked against it by tests/test_aug_parity.c): each
// function follows the arithmetic of the Pillow routine named in its comment, fixed-point
// rounding and float/double evaluation order included, so a model trained here sees the pixels
// timm's transforms would give it.
//   resize:   Resample.c (separable, antialiased when shrinking: the filter support grows with
//             the scale; horizontal pass first into uint8 rows, then vertical; 22-bit fixed point)
//   affine:   Geometry.c's generic transform with its bilinear / bicubic (a = -1) 2x2 / 4x4
//             filters, sampled at pixel centers, outside pixels set to a fill colour
//   blend:    Blend.c (fp32 lerp, truncated; clipped when extrapolating), used by the enhancers
//   LUT ops:  ImageOps autocontrast, equalize, invert, solarize, posterize and timm's solarize_add
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "kernels/image_aug.h"

typedef enum { INTERP_BILINEAR = 0, INTERP_BICUBIC = 1 } Interp;

// A view of an image: pixel (y, x) channel c at px[y * stride + x * chans + c].
typedef struct {
  const uint8_t *px;
  int h, w, chans;
  int64_t stride;  // elements per row
} ImageView;

static inline ImageView image_view(const uint8_t *px, int h, int w, int chans) {
  ImageView v = {px, h, w, chans, (int64_t)w * chans};
  return v;
}

// Pillow's img.resize((out_w, out_h), interp) of the whole of src, of which only the window
// [win_top, win_top + win_h) x [win_left, win_left + win_w) of the output is computed into dst
// (win_h, win_w, chans): the same bytes as resizing and then cropping (a crop of a resize is
// how torchvision's Resize + CenterCrop runs). RandomResizedCrop passes a view of the crop box.
void image_resize(ImageView src, int out_h, int out_w, int win_top, int win_left, int win_h,
                  int win_w, Interp interp, uint8_t *dst);

// The fixed-point weights image_resize uses along one axis (Pillow's precompute_coeffs), for
// outputs [win0, win0 + win_n) of an in_size -> out_size resize: output o reads count[o] pixels
// from first[o] with weights k[o * ksize + j], j < count[o] (the rest of the row is zero), of
// RESIZE_PRECISION_BITS fraction bits (kernels/resize.h), ksize = image_resize_ksize(...). The
// GPU resize (kernels/resize.h) takes its weights from here: both sides multiply by the same
// integers. first and count hold win_n entries, k win_n * ksize.
int image_resize_ksize(int in_size, int out_size, Interp interp);
void image_resize_taps(int in_size, int out_size, int win0, int win_n, Interp interp,
                       int32_t *first, int32_t *count, int32_t *k);

// Pillow's img.transform(size, AFFINE, a, resample, fillcolor=fill): output pixel (x, y) reads
// the source at (a0 (x+.5) + a1 (y+.5) + a2, a3 (x+.5) + a4 (y+.5) + a5); points outside the
// source get fill (chans values). dst has src's size and must not overlap it.
void image_affine(ImageView src, const double a[6], Interp interp, const uint8_t *fill,
                  uint8_t *dst);
// Pillow's img.rotate(degrees, resample, fillcolor=fill) (counter-clockwise, about the center,
// same size; the 0 / 180 / square 90 / 270 fast paths included).
void image_rotate(ImageView src, double degrees, Interp interp, const uint8_t *fill, uint8_t *dst);
// How image_rotate turns an (h, w) image by degrees: Pillow's Transpose by `quarters` quarter
// turns counter-clockwise (0, 2, or 1 and 3 of a square image), or, with quarters -1, the affine
// map `matrix` (image_affine's a) that Pillow builds: the angle's cos and sin rounded to 15
// decimals, about the center. The RandAugment steps (kernels/image_aug.h) take it from here too.
typedef struct {
  int quarters;
  double matrix[6];
} ImageRotation;
ImageRotation image_rotation(int h, int w, double degrees);
// Pillow's Transpose: src turned by quarters (0..3; 1 and 3 need a square image) into dst.
void image_rotate_quarters(ImageView src, int quarters, uint8_t *dst);

// In place on img (h, w, chans), each channel by its own histogram where Pillow's is per band.
void image_autocontrast(uint8_t *img, int h, int w, int chans);
void image_equalize(uint8_t *img, int h, int w, int chans);
void image_invert(uint8_t *img, int64_t n);
void image_solarize(uint8_t *img, int64_t n, int threshold);  // v >= threshold -> 255 - v
void image_solarize_add(uint8_t *img, int64_t n, int add, int threshold);  // v < t: min(255, v+add)
void image_posterize(uint8_t *img, int64_t n, int bits);  // keep the top `bits` bits

// ImageEnhance: Color (saturation), Contrast, Brightness, Sharpness with an enhancement factor
// (1 = unchanged), in place on img (h, w, chans); chans 1 or 3.
void image_enhance_color(uint8_t *img, int h, int w, int chans, double factor);
void image_enhance_contrast(uint8_t *img, int h, int w, int chans, double factor);
void image_enhance_brightness(uint8_t *img, int h, int w, int chans, double factor);
void image_enhance_sharpness(uint8_t *img, int h, int w, int chans, double factor);

// One augmentation step (kernels/image_aug.h) on img (h, w, chans) in place, by the functions
// above: the CPU path of the steps that randaugment_draw and color_jitter_draw make
// (data/randaugment.h), and the spec of the batched kernels. fill (chans) is the geometric ops'
// outside colour and scratch (h * w * chans bytes) the copy of img that they read: AFFINE and
// TRANSPOSE use both, other steps neither (NULL is fine there).
void image_apply_step(const ImageAugStep *step, const uint8_t *fill, uint8_t *img, int h, int w,
                      int chans, uint8_t *scratch);
// steps[0..n) in order, with a scratch image of its own where one needs it.
void image_apply_steps(const ImageAugStep *steps, int n, const uint8_t *fill, uint8_t *img, int h,
                       int w, int chans);
