// transform.c: RandomResizedCrop, horizontal flip, RandAugment / ColorJitter, and resize +
// center crop (see transform.h), over the Pillow-exact operations of image_ops.c.
#include "data/transform.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/util.h"

static ResampleChoice resample_choice(const char *name) {
  if (strcmp(name, "bicubic") == 0) return RESAMPLE_BICUBIC;
  if (strcmp(name, "random") == 0) return RESAMPLE_RANDOM;
  return RESAMPLE_BILINEAR;
}

int transform_params_from_config(TransformParams *p, const Config *cfg, Error *err) {
  if (cfg->img_h < 1 || cfg->img_w < 1) {
    return error_set(err, "model.img_size %dx%d is not a valid image size", cfg->img_h, cfg->img_w);
  }
  if (!(cfg->scale_min > 0 && cfg->scale_min <= cfg->scale_max) ||
      !(cfg->ratio_min > 0 && cfg->ratio_min <= cfg->ratio_max) ||
      !(cfg->crop_pct > 0 && cfg->crop_pct <= 1)) {
    error_set(err,
              "data augmentation settings out of range: scale [%g, %g], ratio [%g, %g], "
              "crop_pct %g\nHINT: need 0 < data.scale_min <= data.scale_max, "
              "0 < data.ratio_min <= data.ratio_max and 0 < data.crop_pct <= 1",
              cfg->scale_min, cfg->scale_max, cfg->ratio_min, cfg->ratio_max, cfg->crop_pct);
    return config_error_where(cfg, err);
  }
  RandAugmentPolicy randaugment;
  if (randaugment_parse(&randaugment, cfg->randaugment, err) != 0) return -1;
  *p = (TransformParams){.out_h = cfg->img_h,
                         .out_w = cfg->img_w,
                         .chans = cfg->in_chans,
                         .scale_min = cfg->scale_min,
                         .scale_max = cfg->scale_max,
                         .ratio_min = cfg->ratio_min,
                         .ratio_max = cfg->ratio_max,
                         .hflip = cfg->hflip,
                         .crop_pct = cfg->crop_pct,
                         .resample = resample_choice(cfg->interpolation),
                         .randaugment = randaugment,
                         .color_jitter = cfg->color_jitter};
  // timm's img_mean: min(255, round(255 * mean)) per channel, RandAugment's fill colour.
  for (int c = 0; c < cfg->in_chans && c < 4; c++) {
    double v = nearbyint(255.0 * cfg->mean[cfg->num_mean == 1 ? 0 : c]);
    p->fill[c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
  }
  return 0;
}

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

TransformPlan transform_plan_train(const TransformParams *p, int h, int w, Rng *rng) {
  TransformPlan t = {.src_h = h, .src_w = w};
  // torchvision crops, then resizes the crop: the filter never reads outside the box.
  t.box = transform_rrc_box(p, h, w, rng);
  t.interp = resample_pick(p->resample, rng);
  t.resize_h = t.out_h = p->out_h;
  t.resize_w = t.out_w = p->out_w;
  // Always drawn, so the draw sequence does not depend on hflip.
  t.hflip = rng_uniform(rng) < p->hflip;
  return t;
}

int transform_plan_check(const TransformPlan *t, int h, int w, char *why, size_t n) {
  const CropBox *b = &t->box;
  bool fits = t->src_h == h && t->src_w == w && b->top >= 0 && b->left >= 0 && b->h >= 1 &&
              b->w >= 1 && b->top + b->h <= h && b->left + b->w <= w && t->resize_h >= 1 &&
              t->resize_w >= 1 && t->out_h >= 1 && t->out_w >= 1 && t->top >= 0 && t->left >= 0 &&
              t->top + t->out_h <= t->resize_h && t->left + t->out_w <= t->resize_w;
  if (fits) return 0;
  snprintf(why, n,
           "a %dx%d image, plan made for %dx%d: box %dx%d at (%d, %d), resize %dx%d, window "
           "%dx%d at (%d, %d)",
           h, w, t->src_h, t->src_w, b->h, b->w, b->top, b->left, t->resize_h, t->resize_w,
           t->out_h, t->out_w, t->top, t->left);
  return -1;
}

void transform_apply(const TransformPlan *t, const uint8_t *src, int chans, uint8_t *dst) {
  int64_t stride = (int64_t)t->src_w * chans;
  const uint8_t *box = src + (int64_t)t->box.top * stride + (int64_t)t->box.left * chans;
  if (t->resize_h == t->box.h && t->resize_w == t->box.w) {
    // Pillow returns a copy when the size does not change (an RRC box of the output's size, an
    // eval image already at the resize size): the window, copied. (Pillow's resize to the same
    // size would give the same bytes: its taps are then the identity.)
    size_t row = (size_t)t->out_w * chans;
    for (int y = 0; y < t->out_h; y++)
      memcpy(dst + (size_t)y * row, box + (int64_t)(t->top + y) * stride + (int64_t)t->left * chans,
             row);
  } else {
    ImageView v = {box, t->box.h, t->box.w, chans, stride};
    image_resize(v, t->resize_h, t->resize_w, t->top, t->left, t->out_h, t->out_w, t->interp, dst);
  }
  if (t->hflip) transform_hflip(dst, t->out_h, t->out_w, chans);
}

void transform_train(const TransformParams *p, const uint8_t *src, int h, int w, Rng *rng,
                     uint8_t *dst) {
  TransformPlan t = transform_plan_train(p, h, w, rng);
  transform_apply(&t, src, p->chans, dst);
}

bool transform_has_color(const TransformParams *p) {
  return p->randaugment.enabled || p->color_jitter > 0;
}

int transform_color_draw(const TransformParams *p, Rng *rng, ImageAugStep *steps, int max_steps) {
  if (p->randaugment.enabled)
    return randaugment_draw(&p->randaugment, p->resample, p->out_h, p->out_w, rng, steps,
                            max_steps);
  if (p->color_jitter > 0) return color_jitter_draw(p->color_jitter, rng, steps, max_steps);
  return 0;
}

void transform_train_color(const TransformParams *p, uint8_t *img, int chans, Rng *rng) {
  ImageAugStep steps[IMAGE_AUG_MAX_STEPS];
  int n = transform_color_draw(p, rng, steps, IMAGE_AUG_MAX_STEPS);
  image_apply_steps(steps, n, p->fill, img, p->out_h, p->out_w, chans);
}

TransformPlan transform_plan_eval(const TransformParams *p, int h, int w) {
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
  TransformPlan t = {.src_h = h,
                     .src_w = w,
                     .box = {0, 0, h, w},
                     .resize_h = new_h,
                     .resize_w = new_w,
                     .top = round_half_even((new_h - p->out_h) / 2.0),
                     .left = round_half_even((new_w - p->out_w) / 2.0),
                     .out_h = p->out_h,
                     .out_w = p->out_w,
                     .interp = p->resample == RESAMPLE_BILINEAR ? INTERP_BILINEAR : INTERP_BICUBIC};
  return t;
}

void transform_eval(const TransformParams *p, const uint8_t *src, int h, int w, uint8_t *dst) {
  TransformPlan t = transform_plan_eval(p, h, w);
  transform_apply(&t, src, p->chans, dst);
}

// ---- the GPU form of a batch of plans (kernels/resize.h) ----

// Tap-table entries of one axis: first and count per output, and ksize weights per output.
static int64_t axis_entries(int in_size, int out_size, int n, Interp interp) {
  return (int64_t)n * (2 + image_resize_ksize(in_size, out_size, interp));
}

int64_t transform_plans_packed_bytes(const TransformPlan *plans, int n) {
  int64_t entries = 0;
  for (int k = 0; k < n; k++) {
    const TransformPlan *t = &plans[k];
    entries += axis_entries(t->box.w, t->resize_w, t->out_w, t->interp) +
               axis_entries(t->box.h, t->resize_h, t->out_h, t->interp);
  }
  return (int64_t)sizeof(ResizeDesc) * n + (int64_t)sizeof(int32_t) * entries;
}

// One axis's table at tables + at (image_resize_taps: first, count, then the weights); returns
// the entries written.
static int64_t axis_pack(int in_size, int out_size, int win0, int n, Interp interp, int32_t *tables,
                         int64_t at, int32_t *ksize) {
  *ksize = image_resize_ksize(in_size, out_size, interp);
  int32_t *first = tables + at, *count = first + n;
  image_resize_taps(in_size, out_size, win0, n, interp, first, count, count + n);
  return (int64_t)n * (2 + *ksize);
}

void transform_plans_pack(const TransformPlan *plans, int n, int chans, const int64_t *src,
                          const int64_t *dst, void *packed, ResizeBatch *batch) {
  ResizeDesc *desc = packed;
  int32_t *tables = (int32_t *)(desc + n);
  *batch = (ResizeBatch){
      .count = n, .chans = chans, .packed_bytes = transform_plans_packed_bytes(plans, n)};
  int64_t at = 0;
  for (int k = 0; k < n; k++) {
    const TransformPlan *t = &plans[k];
    ResizeDesc *d = &desc[k];
    *d = (ResizeDesc){.src_pitch = (int64_t)t->src_w * chans,
                      .out_h = t->out_h,
                      .out_w = t->out_w,
                      .hflip = t->hflip};
    d->src = src[k] + (int64_t)t->box.top * d->src_pitch + (int64_t)t->box.left * chans;
    // A resize to the box's own size (transform_apply's copy) runs as a resize here: its taps
    // are the identity (weight 1 << RESIZE_PRECISION_BITS on the pixel itself, 0 on its
    // neighbours), which gives the copy's bytes.
    d->taps_x = at;
    at += axis_pack(t->box.w, t->resize_w, t->left, t->out_w, t->interp, tables, at, &d->ksize_x);
    d->taps_y = at;
    at += axis_pack(t->box.h, t->resize_h, t->top, t->out_h, t->interp, tables, at, &d->ksize_y);
    // The box rows the vertical taps read (image_resize's row0, row1).
    const int32_t *first_y = tables + d->taps_y, *count_y = first_y + t->out_h;
    d->row0 = first_y[0];
    d->rows = first_y[t->out_h - 1] + count_y[t->out_h - 1] - d->row0;
    int64_t tmp_pixels = (int64_t)d->rows * t->out_w, dst_pixels = (int64_t)t->out_h * t->out_w;
    d->tmp = batch->tmp_bytes;
    d->dst = dst ? dst[k] : batch->dst_bytes;
    batch->tmp_bytes += tmp_pixels * chans;
    int64_t end = d->dst + dst_pixels * chans;
    if (end > batch->dst_bytes) batch->dst_bytes = end;
    if (tmp_pixels > batch->max_tmp_pixels) batch->max_tmp_pixels = tmp_pixels;
    if (dst_pixels > batch->max_dst_pixels) batch->max_dst_pixels = dst_pixels;
  }
}
