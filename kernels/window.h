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
#ifdef SWIN_HAVE_CUDA
#include <cuda_runtime.h>  // outside the extern "C" block: it declares C++ templates
#endif

#ifdef __cplusplus
extern "C" {
#endif

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

#ifdef SWIN_HAVE_CUDA
// CUDA forms of the two permutations: same parameters, device pointers, launched on `stream`
// (no synchronization). tokens and windows must not overlap. One thread moves one C-vector
// chunk (16 bytes when C % 4 == 0 and both pointers are 16-byte aligned, else one float), so
// accesses are coalesced over C. Limit: B*H*W tokens < 2^31 (element offsets are 64-bit).
//
// relative_position_index and attention_mask_build have no CUDA form: they depend only on the
// geometry, so the caller builds them once on the host and uploads the results.
void window_partition_cuda(float *windows, const float *tokens, int B, int H, int W, int C, int wh,
                           int ww, int sh, int sw, cudaStream_t stream);
void window_reverse_cuda(float *tokens, const float *windows, int B, int H, int W, int C, int wh,
                         int ww, int sh, int sw, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
