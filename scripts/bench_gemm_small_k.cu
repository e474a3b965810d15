// bench_gemm_small_k.cu: the small-K GEMM (kernels/cuda/gemm_small_k.cu, kernels/PERF.md)
// timed against cuBLASLt on Swin-T's stage 0 and 1 linear layers at batch 128, bf16:
//   (a) cuBLASLt linear_forward_cuda (bias in its epilogue; the model's path in stage 1);
//   (b) linear_small_k_forward_cuda with post = NULL (the model's path in stage 0);
//   and for the MLP's first layer (fc1) also
//   (c) cuBLASLt + gelu_forward_cuda (the model's path in stage 1);
//   (d) linear_small_k_forward_cuda with post (the fused GELU: the model's path in stage 0).
// Each time is the median of 20 launches, each between its own pair of events, after 3 warm-ups.
// TB/s counts the bytes a layer must move, 2 N IC + 2 N OC (x 2 with post), for every variant:
// (c) moves 2 N OC x 2 more than that (the GELU pass reads pre back), so its figure is the
// useful rate, comparable with (d)'s.
//
// Build: cmake --build build-gpu (target bench_gemm_small_k, CUDA builds only). Run:
//   build-gpu/bench_gemm_small_k
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kernels/gelu.h"
#include "kernels/gemm.h"
#include "src/base/cuda_util.h"

namespace {

constexpr int kWarmups = 3, kRepeats = 20;

struct Shape {
  const char *name;
  int64_t N;
  int IC, OC;
  bool fc1;  // the MLP's first layer: GELU follows
};

// Swin-T at batch 128: stage 0 (56 x 56 tokens, C = 96), stage 1 (28 x 28, C = 192).
const Shape kShapes[] = {
    {"s0 qkv", 401408, 96, 288, false},   {"s0 proj", 401408, 96, 96, false},
    {"s0 fc1", 401408, 96, 384, true},    {"s1 qkv", 100352, 192, 576, false},
    {"s1 proj", 100352, 192, 192, false}, {"s1 fc1", 100352, 192, 768, true},
};

// x (n) uniform in [-scale, scale) from a hash of the index and seed.
__global__ void fill_kernel(__nv_bfloat16 *x, int64_t n, uint32_t seed, float scale) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 0x9E3779B1u ^ seed;
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    x[i] = __float2bfloat16_rn(scale * ((float)(h >> 8) * (2.0f / 16777216.0f) - 1.0f));
  }
}

__nv_bfloat16 *random_bf16(int64_t n, uint32_t seed, float scale, cudaStream_t stream) {
  __nv_bfloat16 *d = nullptr;
  CUDA_CHECK(cudaMalloc(&d, sizeof(__nv_bfloat16) * (size_t)n));
  fill_kernel<<<1024, 256, 0, stream>>>(d, n, seed, scale);
  CUDA_CHECK_LAUNCH();
  return d;
}

// Median microseconds of run() on stream.
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

// The bytes a layer must move: inp, pre, and post when it is written.
double layer_bytes(const Shape &s, bool post) {
  return 2.0 * (double)s.N * s.IC + 2.0 * (double)s.N * s.OC * (post ? 2 : 1);
}

double tb_per_s(double bytes, double us) {
  return bytes / (us * 1e-6) / 1e12;
}

}  // namespace

int main() {
  if (!cuda_device_available()) {
    fprintf(stderr, "bench_gemm_small_k: no CUDA device\n");
    return 1;
  }
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  GemmContext *g = gemm_context_create(stream);
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  printf(
      "bf16 linear layers, Swin-T batch 128, %s; us = median of %d; TB/s = (2 N IC + 2 N OC "
      "[x2 with GELU]) / time\n",
      prop.name, kRepeats);
  printf("%-8s %7s %4s %4s | %9s %5s | %9s %5s | %6s | %9s %5s | %9s %5s | %6s\n", "shape", "N",
         "IC", "OC", "cuBLASLt", "TB/s", "ours", "TB/s", "ratio", "cuBL+GELU", "TB/s", "fused",
         "TB/s", "ratio");
  for (const Shape &s : kShapes) {
    if (!linear_small_k_supported(s.IC, s.OC)) {
      fprintf(stderr, "bench_gemm_small_k: %s (IC %d, OC %d) not supported\n", s.name, s.IC, s.OC);
      return 1;
    }
    const int64_t nout = s.N * s.OC;
    __nv_bfloat16 *inp = random_bf16(s.N * s.IC, 1, 1.0f, stream);
    __nv_bfloat16 *weight = random_bf16((int64_t)s.OC * s.IC, 2, 0.1f, stream);
    __nv_bfloat16 *bias = random_bf16(s.OC, 3, 0.5f, stream);
    __nv_bfloat16 *pre = nullptr, *post = nullptr;
    CUDA_CHECK(cudaMalloc(&pre, sizeof(__nv_bfloat16) * (size_t)nout));
    CUDA_CHECK(cudaMalloc(&post, sizeof(__nv_bfloat16) * (size_t)nout));

    const double a = median_us(stream, [&] {
      linear_forward_cuda(g, DTYPE_BF16, pre, inp, weight, bias, s.N, s.IC, s.OC);
    });
    const double b = median_us(stream, [&] {
      linear_small_k_forward_cuda(pre, nullptr, inp, weight, bias, s.N, s.IC, s.OC, stream);
    });
    const double plain = layer_bytes(s, false), fused = layer_bytes(s, true);
    printf("%-8s %7lld %4d %4d | %9.1f %5.2f | %9.1f %5.2f | %6.3f |", s.name, (long long)s.N, s.IC,
           s.OC, a, tb_per_s(plain, a), b, tb_per_s(plain, b), b / a);
    if (s.fc1) {
      const double c = median_us(stream, [&] {
        linear_forward_cuda(g, DTYPE_BF16, pre, inp, weight, bias, s.N, s.IC, s.OC);
        gelu_forward_cuda(DTYPE_BF16, post, pre, nout, stream);
      });
      const double d = median_us(stream, [&] {
        linear_small_k_forward_cuda(pre, post, inp, weight, bias, s.N, s.IC, s.OC, stream);
      });
      printf(" %9.1f %5.2f | %9.1f %5.2f | %6.3f\n", c, tb_per_s(fused, c), d, tb_per_s(fused, d),
             d / c);
    } else {
      printf(" %9s %5s | %9s %5s | %6s\n", "-", "-", "-", "-", "-");
    }
    __nv_bfloat16 *bufs[] = {inp, weight, bias, pre, post};
    for (__nv_bfloat16 *p : bufs) CUDA_CHECK(cudaFree(p));
  }
  gemm_context_destroy(g);
  CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}
