// patch.c: CPU reference of the patch-embedding gather, patch merging (forward and backward),
// the uint8 -> normalized float conversion of input batches, and patch merging + LayerNorm
// composed from the merge and kernels/cpu/layernorm.c (kernels/patch.h).
//
// The first three are pure data movement (or a per-channel affine map), parallel over output
// rows.
#include "kernels/patch.h"

#include <stdbool.h>
#include <string.h>

#include "kernels/layernorm.h"

void patch_gather_cpu(float *patches, const float *images, int B, int H, int W, int Cin, int p) {
  int Hp = H / p, Wp = W / p, row = Cin * p * p;
#pragma omp parallel for schedule(static)
  for (int64_t by = 0; by < (int64_t)B * Hp; by++) {
    int64_t b = by / Hp;
    int y = (int)(by % Hp);
    for (int x = 0; x < Wp; x++) {
      float *dst = patches + (by * Wp + x) * row;
      // column c*p*p + i*p + j: the conv weight (E, Cin, p, p) flattened.
      for (int i = 0; i < p; i++) {
        const float *src = images + ((b * H + (int64_t)y * p + i) * W + (int64_t)x * p) * Cin;
        for (int j = 0; j < p; j++)
          for (int c = 0; c < Cin; c++) dst[c * p * p + i * p + j] = src[j * Cin + c];
      }
    }
  }
}

// Neighbour k of the 2x2 block, timm's reshape(B, H/2, 2, W/2, 2, C).permute(0, 1, 3, 4, 2, 5).
static const int merge_dy[4] = {0, 1, 0, 1};
static const int merge_dx[4] = {0, 0, 1, 1};

// Moves each token between the map and its slot in the merged 2x2 neighbourhood; the forward
// and the backward are the two directions of this permutation (for even H, W).
static void merge_permute(float *merged, float *tokens, bool to_merged, int B, int H, int W,
                          int C) {
  int H2 = H / 2, W2 = W / 2;
#pragma omp parallel for schedule(static)
  for (int64_t by = 0; by < (int64_t)B * H2; by++) {
    int64_t b = by / H2;
    int y = (int)(by % H2);
    for (int x = 0; x < W2; x++) {
      float *m = merged + (by * W2 + x) * 4 * C;
      for (int k = 0; k < 4; k++) {
        float *t = tokens + ((b * H + 2 * y + merge_dy[k]) * W + 2 * x + merge_dx[k]) * C;
        if (to_merged)
          memcpy(m + k * C, t, (size_t)C * sizeof(float));
        else
          memcpy(t, m + k * C, (size_t)C * sizeof(float));
      }
    }
  }
}

void patch_merge_forward_cpu(float *merged, const float *tokens, int B, int H, int W, int C) {
  merge_permute(merged, (float *)tokens, true, B, H, W, C);
}

// With odd H or W the last row/column takes no part in the merge and gets a zero gradient.
void patch_merge_backward_cpu(float *dtokens, const float *dmerged, int B, int H, int W, int C) {
  int H2 = H / 2, W2 = W / 2;
  merge_permute((float *)dmerged, dtokens, false, B, H, W, C);
  if (H % 2 || W % 2) {
    for (int64_t b = 0; b < B; b++)
      for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
          if (y >= 2 * H2 || x >= 2 * W2)
            memset(dtokens + ((b * H + y) * W + x) * C, 0, (size_t)C * sizeof(float));
  }
}

// Same arithmetic as torchvision's ToTensor (x / 255 in fp32) then Normalize ((x - mean) / std).
void images_normalize_cpu(float *images, const uint8_t *pixels, int64_t B, int H, int W, int Cin,
                          const float *mean, const float *std) {
  int64_t pixels_total = B * H * W;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < pixels_total; i++) {
    const uint8_t *src = pixels + i * Cin;
    float *dst = images + i * Cin;
    for (int c = 0; c < Cin; c++) dst[c] = ((float)src[c] / 255.0f - mean[c]) / std[c];
  }
}

void merge_layernorm_forward_cpu(float *out, float *mean, float *rstd, const float *tokens,
                                 const float *weight, const float *bias, int B, int H, int W, int C,
                                 float *scratch) {
  patch_merge_forward_cpu(scratch, tokens, B, H, W, C);
  layernorm_forward_cpu(out, mean, rstd, scratch, weight, bias, (int64_t)B * (H / 2) * (W / 2),
                        4 * C);
}

void merge_layernorm_backward_cpu(float *dtokens, float *dweight, float *dbias, const float *dout,
                                  const float *tokens, const float *weight, const float *mean,
                                  const float *rstd, int B, int H, int W, int C, float *scratch) {
  int64_t count = (int64_t)B * H * W * C;
  float *merged = scratch, *dmerged = scratch + count;
  patch_merge_forward_cpu(merged, tokens, B, H, W, C);
  layernorm_backward_cpu(dmerged, dweight, dbias, dout, merged, weight, mean, rstd,
                         (int64_t)B * (H / 2) * (W / 2), 4 * C);
  patch_merge_backward_cpu(dtokens, dmerged, B, H, W, C);
}
