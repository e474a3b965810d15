// model.c: the Swin Transformer's geometry, parameter table, initialization, and the forward and
// backward that chain the backend's ops (src/model/backend.h) in the order of timm's
// SwinTransformer.
#include "src/model/model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/cosine_attention.h"
#include "kernels/window.h"
#include "src/base/nvtx.h"
#include "src/base/rng.h"
#include "src/model/backend_check.h"

// ---------------------------------------------------------------------------------------------
// Geometry

static int min_int(int a, int b) {
  return a < b ? a : b;
}

static void build_geometry(Model *m) {
  const Config *c = &m->cfg;
  m->num_stages = c->num_stages;
  m->Hp = c->img_h / c->patch_size;
  m->Wp = c->img_w / c->patch_size;
  m->patch_dim = c->in_chans * c->patch_size * c->patch_size;
  m->num_blocks = 0;
  for (int s = 0; s < m->num_stages; s++) {
    StageGeom *g = &m->stages[s];
    g->H = m->Hp >> s;
    g->W = m->Wp >> s;
    g->C = c->embed_dim << s;
    g->depth = c->depths[s];
    g->heads = c->num_heads[s];
    g->head_dim = g->C / g->heads;
    g->hidden = (int)((float)g->C * c->mlp_ratio);
    // A side no larger than the window becomes the window and is never shifted (timm).
    g->wh = min_int(g->H, c->window_size);
    g->ww = min_int(g->W, c->window_size);
    g->sh = g->H <= c->window_size ? 0 : c->window_size / 2;
    g->sw = g->W <= c->window_size ? 0 : c->window_size / 2;
    g->nW = (g->H / g->wh) * (g->W / g->ww);
    g->N = g->wh * g->ww;
    g->merge = s > 0;
    g->first_block = m->num_blocks;
    m->num_blocks += g->depth;
    g->rel_index = malloc_check(sizeof(int) * (size_t)g->N * (size_t)g->N);
    relative_position_index(g->rel_index, g->wh, g->ww);
    g->mask = NULL;
    if ((g->sh || g->sw) && g->depth > 1) {
      g->mask = malloc_check(sizeof(float) * (size_t)g->nW * (size_t)g->N * (size_t)g->N);
      attention_mask_build(g->mask, g->H, g->W, g->wh, g->ww, g->sh, g->sw);
    }
    g->cpb_rows = 0;
    g->cpb_coords = NULL;
    if (c->version == 2) {
      int pw = c->pretrained_windows[c->num_pretrained_windows == 1 ? 0 : s];
      g->cpb_rows = (2 * g->wh - 1) * (2 * g->ww - 1);
      g->cpb_coords = malloc_check(sizeof(float) * 2 * (size_t)g->cpb_rows);
      // config_validate refused the sides that divide by zero.
      if (cpb_coords_build(g->cpb_coords, g->wh, g->ww, pw, pw) != 0) abort();
    }
  }
  // Stochastic depth rate grows linearly over all blocks: linspace(0, rate, num_blocks).
  m->block_drop = malloc_check(sizeof(float) * (size_t)(m->num_blocks ? m->num_blocks : 1));
  for (int i = 0; i < m->num_blocks; i++)
    m->block_drop[i] =
        m->num_blocks > 1 ? (float)((double)c->drop_path_rate * i / (m->num_blocks - 1)) : 0.0f;
  // train.recompute: -1 every block, N the first N of each stage (all of a shallower one).
  m->block_recompute = calloc_check((size_t)(m->num_blocks ? m->num_blocks : 1), sizeof(bool));
  m->num_recomputed = 0;
  for (int s = 0; s < m->num_stages; s++)
    for (int j = 0; j < m->stages[s].depth; j++) {
      bool on = c->recompute < 0 || j < c->recompute;
      m->block_recompute[m->stages[s].first_block + j] = on;
      m->num_recomputed += on;
    }
}

static bool block_is_shifted(const StageGeom *g, int j) {
  return (j % 2 == 1) && (g->sh || g->sw);
}

// ---------------------------------------------------------------------------------------------
// Parameters: one walk over the model in forward order defines the table (names, shapes, decay,
// initialization)
// and binds typed pointers into any flat buffer with the same layout. It is the only place the
// order is written down.

typedef struct {
  Param *table;  // filled when non-NULL
  float *base;   // buffer being bound, or NULL
  int index;
  int64_t offset;  // next tensor's start (aligned)
  int64_t values;  // parameters so far
  int layer_id;    // of the tensors that follow (Param.layer_id)
} ParamWalk;

static float *param(ParamWalk *k, bool decay, ParamInit init, int ndim, const int64_t *shape,
                    const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static float *param(ParamWalk *k, bool decay, ParamInit init, int ndim, const int64_t *shape,
                    const char *fmt, ...) {
  int64_t numel = 1;
  for (int i = 0; i < ndim; i++) numel *= shape[i];
  if (k->table) {
    char name[TENSOR_NAME_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    k->table[k->index] = (Param){.t = tensor_view(NULL, DTYPE_F32, DEVICE_CPU, name, ndim, shape),
                                 .offset = k->offset,
                                 .decay = decay,
                                 .init = init,
                                 .layer_id = k->layer_id};
  }
  float *ptr = k->base ? k->base + k->offset : NULL;
  k->index++;
  k->values += numel;
  k->offset += (numel + MODEL_PARAM_ALIGN - 1) / MODEL_PARAM_ALIGN * MODEL_PARAM_ALIGN;
  return ptr;
}

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})
#define NDIM(...) ((int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))
// A weight matrix or table (decay and initialization as given) and a 1-D vector (never decayed).
#define PARAM(decay, init, ...) param(&k, decay, init, NDIM(__VA_ARGS__), SHAPE(__VA_ARGS__)
#define VEC(init, n, ...) param(&k, false, init, 1, SHAPE(n), __VA_ARGS__)
#define NORMAL PARAM_INIT_TRUNC_NORMAL
#define ZERO PARAM_INIT_ZERO
#define ONE PARAM_INIT_ONE
#define CONV PARAM_INIT_CONV_UNIFORM
#define LOG_TEN PARAM_INIT_LOG_TEN

// Layer ids (Param.layer_id, for train.layer_decay) are those of the official Swin code's
// layer-wise lr decay (get_swin_layer in microsoft/Swin-Transformer's optimizer.py, with which
// its fine-tuning builds the parameter groups; scale layer_decay^(L + 1 - id), L the number of
// blocks): the patch embedding is 0; block j of stage s is 1 + the number of blocks before it;
// a patch merging has the id of the block just before it (the official layout puts it at the
// end of the previous stage, layers.{s-1}.downsample, with id sum(depths[:s])); the final norm
// and the head, everything after the blocks, L + 1. timm's group_matcher for Swin (timm's
// layout, merging at the start of layers.{s}) numbers two groups otherwise: its merging shares
// the id of the stage's first block, and its final norm that of the last block.

// A V2 block's tensors, in timm's order. The position-bias MLP's weights and the logit scale
// take no weight decay, as the official code's no_weight_decay_keywords ("cpb_mlp",
// "logit_scale") say; the res-post-norms start at zero (timm's and the official
// _init_respostnorm), so every block starts as the identity.
#define BLK "layers.%d.blocks.%d."
static void walk_block_v2(ParamWalk *walk, BlockWeights *b, const StageGeom *g, bool qkv_bias,
                          int s, int j) {
  ParamWalk k = *walk;
  int64_t C = g->C, hidden = g->hidden, heads = g->heads;
  b->logit_scale = PARAM(false, LOG_TEN, heads, 1, 1), BLK "attn.logit_scale", s, j);
  b->q_bias = qkv_bias ? VEC(ZERO, C, BLK "attn.q_bias", s, j) : NULL;
  b->v_bias = qkv_bias ? VEC(ZERO, C, BLK "attn.v_bias", s, j) : NULL;
  b->cpb_w1 = PARAM(false, NORMAL, CPB_HIDDEN, 2), BLK "attn.cpb_mlp.0.weight", s, j);
  b->cpb_b1 = VEC(ZERO, CPB_HIDDEN, BLK "attn.cpb_mlp.0.bias", s, j);
  b->cpb_w2 = PARAM(false, NORMAL, heads, CPB_HIDDEN), BLK "attn.cpb_mlp.2.weight", s, j);
  b->qkv_w = PARAM(true, NORMAL, 3 * C, C), BLK "attn.qkv.weight", s, j);
  b->qkv_b = b->rel_table = NULL;
  b->proj_w = PARAM(true, NORMAL, C, C), BLK "attn.proj.weight", s, j);
  b->proj_b = VEC(ZERO, C, BLK "attn.proj.bias", s, j);
  b->norm1_w = VEC(ZERO, C, BLK "norm1.weight", s, j);
  b->norm1_b = VEC(ZERO, C, BLK "norm1.bias", s, j);
  b->fc1_w = PARAM(true, NORMAL, hidden, C), BLK "mlp.fc1.weight", s, j);
  b->fc1_b = VEC(ZERO, hidden, BLK "mlp.fc1.bias", s, j);
  b->fc2_w = PARAM(true, NORMAL, C, hidden), BLK "mlp.fc2.weight", s, j);
  b->fc2_b = VEC(ZERO, C, BLK "mlp.fc2.bias", s, j);
  b->norm2_w = VEC(ZERO, C, BLK "norm2.weight", s, j);
  b->norm2_b = VEC(ZERO, C, BLK "norm2.bias", s, j);
  *walk = k;
}

// Walks every parameter in forward order: fills table when non-NULL, binds w to base when both
// are non-NULL. Returns the number of parameter tensors; sets m->num_floats and m->num_values.
static int walk_params(Model *m, Param *table, Weights *w, float *base) {
  const Config *c = &m->cfg;
  ParamWalk k = {.table = table, .base = base, .layer_id = 0};
  Weights unused = {0};
  if (!w) w = &unused;
  int64_t E = c->embed_dim, p = c->patch_size;

  w->patch_w = PARAM(true, CONV, E, c->in_chans, p, p), "patch_embed.proj.weight");
  w->patch_b = VEC(CONV, E, "patch_embed.proj.bias");
  w->patch_norm_w = VEC(ONE, E, "patch_embed.norm.weight");
  w->patch_norm_b = VEC(ZERO, E, "patch_embed.norm.bias");
  for (int s = 0; s < m->num_stages; s++) {
    const StageGeom *g = &m->stages[s];
    int64_t C = g->C;
    if (g->merge && c->version == 2) {  // reduce, then normalize
      k.layer_id = g->first_block;
      w->merge_w[s] = PARAM(true, NORMAL, C, 2 * C), "layers.%d.downsample.reduction.weight", s);
      w->merge_norm_w[s] = VEC(ONE, C, "layers.%d.downsample.norm.weight", s);
      w->merge_norm_b[s] = VEC(ZERO, C, "layers.%d.downsample.norm.bias", s);
    } else if (g->merge) {
      int64_t C4 = 2 * C;           // 4 * previous width
      k.layer_id = g->first_block;  // the previous stage's last block
      w->merge_norm_w[s] = VEC(ONE, C4, "layers.%d.downsample.norm.weight", s);
      w->merge_norm_b[s] = VEC(ZERO, C4, "layers.%d.downsample.norm.bias", s);
      w->merge_w[s] = PARAM(true, NORMAL, C, C4), "layers.%d.downsample.reduction.weight", s);
    }
    for (int j = 0; j < g->depth; j++) {
      BlockWeights unused_block, *b = w->blocks ? &w->blocks[g->first_block + j] : &unused_block;
      int64_t table_rows = (int64_t)(2 * g->wh - 1) * (2 * g->ww - 1), hidden = g->hidden;
      k.layer_id = g->first_block + j + 1;
      if (c->version == 2) {
        walk_block_v2(&k, b, g, c->qkv_bias, s, j);
        continue;
      }
      b->norm1_w = VEC(ONE, C, BLK "norm1.weight", s, j);
      b->norm1_b = VEC(ZERO, C, BLK "norm1.bias", s, j);
      b->rel_table = PARAM(false, NORMAL, table_rows, g->heads), BLK "attn.relative_position_bias_table",
                           s, j);
      b->qkv_w = PARAM(true, NORMAL, 3 * C, C), BLK "attn.qkv.weight", s, j);
      b->qkv_b = c->qkv_bias ? VEC(ZERO, 3 * C, BLK "attn.qkv.bias", s, j) : NULL;
      b->proj_w = PARAM(true, NORMAL, C, C), BLK "attn.proj.weight", s, j);
      b->proj_b = VEC(ZERO, C, BLK "attn.proj.bias", s, j);
      b->norm2_w = VEC(ONE, C, BLK "norm2.weight", s, j);
      b->norm2_b = VEC(ZERO, C, BLK "norm2.bias", s, j);
      b->fc1_w = PARAM(true, NORMAL, hidden, C), BLK "mlp.fc1.weight", s, j);
      b->fc1_b = VEC(ZERO, hidden, BLK "mlp.fc1.bias", s, j);
      b->fc2_w = PARAM(true, NORMAL, C, hidden), BLK "mlp.fc2.weight", s, j);
      b->fc2_b = VEC(ZERO, C, BLK "mlp.fc2.bias", s, j);
    }
  }
  int64_t Cl = m->stages[m->num_stages - 1].C;
  k.layer_id = m->num_blocks + 1;
  w->norm_w = VEC(ONE, Cl, "norm.weight");
  w->norm_b = VEC(ZERO, Cl, "norm.bias");
  w->head_w = PARAM(true, NORMAL, c->num_classes, Cl), "head.fc.weight");
  w->head_b = VEC(ZERO, c->num_classes, "head.fc.bias");
  m->num_floats = k.offset;
  m->num_values = k.values;
  return k.index;
}
#undef BLK
#undef PARAM
#undef VEC
#undef NORMAL
#undef ZERO
#undef ONE
#undef CONV
#undef LOG_TEN

// ---------------------------------------------------------------------------------------------
// Activations: one plan assigns every saved tensor and scratch buffer; run once to count bytes
// (arena without memory) and once to hand out views in the backend's memory.

// Each planned buffer is also a row of the activation table (Model.act_table): its name, dtype,
// shape and, in the second pass, its memory. The counting pass only counts the rows.
typedef struct {
  Arena *arena;
  Model *m;
  int rows;
} ActPlan;

// Every buffer starts at a multiple of 256 bytes: the largest alignment cuBLASLt's algorithm
// choice distinguishes (kernels/cuda/gemm.cu keys its plans by it), so a GEMM over a recomputed
// block's shared buffers runs the algorithm it runs over the block's own (the same bits).
#define ACT_ALIGN 256

__attribute__((format(printf, 5, 6))) static void *plan_tensor(ActPlan *p, DType dtype, int ndim,
                                                               const int64_t *shape,
                                                               const char *fmt, ...) {
  Tensor t = tensor_view(NULL, dtype, p->m->be->device, NULL, ndim, shape);
  t.data = arena_alloc_aligned(p->arena, tensor_bytes(&t), ACT_ALIGN);
  if (p->m->act_table) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t.name, sizeof t.name, fmt, ap);
    va_end(ap);
    p->m->act_table[p->rows] = t;
  }
  p->rows++;
  return t.data;
}
// ACT / F32 (plan, (shape...), name format, its arguments...): a buffer in the compute type / f32.
#define ACT(p, shape, ...) plan_tensor(p, (p)->m->be->act, NDIM shape, SHAPE shape, __VA_ARGS__)
#define F32(p, shape, ...) plan_tensor(p, DTYPE_F32, NDIM shape, SHAPE shape, __VA_ARGS__)

// The saved activations of block j of stage s (all but x), in the arena or, for a recomputed
// block, as views of the shared set (bound in plan_activations).
static void plan_block(ActPlan *p, BlockActs *b, const StageGeom *g, int B, int s, int j) {
  int64_t L = (int64_t)g->H * g->W, BL = B * L, C = g->C;
  Backend *be = p->m->be;
  b->ln1_mean = F32(p, (BL), "layers.%d.blocks.%d.ln1_mean", s, j);
  b->ln1_rstd = F32(p, (BL), "layers.%d.blocks.%d.ln1_rstd", s, j);
  b->qkv = ACT(p, ((int64_t)B * g->nW, g->N, 3 * C), "layers.%d.blocks.%d.qkv", s, j);
  b->att = F32(p, (be->ops->attention_saved_floats(be, B * g->nW, g->N, g->C, g->heads)),
               "layers.%d.blocks.%d.attn_saved", s, j);
  b->attn_out = ACT(p, ((int64_t)B * g->nW, g->N, C), "layers.%d.blocks.%d.attn_out", s, j);
  b->x1 = ACT(p, (B, L, C), "layers.%d.blocks.%d.x1", s, j);
  b->ln2_mean = F32(p, (BL), "layers.%d.blocks.%d.ln2_mean", s, j);
  b->ln2_rstd = F32(p, (BL), "layers.%d.blocks.%d.ln2_rstd", s, j);
  b->fc1 = ACT(p, (B, L, g->hidden), "layers.%d.blocks.%d.fc1", s, j);
  // dp_attn and dp_mlp point into drop_scales at each training forward (bind_drop_scales).
}

// A V2 block's saved activations (BlockActs), all its own (V2 has no recompute).
static void plan_block_v2(ActPlan *p, BlockActs *b, const StageGeom *g, int B, int s, int j) {
  int64_t L = (int64_t)g->H * g->W, BL = B * L, C = g->C, BW = (int64_t)B * g->nW;
  Backend *be = p->m->be;
  b->xw = ACT(p, (BW, g->N, C), "layers.%d.blocks.%d.x_windows", s, j);
  b->qkv = ACT(p, (BW, g->N, 3 * C), "layers.%d.blocks.%d.qkv", s, j);
  b->qk_norms = F32(p, (BL, 2, g->heads), "layers.%d.blocks.%d.qk_norms", s, j);
  b->cpb_hidden = F32(p, (g->cpb_rows, CPB_HIDDEN), "layers.%d.blocks.%d.cpb_hidden", s, j);
  b->cpb_table = F32(p, (g->cpb_rows, g->heads), "layers.%d.blocks.%d.cpb_table", s, j);
  b->att = F32(p, (be->ops->attention_saved_floats(be, (int)BW, g->N, g->C, g->heads)),
               "layers.%d.blocks.%d.attn_saved", s, j);
  b->attn_out = ACT(p, (BW, g->N, C), "layers.%d.blocks.%d.attn_out", s, j);
  b->proj = ACT(p, (BW, g->N, C), "layers.%d.blocks.%d.proj", s, j);
  b->ln1_mean = F32(p, (BL), "layers.%d.blocks.%d.ln1_mean", s, j);
  b->ln1_rstd = F32(p, (BL), "layers.%d.blocks.%d.ln1_rstd", s, j);
  b->x1 = ACT(p, (B, L, C), "layers.%d.blocks.%d.x1", s, j);
  b->fc1 = ACT(p, (B, L, g->hidden), "layers.%d.blocks.%d.fc1", s, j);
  b->fc2 = ACT(p, (B, L, C), "layers.%d.blocks.%d.fc2", s, j);
  b->ln2_mean = F32(p, (BL), "layers.%d.blocks.%d.ln2_mean", s, j);
  b->ln2_rstd = F32(p, (BL), "layers.%d.blocks.%d.ln2_rstd", s, j);
}

// The set every recomputed block's views share (Activations.rebuilt): each buffer as large as
// the largest stage with a recomputed block needs it, flat.
static void plan_rebuilt(ActPlan *p, BlockActs *r, int B) {
  Model *m = p->m;
  int64_t rows = 0, qkv = 0, att = 0, tokens = 0, hidden = 0;
  for (int s = 0; s < m->num_stages; s++) {
    const StageGeom *g = &m->stages[s];
    if (!m->block_recompute[g->first_block]) continue;  // the stage's first block is the first
    int64_t BL = (int64_t)B * g->H * g->W;
    int64_t saved = m->be->ops->attention_saved_floats(m->be, B * g->nW, g->N, g->C, g->heads);
    if (BL > rows) rows = BL;
    if (BL * 3 * g->C > qkv) qkv = BL * 3 * g->C;
    if (saved > att) att = saved;
    if (BL * g->C > tokens) tokens = BL * g->C;
    if (BL * g->hidden > hidden) hidden = BL * g->hidden;
  }
  if (rows == 0) return;
  r->ln1_mean = F32(p, (rows), "recompute.ln1_mean");
  r->ln1_rstd = F32(p, (rows), "recompute.ln1_rstd");
  r->qkv = ACT(p, (qkv), "recompute.qkv");
  r->att = F32(p, (att), "recompute.attn_saved");
  r->attn_out = ACT(p, (tokens), "recompute.attn_out");
  r->x1 = ACT(p, (tokens), "recompute.x1");
  r->ln2_mean = F32(p, (rows), "recompute.ln2_mean");
  r->ln2_rstd = F32(p, (rows), "recompute.ln2_rstd");
  r->fc1 = ACT(p, (hidden), "recompute.fc1");
}

// Plans every activation for batch B; with recompute false as if no block were recomputed (to
// count what recompute saves). Returns the number of rows.
static int plan_activations(Model *m, Arena *a, int B, bool recompute) {
  const Config *c = &m->cfg;
  Activations *x = &m->acts;
  ActPlan plan = {a, m, 0}, *p = &plan;
  int64_t L0 = (int64_t)m->Hp * m->Wp, E = c->embed_dim;
  x->patches = ACT(p, (B, L0, m->patch_dim), "patches");
  x->pe = ACT(p, (B, L0, E), "patch_embed");
  x->pe_mean = F32(p, (B * L0), "patch_embed.ln_mean");
  x->pe_rstd = F32(p, (B * L0), "patch_embed.ln_rstd");
  x->drop_scales = F32(p, (2 * (int64_t)m->num_blocks, B), "drop_path_scales");
  int64_t max_lc = B * L0 * E, max_hidden = 0, max_gelu = 0, max_qkv = 0, max_table = 0;
  for (int s = 0; s < m->num_stages; s++) {
    const StageGeom *g = &m->stages[s];
    int64_t L = (int64_t)g->H * g->W, BL = B * L, C = g->C;
    if (g->merge) {
      x->merge_ln[s] = ACT(p, (B, L, 2 * C), "layers.%d.downsample", s);
      if (c->version == 2) x->merge_red[s] = ACT(p, (B, L, C), "layers.%d.downsample.reduction", s);
      x->merge_mean[s] = F32(p, (BL), "layers.%d.downsample.ln_mean", s);
      x->merge_rstd[s] = F32(p, (BL), "layers.%d.downsample.ln_rstd", s);
    }
    for (int j = 0; j < g->depth; j++) {
      BlockActs *b = &x->blocks[g->first_block + j];
      if (c->version == 2) {
        plan_block_v2(p, b, g, B, s, j);
        continue;
      }
      b->x = ACT(p, (B, L, C), "layers.%d.blocks.%d.x", s, j);
      if (!recompute || !m->block_recompute[g->first_block + j]) plan_block(p, b, g, B, s, j);
    }
    x->stage_out[s] = ACT(p, (B, L, C), "layers.%d.out", s);
    if (BL * C > max_lc) max_lc = BL * C;
    if (BL * g->hidden > max_hidden) max_hidden = BL * g->hidden;
    int64_t gelu = m->be->ops->mlp_hidden_elements(m->be, BL, (int)C, g->hidden);
    if (gelu > max_gelu) max_gelu = gelu;
    if (BL * 3 * C > max_qkv) max_qkv = BL * 3 * C;
    if ((int64_t)g->cpb_rows * g->heads > max_table) max_table = (int64_t)g->cpb_rows * g->heads;
  }
  const StageGeom *last = &m->stages[m->num_stages - 1];
  int64_t Ll = (int64_t)last->H * last->W, BLl = B * Ll;
  x->norm_mean = F32(p, (BLl), "norm.ln_mean");
  x->norm_rstd = F32(p, (BLl), "norm.ln_rstd");
  x->norm_out = ACT(p, (B, Ll, last->C), "norm");
  x->pooled = F32(p, (B, last->C), "pooled");
  x->logits = F32(p, (B, c->num_classes), "logits");
  x->dlogits = F32(p, (B, c->num_classes), "logits.grad");
  // The shared buffers hold the largest of their uses (flat).
  if (c->version == 1) {
    x->xw = ACT(p, (max_lc), "shared.ln1_windows");
    x->ln2 = ACT(p, (max_lc), "shared.ln2");
    x->branch = ACT(p, (max_lc), "shared.branch");
  }
  // GELU(pre) is stored only for the MLPs whose ops ask for room (mlp_hidden_elements): no
  // buffer at all where none does.
  x->hidden = max_gelu > 0 ? ACT(p, (max_gelu), "shared.gelu") : NULL;
  x->dres = F32(p, (max_lc), "shared.residual.grad");
  x->dbranch = ACT(p, (max_lc), "shared.branch.grad");
  x->dln = ACT(p, (max_lc), "shared.ln.grad");
  x->dattn = ACT(p, (max_lc), "shared.attn.grad");
  x->dhidden = ACT(p, (max_hidden), "shared.hidden.grad");
  x->dqkv = ACT(p, (max_qkv), "shared.qkv.grad");
  if (c->version == 2) {
    x->stream = ACT(p, (max_lc), "shared.residual");
    x->dtable = F32(p, (max_table), "shared.cpb_table.grad");
  }
  x->rebuilt = (BlockActs){0};
  if (recompute) plan_rebuilt(p, &x->rebuilt, B);
  for (int gi = 0; recompute && gi < m->num_blocks; gi++) {
    if (!m->block_recompute[gi]) continue;
    BlockActs *b = &x->blocks[gi];
    void *own = b->x;
    *b = x->rebuilt;
    b->x = own;
  }
  return plan.rows;
}
#undef ACT
#undef F32

// What the backend's private scratch must hold for this model at batch B.
static BackendNeeds backend_needs(const Model *m, int B) {
  const Config *c = &m->cfg;
  BackendNeeds n = {.max_batch = B, .num_params = m->num_floats};
  int64_t rows = (int64_t)B * m->Hp * m->Wp;
  n.max_elements = (int64_t)B * c->img_h * c->img_w * c->in_chans;
  if (rows * m->patch_dim > n.max_elements) n.max_elements = rows * m->patch_dim;
  n.max_rows = rows;
  n.max_width = m->patch_dim > c->num_classes ? m->patch_dim : c->num_classes;
  for (int s = 0; s < m->num_stages; s++) {
    const StageGeom *g = &m->stages[s];
    int64_t BL = (int64_t)B * g->H * g->W;
    int widths[3] = {3 * g->C, g->hidden, 2 * g->C};  // qkv, MLP, merged 2x2 (4 C_{s-1})
    for (int k = 0; k < 3; k++) {
      if (widths[k] > n.max_width) n.max_width = widths[k];
      if (BL * widths[k] > n.max_elements) n.max_elements = BL * widths[k];
    }
    if (BL > n.max_rows) n.max_rows = BL;
    if (g->N > n.max_window_tokens) n.max_window_tokens = g->N;
    if (g->heads > n.max_heads) n.max_heads = g->heads;
  }
  return n;
}

// Copies a host array into fresh backend memory.
static void *backend_copy(Backend *be, const void *src, size_t bytes) {
  void *dst = be->ops->alloc(be, bytes);
  be->ops->upload(be, dst, src, bytes);
  return dst;
}

// Whether every stage's window and head width are within what the backend's attention serves.
static int check_backend_limits(const Model *m, const BackendOps *ops, Error *err) {
  for (int s = 0; s < m->num_stages; s++) {
    const StageGeom *g = &m->stages[s];
    if (ops->max_window_tokens > 0 && g->N > ops->max_window_tokens)
      return error_set(err,
                       "model.window_size = %d: stage %d has %dx%d windows (%d tokens), but the "
                       "%s backend's attention serves at most %d tokens per window\n"
                       "HINT: use a window of at most %d tokens, or device=cpu",
                       m->cfg.window_size, s, g->wh, g->ww, g->N, ops->name, ops->max_window_tokens,
                       ops->max_window_tokens);
    if (ops->max_head_dim > 0 && g->head_dim > ops->max_head_dim)
      return error_set(err,
                       "model.num_heads: stage %d has %d heads of %d channels, but the %s "
                       "backend's attention serves at most %d channels per head\n"
                       "HINT: raise that stage's head count, or device=cpu",
                       s, g->heads, g->head_dim, ops->name, ops->max_head_dim);
  }
  return 0;
}

// Registers a flat buffer of num_floats values of dtype with the backend's checking layer
// (src/model/backend_check.h), and each parameter's view in it as a tensor named as the parameter
// with suffix: an op given one parameter is checked against that parameter alone, so an extent
// that runs into the next tensor is caught and the message names the tensor.
static void register_flat(const Model *m, void *base, DType dtype, const char *name,
                          const char *suffix) {
  Tensor flat = tensor_view(base, dtype, m->be->device, name, 1, SHAPE(m->num_floats));
  backend_check_register_buffer(m->be, &flat);
  for (int i = 0; i < m->num_params; i++) {
    const Param *p = &m->params[i];
    Tensor t = p->t;
    t.data = (char *)base + p->offset * (int64_t)dtype_size(dtype);
    t.dtype = dtype;
    t.device = m->be->device;
    snprintf(t.name, sizeof t.name, "%.*s%s", (int)(sizeof t.name - 8), p->t.name, suffix);
    backend_check_register(m->be, &t);
  }
}

// Every region of backend memory the model passes to ops, for the checking layer: the
// activation table, the master weights, their compute copy and the gradients (per parameter),
// and the geometry tables. model_destroy unregisters them.
static void register_regions(const Model *m) {
  Backend *be = m->be;
  for (int i = 0; i < m->num_acts; i++) backend_check_register(be, &m->act_table[i]);
  register_flat(m, m->master, DTYPE_F32, "weights", "");
  if (m->compute != (void *)m->master) register_flat(m, m->compute, be->act, "weights.compute", "");
  register_flat(m, m->grads, DTYPE_F32, "grads", ".grad");
  char name[TENSOR_NAME_MAX];
  for (int s = 0; s < m->num_stages; s++) {
    const StageGeom *g = &m->stages[s];
    snprintf(name, sizeof name, "layers.%d.attn.relative_position_index", s);
    Tensor t = tensor_view(g->index_be, DTYPE_I32, be->device, name, 2, SHAPE(g->N, g->N));
    backend_check_register(be, &t);
    if (g->mask_be) {
      snprintf(name, sizeof name, "layers.%d.attn.mask", s);
      t = tensor_view(g->mask_be, DTYPE_F32, be->device, name, 3, SHAPE(g->nW, g->N, g->N));
      backend_check_register(be, &t);
    }
    if (g->cpb_coords_be) {
      snprintf(name, sizeof name, "layers.%d.attn.relative_coords_table", s);
      t = tensor_view(g->cpb_coords_be, DTYPE_F32, be->device, name, 2, SHAPE(g->cpb_rows, 2));
      backend_check_register(be, &t);
    }
  }
  Tensor t = tensor_view(m->block_drop_be, DTYPE_F32, be->device, "drop_path.rates", 1,
                         SHAPE(m->num_blocks));
  backend_check_register(be, &t);
}

int model_create(Model *m, const Config *cfg, Backend *be, int max_batch, Error *err) {
  memset(m, 0, sizeof *m);
  m->cfg = *cfg;
  if (max_batch < 0 || (be && max_batch < 1) || (!be && max_batch > 0))
    return error_set(err, "model_create: max_batch %d needs %s", max_batch,
                     be ? "to be at least 1" : "a backend");
  build_geometry(m);
  if (be && check_backend_limits(m, be->ops, err) != 0) {
    model_destroy(m);
    return -1;
  }
  m->num_params = walk_params(m, NULL, NULL, NULL);
  m->params = calloc_check((size_t)m->num_params, sizeof(Param));
  walk_params(m, m->params, NULL, NULL);
  size_t bytes = sizeof(float) * (size_t)m->num_floats;
  m->weights = aligned_alloc_check(bytes);
  memset(m->weights, 0, bytes);
  m->w.blocks = calloc_check((size_t)m->num_blocks, sizeof(BlockWeights));
  m->g.blocks = calloc_check((size_t)m->num_blocks, sizeof(BlockWeights));
  m->acts.blocks = calloc_check((size_t)m->num_blocks, sizeof(BlockActs));
  m->max_batch = max_batch;
  if (!be) {
    walk_params(m, NULL, &m->w, m->weights);
    return 0;
  }

  // Backend memory: the master weights (the host copy itself on the CPU), their compute copy,
  // the gradients, the geometry tables and the activations.
  m->be = be;
  const BackendOps *ops = be->ops;
  m->master = be->device == DEVICE_CPU ? m->weights : ops->alloc(be, bytes);
  m->compute = be->act == DTYPE_F32 ? (void *)m->master
                                    : ops->alloc(be, (size_t)m->num_floats * dtype_size(be->act));
  m->grads = ops->alloc(be, bytes);
  walk_params(m, NULL, &m->w, m->master);
  walk_params(m, NULL, &m->g, m->grads);
  for (int s = 0; s < m->num_stages; s++) {
    StageGeom *g = &m->stages[s];
    g->index_be = backend_copy(be, g->rel_index, sizeof(int) * (size_t)g->N * (size_t)g->N);
    if (g->mask)
      g->mask_be = backend_copy(be, g->mask, sizeof(float) * (size_t)g->nW * g->N * g->N);
    if (g->cpb_coords)
      g->cpb_coords_be = backend_copy(be, g->cpb_coords, sizeof(float) * 2 * (size_t)g->cpb_rows);
  }
  m->block_drop_be = backend_copy(be, m->block_drop, sizeof(float) * (size_t)m->num_blocks);
  Arena counting = {.name = "activations (counting)"}, without = counting;
  plan_activations(m, &without, max_batch, false);
  m->num_acts = plan_activations(m, &counting, max_batch, true);
  m->acts_saved_bytes = without.used > counting.used ? without.used - counting.used : 0;
  m->act_table = calloc_check((size_t)m->num_acts, sizeof(Tensor));
  arena_init_at(&m->acts_arena, "activations", be->device, ops->alloc(be, counting.used),
                counting.used);
  plan_activations(m, &m->acts_arena, max_batch, true);
  register_regions(m);
  BackendNeeds needs = backend_needs(m, max_batch);
  ops->reserve(be, &needs);
  return 0;
}

// Releases backend memory of the model once the checking layer has forgotten its regions (the
// memory may be handed out again for something else).
static void release_backend(Backend *be, void *ptr) {
  backend_check_unregister(be, ptr);
  be->ops->release(be, ptr);
}

void model_destroy(Model *m) {
  Backend *be = m->be;
  for (int s = 0; s < m->num_stages; s++) {
    free(m->stages[s].rel_index);
    free(m->stages[s].mask);
    free(m->stages[s].cpb_coords);
    if (be) {
      release_backend(be, m->stages[s].index_be);
      release_backend(be, m->stages[s].mask_be);
      release_backend(be, m->stages[s].cpb_coords_be);
    }
  }
  if (be) {
    if (m->compute != (void *)m->master) release_backend(be, m->compute);
    if (m->master != m->weights)
      release_backend(be, m->master);
    else
      backend_check_unregister(be, m->master);  // host memory, freed with m->weights
    release_backend(be, m->grads);
    release_backend(be, m->block_drop_be);
    for (int i = 0; i < m->num_acts; i++) backend_check_unregister(be, m->act_table[i].data);
    be->ops->release(be, m->acts_arena.base);
  }
  free(m->block_drop);
  free(m->block_recompute);
  free(m->params);
  free(m->weights);
  free(m->w.blocks);
  free(m->g.blocks);
  free(m->acts.blocks);
  free(m->act_table);
  memset(m, 0, sizeof *m);
}

void model_weights_to_backend(Model *m) {
  Backend *be = m->be;
  if (!be) return;
  if (m->master != m->weights)
    be->ops->upload(be, m->master, m->weights, sizeof(float) * (size_t)m->num_floats);
  if (m->compute != (void *)m->master)
    be->ops->to_compute(be, m->compute, m->master, m->num_floats);
}

void model_weights_to_host(Model *m) {
  if (m->be && m->master != m->weights)
    m->be->ops->download(m->be, m->weights, m->master, sizeof(float) * (size_t)m->num_floats);
}

void model_grads_to_host(const Model *m, float *dst) {
  m->be->ops->download(m->be, dst, m->grads, sizeof(float) * (size_t)m->num_floats);
}

const void *model_compute_weight(const Model *m, const float *master) {
  if (!master) return NULL;
  return (const char *)m->compute + (master - m->master) * (ptrdiff_t)dtype_size(m->be->act);
}

void model_memory(const Model *m, size_t *weights, size_t *grads, size_t *activations) {
  size_t f32 = sizeof(float) * (size_t)m->num_floats;
  *weights =
      f32 + (m->compute != (void *)m->master ? (size_t)m->num_floats * dtype_size(m->be->act) : 0);
  *grads = f32;
  *activations = m->acts_arena.capacity;
}
// ---------------------------------------------------------------------------------------------
// Initialization (timm / official), as each row of the parameter table names it (Param.init):
// Linear weights and the bias tables trunc_normal(std 0.02,
// cut at +-2), biases 0, LayerNorm 1 / 0; the patch conv keeps PyTorch's Conv2d default,
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias. Each tensor draws from its own RNG
// stream keyed by its index, so the result does not depend on anything but the seed.

static double normal_draw(Rng *r) {
  double u1 = rng_uniform_double(r), u2 = rng_uniform_double(r);
  return sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2);
}

void model_init_weights(Model *m, uint64_t seed) {
  for (int i = 0; i < m->num_params; i++) {
    const Param *p = &m->params[i];
    float *x = m->weights + p->offset;
    int64_t n = tensor_numel(&p->t);
    Rng r = rng_make(seed, RNG_STREAM_INIT, (uint64_t)i, 0);
    switch (p->init) {
      case PARAM_INIT_CONV_UNIFORM: {
        double bound = 1.0 / sqrt((double)m->patch_dim);
        for (int64_t j = 0; j < n; j++)
          x[j] = (float)((2.0 * rng_uniform_double(&r) - 1.0) * bound);
        break;
      }
      case PARAM_INIT_ONE:
        for (int64_t j = 0; j < n; j++) x[j] = 1.0f;
        break;
      case PARAM_INIT_LOG_TEN:
        for (int64_t j = 0; j < n; j++) x[j] = (float)log(10.0);
        break;
      case PARAM_INIT_ZERO:
        memset(x, 0, sizeof(float) * (size_t)n);
        break;
      case PARAM_INIT_TRUNC_NORMAL:
        for (int64_t j = 0; j < n; j++) {
          double v;
          do v = 0.02 * normal_draw(&r);
          while (v < -2.0 || v > 2.0);
          x[j] = (float)v;
        }
        break;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Forward. Each LayerNorm is fused with the residual add before it and with the window
// partition after it, and each residual with the layer whose output it adds, so a block is: qkv,
// attention, [proj; x1 = x + dp * rev(proj); ln2 = LN2(x1)], [fc1 + GELU, fc2; x' = x1 + dp *
// fc2; xw = part(LN1'(x'))], x' and LN1' being the next block's (for a stage's last block the
// stage's output, and no LN1); each bracket is one op (linear_residual_layernorm_forward,
// mlp_residual_layernorm_forward), one kernel where the backend fuses them. A stage's first
// block's LN1 is residual_layernorm_forward of its input alone.

// The window order of block j's attention.
static WindowMap block_windows(const StageGeom *g, int j) {
  bool shifted = block_is_shifted(g, j);
  WindowMap w = {g->H, g->W, g->wh, g->ww, shifted ? g->sh : 0, shifted ? g->sw : 0};
  return w;
}

// LN1 of a stage's first block into its windows (the other blocks' LN1 comes with the residual
// that ends the block before: block_mlp_residual_forward).
static void block_norm1_forward(Model *m, const StageGeom *g, int B) {
  Backend *be = m->be;
  BlockActs *a = &m->acts.blocks[g->first_block];
  const BlockWeights *w = &m->w.blocks[g->first_block];
  WindowMap wm = block_windows(g, 0);
  be->ops->residual_layernorm_forward(be, NULL, m->acts.xw, a->ln1_mean, a->ln1_rstd, a->x, NULL,
                                      NULL, NULL, w->norm1_w, w->norm1_b, &wm, B,
                                      (int64_t)g->H * g->W, g->C);
}

// Block j from LN1's windows (in x->xw) to the MLP's input: the attention branch with its
// residual + LN2 (x->ln2).
static void block_forward_to_mlp(Model *m, const StageGeom *g, int j, int B) {
  Backend *be = m->be;
  const BackendOps *ops = be->ops;
  Activations *x = &m->acts;
  int gi = g->first_block + j;
  BlockActs *a = &x->blocks[gi];
  const BlockWeights *w = &m->w.blocks[gi];
  int C = g->C, BW = B * g->nW;
  int64_t L = (int64_t)g->H * g->W, BL = B * L;
  WindowMap wm = block_windows(g, j);
  const float *mask = wm.sh || wm.sw ? g->mask_be : NULL;

  ops->linear_forward(be, a->qkv, x->xw, model_compute_weight(m, w->qkv_w),
                      model_compute_weight(m, w->qkv_b), BL, C, 3 * C, ACTIVATION_NONE, NULL);
  ops->attention_forward(be, a->attn_out, a->att, a->qkv, w->rel_table, g->index_be, mask, BW,
                         g->nW, g->N, C, g->heads, attention_head_dim_scale(g->head_dim));
  ops->linear_residual_layernorm_forward(
      be, a->x1, x->ln2, a->ln2_mean, a->ln2_rstd, x->branch, a->x, a->attn_out,
      model_compute_weight(m, w->proj_w), model_compute_weight(m, w->proj_b), &wm,
      m->drop_path_active ? a->dp_attn : NULL, w->norm2_w, w->norm2_b, B, L, C, C);
}

// The hidden argument of stage g's MLP ops over BL rows: the shared buffer where the backend
// stores GELU(pre) for that MLP, NULL where it does not (plan_activations sized the buffer for
// the former alone).
static void *mlp_hidden(const Model *m, const StageGeom *g, int64_t BL) {
  bool stored = m->be->ops->mlp_hidden_elements(m->be, BL, g->C, g->hidden) > 0;
  return stored ? m->acts.hidden : NULL;
}

// Block j's fc1 pre-activation (a->fc1) from LN2's output again: the backward's rebuild.
static void block_mlp_rebuild(Model *m, const StageGeom *g, int j, int B) {
  int gi = g->first_block + j;
  const BlockWeights *w = &m->w.blocks[gi];
  int64_t BL = (int64_t)B * g->H * g->W;
  m->be->ops->mlp_forward(m->be, NULL, m->acts.blocks[gi].fc1, mlp_hidden(m, g, BL), m->acts.ln2,
                          model_compute_weight(m, w->fc1_w), model_compute_weight(m, w->fc1_b),
                          model_compute_weight(m, w->fc2_w), model_compute_weight(m, w->fc2_b), BL,
                          g->C, g->hidden);
}

// Block j's MLP and the residual that ends the block, x' = x1 + dp * mlp(ln2): into block j + 1's
// input with its LN1 into that block's windows, or for the stage's last block into the stage's
// output (the last stage's also through the final norm). One op: one kernel where the backend
// fuses fc2 with the residual and LayerNorm after it.
static void block_mlp_residual_forward(Model *m, int s, int j, int B) {
  Backend *be = m->be;
  Activations *x = &m->acts;
  const Weights *W = &m->w;
  const StageGeom *g = &m->stages[s];
  int gi = g->first_block + j;
  const BlockWeights *w = &W->blocks[gi];
  const BlockActs *a = &x->blocks[gi];
  int64_t L = (int64_t)g->H * g->W, BL = B * L;
  void *x_out, *ln_out;
  float *mean, *rstd;
  const float *ln_w, *ln_b;
  WindowMap wm;
  const WindowMap *map = NULL;
  if (j + 1 < g->depth) {
    BlockActs *n = &x->blocks[gi + 1];
    wm = block_windows(g, j + 1);
    map = &wm;
    x_out = n->x;
    ln_out = x->xw;
    mean = n->ln1_mean;
    rstd = n->ln1_rstd;
    ln_w = W->blocks[gi + 1].norm1_w;
    ln_b = W->blocks[gi + 1].norm1_b;
  } else {
    x_out = x->stage_out[s];
    ln_out = s == m->num_stages - 1 ? x->norm_out : NULL;
    mean = x->norm_mean;
    rstd = x->norm_rstd;
    ln_w = W->norm_w;
    ln_b = W->norm_b;
  }
  be->ops->mlp_residual_layernorm_forward(
      be, x_out, ln_out, mean, rstd, x->branch, a->fc1, mlp_hidden(m, g, BL), a->x1, x->ln2,
      model_compute_weight(m, w->fc1_w), model_compute_weight(m, w->fc1_b),
      model_compute_weight(m, w->fc2_w), model_compute_weight(m, w->fc2_b),
      m->drop_path_active ? a->dp_mlp : NULL, ln_w, ln_b, map, B, L, g->C, g->hidden);
}

// A V2 block (res-post-norm) from its windows a->xw and the residual stream (x->stream, in token
// order) to its output: x1 = x + dp * LN1(proj(attention)), out = x1 + dp * LN2(mlp(x1)), each a
// postnorm_residual. The output goes to `out`; with next (block j + 1's windows), also in its
// window order to next_xw, the next block's input.
static void block_forward_v2(Model *m, const StageGeom *g, int j, int B, void *out, void *next_xw) {
  Backend *be = m->be;
  const BackendOps *ops = be->ops;
  Activations *x = &m->acts;
  int gi = g->first_block + j;
  BlockActs *a = &x->blocks[gi];
  const BlockWeights *w = &m->w.blocks[gi];
  int C = g->C, BW = B * g->nW;
  int64_t L = (int64_t)g->H * g->W, BL = B * L;
  WindowMap wm = block_windows(g, j), next = block_windows(g, j + 1);
  const float *mask = wm.sh || wm.sw ? g->mask_be : NULL;
  bool dp = m->drop_path_active;

  ops->cpb_forward(be, a->cpb_table, a->cpb_hidden, g->cpb_coords_be, w->cpb_w1, w->cpb_b1,
                   w->cpb_w2, g->cpb_rows, g->heads);
  ops->linear_forward(be, a->qkv, a->xw, model_compute_weight(m, w->qkv_w), NULL, BL, C, 3 * C,
                      ACTIVATION_NONE, NULL);
  ops->cosine_qk_forward(be, a->qkv, a->qk_norms, w->q_bias, w->v_bias, w->logit_scale, BL, C,
                         g->heads);
  ops->attention_forward(be, a->attn_out, a->att, a->qkv, a->cpb_table, g->index_be, mask, BW,
                         g->nW, g->N, C, g->heads, 1.0f);
  ops->linear_forward(be, a->proj, a->attn_out, model_compute_weight(m, w->proj_w),
                      model_compute_weight(m, w->proj_b), BL, C, C, ACTIVATION_NONE, NULL);
  ops->postnorm_residual_forward(be, a->x1, NULL, a->ln1_mean, a->ln1_rstd, x->stream, a->proj, &wm,
                                 dp ? a->dp_attn : NULL, w->norm1_w, w->norm1_b, NULL, B, L, C);
  ops->mlp_forward(be, a->fc2, a->fc1, mlp_hidden(m, g, BL), a->x1,
                   model_compute_weight(m, w->fc1_w), model_compute_weight(m, w->fc1_b),
                   model_compute_weight(m, w->fc2_w), model_compute_weight(m, w->fc2_b), BL, C,
                   g->hidden);
  ops->postnorm_residual_forward(be, out, next_xw, a->ln2_mean, a->ln2_rstd, a->x1, a->fc2, NULL,
                                 dp ? a->dp_mlp : NULL, w->norm2_w, w->norm2_b,
                                 next_xw ? &next : NULL, B, L, C);
}

static const char *const stage_names[CONFIG_MAX_STAGES] = {
    "stage 0", "stage 1", "stage 2", "stage 3", "stage 4", "stage 5", "stage 6", "stage 7"};

// Views of each block's drop-path scales in drop_scales, which drop_path_scales fills as (units,
// B) for this forward's B (which may be below max_batch): unit 2 gi (attention) and 2 gi + 1
// (MLP); NULL where the block's rate is 0.
static void bind_drop_scales(Model *m, int B) {
  for (int gi = 0; gi < m->num_blocks; gi++) {
    BlockActs *b = &m->acts.blocks[gi];
    bool drops = m->block_drop[gi] > 0;
    b->dp_attn = drops ? m->acts.drop_scales + (int64_t)2 * gi * B : NULL;
    b->dp_mlp = drops ? m->acts.drop_scales + (int64_t)(2 * gi + 1) * B : NULL;
  }
}

Normalize model_input_normalize(const Config *cfg) {
  Normalize norm = {{0}, {0}};
  for (int c = 0; c < cfg->in_chans && c < 4; c++) {
    norm.mean[c] = cfg->mean[cfg->num_mean == 1 ? 0 : c];
    norm.std[c] = cfg->std[cfg->num_mean == 1 ? 0 : c];
  }
  return norm;
}

// Head: mean over tokens, linear, in f32.
static void model_head_forward(Model *m, int B) {
  const StageGeom *g = &m->stages[m->num_stages - 1];
  m->be->ops->head_forward(m->be, m->acts.logits, m->acts.pooled, m->acts.norm_out, m->w.head_w,
                           m->w.head_b, B, g->H * g->W, g->C, m->cfg.num_classes);
}

// V2 after the patch embedding's linear (x->pe): its LayerNorm into the residual stream and the
// first block's windows; per stage the merging (gather, reduce, LayerNorm likewise) and the
// blocks; the final LayerNorm; the head.
static void model_forward_v2(Model *m, int B) {
  const Config *c = &m->cfg;
  Backend *be = m->be;
  const BackendOps *ops = be->ops;
  Activations *x = &m->acts;
  const Weights *w = &m->w;
  WindowMap first = block_windows(&m->stages[0], 0);
  ops->postnorm_residual_forward(be, x->stream, x->blocks[0].xw, x->pe_mean, x->pe_rstd, NULL,
                                 x->pe, NULL, NULL, w->patch_norm_w, w->patch_norm_b, &first, B,
                                 (int64_t)m->Hp * m->Wp, c->embed_dim);
  for (int s = 0; s < m->num_stages; s++) {
    NVTX_PUSH(stage_names[s]);
    const StageGeom *g = &m->stages[s];
    int64_t L = (int64_t)g->H * g->W;
    BlockActs *a0 = &x->blocks[g->first_block];
    if (g->merge) {
      const StageGeom *p = &m->stages[s - 1];
      WindowMap wm = block_windows(g, 0);
      ops->patch_merge_forward(be, x->merge_ln[s], x->stage_out[s - 1], B, p->H, p->W, p->C);
      ops->linear_forward(be, x->merge_red[s], x->merge_ln[s],
                          model_compute_weight(m, w->merge_w[s]), NULL, B * L, 4 * p->C, g->C,
                          ACTIVATION_NONE, NULL);
      ops->postnorm_residual_forward(be, x->stream, a0->xw, x->merge_mean[s], x->merge_rstd[s],
                                     NULL, x->merge_red[s], NULL, NULL, w->merge_norm_w[s],
                                     w->merge_norm_b[s], &wm, B, L, g->C);
    }
    for (int j = 0; j < g->depth; j++) {
      bool last = j == g->depth - 1;
      block_forward_v2(m, g, j, B, last ? x->stage_out[s] : x->stream,
                       last ? NULL : x->blocks[g->first_block + j + 1].xw);
    }
    NVTX_POP();
  }
  const StageGeom *g = &m->stages[m->num_stages - 1];
  ops->residual_layernorm_forward(be, NULL, x->norm_out, x->norm_mean, x->norm_rstd,
                                  x->stage_out[m->num_stages - 1], NULL, NULL, NULL, w->norm_w,
                                  w->norm_b, NULL, B, (int64_t)g->H * g->W, g->C);
  model_head_forward(m, B);
}

void model_forward(Model *m, const void *input, DType input_dtype, Normalize norm, int B,
                   bool train, uint64_t seed, const StepParams *step) {
  NVTX_PUSH("forward");
  const Config *c = &m->cfg;
  Backend *be = m->be;
  const BackendOps *ops = be->ops;
  Activations *x = &m->acts;
  const Weights *w = &m->w;
  int64_t L0 = (int64_t)m->Hp * m->Wp;
  int E = c->embed_dim;

  m->drop_path_active = train && c->drop_path_rate > 0;
  if (m->drop_path_active) {
    bind_drop_scales(m, B);
    ops->drop_path_scales(be, x->drop_scales, m->block_drop_be, 2 * m->num_blocks, B, seed, step);
  }

  // Patch embedding: gather p x p patches (normalizing pixels), linear (= the strided conv),
  // LayerNorm into the first block's input.
  ops->patch_embed_input(be, x->patches, input, input_dtype, norm, B, c->img_h, c->img_w,
                         c->in_chans, c->patch_size);
  ops->linear_forward(be, x->pe, x->patches, model_compute_weight(m, w->patch_w),
                      model_compute_weight(m, w->patch_b), B * L0, m->patch_dim, E, ACTIVATION_NONE,
                      NULL);
  if (c->version == 2) {
    model_forward_v2(m, B);
    NVTX_POP();
    return;
  }
  ops->residual_layernorm_forward(be, NULL, x->blocks[0].x, x->pe_mean, x->pe_rstd, x->pe, NULL,
                                  NULL, NULL, w->patch_norm_w, w->patch_norm_b, NULL, B, L0, E);

  for (int s = 0; s < m->num_stages; s++) {
    NVTX_PUSH(stage_names[s]);
    const StageGeom *g = &m->stages[s];
    if (g->merge) {
      const StageGeom *p = &m->stages[s - 1];
      int64_t BL = (int64_t)B * g->H * g->W;
      ops->merge_layernorm_forward(be, x->merge_ln[s], x->merge_mean[s], x->merge_rstd[s],
                                   x->stage_out[s - 1], w->merge_norm_w[s], w->merge_norm_b[s], B,
                                   p->H, p->W, p->C);
      ops->linear_forward(be, x->blocks[g->first_block].x, x->merge_ln[s],
                          model_compute_weight(m, w->merge_w[s]), NULL, BL, 4 * p->C, g->C,
                          ACTIVATION_NONE, NULL);
    }
    block_norm1_forward(m, g, B);
    for (int j = 0; j < g->depth; j++) {
      block_forward_to_mlp(m, g, j, B);
      block_mlp_residual_forward(m, s, j, B);
    }
    NVTX_POP();
  }

  model_head_forward(m, B);
  NVTX_POP();
}

// ---------------------------------------------------------------------------------------------
// Backward: the residual stream's gradient lives in dres (f32) and is carried from the head down
// to the patch embedding; a branch's gradient goes to dbranch; parameter gradients accumulate
// into m->grads. A linear layer's bias gradient (the column sums of its output gradient) comes
// from the op that writes that gradient, which reads or computes every element of it anyway:
// fc2's from the residual + LN1 backward that follows it (for a stage's last block the stage-end
// residual), proj's from LN2's backward, fc1's from the GELU pass, qkv's from the attention
// backward, the patch embedding's from its LayerNorm's backward; their linear_backward calls
// then take no dbias.

// A recomputed block's forward again (train.recompute), right before its backward: LN1 of its
// kept input x (which the forward stored before normalizing the stored value, so LN1 alone
// gives the windows and statistics the fused residual + LN1 gave), then up to fc1's
// pre-activation, into the shared set its views point to and the shared buffers, with the
// drop-path scales the forward drew. The same ops on the same inputs: the same bits. fc2's
// output is not needed by the backward (its input is rebuilt there from fc1's) and is not
// rebuilt.
static void block_recompute(Model *m, const StageGeom *g, int j, int B) {
  NVTX_PUSH("recompute");
  int gi = g->first_block + j;
  const BlockWeights *w = &m->w.blocks[gi];
  const BlockActs *a = &m->acts.blocks[gi];
  WindowMap wm = block_windows(g, j);
  m->be->ops->residual_layernorm_forward(m->be, NULL, m->acts.xw, a->ln1_mean, a->ln1_rstd, a->x,
                                         NULL, NULL, NULL, w->norm1_w, w->norm1_b, &wm, B,
                                         (int64_t)g->H * g->W, g->C);
  block_forward_to_mlp(m, g, j, B);
  block_mlp_rebuild(m, g, j, B);
  NVTX_POP();
}

// Block j from d(its fc2 output) in dbranch (its column sums already in fc2's bias gradient) and
// d(x1) in dres, down to the gradient of qkv's output in dqkv, with LN1's output in xw for qkv's
// weight gradient; dres then holds d(x) from the attention residual alone. rebuilt:
// block_recompute has just run, so LN1's and LN2's outputs are still in xw and ln2 (nothing in
// between writes them) and are not computed again.
static void block_backward(Model *m, const StageGeom *g, int j, int B, bool rebuilt) {
  Backend *be = m->be;
  const BackendOps *ops = be->ops;
  Activations *x = &m->acts;
  int gi = g->first_block + j;
  const BlockWeights *w = &m->w.blocks[gi];
  BlockWeights *gw = &m->g.blocks[gi];
  BlockActs *a = &x->blocks[gi];
  int C = g->C, BW = B * g->nW;
  int64_t L = (int64_t)g->H * g->W, BL = B * L;
  WindowMap wm = block_windows(g, j);
  const float *mask = wm.sh || wm.sw ? g->mask_be : NULL;

  // MLP: fc2 through GELU (its input recomputed from fc1's output), fc1, then LN2 + the
  // attention residual; LN2's output is recomputed from its input first.
  ops->gelu_linear_backward(be, x->dhidden, mlp_hidden(m, g, BL), gw->fc2_w, gw->fc1_b, x->dbranch,
                            a->fc1, model_compute_weight(m, w->fc2_w), BL, g->hidden, C);
  if (!rebuilt)
    ops->residual_layernorm_forward(be, NULL, x->ln2, a->ln2_mean, a->ln2_rstd, a->x1, NULL, NULL,
                                    NULL, w->norm2_w, w->norm2_b, NULL, B, L, C);
  ops->linear_residual_layernorm_backward(
      be, x->dres, x->dbranch, gw->proj_b, gw->fc1_w, gw->norm2_w, gw->norm2_b, x->dln, x->dres,
      x->dhidden, x->ln2, model_compute_weight(m, w->fc1_w), a->x1, w->norm2_w, a->ln2_mean,
      a->ln2_rstd, &wm, m->drop_path_active ? a->dp_attn : NULL, NULL, B, L, C, g->hidden);
  // Attention: proj (dbranch holds d(proj) in window order), attention, qkv.
  ops->linear_backward(be, x->dattn, gw->proj_w, NULL, x->dbranch, a->attn_out,
                       model_compute_weight(m, w->proj_w), BL, C, C);
  ops->attention_backward(be, x->dqkv, gw->qkv_b, gw->rel_table, x->dattn, a->qkv, a->attn_out,
                          w->rel_table, g->index_be, mask, a->att, BW, g->nW, g->N, C, g->heads,
                          attention_head_dim_scale(g->head_dim));
  if (!rebuilt)
    ops->residual_layernorm_forward(be, NULL, x->xw, a->ln1_mean, a->ln1_rstd, a->x, NULL, NULL,
                                    NULL, w->norm1_w, w->norm1_b, &wm, B, L, C);
}

// qkv of block j and LN1 back through its residual, from d(qkv) in dqkv and LN1's output in xw
// (block_backward's): d(x) = dres + LN1'(d(LN1's output)), that gradient (window order) being
// qkv's input gradient. For j > 0 d(x) is the gradient of the previous block's x1 (dres) and,
// scaled by its drop path, of its fc2 output (dbranch, summed into that fc2's bias gradient); for
// j == 0 it is the gradient of the stage input, to dbranch.
static void block_norm1_backward(Model *m, const StageGeom *g, int j, int B) {
  Backend *be = m->be;
  Activations *x = &m->acts;
  int gi = g->first_block + j;
  const BlockWeights *w = &m->w.blocks[gi];
  BlockWeights *gw = &m->g.blocks[gi];
  const BlockActs *a = &x->blocks[gi];
  WindowMap wm = block_windows(g, j);
  int64_t L = (int64_t)g->H * g->W;
  const float *scale = j > 0 && m->drop_path_active ? x->blocks[gi - 1].dp_mlp : NULL;
  float *fc2_bias = j > 0 ? m->g.blocks[gi - 1].fc2_b : NULL;
  be->ops->linear_residual_layernorm_backward(
      be, j > 0 ? x->dres : NULL, x->dbranch, fc2_bias, gw->qkv_w, gw->norm1_w, gw->norm1_b, x->dln,
      x->dres, x->dqkv, x->xw, model_compute_weight(m, w->qkv_w), a->x, w->norm1_w, a->ln1_mean,
      a->ln1_rstd, NULL, scale, &wm, B, L, g->C, 3 * g->C);
}

// Tells m->grads_ready that every gradient from `lowest` (a pointer into m->grads) to the end of
// the buffer is final. Backward writes each tensor's gradient in one place, walking the layout
// (src/model/model.h) from its end to its start; the exception inside a block (the bias table's
// gradient comes before qkv's, though it lies below) is why marks fall only between blocks. A
// block's fc2 bias, its last tensor, is written by the LN1 backward of the block after it (the
// stage-end residual for a stage's last block), before that block's mark, which lies above it.
static void grads_final_from(Model *m, bool report, const float *lowest) {
  if (report && m->grads_ready) m->grads_ready(m->grads_ready_ctx, lowest - m->grads);
}

// V2 block j's backward. On entry dres holds d(block output) along the residual and, for
// j < depth - 1, x->dln holds d(block j + 1's windows) (from its qkv linear), which both add up
// to the gradient of the output; on return dres holds d(block input) along the residual and
// x->dln d(this block's windows), for the unit below (postnorm_residual_backward adds them).
static void block_backward_v2(Model *m, const StageGeom *g, int j, int B) {
  Backend *be = m->be;
  const BackendOps *ops = be->ops;
  Activations *x = &m->acts;
  int gi = g->first_block + j;
  const BlockWeights *w = &m->w.blocks[gi];
  BlockWeights *gw = &m->g.blocks[gi];
  BlockActs *a = &x->blocks[gi];
  int C = g->C, BW = B * g->nW;
  int64_t L = (int64_t)g->H * g->W, BL = B * L;
  WindowMap wm = block_windows(g, j), next = block_windows(g, j + 1);
  const float *mask = wm.sh || wm.sw ? g->mask_be : NULL;
  bool dp = m->drop_path_active, has_next = j < g->depth - 1;

  // MLP unit: LN2 (d(fc2 output) to dbranch, summed into fc2's bias gradient), fc2 through GELU,
  // fc1 (d(x1) from the MLP to dattn).
  ops->postnorm_residual_backward(be, x->dres, x->dbranch, gw->fc2_b, gw->norm2_w, gw->norm2_b,
                                  x->dres, has_next ? x->dln : NULL, has_next ? &next : NULL,
                                  a->fc2, w->norm2_w, a->ln2_mean, a->ln2_rstd, NULL,
                                  dp ? a->dp_mlp : NULL, B, L, C);
  ops->gelu_linear_backward(be, x->dhidden, mlp_hidden(m, g, BL), gw->fc2_w, gw->fc1_b, x->dbranch,
                            a->fc1, model_compute_weight(m, w->fc2_w), BL, g->hidden, C);
  ops->linear_backward(be, x->dattn, gw->fc1_w, NULL, x->dhidden, a->x1,
                       model_compute_weight(m, w->fc1_w), BL, C, g->hidden);
  // Attention unit: LN1 (d(proj output) in window order to dbranch, summed into proj's bias
  // gradient), proj, attention (the table's gradient to dtable), the cosine q/k, the position
  // bias MLP, qkv (d(windows) to dln).
  ops->postnorm_residual_backward(be, x->dres, x->dbranch, gw->proj_b, gw->norm1_w, gw->norm1_b,
                                  x->dres, x->dattn, NULL, a->proj, w->norm1_w, a->ln1_mean,
                                  a->ln1_rstd, &wm, dp ? a->dp_attn : NULL, B, L, C);
  ops->linear_backward(be, x->dattn, gw->proj_w, NULL, x->dbranch, a->attn_out,
                       model_compute_weight(m, w->proj_w), BL, C, C);
  ops->zero(be, x->dtable, sizeof(float) * (size_t)g->cpb_rows * (size_t)g->heads);
  ops->attention_backward(be, x->dqkv, NULL, x->dtable, x->dattn, a->qkv, a->attn_out, a->cpb_table,
                          g->index_be, mask, a->att, BW, g->nW, g->N, C, g->heads, 1.0f);
  ops->cosine_qk_backward(be, x->dqkv, gw->q_bias, gw->v_bias, gw->logit_scale, a->qkv, a->qk_norms,
                          w->logit_scale, BL, C, g->heads);
  ops->cpb_backward(be, gw->cpb_w1, gw->cpb_b1, gw->cpb_w2, x->dtable, a->cpb_table, a->cpb_hidden,
                    g->cpb_coords_be, w->cpb_w2, g->cpb_rows, g->heads);
  ops->linear_backward(be, x->dln, gw->qkv_w, NULL, x->dqkv, a->xw,
                       model_compute_weight(m, w->qkv_w), BL, C, 3 * C);
}

// V2's backward from d(final norm output) in dln: the final LayerNorm, then per stage the blocks
// and the merging's LayerNorm (d(reduction) to dbranch), reduction and gather (d(previous stage
// output) to dres), and last the patch embedding's LayerNorm and linear.
static void model_backward_v2(Model *m, int B, bool report) {
  const Config *c = &m->cfg;
  Backend *be = m->be;
  const BackendOps *ops = be->ops;
  Activations *x = &m->acts;
  const Weights *w = &m->w;
  Weights *gw = &m->g;
  const StageGeom *last = &m->stages[m->num_stages - 1];
  ops->residual_layernorm_backward(be, x->dres, NULL, NULL, gw->norm_w, gw->norm_b, NULL, x->dln,
                                   x->stage_out[m->num_stages - 1], w->norm_w, x->norm_mean,
                                   x->norm_rstd, NULL, NULL, NULL, B, (int64_t)last->H * last->W,
                                   last->C);
  for (int s = m->num_stages - 1; s >= 0; s--) {
    NVTX_PUSH(stage_names[s]);
    const StageGeom *g = &m->stages[s];
    int64_t L = (int64_t)g->H * g->W;
    for (int j = g->depth - 1; j >= 0; j--) {
      block_backward_v2(m, g, j, B);
      grads_final_from(m, report, gw->blocks[g->first_block + j].logit_scale);  // its first
    }
    WindowMap wm = block_windows(g, 0);
    if (g->merge) {
      const StageGeom *p = &m->stages[s - 1];
      ops->postnorm_residual_backward(be, NULL, x->dbranch, NULL, gw->merge_norm_w[s],
                                      gw->merge_norm_b[s], x->dres, x->dln, &wm, x->merge_red[s],
                                      w->merge_norm_w[s], x->merge_mean[s], x->merge_rstd[s], NULL,
                                      NULL, B, L, g->C);
      ops->linear_backward(be, x->dattn, gw->merge_w[s], NULL, x->dbranch, x->merge_ln[s],
                           model_compute_weight(m, w->merge_w[s]), B * L, 4 * p->C, g->C);
      ops->patch_merge_backward(be, x->dres, x->dattn, B, p->H, p->W, p->C);
      grads_final_from(m, report, gw->merge_w[s]);
    } else {
      ops->postnorm_residual_backward(
          be, NULL, x->dbranch, gw->patch_b, gw->patch_norm_w, gw->patch_norm_b, x->dres, x->dln,
          &wm, x->pe, w->patch_norm_w, x->pe_mean, x->pe_rstd, NULL, NULL, B, L, c->embed_dim);
      ops->linear_backward(be, NULL, gw->patch_w, NULL, x->dbranch, x->patches,
                           model_compute_weight(m, w->patch_w), B * L, m->patch_dim, c->embed_dim);
      grads_final_from(m, report, m->grads);
    }
    NVTX_POP();
  }
}

void model_backward(Model *m, int B, bool report) {
  NVTX_PUSH("backward");
  const Config *c = &m->cfg;
  Backend *be = m->be;
  const BackendOps *ops = be->ops;
  Activations *x = &m->acts;
  const Weights *w = &m->w;
  Weights *gw = &m->g;
  const StageGeom *last = &m->stages[m->num_stages - 1];

  // Head: linear and mean pool -> d(final norm output) in dln.
  ops->head_backward(be, x->dln, gw->head_w, gw->head_b, x->dlogits, x->pooled, w->head_w, B,
                     last->H * last->W, last->C, c->num_classes);
  if (c->version == 2) {
    model_backward_v2(m, B, report);
    NVTX_POP();
    return;
  }

  for (int s = m->num_stages - 1; s >= 0; s--) {
    NVTX_PUSH(stage_names[s]);
    const StageGeom *g = &m->stages[s];
    int64_t L = (int64_t)g->H * g->W;
    // The last block's MLP residual (with the final norm in the last stage): dres = d(x1),
    // dbranch = d(fc2 output), summed into fc2's bias gradient. Other stages get d(stage output)
    // in dres from the merge below.
    const int last_block = g->first_block + g->depth - 1;
    const BlockActs *a = &x->blocks[last_block];
    const float *scale = m->drop_path_active ? a->dp_mlp : NULL;
    float *fc2_bias = gw->blocks[last_block].fc2_b;
    if (s == m->num_stages - 1)
      ops->residual_layernorm_backward(be, x->dres, x->dbranch, fc2_bias, gw->norm_w, gw->norm_b,
                                       NULL, x->dln, x->stage_out[s], w->norm_w, x->norm_mean,
                                       x->norm_rstd, NULL, scale, NULL, B, L, g->C);
    else
      ops->residual_layernorm_backward(be, x->dres, x->dbranch, fc2_bias, NULL, NULL, x->dres, NULL,
                                       NULL, NULL, NULL, NULL, NULL, scale, NULL, B, L, g->C);
    for (int j = g->depth - 1; j >= 0; j--) {
      bool rebuilt = m->block_recompute[g->first_block + j];
      if (rebuilt) block_recompute(m, g, j, B);
      block_backward(m, g, j, B, rebuilt);
      block_norm1_backward(m, g, j, B);
      grads_final_from(m, report, gw->blocks[g->first_block + j].norm1_w);  // its first tensor
    }
    // dbranch now holds d(stage input): back through the merge (linear, LN, gather) into dres.
    if (g->merge) {
      const StageGeom *p = &m->stages[s - 1];
      ops->linear_backward(be, x->dln, gw->merge_w[s], NULL, x->dbranch, x->merge_ln[s],
                           model_compute_weight(m, w->merge_w[s]), B * L, 4 * p->C, g->C);
      ops->merge_layernorm_backward(be, x->dres, gw->merge_norm_w[s], gw->merge_norm_b[s], x->dln,
                                    x->stage_out[s - 1], w->merge_norm_w[s], x->merge_mean[s],
                                    x->merge_rstd[s], B, p->H, p->W, p->C);
      grads_final_from(m, report, gw->merge_norm_w[s]);
    }
    NVTX_POP();
  }

  // Patch embedding: LayerNorm (d(pe) to dattn, summed into the projection's bias gradient),
  // linear (the image needs no gradient).
  int64_t L0 = (int64_t)m->Hp * m->Wp;
  ops->residual_layernorm_backward(be, NULL, x->dattn, gw->patch_b, gw->patch_norm_w,
                                   gw->patch_norm_b, NULL, x->dbranch, x->pe, w->patch_norm_w,
                                   x->pe_mean, x->pe_rstd, NULL, NULL, NULL, B, L0, c->embed_dim);
  ops->linear_backward(be, NULL, gw->patch_w, NULL, x->dattn, x->patches,
                       model_compute_weight(m, w->patch_w), B * L0, m->patch_dim, c->embed_dim);
  grads_final_from(m, report, m->grads);
  NVTX_POP();
}

void model_zero_grads(Model *m) {
  m->be->ops->zero(m->be, m->grads, sizeof(float) * (size_t)m->num_floats);
}

double model_train_flops(const Model *m, int B) {
  const Config *c = &m->cfg;
  double L0 = (double)m->Hp * m->Wp, macs = L0 * m->patch_dim * c->embed_dim;
  for (int s = 0; s < m->num_stages; s++) {
    const StageGeom *g = &m->stages[s];
    double L = (double)g->H * g->W, C = g->C, H = g->hidden;
    if (g->merge) macs += L * 2 * C * C;  // 4 C_{s-1} = 2 C inputs, C outputs
    // qkv, q k^T and P v (N keys for each of the L queries, over C channels), proj, fc1, fc2
    macs += g->depth * (L * C * 3 * C + 2 * L * g->N * C + L * C * C + 2 * L * C * H);
  }
  macs += (double)m->stages[m->num_stages - 1].C * c->num_classes;
  // V2's position-bias MLP runs once per block whatever the batch: 2 -> 512 -> heads per row.
  double cpb_macs = 0;
  for (int s = 0; s < m->num_stages; s++) {
    const StageGeom *g = &m->stages[s];
    cpb_macs += (double)g->depth * g->cpb_rows * CPB_HIDDEN * (2.0 + g->heads);
  }
  return 2.0 * 3.0 * (macs * B + cpb_macs);
}

float model_layer_lr_scale(const Model *m, int layer_id, float layer_decay) {
  return (float)pow((double)layer_decay, (double)(m->num_blocks + 1 - layer_id));
}

int model_adamw_chunks(const Model *m, float weight_decay, float layer_decay, AdamWChunk *chunks) {
  int n = 0;
  for (int i = 0; i < m->num_params; i++) {
    const Param *p = &m->params[i];
    int64_t numel = tensor_numel(&p->t);
    float lr_scale = model_layer_lr_scale(m, p->layer_id, layer_decay);
    for (int64_t off = 0; off < numel; off += MODEL_ADAMW_CHUNK, n++) {
      if (!chunks) continue;
      int64_t left = numel - off;
      chunks[n] =
          (AdamWChunk){.offset = p->offset + off,
                       .count = (int32_t)(left < MODEL_ADAMW_CHUNK ? left : MODEL_ADAMW_CHUNK),
                       .weight_decay = p->decay ? weight_decay : 0.0f,
                       .lr_scale = lr_scale};
    }
  }
  return n;
}

const Param *model_find_param(const Model *m, const char *name) {
  for (int i = 0; i < m->num_params; i++)
    if (strcmp(m->params[i].t.name, name) == 0) return &m->params[i];
  return NULL;
}

Tensor model_param_view(const Model *m, int i, const float *base) {
  Tensor t = m->params[i].t;
  t.data = (void *)(base + m->params[i].offset);
  return t;
}

// ---------------------------------------------------------------------------------------------
// Summary

static void format_count(char *buf, size_t size, int64_t n) {
  char digits[32];
  snprintf(digits, sizeof digits, "%lld", (long long)n);
  int len = (int)strlen(digits), o = 0;
  for (int i = 0; i < len && o + 2 < (int)size; i++) {
    if (i > 0 && (len - i) % 3 == 0) buf[o++] = ',';
    buf[o++] = digits[i];
  }
  buf[o] = 0;
}

static int64_t params_with_prefix(const Model *m, const char *prefix) {
  int64_t n = 0;
  size_t k = strlen(prefix);
  for (int i = 0; i < m->num_params; i++)
    if (strncmp(m->params[i].t.name, prefix, k) == 0) n += tensor_numel(&m->params[i].t);
  return n;
}

void model_print_summary(const Model *m, FILE *out) {
  const Config *c = &m->cfg;
  char count[32], buf[64];
  fprintf(out,
          "model: Swin%s, image %dx%dx%d, patch %d, embed %d, window %d, mlp %.4g, %d classes\n",
          c->version == 2 ? " V2" : "", c->img_h, c->img_w, c->in_chans, c->patch_size,
          c->embed_dim, c->window_size, (double)c->mlp_ratio, c->num_classes);
  fprintf(out, "  %-12s %-9s %6s %6s %6s %9s %8s %10s %14s\n", "stage", "tokens", "width", "depth",
          "heads", "window", "shift", "drop_path", "params");
  format_count(count, sizeof count, params_with_prefix(m, "patch_embed."));
  fprintf(out, "  %-12s %-9s %6d %6s %6s %9s %8s %10s %14s\n", "patch_embed",
          (snprintf(buf, sizeof buf, "%dx%d", m->Hp, m->Wp), buf), c->embed_dim, "-", "-", "-", "-",
          "-", count);
  for (int s = 0; s < m->num_stages; s++) {
    const StageGeom *g = &m->stages[s];
    char name[32], tokens[32], window[32], shift[32], drop[32];
    snprintf(name, sizeof name, "layers.%d", s);
    snprintf(tokens, sizeof tokens, "%dx%d", g->H, g->W);
    snprintf(window, sizeof window, "%dx%d", g->wh, g->ww);
    snprintf(shift, sizeof shift, "%d,%d", g->sh, g->sw);
    snprintf(drop, sizeof drop, "%.3f-%.3f", (double)m->block_drop[g->first_block],
             (double)m->block_drop[g->first_block + g->depth - 1]);
    char prefix[32];
    snprintf(prefix, sizeof prefix, "layers.%d.", s);
    format_count(count, sizeof count, params_with_prefix(m, prefix));
    fprintf(out, "  %-12s %-9s %6d %6d %6d %9s %8s %10s %14s\n", name, tokens, g->C, g->depth,
            g->heads, window, (g->sh || g->sw) && g->depth > 1 ? shift : "-", drop, count);
  }
  format_count(count, sizeof count,
               params_with_prefix(m, "norm.") + params_with_prefix(m, "head."));
  fprintf(out, "  %-12s %-9s %6d %6s %6s %9s %8s %10s %14s\n", "norm+head", "-", c->num_classes,
          "-", "-", "-", "-", "-", count);
  format_count(count, sizeof count, m->num_values);
  fprintf(out, "parameters: %s (%d tensors)\n", count, m->num_params);
  char recompute[256];
  model_describe_recompute(m, recompute, sizeof recompute);
  fprintf(out, "recompute: %s\n", recompute);
}

void model_describe_recompute(const Model *m, char *buf, size_t size) {
  int r = m->cfg.recompute;
  if (m->num_recomputed == 0) {
    snprintf(buf, size, "none (every block keeps its activations)");
    return;
  }
  char which[96];
  if (r < 0)
    snprintf(which, sizeof which, "all %d blocks (train.recompute=all)", m->num_recomputed);
  else
    snprintf(which, sizeof which,
             "the first %d block%s of each stage, %d of %d (train.recompute=%d)", r,
             r == 1 ? "" : "s", m->num_recomputed, m->num_blocks, r);
  snprintf(buf, size, "%s: each keeps its input and runs its forward again in the backward", which);
}
