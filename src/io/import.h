// import.h: weights in and out of swin.c in the layouts the PyTorch ecosystem uses.
//
// Export writes a flat timm state dict (timm names, no buffers) as safetensors in f32, bf16 or
// f16, loadable by timm.create_model(...).load_state_dict(strict=True). Import reads timm-layout
// or official-layout (downsample at the end of stages 0..2, head.{weight,bias}) safetensors in
// any of those dtypes, or a swin.c checkpoint's weights (its optimizer moments are skipped);
// buffers (relative_position_index, attn_mask) are ignored. A different
// class count replaces the head (kept at its fresh initialization) with a printed notice; a
// relative-position bias table of another window size is resized (bias_table_resize) with a
// notice per tensor; any other missing, extra or misshapen tensor is an error that names it.
#pragma once
#include <stdio.h>

#include "src/base/config.h"
#include "src/base/tensor.h"
#include "src/base/util.h"
#include "src/io/safetensors.h"
#include "src/model/model.h"

int import_weights(Model *m, const char *path, FILE *log, Error *err);

// Resizes a relative-position bias table: per head, the (sh x sw, heads) table (row y * sw + x)
// as an sh x sw image resized to dh x dw as PyTorch's interpolate(mode='bicubic',
// align_corners=False) does: Keys' cubic with A = -0.75, source coordinate
// (i + 0.5) * s / d - 0.5, taps clamped at the border; the official load_pretrained's resize.
void bias_table_resize(const float *src, int sh, int sw, float *dst, int dh, int dw, int heads);
// Writes m's weights to path as a timm state dict in dtype, with metadata "swin.config" (m's
// config as INI text) and, when class_names is not NULL, "swin.class_names" (the names joined
// with '\n', as a checkpoint's "class_names"): swin_predict reads both.
int export_weights(const Model *m, const char *path, DType dtype, const char *class_names,
                   Error *err);

// swin_predict's input: tensor "input", F32 (B, img_h, img_w, in_chans), channels-last,
// normalized, 1 <= B <= INPUT_BATCH_MAX. Sets *input or fails naming the file and the shape wanted.
#define INPUT_BATCH_MAX 65536
int import_input_batch(const SafeTensors *st, const Config *cfg, const SafeTensorEntry **input,
                       Error *err);
