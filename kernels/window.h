// window.h: cyclic shift + window partition, and its reverse, on channels-last tokens.
//
// A stage's feature map is tokens (B, H, W, C). Windows are wh x ww rectangles (wh = min(H,
// window_size), likewise ww; see window_geometry in src/model.h); shifted blocks roll the map by
// (-sh, -sw) before partitioning (torch.roll(x, (-sh, -sw), (1, 2))), so shifted[i][j] =
// x[(i + sh) % H][(j + sw) % W]. Window w = (wi * (W / ww) + wj) for windows row wi, column wj;
// inside a window, token t = r * ww + c. Windows of all images are stacked:
// windows (B * nW, wh * ww, C) with nW = (H / wh) * (W / ww), image-major.
//
// Both maps are permutations, so each one's backward is the other one.
#pragma once
#include <stdint.h>

#include "src/hostdev.h"

#ifdef __cplusplus
extern "C" {
#endif

// The window order of one stage's map, for ops that read or write tokens in it directly (the
// fused residual + LayerNorm ops fold partition and reverse into their loads and stores).
typedef struct {
  int H, W;    // map
  int wh, ww;  // window
  int sh, sw;  // cyclic shift (0 for unshifted blocks)
} WindowMap;

// Row of token (b, y, x) in the windows (B * nW, wh * ww) of map m: the token sits at
// ((y - sh) mod H, (x - sw) mod W) of the rolled map, i.e. in window (i / wh, j / ww) at (i % wh,
// j % ww). Partition writes that row from token (b, y, x); reverse reads it back.
static inline SWIN_HOSTDEV int64_t window_row(const WindowMap *m, int64_t b, int y, int x) {
  int i = y - m->sh, j = x - m->sw;
  if (i < 0) i += m->H;
  if (j < 0) j += m->W;
  int nWw = m->W / m->ww;
  int64_t w = b * ((int64_t)(m->H / m->wh) * nWw) + (int64_t)(i / m->wh) * nWw + j / m->ww;
  return w * (m->wh * m->ww) + (i % m->wh) * m->ww + j % m->ww;
}

// windows (B*nW, wh*ww, C) <- tokens (B, H, W, C)
void window_partition_cpu(float *windows, const float *tokens, int B, int H, int W, int C, int wh,
                          int ww, int sh, int sw);
// tokens (B, H, W, C) <- windows (B*nW, wh*ww, C): un-partition, then roll by (+sh, +sw).
void window_reverse_cpu(float *tokens, const float *windows, int B, int H, int W, int C, int wh,
                        int ww, int sh, int sw);

// Relative position index (wh*ww, wh*ww) into the bias table ((2wh-1)*(2ww-1), heads):
//   index[i][j] = (ri - rj + wh - 1) * (2ww - 1) + (ci - cj + ww - 1).
void relative_position_index(int *index, int wh, int ww);

// Shift mask (nW, wh*ww, wh*ww): 0 where the two tokens of a shifted window belong to the same
// region, -100 where they do not (tokens the roll brought together from opposite edges). Regions
// are taken in rolled-map coordinates, as timm does: per dimension the slices [0, H-wh),
// [H-wh, H-sh), [H-sh, H) (likewise W), labelled row-region * 3 + column-region; a dimension
// with shift 0 has one region.
void attention_mask_build(float *mask, int H, int W, int wh, int ww, int sh, int sw);

// No CUDA forms: on the GPU the two permutations are folded into the loads and stores of the
// fused LayerNorm kernels (kernels/layernorm.h, through window_row), and the index and mask
// depend only on the geometry, so the model builds them once on the host and uploads them.

#ifdef __cplusplus
}
#endif
