// model.h: a Swin Transformer built from a Config: its geometry, its parameters (timm names,
// one flat fp32 buffer in forward order), its saved activations, and the forward and backward,
// written once against the backend interface (src/model/backend.h), so the same code runs on the
// CPU reference kernels and on CUDA.
//
// Geometry follows timm >= 0.9 / the official code: patch embedding (conv p x p / p as gather +
// linear) + LN; stages of blocks, patch merging at the start of stages 1..; final LN, mean pool
// over tokens and a linear head. Inside a stage each side's window is min(side, window_size); odd
// blocks shift by window_size / 2 along a side only when that side is larger than the window.
//
// model.version picks the block. V1 (SwinTransformer): pre-norm, x += attn(LN1(x)), x +=
// mlp(LN2(x)); attention softmax(q k^T / sqrt(hd) + table[index] + mask) v with a learned bias
// table; merging gathers 2x2, normalizes, then reduces. V2 (SwinTransformerV2): res-post-norm,
// x += LN1(attn(x)), x += LN2(mlp(x)); scaled cosine attention, normalize(q) normalize(k)^T
// exp(min(logit_scale, ln 100)) + 16 sigmoid(cpb_mlp(coords))[index] + mask, with q and v biases
// (no k bias); merging gathers 2x2, reduces, then normalizes (kernels/cosine_attention.h).
//
// Parameters live in one buffer laid out in forward order, so the gradients backward produces
// fill the mirror buffer from its end towards its start: gradient buckets are contiguous ranges.
// Each tensor starts at a multiple of MODEL_PARAM_ALIGN floats (the gaps stay zero), so every
// weight a GEMM reads is 512-byte aligned in f32 and 256-byte aligned in bf16/f16 (the largest
// alignment cuBLASLt's algorithm choice distinguishes), at a cost of under 128 floats a tensor.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "src/base/config.h"
#include "src/base/tensor.h"
#include "src/base/util.h"
#include "src/model/backend.h"

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
  int *index_be;    // rel_index and mask in backend memory (NULL without a backend)
  float *mask_be;
  // V2: the continuous position bias's input, (cpb_rows = (2wh-1)(2ww-1), 2) log-spaced relative
  // coordinates normalized by the pretrained window (model.pretrained_window_sizes) or this one.
  int cpb_rows;
  float *cpb_coords, *cpb_coords_be;
} StageGeom;

#define MODEL_PARAM_ALIGN 128

typedef struct {
  float *norm1_w, *norm1_b;  // (C)
  float *qkv_w, *qkv_b;      // (3C, C), (3C) or NULL without qkv_bias (V1)
  float *rel_table;          // ((2wh-1)(2ww-1), heads) (V1)
  // V2: q and v biases (C each, NULL without qkv_bias), the per-head logit scale (heads, 1, 1),
  // the position-bias MLP Linear(2, 512) (512, 2) + (512) -> ReLU -> Linear(512, heads) (heads,
  // 512).
  float *q_bias, *v_bias, *logit_scale;
  float *cpb_w1, *cpb_b1, *cpb_w2;
  float *proj_w, *proj_b;    // (C, C), (C)
  float *norm2_w, *norm2_b;  // (C)
  float *fc1_w, *fc1_b;      // (hidden, C), (hidden)
  float *fc2_w, *fc2_b;      // (C, hidden), (C)
} BlockWeights;

// Typed pointers into a flat buffer (the parameters, or their gradients: same offsets).
typedef struct {
  float *patch_w, *patch_b;            // (E, Cin*p*p) = conv (E, Cin, p, p), (E)
  float *patch_norm_w, *patch_norm_b;  // (E)
  // Patch merging of stage s (width C = 2 * the previous width): V1 normalizes the 2C = 4
  // previous-width channels of each 2x2 neighbourhood, then reduces them 2C -> C without bias;
  // V2 reduces, then normalizes the C channels.
  float *merge_norm_w[CONFIG_MAX_STAGES], *merge_norm_b[CONFIG_MAX_STAGES];  // V1 (2C), V2 (C)
  float *merge_w[CONFIG_MAX_STAGES];                                         // (C, 2C)
  BlockWeights *blocks;    // one per block, stages in order
  float *norm_w, *norm_b;  // (C_last)
  float *head_w, *head_b;  // (classes, C_last), (classes)
} Weights;

// How model_init_weights initializes a parameter (the official / timm scheme).
typedef enum {
  PARAM_INIT_TRUNC_NORMAL,  // N(0, 0.02) cut at +-2: linear weights, bias tables, the head
  PARAM_INIT_ZERO,          // biases, LayerNorm biases
  PARAM_INIT_ONE,           // LayerNorm weights
  PARAM_INIT_CONV_UNIFORM,  // PyTorch's Conv2d default, U(+-1/sqrt(fan_in)): the patch conv
  PARAM_INIT_LOG_TEN,       // ln 10: V2's logit scale
} ParamInit;

// One row of the parameter table. The tensor is the description: timm's state-dict name, F32
// and the shape, with t.data NULL; model_param_view gives the same tensor over a flat buffer
// (weights, gradients, moments: all share the offsets).
typedef struct {
  Tensor t;
  int64_t offset;  // floats from the start of the buffer (a multiple of MODEL_PARAM_ALIGN)
  bool decay;      // weight decay applies (not for 1-D params, biases, bias tables)
  ParamInit init;
  int layer_id;  // train.layer_decay's depth, 0 (patch embedding) .. num_blocks + 1 (model.c)
} Param;

// Per-block saved activations of the training forward (views in the activation arena, backend
// memory). `act` tensors are in the compute type; statistics and scales are f32. What is cheaper
// to recompute than to keep is not kept: the LayerNorm outputs (from their input and saved
// statistics: the recomputation is deterministic, so it writes the same bits) and the GELU
// output (from its input) are rebuilt in the backward in shared buffers (Activations).
//
// Activation checkpointing (train.recompute): a recomputed block keeps only x, its input on the
// residual stream (its drop-path scales live in drop_scales for every block). Its other views
// point into Activations.rebuilt, one set shared by every recomputed block, which the forward
// writes in passing and the backward fills again, right before the block's backward, by running
// the block's forward once more from x: the same ops on the same inputs, so the same bits. The
// LayerNorm statistics are not kept either: the LayerNorm that rebuilds LN1's windows (and the
// attention residual's LN2) computes them anyway.
//
// A V2 block keeps: xw, its input in its window order (B*nW, N, C) act (qkv's input; x is
// unused); qkv after cosine_qk_forward (normalized and scaled q, k, biased v); qk_norms; att;
// attn_out; proj, the attention branch (B*nW, N, C) act, LN1's input (ln1_* its statistics, in
// token order); x1; fc1; fc2, the MLP branch (B, L, C) act, LN2's input (ln2_*); the position
// bias table cpb_table (cpb_rows, heads) f32 and the MLP's hidden layer cpb_hidden (cpb_rows,
// 512) f32 it came from.
typedef struct {
  void *x;                     // block input (B, L, C) act: LN1's input (V1)
  float *ln1_mean, *ln1_rstd;  // (B*L)
  void *qkv;                   // (B*nW, N, 3C) act
  float *att;                  // what the backend saves of the softmax (attention_saved_floats)
  void *attn_out;              // (B*nW, N, C) act
  void *x1;                    // after the attention residual (B, L, C) act: LN2's input
  float *ln2_mean, *ln2_rstd;  // (B*L)
  void *fc1;                   // pre-GELU (B, L, hidden) act
  float *dp_attn, *dp_mlp;     // drop-path scales (B), NULL when the block's rate is 0
  // V2 only (above)
  void *xw, *proj, *fc2;
  float *qk_norms;  // (B*nW*N, 2, heads): |q| and |k| before normalization
  float *cpb_table, *cpb_hidden;
} BlockActs;

typedef struct {
  void *patches;  // (B, Hp, Wp, Cin*p*p) act
  void *pe;       // patch linear output (B, L0, E) act: the patch LayerNorm's input
  float *pe_mean, *pe_rstd;
  // V1: merged 2x2 + LayerNorm (B, L_s, 4C_{s-1}) act; V2: merged 2x2 (the same shape), whose
  // reduction merge_red (B, L_s, C_s) act is what the LayerNorm (merge_mean, merge_rstd) reads.
  void *merge_ln[CONFIG_MAX_STAGES], *merge_red[CONFIG_MAX_STAGES];
  float *merge_mean[CONFIG_MAX_STAGES], *merge_rstd[CONFIG_MAX_STAGES];
  BlockActs *blocks;
  void *stage_out[CONFIG_MAX_STAGES];  // each stage's output (B, L_s, C_s) act
  float *norm_mean, *norm_rstd;
  void *norm_out;      // final LayerNorm output (B, L, C) act
  float *pooled;       // (B, C_last)
  float *logits;       // (B, classes)
  float *drop_scales;  // (2 * blocks, B): the blocks' dp_attn and dp_mlp
  // The saved-activation views every recomputed block points to (x unused): one set, each
  // buffer flat and sized for the largest stage that has a recomputed block; NULL without.
  BlockActs rebuilt;
  // Short-lived buffers, reused by every block.
  void *xw;        // LN1 output in window order (B*nW, N, C) act, forward and recomputed
  void *ln2;       // LN2 output (B, L, C) act, forward and recomputed
  void *hidden;    // GELU output (B, L, hidden) act, forward and recomputed, for the MLPs whose
                   // ops store it (mlp_hidden_elements not 0); NULL when no MLP's ops do
  void *branch;    // a branch output waiting for its residual add: proj (windows) or fc2 (B, L, C)
  float *dres;     // gradient of the residual stream (B, L, C) f32
  void *dbranch;   // gradient of a branch output or of a block input (B, L, C) act
  void *dln;       // gradient of a LayerNorm output (B, L, C) act
  void *dattn;     // gradient of the attention output (B, L, C) act
  void *dhidden;   // gradient of the MLP hidden layer (B, L, hidden) act
  void *dqkv;      // (B, L, 3C) act
  float *dlogits;  // (B, classes)
  // V2: the residual stream between the stage input, the blocks' x1 and their outputs (B, L, C)
  // act, and the gradient of a block's position-bias table (cpb_rows, heads) f32.
  void *stream;
  float *dtable;
} Activations;

typedef struct {
  Config cfg;
  Backend *be;  // where the parameters, gradients and activations live; NULL: host weights only
  int num_stages, num_blocks;
  int Hp, Wp, patch_dim;  // token map after patch embedding, Cin*p*p
  StageGeom stages[CONFIG_MAX_STAGES];
  float *block_drop;  // drop-path rate per block (linear from 0 to drop_path_rate), host
  float *block_drop_be;
  // Activation checkpointing (train.recompute): per block (host), whether it keeps only its
  // input and runs its forward again in the backward (BlockActs).
  bool *block_recompute;
  int num_recomputed;

  Param *params;
  int num_params;
  int64_t num_values;  // parameter count (the sum of the tensors' sizes)
  int64_t num_floats;  // length of the flat buffers (with the alignment gaps)
  float *weights;      // host fp32 master weights: init, import, checkpoints (num_floats)
  float *master;       // backend fp32 master weights (== weights on the CPU backend)
  void *compute;       // backend weights in the compute type (== master in f32)
  float *grads;        // backend gradients (num_floats)
  Weights w, g;        // typed views of master and grads

  int max_batch;
  bool drop_path_active;  // the last forward drew drop-path scales (training)
  // Called by model_backward (with report) each time every gradient at float offset >=
  // lowest_offset is final for this backward: after each block, after each patch merging, and
  // last with 0. A data-parallel trainer starts reducing the gradient buckets above that offset
  // while backward goes on below it (dist/reducer.h). NULL: never called.
  void (*grads_ready)(void *ctx, int64_t lowest_offset);
  void *grads_ready_ctx;
  Arena acts_arena;
  size_t acts_saved_bytes;  // what recompute saves of the activation arena (0 without)
  Activations acts;
  // The activation table: every buffer of acts as a tensor (name, dtype, shape, its memory in
  // acts_arena), in the order planned; the shared buffers are flat. NULL without a backend.
  Tensor *act_table;
  int num_acts;
} Model;

// Builds geometry and the parameter table. With a backend, also allocates in its memory the
// master weights, their compute copy, the gradients and the activations for up to max_batch
// images (max_batch >= 1), and registers every one of those tensors (per parameter, per
// activation row) and the geometry tables with the backend's op checks
// (src/model/backend_check.h); model_destroy unregisters them. be NULL: host weights only (dry
// run, export, import checks).
// cfg must have passed config_validate.
int model_create(Model *m, const Config *cfg, Backend *be, int max_batch, Error *err);
void model_destroy(Model *m);
// Official / timm initialization of the host weights, from the counter-based RNG keyed by seed.
void model_init_weights(Model *m, uint64_t seed);
// Copies the host weights to the backend (master and compute copy) after init, import or a
// checkpoint load; and the backend master back to the host (before a checkpoint or export).
void model_weights_to_backend(Model *m);
void model_weights_to_host(Model *m);
// Backend gradients to a host buffer of num_floats (waits for queued work).
void model_grads_to_host(const Model *m, float *dst);
// A master-weight pointer's counterpart in the compute copy.
const void *model_compute_weight(const Model *m, const float *master);

// The normalization of uint8 input for cfg: data.mean / data.std per input channel (one value
// given applies to every channel); what training, evaluation and swin_predict pass to
// model_forward with U8 images.
Normalize model_input_normalize(const Config *cfg);
// Forward over B <= max_batch images input (B, H, W, Cin) in backend memory: uint8 pixels
// (input_dtype U8, normalized with norm) or normalized f32 images (F32; norm unused). Logits land
// in m->acts.logits. train enables drop path, keyed by (seed, step->step, step->first_sample +
// b), both read from backend memory (step: StepParams in backend memory, written by
// ops->step_params_set; unused and may be NULL when train is false). step->first_sample is the
// global index of image 0 in the step's batch (rank * B under data parallelism, plus the offset
// of a micro-batch; 0 in one process), so every rank and micro-batch draws what one process
// would for the same images in one batch. Eval uses no drop path. Queued on the backend; nothing
// waits.
void model_forward(Model *m, const void *input, DType input_dtype, Normalize norm, int B,
                   bool train, uint64_t seed, const StepParams *step);
// Backward of the last training forward from m->acts.dlogits (B, classes); accumulates into
// m->grads (zero them first with model_zero_grads; without zeroing, the gradients of several
// micro-batches add up). With report, tells m->grads_ready of the finished gradients as it goes:
// false for the micro-batches of a step before its last, whose sums are not final yet.
void model_backward(Model *m, int B, bool report);
void model_zero_grads(Model *m);

// Floating-point operations of one training step (forward + backward) on B images, counting
// the matrix products only (linear layers, q k^T and P v): 2 per multiply-add, and the backward
// as twice the forward (the input and the weight gradient of every product), plus V2's
// position-bias MLP once per block (whatever B). Elementwise work,
// LayerNorm and softmax are not counted. The basis of the benchmark's MFU.
double model_train_flops(const Model *m, int B);

// Layer-wise learning-rate decay (train.layer_decay): the factor on the learning rate of
// parameters with layer id `layer_id`, layer_decay^(num_blocks + 1 - layer_id) (computed in
// double, rounded to float); 1 for every id when layer_decay is 1.
float model_layer_lr_scale(const Model *m, int layer_id, float layer_decay);
// The AdamW chunk table (optim/optimizer.h): every tensor cut into pieces of at most
// MODEL_ADAMW_CHUNK elements, with weight_decay where Param.decay and 0 elsewhere, and the
// lr_scale of the tensor's layer id (model_layer_lr_scale). Returns the number of chunks;
// chunks NULL only counts.
#define MODEL_ADAMW_CHUNK 16384
int model_adamw_chunks(const Model *m, float weight_decay, float layer_decay, AdamWChunk *chunks);
// Looks a parameter up by timm name; NULL if absent.
const Param *model_find_param(const Model *m, const char *name);
// Parameter i as a tensor over the flat host buffer base (num_floats: weights, moments).
Tensor model_param_view(const Model *m, int i, const float *base);
// Prints the per-stage table, the parameter count and what train.recompute rebuilds.
void model_print_summary(const Model *m, FILE *out);
// What train.recompute makes of this model, for the start-up lines: "none", or which blocks,
// how many of them, what they keep and what it saves.
void model_describe_recompute(const Model *m, char *buf, size_t size);
// Bytes of backend memory the model holds: weights (master + compute copy), gradients,
// activations (with recompute's savings: acts_saved_bytes).
void model_memory(const Model *m, size_t *weights, size_t *grads, size_t *activations);
