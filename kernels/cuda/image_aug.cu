// image_aug.cu: the batched augmentation steps on the GPU (kernels/image_aug.h).
//
// Per step index, two launches over the whole batch, each a grid of (blocks over one image's
// pixels, images) whose blocks read their image's step and do what it needs:
//   1. PIXEL ops in place, a thread per pixel with all its channels (the channel count a template
//      constant, so the per-pixel loops unroll); HISTOGRAM ops by the image's first block alone:
//      the histogram in shared memory with integer atomics (exact, so the order of the adds does
//      not matter), the tables by one thread per channel with the functions the CPU form uses,
//      then the table applied; COPY ops copy the image to scratch (16-byte vectors where the
//      image's size allows).
//   2. COPY ops write each output pixel from scratch back into the image; other images' blocks
//      return at once.
// Neighbouring threads take neighbouring pixels, so rows are read and written contiguously; the
// affine ops' taps fall near each other and stay in cache.
//
// Exactness: this file is compiled with --fmad=false (CMakeLists.txt), so no multiply and add
// of the shared per-pixel code is fused into an FMA: each is rounded alone, as the CPU computes
// it under -ffp-contract=off. Division is IEEE-rounded by default (no fast math here).
#include "kernels/image_aug.h"

namespace {

constexpr int kImageAugThreads = 512;
// Blocks per image: enough to fill the GPU with a batch of a few images; larger images stride.
constexpr int64_t kImageAugMaxBlocks = 64;
constexpr int kMaxGridY = 65535;

// A HISTOGRAM step on one image by the whole block; hist (C * 256) and lut (C * 256) are the
// block's shared memory. The branch a block takes depends only on its image, so every thread of
// the block reaches every barrier.
template <int C>
__device__ void histogram_step(const ImageAugStep &s, uint8_t *img, int64_t pixels, uint32_t *hist,
                               uint8_t *lut, int *mean) {
  for (int k = threadIdx.x; k < C * 256; k += blockDim.x) hist[k] = 0;
  __syncthreads();
  bool contrast = s.op == IMAGE_AUG_CONTRAST;
  for (int64_t p = threadIdx.x; p < pixels; p += blockDim.x) {
    const uint8_t *px = img + p * C;
    if (contrast) {
      atomicAdd(&hist[image_aug_contrast_bin(px, C)], 1u);
    } else {
#pragma unroll
      for (int c = 0; c < C; c++) atomicAdd(&hist[c * 256 + px[c]], 1u);
    }
  }
  __syncthreads();
  if (contrast && threadIdx.x == 0) *mean = image_aug_contrast_mean(hist, pixels);
  if (!contrast && threadIdx.x < C) {
    if (s.op == IMAGE_AUG_AUTOCONTRAST)
      image_aug_autocontrast_lut(hist + threadIdx.x * 256, lut + threadIdx.x * 256);
    else
      image_aug_equalize_lut(hist + threadIdx.x * 256, lut + threadIdx.x * 256);
  }
  __syncthreads();
  if (contrast) {
    uint8_t degenerate = (uint8_t)*mean;
    float alpha = (float)s.factor;
    for (int64_t i = threadIdx.x; i < pixels * C; i += blockDim.x)
      img[i] = image_aug_blend(img[i], degenerate, alpha);
  } else {
    for (int64_t p = threadIdx.x; p < pixels; p += blockDim.x) {
      uint8_t *px = img + p * C;
#pragma unroll
      for (int c = 0; c < C; c++) px[c] = lut[c * 256 + px[c]];
    }
  }
  __syncthreads();  // the shared tables are free for the block's next image
}

// Copies one image's bytes to scratch, the grid row's blocks striding over it.
__device__ void copy_image(const uint8_t *__restrict__ src, uint8_t *__restrict__ dst,
                           int64_t bytes) {
  int64_t start = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  if (bytes % 16 == 0 && ((uintptr_t)src & 15) == 0 && ((uintptr_t)dst & 15) == 0) {
    const uint4 *s = reinterpret_cast<const uint4 *>(src);
    uint4 *d = reinterpret_cast<uint4 *>(dst);
    for (int64_t k = start; k < bytes / 16; k += stride) d[k] = s[k];
  } else {
    for (int64_t k = start; k < bytes; k += stride) dst[k] = src[k];
  }
}

template <int C>
__global__ void __launch_bounds__(kImageAugThreads)
    image_aug_step_kernel(uint8_t *__restrict__ images, uint8_t *__restrict__ scratch,
                          const ImageAugStep *__restrict__ steps, int count, int nsteps, int step,
                          int h, int w) {
  __shared__ uint32_t hist[C * 256];
  __shared__ uint8_t lut[C * 256];
  __shared__ int mean;
  int64_t pixels = (int64_t)h * w, bytes = pixels * C;
  for (int i = blockIdx.y; i < count; i += gridDim.y) {
    const ImageAugStep s = steps[(int64_t)i * nsteps + step];
    uint8_t *img = images + i * bytes;
    ImageAugPass pass = image_aug_pass(s.op);
    if (pass == IMAGE_AUG_PASS_PIXEL) {
      for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < pixels;
           p += (int64_t)gridDim.x * blockDim.x)
        image_aug_pixel(&s, C, img + p * C);
    } else if (pass == IMAGE_AUG_PASS_COPY) {
      copy_image(img, scratch + i * bytes, bytes);
    } else if (pass == IMAGE_AUG_PASS_HISTOGRAM && blockIdx.x == 0) {
      histogram_step<C>(s, img, pixels, hist, lut, &mean);
    }
  }
}

template <int C>
__global__ void __launch_bounds__(kImageAugThreads)
    image_aug_copy_kernel(uint8_t *__restrict__ images, const uint8_t *__restrict__ scratch,
                          const ImageAugStep *__restrict__ steps, int count, int nsteps, int step,
                          int h, int w, ImageAugFill fill) {
  int64_t pixels = (int64_t)h * w, bytes = pixels * C;
  uint8_t outside[C];
#pragma unroll
  for (int c = 0; c < C; c++) outside[c] = fill.v[c];
  for (int i = blockIdx.y; i < count; i += gridDim.y) {
    const ImageAugStep s = steps[(int64_t)i * nsteps + step];
    if (image_aug_pass(s.op) != IMAGE_AUG_PASS_COPY) continue;
    const uint8_t *src = scratch + i * bytes;
    uint8_t *img = images + i * bytes;
    for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < pixels;
         p += (int64_t)gridDim.x * blockDim.x)
      image_aug_copy_pixel(&s, src, h, w, C, outside, (int)(p / w), (int)(p % w), img + p * C);
  }
}

template <int C>
cudaError_t launch(uint8_t *images, uint8_t *scratch, const ImageAugStep *steps, int count,
                   int nsteps, int h, int w, ImageAugFill fill, cudaStream_t stream) {
  int64_t blocks = ((int64_t)h * w + kImageAugThreads - 1) / kImageAugThreads;
  if (blocks > kImageAugMaxBlocks) blocks = kImageAugMaxBlocks;
  dim3 grid((unsigned)blocks, (unsigned)(count < kMaxGridY ? count : kMaxGridY));
  for (int s = 0; s < nsteps; s++) {
    image_aug_step_kernel<C>
        <<<grid, kImageAugThreads, 0, stream>>>(images, scratch, steps, count, nsteps, s, h, w);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    image_aug_copy_kernel<C><<<grid, kImageAugThreads, 0, stream>>>(images, scratch, steps, count,
                                                                    nsteps, s, h, w, fill);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t image_aug_batch_cuda(uint8_t *images, uint8_t *scratch, const ImageAugStep *d_steps,
                                 int count, int nsteps, int h, int w, int chans, ImageAugFill fill,
                                 cudaStream_t stream) {
  if (count <= 0 || nsteps <= 0 || h <= 0 || w <= 0) return cudaSuccess;
  // The histograms count in uint32 (image_aug_equalize_lut's sums stay below 2^32).
  if ((int64_t)h * w >= ((int64_t)1 << 31)) return cudaErrorInvalidValue;
  // The loader's images are gray or RGB (data/jpeg_gpu.h); other counts are not built.
  if (chans == 1) return launch<1>(images, scratch, d_steps, count, nsteps, h, w, fill, stream);
  if (chans == 3) return launch<3>(images, scratch, d_steps, count, nsteps, h, w, fill, stream);
  return cudaErrorInvalidValue;
}
