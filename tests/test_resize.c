// test_resize.c: the batched resize's packing and per-pixel code (kernels/resize.h, the code the
// CUDA kernels run) against the CPU transform (transform_apply: image_resize, the copy of an
// unchanged size, transform_hflip), on random images and plans, with no GPU needed. The GPU
// kernels themselves are checked on nvJPEG's pixels by tests/test_gpu_jpeg.c.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/image_ops.h"
#include "data/randaugment.h"
#include "data/transform.h"
#include "kernels/resize.h"
#include "src/base/rng.h"
#include "src/base/util.h"
#include "tests/util/test_plans.h"
#include "tests/util/test_util.h"

// Batches of 1-6 random images (gray or RGB, up to 160 a side) side by side in one source
// buffer with gaps between them, each with a random plan; packed, resized by resize_batch_cpu
// into outputs poisoned first with 0x00 and then with 0xFF (a byte never written fails one of
// the two), and compared with transform_apply on each image alone: 0 bytes may differ (the
// sums are exact integers, and the weights the same integers).
static void test_batches(void) {
  TestRng r = {20261202};
  int batches = 0, images = 0, kinds[TEST_PLAN_KINDS] = {0};
  int64_t differ = 0, bytes = 0, layout_bad = 0;
  for (int t = 0; t < 120; t++) {
    int n = 1 + test_below(&r, 6), chans = test_below(&r, 2) ? 3 : 1;
    int h[6], w[6];
    int64_t src_at[6], src_bytes = 0;
    TransformPlan plans[6];
    int kind[6];
    for (int k = 0; k < n; k++) {
      h[k] = 1 + test_below(&r, 160);
      w[k] = 1 + test_below(&r, 160);
      src_bytes += test_below(&r, 7);  // a gap: offsets need not be aligned or adjacent
      src_at[k] = src_bytes;
      src_bytes += (int64_t)h[k] * w[k] * chans;
      kind[k] = test_below(&r, TEST_PLAN_KINDS);
      plans[k] = test_random_plan(&r, h[k], w[k], kind[k]);
      kinds[kind[k]]++;
    }
    uint8_t *src = malloc_check((size_t)src_bytes);
    for (int64_t i = 0; i < src_bytes; i++) src[i] = (uint8_t)test_rng_u64(&r);
    TestPacked p = test_pack(plans, n, chans, src_at);
    // The layout transform_plans_pack promises: outputs packed in order from byte 0.
    int64_t at = 0;
    for (int k = 0; k < n; k++) {
      layout_bad += test_desc(&p, k)->dst != at;
      at += (int64_t)plans[k].out_h * plans[k].out_w * chans;
    }
    layout_bad += p.batch.dst_bytes != at || p.batch.count != n || p.batch.chans != chans;
    uint8_t *tmp = malloc_check((size_t)p.batch.tmp_bytes);
    uint8_t *got = malloc_check((size_t)p.batch.dst_bytes);
    uint8_t *want = malloc_check((size_t)p.batch.dst_bytes);
    for (int k = 0; k < n; k++)
      transform_apply(&plans[k], src + src_at[k], chans, want + test_desc(&p, k)->dst);
    for (int poison = 0x00; poison <= 0xFF; poison += 0xFF) {
      memset(got, poison, (size_t)p.batch.dst_bytes);
      memset(tmp, poison, (size_t)p.batch.tmp_bytes);
      resize_batch_cpu(src, p.packed, &p.batch, tmp, got);
      for (int k = 0; k < n; k++) {
        const TransformPlan *q = &plans[k];
        int64_t off = test_desc(&p, k)->dst, len = (int64_t)q->out_h * q->out_w * chans;
        int64_t d = test_bytes_differ(got + off, want + off, len);
        if (d)
          test_check(0,
                     "%s plan, %dx%dx%d image, box %dx%d at (%d, %d) -> %dx%d, window %dx%d at "
                     "(%d, %d), %s%s, poison 0x%02x: %lld of %lld bytes differ",
                     test_plan_kind(kind[k]), h[k], w[k], chans, q->box.h, q->box.w, q->box.top,
                     q->box.left, q->resize_h, q->resize_w, q->out_h, q->out_w, q->top, q->left,
                     q->interp == INTERP_BICUBIC ? "bicubic" : "bilinear",
                     q->hflip ? ", flipped" : "", poison, (long long)d, (long long)len);
        differ += d;
        bytes += len;
      }
    }
    batches++;
    images += n;
    free(src), free(tmp), free(got), free(want), free(p.packed);
  }
  test_check(layout_bad == 0,
             "transform_plans_pack: outputs packed in order, sizes summed (%lld "
             "wrong)",
             (long long)layout_bad);
  test_check(differ == 0,
             "resize_batch_cpu vs transform_apply: %d batches, %d images (%d train, %d eval, %d "
             "copy-sized, %d arbitrary plans), 1 and 3 channels, two poisons: %lld of %lld bytes "
             "differ (tol 0)",
             batches, images, kinds[0], kinds[1], kinds[2], kinds[3], (long long)differ,
             (long long)bytes);
}

// transform_plan_train draws what transform_train drew before it was split into a plan: the
// box, the interpolation, then the flip, from the same generator in that order, so the colour
// part that follows (RandAugment) sees the same draws.
static void test_train_draw_order(void) {
  TransformParams p = {.out_h = 24,
                       .out_w = 24,
                       .chans = 3,
                       .scale_min = 0.08f,
                       .scale_max = 1,
                       .ratio_min = 0.75f,
                       .ratio_max = 4.0f / 3,
                       .hflip = 0.5f,
                       .resample = RESAMPLE_RANDOM};
  int same = 1, flips = 0;
  for (int i = 0; i < 500; i++) {
    Rng a = rng_make(11, RNG_STREAM_AUGMENT, 3, (uint64_t)i), b = a;
    TransformPlan t = transform_plan_train(&p, 90 + i % 50, 140 - i % 70, &a);
    CropBox box = transform_rrc_box(&p, 90 + i % 50, 140 - i % 70, &b);
    Interp interp = resample_pick(p.resample, &b);
    bool flip = rng_uniform(&b) < p.hflip;
    same &= memcmp(&t.box, &box, sizeof box) == 0 && t.interp == interp && t.hflip == flip &&
            rng_u32(&a) == rng_u32(&b);
    flips += flip;
  }
  test_check(same && flips > 150 && flips < 350,
             "transform_plan_train: box, interpolation, flip drawn in transform_train's order, "
             "the generator left where it was (500 samples, %d flips)",
             flips);
}

// transform_plan_check: the plans the draws make pass; each way a plan can miss its image fails,
// and the message gives the image's size and the plan's box.
static void test_plan_check(void) {
  TransformParams p = {.out_h = 24,
                       .out_w = 20,
                       .chans = 3,
                       .scale_min = 0.08f,
                       .scale_max = 1.0f,
                       .ratio_min = 0.75f,
                       .ratio_max = 4.0f / 3.0f,
                       .hflip = 0.5f,
                       .crop_pct = 0.875f,
                       .resample = RESAMPLE_RANDOM};
  char why[256];
  int bad = 0;
  for (int i = 0; i < 200; i++) {
    Rng r = rng_make(5, RNG_STREAM_AUGMENT, 0, (uint64_t)i);
    int h = 17 + i % 60, w = 23 + i % 45;
    TransformPlan t = transform_plan_train(&p, h, w, &r), e = transform_plan_eval(&p, h, w);
    bad += transform_plan_check(&t, h, w, why, sizeof why) != 0;
    bad += transform_plan_check(&e, h, w, why, sizeof why) != 0;
  }
  test_check(bad == 0, "transform_plan_check: 400 drawn plans (train and eval) fit (%d refused)",
             bad);
  Rng r = rng_make(5, RNG_STREAM_AUGMENT, 0, 7);
  const TransformPlan good = transform_plan_train(&p, 50, 60, &r);
  struct {
    const char *what;
    TransformPlan t;
    int h, w;
  } cases[6];
  for (int k = 0; k < 6; k++) cases[k].t = good, cases[k].h = 50, cases[k].w = 60;
  cases[0].what = "another image size";
  cases[0].h = 49;
  cases[1].what = "box past the bottom";
  cases[1].t.box.top = 50 - cases[1].t.box.h + 1;
  cases[2].what = "box left of the image";
  cases[2].t.box.left = -1;
  cases[3].what = "empty box";
  cases[3].t.box.w = 0;
  cases[4].what = "window past the resize";
  cases[4].t.left = cases[4].t.resize_w - cases[4].t.out_w + 1;
  cases[5].what = "empty output";
  cases[5].t.out_h = 0;
  for (int k = 0; k < 6; k++) {
    why[0] = 0;
    int rc = transform_plan_check(&cases[k].t, cases[k].h, cases[k].w, why, sizeof why);
    char image[32];
    snprintf(image, sizeof image, "a %dx%d image", cases[k].h, cases[k].w);
    test_check(rc == -1 && strstr(why, image) && strstr(why, "box "),
               "transform_plan_check refuses a plan with %s: \"%s\"", cases[k].what, why);
  }
}

int main(void) {
  test_batches();
  test_train_draw_order();
  test_plan_check();
  return test_finish();
}
