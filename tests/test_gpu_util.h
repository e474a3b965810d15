// test_gpu_util.h: what the GPU tests share on top of test_util.h. A GPU test compares a CUDA
// kernel with its CPU reference (the spec) on the same fresh random inputs, with device outputs
// poisoned (all bits set: NaN) before the launch so an unwritten element fails.
//
// Without the CUDA backend in the build, or without a device at run time, a GPU test prints a
// SKIP line and exits 77 (ctest shows it as skipped).
#pragma once
#include "tests/test_util.h"

#ifdef SWIN_HAVE_CUDA
#include "src/cuda_util.h"

static inline void gpu_test_require_device(void) {
  if (!cuda_device_available()) {
    printf("SKIP: no CUDA device\n");
    exit(77);
  }
}

static inline void *gpu_alloc(size_t bytes) {
  void *p = NULL;
  CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 4));
  return p;
}
// Device copy of n host floats.
static inline float *gpu_upload(const float *host, int64_t n) {
  float *d = (float *)gpu_alloc(sizeof(float) * (size_t)n);
  CUDA_CHECK(cudaMemcpy(d, host, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice));
  return d;
}
static inline void *gpu_upload_bytes(const void *host, size_t bytes) {
  void *d = gpu_alloc(bytes);
  CUDA_CHECK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
  return d;
}
// Host copy of n device floats (synchronizes).
static inline void gpu_download(float *host, const float *dev, int64_t n) {
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemcpy(host, dev, sizeof(float) * (size_t)n, cudaMemcpyDeviceToHost));
}
// All bits set: a NaN in every float.
static inline void gpu_poison(float *dev, int64_t n) {
  CUDA_CHECK(cudaMemset(dev, 0xFF, sizeof(float) * (size_t)n));
}
#define GPU_TEST_MAIN_BEGIN() gpu_test_require_device()
#else
#define GPU_TEST_MAIN_BEGIN()                               \
  do {                                                      \
    printf("SKIP: built without the CUDA backend\n");       \
    return 77;                                              \
  } while (0)
#endif
