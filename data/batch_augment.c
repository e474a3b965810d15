// batch_augment.c: host-side draws of random erasing and mixup / cutmix, and the soft targets
// (see batch_augment.h for the semantics and the RNG keys).
#include "data/batch_augment.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define PI_DOUBLE 3.14159265358979323846

// timm RandomErasing's defaults.
#define ERASE_MIN_AREA 0.02
#define ERASE_MAX_AREA (1.0 / 3.0)
#define ERASE_MIN_ASPECT 0.3

BatchAugmentOptions batch_augment_options(const Config *cfg, int rank) {
  BatchAugmentOptions o = {.seed = cfg->seed,
                           .reprob = cfg->reprob,
                           .mixup_alpha = cfg->mixup,
                           .cutmix_alpha = cfg->cutmix,
                           .mix_prob = cfg->mixup_prob,
                           .switch_prob = cfg->mixup_switch_prob,
                           .smoothing = cfg->label_smoothing,
                           .num_classes = cfg->num_classes,
                           .rank = rank};
  return o;
}

bool batch_augment_soft_targets(const BatchAugmentOptions *o) {
  return o->mixup_alpha > 0 || o->cutmix_alpha > 0;
}

bool batch_augment_active(const BatchAugmentOptions *o) {
  return o->reprob > 0 || batch_augment_soft_targets(o);
}

// Python's round() (half to even).
static int round_half_even(double x) {
  return (int)nearbyint(x);
}

EraseBox batch_augment_erase_box(float reprob, int H, int W, Rng *r) {
  EraseBox box;
  memset(&box, 0, sizeof box);
  if (rng_uniform_double(r) > reprob) return box;  // timm: random() > probability -> keep
  double area = (double)H * W;
  double log_lo = log(ERASE_MIN_ASPECT), log_hi = log(1 / ERASE_MIN_ASPECT);
  for (int attempt = 0; attempt < 10; attempt++) {
    double u = rng_uniform_double(r);
    double target = (ERASE_MIN_AREA + (ERASE_MAX_AREA - ERASE_MIN_AREA) * u) * area;
    double aspect = exp(log_lo + (log_hi - log_lo) * rng_uniform_double(r));
    int h = round_half_even(sqrt(target * aspect));
    int w = round_half_even(sqrt(target / aspect));
    if (w < W && h < H) {
      box.top = (int32_t)rng_below(r, (uint32_t)(H - h + 1));
      box.left = (int32_t)rng_below(r, (uint32_t)(W - w + 1));
      box.h = h;
      box.w = w;
      return box;
    }
  }
  return box;
}

static double normal_double(Rng *r) {
  double u = 1.0 - rng_uniform_double(r), v = rng_uniform_double(r);
  return sqrt(-2.0 * log(u)) * cos(2.0 * PI_DOUBLE * v);
}

// Gamma(a, 1): Marsaglia and Tsang (2000); for a < 1 the boost Gamma(a + 1) * U^(1/a).
static double gamma_draw(double a, Rng *r) {
  if (a < 1.0) {
    double u = rng_uniform_double(r);
    return gamma_draw(a + 1.0, r) * pow(u, 1.0 / a);
  }
  double d = a - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
  for (;;) {
    double x, v;
    do {
      x = normal_double(r);
      v = 1.0 + c * x;
    } while (v <= 0.0);
    v = v * v * v;
    double u = rng_uniform_double(r);
    if (u < 1.0 - 0.0331 * x * x * x * x) return d * v;
    if (log(u) < 0.5 * x * x + d * (1.0 - v + log(v))) return d * v;
  }
}

double batch_augment_beta(double alpha, Rng *r) {
  double x = gamma_draw(alpha, r), y = gamma_draw(alpha, r);
  return x + y > 0 ? x / (x + y) : 0.5;
}

static int clip_int(int v, int lo, int hi) {
  return v < lo ? lo : v > hi ? hi : v;
}

MixParams batch_augment_cutmix_box(double lam, int H, int W, int cy, int cx) {
  // timm rand_bbox: cut = int(side * sqrt(1 - lam)), box [c - cut // 2, c + (cut + 1) // 2)
  // clipped to the image (timm >= 1.0; older versions ended at c + cut // 2).
  double ratio = sqrt(1.0 - lam);
  int cut_h = (int)(H * ratio), cut_w = (int)(W * ratio);
  int yl = clip_int(cy - cut_h / 2, 0, H), yh = clip_int(cy + (cut_h + 1) / 2, 0, H);
  int xl = clip_int(cx - cut_w / 2, 0, W), xh = clip_int(cx + (cut_w + 1) / 2, 0, W);
  MixParams m = {.mode = MIX_CUTMIX, .top = yl, .left = xl, .h = yh - yl, .w = xh - xl};
  // correct_lam: the weight is the share of the image that stays.
  m.lam = 1.0 - (double)((yh - yl) * (xh - xl)) / (double)(H * W);
  return m;
}

void batch_augment_soft_targets_fill(float *targets, const int *labels, int B, int K, double lam,
                                     float smoothing) {
  // timm mixup_target: one_hot in fp32 with off = s / K and on = 1 - s + off, then
  // y1 * lam + y2 * (1 - lam), each product and the sum rounded to fp32.
  double off = (double)smoothing / K, on = 1.0 - (double)smoothing + off;
  float off_f = (float)off, on_f = (float)on, keep = (float)lam, take = (float)(1.0 - lam);
  for (int b = 0; b < B; b++) {
    int y1 = labels[b], y2 = labels[B - 1 - b];
    float *t = targets + (int64_t)b * K;
    for (int k = 0; k < K; k++) {
      float p = (k == y1 ? on_f : off_f) * keep;
      float q = (k == y2 ? on_f : off_f) * take;
      t[k] = p + q;
    }
  }
}

static MixParams draw_mix(const BatchAugmentOptions *o, const Batch *b, int part, int parts, int H,
                          int W) {
  MixParams m = {.mode = MIX_NONE, .lam = 1.0};
  Rng r = rng_make(o->seed, RNG_STREAM_MIXUP + 256u * (uint32_t)o->rank, (uint64_t)b->epoch,
                   (uint64_t)b->index * (uint64_t)parts + (uint64_t)part);
  if (!batch_augment_soft_targets(o) || !(rng_uniform_double(&r) < o->mix_prob)) return m;
  bool cutmix = o->cutmix_alpha > 0;
  if (o->mixup_alpha > 0 && o->cutmix_alpha > 0) cutmix = rng_uniform_double(&r) < o->switch_prob;
  double lam = batch_augment_beta(cutmix ? o->cutmix_alpha : o->mixup_alpha, &r);
  if (lam == 1.0) return m;  // timm: nothing to mix
  if (!cutmix) {
    m.mode = MIX_MIXUP;
    m.lam = lam;
    return m;
  }
  int cy = (int)rng_below(&r, (uint32_t)H), cx = (int)rng_below(&r, (uint32_t)W);
  return batch_augment_cutmix_box(lam, H, W, cy, cx);
}

int batch_augment_draw(const BatchAugmentOptions *o, const Batch *b, int part, int parts, int H,
                       int W, EraseBox *erase, BatchAugment *out, float *soft_targets, Error *err) {
  int B = b->count / parts;
  const int *labels = b->labels + (int64_t)part * B;
  const int64_t *samples = b->samples + (int64_t)part * B;
  bool soft = batch_augment_soft_targets(o);
  if (soft && B % 2 != 0) {
    char which[48] = "";
    if (parts > 1) snprintf(which, sizeof which, "micro-batch %d of ", part);
    return error_set(err,
                     "mixup/cutmix pair sample b with sample B-1-b, but %sbatch %lld of epoch "
                     "%lld has %d samples (odd)\nHINT: use an even train.batch_size per rank and "
                     "micro-batch",
                     which, (long long)b->index, (long long)b->epoch, B);
  }
  for (int j = 0; j < B; j++)
    if (labels[j] < 0 || labels[j] >= o->num_classes)
      return error_set(err, "batch %lld: label %d of sample %lld is outside [0, %d)",
                       (long long)b->index, labels[j], (long long)samples[j], o->num_classes);
  out->erase = NULL;
  if (o->reprob > 0) {
    for (int j = 0; j < B; j++) {
      uint64_t epoch = (uint64_t)b->epoch, sample = (uint64_t)samples[j];
      Rng r = rng_make(o->seed, RNG_STREAM_ERASE, epoch, sample);
      erase[j] = batch_augment_erase_box(o->reprob, H, W, &r);
      erase[j].fill = rng_make(o->seed, RNG_STREAM_ERASE_FILL, epoch, sample);
    }
    out->erase = erase;
  }
  out->mix = draw_mix(o, b, part, parts, H, W);
  if (soft && soft_targets)
    batch_augment_soft_targets_fill(soft_targets, labels, B, o->num_classes, out->mix.lam,
                                    o->smoothing);
  return 0;
}
