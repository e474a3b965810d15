// resize.h: a batch of Pillow-exact resizes of uint8 HWC images (1 or 3 channels), each of a
// source box to one output window, optionally mirrored: the loader's crop + resize + flip on the
// GPU, right after nvJPEG decodes a batch (data/jpeg_gpu.h).
//
// The spec is image_resize (data/image_ops.h), which follows Pillow's Resample.c: separable
// fixed-point filters, the horizontal pass first over only the source rows the vertical taps
// read, each result rounded and clipped to uint8, then the vertical pass from those rows. The
// integer weights here are image_resize_taps' (the same host code computes them for both), and
// the sums are exact int32 sums, so summing in another order (a thread per output pixel here, a
// row of sums at a time in image_resize) gives the same bytes. transform_hflip mirrors the
// result; here each output row is stored mirrored.
//
// One batch is one packed buffer: `count` ResizeDesc, then their tap tables (int32): for each
// image an x table and a y table, each first (n), count (n) and weights (n * ksize: output o
// reads count[o] pixels from first[o] with weights k[o * ksize ..]); n = out_w and out_h. The
// first indices are relative to the box. data/transform.h (transform_plans_pack) writes it from
// the transform plans. resize_batch_cpu is the plain form of the kernels, with the same
// per-pixel code (SWIN_HOSTDEV below); it checks the packing where no GPU is (tests/test_resize.c).
#pragma once
#include <stdint.h>
#ifdef SWIN_HAVE_CUDA
#include <cuda_runtime.h>  // outside the extern "C" block: it declares C++ templates
#endif

#include "src/base/hostdev.h"

#ifdef __cplusplus
extern "C" {
#endif

// Pillow's PRECISION_BITS: weights are fixed point with this many fraction bits, which leaves
// 8 bits for the pixel value and 2 for the sum's headroom in an int32.
#define RESIZE_PRECISION_BITS (32 - 8 - 2)

// One image of a batch. Byte offsets into the batch's source, intermediate and output buffers;
// tap offsets in int32 elements from the start of the tap tables.
typedef struct {
  int64_t src;        // the box's top-left pixel
  int64_t src_pitch;  // bytes per source row
  int64_t tmp;        // the horizontal pass's rows: (rows, out_w, chans)
  int64_t dst;        // the output (out_h, out_w, chans)
  int64_t taps_x, taps_y;
  int32_t ksize_x, ksize_y;
  int32_t row0, rows;    // the box rows the vertical taps read: [row0, row0 + rows)
  int32_t out_h, out_w;  // the output window
  int32_t hflip;         // store each output row mirrored
  int32_t unused;        // keeps the size a multiple of 8, so the tap tables stay aligned
} ResizeDesc;

// What a launch needs besides the packed buffer.
typedef struct {
  int count, chans;
  int64_t packed_bytes;                    // descriptors and tap tables
  int64_t tmp_bytes, dst_bytes;            // every image's intermediate rows / outputs
  int64_t max_tmp_pixels, max_dst_pixels;  // the most of one image (rows * out_w, out_h * out_w)
} ResizeBatch;

// Pillow's clip8: the fixed-point sum (rounding offset included) to a byte; an arithmetic shift
// floors, as Pillow's lookup does.
static inline SWIN_HOSTDEV uint8_t resize_clip(int32_t ss) {
  int32_t v = ss >> RESIZE_PRECISION_BITS;
  return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

// The tap tables of a packed batch of `count` images.
static inline SWIN_HOSTDEV const int32_t *resize_tables(const void *packed, int count) {
  return (const int32_t *)((const ResizeDesc *)packed + count);
}

// Horizontal pass, one intermediate pixel: row r of [0, rows), column x of [0, out_w), chans
// channels (at most 4).
static inline SWIN_HOSTDEV void resize_h_pixel(const uint8_t *src, const ResizeDesc *d,
                                               const int32_t *tables, int chans, int r, int x,
                                               uint8_t *tmp) {
  const int32_t *first = tables + d->taps_x, *count = first + d->out_w;
  const int32_t *k = count + d->out_w + (int64_t)x * d->ksize_x;
  const uint8_t *p =
      src + d->src + (int64_t)(d->row0 + r) * d->src_pitch + (int64_t)first[x] * chans;
  int32_t ss[4] = {0, 0, 0, 0};
  for (int j = 0; j < count[x]; j++)
    for (int c = 0; c < chans; c++) ss[c] += p[j * chans + c] * k[j];
  uint8_t *t = tmp + d->tmp + ((int64_t)r * d->out_w + x) * chans;
  for (int c = 0; c < chans; c++) t[c] = resize_clip(ss[c] + (1 << (RESIZE_PRECISION_BITS - 1)));
}

// Vertical pass, one output pixel: row y of [0, out_h), column x of [0, out_w), stored at column
// out_w - 1 - x when mirrored.
static inline SWIN_HOSTDEV void resize_v_pixel(const uint8_t *tmp, const ResizeDesc *d,
                                               const int32_t *tables, int chans, int y, int x,
                                               uint8_t *dst) {
  const int32_t *first = tables + d->taps_y, *count = first + d->out_h;
  const int32_t *k = count + d->out_h + (int64_t)y * d->ksize_y;
  int64_t row = (int64_t)d->out_w * chans;
  const uint8_t *t = tmp + d->tmp + (int64_t)(first[y] - d->row0) * row + (int64_t)x * chans;
  int32_t ss[4] = {0, 0, 0, 0};
  for (int j = 0; j < count[y]; j++)
    for (int c = 0; c < chans; c++) ss[c] += t[j * row + c] * k[j];
  int xo = d->hflip ? d->out_w - 1 - x : x;
  uint8_t *o = dst + d->dst + (int64_t)y * row + (int64_t)xo * chans;
  for (int c = 0; c < chans; c++) o[c] = resize_clip(ss[c] + (1 << (RESIZE_PRECISION_BITS - 1)));
}

// src: the batch's source images; packed: its descriptors and tap tables (b->packed_bytes);
// tmp (b->tmp_bytes) and dst (b->dst_bytes) are written. Every buffer is host memory.
void resize_batch_cpu(const uint8_t *src, const void *packed, const ResizeBatch *b, uint8_t *tmp,
                      uint8_t *dst);

#ifdef SWIN_HAVE_CUDA
// The same on `stream`, every buffer device memory: two launches (horizontal, vertical) over all
// images, a grid row per image. Returns the launch error (cudaSuccess when both launched), for
// the caller to report: the loader's decoder returns errors rather than aborting.
cudaError_t resize_batch_cuda(const uint8_t *src, const void *packed, const ResizeBatch *b,
                              uint8_t *tmp, uint8_t *dst, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
