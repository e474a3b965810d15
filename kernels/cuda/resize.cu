// resize.cu: the batched Pillow-exact resize on the GPU (kernels/resize.h).
//
// Two launches over the whole batch: the horizontal pass writes every image's intermediate rows,
// then the vertical pass reads them (the second launch is the barrier between the passes).
// Grid: (blocks over one image's pixels, images); a thread takes one pixel with all its
// channels (the channel count a template constant, so the per-pixel loops unroll), striding
// over its image, whose pixel count may be smaller or larger than the grid row. Neighbouring
// threads take neighbouring columns, so the intermediate and output rows are read and written
// contiguously; the tap tables are small and stay in cache.
#include "kernels/resize.h"

namespace {

constexpr int kResizeThreads = 256;
// Blocks per image: enough to fill the GPU with a batch of a few images; larger images stride.
constexpr int64_t kResizeMaxBlocks = 64;
constexpr int kMaxGridY = 65535;

template <int C>
__global__ void resize_h_kernel(const uint8_t *__restrict__ src, const void *__restrict__ packed,
                                int count, uint8_t *__restrict__ tmp) {
  const ResizeDesc *desc = static_cast<const ResizeDesc *>(packed);
  const int32_t *tables = resize_tables(packed, count);
  for (int i = blockIdx.y; i < count; i += gridDim.y) {
    ResizeDesc d = desc[i];
    int64_t n = (int64_t)d.rows * d.out_w;
    for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < n;
         p += (int64_t)gridDim.x * blockDim.x)
      resize_h_pixel(src, &d, tables, C, (int)(p / d.out_w), (int)(p % d.out_w), tmp);
  }
}

template <int C>
__global__ void resize_v_kernel(const uint8_t *__restrict__ tmp, const void *__restrict__ packed,
                                int count, uint8_t *__restrict__ dst) {
  const ResizeDesc *desc = static_cast<const ResizeDesc *>(packed);
  const int32_t *tables = resize_tables(packed, count);
  for (int i = blockIdx.y; i < count; i += gridDim.y) {
    ResizeDesc d = desc[i];
    int64_t n = (int64_t)d.out_h * d.out_w;
    for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < n;
         p += (int64_t)gridDim.x * blockDim.x)
      resize_v_pixel(tmp, &d, tables, C, (int)(p / d.out_w), (int)(p % d.out_w), dst);
  }
}

dim3 resize_grid(int64_t max_pixels, int count) {
  int64_t blocks = (max_pixels + kResizeThreads - 1) / kResizeThreads;
  if (blocks > kResizeMaxBlocks) blocks = kResizeMaxBlocks;
  if (blocks < 1) blocks = 1;
  return dim3((unsigned)blocks, (unsigned)(count < kMaxGridY ? count : kMaxGridY));
}

template <int C>
cudaError_t launch(const uint8_t *src, const void *packed, const ResizeBatch *b, uint8_t *tmp,
                   uint8_t *dst, cudaStream_t stream) {
  resize_h_kernel<C><<<resize_grid(b->max_tmp_pixels, b->count), kResizeThreads, 0, stream>>>(
      src, packed, b->count, tmp);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  resize_v_kernel<C><<<resize_grid(b->max_dst_pixels, b->count), kResizeThreads, 0, stream>>>(
      tmp, packed, b->count, dst);
  return cudaGetLastError();
}

}  // namespace

cudaError_t resize_batch_cuda(const uint8_t *src, const void *packed, const ResizeBatch *b,
                              uint8_t *tmp, uint8_t *dst, cudaStream_t stream) {
  if (b->count <= 0) return cudaSuccess;
  // The loader decodes to gray or RGB (data/jpeg_gpu.h); other counts are not built.
  if (b->chans == 1) return launch<1>(src, packed, b, tmp, dst, stream);
  if (b->chans == 3) return launch<3>(src, packed, b, tmp, dst, stream);
  return cudaErrorInvalidValue;
}
