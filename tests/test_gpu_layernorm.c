// test_gpu_layernorm.c: the CUDA backend's fused residual + LayerNorm, patch merging +
// LayerNorm and res-post-norm residual (residual_layernorm_{forward,backward},
// merge_layernorm_{forward,backward}, postnorm_residual_{forward,backward}: Swin V2's attention
// and MLP units on every shape below, C = 1536 included) against the CPU backend's, in fp32,
// bf16 and fp16. Every way src/model/model.c calls the fused op is a
// mode below (window partition / reverse folded in through shifted and unshifted maps, drop-path
// scales with a zero, dres aliasing, no dres, no LayerNorm term); the shapes cover the 16-byte
// path, the scalar path (C = 30), Swin-T's stage 1 at batch 2, Swin V2-T's stage 1 at batch 32
// (the res-post-norm register backward's slots then take two rows each), and a large C (fewer
// warps per backward block). The merge runs on those shapes and on Swin-T's three merges (C = 96, 192, 384 on
// 56x56, 28x28, 14x14 maps, batches large enough that each backward slot takes several rows), a
// ragged one (the last block part full, odd W/2); together they reach every register shape of
// bf16 / fp16 / fp32 that Swin-T uses and both fallbacks (C = 30 scalar; 4C = 6144, too wide for
// registers). Parameter gradients accumulate onto random values; every backward runs twice and
// must give the same bits. The backward's dbranch_bias (the column sums of dbranch, the bias
// gradient of the layer that produced the branch) is asked for wherever the model asks for it,
// the pure residual without LayerNorm term included.
#include "tests/util/test_gpu_util.h"

#ifdef SWIN_HAVE_CUDA
#include "kernels/gemm.h"

typedef struct {
  const char *name;
  int B, H, W, C;
  int window, shift;  // square windows and shift, as Swin's
} LnShape;

static const LnShape shapes[] = {
    {"small", 2, 8, 12, 48, 4, 2},
    {"Swin-T stage 1", 2, 28, 28, 192, 7, 3},
    {"Swin V2-T stage 1 (256 px, window 8; rows per backward slot > 1)", 32, 32, 32, 96, 8, 4},
    {"odd width (scalar path)", 2, 8, 12, 30, 4, 2},
    {"large C (4 warps per backward block, 1 in the merge)", 2, 8, 8, 1536, 4, 2},
};
#define NUM_SHAPES ((int)(sizeof shapes / sizeof shapes[0]))

// Patch merging + LayerNorm (window and shift unused): the shapes above and these.
static const LnShape merge_only_shapes[] = {
    {"ragged: 105 merged rows, W/2 = 7", 3, 10, 14, 96, 0, 0},
    {"Swin-T merge 1 (4C = 384)", 7, 56, 56, 96, 0, 0},
    {"Swin-T merge 2 (4C = 768)", 16, 28, 28, 192, 0, 0},
    {"Swin-T merge 3 (4C = 1536)", 32, 14, 14, 384, 0, 0},
};
#define NUM_MERGE_ONLY_SHAPES ((int)(sizeof merge_only_shapes / sizeof merge_only_shapes[0]))

// Which window order a tensor is in: token order (no map), unshifted or shifted windows.
typedef enum { MAP_NONE, MAP_PLAIN, MAP_SHIFTED } MapKind;

static WindowMap shape_map(const LnShape *s, MapKind k) {
  int shift = k == MAP_SHIFTED ? s->shift : 0;
  WindowMap m = {s->H, s->W, s->window, s->window, shift, shift};
  return m;
}

// A forward call as the model makes it.
typedef struct {
  const char *name;
  bool branch;  // x_out = x_in + scale * branch[bmap(t)]
  MapKind bmap;
  bool scale;  // drop-path scales (one sample dropped) instead of NULL
  bool ln;     // ln_out[lmap(t)] = LN(x_out[t]), mean and rstd
  MapKind lmap;
  bool in_place;  // x_out is x_in
} ForwardMode;

static const ForwardMode forward_modes[] = {
    {"LN1 + previous MLP residual, into shifted windows", true, MAP_NONE, true, true, MAP_SHIFTED,
     false},
    {"attention residual from shifted windows + LN2", true, MAP_SHIFTED, true, true, MAP_NONE,
     false},
    {"LN1 of a stage's first block, into windows", false, MAP_NONE, false, true, MAP_PLAIN, false},
    {"stage end: residual only", true, MAP_NONE, true, false, MAP_NONE, false},
    {"residual only, in place", true, MAP_NONE, true, false, MAP_NONE, true},
    {"last residual + final norm, no drop path", true, MAP_NONE, false, true, MAP_NONE, false},
    {"patch-embedding LN", false, MAP_NONE, false, true, MAP_NONE, false},
};

// A backward call as the model makes it (dbranch is always written).
typedef enum { DRES_NONE, DRES_ALIAS, DRES_SEPARATE } DresOut;
typedef struct {
  const char *name;
  bool dres_in;
  DresOut dres_out;  // none, the dres_in array itself, or its own array
  bool dln;          // the LayerNorm term, dweight and dbias
  MapKind lmap;      // dln's order
  MapKind bmap;      // dbranch's order
  bool scale;
  bool dbranch_bias;  // dbranch's column sums (the branch's producer's bias gradient)
} BackwardMode;

static const BackwardMode backward_modes[] = {
    {"LN1 of block j > 0: dres + LN1' from shifted windows, scaled, fc2 bias", true, DRES_ALIAS,
     true, MAP_SHIFTED, MAP_NONE, true, true},
    {"LN1 of a stage's first block: from windows, no dres_out, no bias", true, DRES_NONE, true,
     MAP_PLAIN, MAP_NONE, false, false},
    {"LN2 + attention residual: dbranch to shifted windows, scaled, proj bias", true, DRES_ALIAS,
     true, MAP_NONE, MAP_SHIFTED, true, true},
    {"final norm + last residual: no dres_in, fc2 bias", false, DRES_SEPARATE, true, MAP_NONE,
     MAP_NONE, true, true},
    {"stage end: pure residual, no dln, fc2 bias", true, DRES_ALIAS, false, MAP_NONE, MAP_NONE,
     true, true},
    {"patch-embedding LN: no dres_in, no dres_out, projection bias", false, DRES_NONE, true,
     MAP_NONE, MAP_NONE, false, true},
};

static const WindowMap *map_or_null(const WindowMap *m, MapKind k) {
  return k == MAP_NONE ? NULL : m;
}

static int64_t shape_rows(const LnShape *s) {
  return (int64_t)s->B * s->H * s->W;
}

static void describe(char *ctx, size_t size, const char *op, const char *mode, const char *prec,
                     const LnShape *s) {
  snprintf(ctx, size, "%s [%s] %s, B=%d %dx%d C=%d win %d shift %d (%s)", op, prec, s->name, s->B,
           s->H, s->W, s->C, s->window, s->shift, mode);
}

// Rows of C values, each around its own offset in [-1, 1) so the mean subtraction matters.
static float *random_rows(TestRng *r, DType dt, int64_t rows, int C) {
  float *x = test_alloc_floats(rows * C);
  for (int64_t i = 0; i < rows; i++) {
    float offset = test_rng_uniform(r, -1.0f, 1.0f);
    test_fill_uniform(r, x + i * C, C, offset - 1.0f, offset + 1.0f);
  }
  test_round_all(dt, x, rows * C);
  return x;
}

// Drop-path scales (B): even samples kept (1 / keep, keep 0.8), odd ones dropped (0).
static float *drop_scales(int B) {
  float *s = test_alloc_floats(B);
  for (int b = 0; b < B; b++) s[b] = b % 2 ? 0.0f : 1.0f / 0.8f;
  return s;
}

// ---- residual + LayerNorm forward --------------------------------------------------------------

typedef struct {
  float *x_in, *branch, *scale, *weight, *bias;
} ForwardIn;
typedef struct {
  float *x_out, *ln_out, *mean, *rstd;  // (rows, C), (rows, C), (rows), (rows)
} ForwardOut;

static void forward_out_alloc(ForwardOut *o, int64_t rows, int C) {
  o->x_out = test_alloc_floats(rows * C);
  o->ln_out = test_alloc_floats(rows * C);
  o->mean = test_alloc_floats(rows);
  o->rstd = test_alloc_floats(rows);
}
static void forward_out_free(ForwardOut *o) {
  free(o->x_out);
  free(o->ln_out);
  free(o->mean);
  free(o->rstd);
}

static void forward_on(Backend *be, const LnShape *s, const ForwardMode *md, const ForwardIn *in,
                       ForwardOut *out) {
  const int64_t L = (int64_t)s->H * s->W, rows = shape_rows(s), n = rows * s->C;
  void *x_in = be_copy_act(be, in->x_in, n);
  void *branch = md->branch ? be_copy_act(be, in->branch, n) : NULL;
  float *scale = md->scale ? be_copy_f32(be, in->scale, s->B) : NULL;
  float *weight = be_copy_f32(be, in->weight, s->C), *bias = be_copy_f32(be, in->bias, s->C);
  void *x_out = md->in_place ? x_in : md->branch ? be_poisoned_act(be, n) : NULL;
  void *ln_out = md->ln ? be_poisoned_act(be, n) : NULL;
  float *mean = be_poisoned_f32(be, rows), *rstd = be_poisoned_f32(be, rows);
  WindowMap bm = shape_map(s, md->bmap), lm = shape_map(s, md->lmap);
  be->ops->residual_layernorm_forward(be, x_out, ln_out, mean, rstd, x_in, branch,
                                      map_or_null(&bm, md->bmap), scale, weight, bias,
                                      map_or_null(&lm, md->lmap), s->B, L, s->C);
  if (x_out) be_read_act(be, out->x_out, x_out, n);
  if (ln_out) {
    be_read_act(be, out->ln_out, ln_out, n);
    be_read_f32(be, out->mean, mean, rows);
    be_read_f32(be, out->rstd, rstd, rows);
  }
  if (!md->in_place) be_free(be, x_out);
  void *bufs[] = {x_in, branch, scale, weight, bias, ln_out, mean, rstd};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be_free(be, bufs[i]);
}

static void forward_in_make(ForwardIn *in, TestRng *rng, DType dt, const LnShape *s) {
  const int64_t rows = shape_rows(s), n = rows * s->C;
  in->x_in = random_rows(rng, dt, rows, s->C);
  in->branch = test_random_act(rng, dt, n, -1.0f, 1.0f);
  in->scale = drop_scales(s->B);
  in->weight = test_alloc_floats(s->C);
  in->bias = test_alloc_floats(s->C);
  test_fill_uniform(rng, in->weight, s->C, 0.5f, 1.5f);
  test_fill_uniform(rng, in->bias, s->C, -0.5f, 0.5f);
}
static void forward_in_free(ForwardIn *in) {
  free(in->x_in);
  free(in->branch);
  free(in->scale);
  free(in->weight);
  free(in->bias);
}

static void check_forward(BackendPair *p, const LnShape *s, const ForwardMode *md, TestRng *rng) {
  const DType dt = p->gpu.act;
  const int64_t rows = shape_rows(s), n = rows * s->C;
  char ctx[512];
  describe(ctx, sizeof ctx, "residual_layernorm_forward", md->name, p->precision, s);
  ForwardIn in;
  forward_in_make(&in, rng, dt, s);
  ForwardOut want, got;
  forward_out_alloc(&want, rows, s->C);
  forward_out_alloc(&got, rows, s->C);
  forward_on(&p->cpu, s, md, &in, &want);
  forward_on(&p->gpu, s, md, &in, &got);
  // x_out is one fp32 add (an fma on the GPU) rounded once to dt. With a branch the GPU
  // normalizes that rounded sum (the CPU the exact one): the rounding, divided by the row's
  // standard deviation (~0.6 here), reaches ln_out, and the statistics move by the rounding's
  // row mean. Without a branch both normalize the same values.
  if (md->branch) test_compare(ctx, "x_out", got.x_out, want.x_out, n, tol_stored(dt));
  if (md->ln) {
    test_compare(ctx, "ln_out", got.ln_out, want.ln_out, n,
                 md->branch ? tol_chained(dt) : tol_stored(dt));
    double stat_tol = md->branch ? tol_stored(dt) : TOL_F32;
    test_compare(ctx, "mean", got.mean, want.mean, rows, stat_tol);
    test_compare(ctx, "rstd", got.rstd, want.rstd, rows, stat_tol);
  }
  forward_in_free(&in);
  forward_out_free(&want);
  forward_out_free(&got);
}

// Negative control: the GPU told to write LN1 into unshifted windows where the CPU shifts them.
static void negative_control(BackendPair *p, const LnShape *s, TestRng *rng) {
  const ForwardMode *md = &forward_modes[0];
  ForwardMode wrong = *md;
  wrong.lmap = MAP_PLAIN;
  const int64_t rows = shape_rows(s), n = rows * s->C;
  char ctx[512];
  describe(ctx, sizeof ctx, "negative control: residual_layernorm_forward, GPU without shift",
           md->name, p->precision, s);
  ForwardIn in;
  forward_in_make(&in, rng, p->gpu.act, s);
  ForwardOut want, got;
  forward_out_alloc(&want, rows, s->C);
  forward_out_alloc(&got, rows, s->C);
  forward_on(&p->cpu, s, md, &in, &want);
  forward_on(&p->gpu, s, &wrong, &in, &got);
  test_must_differ(ctx, "ln_out", got.ln_out, want.ln_out, n, tol_chained(p->gpu.act));
  forward_in_free(&in);
  forward_out_free(&want);
  forward_out_free(&got);
}

// ---- residual + LayerNorm backward -------------------------------------------------------------

typedef struct {
  float *dres_in, *dln, *x, *weight, *mean, *rstd, *scale, *dweight0, *dbias0, *dbranch_bias0;
} BackwardIn;
typedef struct {
  float *dres_out, *dbranch, *dweight, *dbias, *dbranch_bias;
} BackwardOut;

static void backward_out_alloc(BackwardOut *o, int64_t n, int C) {
  o->dres_out = test_alloc_floats(n);
  o->dbranch = test_alloc_floats(n);
  o->dweight = test_alloc_floats(C);
  o->dbias = test_alloc_floats(C);
  o->dbranch_bias = test_alloc_floats(C);
}
static void backward_out_free(BackwardOut *o) {
  free(o->dres_out);
  free(o->dbranch);
  free(o->dweight);
  free(o->dbias);
  free(o->dbranch_bias);
}

static void backward_on(Backend *be, const LnShape *s, const BackwardMode *md, const BackwardIn *in,
                        BackwardOut *out) {
  const int64_t L = (int64_t)s->H * s->W, rows = shape_rows(s), n = rows * s->C;
  float *dres_in = md->dres_in ? be_copy_f32(be, in->dres_in, n) : NULL;
  float *dres_out = md->dres_out == DRES_ALIAS      ? dres_in
                    : md->dres_out == DRES_SEPARATE ? be_poisoned_f32(be, n)
                                                    : NULL;
  void *dbranch = be_poisoned_act(be, n);
  void *dln = NULL, *x = NULL;
  float *weight = NULL, *mean = NULL, *rstd = NULL, *dweight = NULL, *dbias = NULL;
  if (md->dln) {
    dln = be_copy_act(be, in->dln, n);
    x = be_copy_act(be, in->x, n);
    weight = be_copy_f32(be, in->weight, s->C);
    mean = be_copy_f32(be, in->mean, rows);
    rstd = be_copy_f32(be, in->rstd, rows);
    dweight = be_copy_f32(be, in->dweight0, s->C);
    dbias = be_copy_f32(be, in->dbias0, s->C);
  }
  float *scale = md->scale ? be_copy_f32(be, in->scale, s->B) : NULL;
  float *dbranch_bias = md->dbranch_bias ? be_copy_f32(be, in->dbranch_bias0, s->C) : NULL;
  WindowMap bm = shape_map(s, md->bmap), lm = shape_map(s, md->lmap);
  be->ops->residual_layernorm_backward(be, dres_out, dbranch, dbranch_bias, dweight, dbias, dres_in,
                                       dln, x, weight, mean, rstd, map_or_null(&bm, md->bmap),
                                       scale, map_or_null(&lm, md->lmap), s->B, L, s->C);
  if (dres_out) be_read_f32(be, out->dres_out, dres_out, n);
  be_read_act(be, out->dbranch, dbranch, n);
  if (md->dln) {
    be_read_f32(be, out->dweight, dweight, s->C);
    be_read_f32(be, out->dbias, dbias, s->C);
  }
  if (dbranch_bias) be_read_f32(be, out->dbranch_bias, dbranch_bias, s->C);
  if (md->dres_out == DRES_SEPARATE) be_free(be, dres_out);
  void *bufs[] = {dres_in, dbranch, dln,   x,     weight,      mean,
                  rstd,    dweight, dbias, scale, dbranch_bias};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be_free(be, bufs[i]);
}

// mean and rstd of x's rows as the forward saves them (the CPU backend's LayerNorm).
static void row_stats(BackendPair *p, const LnShape *s, const float *x, float *mean, float *rstd) {
  static const ForwardMode ln_only = {"LN only", false, MAP_NONE, false, true, MAP_NONE, false};
  const int64_t rows = shape_rows(s);
  ForwardIn in = {
      .x_in = (float *)x, .weight = test_alloc_floats(s->C), .bias = test_alloc_floats(s->C)};
  for (int c = 0; c < s->C; c++) {
    in.weight[c] = 1.0f;
    in.bias[c] = 0.0f;
  }
  ForwardOut o;
  forward_out_alloc(&o, rows, s->C);
  forward_on(&p->cpu, s, &ln_only, &in, &o);
  memcpy(mean, o.mean, sizeof(float) * (size_t)rows);
  memcpy(rstd, o.rstd, sizeof(float) * (size_t)rows);
  forward_out_free(&o);
  free(in.weight);
  free(in.bias);
}

static void check_backward(BackendPair *p, const LnShape *s, const BackwardMode *md, TestRng *rng) {
  const DType dt = p->gpu.act;
  const int64_t rows = shape_rows(s), n = rows * s->C;
  const int C = s->C;
  char ctx[512];
  describe(ctx, sizeof ctx, "residual_layernorm_backward", md->name, p->precision, s);
  BackwardIn in;
  in.dres_in = test_alloc_floats(n);
  test_fill_uniform(rng, in.dres_in, n, -1.0f, 1.0f);
  in.dln = test_random_act(rng, dt, n, -1.0f, 1.0f);
  in.x = random_rows(rng, dt, rows, C);
  in.weight = test_alloc_floats(C);
  test_fill_uniform(rng, in.weight, C, 0.5f, 1.5f);
  in.mean = test_alloc_floats(rows);
  in.rstd = test_alloc_floats(rows);
  row_stats(p, s, in.x, in.mean, in.rstd);
  in.scale = drop_scales(s->B);
  in.dweight0 = test_alloc_floats(C);
  in.dbias0 = test_alloc_floats(C);
  in.dbranch_bias0 = test_alloc_floats(C);
  test_fill_uniform(rng, in.dweight0, C, -1.0f, 1.0f);
  test_fill_uniform(rng, in.dbias0, C, -1.0f, 1.0f);
  test_fill_uniform(rng, in.dbranch_bias0, C, -1.0f, 1.0f);

  BackwardOut want, got, again;
  backward_out_alloc(&want, n, C);
  backward_out_alloc(&got, n, C);
  backward_out_alloc(&again, n, C);
  backward_on(&p->cpu, s, md, &in, &want);
  backward_on(&p->gpu, s, md, &in, &got);
  backward_on(&p->gpu, s, md, &in, &again);
  // Both backends compute the gradients in fp32 (statistics of the row sums: GPU fp32 shuffles,
  // CPU double) from the same inputs; only dbranch is stored in dt (one rounding).
  if (md->dres_out != DRES_NONE) {
    test_compare(ctx, "dres_out", got.dres_out, want.dres_out, n, TOL_F32);
    test_same_bits(ctx, "dres_out, two GPU runs", got.dres_out, again.dres_out, n);
  }
  test_compare(ctx, "dbranch", got.dbranch, want.dbranch, n, tol_stored(dt));
  test_same_bits(ctx, "dbranch, two GPU runs", got.dbranch, again.dbranch, n);
  if (md->dln) {
    test_compare_increment(ctx, "dweight", got.dweight, want.dweight, in.dweight0, C, TOL_F32);
    test_compare_increment(ctx, "dbias", got.dbias, want.dbias, in.dbias0, C, TOL_F32);
    test_same_bits(ctx, "dweight, two GPU runs", got.dweight, again.dweight, C);
    test_same_bits(ctx, "dbias, two GPU runs", got.dbias, again.dbias, C);
  }
  if (md->dbranch_bias) {
    // The GPU sums dbranch as it stores it (rounded to dt), the CPU its fp32 values: the
    // roundings (each at most u of its element, of random sign) reach the sums as one rounding
    // does a tensor, u normwise at most; the fp32 sums themselves differ by far less. Against
    // the GPU's own dbranch as read back (summed here in double) only the fp32 order differs.
    test_compare_increment(ctx, "dbranch_bias", got.dbranch_bias, want.dbranch_bias,
                           in.dbranch_bias0, C, tol_stored(dt));
    float *own = test_copy_floats(in.dbranch_bias0, C);
    column_sums_cpu(own, got.dbranch, rows, C);
    test_compare_increment(ctx, "dbranch_bias vs the sums of the GPU's own dbranch",
                           got.dbranch_bias, own, in.dbranch_bias0, C, TOL_F32);
    test_same_bits(ctx, "dbranch_bias, two GPU runs", got.dbranch_bias, again.dbranch_bias, C);
    free(own);
  }
  float *bufs[] = {in.dres_in, in.dln,   in.x,        in.weight, in.mean,
                   in.rstd,    in.scale, in.dweight0, in.dbias0, in.dbranch_bias0};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
  backward_out_free(&want);
  backward_out_free(&got);
  backward_out_free(&again);
}

// ---- patch merging + LayerNorm -----------------------------------------------------------------

// tokens (B, H, W, C) -> out (B, H/2, W/2, 4C), mean, rstd (B*H/2*W/2).
static void merge_forward_on(Backend *be, const LnShape *s, const float *tokens_h,
                             const float *weight_h, const float *bias_h, float *out_h,
                             float *mean_h, float *rstd_h) {
  const int64_t n = shape_rows(s) * s->C, rows = shape_rows(s) / 4;
  void *tokens = be_copy_act(be, tokens_h, n);
  float *weight = be_copy_f32(be, weight_h, 4 * s->C), *bias = be_copy_f32(be, bias_h, 4 * s->C);
  void *out = be_poisoned_act(be, n);
  float *mean = be_poisoned_f32(be, rows), *rstd = be_poisoned_f32(be, rows);
  be->ops->merge_layernorm_forward(be, out, mean, rstd, tokens, weight, bias, s->B, s->H, s->W,
                                   s->C);
  be_read_act(be, out_h, out, n);
  be_read_f32(be, mean_h, mean, rows);
  be_read_f32(be, rstd_h, rstd, rows);
  void *bufs[] = {tokens, weight, bias, out, mean, rstd};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be_free(be, bufs[i]);
}

// dtokens (B, H, W, C) from dout (B, H/2, W/2, 4C); dweight, dbias (4C) start from dw0, db0.
static void merge_backward_on(Backend *be, const LnShape *s, const float *dout_h,
                              const float *tokens_h, const float *weight_h, const float *mean_h,
                              const float *rstd_h, const float *dw0, const float *db0,
                              float *dtokens_h, float *dw_h, float *db_h) {
  const int64_t n = shape_rows(s) * s->C, rows = shape_rows(s) / 4;
  const int C4 = 4 * s->C;
  void *dout = be_copy_act(be, dout_h, n), *tokens = be_copy_act(be, tokens_h, n);
  float *weight = be_copy_f32(be, weight_h, C4), *mean = be_copy_f32(be, mean_h, rows);
  float *rstd = be_copy_f32(be, rstd_h, rows);
  float *dw = be_copy_f32(be, dw0, C4), *db = be_copy_f32(be, db0, C4);
  float *dtokens = be_poisoned_f32(be, n);
  be->ops->merge_layernorm_backward(be, dtokens, dw, db, dout, tokens, weight, mean, rstd, s->B,
                                    s->H, s->W, s->C);
  be_read_f32(be, dtokens_h, dtokens, n);
  be_read_f32(be, dw_h, dw, C4);
  be_read_f32(be, db_h, db, C4);
  void *bufs[] = {dout, tokens, weight, mean, rstd, dw, db, dtokens};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be_free(be, bufs[i]);
}

static void check_merge(BackendPair *p, const LnShape *s, TestRng *rng) {
  const DType dt = p->gpu.act;
  const int64_t n = shape_rows(s) * s->C, rows = shape_rows(s) / 4;
  const int C4 = 4 * s->C;
  char ctx[512];
  snprintf(ctx, sizeof ctx, "merge_layernorm [%s] %s, B=%d %dx%d C=%d (2x2 merge + LN)",
           p->precision, s->name, s->B, s->H, s->W, s->C);
  float *tokens = random_rows(rng, dt, shape_rows(s), s->C);
  float *weight = test_alloc_floats(C4), *bias = test_alloc_floats(C4);
  test_fill_uniform(rng, weight, C4, 0.5f, 1.5f);
  test_fill_uniform(rng, bias, C4, -0.5f, 0.5f);

  // Forward: the same gather and fp32 LayerNorm, the GPU's output rounded once to dt.
  float *out[3], *mean[3], *rstd[3];  // CPU, GPU, GPU again
  for (int k = 0; k < 3; k++) {
    out[k] = test_alloc_floats(n);
    mean[k] = test_alloc_floats(rows);
    rstd[k] = test_alloc_floats(rows);
    merge_forward_on(k == 0 ? &p->cpu : &p->gpu, s, tokens, weight, bias, out[k], mean[k], rstd[k]);
  }
  test_compare(ctx, "forward out", out[1], out[0], n, tol_stored(dt));
  test_compare(ctx, "forward mean", mean[1], mean[0], rows, TOL_F32);
  test_compare(ctx, "forward rstd", rstd[1], rstd[0], rows, TOL_F32);
  test_same_bits(ctx, "forward out, two GPU runs", out[1], out[2], n);
  test_same_bits(ctx, "forward mean, two GPU runs", mean[1], mean[2], rows);
  test_same_bits(ctx, "forward rstd, two GPU runs", rstd[1], rstd[2], rows);

  // Backward from the CPU's statistics: fp32 on both sides from the same inputs.
  float *dout = test_random_act(rng, dt, n, -1.0f, 1.0f);
  float *dw0 = test_alloc_floats(C4), *db0 = test_alloc_floats(C4);
  test_fill_uniform(rng, dw0, C4, -1.0f, 1.0f);
  test_fill_uniform(rng, db0, C4, -1.0f, 1.0f);
  float *dtok[3], *dw[3], *db[3];  // CPU, GPU, GPU again
  for (int k = 0; k < 3; k++) {
    dtok[k] = test_alloc_floats(n);
    dw[k] = test_alloc_floats(C4);
    db[k] = test_alloc_floats(C4);
    merge_backward_on(k == 0 ? &p->cpu : &p->gpu, s, dout, tokens, weight, mean[0], rstd[0], dw0,
                      db0, dtok[k], dw[k], db[k]);
  }
  test_compare(ctx, "backward dtokens", dtok[1], dtok[0], n, TOL_F32);
  test_compare_increment(ctx, "backward dweight", dw[1], dw[0], dw0, C4, TOL_F32);
  test_compare_increment(ctx, "backward dbias", db[1], db[0], db0, C4, TOL_F32);
  test_same_bits(ctx, "backward dtokens, two GPU runs", dtok[1], dtok[2], n);
  test_same_bits(ctx, "backward dweight, two GPU runs", dw[1], dw[2], C4);
  test_same_bits(ctx, "backward dbias, two GPU runs", db[1], db[2], C4);

  for (int k = 0; k < 3; k++) {
    free(out[k]);
    free(mean[k]);
    free(rstd[k]);
    free(dtok[k]);
    free(dw[k]);
    free(db[k]);
  }
  float *bufs[] = {tokens, weight, bias, dout, dw0, db0};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
}

// ---- res-post-norm residual (Swin V2)
// ------------------------------------------------------------ The attention unit's forward and
// backward (branch from shifted windows, drop path) and the MLP unit's (xw_out into shifted
// windows, dx from them), as V2's blocks call them, against the CPU, each GPU run twice for the
// same bits.
typedef struct {
  const char *name;
  MapKind bmap, omap;  // the branch's order; xw_out's and dx's (MAP_NONE: neither is given)
} PostMode;

static const PostMode post_modes[] = {
    {"attention unit: branch from shifted windows", MAP_SHIFTED, MAP_NONE},
    {"MLP unit: xw_out, dx in shifted windows", MAP_NONE, MAP_SHIFTED},
};

typedef struct {
  float *x_in, *branch, *scale, *weight, *bias, *dres_in, *dx, *dw0, *db0, *dbb0;
} PostIn;
typedef struct {
  float *x_out, *xw_out, *mean, *rstd, *dres_out, *dbranch, *dw, *db, *dbb;
} PostOut;

static void post_out_alloc(PostOut *o, int64_t rows, int C) {
  const int64_t n = rows * C;
  *o = (PostOut){test_alloc_floats(n),    test_alloc_floats(n), test_alloc_floats(rows),
                 test_alloc_floats(rows), test_alloc_floats(n), test_alloc_floats(n),
                 test_alloc_floats(C),    test_alloc_floats(C), test_alloc_floats(C)};
}
static void post_out_free(PostOut *o) {
  float *bufs[] = {o->x_out,   o->xw_out, o->mean, o->rstd, o->dres_out,
                   o->dbranch, o->dw,     o->db,   o->dbb};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
}

// The forward, then the backward from the forward's own statistics (dres aliased as the model
// passes it), on one backend.
static void post_on(Backend *be, const LnShape *s, const PostMode *md, const PostIn *in,
                    PostOut *out) {
  const int64_t L = (int64_t)s->H * s->W, rows = shape_rows(s), n = rows * s->C;
  const bool windows = md->omap != MAP_NONE;
  WindowMap bm = shape_map(s, md->bmap), om = shape_map(s, md->omap);
  void *x_in = be_copy_act(be, in->x_in, n), *branch = be_copy_act(be, in->branch, n);
  float *scale = be_copy_f32(be, in->scale, s->B);
  float *weight = be_copy_f32(be, in->weight, s->C), *bias = be_copy_f32(be, in->bias, s->C);
  void *x_out = be_poisoned_act(be, n), *xw_out = windows ? be_poisoned_act(be, n) : NULL;
  float *mean = be_poisoned_f32(be, rows), *rstd = be_poisoned_f32(be, rows);
  be->ops->postnorm_residual_forward(be, x_out, xw_out, mean, rstd, x_in, branch,
                                     map_or_null(&bm, md->bmap), scale, weight, bias,
                                     map_or_null(&om, md->omap), s->B, L, s->C);
  be_read_act(be, out->x_out, x_out, n);
  if (windows) be_read_act(be, out->xw_out, xw_out, n);
  be_read_f32(be, out->mean, mean, rows);
  be_read_f32(be, out->rstd, rstd, rows);

  float *dres = be_copy_f32(be, in->dres_in, n);
  void *dx = windows ? be_copy_act(be, in->dx, n) : NULL, *dbranch = be_poisoned_act(be, n);
  float *dw = be_copy_f32(be, in->dw0, s->C), *db = be_copy_f32(be, in->db0, s->C);
  float *dbb = be_copy_f32(be, in->dbb0, s->C);
  be->ops->postnorm_residual_backward(be, dres, dbranch, dbb, dw, db, dres, dx,
                                      map_or_null(&om, md->omap), branch, weight, mean, rstd,
                                      map_or_null(&bm, md->bmap), scale, s->B, L, s->C);
  be_read_f32(be, out->dres_out, dres, n);
  be_read_act(be, out->dbranch, dbranch, n);
  be_read_f32(be, out->dw, dw, s->C);
  be_read_f32(be, out->db, db, s->C);
  be_read_f32(be, out->dbb, dbb, s->C);
  void *bufs[] = {x_in, branch, scale, weight,  bias, x_out, xw_out, mean,
                  rstd, dres,   dx,    dbranch, dw,   db,    dbb};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be_free(be, bufs[i]);
}

static void check_postnorm(BackendPair *p, const LnShape *s, const PostMode *md, TestRng *rng) {
  const DType dt = p->gpu.act;
  const int64_t rows = shape_rows(s), n = rows * s->C;
  const int C = s->C;
  char ctx[512];
  describe(ctx, sizeof ctx, "postnorm_residual", md->name, p->precision, s);
  PostIn in = {.x_in = test_random_act(rng, dt, n, -1.0f, 1.0f),
               .branch = random_rows(rng, dt, rows, C),
               .scale = drop_scales(s->B),
               .weight = test_alloc_floats(C),
               .bias = test_alloc_floats(C),
               .dres_in = test_alloc_floats(n),
               .dx = test_random_act(rng, dt, n, -1.0f, 1.0f),
               .dw0 = test_alloc_floats(C),
               .db0 = test_alloc_floats(C),
               .dbb0 = test_alloc_floats(C)};
  test_fill_uniform(rng, in.weight, C, 0.5f, 1.5f);
  test_fill_uniform(rng, in.bias, C, -0.5f, 0.5f);
  test_fill_uniform(rng, in.dres_in, n, -1.0f, 1.0f);
  test_fill_uniform(rng, in.dw0, C, -1.0f, 1.0f);
  test_fill_uniform(rng, in.db0, C, -1.0f, 1.0f);
  test_fill_uniform(rng, in.dbb0, C, -1.0f, 1.0f);
  PostOut want, got, again;
  post_out_alloc(&want, rows, C);
  post_out_alloc(&got, rows, C);
  post_out_alloc(&again, rows, C);
  post_on(&p->cpu, s, md, &in, &want);
  post_on(&p->gpu, s, md, &in, &got);
  post_on(&p->gpu, s, md, &in, &again);
  // Forward: the same fp32 LayerNorm of the same branch (statistics in fp32 shuffles against
  // double), one add rounded once to dt. Backward: fp32 from the same inputs and statistics
  // within TOL_F32 of each other; dbranch stored once; dbranch_bias sums the stored dbranch on
  // the GPU (random-sign roundings, u normwise at most).
  test_compare(ctx, "x_out", got.x_out, want.x_out, n, tol_stored(dt));
  if (md->omap != MAP_NONE) {
    test_compare(ctx, "xw_out", got.xw_out, want.xw_out, n, tol_stored(dt));
    test_same_bits(ctx, "xw_out, two GPU runs", got.xw_out, again.xw_out, n);
  }
  test_compare(ctx, "mean", got.mean, want.mean, rows, TOL_F32);
  test_compare(ctx, "rstd", got.rstd, want.rstd, rows, TOL_F32);
  test_compare(ctx, "dres_out", got.dres_out, want.dres_out, n, TOL_F32);
  test_compare(ctx, "dbranch", got.dbranch, want.dbranch, n, tol_stored(dt) + TOL_F32);
  test_compare_increment(ctx, "dweight", got.dw, want.dw, in.dw0, C, TOL_F32);
  test_compare_increment(ctx, "dbias", got.db, want.db, in.db0, C, TOL_F32);
  test_compare_increment(ctx, "dbranch_bias", got.dbb, want.dbb, in.dbb0, C,
                         tol_stored(dt) + TOL_F32);
  test_same_bits(ctx, "x_out, two GPU runs", got.x_out, again.x_out, n);
  test_same_bits(ctx, "dbranch, two GPU runs", got.dbranch, again.dbranch, n);
  test_same_bits(ctx, "dweight, two GPU runs", got.dw, again.dw, C);
  test_same_bits(ctx, "dbias, two GPU runs", got.db, again.db, C);
  test_same_bits(ctx, "dbranch_bias, two GPU runs", got.dbb, again.dbb, C);
  float *bufs[] = {in.x_in,    in.branch, in.scale, in.weight, in.bias,
                   in.dres_in, in.dx,     in.dw0,   in.db0,    in.dbb0};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
  post_out_free(&want);
  post_out_free(&got);
  post_out_free(&again);
}

// Scratch for the largest shape: the CPU composes its fused ops in 2 * elements floats; the CUDA
// backward keeps 3 * width partial sums per block (2 * width in the merge, whose width is 4C).
static BackendNeeds needs_for_shapes(void) {
  BackendNeeds nd = {.max_batch = 1};
  for (int i = 0; i < NUM_SHAPES + NUM_MERGE_ONLY_SHAPES; i++) {
    const LnShape *s = i < NUM_SHAPES ? &shapes[i] : &merge_only_shapes[i - NUM_SHAPES];
    int64_t rows = shape_rows(s), n = rows * s->C;
    if (n > nd.max_elements) nd.max_elements = n;
    if (rows > nd.max_rows) nd.max_rows = rows;
    if (4 * s->C > nd.max_width) nd.max_width = 4 * s->C;
    if (s->B > nd.max_batch) nd.max_batch = s->B;
  }
  return nd;
}
#endif

int main(void) {
  GPU_TEST_MAIN_BEGIN();
#ifdef SWIN_HAVE_CUDA
  TestRng rng = {.state = 0x1a7e5c0de};
  BackendNeeds needs = needs_for_shapes();
  for (int pi = 0; pi < GPU_TEST_PRECISIONS; pi++) {
    BackendPair p;
    backend_pair_create(&p, gpu_test_precisions[pi], &needs);
    for (int si = 0; si < NUM_SHAPES; si++) {
      const LnShape *s = &shapes[si];
      for (size_t m = 0; m < sizeof forward_modes / sizeof forward_modes[0]; m++)
        check_forward(&p, s, &forward_modes[m], &rng);
      for (size_t m = 0; m < sizeof backward_modes / sizeof backward_modes[0]; m++)
        check_backward(&p, s, &backward_modes[m], &rng);
      check_merge(&p, s, &rng);
      for (size_t m = 0; m < sizeof post_modes / sizeof post_modes[0]; m++)
        check_postnorm(&p, s, &post_modes[m], &rng);
    }
    for (int si = 0; si < NUM_MERGE_ONLY_SHAPES; si++)
      check_merge(&p, &merge_only_shapes[si], &rng);
    if (pi == 0) negative_control(&p, &shapes[0], &rng);
    backend_pair_destroy(&p);
  }
#endif
  return test_finish();
}
