// model.c: the Swin Transformer's geometry, parameter table, initialization, and the CPU forward
// and backward that chain the ops of kernels/ in the order of timm's SwinTransformer.
#include "src/model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/gelu.h"
#include "kernels/gemm.h"
#include "kernels/layernorm.h"
#include "kernels/loss.h"
#include "kernels/patch.h"
#include "kernels/residual.h"
#include "kernels/window.h"
#include "src/rng.h"

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
  }
  // Stochastic depth rate grows linearly over all blocks: linspace(0, rate, num_blocks).
  m->block_drop = malloc_check(sizeof(float) * (size_t)(m->num_blocks ? m->num_blocks : 1));
  for (int i = 0; i < m->num_blocks; i++)
    m->block_drop[i] =
        m->num_blocks > 1 ? (float)((double)c->drop_path_rate * i / (m->num_blocks - 1)) : 0.0f;
}

static bool block_is_shifted(const StageGeom *g, int j) {
  return (j % 2 == 1) && (g->sh || g->sw);
}

// ---------------------------------------------------------------------------------------------
// Parameters: one walk over the model in forward order defines the table (names, shapes, decay)
// and binds typed pointers into any flat buffer with the same layout. It is the only place the
// order is written down.

typedef struct {
  ParamInfo *table;  // filled when non-NULL
  float *base;       // buffer being bound, or NULL
  int index;
  int64_t offset;
} ParamWalk;

static float *param(ParamWalk *k, bool decay, int ndim, const int64_t *shape, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static float *param(ParamWalk *k, bool decay, int ndim, const int64_t *shape, const char *fmt,
                    ...) {
  int64_t numel = 1;
  for (int i = 0; i < ndim; i++) numel *= shape[i];
  if (k->table) {
    ParamInfo *p = &k->table[k->index];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->name, sizeof p->name, fmt, ap);
    va_end(ap);
    p->ndim = ndim;
    for (int i = 0; i < ndim; i++) p->shape[i] = shape[i];
    p->offset = k->offset;
    p->numel = numel;
    p->decay = decay;
  }
  float *ptr = k->base ? k->base + k->offset : NULL;
  k->index++;
  k->offset += numel;
  return ptr;
}

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})
#define NDIM(...) ((int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))
// A weight matrix or table (decay as given) and a 1-D vector (never decayed).
#define PARAM(decay, ...) param(&k, decay, NDIM(__VA_ARGS__), SHAPE(__VA_ARGS__)
#define VEC(n, ...) param(&k, false, 1, SHAPE(n), __VA_ARGS__)

// Walks every parameter in forward order: fills table when non-NULL, binds w to base when both
// are non-NULL. Returns the number of parameter tensors; sets m->num_floats.
static int walk_params(Model *m, ParamInfo *table, Weights *w, float *base) {
  const Config *c = &m->cfg;
  ParamWalk k = {.table = table, .base = base};
  Weights unused = {0};
  if (!w) w = &unused;
  int64_t E = c->embed_dim, p = c->patch_size;

  w->patch_w = PARAM(true, E, c->in_chans, p, p), "patch_embed.proj.weight");
  w->patch_b = VEC(E, "patch_embed.proj.bias");
  w->patch_norm_w = VEC(E, "patch_embed.norm.weight");
  w->patch_norm_b = VEC(E, "patch_embed.norm.bias");
  for (int s = 0; s < m->num_stages; s++) {
    const StageGeom *g = &m->stages[s];
    int64_t C = g->C;
    if (g->merge) {
      int64_t C4 = 2 * C;  // 4 * previous width
      w->merge_norm_w[s] = VEC(C4, "layers.%d.downsample.norm.weight", s);
      w->merge_norm_b[s] = VEC(C4, "layers.%d.downsample.norm.bias", s);
      w->merge_w[s] = PARAM(true, C, C4), "layers.%d.downsample.reduction.weight", s);
    }
    for (int j = 0; j < g->depth; j++) {
      BlockWeights unused_block, *b = w->blocks ? &w->blocks[g->first_block + j] : &unused_block;
      int64_t table_rows = (int64_t)(2 * g->wh - 1) * (2 * g->ww - 1), hidden = g->hidden;
#define BLK "layers.%d.blocks.%d."
      b->norm1_w = VEC(C, BLK "norm1.weight", s, j);
      b->norm1_b = VEC(C, BLK "norm1.bias", s, j);
      b->rel_table = PARAM(false, table_rows, g->heads), BLK "attn.relative_position_bias_table",
                           s, j);
      b->qkv_w = PARAM(true, 3 * C, C), BLK "attn.qkv.weight", s, j);
      b->qkv_b = c->qkv_bias ? VEC(3 * C, BLK "attn.qkv.bias", s, j) : NULL;
      b->proj_w = PARAM(true, C, C), BLK "attn.proj.weight", s, j);
      b->proj_b = VEC(C, BLK "attn.proj.bias", s, j);
      b->norm2_w = VEC(C, BLK "norm2.weight", s, j);
      b->norm2_b = VEC(C, BLK "norm2.bias", s, j);
      b->fc1_w = PARAM(true, hidden, C), BLK "mlp.fc1.weight", s, j);
      b->fc1_b = VEC(hidden, BLK "mlp.fc1.bias", s, j);
      b->fc2_w = PARAM(true, C, hidden), BLK "mlp.fc2.weight", s, j);
      b->fc2_b = VEC(C, BLK "mlp.fc2.bias", s, j);
#undef BLK
    }
  }
  int64_t Cl = m->stages[m->num_stages - 1].C;
  w->norm_w = VEC(Cl, "norm.weight");
  w->norm_b = VEC(Cl, "norm.bias");
  w->head_w = PARAM(true, c->num_classes, Cl), "head.fc.weight");
  w->head_b = VEC(c->num_classes, "head.fc.bias");
  m->num_floats = k.offset;
  return k.index;
}
#undef PARAM
#undef VEC

// ---------------------------------------------------------------------------------------------
// Activations: one plan assigns every saved tensor and scratch buffer; run once to count bytes
// (arena without memory) and once to hand out views.

static void plan_activations(Model *m, Arena *a, int B) {
  const Config *c = &m->cfg;
  Activations *x = &m->acts;
  int64_t L0 = (int64_t)m->Hp * m->Wp, E = c->embed_dim;
  x->images = arena_floats(a, (int64_t)B * c->img_h * c->img_w * c->in_chans);
  x->patches = arena_floats(a, B * L0 * m->patch_dim);
  x->pe = arena_floats(a, B * L0 * E);
  x->pe_mean = arena_floats(a, B * L0);
  x->pe_rstd = arena_floats(a, B * L0);
  int64_t max_lc = 0, max_big = 0, max_qkv = 0;
  for (int s = 0; s < m->num_stages; s++) {
    const StageGeom *g = &m->stages[s];
    int64_t BL = (int64_t)B * g->H * g->W, C = g->C;
    if (g->merge) {
      x->merged[s] = arena_floats(a, BL * 2 * C);
      x->merge_ln[s] = arena_floats(a, BL * 2 * C);
      x->merge_mean[s] = arena_floats(a, BL);
      x->merge_rstd[s] = arena_floats(a, BL);
    }
    for (int j = 0; j < g->depth; j++) {
      BlockActs *b = &x->blocks[g->first_block + j];
      b->x = arena_floats(a, BL * C);
      b->ln1_mean = arena_floats(a, BL);
      b->ln1_rstd = arena_floats(a, BL);
      b->xw = arena_floats(a, BL * C);
      b->qkv = arena_floats(a, BL * 3 * C);
      b->att = arena_floats(a, (int64_t)B * g->nW * g->heads * g->N * g->N);
      b->attn_out = arena_floats(a, BL * C);
      b->x1 = arena_floats(a, BL * C);
      b->ln2_mean = arena_floats(a, BL);
      b->ln2_rstd = arena_floats(a, BL);
      b->ln2 = arena_floats(a, BL * C);
      b->fc1 = arena_floats(a, BL * g->hidden);
      b->gelu = arena_floats(a, BL * g->hidden);
      bool drops = m->block_drop[g->first_block + j] > 0;
      b->dp_attn = drops ? arena_floats(a, B) : NULL;
      b->dp_mlp = drops ? arena_floats(a, B) : NULL;
    }
    x->stage_out[s] = arena_floats(a, BL * C);
    if (BL * C > max_lc) max_lc = BL * C;
    if (BL * g->hidden > max_big) max_big = BL * g->hidden;
    if (BL * 2 * C > max_big) max_big = BL * 2 * C;
    if (BL * 3 * C > max_qkv) max_qkv = BL * 3 * C;
  }
  const StageGeom *last = &m->stages[m->num_stages - 1];
  int64_t BLl = (int64_t)B * last->H * last->W;
  x->norm_mean = arena_floats(a, BLl);
  x->norm_rstd = arena_floats(a, BLl);
  x->norm_out = arena_floats(a, BLl * last->C);
  x->pooled = arena_floats(a, (int64_t)B * last->C);
  x->logits = arena_floats(a, (int64_t)B * c->num_classes);
  if (B * L0 * E > max_lc) max_lc = B * L0 * E;
  x->dres = arena_floats(a, max_lc);
  x->dtmp = arena_floats(a, max_lc);
  x->dwin = arena_floats(a, max_lc);
  x->dbig = arena_floats(a, max_big);
  x->dqkv = arena_floats(a, max_qkv);
}

int model_create(Model *m, const Config *cfg, int max_batch, Error *err) {
  memset(m, 0, sizeof *m);
  m->cfg = *cfg;
  if (max_batch < 0) return error_set(err, "model_create: max_batch must be >= 0");
  build_geometry(m);
  m->num_params = walk_params(m, NULL, NULL, NULL);
  m->params = calloc_check((size_t)m->num_params, sizeof(ParamInfo));
  walk_params(m, m->params, NULL, NULL);
  m->weights = aligned_alloc_check(sizeof(float) * (size_t)m->num_floats);
  m->grads = aligned_alloc_check(sizeof(float) * (size_t)m->num_floats);
  memset(m->weights, 0, sizeof(float) * (size_t)m->num_floats);
  memset(m->grads, 0, sizeof(float) * (size_t)m->num_floats);
  m->w.blocks = calloc_check((size_t)m->num_blocks, sizeof(BlockWeights));
  m->g.blocks = calloc_check((size_t)m->num_blocks, sizeof(BlockWeights));
  walk_params(m, NULL, &m->w, m->weights);
  walk_params(m, NULL, &m->g, m->grads);

  m->max_batch = max_batch;
  m->acts.blocks = calloc_check((size_t)m->num_blocks, sizeof(BlockActs));
  if (max_batch == 0) return 0;  // weights only (dry run, export)
  Arena counting = {.name = "activations (counting)"};
  plan_activations(m, &counting, max_batch);
  arena_init(&m->acts_arena, "activations", DEVICE_CPU, counting.used);
  plan_activations(m, &m->acts_arena, max_batch);
  return 0;
}

void model_destroy(Model *m) {
  for (int s = 0; s < m->num_stages; s++) {
    free(m->stages[s].rel_index);
    free(m->stages[s].mask);
  }
  free(m->block_drop);
  free(m->params);
  free(m->weights);
  free(m->grads);
  free(m->w.blocks);
  free(m->g.blocks);
  free(m->acts.blocks);
  arena_free(&m->acts_arena);
  memset(m, 0, sizeof *m);
}

// ---------------------------------------------------------------------------------------------
// Initialization (timm / official): Linear weights and the bias tables trunc_normal(std 0.02,
// cut at +-2), biases 0, LayerNorm 1 / 0; the patch conv keeps PyTorch's Conv2d default,
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias. Each tensor draws from its own RNG
// stream keyed by its index, so the result does not depend on anything but the seed.

static double normal_draw(Rng *r) {
  double u1 = rng_uniform_double(r), u2 = rng_uniform_double(r);
  return sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2);
}

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && strcmp(s + n - k, suffix) == 0;
}

void model_init_weights(Model *m, uint64_t seed) {
  for (int i = 0; i < m->num_params; i++) {
    const ParamInfo *p = &m->params[i];
    float *x = m->weights + p->offset;
    Rng r = rng_make(seed, RNG_STREAM_INIT, (uint64_t)i, 0);
    if (strncmp(p->name, "patch_embed.proj.", 17) == 0) {
      double bound = 1.0 / sqrt((double)m->patch_dim);
      for (int64_t j = 0; j < p->numel; j++)
        x[j] = (float)((2.0 * rng_uniform_double(&r) - 1.0) * bound);
    } else if (strstr(p->name, "norm")) {
      float v = ends_with(p->name, ".weight") ? 1.0f : 0.0f;
      for (int64_t j = 0; j < p->numel; j++) x[j] = v;
    } else if (ends_with(p->name, ".bias")) {
      memset(x, 0, sizeof(float) * (size_t)p->numel);
    } else {
      for (int64_t j = 0; j < p->numel; j++) {
        double v;
        do v = 0.02 * normal_draw(&r);
        while (v < -2.0 || v > 2.0);
        x[j] = (float)v;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Forward

// out += in, elementwise (the residual stream's second gradient path).
static void add_inplace(float *out, const float *in, int64_t n) {
  residual_forward_cpu(out, out, in, NULL, 1, n);
}

static void draw_drop_path(float *scale, float rate, int B, uint64_t seed, int64_t step,
                           int64_t unit) {
  // timm drop_path: keep with probability 1 - rate, kept samples scaled by 1 / keep.
  float keep = 1.0f - rate;
  Rng r = rng_make(seed, RNG_STREAM_DROP_PATH, (uint64_t)step, (uint64_t)unit);
  for (int b = 0; b < B; b++) scale[b] = rng_uniform(&r) < keep ? 1.0f / keep : 0.0f;
}

static void block_forward(Model *m, int s, int j, int B, float *out) {
  const StageGeom *g = &m->stages[s];
  int gi = g->first_block + j;
  const BlockWeights *w = &m->w.blocks[gi];
  BlockActs *a = &m->acts.blocks[gi];
  Activations *x = &m->acts;
  int C = g->C, BW = B * g->nW;
  int64_t BL = (int64_t)B * g->H * g->W;
  bool shifted = block_is_shifted(g, j);
  int sh = shifted ? g->sh : 0, sw = shifted ? g->sw : 0;
  const float *dp_attn = m->drop_path_active ? a->dp_attn : NULL;
  const float *dp_mlp = m->drop_path_active ? a->dp_mlp : NULL;

  // x1 = x + drop_path(reverse(proj(attention(qkv(partition(LN1(x)))))))
  layernorm_forward_cpu(x->dtmp, a->ln1_mean, a->ln1_rstd, a->x, w->norm1_w, w->norm1_b, BL, C);
  window_partition_cpu(a->xw, x->dtmp, B, g->H, g->W, C, g->wh, g->ww, sh, sw);
  linear_forward_cpu(a->qkv, a->xw, w->qkv_w, w->qkv_b, BL, C, 3 * C);
  window_attention_forward_cpu(a->attn_out, a->att, a->qkv, w->rel_table, g->rel_index,
                               shifted ? g->mask : NULL, BW, g->nW, g->N, C, g->heads);
  linear_forward_cpu(x->dwin, a->attn_out, w->proj_w, w->proj_b, BL, C, C);
  window_reverse_cpu(x->dtmp, x->dwin, B, g->H, g->W, C, g->wh, g->ww, sh, sw);
  residual_forward_cpu(a->x1, a->x, x->dtmp, dp_attn, B, BL / B * C);
  // out = x1 + drop_path(fc2(GELU(fc1(LN2(x1)))))
  layernorm_forward_cpu(a->ln2, a->ln2_mean, a->ln2_rstd, a->x1, w->norm2_w, w->norm2_b, BL, C);
  linear_forward_cpu(a->fc1, a->ln2, w->fc1_w, w->fc1_b, BL, C, g->hidden);
  gelu_forward_cpu(a->gelu, a->fc1, BL * g->hidden);
  linear_forward_cpu(x->dtmp, a->gelu, w->fc2_w, w->fc2_b, BL, g->hidden, C);
  residual_forward_cpu(out, a->x1, x->dtmp, dp_mlp, B, BL / B * C);
}

void model_forward(Model *m, const float *images, int B, bool train, uint64_t seed, int64_t step) {
  const Config *c = &m->cfg;
  Activations *x = &m->acts;
  const Weights *w = &m->w;
  int64_t L0 = (int64_t)m->Hp * m->Wp;
  int E = c->embed_dim;

  m->drop_path_active = train && c->drop_path_rate > 0;
  if (m->drop_path_active)
    for (int i = 0; i < m->num_blocks; i++)
      if (m->block_drop[i] > 0) {
        draw_drop_path(x->blocks[i].dp_attn, m->block_drop[i], B, seed, step, 2 * i);
        draw_drop_path(x->blocks[i].dp_mlp, m->block_drop[i], B, seed, step, 2 * i + 1);
      }

  // Patch embedding: gather p x p patches, linear (= the strided conv), LayerNorm.
  patch_gather_cpu(x->patches, images, B, c->img_h, c->img_w, c->in_chans, c->patch_size);
  linear_forward_cpu(x->pe, x->patches, w->patch_w, w->patch_b, B * L0, m->patch_dim, E);
  layernorm_forward_cpu(x->blocks[0].x, x->pe_mean, x->pe_rstd, x->pe, w->patch_norm_w,
                        w->patch_norm_b, B * L0, E);

  for (int s = 0; s < m->num_stages; s++) {
    const StageGeom *g = &m->stages[s];
    int64_t BL = (int64_t)B * g->H * g->W;
    if (g->merge) {
      const StageGeom *p = &m->stages[s - 1];
      patch_merge_forward_cpu(x->merged[s], x->stage_out[s - 1], B, p->H, p->W, p->C);
      layernorm_forward_cpu(x->merge_ln[s], x->merge_mean[s], x->merge_rstd[s], x->merged[s],
                            w->merge_norm_w[s], w->merge_norm_b[s], BL, 4 * p->C);
      linear_forward_cpu(x->blocks[g->first_block].x, x->merge_ln[s], w->merge_w[s], NULL, BL,
                         4 * p->C, g->C);
    }
    for (int j = 0; j < g->depth; j++) {
      float *out = j + 1 < g->depth ? x->blocks[g->first_block + j + 1].x : x->stage_out[s];
      block_forward(m, s, j, B, out);
    }
  }

  // Head: LayerNorm, mean over tokens, linear.
  const StageGeom *g = &m->stages[m->num_stages - 1];
  int L = g->H * g->W;
  layernorm_forward_cpu(x->norm_out, x->norm_mean, x->norm_rstd, x->stage_out[m->num_stages - 1],
                        w->norm_w, w->norm_b, (int64_t)B * L, g->C);
  mean_pool_forward_cpu(x->pooled, x->norm_out, B, L, g->C);
  linear_forward_cpu(x->logits, x->pooled, w->head_w, w->head_b, B, g->C, c->num_classes);
}

// ---------------------------------------------------------------------------------------------
// Backward: the residual stream's gradient lives in dres and is carried from the head down to
// the patch embedding; parameter gradients accumulate into m->grads.

static void block_backward(Model *m, int s, int j, int B) {
  const StageGeom *g = &m->stages[s];
  int gi = g->first_block + j;
  const BlockWeights *w = &m->w.blocks[gi];
  BlockWeights *gw = &m->g.blocks[gi];
  BlockActs *a = &m->acts.blocks[gi];
  Activations *x = &m->acts;
  int C = g->C, BW = B * g->nW;
  int64_t BL = (int64_t)B * g->H * g->W, per_sample = BL / B * C;
  bool shifted = block_is_shifted(g, j);
  int sh = shifted ? g->sh : 0, sw = shifted ? g->sw : 0;
  const float *dp_attn = m->drop_path_active ? a->dp_attn : NULL;
  const float *dp_mlp = m->drop_path_active ? a->dp_mlp : NULL;

  // MLP branch; dres holds d(out) and becomes d(x1).
  residual_backward_cpu(x->dtmp, x->dres, dp_mlp, B, per_sample);
  linear_backward_cpu(x->dbig, gw->fc2_w, gw->fc2_b, x->dtmp, a->gelu, w->fc2_w, BL, g->hidden, C);
  gelu_backward_cpu(x->dbig, a->fc1, x->dbig, BL * g->hidden);
  linear_backward_cpu(x->dtmp, gw->fc1_w, gw->fc1_b, x->dbig, a->ln2, w->fc1_w, BL, C, g->hidden);
  layernorm_backward_cpu(x->dwin, gw->norm2_w, gw->norm2_b, x->dtmp, a->x1, w->norm2_w, a->ln2_mean,
                         a->ln2_rstd, BL, C);
  add_inplace(x->dres, x->dwin, BL * C);

  // Attention branch; dres becomes d(x).
  residual_backward_cpu(x->dtmp, x->dres, dp_attn, B, per_sample);
  window_partition_cpu(x->dwin, x->dtmp, B, g->H, g->W, C, g->wh, g->ww, sh, sw);
  linear_backward_cpu(x->dtmp, gw->proj_w, gw->proj_b, x->dwin, a->attn_out, w->proj_w, BL, C, C);
  window_attention_backward_cpu(x->dqkv, gw->rel_table, x->dtmp, a->qkv, a->att, g->rel_index, BW,
                                g->N, C, g->heads);
  linear_backward_cpu(x->dwin, gw->qkv_w, gw->qkv_b, x->dqkv, a->xw, w->qkv_w, BL, C, 3 * C);
  window_reverse_cpu(x->dtmp, x->dwin, B, g->H, g->W, C, g->wh, g->ww, sh, sw);
  layernorm_backward_cpu(x->dwin, gw->norm1_w, gw->norm1_b, x->dtmp, a->x, w->norm1_w, a->ln1_mean,
                         a->ln1_rstd, BL, C);
  add_inplace(x->dres, x->dwin, BL * C);
}

void model_backward(Model *m, const float *dlogits, int B) {
  const Config *c = &m->cfg;
  Activations *x = &m->acts;
  const Weights *w = &m->w;
  Weights *gw = &m->g;
  const StageGeom *last = &m->stages[m->num_stages - 1];
  int L = last->H * last->W;

  // Head: linear, mean pool, LayerNorm -> d(last stage output) in dres.
  linear_backward_cpu(x->dtmp, gw->head_w, gw->head_b, dlogits, x->pooled, w->head_w, B, last->C,
                      c->num_classes);
  mean_pool_backward_cpu(x->dwin, x->dtmp, B, L, last->C);
  layernorm_backward_cpu(x->dres, gw->norm_w, gw->norm_b, x->dwin, x->stage_out[m->num_stages - 1],
                         w->norm_w, x->norm_mean, x->norm_rstd, (int64_t)B * L, last->C);

  for (int s = m->num_stages - 1; s >= 0; s--) {
    const StageGeom *g = &m->stages[s];
    for (int j = g->depth - 1; j >= 0; j--) block_backward(m, s, j, B);
    if (g->merge) {
      const StageGeom *p = &m->stages[s - 1];
      int64_t BL = (int64_t)B * g->H * g->W;
      linear_backward_cpu(x->dbig, gw->merge_w[s], NULL, x->dres, x->merge_ln[s], w->merge_w[s], BL,
                          4 * p->C, g->C);
      layernorm_backward_cpu(x->dqkv, gw->merge_norm_w[s], gw->merge_norm_b[s], x->dbig,
                             x->merged[s], w->merge_norm_w[s], x->merge_mean[s], x->merge_rstd[s],
                             BL, 4 * p->C);
      patch_merge_backward_cpu(x->dres, x->dqkv, B, p->H, p->W, p->C);
    }
  }

  // Patch embedding: LayerNorm, linear (the image itself needs no gradient).
  int64_t BL0 = (int64_t)B * m->Hp * m->Wp;
  layernorm_backward_cpu(x->dtmp, gw->patch_norm_w, gw->patch_norm_b, x->dres, x->pe,
                         w->patch_norm_w, x->pe_mean, x->pe_rstd, BL0, c->embed_dim);
  linear_backward_cpu(NULL, gw->patch_w, gw->patch_b, x->dtmp, x->patches, w->patch_w, BL0,
                      m->patch_dim, c->embed_dim);
}

void model_zero_grads(Model *m) {
  memset(m->grads, 0, sizeof(float) * (size_t)m->num_floats);
}

const ParamInfo *model_find_param(const Model *m, const char *name) {
  for (int i = 0; i < m->num_params; i++)
    if (strcmp(m->params[i].name, name) == 0) return &m->params[i];
  return NULL;
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
    if (strncmp(m->params[i].name, prefix, k) == 0) n += m->params[i].numel;
  return n;
}

void model_print_summary(const Model *m, FILE *out) {
  const Config *c = &m->cfg;
  char count[32], buf[64];
  fprintf(out, "model: Swin, image %dx%dx%d, patch %d, embed %d, window %d, mlp %.4g, %d classes\n",
          c->img_h, c->img_w, c->in_chans, c->patch_size, c->embed_dim, c->window_size,
          (double)c->mlp_ratio, c->num_classes);
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
  format_count(count, sizeof count, m->num_floats);
  fprintf(out, "parameters: %s (%d tensors)\n", count, m->num_params);
}
