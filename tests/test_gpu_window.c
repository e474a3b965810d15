// test_gpu_window.c: window_partition_cuda and window_reverse_cuda against the CPU reference
// (kernels/cpu/window.c, itself checked against timm's roll + partition in test_window.c), on
// the CPU test's geometries (shifted and not, H != W, rectangular windows, maps no larger than
// the window) plus Swin-T stage-0 maps (56x56, C = 96) at batch 2 and 8, channel counts that
// take the scalar path (C % 4 != 0) and a misaligned base pointer. Both maps are permutations,
// so the GPU must match the CPU exactly (tolerance 0).
#include "kernels/window.h"
#include "tests/test_gpu_util.h"

#ifdef SWIN_HAVE_CUDA
typedef struct {
  const char *what;
  int B, H, W, C, wh, ww, sh, sw;
  int misalign;  // floats added to both device base pointers (1 defeats 16-byte alignment)
} WindowCase;

static void check_same_bits(const char *what, const float *a, const float *b, int64_t n) {
  int64_t differ = 0;
  for (int64_t i = 0; i < n; i++) differ += memcmp(&a[i], &b[i], sizeof(float)) != 0;
  test_check(differ == 0, "%-48s %lld elements differ", what, (long long)differ);
}

static void check_case(TestRng *rng, cudaStream_t stream, const WindowCase *k) {
  int64_t n = (int64_t)k->B * k->H * k->W * k->C;
  printf("-- %s: B=%d H=%d W=%d C=%d window %dx%d shift (%d, %d)%s\n", k->what, k->B, k->H, k->W,
         k->C, k->wh, k->ww, k->sh, k->sw, k->misalign ? ", misaligned" : "");
  float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
  float *want = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
  float *again = malloc(n * sizeof(float));
  test_fill_uniform(rng, x, n, -1.0f, 1.0f);
  test_fill_uniform(rng, y, n, -1.0f, 1.0f);

  int64_t padded = n + k->misalign;
  float *d_in_base = gpu_alloc(padded * sizeof(float)),
        *d_out_base = gpu_alloc(padded * sizeof(float));
  float *d_in = d_in_base + k->misalign, *d_out = d_out_base + k->misalign;

  // Partition: windows (B*nW, wh*ww, C) <- tokens (B, H, W, C).
  window_partition_cpu(want, x, k->B, k->H, k->W, k->C, k->wh, k->ww, k->sh, k->sw);
  CUDA_CHECK(cudaMemcpy(d_in, x, n * sizeof(float), cudaMemcpyHostToDevice));
  gpu_poison(d_out, n);
  window_partition_cuda(d_out, d_in, k->B, k->H, k->W, k->C, k->wh, k->ww, k->sh, k->sw, stream);
  gpu_download(got, d_out, n);
  test_close("partition vs CPU (a permutation: exact)", got, want, n, 0.0);
  gpu_poison(d_out, n);
  window_partition_cuda(d_out, d_in, k->B, k->H, k->W, k->C, k->wh, k->ww, k->sh, k->sw, stream);
  gpu_download(again, d_out, n);
  check_same_bits("partition run twice: same bits", got, again, n);

  // Reverse: tokens (B, H, W, C) <- windows, on independent data.
  window_reverse_cpu(want, y, k->B, k->H, k->W, k->C, k->wh, k->ww, k->sh, k->sw);
  CUDA_CHECK(cudaMemcpy(d_in, y, n * sizeof(float), cudaMemcpyHostToDevice));
  gpu_poison(d_out, n);
  window_reverse_cuda(d_out, d_in, k->B, k->H, k->W, k->C, k->wh, k->ww, k->sh, k->sw, stream);
  gpu_download(got, d_out, n);
  test_close("reverse vs CPU (a permutation: exact)", got, want, n, 0.0);

  // reverse(partition(x)) == x entirely on the device.
  CUDA_CHECK(cudaMemcpy(d_in, x, n * sizeof(float), cudaMemcpyHostToDevice));
  window_partition_cuda(d_out, d_in, k->B, k->H, k->W, k->C, k->wh, k->ww, k->sh, k->sw, stream);
  gpu_poison(d_in, n);
  window_reverse_cuda(d_in, d_out, k->B, k->H, k->W, k->C, k->wh, k->ww, k->sh, k->sw, stream);
  gpu_download(got, d_in, n);
  test_close("reverse(partition(x)) == x on the device", got, x, n, 0.0);

  CUDA_CHECK(cudaFree(d_in_base));
  CUDA_CHECK(cudaFree(d_out_base));
  free(x);
  free(y);
  free(want);
  free(got);
  free(again);
}
#endif

int main(void) {
  GPU_TEST_MAIN_BEGIN();
#ifdef SWIN_HAVE_CUDA
  TestRng rng = {.state = 0x3142u};
  const WindowCase cases[] = {
      {"square, unshifted", 2, 8, 8, 5, 4, 4, 0, 0, 0},
      {"square, shifted", 2, 8, 8, 5, 4, 4, 2, 2, 0},
      {"H != W, shifted, C % 4 == 0", 2, 8, 12, 8, 4, 4, 2, 2, 0},
      {"H != W, shifted, odd C", 2, 8, 12, 3, 4, 4, 2, 2, 0},
      {"rectangular window, shifted", 2, 6, 8, 3, 3, 4, 1, 2, 0},
      {"rectangular window 4x6, shift (2, 3)", 1, 8, 12, 12, 4, 6, 2, 3, 0},
      {"shift along W only (H == window)", 2, 4, 8, 3, 4, 4, 0, 2, 0},
      {"map no larger than the window (7x7)", 2, 7, 7, 4, 7, 7, 0, 0, 0},
      {"rectangular map below the window (4x6)", 2, 4, 6, 3, 4, 6, 0, 0, 0},
      {"wide rows: C = 100 (25 float4 per token)", 2, 14, 14, 100, 7, 7, 3, 3, 0},
      {"Swin-T stage 0, unshifted", 2, 56, 56, 96, 7, 7, 0, 0, 0},
      {"Swin-T stage 0, shifted", 2, 56, 56, 96, 7, 7, 3, 3, 0},
      {"Swin-T stage 0, shifted, batch 8", 8, 56, 56, 96, 7, 7, 3, 3, 0},
      {"Swin-T stage 0, shifted, misaligned base", 2, 56, 56, 96, 7, 7, 3, 3, 1},
      {"Swin-T stage 3 (7x7 map), C = 768", 4, 7, 7, 768, 7, 7, 0, 0, 0},
  };
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(&rng, stream, &cases[i]);
  CUDA_CHECK(cudaStreamDestroy(stream));
  return test_finish();
#endif
}
