// resize.c: the plain form of the batched resize (kernels/resize.h): every image's horizontal
// pass, then its vertical pass, with the per-pixel code the CUDA kernels run. The product's CPU
// path resizes with image_resize (data/image_ops.h); this form checks, without a GPU, that a
// packed batch describes the same resizes (tests/test_resize.c).
#include "kernels/resize.h"

void resize_batch_cpu(const uint8_t *src, const void *packed, const ResizeBatch *b, uint8_t *tmp,
                      uint8_t *dst) {
  const ResizeDesc *desc = packed;
  const int32_t *tables = resize_tables(packed, b->count);
  for (int i = 0; i < b->count; i++) {
    const ResizeDesc *d = &desc[i];
    for (int r = 0; r < d->rows; r++)
      for (int x = 0; x < d->out_w; x++) resize_h_pixel(src, d, tables, b->chans, r, x, tmp);
    for (int y = 0; y < d->out_h; y++)
      for (int x = 0; x < d->out_w; x++) resize_v_pixel(tmp, d, tables, b->chans, y, x, dst);
  }
}
