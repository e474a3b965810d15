// image_aug.c: the plain form of the batched augmentation steps (kernels/image_aug.h): each image
// through its steps, with the per-pixel code, histograms and tables the CUDA kernels use. The
// product's CPU path runs steps with image_apply_step (data/image_ops.h); this form checks,
// without a GPU, that the ported per-pixel code gives the CPU path's bytes
// (tests/test_image_aug.c), and is the reference of the GPU test.
#include "kernels/image_aug.h"

#include <string.h>

// A HISTOGRAM step on img (h, w, chans) in place.
static void histogram_step(const ImageAugStep *s, uint8_t *img, int h, int w, int chans) {
  int64_t pixels = (int64_t)h * w;
  uint32_t hist[4][256];
  memset(hist, 0, sizeof hist);
  if (s->op == IMAGE_AUG_CONTRAST) {
    for (int64_t p = 0; p < pixels; p++) hist[0][image_aug_contrast_bin(img + p * chans, chans)]++;
    uint8_t mean = (uint8_t)image_aug_contrast_mean(hist[0], pixels);
    float alpha = (float)s->factor;
    for (int64_t i = 0; i < pixels * chans; i++) img[i] = image_aug_blend(img[i], mean, alpha);
    return;
  }
  uint8_t lut[4][256];
  for (int64_t p = 0; p < pixels; p++)
    for (int c = 0; c < chans; c++) hist[c][img[p * chans + c]]++;
  for (int c = 0; c < chans; c++) {
    if (s->op == IMAGE_AUG_AUTOCONTRAST)
      image_aug_autocontrast_lut(hist[c], lut[c]);
    else
      image_aug_equalize_lut(hist[c], lut[c]);
  }
  for (int64_t p = 0; p < pixels; p++)
    for (int c = 0; c < chans; c++) img[p * chans + c] = lut[c][img[p * chans + c]];
}

static void image_step(const ImageAugStep *s, uint8_t *img, uint8_t *scratch, int h, int w,
                       int chans, const uint8_t *fill) {
  int64_t pixels = (int64_t)h * w;
  switch (image_aug_pass(s->op)) {
    case IMAGE_AUG_PASS_PIXEL:
      for (int64_t p = 0; p < pixels; p++) image_aug_pixel(s, chans, img + p * chans);
      return;
    case IMAGE_AUG_PASS_HISTOGRAM:
      histogram_step(s, img, h, w, chans);
      return;
    case IMAGE_AUG_PASS_COPY:
      memcpy(scratch, img, (size_t)(pixels * chans));
      for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
          image_aug_copy_pixel(s, scratch, h, w, chans, fill, y, x,
                               img + ((int64_t)y * w + x) * chans);
      return;
    default:
      return;
  }
}

void image_aug_batch_cpu(uint8_t *images, uint8_t *scratch, const ImageAugStep *steps, int count,
                         int nsteps, int h, int w, int chans, const uint8_t *fill) {
  int64_t bytes = (int64_t)h * w * chans;
  // Images are independent: each runs all its steps (the GPU runs step s of every image first;
  // the order between images does not matter).
#pragma omp parallel for schedule(dynamic)
  for (int i = 0; i < count; i++)
    for (int s = 0; s < nsteps; s++)
      image_step(&steps[(int64_t)i * nsteps + s], images + i * bytes, scratch + i * bytes, h, w,
                 chans, fill);
}
