// test_plans.h: random TransformPlans (data/transform.h) and the packed batches that run them
// (kernels/resize.h), for the tests of the batched resize: tests/test_resize.c (its CPU form)
// and tests/test_gpu_jpeg.c (the kernels, on nvJPEG's pixels). The plans cover what the loader
// makes (train: RandomResizedCrop + flip draws; eval: resize + center crop, square or not) and
// what it could: a resize to the box's own size (the copy), arbitrary boxes shrunk up to 8x or
// grown up to 4x per axis, windows anywhere in the resize, both filters, flip on and off.
#pragma once
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "data/transform.h"
#include "src/base/util.h"
#include "tests/util/test_util.h"

static inline int test_below(TestRng *r, int n) {
  return (int)(test_rng_u64(r) % (uint64_t)n);
}

static inline CropBox test_random_box(TestRng *r, int h, int w) {
  CropBox b;
  b.h = 1 + test_below(r, h);
  b.w = 1 + test_below(r, w);
  b.top = test_below(r, h - b.h + 1);
  b.left = test_below(r, w - b.w + 1);
  return b;
}

// Plan kinds: 0 train, 1 eval, 2 copy-sized, 3 arbitrary.
enum { TEST_PLAN_KINDS = 4 };

// A plan of the given kind for an (h, w) image. Outputs stay small (at most 96 a side) so the
// CPU reference is quick.
static inline TransformPlan test_random_plan(TestRng *r, int h, int w, int kind) {
  TransformPlan t;
  if (kind == 0 || kind == 1) {
    TransformParams p = {.out_h = 4 + test_below(r, 93),
                         .out_w = 4 + test_below(r, 93),
                         .scale_min = 0.08f,
                         .scale_max = 1,
                         .ratio_min = 0.75f,
                         .ratio_max = 4.0f / 3,
                         .hflip = 0.5f,
                         .crop_pct = test_below(r, 2) ? 0.875f : test_rng_uniform(r, 0.5f, 1.0f),
                         .resample = (ResampleChoice)test_below(r, 3)};
    if (test_below(r, 2)) p.out_w = p.out_h;  // square: torchvision's Resize(int)
    if (kind == 0) {
      Rng rng = rng_make(test_rng_u64(r), RNG_STREAM_AUGMENT, 0, 0);
      return transform_plan_train(&p, h, w, &rng);
    }
    return transform_plan_eval(&p, h, w);
  }
  t = (TransformPlan){.src_h = h, .src_w = w, .box = test_random_box(r, h, w)};
  if (kind == 2) {
    t.resize_h = t.box.h;
    t.resize_w = t.box.w;
  } else {
    t.resize_h = t.box.h / 8 + 1 + test_below(r, 4 * t.box.h);
    t.resize_w = t.box.w / 8 + 1 + test_below(r, 4 * t.box.w);
    if (t.resize_h > 300) t.resize_h = 1 + test_below(r, 300);
    if (t.resize_w > 300) t.resize_w = 1 + test_below(r, 300);
  }
  t.out_h = 1 + test_below(r, t.resize_h < 96 ? t.resize_h : 96);
  t.out_w = 1 + test_below(r, t.resize_w < 96 ? t.resize_w : 96);
  t.top = test_below(r, t.resize_h - t.out_h + 1);
  t.left = test_below(r, t.resize_w - t.out_w + 1);
  t.interp = test_below(r, 2) ? INTERP_BICUBIC : INTERP_BILINEAR;
  t.hflip = test_below(r, 2);
  return t;
}

// The packed batch of plans[0..n) over sources at byte src[k]: packed buffer and sizes.
typedef struct {
  void *packed;
  ResizeBatch batch;
} TestPacked;

static inline TestPacked test_pack(const TransformPlan *plans, int n, int chans,
                                   const int64_t *src) {
  TestPacked p;
  p.packed = malloc_check((size_t)transform_plans_packed_bytes(plans, n));
  transform_plans_pack(plans, n, chans, src, NULL, p.packed, &p.batch);
  return p;
}

static inline const ResizeDesc *test_desc(const TestPacked *p, int k) {
  return (const ResizeDesc *)p->packed + k;
}

// Bytes where got and want differ, of n.
static inline int64_t test_bytes_differ(const uint8_t *got, const uint8_t *want, int64_t n) {
  int64_t d = 0;
  for (int64_t i = 0; i < n; i++) d += got[i] != want[i];
  return d;
}

static inline const char *test_plan_kind(int kind) {
  static const char *names[TEST_PLAN_KINDS] = {"train", "eval", "copy-sized", "arbitrary"};
  return names[kind];
}
