// bench_common.cuh: what the GPU benchmark programs of scripts/ share (bench_gemm.cu,
// bench_cudnn.cu): the median of timed launches, and a rate in TB/s.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>

#include "src/base/cuda_util.h"

namespace bench {

constexpr int kWarmups = 3, kRepeats = 20;

// Median microseconds of run() on stream: kRepeats launches, each between its own pair of
// events, after kWarmups untimed ones.
template <typename F>
double median_us(cudaStream_t stream, F run) {
  for (int i = 0; i < kWarmups; i++) run();
  cudaEvent_t start[kRepeats], stop[kRepeats];
  for (int i = 0; i < kRepeats; i++) {
    CUDA_CHECK(cudaEventCreate(&start[i]));
    CUDA_CHECK(cudaEventCreate(&stop[i]));
  }
  for (int i = 0; i < kRepeats; i++) {
    CUDA_CHECK(cudaEventRecord(start[i], stream));
    run();
    CUDA_CHECK(cudaEventRecord(stop[i], stream));
  }
  CUDA_CHECK(cudaStreamSynchronize(stream));
  double us[kRepeats];
  for (int i = 0; i < kRepeats; i++) {
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start[i], stop[i]));
    us[i] = 1e3 * ms;
    CUDA_CHECK(cudaEventDestroy(start[i]));
    CUDA_CHECK(cudaEventDestroy(stop[i]));
  }
  std::sort(us, us + kRepeats);
  return 0.5 * (us[kRepeats / 2 - 1] + us[kRepeats / 2]);
}

inline double tb_per_s(double bytes, double us) {
  return bytes / (us * 1e-6) / 1e12;
}

}  // namespace bench
