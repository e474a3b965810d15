// test_patch.c: kernels/cpu/patch.c. The patch gather is checked as what it stands for (a
// stride-p convolution computed directly in double) and against explicit loops; patch merging
// against timm's four strided slices and by the adjoint identity of its backward; the uint8
// normalization against the same formula in double.
#include "kernels/patch.h"
#include "tests/util/test_util.h"

static double dot_d(const float *a, const float *b, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; i++) s += (double)a[i] * b[i];
  return s;
}

static void check_patch_gather(TestRng *rng, int B, int H, int W, int Cin, int p, int E) {
  int Hp = H / p, Wp = W / p, K = Cin * p * p;
  int64_t nimg = (int64_t)B * H * W * Cin, npatch = (int64_t)B * Hp * Wp * K;
  int64_t nconv = (int64_t)B * Hp * Wp * E;
  float *img = malloc(nimg * sizeof(float)), *patches = malloc(npatch * sizeof(float));
  float *want = malloc(npatch * sizeof(float)), *weight = malloc((size_t)E * K * sizeof(float));
  float *conv = malloc(nconv * sizeof(float)), *want_conv = malloc(nconv * sizeof(float));
  test_fill_uniform(rng, img, nimg, -1.0f, 1.0f);
  test_fill_uniform(rng, weight, (int64_t)E * K, -1.0f, 1.0f);
  printf("-- patch gather: B=%d image %dx%dx%d, patch %d\n", B, H, W, Cin, p);

  // Explicit loops over the documented column order c*p*p + i*p + j.
  for (int b = 0; b < B; b++)
    for (int y = 0; y < Hp; y++)
      for (int x = 0; x < Wp; x++)
        for (int c = 0; c < Cin; c++)
          for (int i = 0; i < p; i++)
            for (int j = 0; j < p; j++)
              want[(((int64_t)b * Hp + y) * Wp + x) * K + c * p * p + i * p + j] =
                  img[(((int64_t)b * H + y * p + i) * W + x * p + j) * Cin + c];
  test_poison(patches, npatch);
  patch_gather_cpu(patches, img, B, H, W, Cin, p);
  test_close("patches vs explicit loops", patches, want, npatch, 0.0);

  // The point of the gather: patches (rows) times the conv weight (E, Cin, p, p) seen as
  // (E, Cin*p*p) is the convolution. Reference: the convolution over the NHWC image directly.
  for (int b = 0; b < B; b++)
    for (int y = 0; y < Hp; y++)
      for (int x = 0; x < Wp; x++) {
        const float *row = patches + (((int64_t)b * Hp + y) * Wp + x) * K;
        for (int e = 0; e < E; e++) {
          double direct = 0.0;
          for (int c = 0; c < Cin; c++)
            for (int i = 0; i < p; i++)
              for (int j = 0; j < p; j++)
                direct += (double)weight[((e * Cin + c) * p + i) * p + j] *
                          img[(((int64_t)b * H + y * p + i) * W + x * p + j) * Cin + c];
          want_conv[(((int64_t)b * Hp + y) * Wp + x) * E + e] = (float)direct;
          conv[(((int64_t)b * Hp + y) * Wp + x) * E + e] = (float)dot_d(row, weight + e * K, K);
        }
      }
  // Same products summed in a different order in double: equal to ~1e-15.
  test_close("patches @ weight^T == stride-p convolution", conv, want_conv, nconv, 1e-12);
  free(img);
  free(patches);
  free(want);
  free(weight);
  free(conv);
  free(want_conv);
}

static void check_patch_merge(TestRng *rng, int B, int H, int W, int C) {
  int H2 = H / 2, W2 = W / 2;
  int64_t ntok = (int64_t)B * H * W * C, nmerged = (int64_t)B * H2 * W2 * 4 * C;
  float *tok = malloc(ntok * sizeof(float)), *merged = malloc(nmerged * sizeof(float));
  float *want = malloc(nmerged * sizeof(float)), *dmerged = malloc(nmerged * sizeof(float));
  float *dtok = malloc(ntok * sizeof(float)), *want_dtok = malloc(ntok * sizeof(float));
  test_fill_uniform(rng, tok, ntok, -1.0f, 1.0f);
  test_fill_uniform(rng, dmerged, nmerged, -1.0f, 1.0f);
  printf("-- patch merge: B=%d map %dx%d C=%d\n", B, H, W, C);

  // timm: x0 = x[:, 0::2, 0::2], x1 = x[:, 1::2, 0::2], x2 = x[:, 0::2, 1::2],
  // x3 = x[:, 1::2, 1::2], cat([x0, x1, x2, x3], -1).
  const int start_y[4] = {0, 1, 0, 1}, start_x[4] = {0, 0, 1, 1};
  for (int k = 0; k < 4; k++)
    for (int b = 0; b < B; b++)
      for (int y = start_y[k], yo = 0; y < H; y += 2, yo++)
        for (int x = start_x[k], xo = 0; x < W; x += 2, xo++)
          for (int c = 0; c < C; c++) {
            int64_t o = (((int64_t)b * H2 + yo) * W2 + xo) * 4 * C + k * C + c;
            want[o] = tok[(((int64_t)b * H + y) * W + x) * C + c];
            want_dtok[(((int64_t)b * H + y) * W + x) * C + c] = dmerged[o];
          }
  test_poison(merged, nmerged);
  patch_merge_forward_cpu(merged, tok, B, H, W, C);
  test_close("merge forward vs timm strided slices", merged, want, nmerged, 0.0);
  test_poison(dtok, ntok);
  patch_merge_backward_cpu(dtok, dmerged, B, H, W, C);
  test_close("merge backward vs scatter of the slices", dtok, want_dtok, ntok, 0.0);
  // The backward is the adjoint: <merge(x), y> = <x, merge_backward(y)>, the same products
  // summed in another order in double (~1e-15).
  double lhs = dot_d(merged, dmerged, nmerged), rhs = dot_d(tok, dtok, ntok);
  double e = fabs(lhs - rhs) / fabs(rhs);
  test_check(e <= 1e-6, "%-48s rel_err %.3e (tol 1.0e-06)", "adjoint <merge(x), y> = <x, bwd(y)>",
             e);
  free(tok);
  free(merged);
  free(want);
  free(dmerged);
  free(dtok);
  free(want_dtok);
}

static void check_images_normalize(TestRng *rng, int B, int H, int W) {
  const int Cin = 3;
  const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
  int64_t n = (int64_t)B * H * W * Cin;
  uint8_t *pixels = malloc(n);
  float *images = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
  for (int64_t i = 0; i < n; i++) pixels[i] = (uint8_t)(test_rng_u64(rng) & 255);
  pixels[0] = 0;  // both ends of the range
  pixels[n - 1] = 255;
  for (int64_t i = 0; i < n; i++) {
    int c = (int)(i % Cin);
    want[i] = (float)((pixels[i] / 255.0 - mean[c]) / std[c]);
  }
  test_poison(images, n);
  images_normalize_cpu(images, pixels, B, H, W, Cin, mean, std);
  // Three fp32 operations against the same formula in double: a few ulps.
  test_close("images_normalize vs double (x/255 - mean)/std", images, want, n, 1e-6);
  free(pixels);
  free(images);
  free(want);
}

int main(void) {
  TestRng rng = {.state = 0x9a7c4u};
  check_patch_gather(&rng, 2, 16, 24, 3, 4, 8);  // Swin's patch 4 on a non-square image
  check_patch_gather(&rng, 1, 6, 6, 2, 2, 5);
  check_patch_merge(&rng, 2, 8, 12, 5);   // H != W
  check_patch_merge(&rng, 3, 14, 14, 4);  // Swin-T stage 3 -> 4 geometry
  check_images_normalize(&rng, 2, 17, 13);
  return test_finish();
}
