// image_ops.c: Pillow-exact uint8 image operations (see image_ops.h for which Pillow routine
// each one follows). The float and double expressions are written in Pillow's evaluation order
// on purpose: a reordering changes the rounding and so the bytes.
#include "data/image_ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/resize.h"
#include "src/base/util.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

// ---- resize (Pillow Resample.c) ----

#define PRECISION_BITS RESIZE_PRECISION_BITS
#define PI_DOUBLE 3.14159265358979323846  // Python's math.pi

static double bilinear_weight(double x) {
  if (x < 0.0) x = -x;
  return x < 1.0 ? 1.0 - x : 0.0;
}

// Keys' cubic with a = -0.5.
static double bicubic_weight(double x) {
  const double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// Pillow's filter support in input pixels: the filter's own, widened by the scale when shrinking
// (the antialiasing).
static double taps_support(int in_size, int out_size, Interp interp, double *scale,
                           double *filterscale) {
  *scale = (double)(float)in_size / out_size;
  *filterscale = *scale < 1.0 ? 1.0 : *scale;
  return (interp == INTERP_BICUBIC ? 2.0 : 1.0) * *filterscale;
}

int image_resize_ksize(int in_size, int out_size, Interp interp) {
  double scale, filterscale;
  return (int)ceil(taps_support(in_size, out_size, interp, &scale, &filterscale)) * 2 + 1;
}

void image_resize_taps(int in_size, int out_size, int win0, int win_n, Interp interp,
                       int32_t *first, int32_t *count, int32_t *kernel) {
  double scale, filterscale;
  double support = taps_support(in_size, out_size, interp, &scale, &filterscale);
  int ksize = (int)ceil(support) * 2 + 1;
  double *w = malloc_check(sizeof(double) * (size_t)ksize);
  double inv_filterscale = 1.0 / filterscale;
  for (int o = 0; o < win_n; o++) {
    int xx = win0 + o;
    double center = (xx + 0.5) * scale;
    int xmin = (int)(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = (int)(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; x++) {
      double arg = ((double)(x + xmin) - center + 0.5) * inv_filterscale;
      w[x] = interp == INTERP_BICUBIC ? bicubic_weight(arg) : bilinear_weight(arg);
      ww += w[x];
    }
    int32_t *k = kernel + (size_t)o * ksize;
    for (int x = 0; x < xmax; x++) {
      double v = ww != 0.0 ? w[x] / ww : w[x];
      k[x] = v < 0 ? (int32_t)(-0.5 + v * (1 << PRECISION_BITS))
                   : (int32_t)(0.5 + v * (1 << PRECISION_BITS));
    }
    for (int x = xmax; x < ksize; x++) k[x] = 0;
    first[o] = xmin;
    count[o] = xmax;
  }
  free(w);
}

// The taps of outputs [win0, win0 + win_n) along one axis (image_resize_taps), in owned arrays.
typedef struct {
  int32_t *first, *count;
  int32_t *k;
  int ksize;
} Taps;

static Taps taps_make(int in_size, int out_size, int win0, int win_n, Interp interp) {
  Taps t;
  t.ksize = image_resize_ksize(in_size, out_size, interp);
  t.first = malloc_check(sizeof(int32_t) * (size_t)win_n);
  t.count = malloc_check(sizeof(int32_t) * (size_t)win_n);
  t.k = malloc_check(sizeof(int32_t) * (size_t)win_n * (size_t)t.ksize);
  image_resize_taps(in_size, out_size, win0, win_n, interp, t.first, t.count, t.k);
  return t;
}

static void taps_free(Taps *t) {
  free(t->first);
  free(t->count);
  free(t->k);
}

// One row of the horizontal pass: win_w outputs of C channels from source row s. Inlined with
// C a constant (1 and 3, the loader's cases), so the channel loop unrolls into registers.
static inline void resize_row(const uint8_t *s, const Taps *tx, int win_w, int C, uint8_t *t) {
  for (int o = 0; o < win_w; o++) {
    const int32_t *k = tx->k + (size_t)o * tx->ksize;
    const uint8_t *p = s + (size_t)tx->first[o] * C;
    int32_t ss[4] = {0};
    for (int j = 0; j < tx->count[o]; j++)
      for (int c = 0; c < C; c++) ss[c] += p[(size_t)j * C + c] * k[j];
    for (int c = 0; c < C; c++)
      t[(size_t)o * C + c] = resize_clip(ss[c] + (1 << (PRECISION_BITS - 1)));
  }
}

void image_resize(ImageView src, int out_h, int out_w, int win_top, int win_left, int win_h,
                  int win_w, Interp interp, uint8_t *dst) {
  int C = src.chans;
  Taps ty = taps_make(src.h, out_h, win_top, win_h, interp);
  Taps tx = taps_make(src.w, out_w, win_left, win_w, interp);
  // Horizontal pass into uint8 rows (Pillow rounds the intermediate image), over only the source
  // rows the vertical taps read. The sums are exact int32 sums (Pillow's), so summing in another
  // order gives the same bytes.
  int row0 = ty.first[0], row1 = ty.first[win_h - 1] + ty.count[win_h - 1];
  size_t tmp_row = (size_t)win_w * C;
  uint8_t *tmp = malloc_check((size_t)(row1 - row0) * tmp_row + 1);
  for (int y = row0; y < row1; y++) {
    const uint8_t *s = src.px + (int64_t)y * src.stride;
    uint8_t *t = tmp + (size_t)(y - row0) * tmp_row;
    if (C == 3)
      resize_row(s, &tx, win_w, 3, t);
    else if (C == 1)
      resize_row(s, &tx, win_w, 1, t);
    else
      resize_row(s, &tx, win_w, C, t);  // 2 or 4 (model.in_chans is at most 4)
  }
  // Vertical pass, a row of sums at a time: tap j adds row j times k[j] to every sum (contiguous
  // int32 lanes the compiler vectorizes).
  int32_t *acc = malloc_check(sizeof(int32_t) * tmp_row);
  for (int o = 0; o < win_h; o++) {
    const int32_t *k = ty.k + (size_t)o * ty.ksize;
    const uint8_t *t = tmp + (size_t)(ty.first[o] - row0) * tmp_row;
    uint8_t *d = dst + (size_t)o * tmp_row;
    for (size_t i = 0; i < tmp_row; i++) acc[i] = 1 << (PRECISION_BITS - 1);
    for (int j = 0; j < ty.count[o]; j++) {
      const uint8_t *row = t + (size_t)j * tmp_row;
      int32_t kj = k[j];
      for (size_t i = 0; i < tmp_row; i++) acc[i] += row[i] * kj;
    }
    for (size_t i = 0; i < tmp_row; i++) d[i] = resize_clip(acc[i]);
  }
  free(acc);
  free(tmp);
  taps_free(&ty);
  taps_free(&tx);
}

// ---- affine transforms (Pillow Geometry.c) ----

// Pillow's FLOOR: truncation, one lower for negative non-integers (without a libm call).
static int pil_floor(double v) {
  int t = (int)v;
  return v < 0.0 && (double)t != v ? t - 1 : t;
}
static int clamp_index(int i, int n) {
  return i < 0 ? 0 : i < n ? i : n - 1;
}

// A sampler's first tap and its fractions at source point (xin, yin): Pillow moves to pixel
// centers and floors; the taps start `back` pixels before that (bicubic 1, bilinear 0).
static inline void tap_origin(double xin, double yin, int back, int *x, int *y, double *dx,
                              double *dy) {
  xin -= 0.5;
  yin -= 0.5;
  int fx = pil_floor(xin), fy = pil_floor(yin);
  *dx = xin - fx;
  *dy = yin - fy;
  *x = fx - back;
  *y = fy - back;
}

// Pillow's BICUBIC macro: the a = -1 cubic through v1..v4 at d in [0, 1).
static double cubic(double v1, double v2, double v3, double v4, double d) {
  double p1 = v2;
  double p2 = -v1 + v3;
  double p3 = 2 * (v1 - v2) + v3 - v4;
  double p4 = -v1 + v2 - v3 + v4;
  return p1 + d * (p2 + d * (p3 + d * p4));
}

// bilinear_filter8 / bilinear_filter32RGB at source point (xin, yin), inside the image. Inlined
// with C a constant (image_affine's cases), so the channel loops unroll.
static inline void sample_bilinear(ImageView s, int C, double xin, double yin, uint8_t *out) {
  int x, y;
  double dx, dy;
  tap_origin(xin, yin, 0, &x, &y, &dx, &dy);
  int x0 = clamp_index(x, s.w) * C, x1 = clamp_index(x + 1, s.w) * C;
  const uint8_t *r0 = s.px + (int64_t)clamp_index(y, s.h) * s.stride;
  bool has_r1 = y + 1 >= 0 && y + 1 < s.h;
  const uint8_t *r1 = s.px + (int64_t)(has_r1 ? y + 1 : 0) * s.stride;
  for (int c = 0; c < C; c++) {
    double v1 = r0[x0 + c] + (r0[x1 + c] - r0[x0 + c]) * dx;
    double v2 = has_r1 ? r1[x0 + c] + (r1[x1 + c] - r1[x0 + c]) * dx : v1;
    v1 = v1 + (v2 - v1) * dy;
    out[c] = (uint8_t)v1;
  }
}

// bicubic_filter8 / bicubic_filter32RGB: rows past the first that fall outside the image repeat
// the previous row's value (Pillow's edge rule), which is the same as reading the previous row
// again; columns are clamped. Inlined with C a constant.
static inline void sample_bicubic(ImageView s, int C, double xin, double yin, uint8_t *out) {
  int x, y;
  double dx, dy;
  tap_origin(xin, yin, 1, &x, &y, &dx, &dy);
  int xs[4];
  const uint8_t *rows[4];
  if (x >= 0 && x + 3 < s.w && y >= 0 && y + 3 < s.h) {  // all 16 taps inside: no edge rules
    for (int i = 0; i < 4; i++) {
      xs[i] = (x + i) * C;
      rows[i] = s.px + (int64_t)(y + i) * s.stride;
    }
  } else {
    for (int i = 0; i < 4; i++) xs[i] = clamp_index(x + i, s.w) * C;
    rows[0] = s.px + (int64_t)clamp_index(y, s.h) * s.stride;
    for (int r = 1; r < 4; r++)
      rows[r] = y + r >= 0 && y + r < s.h ? s.px + (int64_t)(y + r) * s.stride : rows[r - 1];
  }
  // The row cubics of all channels are independent: their coefficients (exact small integers)
  // go in lanes k = 4c + r and the Horner steps run over the lanes, which the compiler
  // vectorizes; each lane's operations and their order are the macro's.
  double p1[16], p2[16], p3[16], p4[16], v[16];
  for (int c = 0; c < C; c++) {
    for (int r = 0; r < 4; r++) {
      const uint8_t *in = rows[r] + c;
      int a = in[xs[0]], b = in[xs[1]], e = in[xs[2]], f = in[xs[3]], k = 4 * c + r;
      p1[k] = b;
      p2[k] = -a + e;
      p3[k] = 2 * (a - b) + e - f;
      p4[k] = -a + b - e + f;
    }
  }
  for (int k = 0; k < 4 * C; k++) v[k] = p1[k] + dx * (p2[k] + dx * (p3[k] + dx * p4[k]));
  for (int c = 0; c < C; c++) {
    const double *w = v + 4 * c;
    double v1 = cubic(w[0], w[1], w[2], w[3], dy);
    out[c] = v1 <= 0.0 ? 0 : v1 >= 255.0 ? 255 : (uint8_t)v1;
  }
}

#if defined(__AVX2__)
// The samplers above for 3 channels, with AVX2 lanes holding the channels (R, G, B and one
// unused lane): a 4-byte load per source pixel, exact int32 arithmetic for the coefficients,
// and double operations in the same order as the scalar code, so the bytes are the same. Only
// where every tap and the one byte past the last tap's pixel lie inside the image (the caller
// falls back to the scalar sampler elsewhere); returns whether it sampled.
static inline __m128i load_rgb_epi32(const uint8_t *p) {
  int32_t v;
  memcpy(&v, p, 4);
  return _mm_cvtepu8_epi32(_mm_cvtsi32_si128(v));
}
static inline __m256d load_rgb_pd(const uint8_t *p) {
  return _mm256_cvtepi32_pd(load_rgb_epi32(p));
}

static inline void store_rgb(__m256d v, uint8_t *out) {
  v = _mm256_min_pd(_mm256_max_pd(v, _mm256_setzero_pd()), _mm256_set1_pd(255.0));
  __m128i i = _mm256_cvttpd_epi32(v);  // truncation, as the scalar cast (v in [0, 255])
  i = _mm_packus_epi16(_mm_packus_epi32(i, i), i);
  int32_t bytes = _mm_cvtsi128_si32(i);
  memcpy(out, &bytes, 3);
}

// Whether the 4-byte loads of pixels x..x+last in rows y..y+rows-1 stay inside the image.
static inline bool rgb_taps_inside(ImageView s, int x, int y, int last, int rows) {
  return x >= 0 && y >= 0 && x + last < s.w && y + rows - 1 < s.h &&
         (x + last + 1 < s.w || y + rows < s.h);
}

static inline bool sample_bicubic_rgb(ImageView s, double xin, double yin, uint8_t *out) {
  int x, y;
  double dx, dy;
  tap_origin(xin, yin, 1, &x, &y, &dx, &dy);
  if (!rgb_taps_inside(s, x, y, 3, 4)) return false;
  __m256d vdx = _mm256_set1_pd(dx), w[4];
  for (int r = 0; r < 4; r++) {
    const uint8_t *in = s.px + (int64_t)(y + r) * s.stride + (int64_t)x * 3;
    __m128i a = load_rgb_epi32(in), b = load_rgb_epi32(in + 3);
    __m128i e = load_rgb_epi32(in + 6), f = load_rgb_epi32(in + 9);
    __m128i p2 = _mm_sub_epi32(e, a);  // -a + e
    __m128i p3 = _mm_sub_epi32(_mm_add_epi32(_mm_slli_epi32(_mm_sub_epi32(a, b), 1), e), f);
    __m128i p4 = _mm_add_epi32(_mm_sub_epi32(_mm_sub_epi32(b, a), e), f);  // -a + b - e + f
    __m256d v = _mm256_mul_pd(vdx, _mm256_cvtepi32_pd(p4));
    v = _mm256_mul_pd(vdx, _mm256_add_pd(_mm256_cvtepi32_pd(p3), v));
    v = _mm256_mul_pd(vdx, _mm256_add_pd(_mm256_cvtepi32_pd(p2), v));
    w[r] = _mm256_add_pd(_mm256_cvtepi32_pd(b), v);
  }
  // cubic(w0, w1, w2, w3, dy), lane by lane, in the scalar function's order.
  __m256d vdy = _mm256_set1_pd(dy);
  __m256d p2 = _mm256_sub_pd(w[2], w[0]);  // -w0 + w2
  __m256d p3 = _mm256_sub_pd(
      _mm256_add_pd(_mm256_mul_pd(_mm256_set1_pd(2.0), _mm256_sub_pd(w[0], w[1])), w[2]), w[3]);
  __m256d p4 = _mm256_add_pd(_mm256_sub_pd(_mm256_sub_pd(w[1], w[0]), w[2]), w[3]);
  __m256d v = _mm256_mul_pd(vdy, p4);
  v = _mm256_mul_pd(vdy, _mm256_add_pd(p3, v));
  v = _mm256_mul_pd(vdy, _mm256_add_pd(p2, v));
  store_rgb(_mm256_add_pd(w[1], v), out);
  return true;
}

static inline bool sample_bilinear_rgb(ImageView s, double xin, double yin, uint8_t *out) {
  int x, y;
  double dx, dy;
  tap_origin(xin, yin, 0, &x, &y, &dx, &dy);
  if (!rgb_taps_inside(s, x, y, 1, 2)) return false;
  const uint8_t *r0 = s.px + (int64_t)y * s.stride + (int64_t)x * 3, *r1 = r0 + s.stride;
  __m256d a0 = load_rgb_pd(r0), b0 = load_rgb_pd(r0 + 3);
  __m256d a1 = load_rgb_pd(r1), b1 = load_rgb_pd(r1 + 3);
  __m256d vdx = _mm256_set1_pd(dx);
  // v = in[x0] + (in[x1] - in[x0]) * dx per row (the difference exact), then the rows by dy.
  __m256d v1 = _mm256_add_pd(a0, _mm256_mul_pd(_mm256_sub_pd(b0, a0), vdx));
  __m256d v2 = _mm256_add_pd(a1, _mm256_mul_pd(_mm256_sub_pd(b1, a1), vdx));
  v1 = _mm256_add_pd(v1, _mm256_mul_pd(_mm256_sub_pd(v2, v1), _mm256_set1_pd(dy)));
  store_rgb(v1, out);
  return true;
}
#endif

// image_affine for C channels and one interpolation; inlined with both constant.
static inline void affine_pass(ImageView src, int C, const double a[6], bool bicubic,
                               const uint8_t *fill, uint8_t *dst) {
  for (int y = 0; y < src.h; y++) {
    for (int x = 0; x < src.w; x++) {
      double xo = x + 0.5, yo = y + 0.5;
      double xin = a[0] * xo + a[1] * yo + a[2];
      double yin = a[3] * xo + a[4] * yo + a[5];
      uint8_t *out = dst + ((size_t)y * src.w + x) * C;
      if (xin < 0.0 || xin >= src.w || yin < 0.0 || yin >= src.h) {
        for (int c = 0; c < C; c++) out[c] = fill[c];
      } else if (bicubic) {
#if defined(__AVX2__)
        if (C == 3 && sample_bicubic_rgb(src, xin, yin, out)) continue;
#endif
        sample_bicubic(src, C, xin, yin, out);
      } else {
#if defined(__AVX2__)
        if (C == 3 && sample_bilinear_rgb(src, xin, yin, out)) continue;
#endif
        sample_bilinear(src, C, xin, yin, out);
      }
    }
  }
}

void image_affine(ImageView src, const double a[6], Interp interp, const uint8_t *fill,
                  uint8_t *dst) {
  bool bicubic = interp == INTERP_BICUBIC;
  if (src.chans == 3 && bicubic)
    affine_pass(src, 3, a, true, fill, dst);
  else if (src.chans == 3)
    affine_pass(src, 3, a, false, fill, dst);
  else if (src.chans == 1 && bicubic)
    affine_pass(src, 1, a, true, fill, dst);
  else if (src.chans == 1)
    affine_pass(src, 1, a, false, fill, dst);
  else
    affine_pass(src, src.chans, a, bicubic, fill, dst);  // 2 or 4 (model.in_chans <= 4)
}

// Python's round(v, 15): the decimal rounding of the exact binary value, read back.
static double round15(double v) {
  char buf[64];
  snprintf(buf, sizeof buf, "%.15f", v);
  return strtod(buf, NULL);
}

void image_rotate_quarters(ImageView s, int quarters, uint8_t *dst) {
  int C = s.chans, n = s.w;
  for (int y = 0; y < s.h; y++) {
    for (int x = 0; x < s.w; x++) {
      int sy = y, sx = x;
      if (quarters == 2) sy = s.h - 1 - y, sx = s.w - 1 - x;
      if (quarters == 1) sy = x, sx = n - 1 - y;
      if (quarters == 3) sy = n - 1 - x, sx = y;
      memcpy(dst + ((size_t)y * s.w + x) * C, s.px + (int64_t)sy * s.stride + (size_t)sx * C,
             (size_t)C);
    }
  }
}

ImageRotation image_rotation(int h, int w, double degrees) {
  ImageRotation rot = {.quarters = -1};
  double angle = fmod(degrees, 360.0);  // Python's %: the sign of the divisor
  if (angle != 0 && angle < 0) angle += 360.0;
  if (angle == 0 || angle == 180 || ((angle == 90 || angle == 270) && w == h)) {
    rot.quarters = (int)(angle / 90);
    return rot;
  }
  double cx = w / 2.0, cy = h / 2.0;
  double r = -(angle * (PI_DOUBLE / 180.0));
  double *m = rot.matrix;
  m[0] = round15(cos(r));
  m[1] = round15(sin(r));
  m[2] = 0.0;
  m[3] = round15(-sin(r));
  m[4] = round15(cos(r));
  m[5] = 0.0;
  // Python: a * x + b * y + c, evaluated left to right.
  double tx = m[0] * -cx + m[1] * -cy + m[2];
  double ty = m[3] * -cx + m[4] * -cy + m[5];
  m[2] = tx + cx;
  m[5] = ty + cy;
  return rot;
}

void image_rotate(ImageView src, double degrees, Interp interp, const uint8_t *fill, uint8_t *dst) {
  ImageRotation rot = image_rotation(src.h, src.w, degrees);
  if (rot.quarters >= 0)
    image_rotate_quarters(src, rot.quarters, dst);
  else
    image_affine(src, rot.matrix, interp, fill, dst);
}

// ---- lookup-table ops (Pillow ImageOps; timm's solarize_add) ----

static void apply_lut_channel(uint8_t *img, int64_t pixels, int chans, int c, const int *lut) {
  for (int64_t i = 0; i < pixels; i++) {
    int v = lut[img[i * chans + c]];
    img[i * chans + c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);  // Pillow clips LUT values
  }
}

static void histogram(const uint8_t *img, int64_t pixels, int chans, int c, int64_t h[256]) {
  memset(h, 0, sizeof(int64_t) * 256);
  for (int64_t i = 0; i < pixels; i++) h[img[i * chans + c]]++;
}

void image_autocontrast(uint8_t *img, int h, int w, int chans) {
  int64_t pixels = (int64_t)h * w;
  for (int c = 0; c < chans; c++) {
    int64_t hist[256];
    int lut[256];
    histogram(img, pixels, chans, c, hist);
    int lo = 0, hi = 255;
    while (lo < 255 && !hist[lo]) lo++;
    while (hi > 0 && !hist[hi]) hi--;
    for (int i = 0; i < 256; i++) lut[i] = i;
    if (hi > lo) {
      double scale = 255.0 / (hi - lo), offset = -lo * scale;
      for (int i = 0; i < 256; i++) lut[i] = (int)(i * scale + offset);  // int(): toward zero
    }
    apply_lut_channel(img, pixels, chans, c, lut);
  }
}

void image_equalize(uint8_t *img, int h, int w, int chans) {
  int64_t pixels = (int64_t)h * w;
  for (int c = 0; c < chans; c++) {
    int64_t hist[256], total = 0, last = 0;
    int lut[256], used = 0;
    histogram(img, pixels, chans, c, hist);
    for (int i = 0; i < 256; i++)
      if (hist[i]) total += hist[i], last = hist[i], used++;
    int64_t step = used > 1 ? (total - last) / 255 : 0;
    if (step == 0) continue;  // Pillow: identity
    int64_t n = step / 2;
    for (int i = 0; i < 256; i++) {
      int64_t v = n / step;
      lut[i] = (int)(v > 255 ? 255 : v);
      n += hist[i];
    }
    apply_lut_channel(img, pixels, chans, c, lut);
  }
}

void image_invert(uint8_t *img, int64_t n) {
  for (int64_t i = 0; i < n; i++) img[i] = (uint8_t)(255 - img[i]);
}

void image_solarize(uint8_t *img, int64_t n, int threshold) {
  for (int64_t i = 0; i < n; i++)
    if (img[i] >= threshold) img[i] = (uint8_t)(255 - img[i]);
}

void image_solarize_add(uint8_t *img, int64_t n, int add, int threshold) {
  for (int64_t i = 0; i < n; i++) {
    if (img[i] < threshold) {
      int v = img[i] + add;
      img[i] = (uint8_t)(v > 255 ? 255 : v);
    }
  }
}

void image_posterize(uint8_t *img, int64_t n, int bits) {
  if (bits >= 8) return;
  uint8_t mask = (uint8_t) ~((1u << (8 - bits)) - 1);
  for (int64_t i = 0; i < n; i++) img[i] &= mask;
}

// ---- enhancers (Pillow ImageEnhance over Blend.c) ----

// Image.blend(degenerate, img, factor) into img; degenerate (n) is per element.
static void blend_into(uint8_t *img, const uint8_t *degenerate, int64_t n, double factor) {
  float alpha = (float)factor;
  if (alpha == 0.0f) {
    memcpy(img, degenerate, (size_t)n);
    return;
  }
  if (alpha == 1.0f) return;
  bool interpolate = alpha >= 0 && alpha <= 1.0;
  for (int64_t i = 0; i < n; i++) {
    float v = (float)degenerate[i] + alpha * (float)((int)img[i] - (int)degenerate[i]);
    if (interpolate)
      img[i] = (uint8_t)v;
    else
      img[i] = v <= 0.0f ? 0 : v >= 255.0f ? 255 : (uint8_t)v;
  }
}

void image_enhance_color(uint8_t *img, int h, int w, int chans, double factor) {
  // A gray image is its own degenerate (Pillow: convert("L") is the identity): unchanged.
  if (chans != 3) return;
  int64_t pixels = (int64_t)h * w;
  uint8_t *gray = malloc_check((size_t)pixels * 3);
  for (int64_t i = 0; i < pixels; i++)
    gray[3 * i] = gray[3 * i + 1] = gray[3 * i + 2] = image_aug_luma(img + 3 * i);
  blend_into(img, gray, pixels * 3, factor);
  free(gray);
}

void image_enhance_contrast(uint8_t *img, int h, int w, int chans, double factor) {
  int64_t pixels = (int64_t)h * w, n = pixels * chans;
  // ImageStat's mean of the luma histogram, summed in double in bin order.
  int64_t hist[256] = {0};
  for (int64_t i = 0; i < pixels; i++)
    hist[chans == 3 ? image_aug_luma(img + 3 * i) : img[i * chans]]++;
  double sum = 0.0;
  for (int j = 0; j < 256; j++) sum += (double)j * (double)hist[j];
  int mean = (int)(sum / (double)pixels + 0.5);
  uint8_t *flat = malloc_check((size_t)n);
  memset(flat, mean, (size_t)n);
  blend_into(img, flat, n, factor);
  free(flat);
}

void image_enhance_brightness(uint8_t *img, int h, int w, int chans, double factor) {
  int64_t n = (int64_t)h * w * chans;
  uint8_t *black = calloc_check((size_t)n, 1);
  blend_into(img, black, n, factor);
  free(black);
}

// ImageFilter.SMOOTH (3x3 kernel 1 1 1 / 1 5 1 / 1 1 1, divisor 13) as Filter.c computes it:
// fp32 taps, rows y+1, y, y-1 in that order, +0.5 and truncation; border pixels are copied.
static void smooth3x3(const uint8_t *src, int h, int w, int chans, uint8_t *dst) {
  memcpy(dst, src, (size_t)h * w * chans);
  if (h < 3 || w < 3) return;
  const float k1 = 1.0f / 13.0f, k5 = 5.0f / 13.0f;
  const float kernel[9] = {k1, k1, k1, k1, k5, k1, k1, k1, k1};
  int64_t row = (int64_t)w * chans;
  // Interior elements of a row are contiguous (x from 1 to w - 2, every channel), and each is
  // computed alone in Pillow's order, so the loop over them vectorizes without reordering.
  for (int y = 1; y < h - 1; y++) {
    const uint8_t *below = src + (y + 1) * row, *mid = src + y * row, *above = src + (y - 1) * row;
    uint8_t *out = dst + y * row;
    for (int64_t i = chans; i < row - chans; i++) {
      float ss = 0.5f;
      ss += (float)below[i - chans] * kernel[0] + (float)below[i] * kernel[1] +
            (float)below[i + chans] * kernel[2];
      ss += (float)mid[i - chans] * kernel[3] + (float)mid[i] * kernel[4] +
            (float)mid[i + chans] * kernel[5];
      ss += (float)above[i - chans] * kernel[6] + (float)above[i] * kernel[7] +
            (float)above[i + chans] * kernel[8];
      ss = ss < 0.0f ? 0.0f : ss;
      ss = ss > 255.0f ? 255.0f : ss;
      out[i] = (uint8_t)ss;
    }
  }
}

void image_enhance_sharpness(uint8_t *img, int h, int w, int chans, double factor) {
  int64_t n = (int64_t)h * w * chans;
  uint8_t *smooth = malloc_check((size_t)n);
  smooth3x3(img, h, w, chans, smooth);
  blend_into(img, smooth, n, factor);
  free(smooth);
}

// ---- augmentation steps (kernels/image_aug.h) ----

void image_apply_step(const ImageAugStep *s, const uint8_t *fill, uint8_t *img, int h, int w,
                      int chans, uint8_t *scratch) {
  int64_t n = (int64_t)h * w * chans;
  switch (s->op) {
    case IMAGE_AUG_AUTOCONTRAST:
      image_autocontrast(img, h, w, chans);
      return;
    case IMAGE_AUG_EQUALIZE:
      image_equalize(img, h, w, chans);
      return;
    case IMAGE_AUG_INVERT:
      image_invert(img, n);
      return;
    case IMAGE_AUG_POSTERIZE:
      image_posterize(img, n, s->level);
      return;
    case IMAGE_AUG_SOLARIZE:
      image_solarize(img, n, s->level);
      return;
    case IMAGE_AUG_SOLARIZE_ADD:
      image_solarize_add(img, n, s->level, IMAGE_AUG_SOLARIZE_ADD_BELOW);
      return;
    case IMAGE_AUG_COLOR:
      image_enhance_color(img, h, w, chans, s->factor);
      return;
    case IMAGE_AUG_CONTRAST:
      image_enhance_contrast(img, h, w, chans, s->factor);
      return;
    case IMAGE_AUG_BRIGHTNESS:
      image_enhance_brightness(img, h, w, chans, s->factor);
      return;
    case IMAGE_AUG_SHARPNESS:
      image_enhance_sharpness(img, h, w, chans, s->factor);
      return;
    case IMAGE_AUG_AFFINE:
      memcpy(scratch, img, (size_t)n);
      image_affine(image_view(scratch, h, w, chans), s->matrix,
                   s->bicubic ? INTERP_BICUBIC : INTERP_BILINEAR, fill, img);
      return;
    case IMAGE_AUG_TRANSPOSE:
      memcpy(scratch, img, (size_t)n);
      image_rotate_quarters(image_view(scratch, h, w, chans), s->level, img);
      return;
    default:
      return;
  }
}

void image_apply_steps(const ImageAugStep *steps, int n, const uint8_t *fill, uint8_t *img, int h,
                       int w, int chans) {
  uint8_t *scratch = NULL;
  for (int i = 0; i < n; i++) {
    if (!scratch && (steps[i].op == IMAGE_AUG_AFFINE || steps[i].op == IMAGE_AUG_TRANSPOSE))
      scratch = malloc_check((size_t)h * w * chans);
    image_apply_step(&steps[i], fill, img, h, w, chans, scratch);
  }
  free(scratch);
}
