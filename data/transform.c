// transform.c: RandomResizedCrop, horizontal flip, resize + center crop, and the separable
// triangle-filter resampler they share (see transform.h for the filter's definition).
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

// Filter taps of one axis: output o reads count[o] source pixels from first[o] on, with weights
// weight[o * max_taps ..] that sum to 1.
typedef struct {
  int *first, *count;  // (out)
  float *weight;       // (out, max_taps)
  int max_taps;
} Taps;

// Taps resampling [start, start + length) source pixels to `out` pixels, reading only pixels in
// [lo, hi). A source pixel j has its center at j + 0.5; output o's center maps to
// start + (o + 0.5) * scale. The triangle's radius is one output pixel (`support` source pixels),
// never less than one source pixel, so enlarging is bilinear and shrinking averages the area.
static Taps taps_make(double start, double length, int lo, int hi, int out) {
  double scale = length / out;
  double support = scale > 1 ? scale : 1;
  Taps t;
  t.max_taps = (int)ceil(2 * support) + 2;
  t.first = malloc_check(sizeof(int) * (size_t)out);
  t.count = malloc_check(sizeof(int) * (size_t)out);
  t.weight = malloc_check(sizeof(float) * (size_t)out * (size_t)t.max_taps);
  for (int o = 0; o < out; o++) {
    double center = start + (o + 0.5) * scale;
    int a = (int)floor(center - support), b = (int)ceil(center + support);
    if (a < lo) a = lo;
    if (b > hi) b = hi;
    float *w = t.weight + (size_t)o * t.max_taps;
    double sum = 0;
    for (int j = a; j < b; j++) {
      double x = 1 - fabs((j + 0.5 - center) / support);
      w[j - a] = (float)(x > 0 ? x : 0);
      sum += w[j - a];
    }
    // The center lies inside [lo, hi), so its nearest pixel has weight >= 1/2: sum > 0.
    for (int j = a; j < b; j++) w[j - a] = (float)(w[j - a] / sum);
    t.first[o] = a;
    t.count[o] = b - a;
  }
  return t;
}

static void taps_free(Taps *t) {
  free(t->first);
  free(t->count);
  free(t->weight);
}

void transform_resample(const uint8_t *src, int src_h, int src_w, int chans, SourceBox box,
                        bool clamp_to_box, uint8_t *dst, int out_h, int out_w) {
  int y_lo = 0, y_hi = src_h, x_lo = 0, x_hi = src_w;
  if (clamp_to_box) {
    y_lo = (int)floor(box.top);
    y_hi = (int)ceil(box.top + box.h);
    x_lo = (int)floor(box.left);
    x_hi = (int)ceil(box.left + box.w);
  }
  Taps ty = taps_make(box.top, box.h, y_lo, y_hi, out_h);
  Taps tx = taps_make(box.left, box.w, x_lo, x_hi, out_w);
  // Horizontal pass over only the source rows the vertical taps read.
  int row0 = ty.first[0], row1 = ty.first[out_h - 1] + ty.count[out_h - 1];
  size_t tmp_row = (size_t)out_w * chans;
  float *tmp = malloc_check(sizeof(float) * (size_t)(row1 - row0) * tmp_row);  // (rows, out_w, C)
  for (int y = row0; y < row1; y++) {
    const uint8_t *s = src + (size_t)y * src_w * chans;
    float *t = tmp + (size_t)(y - row0) * tmp_row;
    for (int o = 0; o < out_w; o++) {
      const float *w = tx.weight + (size_t)o * tx.max_taps;
      for (int c = 0; c < chans; c++) {
        float acc = 0;
        for (int k = 0; k < tx.count[o]; k++)
          acc += w[k] * s[(size_t)(tx.first[o] + k) * chans + c];
        t[(size_t)o * chans + c] = acc;
      }
    }
  }
  for (int o = 0; o < out_h; o++) {
    const float *w = ty.weight + (size_t)o * ty.max_taps;
    const float *t = tmp + (size_t)(ty.first[o] - row0) * tmp_row;
    uint8_t *d = dst + (size_t)o * tmp_row;
    for (size_t i = 0; i < tmp_row; i++) {
      float acc = 0;
      for (int k = 0; k < ty.count[o]; k++) acc += w[k] * t[(size_t)k * tmp_row + i];
      // Weights are non-negative and sum to 1, so acc stays in [0, 255] up to rounding.
      int v = (int)(acc + 0.5f);
      d[i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
    }
  }
  free(tmp);
  taps_free(&ty);
  taps_free(&tx);
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
  SourceBox box = {b.top, b.left, b.h, b.w};
  transform_resample(src, h, w, p->chans, box, true, dst, p->out_h, p->out_w);
  // Always draw, so the draw sequence does not depend on hflip.
  if (rng_uniform(rng) < p->hflip) transform_hflip(dst, p->out_h, p->out_w, p->chans);
}

void transform_eval(const TransformParams *p, const uint8_t *src, int h, int w, uint8_t *dst) {
  // The side that needs the larger scale to cover (out / crop_pct) becomes round(out / crop_pct)
  // and the other follows the aspect, truncated as torchvision's Resize(int) does; for a square
  // output that is "shorter side = round(out / crop_pct)".
  bool height_binds = (double)p->out_h / h >= (double)p->out_w / w;
  int new_h, new_w;
  if (height_binds) {
    new_h = round_half_even(p->out_h / (double)p->crop_pct);
    new_w = (int)((double)new_h * w / h);
  } else {
    new_w = round_half_even(p->out_w / (double)p->crop_pct);
    new_h = (int)((double)new_w * h / w);
  }
  if (new_h < p->out_h) new_h = p->out_h;
  if (new_w < p->out_w) new_w = p->out_w;
  // The resized image is never materialized: its center crop maps back to a fractional source
  // box, resampled once at the resize's filter scale.
  int top = round_half_even((new_h - p->out_h) / 2.0);
  int left = round_half_even((new_w - p->out_w) / 2.0);
  double fy = (double)h / new_h, fx = (double)w / new_w;
  SourceBox box = {top * fy, left * fx, p->out_h * fy, p->out_w * fx};
  transform_resample(src, h, w, p->chans, box, false, dst, p->out_h, p->out_w);
}
