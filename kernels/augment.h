// augment.h: the per-batch augmentations of the training recipe, applied to the normalized float
// batch images (B, H, W, C) in place: random erasing, then mixup or cutmix (timm's RandomErasing
// in 'pixel' mode and Mixup in 'batch' mode).
//
// Random erasing: sample b with a box (erase[b].h > 0) gets every element of the box replaced by
// a standard normal (normalized space, so N(0, 1) is noise at the data's own scale). The normal
// for element i = (y * W + x) * C + c is rng_normal_at(erase[b].fill, i) (src/base/rng.h): a pure
// function of the sample's fill key and the element index, identical on the CPU and the GPU.
//
// Mixup / cutmix pair sample b with sample B-1-b (timm's x.flip(0)); B must be even.
//   mixup:  out[b] = x[b] * lam + x[B-1-b] * (1 - lam), each product rounded to fp32, then the
//           sum (the rounding of PyTorch's x.mul_(lam).add_(x.flip(0).mul_(1 - lam))), with
//           lam and 1 - lam computed in double and rounded to fp32 once;
//   cutmix: out[b][y][x] = x[B-1-b][y][x] inside the box [top, top+h) x [left, left+w),
//           untouched outside.
// Erasing happens first, so a pair mixes the erased images (timm erases in the loader and mixes
// in the training step).
//
// Parameters are drawn on the host (data/batch_augment.h) and passed here; the CPU and CUDA
// forms give bitwise identical results.
#pragma once
#include <stdint.h>
#ifdef SWIN_HAVE_CUDA
#include <cuda_runtime.h>  // outside the extern "C" block: it declares C++ templates
#endif

#include "src/base/rng.h"

#ifdef __cplusplus
extern "C" {
#endif

// One sample's erase box, in pixels; h == 0 (or w == 0) leaves the sample alone.
typedef struct {
  int32_t top, left, h, w;
  Rng fill;  // key of the sample's normal fill (only its seed, stream, a and b are used)
} EraseBox;

typedef enum { MIX_NONE = 0, MIX_MIXUP = 1, MIX_CUTMIX = 2 } MixMode;

typedef struct {
  MixMode mode;
  double lam;               // weight of a sample itself (cutmix: 1 - box area / image area)
  int32_t top, left, h, w;  // cutmix box in pixels
} MixParams;

typedef struct {
  const EraseBox *erase;  // (B) host boxes, or NULL: no erasing in this batch
  MixParams mix;
} BatchAugment;

// images (B, H, W, C), normalized, augmented in place.
void batch_augment_cpu(float *images, const BatchAugment *p, int B, int H, int W, int C);

#ifdef SWIN_HAVE_CUDA
// CUDA form: images (B, H, W, C) on the device; p->erase stays a host array, copied to
// d_boxes (room for B EraseBox, device memory the caller owns) on `stream` before the launch.
// One pass over the batch: each thread reads an element of samples b and B-1-b, erases and
// mixes both and writes both, so nothing is read after it was overwritten.
void batch_augment_cuda(float *images, const BatchAugment *p, EraseBox *d_boxes, int B, int H,
                        int W, int C, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
