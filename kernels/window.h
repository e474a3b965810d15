// window.h: cyclic shift + window partition, and its reverse, on channels-last tokens.
//
// A stage's feature map is tokens (B, H, W, C). Windows are wh x ww rectangles (wh = min(H,
// window_size), likewise ww; see build_geometry in src/model/model.c); shifted blocks roll the map
// by
// (-sh, -sw) before partitioning (torch.roll(x, (-sh, -sw), (1, 2))), so shifted[i][j] =
// x[(i + sh) % H][(j + sw) % W]. Window w = (wi * (W / ww) + wj) for windows row wi, column wj;
// inside a window, token t = r * ww + c. Windows of all images are stacked:
// windows (B * nW, wh * ww, C) with nW = (H / wh) * (W / ww), image-major.
//
// Both maps are permutations, so each one's backward is the other one.
#pragma once
#include <stdint.h>

#include "src/base/hostdev.h"

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

// Division of n < 2^31 by a divisor d >= 1 fixed ahead, as a multiply-high and a shift:
// mul = ceil(2^p / d) with p = 31 + ceil(log2 d), n / d = (n mul) >> p for every such n. For GPU
// kernels that divide every row index by runtime values (a real division is tens of
// instructions, a 64-bit one over a hundred); tests/test_window.c checks it against `/`.
typedef struct {
  uint32_t d, mul, shift;
} FastDiv;

static inline FastDiv fast_div_make(uint32_t d) {
  FastDiv f = {d, 0, 0};
  if (d <= 1) return f;
  int log2d = 0;
  while ((1ull << log2d) < d) log2d++;
  int p = 31 + log2d;
  f.mul = (uint32_t)(((1ull << p) + d - 1) / d);
  f.shift = (uint32_t)(p - 32);
  return f;
}

static inline SWIN_HOSTDEV uint32_t fast_div(FastDiv f, uint32_t n) {
#ifdef __CUDA_ARCH__
  uint32_t hi = __umulhi(n, f.mul);
#else
  uint32_t hi = (uint32_t)(((uint64_t)n * f.mul) >> 32);
#endif
  return f.d == 1 ? n : hi >> f.shift;
}

// window_row for token t = (b * H + y) * W + x of a stage with L = H * W tokens per image, with
// the divisions precomputed: for launches whose token indices and rows are below 2^31.
typedef struct {
  WindowMap m;
  FastDiv L, W, wh, ww;
  uint32_t nWh, nWw;  // windows per column and per row of the map
} WindowRows;

static inline WindowRows window_rows_make(const WindowMap *m) {
  WindowRows r;
  r.m = *m;
  r.L = fast_div_make((uint32_t)(m->H * m->W));
  r.W = fast_div_make((uint32_t)m->W);
  r.wh = fast_div_make((uint32_t)m->wh);
  r.ww = fast_div_make((uint32_t)m->ww);
  r.nWh = (uint32_t)(m->H / m->wh);
  r.nWw = (uint32_t)(m->W / m->ww);
  return r;
}

static inline SWIN_HOSTDEV uint32_t window_rows_row(const WindowRows *r, uint32_t t) {
  uint32_t b = fast_div(r->L, t), yx = t - b * r->L.d;
  uint32_t y = fast_div(r->W, yx), x = yx - y * r->W.d;
  int i = (int)y - r->m.sh, j = (int)x - r->m.sw;
  if (i < 0) i += r->m.H;
  if (j < 0) j += r->m.W;
  uint32_t wi = fast_div(r->wh, (uint32_t)i), wj = fast_div(r->ww, (uint32_t)j);
  uint32_t ri = (uint32_t)i - wi * r->wh.d, rj = (uint32_t)j - wj * r->ww.d;
  uint32_t w = (b * r->nWh + wi) * r->nWw + wj;
  return w * (r->wh.d * r->ww.d) + ri * r->ww.d + rj;
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
