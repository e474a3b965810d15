// augment.c: CPU reference of the per-batch augmentations (kernels/augment.h): random erasing
// with a per-element normal fill, then mixup or cutmix of sample b with sample B-1-b.
#include "kernels/augment.h"

#include <stddef.h>

static void erase_sample(float *img, const EraseBox *box, int W, int C) {
  for (int y = box->top; y < box->top + box->h; y++) {
    for (int x = box->left; x < box->left + box->w; x++) {
      uint64_t i = ((uint64_t)y * W + x) * C;
      for (int c = 0; c < C; c++) img[i + c] = rng_normal_at(&box->fill, i + c);
    }
  }
}

// Mixup of one pair, both written from the old values of both.
static void mixup_pair(float *a, float *b, int64_t n, double lam) {
  float keep = (float)lam, take = (float)(1.0 - lam);
  for (int64_t i = 0; i < n; i++) {
    float pa = a[i] * keep, pb = b[i] * keep;
    float qa = a[i] * take, qb = b[i] * take;
    a[i] = pa + qb;
    b[i] = pb + qa;
  }
}

// Cutmix of one pair: the box's pixels are swapped.
static void cutmix_pair(float *a, float *b, const MixParams *m, int W, int C) {
  for (int y = m->top; y < m->top + m->h; y++) {
    size_t row = ((size_t)y * W + m->left) * C;
    for (size_t i = row; i < row + (size_t)m->w * C; i++) {
      float t = a[i];
      a[i] = b[i];
      b[i] = t;
    }
  }
}

void batch_augment_cpu(float *images, const BatchAugment *p, int B, int H, int W, int C) {
  int64_t n = (int64_t)H * W * C;
  if (p->erase) {
#pragma omp parallel for schedule(static)
    for (int b = 0; b < B; b++) {
      if (p->erase[b].h > 0 && p->erase[b].w > 0) erase_sample(images + b * n, &p->erase[b], W, C);
    }
  }
  if (p->mix.mode == MIX_NONE) return;
#pragma omp parallel for schedule(static)
  for (int b = 0; b < B / 2; b++) {
    float *x = images + b * n, *y = images + (int64_t)(B - 1 - b) * n;
    if (p->mix.mode == MIX_MIXUP)
      mixup_pair(x, y, n, p->mix.lam);
    else
      cutmix_pair(x, y, &p->mix, W, C);
  }
}
