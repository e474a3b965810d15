// backend_check.c: the checking layer at the backend's op boundary (src/model/backend_check.h):
// the registered regions, the lookup, and one wrapper per model op that states, from the op's
// shape arguments, how many elements of which dtype each of its pointers touches (the shapes of
// src/model/backend.h) before it calls the backend's own op with the same arguments.
#include "src/model/backend_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cosine_attention.h"

// Every op the layer wraps, by its BackendOps field: the enum, the names and the table's
// entries all come from this one list.
#define CHECKED_OPS(X)                  \
  X(to_compute)                         \
  X(patch_embed_input)                  \
  X(drop_path_scales)                   \
  X(images_normalize)                   \
  X(batch_augment)                      \
  X(linear_forward)                     \
  X(mlp_forward)                        \
  X(linear_backward)                    \
  X(gelu_linear_backward)               \
  X(residual_layernorm_forward)         \
  X(linear_residual_layernorm_forward)  \
  X(mlp_residual_layernorm_forward)     \
  X(residual_layernorm_backward)        \
  X(linear_residual_layernorm_backward) \
  X(merge_layernorm_forward)            \
  X(merge_layernorm_backward)           \
  X(postnorm_residual_forward)          \
  X(postnorm_residual_backward)         \
  X(patch_merge_forward)                \
  X(patch_merge_backward)               \
  X(attention_forward)                  \
  X(attention_backward)                 \
  X(cosine_qk_forward)                  \
  X(cosine_qk_backward)                 \
  X(cpb_forward)                        \
  X(cpb_backward)                       \
  X(head_forward)                       \
  X(head_backward)                      \
  X(train_loss)                         \
  X(eval_metrics)                       \
  X(optimizer_step)                     \
  X(ema_update)                         \
  X(weights_swap)

typedef enum {
#define X(op) CHECK_OP_##op,
  CHECKED_OPS(X)
#undef X
      CHECK_OPS
} CheckedOp;

static const char *const op_names[CHECK_OPS] = {
#define X(op) #op,
    CHECKED_OPS(X)
#undef X
};

typedef struct {
  Tensor t;
  uintptr_t begin, end;  // bytes [begin, end) of t.data
} Region;

// Regions of one kind, sorted by address; no two overlap.
typedef struct {
  Region *items;
  int count, capacity;
} RegionSet;

struct BackendCheck {
  BackendOps ops;           // the table be->ops points at: the wrappers, the rest the backend's
  const BackendOps *inner;  // the backend's own table
  RegionSet tensors, buffers;
  BackendCheckCounts counts[CHECK_OPS];
};

// ---- regions ----------------------------------------------------------------------------------

// The number of regions of s that begin at or below p.
static int regions_at_or_below(const RegionSet *s, uintptr_t p) {
  int lo = 0, hi = s->count;
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    if (s->items[mid].begin <= p)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// The region of s that holds byte p, or NULL.
static const Region *region_find(const RegionSet *s, uintptr_t p) {
  int i = regions_at_or_below(s, p);
  return i > 0 && p < s->items[i - 1].end ? &s->items[i - 1] : NULL;
}

static void region_insert(RegionSet *s, const Tensor *t, const char *kind) {
  Region r = {.t = *t, .begin = (uintptr_t)t->data};
  r.end = r.begin + tensor_bytes(t);
  if (r.end == r.begin) return;
  int i = regions_at_or_below(s, r.begin);
  const Region *clash = i > 0 && s->items[i - 1].end > r.begin      ? &s->items[i - 1]
                        : i < s->count && s->items[i].begin < r.end ? &s->items[i]
                                                                    : NULL;
  if (clash) {
    char a[256], b[256];
    tensor_describe(t, a, sizeof a);
    tensor_describe(&clash->t, b, sizeof b);
    fprintf(stderr,
            "internal error: backend check: %s %s overlaps %s, registered before it\n"
            "HINT: two planned buffers share memory: a planning bug in their owner\n",
            kind, a, b);
    abort();
  }
  if (s->count == s->capacity) {
    int capacity = s->capacity ? 2 * s->capacity : 256;
    Region *items = calloc_check((size_t)capacity, sizeof(Region));
    if (s->count) memcpy(items, s->items, sizeof(Region) * (size_t)s->count);
    free(s->items);
    s->items = items;
    s->capacity = capacity;
  }
  memmove(&s->items[i + 1], &s->items[i], sizeof(Region) * (size_t)(s->count - i));
  s->items[i] = r;
  s->count++;
}

static void regions_forget(RegionSet *s, uintptr_t begin, uintptr_t end) {
  int kept = 0;
  for (int i = 0; i < s->count; i++)
    if (s->items[i].begin < begin || s->items[i].end > end) s->items[kept++] = s->items[i];
  s->count = kept;
}

void backend_check_register(Backend *be, const Tensor *t) {
  if (be->check) region_insert(&be->check->tensors, t, "tensor");
}

void backend_check_register_buffer(Backend *be, const Tensor *t) {
  if (be->check) region_insert(&be->check->buffers, t, "buffer");
}

void backend_check_unregister(Backend *be, const void *base) {
  if (!be->check || !base) return;
  uintptr_t begin = (uintptr_t)base;
  const Region *r = region_find(&be->check->buffers, begin);
  if (!r || r->begin != begin) r = region_find(&be->check->tensors, begin);
  if (!r || r->begin != begin) return;
  uintptr_t end = r->end;
  regions_forget(&be->check->tensors, begin, end);
  regions_forget(&be->check->buffers, begin, end);
}

// ---- the check of one pointer argument ------------------------------------------------------

typedef struct {
  BackendCheck *st;
  CheckedOp op;
} Call;

static Call call_begin(Backend *be, CheckedOp op) {
  be->check->counts[op].calls++;
  return (Call){be->check, op};
}

// The second line of every violation's message, then the abort.
static void abort_plan_bug(const char *arg) {
  fprintf(stderr,
          "HINT: the op's shape arguments and the memory passed as %s disagree: a bug in the "
          "caller's plan (src/model/model.c plans the model's buffers), not in the config or "
          "the data\n",
          arg);
  abort();
}

// Aborts naming the op, the argument, its extent and the region r it points into; why says how
// the extent and the region disagree.
static void violation(const Call *c, const char *arg, uintptr_t p, DType dtype, int64_t count,
                      const Region *r, const char *why) {
  char region[256], in[300] = "";
  tensor_describe(&r->t, region, sizeof region);
  const Region *buffer = region_find(&c->st->buffers, r->begin);
  if (buffer && buffer != r) {
    char b[256];
    tensor_describe(&buffer->t, b, sizeof b);
    snprintf(in, sizeof in, " (in %s)", b);
  }
  size_t size = dtype_size(r->t.dtype), offset = p - r->begin;
  char at[64];
  if (offset % size == 0)
    snprintf(at, sizeof at, "element %lld", (long long)(offset / size));
  else
    snprintf(at, sizeof at, "byte %lld", (long long)offset);
  fprintf(stderr, "internal error: %s: %s needs %lld %s elements from %s of %s%s, %s\n",
          op_names[c->op], arg, (long long)count, dtype_name(dtype), at, region, in, why);
  abort_plan_bug(arg);
}

// The same for an argument the op needs but was passed NULL.
static void violation_null(const Call *c, const char *arg, DType dtype, int64_t count) {
  fprintf(stderr, "internal error: %s: %s needs %lld %s elements, but is NULL\n", op_names[c->op],
          arg, (long long)count, dtype_name(dtype));
  abort_plan_bug(arg);
}

// Argument `arg` touches `count` elements of dtype from ptr. whole: the argument takes a whole
// flat buffer (checked against the buffer it points into); else it takes one tensor.
static void check_arg(Call *c, const char *arg, const void *ptr, DType dtype, int64_t count,
                      bool whole) {
  if (!ptr || count == 0) return;
  uintptr_t p = (uintptr_t)ptr;
  const Region *r = region_find(whole ? &c->st->buffers : &c->st->tensors, p);
  if (!r) r = region_find(whole ? &c->st->tensors : &c->st->buffers, p);
  if (!r) {
    c->st->counts[c->op].unchecked++;
    return;
  }
  c->st->counts[c->op].checked++;
  size_t size = dtype_size(dtype), have = (r->end - p) / size;
  char why[160];
  if (!whole && region_find(&c->st->buffers, p) == r) {
    snprintf(why, sizeof why,
             "outside every tensor of that buffer (an argument that takes one "
             "tensor must point at one)");
  } else if (r->t.dtype != dtype) {
    snprintf(why, sizeof why, "which is %s, not %s", dtype_name(r->t.dtype), dtype_name(dtype));
  } else if ((p - r->begin) % size != 0) {
    snprintf(why, sizeof why, "which is not at a whole element of it");
  } else if (count < 0) {
    snprintf(why, sizeof why, "a negative extent");
  } else if ((uint64_t)count > have) {
    snprintf(why, sizeof why, "which holds %lld from there (%lld too few)", (long long)have,
             (long long)(count - (int64_t)have));
  } else {
    return;
  }
  violation(c, arg, p, dtype, count, r, why);
}

// An argument that, unlike the others, may be NULL only where the op touches none of it (count
// 0): elsewhere a NULL is a violation, not memory the caller owns.
static void check_needed(Call *c, const char *arg, const void *ptr, DType dtype, int64_t count) {
  if (!ptr && count > 0) violation_null(c, arg, dtype, count);
  check_arg(c, arg, ptr, dtype, count, false);
}

// CHECK(argument, dtype, elements): the argument takes one tensor; WHOLE: a whole buffer;
// NEEDED: one tensor, and NULL only where elements is 0. Structs in backend memory are U8 bytes.
#define CHECK(arg, dtype, count) check_arg(&c, #arg, (arg), (dtype), (int64_t)(count), false)
#define NEEDED(arg, dtype, count) check_needed(&c, #arg, (arg), (dtype), (int64_t)(count))
#define WHOLE(arg, dtype, count) check_arg(&c, #arg, (arg), (dtype), (int64_t)(count), true)
#define BYTES(arg, type, count) CHECK(arg, DTYPE_U8, sizeof(type) * (size_t)(count))
#define INNER (c.st->inner)

// ---- the wrappers: extents as src/model/backend.h gives the shapes ----------------------------

static void check_to_compute(Backend *be, void *dst, const float *src, int64_t n) {
  Call c = call_begin(be, CHECK_OP_to_compute);
  WHOLE(dst, be->act, n);
  WHOLE(src, DTYPE_F32, n);
  INNER->to_compute(be, dst, src, n);
}

static void check_patch_embed_input(Backend *be, void *patches, const void *input,
                                    DType input_dtype, Normalize norm, int B, int H, int W, int Cin,
                                    int p) {
  Call c = call_begin(be, CHECK_OP_patch_embed_input);
  CHECK(patches, be->act, (int64_t)B * (H / p) * (W / p) * Cin * p * p);
  CHECK(input, input_dtype, (int64_t)B * H * W * Cin);
  INNER->patch_embed_input(be, patches, input, input_dtype, norm, B, H, W, Cin, p);
}

static void check_drop_path_scales(Backend *be, float *scales, const float *rates, int units, int B,
                                   uint64_t seed, const StepParams *step) {
  Call c = call_begin(be, CHECK_OP_drop_path_scales);
  CHECK(scales, DTYPE_F32, (int64_t)units * B);
  CHECK(rates, DTYPE_F32, (units + 1) / 2);  // unit u reads rates[u / 2]
  BYTES(step, StepParams, 1);
  INNER->drop_path_scales(be, scales, rates, units, B, seed, step);
}

static void check_images_normalize(Backend *be, float *images, const uint8_t *pixels,
                                   Normalize norm, int B, int H, int W, int Cin) {
  Call c = call_begin(be, CHECK_OP_images_normalize);
  CHECK(images, DTYPE_F32, (int64_t)B * H * W * Cin);
  CHECK(pixels, DTYPE_U8, (int64_t)B * H * W * Cin);
  INNER->images_normalize(be, images, pixels, norm, B, H, W, Cin);
}

// p is a host struct (its erase boxes a host array): not backend memory.
static void check_batch_augment(Backend *be, float *images, const BatchAugment *p, EraseBox *boxes,
                                int B, int H, int W, int C) {
  Call c = call_begin(be, CHECK_OP_batch_augment);
  if (p->erase || p->mix.mode != MIX_NONE) CHECK(images, DTYPE_F32, (int64_t)B * H * W * C);
  if (p->erase) BYTES(boxes, EraseBox, B);
  INNER->batch_augment(be, images, p, boxes, B, H, W, C);
}

static void check_linear_forward(Backend *be, void *out, const void *inp, const void *weight,
                                 const void *bias, int64_t N, int IC, int OC, Activation act,
                                 void *pre) {
  Call c = call_begin(be, CHECK_OP_linear_forward);
  CHECK(out, be->act, N * OC);
  CHECK(inp, be->act, N * IC);
  CHECK(weight, be->act, (int64_t)OC * IC);
  CHECK(bias, be->act, OC);
  if (act == ACTIVATION_GELU) CHECK(pre, be->act, N * OC);
  INNER->linear_forward(be, out, inp, weight, bias, N, IC, OC, act, pre);
}

// Without out, w2 and b2 are not touched; hidden may still be (a backend may fuse GELU(pre) into
// fc1's output), so it is checked either way, against what the backend says it stores.
static void check_mlp_forward(Backend *be, void *out, void *pre, void *hidden, const void *inp,
                              const void *w1, const void *b1, const void *w2, const void *b2,
                              int64_t N, int C, int H) {
  Call c = call_begin(be, CHECK_OP_mlp_forward);
  CHECK(pre, be->act, N * H);
  NEEDED(hidden, be->act, INNER->mlp_hidden_elements(be, N, C, H));
  CHECK(inp, be->act, N * C);
  CHECK(w1, be->act, (int64_t)H * C);
  CHECK(b1, be->act, H);
  if (out) {
    CHECK(out, be->act, N * C);
    CHECK(w2, be->act, (int64_t)C * H);
    CHECK(b2, be->act, C);
  }
  INNER->mlp_forward(be, out, pre, hidden, inp, w1, b1, w2, b2, N, C, H);
}

static void check_linear_backward(Backend *be, void *dinp, float *dweight, float *dbias,
                                  const void *dout, const void *inp, const void *weight, int64_t N,
                                  int IC, int OC) {
  Call c = call_begin(be, CHECK_OP_linear_backward);
  CHECK(dinp, be->act, N * IC);
  CHECK(dweight, DTYPE_F32, (int64_t)OC * IC);
  CHECK(dbias, DTYPE_F32, OC);
  CHECK(dout, be->act, N * OC);
  CHECK(inp, be->act, N * IC);
  CHECK(weight, be->act, (int64_t)OC * IC);
  INNER->linear_backward(be, dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
}

static void check_gelu_linear_backward(Backend *be, void *dpre, void *hidden, float *dweight,
                                       float *dpre_bias, const void *dout, const void *pre,
                                       const void *weight, int64_t N, int IC, int OC) {
  Call c = call_begin(be, CHECK_OP_gelu_linear_backward);
  CHECK(dpre, be->act, N * IC);
  NEEDED(hidden, be->act, INNER->mlp_hidden_elements(be, N, OC, IC));  // the MLP's C, H
  CHECK(dweight, DTYPE_F32, (int64_t)OC * IC);
  CHECK(dpre_bias, DTYPE_F32, IC);
  CHECK(dout, be->act, N * OC);
  CHECK(pre, be->act, N * IC);
  CHECK(weight, be->act, (int64_t)OC * IC);
  INNER->gelu_linear_backward(be, dpre, hidden, dweight, dpre_bias, dout, pre, weight, N, IC, OC);
}

// Without a branch x_out is not written; without ln_out the statistics and affine parameters
// are not touched (the model passes them anyway where one call site serves both cases).
static void check_residual_layernorm_forward(Backend *be, void *x_out, void *ln_out, float *mean,
                                             float *rstd, const void *x_in, const void *branch,
                                             const WindowMap *branch_map, const float *scale,
                                             const float *weight, const float *bias,
                                             const WindowMap *ln_map, int B, int64_t L, int C) {
  Call c = call_begin(be, CHECK_OP_residual_layernorm_forward);
  int64_t rows = (int64_t)B * L, n = rows * C;
  if (branch) {
    CHECK(x_out, be->act, n);
    CHECK(branch, be->act, n);
    CHECK(scale, DTYPE_F32, B);
  }
  if (branch || ln_out) CHECK(x_in, be->act, n);
  if (ln_out) {
    CHECK(ln_out, be->act, n);
    CHECK(mean, DTYPE_F32, rows);
    CHECK(rstd, DTYPE_F32, rows);
    CHECK(weight, DTYPE_F32, C);
    CHECK(bias, DTYPE_F32, C);
  }
  INNER->residual_layernorm_forward(be, x_out, ln_out, mean, rstd, x_in, branch, branch_map, scale,
                                    weight, bias, ln_map, B, L, C);
}

// Without dln the LayerNorm's inputs and gradients are not touched; without dbranch its scale.
// The layer's output goes to branch on a backend that composes the two ops; one that fuses them
// may leave it untouched, so branch is checked as written.
static void check_linear_residual_layernorm_forward(Backend *be, void *x_out, void *ln_out,
                                                    float *mean, float *rstd, void *branch,
                                                    const void *x_in, const void *inp,
                                                    const void *weight, const void *lin_bias,
                                                    const WindowMap *branch_map, const float *scale,
                                                    const float *ln_weight, const float *ln_bias,
                                                    int B, int64_t L, int IC, int C) {
  Call c = call_begin(be, CHECK_OP_linear_residual_layernorm_forward);
  int64_t rows = (int64_t)B * L, n = rows * C;
  CHECK(x_out, be->act, n);
  CHECK(ln_out, be->act, n);
  CHECK(mean, DTYPE_F32, rows);
  CHECK(rstd, DTYPE_F32, rows);
  CHECK(branch, be->act, n);
  CHECK(x_in, be->act, n);
  CHECK(inp, be->act, rows * IC);
  CHECK(weight, be->act, (int64_t)C * IC);
  CHECK(lin_bias, be->act, C);
  CHECK(scale, DTYPE_F32, B);
  CHECK(ln_weight, DTYPE_F32, C);
  CHECK(ln_bias, DTYPE_F32, C);
  INNER->linear_residual_layernorm_forward(be, x_out, ln_out, mean, rstd, branch, x_in, inp, weight,
                                           lin_bias, branch_map, scale, ln_weight, ln_bias, B, L,
                                           IC, C);
}

// The MLP's checks as check_mlp_forward's (out is branch), then the residual's as
// check_residual_layernorm_forward's.
static void check_mlp_residual_layernorm_forward(
    Backend *be, void *x_out, void *ln_out, float *mean, float *rstd, void *branch, void *pre,
    void *hidden, const void *x_in, const void *inp, const void *w1, const void *b1, const void *w2,
    const void *b2, const float *scale, const float *ln_weight, const float *ln_bias,
    const WindowMap *ln_map, int B, int64_t L, int C, int H) {
  Call c = call_begin(be, CHECK_OP_mlp_residual_layernorm_forward);
  int64_t rows = (int64_t)B * L, n = rows * C;
  CHECK(pre, be->act, rows * H);
  NEEDED(hidden, be->act, INNER->mlp_hidden_elements(be, rows, C, H));
  CHECK(inp, be->act, n);
  CHECK(w1, be->act, (int64_t)H * C);
  CHECK(b1, be->act, H);
  CHECK(w2, be->act, (int64_t)C * H);
  CHECK(b2, be->act, C);
  CHECK(branch, be->act, n);
  CHECK(x_out, be->act, n);
  CHECK(x_in, be->act, n);
  CHECK(scale, DTYPE_F32, B);
  if (ln_out) {
    CHECK(ln_out, be->act, n);
    CHECK(mean, DTYPE_F32, rows);
    CHECK(rstd, DTYPE_F32, rows);
    CHECK(ln_weight, DTYPE_F32, C);
    CHECK(ln_bias, DTYPE_F32, C);
  }
  INNER->mlp_residual_layernorm_forward(be, x_out, ln_out, mean, rstd, branch, pre, hidden, x_in,
                                        inp, w1, b1, w2, b2, scale, ln_weight, ln_bias, ln_map, B,
                                        L, C, H);
}

static void check_residual_layernorm_backward(Backend *be, float *dres_out, void *dbranch,
                                              float *dbranch_bias, float *dweight, float *dbias,
                                              const float *dres_in, const void *dln, const void *x,
                                              const float *weight, const float *mean,
                                              const float *rstd, const WindowMap *branch_map,
                                              const float *scale, const WindowMap *ln_map, int B,
                                              int64_t L, int C) {
  Call c = call_begin(be, CHECK_OP_residual_layernorm_backward);
  int64_t rows = (int64_t)B * L, n = rows * C;
  CHECK(dres_out, DTYPE_F32, n);
  CHECK(dres_in, DTYPE_F32, n);
  if (dln) {
    CHECK(dln, be->act, n);
    CHECK(x, be->act, n);
    CHECK(weight, DTYPE_F32, C);
    CHECK(mean, DTYPE_F32, rows);
    CHECK(rstd, DTYPE_F32, rows);
    CHECK(dweight, DTYPE_F32, C);
    CHECK(dbias, DTYPE_F32, C);
  }
  if (dbranch) {
    CHECK(dbranch, be->act, n);
    CHECK(scale, DTYPE_F32, B);
  }
  CHECK(dbranch_bias, DTYPE_F32, C);
  INNER->residual_layernorm_backward(be, dres_out, dbranch, dbranch_bias, dweight, dbias, dres_in,
                                     dln, x, weight, mean, rstd, branch_map, scale, ln_map, B, L,
                                     C);
}

// The product's checks as check_linear_backward's (dinp is dln), then the LayerNorm's as
// check_residual_layernorm_backward's with dln given.
static void check_linear_residual_layernorm_backward(
    Backend *be, float *dres_out, void *dbranch, float *dbranch_bias, float *dweight,
    float *ln_dweight, float *ln_dbias, void *dln, const float *dres_in, const void *dout,
    const void *inp, const void *weight, const void *x, const float *ln_weight, const float *mean,
    const float *rstd, const WindowMap *branch_map, const float *scale, const WindowMap *ln_map,
    int B, int64_t L, int IC, int OC) {
  Call c = call_begin(be, CHECK_OP_linear_residual_layernorm_backward);
  int64_t rows = (int64_t)B * L, n = rows * IC;
  CHECK(dln, be->act, n);
  CHECK(dweight, DTYPE_F32, (int64_t)OC * IC);
  CHECK(dout, be->act, rows * OC);
  CHECK(inp, be->act, n);
  CHECK(weight, be->act, (int64_t)OC * IC);
  CHECK(dres_out, DTYPE_F32, n);
  CHECK(dres_in, DTYPE_F32, n);
  CHECK(x, be->act, n);
  CHECK(ln_weight, DTYPE_F32, IC);
  CHECK(mean, DTYPE_F32, rows);
  CHECK(rstd, DTYPE_F32, rows);
  CHECK(ln_dweight, DTYPE_F32, IC);
  CHECK(ln_dbias, DTYPE_F32, IC);
  if (dbranch) {
    CHECK(dbranch, be->act, n);
    CHECK(scale, DTYPE_F32, B);
  }
  CHECK(dbranch_bias, DTYPE_F32, IC);
  INNER->linear_residual_layernorm_backward(
      be, dres_out, dbranch, dbranch_bias, dweight, ln_dweight, ln_dbias, dln, dres_in, dout, inp,
      weight, x, ln_weight, mean, rstd, branch_map, scale, ln_map, B, L, IC, OC);
}

// tokens (B, H, W, C), merged (B, H/2, W/2, 4C).
static void check_merge_layernorm_forward(Backend *be, void *out, float *mean, float *rstd,
                                          const void *tokens, const float *weight,
                                          const float *bias, int B, int H, int W, int C) {
  Call c = call_begin(be, CHECK_OP_merge_layernorm_forward);
  int64_t rows = (int64_t)B * (H / 2) * (W / 2);
  CHECK(out, be->act, rows * 4 * C);
  CHECK(mean, DTYPE_F32, rows);
  CHECK(rstd, DTYPE_F32, rows);
  CHECK(tokens, be->act, (int64_t)B * H * W * C);
  CHECK(weight, DTYPE_F32, 4 * C);
  CHECK(bias, DTYPE_F32, 4 * C);
  INNER->merge_layernorm_forward(be, out, mean, rstd, tokens, weight, bias, B, H, W, C);
}

static void check_merge_layernorm_backward(Backend *be, float *dtokens, float *dweight,
                                           float *dbias, const void *dout, const void *tokens,
                                           const float *weight, const float *mean,
                                           const float *rstd, int B, int H, int W, int C) {
  Call c = call_begin(be, CHECK_OP_merge_layernorm_backward);
  int64_t rows = (int64_t)B * (H / 2) * (W / 2);
  CHECK(dtokens, DTYPE_F32, (int64_t)B * H * W * C);
  CHECK(dweight, DTYPE_F32, 4 * C);
  CHECK(dbias, DTYPE_F32, 4 * C);
  CHECK(dout, be->act, rows * 4 * C);
  CHECK(tokens, be->act, (int64_t)B * H * W * C);
  CHECK(weight, DTYPE_F32, 4 * C);
  CHECK(mean, DTYPE_F32, rows);
  CHECK(rstd, DTYPE_F32, rows);
  INNER->merge_layernorm_backward(be, dtokens, dweight, dbias, dout, tokens, weight, mean, rstd, B,
                                  H, W, C);
}

static void check_postnorm_residual_forward(Backend *be, void *x_out, void *xw_out, float *mean,
                                            float *rstd, const void *x_in, const void *branch,
                                            const WindowMap *branch_map, const float *scale,
                                            const float *weight, const float *bias,
                                            const WindowMap *out_map, int B, int64_t L, int C) {
  Call c = call_begin(be, CHECK_OP_postnorm_residual_forward);
  int64_t rows = (int64_t)B * L, n = rows * C;
  CHECK(x_out, be->act, n);
  CHECK(xw_out, be->act, n);
  CHECK(mean, DTYPE_F32, rows);
  CHECK(rstd, DTYPE_F32, rows);
  CHECK(x_in, be->act, n);
  CHECK(branch, be->act, n);
  CHECK(scale, DTYPE_F32, B);
  CHECK(weight, DTYPE_F32, C);
  CHECK(bias, DTYPE_F32, C);
  INNER->postnorm_residual_forward(be, x_out, xw_out, mean, rstd, x_in, branch, branch_map, scale,
                                   weight, bias, out_map, B, L, C);
}

static void check_postnorm_residual_backward(Backend *be, float *dres_out, void *dbranch,
                                             float *dbranch_bias, float *dweight, float *dbias,
                                             const float *dres_in, const void *dx,
                                             const WindowMap *x_map, const void *branch,
                                             const float *weight, const float *mean,
                                             const float *rstd, const WindowMap *branch_map,
                                             const float *scale, int B, int64_t L, int C) {
  Call c = call_begin(be, CHECK_OP_postnorm_residual_backward);
  int64_t rows = (int64_t)B * L, n = rows * C;
  CHECK(dres_out, DTYPE_F32, n);
  CHECK(dbranch, be->act, n);
  CHECK(dbranch_bias, DTYPE_F32, C);
  CHECK(dweight, DTYPE_F32, C);
  CHECK(dbias, DTYPE_F32, C);
  CHECK(dres_in, DTYPE_F32, n);
  CHECK(dx, be->act, n);
  CHECK(branch, be->act, n);
  CHECK(weight, DTYPE_F32, C);
  CHECK(mean, DTYPE_F32, rows);
  CHECK(rstd, DTYPE_F32, rows);
  CHECK(scale, DTYPE_F32, B);
  INNER->postnorm_residual_backward(be, dres_out, dbranch, dbranch_bias, dweight, dbias, dres_in,
                                    dx, x_map, branch, weight, mean, rstd, branch_map, scale, B, L,
                                    C);
}

// tokens (B, H, W, C), merged (B, H/2, W/2, 4C).
static void check_patch_merge_forward(Backend *be, void *merged, const void *tokens, int B, int H,
                                      int W, int C) {
  Call c = call_begin(be, CHECK_OP_patch_merge_forward);
  CHECK(merged, be->act, (int64_t)B * (H / 2) * (W / 2) * 4 * C);
  CHECK(tokens, be->act, (int64_t)B * H * W * C);
  INNER->patch_merge_forward(be, merged, tokens, B, H, W, C);
}

static void check_patch_merge_backward(Backend *be, float *dtokens, const void *dmerged, int B,
                                       int H, int W, int C) {
  Call c = call_begin(be, CHECK_OP_patch_merge_backward);
  CHECK(dtokens, DTYPE_F32, (int64_t)B * H * W * C);
  CHECK(dmerged, be->act, (int64_t)B * (H / 2) * (W / 2) * 4 * C);
  INNER->patch_merge_backward(be, dtokens, dmerged, B, H, W, C);
}

// The bias table has (2wh-1)(2ww-1) rows of heads, but the op's arguments give N = wh*ww only:
// the check asks for the fewest rows any window of N tokens indexes, 2N - 1 (a 1 x N window).
static int64_t table_floats_at_least(int N, int heads) {
  return (int64_t)(2 * N - 1) * heads;
}

static void check_attention_forward(Backend *be, void *out, float *saved, const void *qkv,
                                    const float *table, const int *index, const float *mask, int BW,
                                    int nW, int N, int C, int heads, float scale) {
  Call c = call_begin(be, CHECK_OP_attention_forward);
  CHECK(out, be->act, (int64_t)BW * N * C);
  CHECK(saved, DTYPE_F32, INNER->attention_saved_floats(be, BW, N, C, heads));
  CHECK(qkv, be->act, (int64_t)BW * N * 3 * C);
  CHECK(table, DTYPE_F32, table_floats_at_least(N, heads));
  CHECK(index, DTYPE_I32, (int64_t)N * N);
  CHECK(mask, DTYPE_F32, (int64_t)nW * N * N);
  INNER->attention_forward(be, out, saved, qkv, table, index, mask, BW, nW, N, C, heads, scale);
}

static void check_attention_backward(Backend *be, void *dqkv, float *dqkv_bias, float *dtable,
                                     const void *dout, const void *qkv, const void *out,
                                     const float *table, const int *index, const float *mask,
                                     float *saved, int BW, int nW, int N, int C, int heads,
                                     float scale) {
  Call c = call_begin(be, CHECK_OP_attention_backward);
  CHECK(dqkv, be->act, (int64_t)BW * N * 3 * C);
  CHECK(dqkv_bias, DTYPE_F32, 3 * C);
  CHECK(dtable, DTYPE_F32, table_floats_at_least(N, heads));
  CHECK(dout, be->act, (int64_t)BW * N * C);
  CHECK(qkv, be->act, (int64_t)BW * N * 3 * C);
  CHECK(out, be->act, (int64_t)BW * N * C);
  CHECK(table, DTYPE_F32, table_floats_at_least(N, heads));
  CHECK(index, DTYPE_I32, (int64_t)N * N);
  CHECK(mask, DTYPE_F32, (int64_t)nW * N * N);
  CHECK(saved, DTYPE_F32, INNER->attention_saved_floats(be, BW, N, C, heads));
  INNER->attention_backward(be, dqkv, dqkv_bias, dtable, dout, qkv, out, table, index, mask, saved,
                            BW, nW, N, C, heads, scale);
}

// Without q_bias, v_bias is not read either (both or neither).
static void check_cosine_qk_forward(Backend *be, void *qkv, float *norms, const float *q_bias,
                                    const float *v_bias, const float *logit_scale, int64_t rows,
                                    int C, int heads) {
  Call c = call_begin(be, CHECK_OP_cosine_qk_forward);
  CHECK(qkv, be->act, rows * 3 * C);
  CHECK(norms, DTYPE_F32, rows * 2 * heads);
  CHECK(q_bias, DTYPE_F32, C);
  if (q_bias) CHECK(v_bias, DTYPE_F32, C);
  CHECK(logit_scale, DTYPE_F32, heads);
  INNER->cosine_qk_forward(be, qkv, norms, q_bias, v_bias, logit_scale, rows, C, heads);
}

static void check_cosine_qk_backward(Backend *be, void *dqkv, float *dq_bias, float *dv_bias,
                                     float *dlogit_scale, const void *qkv, const float *norms,
                                     const float *logit_scale, int64_t rows, int C, int heads) {
  Call c = call_begin(be, CHECK_OP_cosine_qk_backward);
  CHECK(dqkv, be->act, rows * 3 * C);
  CHECK(dq_bias, DTYPE_F32, C);
  CHECK(dv_bias, DTYPE_F32, C);
  CHECK(dlogit_scale, DTYPE_F32, heads);
  CHECK(qkv, be->act, rows * 3 * C);
  CHECK(norms, DTYPE_F32, rows * 2 * heads);
  CHECK(logit_scale, DTYPE_F32, heads);
  INNER->cosine_qk_backward(be, dqkv, dq_bias, dv_bias, dlogit_scale, qkv, norms, logit_scale, rows,
                            C, heads);
}

static void check_cpb_forward(Backend *be, float *table, float *hidden, const float *coords,
                              const float *w1, const float *b1, const float *w2, int T, int heads) {
  Call c = call_begin(be, CHECK_OP_cpb_forward);
  CHECK(table, DTYPE_F32, (int64_t)T * heads);
  CHECK(hidden, DTYPE_F32, (int64_t)T * CPB_HIDDEN);
  CHECK(coords, DTYPE_F32, (int64_t)T * 2);
  CHECK(w1, DTYPE_F32, CPB_HIDDEN * 2);
  CHECK(b1, DTYPE_F32, CPB_HIDDEN);
  CHECK(w2, DTYPE_F32, (int64_t)heads * CPB_HIDDEN);
  INNER->cpb_forward(be, table, hidden, coords, w1, b1, w2, T, heads);
}

static void check_cpb_backward(Backend *be, float *dw1, float *db1, float *dw2, const float *dtable,
                               const float *table, const float *hidden, const float *coords,
                               const float *w2, int T, int heads) {
  Call c = call_begin(be, CHECK_OP_cpb_backward);
  CHECK(dw1, DTYPE_F32, CPB_HIDDEN * 2);
  CHECK(db1, DTYPE_F32, CPB_HIDDEN);
  CHECK(dw2, DTYPE_F32, (int64_t)heads * CPB_HIDDEN);
  CHECK(dtable, DTYPE_F32, (int64_t)T * heads);
  CHECK(table, DTYPE_F32, (int64_t)T * heads);
  CHECK(hidden, DTYPE_F32, (int64_t)T * CPB_HIDDEN);
  CHECK(coords, DTYPE_F32, (int64_t)T * 2);
  CHECK(w2, DTYPE_F32, (int64_t)heads * CPB_HIDDEN);
  INNER->cpb_backward(be, dw1, db1, dw2, dtable, table, hidden, coords, w2, T, heads);
}

static void check_head_forward(Backend *be, float *logits, float *pooled, const void *tokens,
                               const float *weight, const float *bias, int B, int L, int C, int K) {
  Call c = call_begin(be, CHECK_OP_head_forward);
  CHECK(logits, DTYPE_F32, (int64_t)B * K);
  CHECK(pooled, DTYPE_F32, (int64_t)B * C);
  CHECK(tokens, be->act, (int64_t)B * L * C);
  CHECK(weight, DTYPE_F32, (int64_t)K * C);
  CHECK(bias, DTYPE_F32, K);
  INNER->head_forward(be, logits, pooled, tokens, weight, bias, B, L, C, K);
}

static void check_head_backward(Backend *be, void *dtokens, float *dweight, float *dbias,
                                const float *dlogits, const float *pooled, const float *weight,
                                int B, int L, int C, int K) {
  Call c = call_begin(be, CHECK_OP_head_backward);
  CHECK(dtokens, be->act, (int64_t)B * L * C);
  CHECK(dweight, DTYPE_F32, (int64_t)K * C);
  CHECK(dbias, DTYPE_F32, K);
  CHECK(dlogits, DTYPE_F32, (int64_t)B * K);
  CHECK(pooled, DTYPE_F32, (int64_t)B * C);
  CHECK(weight, DTYPE_F32, (int64_t)K * C);
  INNER->head_backward(be, dtokens, dweight, dbias, dlogits, pooled, weight, B, L, C, K);
}

// With soft targets the labels are ignored.
static void check_train_loss(Backend *be, float *dlogits, const float *logits, const int *labels,
                             const float *soft_targets, float smoothing, int B, int K,
                             int grad_count, OptimState *state) {
  Call c = call_begin(be, CHECK_OP_train_loss);
  CHECK(dlogits, DTYPE_F32, (int64_t)B * K);
  CHECK(logits, DTYPE_F32, (int64_t)B * K);
  if (!soft_targets) CHECK(labels, DTYPE_I32, B);
  CHECK(soft_targets, DTYPE_F32, (int64_t)B * K);
  BYTES(state, OptimState, 1);
  INNER->train_loss(be, dlogits, logits, labels, soft_targets, smoothing, B, K, grad_count, state);
}

static void check_eval_metrics(Backend *be, EvalSums *sums, const float *logits, const int *labels,
                               int B, int K) {
  Call c = call_begin(be, CHECK_OP_eval_metrics);
  BYTES(sums, EvalSums, 1);
  CHECK(logits, DTYPE_F32, (int64_t)B * K);
  CHECK(labels, DTYPE_I32, B);
  INNER->eval_metrics(be, sums, logits, labels, B, K);
}

static void check_optimizer_step(Backend *be, float *params, void *compute, const float *grads,
                                 float *m, float *v, int64_t n, const AdamWChunk *chunks,
                                 int num_chunks, OptimizerStep hyper, const StepParams *step,
                                 OptimState *state) {
  Call c = call_begin(be, CHECK_OP_optimizer_step);
  WHOLE(params, DTYPE_F32, n);
  WHOLE(compute, be->act, n);
  WHOLE(grads, DTYPE_F32, n);
  WHOLE(m, DTYPE_F32, n);
  WHOLE(v, DTYPE_F32, n);
  BYTES(chunks, AdamWChunk, num_chunks);
  BYTES(step, StepParams, 1);
  BYTES(state, OptimState, 1);
  INNER->optimizer_step(be, params, compute, grads, m, v, n, chunks, num_chunks, hyper, step,
                        state);
}

static void check_ema_update(Backend *be, float *ema, const float *params, int64_t n, EmaSettings s,
                             const OptimState *state) {
  Call c = call_begin(be, CHECK_OP_ema_update);
  WHOLE(ema, DTYPE_F32, n);
  WHOLE(params, DTYPE_F32, n);
  BYTES(state, OptimState, 1);
  INNER->ema_update(be, ema, params, n, s, state);
}

static void check_weights_swap(Backend *be, float *a, float *b, int64_t n) {
  Call c = call_begin(be, CHECK_OP_weights_swap);
  WHOLE(a, DTYPE_F32, n);
  WHOLE(b, DTYPE_F32, n);
  INNER->weights_swap(be, a, b, n);
}

#undef CHECK
#undef NEEDED
#undef WHOLE
#undef BYTES
#undef INNER

// ---- installing, counts -----------------------------------------------------------------------

void backend_check_install(Backend *be) {
  BackendCheck *st = calloc_check(1, sizeof(BackendCheck));
  st->inner = be->ops;
  st->ops = *be->ops;
#define X(op) st->ops.op = check_##op;
  CHECKED_OPS(X)
#undef X
  be->check = st;
  be->ops = &st->ops;
}

void backend_check_remove(Backend *be) {
  BackendCheck *st = be->check;
  if (!st) return;
  be->ops = st->inner;
  free(st->tensors.items);
  free(st->buffers.items);
  free(st);
  be->check = NULL;
}

int backend_check_op_count(void) {
  return CHECK_OPS;
}

const char *backend_check_op_name(int i) {
  return i >= 0 && i < CHECK_OPS ? op_names[i] : NULL;
}

int backend_check_counts(const Backend *be, const char *name, BackendCheckCounts *counts) {
  for (int i = 0; i < CHECK_OPS; i++)
    if (be->check && strcmp(op_names[i], name) == 0) {
      *counts = be->check->counts[i];
      return 0;
    }
  return -1;
}

void backend_check_reset_counts(Backend *be) {
  if (be->check) memset(be->check->counts, 0, sizeof be->check->counts);
}

int backend_check_region_count(const Backend *be) {
  return be->check ? be->check->tensors.count + be->check->buffers.count : 0;
}

const BackendOps *backend_check_inner(const Backend *be) {
  return be->check ? be->check->inner : be->ops;
}
