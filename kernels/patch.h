// patch.h: the two gathers that reshape Swin's feature maps (patch embedding, patch merging),
// patch merging fused with its LayerNorm, and the normalization of the uint8 input batch.
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
#include "src/base/tensor.h"
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

// Patch merging with its LayerNorm over the 4C merged channels, as one op:
//   out (B, H/2, W/2, 4C) = LN(merge(tokens)); mean, rstd (B*H/2*W/2) saved.
// The backward recomputes the gather from tokens: dtokens (B, H, W, C) overwritten from
// dout (B, H/2, W/2, 4C); dweight, dbias (4C) accumulated.
// scratch: 2 * B*H*W*C floats (the CPU composes gather, LayerNorm and scatter).
void merge_layernorm_forward_cpu(float *out, float *mean, float *rstd, const float *tokens,
                                 const float *weight, const float *bias, int B, int H, int W, int C,
                                 float *scratch);
void merge_layernorm_backward_cpu(float *dtokens, float *dweight, float *dbias, const float *dout,
                                  const float *tokens, const float *weight, const float *mean,
                                  const float *rstd, int B, int H, int W, int C, float *scratch);

#ifdef SWIN_HAVE_CUDA
// CUDA forms (device pointers, launched on `stream` without synchronization; outputs of element
// type dt, F32, BF16 or F16):
// The patch-embedding input in one pass: patches (B, H/p, W/p, Cin*p*p) gathered from input
// (B, H, W, Cin), uint8 pixels normalized as images_normalize_cpu does (input_dtype U8; mean,
// std are host arrays of Cin <= 4 values) or normalized f32 images (F32: mean, std unused).
void patch_embed_input_cuda(DType dt, void *patches, const void *input, DType input_dtype,
                            const float *mean, const float *std, int B, int H, int W, int Cin,
                            int p, cudaStream_t stream);
// pixels (B, H, W, Cin) uint8 -> images (B, H, W, Cin) f32, the arithmetic of
// images_normalize_cpu (mean, std: host arrays of Cin <= 4 values).
void images_normalize_cuda(float *images, const uint8_t *pixels, int64_t B, int H, int W, int Cin,
                           const float *mean, const float *std, cudaStream_t stream);
// The plain patch merge (Swin V2, which normalizes after the reduction): merged (B, H/2, W/2, 4C)
// from tokens (B, H, W, C), both of type dt; the backward overwrites dtokens (B, H, W, C, f32) in
// full from dmerged (dt), with zeros for an odd map's last row or column, as the CPU does.
void patch_merge_forward_cuda(DType dt, void *merged, const void *tokens, int B, int H, int W,
                              int C, cudaStream_t stream);
void patch_merge_backward_cuda(DType dt, float *dtokens, const void *dmerged, int B, int H, int W,
                               int C, cudaStream_t stream);
// Patch merging + LayerNorm (the gather folded into the LayerNorm's loads; H and W even): out,
// tokens, dout of type dt; dtokens (f32) overwritten in full; statistics in f32 as in
// kernels/layernorm.h; scratch: merge_layernorm_backward_cuda_scratch floats, fixed-order
// parameter-gradient sums.
void merge_layernorm_forward_cuda(DType dt, void *out, float *mean, float *rstd, const void *tokens,
                                  const float *weight, const float *bias, int B, int H, int W,
                                  int C, cudaStream_t stream);
int64_t merge_layernorm_backward_cuda_scratch(int B, int H, int W, int C);
void merge_layernorm_backward_cuda(DType dt, float *dtokens, float *dweight, float *dbias,
                                   const void *dout, const void *tokens, const float *weight,
                                   const float *mean, const float *rstd, int B, int H, int W, int C,
                                   float *scratch, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
