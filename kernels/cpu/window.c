// window.c: CPU reference of the cyclic shift + window partition and its reverse, the relative
// position index, and the shifted-window attention mask (kernels/window.h).
//
// Partition and reverse are the same permutation read in opposite directions: token t = r*ww + c
// of window (wi, wj) is pixel ((wi*wh + r + sh) % H, (wj*ww + c + sw) % W) of the un-rolled map,
// which folds torch.roll(x, (-sh, -sw)) into the gather. Each copy moves a whole C-vector.
#include "kernels/window.h"

#include <stdbool.h>
#include <string.h>

// Offset in tokens (B, H, W, C) of the pixel that feeds token (r, c) of window (wi, wj).
static inline int64_t window_source_offset(int b, int wi, int wj, int r, int c, int H, int W, int C,
                                           int wh, int ww, int sh, int sw) {
  int y = (wi * wh + r + sh) % H;
  int x = (wj * ww + c + sw) % W;
  return (((int64_t)b * H + y) * W + x) * C;
}

// Moves every token between the map and its window; the two directions are the two maps.
static void window_permute(float *windows, float *tokens, bool to_windows, int B, int H, int W,
                           int C, int wh, int ww, int sh, int sw) {
  int nWw = W / ww, nW = (H / wh) * nWw, N = wh * ww;
  // Windows tile the map exactly, so every token is written once and no two windows collide.
#pragma omp parallel for schedule(static)
  for (int64_t bw = 0; bw < (int64_t)B * nW; bw++) {
    int b = (int)(bw / nW), w = (int)(bw % nW);
    for (int r = 0; r < wh; r++) {
      for (int c = 0; c < ww; c++) {
        float *win = windows + (bw * N + r * ww + c) * C;
        float *tok =
            tokens + window_source_offset(b, w / nWw, w % nWw, r, c, H, W, C, wh, ww, sh, sw);
        if (to_windows)
          memcpy(win, tok, (size_t)C * sizeof(float));
        else
          memcpy(tok, win, (size_t)C * sizeof(float));
      }
    }
  }
}

void window_partition_cpu(float *windows, const float *tokens, int B, int H, int W, int C, int wh,
                          int ww, int sh, int sw) {
  window_permute(windows, (float *)tokens, true, B, H, W, C, wh, ww, sh, sw);
}

void window_reverse_cpu(float *tokens, const float *windows, int B, int H, int W, int C, int wh,
                        int ww, int sh, int sw) {
  window_permute((float *)windows, tokens, false, B, H, W, C, wh, ww, sh, sw);
}

void relative_position_index(int *index, int wh, int ww) {
  int N = wh * ww;
  for (int i = 0; i < N; i++) {
    int ri = i / ww, ci = i % ww;
    for (int j = 0; j < N; j++) {
      int rj = j / ww, cj = j % ww;
      index[i * N + j] = (ri - rj + wh - 1) * (2 * ww - 1) + (ci - cj + ww - 1);
    }
  }
}

// Region of coordinate p (of the rolled map) along a dimension of the given size: the slices
// [0, size - win), [size - win, size - shift), [size - shift, size). A zero shift leaves one
// region (timm's slices would be empty or overlapping there).
static inline int shift_region(int p, int size, int win, int shift) {
  if (shift == 0) return 0;
  if (p < size - win) return 0;
  return p < size - shift ? 1 : 2;
}

void attention_mask_build(float *mask, int H, int W, int wh, int ww, int sh, int sw) {
  int nWh = H / wh, nWw = W / ww, N = wh * ww;
  for (int wi = 0; wi < nWh; wi++) {
    for (int wj = 0; wj < nWw; wj++) {
      float *m = mask + ((int64_t)wi * nWw + wj) * N * N;
      for (int i = 0; i < N; i++) {
        int label_i = shift_region(wi * wh + i / ww, H, wh, sh) * 3 +
                      shift_region(wj * ww + i % ww, W, ww, sw);
        for (int j = 0; j < N; j++) {
          int label_j = shift_region(wi * wh + j / ww, H, wh, sh) * 3 +
                        shift_region(wj * ww + j % ww, W, ww, sw);
          m[i * N + j] = label_i == label_j ? 0.0f : -100.0f;
        }
      }
    }
  }
}
