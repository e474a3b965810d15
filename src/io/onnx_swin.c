// onnx_swin.c: the inference graph of a Swin Transformer as ONNX nodes (the layout is described
// at the top of src/io/onnx.h). Geometry comes from the Model (StageGeom: map, windows, shifts,
// relative position index, shift mask); only model.h's rule "odd blocks shift" is restated.
//
// The residual stream is kept as rows, tokens (N*H*W, C) in (n, h, w) order, so each linear
// layer is one Gemm with the timm weight as is (transB = 1) and its bias; window partition,
// reverse and patch merging are Reshape/Transpose pairs around it, the cyclic shift is a
// Slice/Concat roll per shifted axis. Every Reshape leaves only the batch-dependent dimension
// as -1, so the same graph serves a dynamic and a fixed batch.
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cosine_attention.h"
#include "src/base/config.h"
#include "src/io/onnx.h"
#include "src/io/safetensors.h"

typedef struct {
  OnnxModel *om;
  const Model *m;
  int elem;  // ONNX_FLOAT or ONNX_FLOAT16: the weights' and the arithmetic's type
} Graph;

typedef char Name[ONNX_NAME_MAX];

static const char *fmt(Name buf, const char *format, ...) __attribute__((format(printf, 2, 3)));
static const char *fmt(Name buf, const char *format, ...) {
  va_list ap;
  va_start(ap, format);
  vsnprintf(buf, ONNX_NAME_MAX, format, ap);
  va_end(ap);
  return buf;
}

// A node whose one output value carries the node's name; inputs end with NULL.
static OnnxNode *node(Graph *g, const char *op_type, const char *name, ...) {
  OnnxNode *n = onnx_add_node(g->om, op_type, name);
  va_list ap;
  va_start(ap, name);
  for (const char *in = va_arg(ap, const char *); in; in = va_arg(ap, const char *))
    onnx_node_input(n, in);
  va_end(ap);
  onnx_node_output(n, name);
  return n;
}

// ---------------------------------------------------------------------------------------------
// Initializers

// Values in the graph's type: f32 as given, or rounded to f16 (owned copy).
static OnnxTensor *add_values(Graph *g, const char *name, int ndim, const int64_t *dims,
                              const float *values, float *owned_f32) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= dims[d];
  if (g->elem == ONNX_FLOAT)
    return onnx_add_initializer(g->om, name, ONNX_FLOAT, ndim, dims, values, owned_f32);
  uint16_t *half = malloc_check(sizeof *half * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) half[i] = f32_to_f16(values[i]);
  free(owned_f32);
  return onnx_add_initializer(g->om, name, ONNX_FLOAT16, ndim, dims, half, half);
}

// A timm parameter under its own name and shape.
static const char *param(Graph *g, const char *name) {
  const Param *p = model_find_param(g->m, name);
  if (!p) {  // the graph asks only for parameters the model's own table defines
    fprintf(stderr, "onnx_swin: the model has no parameter '%s'\n", name);
    abort();
  }
  return add_values(g, p->t.name, p->t.ndim, p->t.shape, g->m->weights + p->offset, NULL)->name;
}

// A scalar constant in the graph's type.
static const char *scalar(Graph *g, const char *name, float v) {
  if (onnx_find_initializer(g->om, name)) return name;
  float *value = malloc_check(sizeof *value);
  *value = v;
  return add_values(g, name, 0, NULL, value, value)->name;
}

// An int64 constant named after its values: "i64[-1,8,8,48]" (1-D) or "i64(2)" (a scalar).
static const char *ints(Graph *g, bool is_scalar, int count, const int64_t *v) {
  Name name;
  int o = snprintf(name, sizeof name, "i64%c", is_scalar ? '(' : '[');
  for (int i = 0; i < count; i++)
    o += snprintf(name + o, sizeof name - (size_t)o, "%s%lld", i ? "," : "", (long long)v[i]);
  snprintf(name + o, sizeof name - (size_t)o, "%c", is_scalar ? ')' : ']');
  const OnnxTensor *have = onnx_find_initializer(g->om, name);
  if (have) return have->name;
  int64_t *data = malloc_check(sizeof *data * (size_t)count);
  memcpy(data, v, sizeof *data * (size_t)count);
  int64_t dims[1] = {count};
  return onnx_add_initializer(g->om, name, ONNX_INT64, is_scalar ? 0 : 1, dims, data, data)->name;
}

#define I64(...) \
  ints(g, false, (int)(sizeof((int64_t[]){__VA_ARGS__}) / 8), (int64_t[]){__VA_ARGS__})

// ---------------------------------------------------------------------------------------------
// Layers

static const char *reshape(Graph *g, const char *name, const char *x, const char *shape) {
  return node(g, "Reshape", name, x, shape, NULL)->name;
}

static const char *transpose(Graph *g, const char *name, const char *x, int n,
                             const int64_t *perm) {
  OnnxNode *t = node(g, "Transpose", name, x, NULL);
  onnx_attr_ints(t, "perm", n, perm);
  return t->name;
}
#define PERM(...)                                            \
  (int)(sizeof((int64_t[]){__VA_ARGS__}) / 8), (int64_t[]) { \
    __VA_ARGS__                                              \
  }

// LayerNorm over the last axis (eps 1e-5, as timm's nn.LayerNorm); module.weight / module.bias.
static const char *layernorm(Graph *g, const char *module, const char *x) {
  Name w, b;
  OnnxNode *n = node(g, "LayerNormalization", module, x, param(g, fmt(w, "%s.weight", module)),
                     param(g, fmt(b, "%s.bias", module)), NULL);
  onnx_attr_int(n, "axis", -1);
  onnx_attr_float(n, "epsilon", 1e-5f);
  return n->name;
}

// nn.Linear on rows: Gemm(x, weight^T) + bias, the weight in timm's (out, in) layout.
static const char *linear(Graph *g, const char *module, const char *x, bool has_bias) {
  Name w, b;
  const char *weight = param(g, fmt(w, "%s.weight", module));
  const char *bias = has_bias ? param(g, fmt(b, "%s.bias", module)) : NULL;
  OnnxNode *n = node(g, "Gemm", module, x, weight, bias, NULL);
  onnx_attr_int(n, "transB", 1);
  return n->name;
}

// Exact GELU, 0.5 x (1 + erf(x / sqrt 2)), written as PyTorch exports it (Div, Erf, Add, Mul,
// Mul) so ONNX Runtime's and TensorRT's GELU fusions recognize it.
static const char *gelu(Graph *g, const char *module, const char *x) {
  Name div, erf, add, mul;
  node(g, "Div", fmt(div, "%s.div", module), x, scalar(g, "f.sqrt2", 1.4142135623730951f), NULL);
  node(g, "Erf", fmt(erf, "%s.erf", module), div, NULL);
  node(g, "Add", fmt(add, "%s.add", module), erf, scalar(g, "f.one", 1.0f), NULL);
  node(g, "Mul", fmt(mul, "%s.mul", module), x, add, NULL);
  return node(g, "Mul", module, mul, scalar(g, "f.half", 0.5f), NULL)->name;
}

// torch.roll by -shift along axis of a map (N, H, W, C): out[i] = x[(i + shift) % size], the
// concatenation of x[shift:] and x[:shift]. Rolling back by +s is a roll by size - s.
static const char *roll(Graph *g, const char *name, const char *x, int64_t axis, int64_t size,
                        int64_t shift) {
  Name tail, head;
  const char *axes = I64(axis);
  node(g, "Slice", fmt(tail, "%s.tail", name), x, I64(shift), I64(size), axes, NULL);
  node(g, "Slice", fmt(head, "%s.head", name), x, I64(0), I64(shift), axes, NULL);
  OnnxNode *n = node(g, "Concat", name, tail, head, NULL);
  onnx_attr_int(n, "axis", axis);
  return n->name;
}

// The cyclic shift of a block's rows (N*H*W, C) as a map (N, H, W, C), rolled along each axis
// that shifts; `back` rolls by (+sh, +sw) instead of (-sh, -sw). Returns the map.
static const char *shift_map(Graph *g, const char *prefix, const char *map, const StageGeom *st,
                             bool back) {
  Name rows, cols;
  const char *x = map;
  if (st->sh)
    x = roll(g, fmt(rows, "%s.rows", prefix), x, 1, st->H, back ? st->H - st->sh : st->sh);
  if (st->sw)
    x = roll(g, fmt(cols, "%s.cols", prefix), x, 2, st->W, back ? st->W - st->sw : st->sw);
  return x;
}

// Rows (N*H*W, C) -> windows as rows (N*nW*wh*ww, C), after the shift when `shifted`.
static const char *window_partition(Graph *g, const char *block, const char *x, const StageGeom *st,
                                    bool shifted) {
  Name map, split, perm, out, prefix;
  if (shifted)
    x = shift_map(g, fmt(prefix, "%s.shift", block),
                  reshape(g, fmt(map, "%s.shift.map", block), x, I64(-1, st->H, st->W, st->C)), st,
                  false);
  reshape(g, fmt(split, "%s.window_partition.reshape", block), x,
          I64(-1, st->H / st->wh, st->wh, st->W / st->ww, st->ww, st->C));
  transpose(g, fmt(perm, "%s.window_partition.transpose", block), split, PERM(0, 1, 3, 2, 4, 5));
  return reshape(g, fmt(out, "%s.window_partition", block), perm, I64(-1, st->C));
}

// Windows as rows -> rows (N*H*W, C), rolled back when `shifted`.
static const char *window_reverse(Graph *g, const char *block, const char *x, const StageGeom *st,
                                  bool shifted) {
  Name split, perm, out, prefix;
  reshape(g, fmt(split, "%s.window_reverse.reshape", block), x,
          I64(-1, st->H / st->wh, st->W / st->ww, st->wh, st->ww, st->C));
  const char *map =
      transpose(g, fmt(perm, "%s.window_reverse.transpose", block), split, PERM(0, 1, 3, 2, 4, 5));
  if (shifted) {
    // The transpose gives (N, H/wh, wh, W/ww, ww, C); the roll wants (N, H, W, C).
    Name as_map;
    map = reshape(g, fmt(as_map, "%s.unshift.map", block), map, I64(-1, st->H, st->W, st->C));
    map = shift_map(g, fmt(prefix, "%s.unshift", block), map, st, true);
  }
  return reshape(g, fmt(out, "%s.window_reverse", block), map, I64(-1, st->C));
}

// The block's attention bias, table[index[i][j]][h] laid out (heads, N, N); in a shifted block
// with the shift mask added, (nW, heads, N, N).
static const char *attention_bias(Graph *g, const char *block, const StageGeom *st,
                                  const float *table, bool shifted) {
  int64_t N = st->N, heads = st->heads, nW = shifted ? st->nW : 1;
  float *bias = malloc_check(sizeof *bias * (size_t)(nW * heads * N * N));
  for (int64_t w = 0; w < nW; w++)
    for (int64_t h = 0; h < heads; h++)
      for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < N; j++) {
          float v = table[(int64_t)st->rel_index[i * N + j] * heads + h];
          if (shifted) v += st->mask[(w * N + i) * N + j];
          bias[((w * heads + h) * N + i) * N + j] = v;
        }
  Name name;
  if (shifted)
    return add_values(g, fmt(name, "%s.attn.relative_position_bias_masked", block), 4,
                      (int64_t[]){nW, heads, N, N}, bias, bias)
        ->name;
  return add_values(g, fmt(name, "%s.attn.relative_position_bias", block), 3,
                    (int64_t[]){heads, N, N}, bias, bias)
      ->name;
}

// The qkv output (rows) as q, k, v (B_, heads, N, hd), named in part.
static void split_qkv(Graph *g, const char *block, const char *qkv, const StageGeom *st,
                      Name part[3]) {
  Name heads5, qkv_t;
  reshape(g, fmt(heads5, "%s.attn.qkv.heads", block), qkv,
          I64(-1, st->N, 3, st->heads, st->head_dim));
  // (B_, N, 3, heads, hd) -> (3, B_, heads, N, hd), then q, k, v = one index each of axis 0.
  transpose(g, fmt(qkv_t, "%s.attn.qkv.transpose", block), heads5, PERM(2, 0, 3, 1, 4));
  const char *suffix[3] = {"q", "k", "v"};
  for (int i = 0; i < 3; i++) {
    OnnxNode *n = node(g, "Gather", fmt(part[i], "%s.attn.%s", block, suffix[i]), qkv_t,
                       ints(g, true, 1, (int64_t[]){i}), NULL);
    onnx_attr_int(n, "axis", 0);
  }
}

// From q (scaled) and k (B_, heads, N, hd): the scores plus the block's bias from table (+ the
// mask), softmax, times v, back to rows (B_*N, C), the proj output.
static const char *attention_scores_to_proj(Graph *g, const char *block, const char *q,
                                            const char *k, const char *v, const float *table,
                                            const StageGeom *st, bool shifted) {
  int64_t N = st->N, heads = st->heads;
  Name kt, scores, win, biased, flat, soft, ctx, ctx_t, rows, proj;
  transpose(g, fmt(kt, "%s.attn.k_t", block), k, PERM(0, 1, 3, 2));
  const char *s = node(g, "MatMul", fmt(scores, "%s.attn.scores", block), q, kt, NULL)->name;
  const char *bias = attention_bias(g, block, st, table, shifted);
  if (shifted) {
    // (B_, heads, N, N) as (N_img, nW, heads, N, N): window b of an image takes mask b % nW.
    s = reshape(g, fmt(win, "%s.attn.scores.windows", block), s, I64(-1, st->nW, heads, N, N));
    s = node(g, "Add", fmt(biased, "%s.attn.scores_biased", block), s, bias, NULL)->name;
    s = reshape(g, fmt(flat, "%s.attn.scores_biased.flat", block), s, I64(-1, heads, N, N));
  } else {
    s = node(g, "Add", fmt(biased, "%s.attn.scores_biased", block), s, bias, NULL)->name;
  }
  OnnxNode *sm = node(g, "Softmax", fmt(soft, "%s.attn.softmax", block), s, NULL);
  onnx_attr_int(sm, "axis", -1);
  node(g, "MatMul", fmt(ctx, "%s.attn.context", block), soft, v, NULL);
  // (B_, heads, N, hd) -> (B_, N, heads, hd) -> rows (B_*N, C), channel h*hd + d.
  transpose(g, fmt(ctx_t, "%s.attn.context.transpose", block), ctx, PERM(0, 2, 1, 3));
  reshape(g, fmt(rows, "%s.attn.context.rows", block), ctx_t, I64(-1, st->C));
  return linear(g, fmt(proj, "%s.attn.proj", block), rows, true);
}

// Window attention on windows as rows (N*nW*Nt, C) -> the proj output, same shape.
static const char *attention(Graph *g, const char *block, const char *x, const StageGeom *st,
                             const BlockWeights *w, bool shifted) {
  int64_t hd = st->head_dim;
  Name module, part[3], qs, scale_name;
  split_qkv(g, block, linear(g, fmt(module, "%s.attn.qkv", block), x, g->m->cfg.qkv_bias), st,
            part);
  node(g, "Mul", fmt(qs, "%s.attn.q_scaled", block), part[0],
       scalar(g, fmt(scale_name, "f.head_dim_%lld^-0.5", (long long)hd),
              (float)(1.0 / sqrt((double)hd))),
       NULL);
  return attention_scores_to_proj(g, block, qs, part[1], part[2], w->rel_table, st, shifted);
}

// F.normalize over the last axis: x / max(|x|, eps).
static const char *l2_normalize(Graph *g, const char *name, const char *x) {
  Name norm, clamped;
  OnnxNode *n = node(g, "ReduceL2", fmt(norm, "%s.norm", name), x, NULL);
  onnx_attr_ints(n, "axes", 1, (int64_t[]){-1});
  onnx_attr_int(n, "keepdims", 1);
  node(g, "Max", fmt(clamped, "%s.norm_clamped", name), norm,
       scalar(g, "f.normalize_eps", COSINE_NORM_EPS), NULL);
  return node(g, "Div", name, x, clamped, NULL)->name;
}

// V2's window attention on windows as rows -> the proj output. What depends on the weights
// alone is computed here once, as timm computes it in every forward: the qkv bias (q_bias, 0,
// v_bias), each head's exp(min(logit_scale, ln 100)), and the position-bias table 16 sigmoid(
// cpb_mlp(coords)) (kernels/cosine_attention.h's CPU reference), gathered like V1's table.
static const char *attention_v2(Graph *g, const char *block, const char *x, const StageGeom *st,
                                const BlockWeights *w, bool shifted) {
  int64_t heads = st->heads, C = st->C;
  Name module, weight, bias_name, part[3], qn, kn, qs, scale_name;
  OnnxNode *qkv = node(g, "Gemm", fmt(module, "%s.attn.qkv", block), x,
                       param(g, fmt(weight, "%s.attn.qkv.weight", block)), NULL);
  onnx_attr_int(qkv, "transB", 1);
  if (w->q_bias) {
    float *b = calloc_check((size_t)(3 * C), sizeof *b);
    memcpy(b, w->q_bias, sizeof *b * (size_t)C);
    memcpy(b + 2 * C, w->v_bias, sizeof *b * (size_t)C);
    onnx_node_input(
        qkv, add_values(g, fmt(bias_name, "%s.attn.qkv_bias", block), 1, (int64_t[]){3 * C}, b, b)
                 ->name);
  }
  split_qkv(g, block, module, st, part);
  l2_normalize(g, fmt(qn, "%s.attn.q_normalized", block), part[0]);
  l2_normalize(g, fmt(kn, "%s.attn.k_normalized", block), part[1]);
  float *scale = malloc_check(sizeof *scale * (size_t)heads);
  for (int64_t h = 0; h < heads; h++) scale[h] = expf(fminf(w->logit_scale[h], COSINE_LOGIT_MAX));
  node(g, "Mul", fmt(qs, "%s.attn.q_scaled", block), qn,
       add_values(g, fmt(scale_name, "%s.attn.logit_scale_clamped_exp", block), 3,
                  (int64_t[]){heads, 1, 1}, scale, scale)
           ->name,
       NULL);
  float *table = malloc_check(sizeof *table * (size_t)(st->cpb_rows * heads));
  float *hidden = malloc_check(sizeof *hidden * (size_t)st->cpb_rows * CPB_HIDDEN);
  cpb_forward_cpu(table, hidden, st->cpb_coords, w->cpb_w1, w->cpb_b1, w->cpb_w2, st->cpb_rows,
                  st->heads);
  free(hidden);
  const char *proj = attention_scores_to_proj(g, block, qs, kn, part[2], table, st, shifted);
  free(table);
  return proj;
}

// V2 block (res-post-norm): x1 = x + norm1(attn(x)), out = x1 + norm2(mlp(x1)).
static const char *block_v2(Graph *g, int s, int j, const char *x) {
  const StageGeom *st = &g->m->stages[s];
  const BlockWeights *w = &g->m->w.blocks[st->first_block + j];
  bool shifted = (j % 2 == 1) && (st->sh || st->sw);
  bool windows = st->nW > 1;
  Name prefix, module, res1, fc1, act, fc2;
  fmt(prefix, "layers.%d.blocks.%d", s, j);
  const char *h = windows ? window_partition(g, prefix, x, st, shifted) : x;
  h = attention_v2(g, prefix, h, st, w, shifted);
  if (windows) h = window_reverse(g, prefix, h, st, shifted);
  h = layernorm(g, fmt(module, "%s.norm1", prefix), h);
  const char *x1 = node(g, "Add", fmt(res1, "%s.attn_residual", prefix), x, h, NULL)->name;
  h = linear(g, fmt(fc1, "%s.mlp.fc1", prefix), x1, true);
  h = gelu(g, fmt(act, "%s.mlp.act", prefix), h);
  h = linear(g, fmt(fc2, "%s.mlp.fc2", prefix), h, true);
  h = layernorm(g, fmt(module, "%s.norm2", prefix), h);
  return node(g, "Add", prefix, x1, h, NULL)->name;
}

static const char *block(Graph *g, int s, int j, const char *x) {
  const StageGeom *st = &g->m->stages[s];
  const BlockWeights *w = &g->m->w.blocks[st->first_block + j];
  // Odd blocks of a stage that shifts at all (model.h: a side shifts only when larger than the
  // window).
  bool shifted = (j % 2 == 1) && (st->sh || st->sw);
  bool windows = st->nW > 1;  // one window per image: partition and reverse are identities
  Name prefix, module, res1, fc1, act, fc2;
  fmt(prefix, "layers.%d.blocks.%d", s, j);
  const char *h = layernorm(g, fmt(module, "%s.norm1", prefix), x);
  if (windows) h = window_partition(g, prefix, h, st, shifted);
  h = attention(g, prefix, h, st, w, shifted);
  if (windows) h = window_reverse(g, prefix, h, st, shifted);
  const char *x1 = node(g, "Add", fmt(res1, "%s.attn_residual", prefix), x, h, NULL)->name;
  h = layernorm(g, fmt(module, "%s.norm2", prefix), x1);
  h = linear(g, fmt(fc1, "%s.mlp.fc1", prefix), h, true);
  h = gelu(g, fmt(act, "%s.mlp.act", prefix), h);
  h = linear(g, fmt(fc2, "%s.mlp.fc2", prefix), h, true);
  return node(g, "Add", prefix, x1, h, NULL)->name;  // the block's output carries its name
}

// Patch merging at the start of stage s: rows of the previous map (N*H*W, C) -> the 2x2
// neighbourhoods' channels [x(0::2,0::2), x(1::2,0::2), x(0::2,1::2), x(1::2,1::2)] (timm's
// reshape(N, H/2, 2, W/2, 2, C).permute(0, 1, 3, 4, 2, 5)), LayerNorm, reduction (V2: reduction,
// LayerNorm).
static const char *downsample(Graph *g, int s, const char *x) {
  const StageGeom *p = &g->m->stages[s - 1];
  Name split, perm, rows, norm, red;
  reshape(g, fmt(split, "layers.%d.downsample.gather.reshape", s), x,
          I64(-1, p->H / 2, 2, p->W / 2, 2, p->C));
  transpose(g, fmt(perm, "layers.%d.downsample.gather.transpose", s), split,
            PERM(0, 1, 3, 4, 2, 5));
  reshape(g, fmt(rows, "layers.%d.downsample.gather", s), perm, I64(-1, 4 * p->C));
  if (g->m->cfg.version == 2) {  // reduce, then normalize
    const char *h = linear(g, fmt(red, "layers.%d.downsample.reduction", s), rows, false);
    return layernorm(g, fmt(norm, "layers.%d.downsample.norm", s), h);
  }
  const char *h = layernorm(g, fmt(norm, "layers.%d.downsample.norm", s), rows);
  return linear(g, fmt(red, "layers.%d.downsample.reduction", s), h, false);
}

static const char *patch_embed(Graph *g, const char *images) {
  const Config *c = &g->m->cfg;
  OnnxNode *conv = node(g, "Conv", "patch_embed.proj", images, param(g, "patch_embed.proj.weight"),
                        param(g, "patch_embed.proj.bias"), NULL);
  onnx_attr_ints(conv, "kernel_shape", 2, (int64_t[]){c->patch_size, c->patch_size});
  onnx_attr_ints(conv, "strides", 2, (int64_t[]){c->patch_size, c->patch_size});
  // (N, E, Hp, Wp) -> (N, Hp, Wp, E) -> rows (N*Hp*Wp, E)
  transpose(g, "patch_embed.proj.nhwc", conv->name, PERM(0, 2, 3, 1));
  reshape(g, "patch_embed.proj.rows", "patch_embed.proj.nhwc", I64(-1, c->embed_dim));
  return layernorm(g, "patch_embed.norm", "patch_embed.proj.rows");
}

// Final LayerNorm, mean over each image's tokens, linear head; returns the head's node.
static OnnxNode *head(Graph *g, const char *x) {
  const StageGeom *last = &g->m->stages[g->m->num_stages - 1];
  const char *h = layernorm(g, "norm", x);
  reshape(g, "head.global_pool.tokens", h, I64(-1, (int64_t)last->H * last->W, last->C));
  OnnxNode *pool = node(g, "ReduceMean", "head.global_pool", "head.global_pool.tokens", NULL);
  onnx_attr_ints(pool, "axes", 1, (int64_t[]){1});
  onnx_attr_int(pool, "keepdims", 0);
  OnnxNode *fc = node(g, "Gemm", "head.fc", pool->name, param(g, "head.fc.weight"),
                      param(g, "head.fc.bias"), NULL);
  onnx_attr_int(fc, "transB", 1);
  return fc;
}

static void set_value_info(OnnxValueInfo *v, const char *name, int ndim, const int64_t *dims,
                           int64_t batch) {
  memset(v, 0, sizeof *v);
  snprintf(v->name, sizeof v->name, "%s", name);
  v->elem_type = ONNX_FLOAT;
  v->ndim = ndim;
  for (int d = 0; d < ndim; d++) v->dims[d] = dims[d];
  if (batch > 0)
    v->dims[0] = batch;
  else
    snprintf(v->dim_params[0], sizeof v->dim_params[0], "batch");
}

int onnx_build_swin(OnnxModel *om, const Model *m, DType dtype, int64_t batch, Error *err) {
  onnx_model_init(om);
  if (dtype != DTYPE_F32 && dtype != DTYPE_F16)
    return error_set(err, "ONNX export: dtype %s is not supported\nHINT: dtype=f32 or dtype=f16",
                     dtype_name(dtype));
  if (batch < 0)
    return error_set(err, "ONNX export: batch %lld must be > 0 (or 0 for a dynamic batch)",
                     (long long)batch);
  const Config *c = &m->cfg;
  Graph g = {om, m, dtype == DTYPE_F16 ? ONNX_FLOAT16 : ONNX_FLOAT};
  snprintf(om->producer_name, sizeof om->producer_name, "swin.c");
  snprintf(om->producer_version, sizeof om->producer_version, "swin_export");
  snprintf(om->graph_name, sizeof om->graph_name, "swin");
  char *ini = config_to_ini(c);
  onnx_add_metadata(om, "swin.config", ini);
  free(ini);

  set_value_info(&om->inputs[om->num_inputs++], "images", 4,
                 (int64_t[]){-1, c->in_chans, c->img_h, c->img_w}, batch);
  set_value_info(&om->outputs[om->num_outputs++], "logits", 2, (int64_t[]){-1, c->num_classes},
                 batch);
  const char *x = "images";
  if (g.elem == ONNX_FLOAT16) onnx_attr_int(node(&g, "Cast", "images.f16", x, NULL), "to", g.elem);
  x = patch_embed(&g, g.elem == ONNX_FLOAT16 ? "images.f16" : x);
  for (int s = 0; s < m->num_stages; s++) {
    if (m->stages[s].merge) x = downsample(&g, s, x);
    for (int j = 0; j < m->stages[s].depth; j++)
      x = c->version == 2 ? block_v2(&g, s, j, x) : block(&g, s, j, x);
  }
  OnnxNode *fc = head(&g, x);
  if (g.elem == ONNX_FLOAT16)
    onnx_attr_int(node(&g, "Cast", "logits", fc->name, NULL), "to", ONNX_FLOAT);
  else
    snprintf(fc->outputs[0], ONNX_NAME_MAX, "logits");
  return 0;
}

int onnx_export_swin(const Model *m, const char *path, DType dtype, int64_t batch, Error *err) {
  OnnxModel om;
  int rc = onnx_build_swin(&om, m, dtype, batch, err);
  if (rc == 0) rc = onnx_model_save(&om, path, err);
  onnx_model_free(&om);
  return rc;
}
