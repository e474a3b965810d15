// model.h: a Swin Transformer built from a Config: its geometry, its parameters (timm names,
// one flat fp32 buffer in forward order), its saved activations, and the CPU forward and backward.
//
// Geometry follows timm >= 0.9 / the official code: patch embedding (conv p x p / p as gather +
// linear) + LN; stages of blocks, patch merging at the start of stages 1..; final LN, mean pool
// over tokens and a linear head. Inside a stage each side's window is min(side, window_size); odd
// blocks shift by window_size / 2 along a side only when that side is larger than the window.
//
// Parameters live in one buffer laid out in forward order, so the gradients backward produces
// fill the mirror buffer from its end towards its start: gradient buckets are contiguous ranges.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "src/config.h"
#include "src/tensor.h"
#include "src/util.h"

typedef struct {
  int H, W;  // token map (tokens per side) inside the stage
  int C;     // width
  int depth, heads, head_dim, hidden;
  int wh, ww;       // window sides
  int sh, sw;       // shift of the odd blocks
  int nW, N;        // windows per image, tokens per window
  bool merge;       // patch merging at the stage start (stages 1..)
  int first_block;  // global index of the stage's first block
  int *rel_index;   // (N, N)
  float *mask;      // (nW, N, N) for shifted blocks, NULL when the stage never shifts
} StageGeom;

typedef struct {
  float *norm1_w, *norm1_b;  // (C)
  float *qkv_w, *qkv_b;      // (3C, C), (3C) or NULL without qkv_bias
  float *rel_table;          // ((2wh-1)(2ww-1), heads)
  float *proj_w, *proj_b;    // (C, C), (C)
  float *norm2_w, *norm2_b;  // (C)
  float *fc1_w, *fc1_b;      // (hidden, C), (hidden)
  float *fc2_w, *fc2_b;      // (C, hidden), (C)
} BlockWeights;

// Typed pointers into a flat buffer (the parameters, or their gradients: same offsets).
typedef struct {
  float *patch_w, *patch_b;            // (E, Cin*p*p) = conv (E, Cin, p, p), (E)
  float *patch_norm_w, *patch_norm_b;  // (E)
  // Patch merging of stage s (width C = 2 * the previous width): LayerNorm over the 2C = 4
  // previous-width channels of each 2x2 neighbourhood, then a linear 2C -> C without bias.
  float *merge_norm_w[CONFIG_MAX_STAGES], *merge_norm_b[CONFIG_MAX_STAGES];  // (2C)
  float *merge_w[CONFIG_MAX_STAGES];                                         // (C, 2C)
  BlockWeights *blocks;    // one per block, stages in order
  float *norm_w, *norm_b;  // (C_last)
  float *head_w, *head_b;  // (classes, C_last), (classes)
} Weights;

typedef struct {
  char name[96];  // timm state-dict name
  int ndim;
  int64_t shape[4];
  int64_t offset;  // floats from the start of the buffer
  int64_t numel;
  bool decay;  // weight decay applies (not for 1-D params, biases, bias tables)
} ParamInfo;

// Per-block saved activations of the training forward (views in the activation arena).
typedef struct {
  float *x;                    // block input (B, L, C)
  float *ln1_mean, *ln1_rstd;  // (B*L)
  float *xw;                   // LN1 output, shifted and partitioned (B*nW, N, C)
  float *qkv;                  // (B*nW, N, 3C)
  float *att;                  // softmax probabilities (B*nW, heads, N, N)
  float *attn_out;             // (B*nW, N, C)
  float *x1;                   // after the attention residual (B, L, C)
  float *ln2_mean, *ln2_rstd;  // (B*L)
  float *ln2;                  // (B, L, C)
  float *fc1;                  // pre-GELU (B, L, hidden)
  float *gelu;                 // (B, L, hidden)
  float *dp_attn, *dp_mlp;     // drop-path scales (B), NULL when the block's rate is 0
} BlockActs;

typedef struct {
  float *images;   // (B, H, W, Cin) normalized input buffer for the caller
  float *patches;  // (B, Hp, Wp, Cin*p*p)
  float *pe;       // patch linear output (B, L0, E)
  float *pe_mean, *pe_rstd;
  float *merged[CONFIG_MAX_STAGES];  // gathered 2x2 (B, L_s, 4C_{s-1})
  float *merge_mean[CONFIG_MAX_STAGES], *merge_rstd[CONFIG_MAX_STAGES];
  float *merge_ln[CONFIG_MAX_STAGES];
  BlockActs *blocks;
  float *stage_out[CONFIG_MAX_STAGES];  // each stage's last block output (B, L_s, C_s)
  float *norm_mean, *norm_rstd, *norm_out;
  float *pooled;  // (B, C_last)
  float *logits;  // (B, classes)
  // scratch (the forward borrows dtmp and dwin for short-lived intermediates)
  float *dres, *dtmp, *dwin;  // (B, L, C) at the largest stage
  float *dbig;                // (B, L, max(hidden, 4C))
  float *dqkv;                // (B, L, 3C)
} Activations;

typedef struct {
  Config cfg;
  int num_stages, num_blocks;
  int Hp, Wp, patch_dim;  // token map after patch embedding, Cin*p*p
  StageGeom stages[CONFIG_MAX_STAGES];
  float *block_drop;  // drop-path rate per block (linear from 0 to drop_path_rate)

  ParamInfo *params;
  int num_params;
  int64_t num_floats;  // total parameter count
  float *weights;      // fp32 master weights (num_floats)
  float *grads;        // gradients (num_floats)
  Weights w, g;        // typed views of weights and grads

  int max_batch;
  bool drop_path_active;  // the last forward drew drop-path scales (training)
  Arena acts_arena;
  Activations acts;
} Model;

// Builds geometry and the parameter table (and allocates weights, grads and the activations for
// up to max_batch images; 0 for weights only). cfg must have passed config_validate.
int model_create(Model *m, const Config *cfg, int max_batch, Error *err);
void model_destroy(Model *m);
// Official / timm initialization, drawn from the counter-based RNG keyed by seed.
void model_init_weights(Model *m, uint64_t seed);

// Forward over B <= max_batch normalized images (B, H, W, Cin) (images_normalize_cpu makes them
// from a uint8 batch; m->acts.images is a buffer of the right size); logits land in
// m->acts.logits. train enables drop path, keyed by (seed, step); eval uses none.
void model_forward(Model *m, const float *images, int B, bool train, uint64_t seed, int64_t step);
// Backward of the last training forward from dlogits (B, classes); accumulates into m->grads
// (zero them first with model_zero_grads).
void model_backward(Model *m, const float *dlogits, int B);
void model_zero_grads(Model *m);

// Looks a parameter up by timm name; NULL if absent.
const ParamInfo *model_find_param(const Model *m, const char *name);
// Prints the per-stage table and the parameter count.
void model_print_summary(const Model *m, FILE *out);
