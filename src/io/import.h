// import.h: weights in and out of swin.c in the layouts the PyTorch ecosystem uses.
//
// Export writes a flat timm state dict (timm names, no buffers) as safetensors in f32, bf16 or
// f16, loadable by timm.create_model(...).load_state_dict(strict=True). Import reads timm-layout
// or official-layout (downsample at the end of stages 0..2, head.{weight,bias}) safetensors in
// any of those dtypes; buffers (relative_position_index, attn_mask) are ignored. A different
// class count replaces the head (kept at its fresh initialization) with a printed notice; a
// missing, extra or misshapen tensor is an error that names it.
#pragma once
#include <stdio.h>

#include "src/base/config.h"
#include "src/base/tensor.h"
#include "src/base/util.h"
#include "src/io/safetensors.h"
#include "src/model/model.h"

int import_weights(Model *m, const char *path, FILE *log, Error *err);
int export_weights(const Model *m, const char *path, DType dtype, Error *err);

// swin_predict's input: tensor "input", F32 (B, img_h, img_w, in_chans), channels-last,
// normalized, 1 <= B <= INPUT_BATCH_MAX. Sets *input or fails naming the file and the shape wanted.
#define INPUT_BATCH_MAX 65536
int import_input_batch(const SafeTensors *st, const Config *cfg, const SafeTensorEntry **input,
                       Error *err);
