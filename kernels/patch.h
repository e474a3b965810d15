// patch.h: the two gathers that reshape Swin's feature maps.
//
// Patch embedding is a p x p / stride p convolution; with non-overlapping patches it is a gather
// of each patch into a row followed by a linear layer whose weight is the conv weight
// (E, Cin, p, p) seen as (E, Cin*p*p).
//   images (B, H, W, Cin) channels-last -> patches (B, H/p, W/p, Cin*p*p),
//   column c*p*p + i*p + j = images[b][y*p + i][x*p + j][c].
// The image needs no gradient, so the gather has no backward.
//
// Patch merging halves the map and stacks each 2x2 neighbourhood on channels in timm's order:
//   tokens (B, H, W, C) -> merged (B, H/2, W/2, 4C),
//   merged[b][y][x][k*C + c] = tokens[b][2y + dy_k][2x + dx_k][c],
//   (dy, dx) = (0,0), (1,0), (0,1), (1,1) for k = 0..3.
#pragma once
#include <stdint.h>
#ifdef SWIN_HAVE_CUDA
#include <cuda_runtime.h>  // outside the extern "C" block: it declares C++ templates
#endif

#ifdef __cplusplus
extern "C" {
#endif

void patch_gather_cpu(float *patches, const float *images, int B, int H, int W, int Cin, int p);

void patch_merge_forward_cpu(float *merged, const float *tokens, int B, int H, int W, int C);
// dtokens (B, H, W, C) overwritten from dmerged (B, H/2, W/2, 4C).
void patch_merge_backward_cpu(float *dtokens, const float *dmerged, int B, int H, int W, int C);

// Batches travel as uint8 and are normalized where they are consumed:
//   images[b][y][x][c] = (pixels[b][y][x][c] / 255 - mean[c]) / std[c], both (B, H, W, Cin).
void images_normalize_cpu(float *images, const uint8_t *pixels, int64_t B, int H, int W, int Cin,
                          const float *mean, const float *std);

#ifdef SWIN_HAVE_CUDA
// CUDA forms: same parameters, device pointers (mean and std too: (Cin) floats the caller
// uploads once), launched on `stream` without synchronization; inputs and outputs must not
// overlap. Gather and merge copy whole rows with the threads of a row striding over it (16-byte
// chunks for merging when C % 4 == 0 and the pointers are 16-byte aligned), so both sides are
// coalesced. Limit for gather and merge: B*H*W (pixels or tokens) < 2^31; element offsets are
// 64-bit everywhere.
void patch_gather_cuda(float *patches, const float *images, int B, int H, int W, int Cin, int p,
                       cudaStream_t stream);
void patch_merge_forward_cuda(float *merged, const float *tokens, int B, int H, int W, int C,
                              cudaStream_t stream);
// As on the CPU, dtokens is overwritten in full: with odd H or W the last row/column gets 0.
void patch_merge_backward_cuda(float *dtokens, const float *dmerged, int B, int H, int W, int C,
                               cudaStream_t stream);
// pixels (B, H, W, Cin) uint8 on the device -> images (B, H, W, Cin), the same fp32 arithmetic.
void images_normalize_cuda(float *images, const uint8_t *pixels, int64_t B, int H, int W, int Cin,
                           const float *mean, const float *std, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
