// bench_gemm.cu: our own linear-layer kernels timed against cuBLASLt at batch 128, bf16
// (kernels/PERF.md). Five tables.
// 1. The small-K GEMM (kernels/cuda/gemm_small_k.cu) on Swin-T's stage 0 and 1 linear layers and
//   Swin-B's stage 0 (cuBLASLt's path there):
//   (a) cuBLASLt linear_forward_cuda (bias in its epilogue; the model's path in stage 1);
//   (b) linear_small_k_forward_cuda with post = NULL (the model's path in stage 0);
//   and for the MLP's first layer (fc1) also
//   (c) cuBLASLt + gelu_forward_cuda (the model's path in stage 1);
//   (d) linear_small_k_forward_cuda with post (the fused GELU: the model's path in stage 0).
//   TB/s counts the bytes a layer must move, 2 N IC + 2 N OC (x 2 with post), for every
//   variant: (c) moves 2 N OC x 2 more than that (the GELU pass reads pre back), so its figure
//   is the useful rate, comparable with (d)'s.
// 2. The Hopper GEMM (kernels/cuda/gemm_hopper.cu) on every forward linear layer of Swin-T and
//   Swin-B: cuBLASLt's heuristic choice (linear_forward_cuda, bias in its epilogue), cuBLASLt's
//   fastest of 16 (gemm_context_set_tuning), linear_hopper_forward_tile at each tile width and
//   linear_hopper_forward_cuda (the width it picks); TFLOP/s = 2 N IC OC / time; the largest
//   difference between ours and cuBLASLt's output relative to its largest magnitude, as a check
//   that both computed the same product; for fc1, tuned cuBLASLt + gelu_forward_cuda against
//   linear_hopper_forward_cuda with post (the GELU in its epilogue).
// 3. The MLP backward's first half (fc2's d(input), then the GELU pass: GELU(pre), dpre and fc1's
//   bias gradient) on every MLP of Swin-T and Swin-B: tuned cuBLASLt (linear_backward_cuda) +
//   gelu_recompute_backward_cuda against linear_hopper_dgelu_tile at each width and
//   linear_hopper_dgelu_cuda (the pass in the product's epilogue), in us; the
//   largest difference between the two dpre relative to its largest magnitude. Where it serves
//   (C <= 128) also fc2's weight gradient: linear_hopper_dgelu_tile (128) + tuned cuBLASLt's
//   dweight product (the model's path before version 22) against
//   linear_hopper_dgelu_dweight_cuda (the product inside the kernel).
// 4. The MLP forward on every MLP of Swin-T and Swin-B, the two routes of src/model/backend_cuda.cu
//   (cuda_mlp_forward): fc1 with its GELU fused (the small-K kernel for C = 96, else the Hopper
//   GEMM) + fc2 on cuBLASLt, against fc1 alone (small-K or cuBLASLt) + fc2 on
//   linear_hopper_gelu_forward_cuda (the GELU in its operand load); and fc2 alone both ways.
// 5. A block's proj + residual + LN2 in Swin-T's stage 0: cuBLASLt or the small-K layer followed
//   by residual_layernorm_forward_cuda (the model's path before version 24), and the residual
//   LayerNorm alone, against linear_small_k_residual_layernorm_cuda (one kernel); then fc2 + the
//   residual + the next LN1 in stages 0 and 1: linear_hopper_gelu_forward_tile followed by
//   residual_layernorm_forward_cuda (before version 25) against
//   linear_hopper_gelu_residual_layernorm_cuda.
// Each time is the median of 20 launches, each between its own pair of events, after 3 warm-ups.
//
// Build: cmake --build build-gpu (target bench_gemm, CUDA builds only). Run: build-gpu/bench_gemm
// [small_k] [hopper] [dgelu] [mlp] [resln] (all when none is named).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/gelu.h"
#include "kernels/gemm.h"
#include "kernels/layernorm.h"
#include "scripts/bench_common.cuh"
#include "src/base/cuda_util.h"

namespace {

using bench::kRepeats;
using bench::median_us;
using bench::tb_per_s;

struct Shape {
  const char *name;
  int64_t N;
  int IC, OC;
  bool fc1;  // the MLP's first layer: GELU follows
};

// Swin-T at batch 128: stage 0 (56 x 56 tokens, C = 96), stage 1 (28 x 28, C = 192); Swin-B's
// stage 0 (C = 128, "B").
const Shape kShapes[] = {
    {"s0 qkv", 401408, 96, 288, false},    {"s0 proj", 401408, 96, 96, false},
    {"s0 fc1", 401408, 96, 384, true},     {"s1 qkv", 100352, 192, 576, false},
    {"s1 proj", 100352, 192, 192, false},  {"s1 fc1", 100352, 192, 768, true},
    {"B s0 qkv", 401408, 128, 384, false}, {"B s0 proj", 401408, 128, 128, false},
    {"B s0 fc1", 401408, 128, 512, true},
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

// The bytes a layer must move: inp, pre, and post when it is written.
double layer_bytes(const Shape &s, bool post) {
  return 2.0 * (double)s.N * s.IC + 2.0 * (double)s.N * s.OC * (post ? 2 : 1);
}

// Table 1 (see the top of the file).
void small_k_table(GemmContext *g, cudaStream_t stream) {
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  printf(
      "bf16 linear layers, Swin-T (and Swin-B: B) batch 128, %s; us = median of %d; TB/s = "
      "(2 N IC + 2 N OC [x2 with GELU]) / time\n",
      prop.name, kRepeats);
  printf("%-9s %7s %4s %4s | %9s %5s | %9s %5s | %6s | %9s %5s | %9s %5s | %6s\n", "shape", "N",
         "IC", "OC", "cuBLASLt", "TB/s", "ours", "TB/s", "ratio", "cuBL+GELU", "TB/s", "fused",
         "TB/s", "ratio");
  for (const Shape &s : kShapes) {
    if (!linear_small_k_supported(s.IC, s.OC)) {
      fprintf(stderr, "bench_gemm: %s (IC %d, OC %d) not supported\n", s.name, s.IC, s.OC);
      exit(1);
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
    printf("%-9s %7lld %4d %4d | %9.1f %5.2f | %9.1f %5.2f | %6.3f |", s.name, (long long)s.N, s.IC,
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
}

// Swin-T's and Swin-B's forward linear layers at batch 128 (C = 96 or 128 in stage 0, doubling
// per stage; 3136 tokens an image in stage 0, a quarter per stage): qkv, proj, fc1, fc2, and
// the patch merging reduction 2 C -> C that starts stages 1-3.
struct Layer {
  char name[16];
  int64_t N;
  int IC, OC;
};

std::vector<Layer> forward_layers() {
  std::vector<Layer> v;
  for (int m = 0; m < 2; m++)
    for (int st = 0; st < 4; st++) {
      const int C = (m == 0 ? 96 : 128) << st;
      const int64_t N = 128LL * (3136 >> (2 * st));
      const struct {
        const char *kind;
        int IC, OC;
      } layers[] = {{"qkv", C, 3 * C},
                    {"proj", C, C},
                    {"fc1", C, 4 * C},
                    {"fc2", 4 * C, C},
                    {"merge", 2 * C, C}};
      for (const auto &l : layers) {
        if (st == 0 && l.kind[0] == 'm') continue;  // stage 0 starts with the patch embedding
        Layer x;
        snprintf(x.name, sizeof x.name, "%c%d %s", m == 0 ? 't' : 'b', st, l.kind);
        x.N = N, x.IC = l.IC, x.OC = l.OC;
        v.push_back(x);
      }
    }
  return v;
}

__global__ void max_diff_kernel(const __nv_bfloat16 *a, const __nv_bfloat16 *b, int64_t n,
                                float *out) {  // out[0] = max |a - b|, out[1] = max |b|
  float d = 0.0f, m = 0.0f;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float x = __bfloat162float(a[i]), y = __bfloat162float(b[i]);
    d = fmaxf(d, fabsf(x - y));
    m = fmaxf(m, fabsf(y));
  }
  atomicMax((int *)&out[0], __float_as_int(d));  // non-negative floats order as ints
  atomicMax((int *)&out[1], __float_as_int(m));
}

// Table 2 (see the top of the file).
void hopper_table(GemmContext *g, GemmContext *tuned, cudaStream_t stream) {
  if (!linear_hopper_supported(96, 288)) {
    printf(
        "linear_hopper: not served here (needs compute capability 9.0 and a build for sm_90a)\n");
    return;
  }
  static const int tiles[] = {96, 128, 192, 256};
  printf(
      "\nus (TFLOP/s); hopper NNN: the tile width NNN; default: the width the kernel picks; "
      "fc1 rows also: cuBLASLt + the GELU pass against the GELU in the epilogue\n");
  printf("%-9s %6s %5s %5s | %13s %13s | %6s %6s %6s %6s | %13s %6s | %8s | %7s %7s %6s\n", "layer",
         "N", "IC", "OC", "cuBLASLt", "tuned", "h96", "h128", "h192", "h256", "default", "/tuned",
         "rel diff", "cuBL+G", "fused", "ratio");
  double sum[3] = {0, 0, 0};
  for (const Layer &s : forward_layers()) {
    const int64_t nout = s.N * s.OC;
    const bool fc1 = s.OC == 4 * s.IC;
    __nv_bfloat16 *inp = random_bf16(s.N * s.IC, 1, 1.0f, stream);
    __nv_bfloat16 *weight = random_bf16((int64_t)s.OC * s.IC, 2, 0.1f, stream);
    __nv_bfloat16 *bias = random_bf16(s.OC, 3, 0.5f, stream);
    __nv_bfloat16 *ref = nullptr, *out = nullptr, *post = nullptr;
    float *diff = nullptr;
    CUDA_CHECK(cudaMalloc(&ref, sizeof(__nv_bfloat16) * (size_t)nout));
    CUDA_CHECK(cudaMalloc(&out, sizeof(__nv_bfloat16) * (size_t)nout));
    CUDA_CHECK(cudaMalloc(&post, sizeof(__nv_bfloat16) * (size_t)nout));
    CUDA_CHECK(cudaMalloc(&diff, 2 * sizeof(float)));
    const double flop = 2.0 * (double)s.N * s.IC * s.OC;
    const double base = median_us(stream, [&] {
      linear_forward_cuda(g, DTYPE_BF16, ref, inp, weight, bias, s.N, s.IC, s.OC);
    });
    const double best = median_us(stream, [&] {
      linear_forward_cuda(tuned, DTYPE_BF16, ref, inp, weight, bias, s.N, s.IC, s.OC);
    });
    double per_tile[4];
    for (int k = 0; k < 4; k++)
      per_tile[k] = median_us(stream, [&] {
        linear_hopper_forward_tile(out, nullptr, inp, weight, bias, s.N, s.IC, s.OC, tiles[k],
                                   stream);
      });
    const double ours = median_us(stream, [&] {
      linear_hopper_forward_cuda(out, nullptr, inp, weight, bias, s.N, s.IC, s.OC, stream);
    });
    CUDA_CHECK(cudaMemsetAsync(diff, 0, 2 * sizeof(float), stream));
    max_diff_kernel<<<264, 256, 0, stream>>>(out, ref, nout, diff);
    CUDA_CHECK_LAUNCH();
    float h[2];
    CUDA_CHECK(cudaMemcpyAsync(h, diff, sizeof h, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    printf(
        "%-9s %6lld %5d %5d | %6.1f (%4.0f) %6.1f (%4.0f) | %6.1f %6.1f %6.1f %6.1f | %6.1f "
        "(%4.0f) %6.3f | %8.2e |",
        s.name, (long long)s.N, s.IC, s.OC, base, flop / base * 1e-6, best, flop / best * 1e-6,
        per_tile[0], per_tile[1], per_tile[2], per_tile[3], ours, flop / ours * 1e-6, best / ours,
        h[0] / (h[1] > 0 ? h[1] : 1.0f));
    if (fc1) {
      const double pair = median_us(stream, [&] {
        linear_forward_cuda(tuned, DTYPE_BF16, ref, inp, weight, bias, s.N, s.IC, s.OC);
        gelu_forward_cuda(DTYPE_BF16, post, ref, nout, stream);
      });
      const double fused = median_us(stream, [&] {
        linear_hopper_forward_cuda(out, post, inp, weight, bias, s.N, s.IC, s.OC, stream);
      });
      printf(" %7.1f %7.1f %6.3f\n", pair, fused, pair / fused);
    } else {
      printf(" %7s %7s %6s\n", "-", "-", "-");
    }
    sum[0] += base, sum[1] += best, sum[2] += ours;
    __nv_bfloat16 *bufs[] = {inp, weight, bias, ref, out, post};
    for (__nv_bfloat16 *p : bufs) CUDA_CHECK(cudaFree(p));
    CUDA_CHECK(cudaFree(diff));
  }
  printf("sum: cuBLASLt %.1f us, tuned %.1f, hopper (default tiles) %.1f: tuned / hopper %.3f\n",
         sum[0], sum[1], sum[2], sum[1] / sum[2]);
}

// Table 3 (see the top of the file).
void dgelu_table(GemmContext *tuned, cudaStream_t stream) {
  if (!linear_hopper_supported(96, 384)) return;  // hopper_table said why
  printf(
      "\nMLP backward, d(hidden) + GELU pass: us; tuned cuBLASLt + gelu_recompute_backward_cuda "
      "against linear_hopper_dgelu (h96, h128: at that width)\n");
  printf("%-9s %6s %5s %5s | %8s | %7s %7s %7s | %6s | %8s | %8s %8s\n", "mlp", "N", "IC", "OC",
         "cuBL+G", "h96", "h128", "default", "ratio", "rel diff", "h128+dW", "fused dW");
  double sum[2] = {0, 0};
  for (const Layer &l : forward_layers()) {
    if (l.OC != 4 * l.IC) continue;  // fc1's rows name the MLPs
    const int64_t N = l.N;
    const int IC = l.OC, OC = l.IC;  // d(hidden) (N, 4C) from dout (N, C) and fc2's (C, 4C)
    const int64_t nh = N * IC;
    __nv_bfloat16 *dout = random_bf16(N * OC, 4, 1.0f, stream);
    __nv_bfloat16 *weight = random_bf16((int64_t)OC * IC, 5, 0.1f, stream);
    __nv_bfloat16 *pre = random_bf16(nh, 6, 3.0f, stream);
    __nv_bfloat16 *dpre = nullptr, *hidden = nullptr, *ref = nullptr;
    float *sums = nullptr, *scratch = nullptr, *diff = nullptr;
    const bool fused_dw = linear_hopper_dgelu_dweight_supported(IC, OC);
    const int64_t scratch_floats =
        std::max({linear_hopper_dgelu_scratch(N, IC, OC), column_sums_cuda_scratch(N, IC),
                  fused_dw ? linear_hopper_dgelu_dweight_scratch(N, IC, OC) : 0});
    CUDA_CHECK(cudaMalloc(&dpre, sizeof(__nv_bfloat16) * (size_t)nh));
    CUDA_CHECK(cudaMalloc(&hidden, sizeof(__nv_bfloat16) * (size_t)nh));
    CUDA_CHECK(cudaMalloc(&ref, sizeof(__nv_bfloat16) * (size_t)nh));
    CUDA_CHECK(cudaMalloc(&sums, sizeof(float) * (size_t)IC));
    CUDA_CHECK(cudaMalloc(&scratch, sizeof(float) * (size_t)scratch_floats));
    CUDA_CHECK(cudaMalloc(&diff, 2 * sizeof(float)));
    CUDA_CHECK(cudaMemsetAsync(sums, 0, sizeof(float) * (size_t)IC, stream));
    // fc2's weight gradient both ways: after the kernel that stores hidden, and inside the kernel.
    float *dweight = nullptr;
    double with_dw[2] = {0, 0};
    if (fused_dw) {
      CUDA_CHECK(cudaMalloc(&dweight, sizeof(float) * (size_t)OC * IC));
      CUDA_CHECK(cudaMemsetAsync(dweight, 0, sizeof(float) * (size_t)OC * IC, stream));
      with_dw[0] = median_us(stream, [&] {
        linear_hopper_dgelu_tile(dpre, hidden, sums, scratch, dout, weight, pre, N, IC, OC, 128,
                                 stream);
        linear_backward_cuda(tuned, DTYPE_BF16, nullptr, dweight, nullptr, dout, hidden, weight, N,
                             IC, OC, nullptr);
      });
      with_dw[1] = median_us(stream, [&] {
        linear_hopper_dgelu_dweight_cuda(dpre, dweight, sums, scratch, dout, weight, pre, N, IC, OC,
                                         stream);
      });
    }
    const double pair = median_us(stream, [&] {
      linear_backward_cuda(tuned, DTYPE_BF16, ref, nullptr, nullptr, dout, nullptr, weight, N, IC,
                           OC, nullptr);
      gelu_recompute_backward_cuda(DTYPE_BF16, hidden, ref, pre, ref, N, IC, sums, scratch, stream);
    });
    double at[2];
    static const int widths[] = {96, 128};
    for (int k = 0; k < 2; k++)
      at[k] = median_us(stream, [&] {
        linear_hopper_dgelu_tile(dpre, hidden, sums, scratch, dout, weight, pre, N, IC, OC,
                                 widths[k], stream);
      });
    const double ours = median_us(stream, [&] {
      linear_hopper_dgelu_cuda(dpre, hidden, sums, scratch, dout, weight, pre, N, IC, OC, stream);
    });
    // The two dpre: one more run of each (the pass works in place on ref).
    linear_backward_cuda(tuned, DTYPE_BF16, ref, nullptr, nullptr, dout, nullptr, weight, N, IC, OC,
                         nullptr);
    gelu_recompute_backward_cuda(DTYPE_BF16, hidden, ref, pre, ref, N, IC, nullptr, nullptr,
                                 stream);
    CUDA_CHECK(cudaMemsetAsync(diff, 0, 2 * sizeof(float), stream));
    max_diff_kernel<<<264, 256, 0, stream>>>(dpre, ref, nh, diff);
    CUDA_CHECK_LAUNCH();
    float h[2];
    CUDA_CHECK(cudaMemcpyAsync(h, diff, sizeof h, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    char name[16];
    snprintf(name, sizeof name, "%.2s mlp", l.name);
    printf("%-9s %6lld %5d %5d | %8.1f | %7.1f %7.1f %7.1f | %6.3f | %8.2e", name, (long long)N, IC,
           OC, pair, at[0], at[1], ours, pair / ours, h[0] / (h[1] > 0 ? h[1] : 1.0f));
    if (fused_dw)
      printf(" | %8.1f %8.1f\n", with_dw[0], with_dw[1]);
    else
      printf(" | %8s %8s\n", "-", "-");
    sum[0] += pair, sum[1] += ours;
    __nv_bfloat16 *bufs[] = {dout, weight, pre, dpre, hidden, ref};
    for (__nv_bfloat16 *p : bufs) CUDA_CHECK(cudaFree(p));
    float *fbufs[] = {sums, scratch, diff, dweight};
    for (float *p : fbufs) CUDA_CHECK(cudaFree(p));
  }
  printf("sum: tuned cuBLASLt + GELU pass %.1f us, hopper dgelu %.1f: ratio %.3f\n", sum[0], sum[1],
         sum[0] / sum[1]);
}

// Table 4 (see the top of the file).
void mlp_table(GemmContext *g, cudaStream_t stream) {
  if (!linear_hopper_supported(96, 384)) return;  // hopper_table said why
  printf(
      "\nMLP forward, us: fc1 + GELU fused, fc2 cuBLASLt | fc1 alone, fc2 with the GELU in its "
      "operand load; fc2 alone: cuBLASLt (on the stored hidden layer) | ours\n");
  printf("%-9s %6s %5s %5s | %8s %8s %6s | %8s %8s %6s\n", "mlp", "N", "C", "H", "fused1",
         "gelu-in", "ratio", "fc2 cuBL", "fc2 ours", "ratio");
  for (const Layer &l : forward_layers()) {
    if (l.OC != 4 * l.IC) continue;
    const int64_t N = l.N;
    const int C = l.IC, H = l.OC;
    __nv_bfloat16 *inp = random_bf16(N * C, 7, 1.0f, stream);
    __nv_bfloat16 *w1 = random_bf16((int64_t)H * C, 8, 0.1f, stream);
    __nv_bfloat16 *b1 = random_bf16(H, 9, 0.5f, stream);
    __nv_bfloat16 *w2 = random_bf16((int64_t)C * H, 10, 0.05f, stream);
    __nv_bfloat16 *b2 = random_bf16(C, 11, 0.5f, stream);
    __nv_bfloat16 *pre = nullptr, *hidden = nullptr, *out = nullptr;
    CUDA_CHECK(cudaMalloc(&pre, sizeof(__nv_bfloat16) * (size_t)(N * H)));
    CUDA_CHECK(cudaMalloc(&hidden, sizeof(__nv_bfloat16) * (size_t)(N * H)));
    CUDA_CHECK(cudaMalloc(&out, sizeof(__nv_bfloat16) * (size_t)(N * C)));
    const bool small = C == 96;  // the model's stage-0 route (use_small_k)
    auto fc1 = [&](bool gelu) {
      if (small)
        linear_small_k_forward_cuda(pre, gelu ? hidden : nullptr, inp, w1, b1, N, C, H, stream);
      else if (gelu)
        linear_hopper_forward_cuda(pre, hidden, inp, w1, b1, N, C, H, stream);
      else
        linear_forward_cuda(g, DTYPE_BF16, pre, inp, w1, b1, N, C, H);
    };
    const double fused = median_us(stream, [&] {
      fc1(true);
      linear_forward_cuda(g, DTYPE_BF16, out, hidden, w2, b2, N, H, C);
    });
    const double gelu_in = median_us(stream, [&] {
      fc1(false);
      linear_hopper_gelu_forward_cuda(out, pre, w2, b2, N, H, C, stream);
    });
    const double fc2_cublas = median_us(
        stream, [&] { linear_forward_cuda(g, DTYPE_BF16, out, hidden, w2, b2, N, H, C); });
    const double fc2_ours = median_us(
        stream, [&] { linear_hopper_gelu_forward_cuda(out, pre, w2, b2, N, H, C, stream); });
    char name[16];
    snprintf(name, sizeof name, "%.2s mlp", l.name);
    printf("%-9s %6lld %5d %5d | %8.1f %8.1f %6.3f | %8.1f %8.1f %6.3f\n", name, (long long)N, C, H,
           fused, gelu_in, fused / gelu_in, fc2_cublas, fc2_ours, fc2_cublas / fc2_ours);
    __nv_bfloat16 *bufs[] = {inp, w1, b1, w2, b2, pre, hidden, out};
    for (__nv_bfloat16 *p : bufs) CUDA_CHECK(cudaFree(p));
  }
}

// Table 5 (see the top of the file).
void resln_table(GemmContext *g, cudaStream_t stream) {
  const int B = 128, H = 56, C = 96;
  const int64_t L = (int64_t)H * H, N = B * L, n = N * C;
  const WindowMap map = {H, H, 7, 7, 3, 3};
  __nv_bfloat16 *inp = random_bf16(n, 1, 1.0f, stream), *x = random_bf16(n, 4, 2.0f, stream);
  __nv_bfloat16 *weight = random_bf16((int64_t)C * C, 2, 0.1f, stream);
  __nv_bfloat16 *bias = random_bf16(C, 3, 0.5f, stream);
  __nv_bfloat16 *branch, *x_out, *ln_out;
  float *stats, *ln_par, *scale;
  CUDA_CHECK(cudaMalloc(&branch, sizeof(__nv_bfloat16) * (size_t)n));
  CUDA_CHECK(cudaMalloc(&x_out, sizeof(__nv_bfloat16) * (size_t)n));
  CUDA_CHECK(cudaMalloc(&ln_out, sizeof(__nv_bfloat16) * (size_t)n));
  CUDA_CHECK(cudaMalloc(&stats, sizeof(float) * 2 * (size_t)N));
  CUDA_CHECK(cudaMalloc(&ln_par, sizeof(float) * 2 * C));
  CUDA_CHECK(cudaMalloc(&scale, sizeof(float) * B));
  std::vector<float> host(2 * C, 1.0f);
  for (int c = 0; c < C; c++) host[C + c] = 0.0f;
  CUDA_CHECK(cudaMemcpy(ln_par, host.data(), sizeof(float) * 2 * C, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(scale, host.data(), sizeof(float) * B, cudaMemcpyHostToDevice));
  float *mean = stats, *rstd = stats + N;
  auto ln = [&] {
    residual_layernorm_forward_cuda(DTYPE_BF16, x_out, ln_out, mean, rstd, x, branch, &map, scale,
                                    ln_par, ln_par + C, nullptr, B, L, C, stream);
  };
  const double a = median_us(stream, [&] {
    linear_forward_cuda(g, DTYPE_BF16, branch, inp, weight, bias, N, C, C);
    ln();
  });
  const double b = median_us(stream, [&] {
    linear_small_k_forward_cuda(branch, nullptr, inp, weight, bias, N, C, C, stream);
    ln();
  });
  const double b_ln = median_us(stream, ln);
  const double c = median_us(stream, [&] {
    linear_small_k_residual_layernorm_cuda(x_out, ln_out, mean, rstd, x, inp, &map, scale, weight,
                                           bias, ln_par, ln_par + C, B, L, C, C, stream);
  });
  // What the fused kernel must move: inp, x in; x_out, ln_out out (bf16), mean and rstd (f32).
  const double bytes = 8.0 * (double)n + 8.0 * (double)N;
  printf(
      "\nproj + residual + LN2, Swin-T stage 0 (N %lld, C %d, windows 7 shifted 3), bf16; us = "
      "median of %d; TB/s = %.0f MB / time\n",
      (long long)N, C, kRepeats, bytes / 1e6);
  printf("  cuBLASLt + residual LN           %8.1f us %5.2f TB/s\n", a, tb_per_s(bytes, a));
  printf("  small-K + residual LN (LN alone)  %8.1f us %5.2f TB/s  (%.1f)\n", b, tb_per_s(bytes, b),
         b_ln);
  printf("  fused small-K residual LN        %8.1f us %5.2f TB/s  (%.3f of small-K + LN)\n", c,
         tb_per_s(bytes, c), c / b);
  void *bufs[] = {inp, x, weight, bias, branch, x_out, ln_out, stats, ln_par};
  for (void *p : bufs) CUDA_CHECK(cudaFree(p));

  // fc2 (the GELU in its operand load) + residual + LN1 into the next block's windows, stages 0
  // and 1 of Swin-T, where the Hopper GEMM serves it.
  if (!linear_hopper_gelu_residual_layernorm_supported(384, 96)) {
    CUDA_CHECK(cudaFree(scale));
    return;
  }
  printf(
      "\nfc2 + residual + LN1, Swin-T stages 0 and 1, bf16; us = median of %d; TB/s = the "
      "fused kernel's bytes (pre, x in; x_out, ln_out out) / time\n",
      kRepeats);
  for (int st = 0; st < 2; st++) {
    const int Cs = 96 << st, Hs = 56 >> st, HID = 4 * Cs;
    const int64_t Ls = (int64_t)Hs * Hs, Ns = B * Ls, ns = Ns * Cs;
    const WindowMap m = {Hs, Hs, 7, 7, 3, 3};
    __nv_bfloat16 *pre = random_bf16(Ns * HID, 5, 3.0f, stream),
                  *xs = random_bf16(ns, 6, 2.0f, stream);
    __nv_bfloat16 *w2 = random_bf16((int64_t)Cs * HID, 7, 0.05f, stream);
    __nv_bfloat16 *b2 = random_bf16(Cs, 8, 0.5f, stream);
    __nv_bfloat16 *br, *xo, *lo;
    float *st2, *par;
    CUDA_CHECK(cudaMalloc(&br, sizeof(__nv_bfloat16) * (size_t)ns));
    CUDA_CHECK(cudaMalloc(&xo, sizeof(__nv_bfloat16) * (size_t)ns));
    CUDA_CHECK(cudaMalloc(&lo, sizeof(__nv_bfloat16) * (size_t)ns));
    CUDA_CHECK(cudaMalloc(&st2, sizeof(float) * 2 * (size_t)Ns));
    CUDA_CHECK(cudaMalloc(&par, sizeof(float) * 2 * Cs));
    std::vector<float> ones(2 * Cs, 1.0f);
    for (int c = 0; c < Cs; c++) ones[Cs + c] = 0.0f;
    CUDA_CHECK(cudaMemcpy(par, ones.data(), sizeof(float) * 2 * Cs, cudaMemcpyHostToDevice));
    auto lnf = [&] {
      residual_layernorm_forward_cuda(DTYPE_BF16, xo, lo, st2, st2 + Ns, xs, br, nullptr, scale,
                                      par, par + Cs, &m, B, Ls, Cs, stream);
    };
    const double two = median_us(stream, [&] {
      linear_hopper_gelu_forward_tile(br, pre, w2, b2, Ns, HID, Cs, Cs, stream);
      lnf();
    });
    const double ln_alone = median_us(stream, lnf);
    const double one = median_us(stream, [&] {
      linear_hopper_gelu_residual_layernorm_cuda(xo, lo, st2, st2 + Ns, xs, pre, w2, b2, scale, par,
                                                 par + Cs, &m, B, Ls, HID, Cs, stream);
    });
    const double fbytes = 2.0 * (double)Ns * HID + 6.0 * (double)ns + 8.0 * (double)Ns;
    printf(
        "  stage %d (N %lld, %d -> %d): fc2 + residual LN %8.1f us (LN alone %.1f); fused "
        "%8.1f us %5.2f TB/s (%.3f)\n",
        st, (long long)Ns, HID, Cs, two, ln_alone, one, tb_per_s(fbytes, one), one / two);
    void *bb[] = {pre, xs, w2, b2, br, xo, lo, st2, par};
    for (void *p : bb) CUDA_CHECK(cudaFree(p));
  }
  CUDA_CHECK(cudaFree(scale));
}

}  // namespace

int main(int argc, char **argv) {
  if (!cuda_device_available()) {
    fprintf(stderr, "bench_gemm: no CUDA device\n");
    return 1;
  }
  bool small_k = argc == 1, hopper = argc == 1, dgelu = argc == 1, mlp = argc == 1,
       resln = argc == 1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "small_k"))
      small_k = true;
    else if (!strcmp(argv[i], "hopper"))
      hopper = true;
    else if (!strcmp(argv[i], "dgelu"))
      dgelu = true;
    else if (!strcmp(argv[i], "mlp"))
      mlp = true;
    else if (!strcmp(argv[i], "resln"))
      resln = true;
    else {
      fprintf(stderr, "bench_gemm: unknown table %s (small_k, hopper, dgelu, mlp, resln)\n",
              argv[i]);
      return 2;
    }
  }
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  GemmContext *g = gemm_context_create(stream), *tuned = gemm_context_create(stream);
  gemm_context_set_tuning(tuned, true);
  if (small_k) small_k_table(g, stream);
  if (hopper) hopper_table(g, tuned, stream);
  if (dgelu) dgelu_table(tuned, stream);
  if (mlp) mlp_table(g, stream);
  if (resln) resln_table(g, stream);
  gemm_context_destroy(tuned);
  gemm_context_destroy(g);
  CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}
