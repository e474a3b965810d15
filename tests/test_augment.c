// test_augment.c: the per-batch augmentations (kernels/augment.h, data/batch_augment.h):
// the portable normal generator against libm's Box-Muller, random erasing, mixup and cutmix
// against independent element-by-element references, the host draws (erase boxes, Beta, cutmix
// boxes, soft targets) against timm's rules and the distributions they should follow.
#include <math.h>

#include "data/batch_augment.h"
#include "kernels/augment.h"
#include "src/base/rng.h"
#include "tests/util/test_util.h"

// rng_normal_at recomputed with libm in double from the same Philox bits.
static double normal_reference(const Rng *r, uint64_t i) {
  Philox4 x = rng_block(r, (uint32_t)(i >> 2));
  int pair = (int)((i & 3) >> 1);
  double u = (double)((x.v[2 * pair] >> 8) + 1) / 16777216.0;
  double turn = (double)(x.v[2 * pair + 1] >> 8) / 16777216.0;
  double radius = sqrt(-2.0 * log(u));
  return (i & 1) ? radius * sin(2 * 3.14159265358979323846 * turn)
                 : radius * cos(2 * 3.14159265358979323846 * turn);
}

static void test_normals(void) {
  enum { N = 1 << 20 };
  Rng r = rng_make(12345, RNG_STREAM_ERASE_FILL, 3, 77);
  double sum = 0, sum2 = 0, sum4 = 0, worst = 0;
  int64_t within1 = 0;
  for (int64_t i = 0; i < N; i++) {
    double z = rng_normal_at(&r, (uint64_t)i), ref = normal_reference(&r, (uint64_t)i);
    // fp32 Box-Muller: radius to ~1e-7 relative, the angle's sin/cos to ~1e-7 absolute.
    worst = fmax(worst, fabs(z - ref) / fmax(1.0, fabs(ref)));
    sum += z;
    sum2 += z * z;
    sum4 += z * z * z * z;
    within1 += fabs(z) < 1;
  }
  test_check(worst < 2e-6, "normals: fp32 log/sincos vs libm double, max err %.2e (tol 2e-6)",
             worst);
  double mean = sum / N, var = sum2 / N - mean * mean, kurt = sum4 / N / (var * var);
  // Standard errors for 2^20 draws: mean 1e-3, variance 1.4e-3, kurtosis 4.8e-3, P(|z|<1) 4.5e-4.
  test_check(fabs(mean) < 5e-3 && fabs(var - 1) < 7e-3 && fabs(kurt - 3) < 0.03 &&
                 fabs((double)within1 / N - 0.682689) < 2.5e-3,
             "normals: mean %.4f, var %.4f, kurtosis %.3f, P(|z|<1) %.4f (N(0,1): 0, 1, 3, 0.6827)",
             mean, var, kurt, (double)within1 / N);
  Rng other = rng_make(12345, RNG_STREAM_ERASE_FILL, 3, 78);
  test_check(rng_normal_at(&r, 5) != rng_normal_at(&other, 5) &&
                 rng_normal_at(&r, 5) == rng_normal_at(&r, 5),
             "normals: a pure function of (key, index); another sample key differs");
}

typedef struct {
  int B, H, W, C;
  float *x;  // (B, H, W, C)
} TestBatch;

static TestBatch random_batch(TestRng *r, int B, int H, int W, int C) {
  TestBatch t = {B, H, W, C, test_alloc_floats((int64_t)B * H * W * C)};
  test_fill_uniform(r, t.x, (int64_t)B * H * W * C, -2.0f, 2.0f);
  return t;
}

// Element (b, y, x, c) of the reference: erased from box, then mixed per p, in double where the
// operation is arithmetic (rounded to fp32 at the end).
static double reference_element(const TestBatch *t, const BatchAugment *p, int b, int y, int x,
                                int c) {
  int64_t n = (int64_t)t->H * t->W * t->C, i = ((int64_t)y * t->W + x) * t->C + c;
  double v[2];
  int who[2] = {b, t->B - 1 - b};
  for (int k = 0; k < 2; k++) {
    v[k] = t->x[who[k] * n + i];
    const EraseBox *e = p->erase ? &p->erase[who[k]] : NULL;
    if (e && y >= e->top && y < e->top + e->h && x >= e->left && x < e->left + e->w)
      v[k] = normal_reference(&e->fill, (uint64_t)i);
  }
  const MixParams *m = &p->mix;
  if (m->mode == MIX_MIXUP) return v[0] * m->lam + v[1] * (1 - m->lam);
  if (m->mode == MIX_CUTMIX && y >= m->top && y < m->top + m->h && x >= m->left &&
      x < m->left + m->w)
    return v[1];
  return v[0];
}

// Applies p with batch_augment_cpu and compares every element with the reference: erased
// elements within the normal generator's 2e-6, mixed ones within fp32 rounding (three
// roundings of values <= 4 in magnitude: 4e-7 relative to the row scale), the rest exact.
static void check_batch(const char *what, TestBatch t, const BatchAugment *p) {
  int64_t n = (int64_t)t.B * t.H * t.W * t.C;
  float *got = test_alloc_floats(n);
  memcpy(got, t.x, sizeof(float) * (size_t)n);
  batch_augment_cpu(got, p, t.B, t.H, t.W, t.C);
  double worst = 0;
  int64_t changed = 0;
  for (int b = 0; b < t.B; b++)
    for (int y = 0; y < t.H; y++)
      for (int x = 0; x < t.W; x++)
        for (int c = 0; c < t.C; c++) {
          int64_t i = (((int64_t)b * t.H + y) * t.W + x) * t.C + c;
          double want = reference_element(&t, p, b, y, x, c);
          double err = fabs(got[i] - want) / fmax(1.0, fabs(want));
          if (!(err <= worst)) worst = err;
          changed += got[i] != t.x[i];
        }
  test_check(worst <= 2e-6 && changed > 0, "%-40s max err %.2e (tol 2e-6), %lld of %lld changed",
             what, worst, (long long)changed, (long long)n);
  free(got);
}

static void test_kernels(TestRng *r) {
  TestBatch t = random_batch(r, 6, 13, 17, 3);
  EraseBox boxes[6];
  memset(boxes, 0, sizeof boxes);
  for (int b = 0; b < 6; b++) boxes[b].fill = rng_make(9, RNG_STREAM_ERASE_FILL, 1, (uint64_t)b);
  boxes[0] = (EraseBox){2, 3, 5, 7, boxes[0].fill};    // inside
  boxes[2] = (EraseBox){0, 0, 13, 1, boxes[2].fill};   // a full-height column at the left edge
  boxes[5] = (EraseBox){12, 16, 1, 1, boxes[5].fill};  // the last pixel
  BatchAugment p = {.erase = boxes, .mix = {.mode = MIX_NONE, .lam = 1}};
  check_batch("erase only (3 of 6 samples)", t, &p);
  p.mix = (MixParams){.mode = MIX_MIXUP, .lam = 0.3137};
  check_batch("erase + mixup lam 0.3137", t, &p);
  p.mix = batch_augment_cutmix_box(0.6, 13, 17, 1, 15);  // clipped at the top and right
  check_batch("erase + cutmix box clipped at a corner", t, &p);
  p.erase = NULL;
  p.mix = (MixParams){.mode = MIX_MIXUP, .lam = 0.9};
  check_batch("mixup only", t, &p);

  // Mixup's exact rounding: x * fp32(lam) and y * fp32(1 - lam), each rounded, then the sum.
  float *got = test_alloc_floats(6 * 13 * 17 * 3);
  memcpy(got, t.x, sizeof(float) * 6 * 13 * 17 * 3);
  batch_augment_cpu(got, &p, 6, 13, 17, 3);
  int64_t n = 13 * 17 * 3, differ = 0;
  volatile float keep = (float)0.9, take = (float)(1.0 - 0.9);
  for (int b = 0; b < 6; b++)
    for (int64_t i = 0; i < n; i++) {
      volatile float a = t.x[b * n + i] * keep, c = t.x[(5 - b) * n + i] * take;
      differ += got[b * n + i] != (float)(a + c);
    }
  test_check(differ == 0, "mixup rounds like PyTorch's mul_/add_: %lld elements differ",
             (long long)differ);
  free(got);

  // An odd batch with erasing only: the middle sample is erased once, not twice.
  TestBatch odd = random_batch(r, 5, 8, 9, 1);
  EraseBox ob[5];
  memset(ob, 0, sizeof ob);
  ob[2] = (EraseBox){1, 1, 4, 4, rng_make(9, RNG_STREAM_ERASE_FILL, 2, 2)};
  BatchAugment po = {.erase = ob, .mix = {.mode = MIX_NONE, .lam = 1}};
  check_batch("odd batch, erase the middle sample", odd, &po);
  free(odd.x);
  free(t.x);
}

static void test_erase_boxes(void) {
  enum { N = 20000, H = 32, W = 48 };
  int erased = 0, inside = 1, area_ok = 1, aspect_ok = 1, same = 1;
  double area_sum = 0;
  for (int i = 0; i < N; i++) {
    Rng r = rng_make(5, RNG_STREAM_ERASE, 0, (uint64_t)i), r2 = r;
    EraseBox b = batch_augment_erase_box(0.25f, H, W, &r),
             b2 = batch_augment_erase_box(0.25f, H, W, &r2);
    same &= b.top == b2.top && b.left == b2.left && b.h == b2.h && b.w == b2.w;
    if (b.h == 0) continue;
    erased++;
    inside &=
        b.top >= 0 && b.left >= 0 && b.h < H && b.w < W && b.top + b.h <= H && b.left + b.w <= W;
    // h and w are rounded from reals: allow half a pixel on each side.
    double a_hi = (b.h + 0.5) * (b.w + 0.5) / (H * W), a_lo = (b.h - 0.5) * (b.w - 0.5) / (H * W);
    area_ok &= a_hi >= 0.02 && a_lo <= 1.0 / 3.0;
    aspect_ok &= (b.h + 0.5) / (b.w - 0.5) >= 0.3 && (b.h - 0.5) / (b.w + 0.5) <= 1 / 0.3;
    area_sum += (double)b.h * b.w / (H * W);
  }
  // Binomial(20000, 0.25): sd 61, so +-300 is 5 sd. A few of the erasings fail all 10 tries
  // (tall boxes on a 32-row image), which lowers the rate by well under 1%.
  test_check(abs(erased - N / 4) < 300, "erase: %d of %d samples erased (want ~%d)", erased, N,
             N / 4);
  test_check(inside && area_ok && aspect_ok && same,
             "erase: boxes inside, area in [0.02, 1/3], aspect in [0.3, 3.33], deterministic");
  // Accepted areas are U(0.02, 1/3) thinned by the fit test; the mean stays well inside.
  double mean_area = area_sum / erased;
  test_check(mean_area > 0.12 && mean_area < 0.19, "erase: mean box area %.3f of the image",
             mean_area);
}

static void test_beta_and_cutmix(void) {
  const double alphas[3] = {0.8, 1.0, 0.2};
  for (int a = 0; a < 3; a++) {
    enum { N = 40000 };
    double sum = 0, sum2 = 0;
    int in_range = 1;
    for (int i = 0; i < N; i++) {
      Rng r = rng_make(1, RNG_STREAM_MIXUP, (uint64_t)a, (uint64_t)i);
      double x = batch_augment_beta(alphas[a], &r);
      in_range &= x >= 0 && x <= 1;
      sum += x;
      sum2 += x * x;
    }
    double mean = sum / N, var = sum2 / N - mean * mean, want_var = 1 / (4 * (2 * alphas[a] + 1));
    // sd of the mean sqrt(var / N) <= 2.5e-3; of the variance ~ var * sqrt(2 / N) (~2e-3).
    test_check(in_range && fabs(mean - 0.5) < 0.01 && fabs(var - want_var) < 0.01,
               "Beta(%.1f, %.1f): mean %.4f (0.5), var %.4f (%.4f)", alphas[a], alphas[a], mean,
               var, want_var);
  }
  // timm rand_bbox at lam 0.75 on 33 x 48: cut 16 x 24, centered at (10, 40): rows [2, 18),
  // columns [28, 48) (clipped from 52), so lam = 1 - 16 * 20 / 1584. At lam 0.5 on 33 x 48: cut
  // int(33 * 0.7071) = 23 rows, [c - 11, c + 12): 23 rows for a center inside.
  MixParams m = batch_augment_cutmix_box(0.75, 33, 48, 10, 40);
  MixParams odd = batch_augment_cutmix_box(0.5, 33, 48, 16, 20);
  test_check(m.mode == MIX_CUTMIX && m.top == 2 && m.h == 16 && m.left == 28 && m.w == 20 &&
                 m.lam == 1.0 - 320.0 / 1584.0 && odd.top == 5 && odd.h == 23,
             "cutmix box (%d,%d %dx%d) and corrected lam %.6f", m.top, m.left, m.h, m.w, m.lam);
}

static void test_soft_targets(void) {
  enum { B = 4, K = 5 };
  int labels[B] = {0, 3, 3, 1};
  float t[B * K];
  test_poison(t, B * K);
  double lam = 0.35;
  float s = 0.1f;
  batch_augment_soft_targets_fill(t, labels, B, K, lam, s);
  double worst = 0, worst_sum = 0;
  for (int b = 0; b < B; b++) {
    double row = 0;
    for (int k = 0; k < K; k++) {
      double want = lam * ((k == labels[b] ? 1 - s : 0) + s / K) +
                    (1 - lam) * ((k == labels[B - 1 - b] ? 1 - s : 0) + s / K);
      worst = fmax(worst, fabs(t[b * K + k] - want));
      row += t[b * K + k];
    }
    worst_sum = fmax(worst_sum, fabs(row - 1));
  }
  // fp32 one-hot values and three roundings: a few ulps of 1.
  test_check(worst < 3e-7 && worst_sum < 1e-6,
             "soft targets: max err %.2e vs lam-mixed smoothed one-hots, rows sum to 1 within %.1e",
             worst, worst_sum);
}

static void test_draw(void) {
  enum { B = 8, K = 10, H = 16, W = 16 };
  int labels[B];
  int64_t samples[B];
  for (int b = 0; b < B; b++) labels[b] = b % K, samples[b] = 100 + b;
  Batch batch = {.labels = labels, .samples = samples, .count = B, .epoch = 2, .index = 0};
  BatchAugmentOptions o = {.seed = 7,
                           .reprob = 0.25f,
                           .mixup_alpha = 0.8f,
                           .cutmix_alpha = 1.0f,
                           .mix_prob = 1.0f,
                           .switch_prob = 0.5f,
                           .smoothing = 0.1f,
                           .num_classes = K};
  EraseBox boxes[B], boxes2[B];
  float targets[B * K], targets2[B * K];
  BatchAugment p, p2;
  Error err;
  int mixup = 0, cutmix = 0, none = 0, erased = 0, deterministic = 1;
  for (int i = 0; i < 400; i++) {
    batch.index = i;
    for (int b = 0; b < B; b++) samples[b] = (int64_t)i * B + b;  // erasing is keyed per sample
    if (batch_augment_draw(&o, &batch, 0, 1, H, W, boxes, &p, targets, &err) != 0) {
      test_check(0, "draw: %s", err.msg);
      return;
    }
    batch_augment_draw(&o, &batch, 0, 1, H, W, boxes2, &p2, targets2, &err);
    deterministic &= memcmp(boxes, boxes2, sizeof boxes) == 0 && p.mix.lam == p2.mix.lam &&
                     memcmp(targets, targets2, sizeof targets) == 0;
    mixup += p.mix.mode == MIX_MIXUP;
    cutmix += p.mix.mode == MIX_CUTMIX;
    none += p.mix.mode == MIX_NONE;
    for (int b = 0; b < B; b++) erased += boxes[b].h > 0;
  }
  // Switch probability 0.5 over 400 batches: sd 10. Erasing: 3200 samples at 0.25, sd 24.5.
  test_check(abs(mixup - 200) < 50 && abs(cutmix - 200) < 50 && none == 0,
             "draw: %d mixup, %d cutmix, %d unmixed of 400 batches", mixup, cutmix, none);
  test_check(abs(erased - 800) < 120 && deterministic,
             "draw: %d of 3200 samples erased (~800); the same batch draws the same", erased);
  o.mix_prob = 0;
  batch_augment_draw(&o, &batch, 0, 1, H, W, boxes, &p, targets, &err);
  test_check(p.mix.mode == MIX_NONE && p.mix.lam == 1 && fabsf(targets[0] - 0.91f) < 1e-6f,
             "draw: mix_prob 0 leaves the batch alone, targets are smoothed one-hots");
  // Micro-batch j of 2 (gradient accumulation): samples [4j, 4j + 4) erased as in the whole batch
  // (keyed per sample), mixed within the micro-batch with its own draw, keyed as batch 2i + j of
  // one part (so micro-batches differ and every step's pair of draws is new).
  o.mix_prob = 1.0f;
  EraseBox part_boxes[B / 2];
  float part_targets[B / 2 * K], alone_targets[B / 2 * K];
  BatchAugment q, alone;
  batch_augment_draw(&o, &batch, 0, 1, H, W, boxes, &p, targets, &err);
  bool same_boxes = true, same_mix = true, distinct = false;
  MixParams mixes[2];
  for (int j = 0; j < 2; j++) {
    if (batch_augment_draw(&o, &batch, j, 2, H, W, part_boxes, &q, part_targets, &err) != 0) {
      test_check(0, "draw of micro-batch %d: %s", j, err.msg);
      return;
    }
    same_boxes &= memcmp(part_boxes, boxes + j * (B / 2), sizeof part_boxes) == 0;
    Batch as_batch = batch;  // the micro-batch as a batch of its own, index 2i + j
    as_batch.labels = labels + j * (B / 2);
    as_batch.samples = samples + j * (B / 2);
    as_batch.count = B / 2;
    as_batch.index = batch.index * 2 + j;
    batch_augment_draw(&o, &as_batch, 0, 1, H, W, part_boxes, &alone, alone_targets, &err);
    same_mix &= memcmp(&q.mix, &alone.mix, sizeof q.mix) == 0 &&
                memcmp(part_targets, alone_targets, sizeof part_targets) == 0;
    mixes[j] = q.mix;
  }
  distinct = mixes[0].lam != mixes[1].lam;
  test_check(same_boxes && same_mix && distinct,
             "draw of 2 micro-batches: the batch's erase boxes, each mixed within itself as "
             "batch 2i + j (lam %.4f, %.4f)",
             mixes[0].lam, mixes[1].lam);
  o.mix_prob = 0;
  batch.count = 7;
  test_check(batch_augment_draw(&o, &batch, 0, 1, H, W, boxes, &p, targets, &err) != 0 &&
                 strstr(err.msg, "odd") && strstr(err.msg, "HINT"),
             "draw: an odd batch with mixup is refused");
  batch.count = 6;
  test_check(batch_augment_draw(&o, &batch, 1, 2, H, W, boxes, &p, targets, &err) != 0 &&
                 strstr(err.msg, "micro-batch 1 of batch") && strstr(err.msg, "3 samples (odd)"),
             "draw: an odd micro-batch with mixup is refused, naming it (%s)", err.msg);
  batch.count = B;
  labels[3] = K;
  test_check(batch_augment_draw(&o, &batch, 0, 1, H, W, boxes, &p, targets, &err) != 0 &&
                 strstr(err.msg, "label 10"),
             "draw: a label outside [0, K) is refused");
}

int main(void) {
  TestRng r = {20261201};
  test_normals();
  test_kernels(&r);
  test_erase_boxes();
  test_beta_and_cutmix();
  test_soft_targets();
  test_draw();
  return test_finish();
}
