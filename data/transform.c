// transform.c: RandomResizedCrop, horizontal flip, RandAugment / ColorJitter, and resize +
// center crop (see transform.h), over the Pillow-exact operations of image_ops.c.
#include "data/transform.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/util.h"

// Python's round() (half to even), as torchvision computes crop sizes with it.
static int round_half_even(double x) {
  return (int)nearbyint(x);
}

CropBox transform_rrc_box(const TransformParams *p, int h, int w, Rng *rng) {
  double area = (double)h * w;
  double log_rmin = log(p->ratio_min), log_rmax = log(p->ratio_max);
  for (int attempt = 0; attempt < 10; attempt++) {
    double target = area * (p->scale_min + (p->scale_max - p->scale_min) * rng_uniform_double(rng));
    double aspect = exp(log_rmin + (log_rmax - log_rmin) * rng_uniform_double(rng));
    int cw = round_half_even(sqrt(target * aspect));
    int ch = round_half_even(sqrt(target / aspect));
    if (cw > 0 && cw <= w && ch > 0 && ch <= h) {
      int top = (int)rng_below(rng, (uint32_t)(h - ch + 1));
      int left = (int)rng_below(rng, (uint32_t)(w - cw + 1));
      return (CropBox){top, left, ch, cw};
    }
  }
  // Fallback: the largest centered box whose aspect lies in the allowed range.
  double in_ratio = (double)w / h;
  int cw = w, ch = h;
  if (in_ratio < p->ratio_min) {
    ch = round_half_even(w / (double)p->ratio_min);
  } else if (in_ratio > p->ratio_max) {
    cw = round_half_even(h * (double)p->ratio_max);
  }
  if (ch < 1) ch = 1;
  if (ch > h) ch = h;
  if (cw < 1) cw = 1;
  if (cw > w) cw = w;
  return (CropBox){(h - ch) / 2, (w - cw) / 2, ch, cw};
}

void transform_hflip(uint8_t *img, int h, int w, int chans) {
  for (int y = 0; y < h; y++) {
    uint8_t *row = img + (size_t)y * w * chans;
    for (int a = 0, b = w - 1; a < b; a++, b--) {
      for (int c = 0; c < chans; c++) {
        uint8_t t = row[a * chans + c];
        row[a * chans + c] = row[b * chans + c];
        row[b * chans + c] = t;
      }
    }
  }
}

void transform_train(const TransformParams *p, const uint8_t *src, int h, int w, Rng *rng,
                     uint8_t *dst) {
  CropBox b = transform_rrc_box(p, h, w, rng);
  Interp interp = resample_pick(p->resample, rng);
  // torchvision crops, then resizes the crop: the filter never reads outside the box.
  ImageView crop = {src + ((int64_t)b.top * w + b.left) * p->chans, b.h, b.w, p->chans,
                    (int64_t)w * p->chans};
  image_resize(crop, p->out_h, p->out_w, 0, 0, p->out_h, p->out_w, interp, dst);
  // Always draw, so the draw sequence does not depend on hflip.
  if (rng_uniform(rng) < p->hflip) transform_hflip(dst, p->out_h, p->out_w, p->chans);
}

bool transform_has_color(const TransformParams *p) {
  return p->randaugment.enabled || p->color_jitter > 0;
}

void transform_train_color(const TransformParams *p, uint8_t *img, int chans, Rng *rng) {
  if (p->randaugment.enabled)
    randaugment_image(&p->randaugment, p->resample, p->fill, img, p->out_h, p->out_w, chans, rng);
  else if (p->color_jitter > 0)
    color_jitter_image(p->color_jitter, img, p->out_h, p->out_w, chans, rng);
}

void transform_eval(const TransformParams *p, const uint8_t *src, int h, int w, uint8_t *dst) {
  // timm's scale_size = floor(out / crop_pct). Square output: torchvision's Resize(int), the
  // shorter side becomes it and the other is int(side * long / short). Otherwise timm's
  // ResizeKeepRatio: both sides divided by min(h / target_h, w / target_w), rounded.
  int target_h = (int)floor(p->out_h / (double)p->crop_pct);
  int target_w = (int)floor(p->out_w / (double)p->crop_pct);
  int new_h, new_w;
  if (p->out_h == p->out_w) {
    if (w <= h) {
      new_w = target_w;
      new_h = (int)((double)target_w * h / w);
    } else {
      new_h = target_h;
      new_w = (int)((double)target_h * w / h);
    }
  } else {
    double ratio_h = (double)h / target_h, ratio_w = (double)w / target_w;
    double ratio = ratio_h < ratio_w ? ratio_h : ratio_w;
    new_h = round_half_even(h / ratio);
    new_w = round_half_even(w / ratio);
  }
  if (new_h < p->out_h) new_h = p->out_h;
  if (new_w < p->out_w) new_w = p->out_w;
  // CenterCrop's offsets (round half to even); only the cropped window of the resize is
  // computed, which gives the same bytes as resizing the whole image.
  int top = round_half_even((new_h - p->out_h) / 2.0);
  int left = round_half_even((new_w - p->out_w) / 2.0);
  Interp interp = p->resample == RESAMPLE_BILINEAR ? INTERP_BILINEAR : INTERP_BICUBIC;
  if (new_h == h && new_w == w) {
    // Pillow returns a copy when the size does not change: a plain crop.
    for (int y = 0; y < p->out_h; y++)
      memcpy(dst + (size_t)y * p->out_w * p->chans, src + ((size_t)(top + y) * w + left) * p->chans,
             (size_t)p->out_w * p->chans);
    return;
  }
  image_resize(image_view(src, h, w, p->chans), new_h, new_w, top, left, p->out_h, p->out_w, interp,
               dst);
}
