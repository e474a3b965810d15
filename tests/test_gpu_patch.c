// test_gpu_patch.c: patch_gather_cuda, patch_merge_forward_cuda / _backward_cuda and
// images_normalize_cuda against the CPU reference (kernels/cpu/patch.c, checked against timm's
// slicing in test_patch.c). Geometries: the CPU test's, Swin-T's real ones (224x224x3 images
// with patch 4; 56x56x96 maps merged at batch 2 and 8), odd maps (the last row/column takes no
// part in the merge and gets a zero gradient), channel counts and a misaligned base pointer
// that take the scalar path, and a batch large enough that the normalization's grid-stride loop
// runs more than once.
#include "kernels/patch.h"
#include "tests/test_gpu_util.h"

#ifdef SWIN_HAVE_CUDA
static void check_same_bits(const char *what, const float *a, const float *b, int64_t n) {
  int64_t differ = 0;
  for (int64_t i = 0; i < n; i++) differ += memcmp(&a[i], &b[i], sizeof(float)) != 0;
  test_check(differ == 0, "%-48s %lld elements differ", what, (long long)differ);
}

static void check_patch_gather(TestRng *rng, cudaStream_t stream, int B, int H, int W, int Cin,
                               int p) {
  int Hp = H / p, Wp = W / p;
  int64_t nimg = (int64_t)B * H * W * Cin, npatch = (int64_t)B * Hp * Wp * Cin * p * p;
  printf("-- patch gather: B=%d image %dx%dx%d, patch %d\n", B, H, W, Cin, p);
  float *img = malloc(nimg * sizeof(float)), *want = malloc(npatch * sizeof(float));
  float *got = malloc(npatch * sizeof(float)), *again = malloc(npatch * sizeof(float));
  test_fill_uniform(rng, img, nimg, -1.0f, 1.0f);
  patch_gather_cpu(want, img, B, H, W, Cin, p);
  float *d_img = gpu_upload(img, nimg), *d_patches = gpu_alloc(npatch * sizeof(float));
  gpu_poison(d_patches, npatch);
  patch_gather_cuda(d_patches, d_img, B, H, W, Cin, p, stream);
  gpu_download(got, d_patches, npatch);
  // A pure gather: exact.
  test_close("patches vs CPU (a gather: exact)", got, want, npatch, 0.0);
  gpu_poison(d_patches, npatch);
  patch_gather_cuda(d_patches, d_img, B, H, W, Cin, p, stream);
  gpu_download(again, d_patches, npatch);
  check_same_bits("patch gather run twice: same bits", got, again, npatch);
  CUDA_CHECK(cudaFree(d_img));
  CUDA_CHECK(cudaFree(d_patches));
  free(img);
  free(want);
  free(got);
  free(again);
}

// misalign: floats added to the device base pointers (1 defeats the 16-byte vector path).
static void check_patch_merge(TestRng *rng, cudaStream_t stream, int B, int H, int W, int C,
                              int misalign) {
  int64_t ntok = (int64_t)B * H * W * C, nmerged = (int64_t)B * (H / 2) * (W / 2) * 4 * C;
  printf("-- patch merge: B=%d map %dx%d C=%d%s\n", B, H, W, C, misalign ? ", misaligned" : "");
  float *tok = malloc(ntok * sizeof(float)), *dmerged = malloc(nmerged * sizeof(float));
  float *want = malloc(nmerged * sizeof(float)), *got = malloc(nmerged * sizeof(float));
  float *want_dtok = malloc(ntok * sizeof(float)), *got_dtok = malloc(ntok * sizeof(float));
  float *again = malloc(ntok * sizeof(float));
  test_fill_uniform(rng, tok, ntok, -1.0f, 1.0f);
  test_fill_uniform(rng, dmerged, nmerged, -1.0f, 1.0f);
  patch_merge_forward_cpu(want, tok, B, H, W, C);
  patch_merge_backward_cpu(want_dtok, dmerged, B, H, W, C);

  float *d_tok_base = gpu_alloc((ntok + misalign) * sizeof(float));
  float *d_merged_base = gpu_alloc((nmerged + misalign) * sizeof(float));
  float *d_tok = d_tok_base + misalign, *d_merged = d_merged_base + misalign;

  CUDA_CHECK(cudaMemcpy(d_tok, tok, ntok * sizeof(float), cudaMemcpyHostToDevice));
  gpu_poison(d_merged, nmerged);
  patch_merge_forward_cuda(d_merged, d_tok, B, H, W, C, stream);
  gpu_download(got, d_merged, nmerged);
  test_close("merge forward vs CPU (a gather: exact)", got, want, nmerged, 0.0);

  // The backward overwrites every token, the unmerged last row/column of an odd map with 0:
  // the poison would show anywhere it did not.
  CUDA_CHECK(cudaMemcpy(d_merged, dmerged, nmerged * sizeof(float), cudaMemcpyHostToDevice));
  gpu_poison(d_tok, ntok);
  patch_merge_backward_cuda(d_tok, d_merged, B, H, W, C, stream);
  gpu_download(got_dtok, d_tok, ntok);
  test_close("merge backward vs CPU (a scatter: exact)", got_dtok, want_dtok, ntok, 0.0);
  gpu_poison(d_tok, ntok);
  patch_merge_backward_cuda(d_tok, d_merged, B, H, W, C, stream);
  gpu_download(again, d_tok, ntok);
  check_same_bits("merge backward run twice: same bits", got_dtok, again, ntok);

  CUDA_CHECK(cudaFree(d_tok_base));
  CUDA_CHECK(cudaFree(d_merged_base));
  free(tok);
  free(dmerged);
  free(want);
  free(got);
  free(want_dtok);
  free(got_dtok);
  free(again);
}

static void check_images_normalize(TestRng *rng, cudaStream_t stream, int B, int H, int W,
                                   int Cin) {
  const float mean[4] = {0.485f, 0.456f, 0.406f, 0.5f}, std[4] = {0.229f, 0.224f, 0.225f, 0.25f};
  int64_t n = (int64_t)B * H * W * Cin;
  printf("-- images normalize: B=%d %dx%dx%d (%lld elements)\n", B, H, W, Cin, (long long)n);
  uint8_t *pixels = malloc(n);
  float *want = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
  for (int64_t i = 0; i < n; i++) pixels[i] = (uint8_t)(test_rng_u64(rng) & 255);
  pixels[0] = 0;  // both ends of the range
  pixels[n - 1] = 255;
  images_normalize_cpu(want, pixels, B, H, W, Cin, mean, std);
  uint8_t *d_pixels = gpu_upload_bytes(pixels, n);
  float *d_mean = gpu_upload(mean, Cin), *d_std = gpu_upload(std, Cin);
  float *d_images = gpu_alloc(n * sizeof(float));
  gpu_poison(d_images, n);
  images_normalize_cuda(d_images, d_pixels, B, H, W, Cin, d_mean, d_std, stream);
  gpu_download(got, d_images, n);
  // The same three IEEE fp32 operations (convert, divide, subtract, divide: each correctly
  // rounded on both sides, no contraction possible) give the same bits; 1e-6 allows a few ulps.
  test_close("images_normalize vs CPU", got, want, n, 1e-6);
  CUDA_CHECK(cudaFree(d_pixels));
  CUDA_CHECK(cudaFree(d_mean));
  CUDA_CHECK(cudaFree(d_std));
  CUDA_CHECK(cudaFree(d_images));
  free(pixels);
  free(want);
  free(got);
}
#endif

int main(void) {
  GPU_TEST_MAIN_BEGIN();
#ifdef SWIN_HAVE_CUDA
  TestRng rng = {.state = 0x9a7c5u};
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  check_patch_gather(&rng, stream, 2, 16, 24, 3, 4);  // Swin's patch 4 on a non-square image
  check_patch_gather(&rng, stream, 1, 6, 6, 2, 2);
  check_patch_gather(&rng, stream, 2, 18, 22, 3, 4);    // H, W not multiples of p: remainder unused
  check_patch_gather(&rng, stream, 4, 224, 224, 3, 4);  // Swin-T's input
  check_patch_merge(&rng, stream, 2, 8, 12, 5, 0);      // H != W, scalar path
  check_patch_merge(&rng, stream, 3, 14, 14, 4, 0);     // Swin-T stage 3 -> 4 geometry
  check_patch_merge(&rng, stream, 2, 7, 9, 8, 0);       // odd H and W: zero gradient at the edge
  check_patch_merge(&rng, stream, 2, 56, 56, 96, 0);    // Swin-T stage 0 -> 1
  check_patch_merge(&rng, stream, 8, 56, 56, 96, 0);
  check_patch_merge(&rng, stream, 2, 28, 28, 192, 1);  // misaligned: scalar fallback
  check_images_normalize(&rng, stream, 2, 17, 13, 3);
  check_images_normalize(&rng, stream, 3, 9, 11, 1);
  check_images_normalize(&rng, stream, 2, 15, 7, 4);
  // 16 x 224 x 224 x 3 = 2.4M elements > 8192 blocks x 256 threads: the loop runs twice, with
  // the channel index carried across the stride.
  check_images_normalize(&rng, stream, 16, 224, 224, 3);
  CUDA_CHECK(cudaStreamDestroy(stream));
  return test_finish();
#endif
}
