// test_gpu_gemm.c: the CUDA backend's linear layers and classifier head against the CPU backend's,
// in fp32, bf16 and fp16.
//   linear_forward: no activation with and without bias, GELU with the pre-activation kept;
//   linear_backward: dinp or none, dweight, dbias or none; gelu_linear_backward: GELU(pre)
//   recomputed into hidden (where the backend stores it: mlp_hidden_elements), dpre through
//   GELU', dweight from GELU(pre), dpre_bias (dpre's column sums: the bias gradient of the MLP's
//   first layer);
//   head_forward / head_backward (mean pool over tokens + fp32 linear) with K = 10 and 1000.
// Shapes as in Swin-T's first stage (qkv 96 -> 288, fc2 384 -> 96 over 1568 tokens), a small one,
// and in fp32 an odd one (37 x 17 -> 10: no dimension a multiple of 4). Parameter gradients
// accumulate onto random values; every backward runs twice on the GPU and must give the same bits.
// Everything runs with GEMM tuning off and again with it on (gemm_tune: the first call of each
// product times up to 16 algorithms on its own operands, so a dweight accumulated onto random
// values also checks that the trials leave C as it was). Then the tuned choices written as text
// and read into a fresh context give the same algorithms, untimed, and the same bits.
#define _POSIX_C_SOURCE 200809L  // open_memstream
#include "tests/util/test_gpu_util.h"

#ifdef SWIN_HAVE_CUDA
#include "kernels/gemm.h"

typedef struct {
  const char *name;
  int64_t N;
  int IC, OC;
  bool f32_only;  // odd sizes: in fp32 only (the 16-bit GEMMs of the configs have widths that
                  // are multiples of 8)
} LinearShape;

static const LinearShape linear_shapes[] = {
    {"qkv (Swin-T stage 0, batch 2)", 1568, 96, 288, false},
    {"fc2 (Swin-T stage 0, batch 2)", 1568, 384, 96, false},
    {"small", 64, 16, 48, false},
    {"odd sizes", 37, 17, 10, true},
};
#define NUM_LINEAR ((int)(sizeof linear_shapes / sizeof linear_shapes[0]))

// fp32 products of K terms in another order (cuBLAS's blocking vs the CPU's packed panels): a
// random walk of roundings, ~2e-6 per side at K = 1000; 1e-5 up to K = 1024, scaled by
// sqrt(K / 1024) beyond.
static double gemm_tol_f32(int64_t K) {
  return TOL_F32 * fmax(1.0, sqrt((double)K / 1024.0));
}
// The bf16 and f16 products run on tensor cores, whose fp32 accumulation is not IEEE (addends
// aligned to the largest exponent and truncated, Fasi et al. 2021): allow 1e-3 on top of the
// fp32 differences. Still 4x below one bf16 rounding, and 25x below one row of 1568 missing
// from a dweight sum (1 / sqrt(1568)).
static double gemm_tol_sum(DType dt, int64_t K) {
  return gemm_tol_f32(K) + (dt == DTYPE_F32 ? 0.0 : 1e-3);
}

static void describe(char *ctx, size_t size, const char *op, const char *mode, const char *prec,
                     const LinearShape *s) {
  snprintf(ctx, size, "%s [%s] %s: N=%lld IC=%d OC=%d (%s)", op, prec, s->name, (long long)s->N,
           s->IC, s->OC, mode);
}

// ---- linear forward ----------------------------------------------------------------------------

typedef struct {
  const char *name;
  bool bias;
  Activation act;
} ForwardMode;

static const ForwardMode forward_modes[] = {
    {"no activation, bias", true, ACTIVATION_NONE},
    {"no activation, no bias", false, ACTIVATION_NONE},
    {"GELU, bias, pre kept", true, ACTIVATION_GELU},
};

// out (N, OC) and, with GELU, pre (N, OC) on be.
static void forward_on(Backend *be, const LinearShape *s, const ForwardMode *md, const float *inp_h,
                       const float *weight_h, const float *bias_h, float *out_h, float *pre_h) {
  const int64_t nin = s->N * s->IC, nout = s->N * s->OC;
  void *inp = be_copy_act(be, inp_h, nin);
  void *weight = be_copy_act(be, weight_h, (int64_t)s->OC * s->IC);
  void *bias = md->bias ? be_copy_act(be, bias_h, s->OC) : NULL;
  void *out = be_poisoned_act(be, nout);
  void *pre = md->act == ACTIVATION_GELU ? be_poisoned_act(be, nout) : NULL;
  be->ops->linear_forward(be, out, inp, weight, bias, s->N, s->IC, s->OC, md->act, pre);
  be_read_act(be, out_h, out, nout);
  if (pre) be_read_act(be, pre_h, pre, nout);
  void *bufs[] = {inp, weight, bias, out, pre};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be_free(be, bufs[i]);
}

typedef struct {
  float *inp, *weight, *bias;
} LinearIn;

// inp U(-1, 1), weight U(-1, 1) / sqrt(IC) (outputs of order 1), bias U(-0.5, 0.5), rounded.
static void linear_in_make(LinearIn *in, TestRng *rng, DType dt, const LinearShape *s) {
  float ws = 1.0f / sqrtf((float)s->IC);
  in->inp = test_random_act(rng, dt, s->N * s->IC, -1.0f, 1.0f);
  in->weight = test_random_act(rng, dt, (int64_t)s->OC * s->IC, -ws, ws);
  in->bias = test_random_act(rng, dt, s->OC, -0.5f, 0.5f);
}
static void linear_in_free(LinearIn *in) {
  free(in->inp);
  free(in->weight);
  free(in->bias);
}

static void check_forward(BackendPair *p, const LinearShape *s, const ForwardMode *md,
                          TestRng *rng) {
  const DType dt = p->gpu.act;
  const int64_t nout = s->N * s->OC;
  char ctx[512];
  describe(ctx, sizeof ctx, "linear_forward", md->name, p->precision, s);
  LinearIn in;
  linear_in_make(&in, rng, dt, s);
  float *out[2], *pre[2];
  for (int k = 0; k < 2; k++) {
    out[k] = test_alloc_floats(nout);
    pre[k] = test_alloc_floats(nout);
    forward_on(k ? &p->gpu : &p->cpu, s, md, in.inp, in.weight, in.bias, out[k], pre[k]);
  }
  // The product (+ bias) is rounded once to dt; with GELU, GELU of the rounded pre-activation
  // is rounded again.
  double tol = unit_roundoff(dt) + gemm_tol_sum(dt, s->IC);
  if (md->act == ACTIVATION_GELU) {
    test_compare(ctx, "pre", pre[1], pre[0], nout, tol);
    test_compare(ctx, "out", out[1], out[0], nout, fmax(tol_chained(dt), tol));
  } else {
    test_compare(ctx, "out", out[1], out[0], nout, tol);
  }
  linear_in_free(&in);
  for (int k = 0; k < 2; k++) {
    free(out[k]);
    free(pre[k]);
  }
}

// ---- linear backward ---------------------------------------------------------------------------

typedef struct {
  const char *name;
  bool dinp, gelu, dbias;  // with gelu, dbias is gelu_linear_backward's dpre_bias (IC)
} BackwardMode;

static const BackwardMode backward_modes[] = {
    {"dinp, dweight, dbias", true, false, true},
    {"gelu_linear_backward: hidden = GELU(pre), dpre, dweight, dpre_bias", true, true, true},
    {"gelu_linear_backward without dpre_bias", true, true, false},
    {"no dinp (patch embedding), dweight, dbias", false, false, true},
    {"dinp, dweight, no dbias (patch merging; the model's layers whose bias gradient is fused)",
     true, false, false},
};

// The bias gradient's width: dout's columns, or with GELU dpre's.
static int bias_width(const LinearShape *s, const BackwardMode *md) {
  return md->gelu ? s->IC : s->OC;
}

typedef struct {
  float *dout, *inp, *weight, *gelu_pre, *dweight0, *dbias0;
} BackwardIn;
typedef struct {
  float *dinp, *dweight, *dbias, *hidden;
  bool hidden_stored;  // with GELU: the backend wrote hidden (mlp_hidden_elements not 0)
} BackwardOut;

static void backward_on(Backend *be, const LinearShape *s, const BackwardMode *md,
                        const BackwardIn *in, BackwardOut *o) {
  const int64_t nin = s->N * s->IC, nout = s->N * s->OC, nw = (int64_t)s->OC * s->IC;
  void *dout = be_copy_act(be, in->dout, nout), *inp = be_copy_act(be, in->inp, nin);
  void *weight = be_copy_act(be, in->weight, nw);
  void *gelu_pre = md->gelu ? be_copy_act(be, in->gelu_pre, nin) : NULL;
  void *dinp = md->dinp ? be_poisoned_act(be, nin) : NULL;
  float *dweight = be_copy_f32(be, in->dweight0, nw);
  const int nb = bias_width(s, md);
  float *dbias = md->dbias ? be_copy_f32(be, in->dbias0, nb) : NULL;
  if (md->gelu) {  // the op writes GELU(pre) into hidden where it stores it; inp is not used
    // As the model passes it: NULL where the backend never stores GELU(pre) (the MLP's C is OC).
    o->hidden_stored = be->ops->mlp_hidden_elements(be, s->N, s->OC, s->IC) > 0;
    void *hidden = o->hidden_stored ? be_poisoned_act(be, nin) : NULL;
    be->ops->gelu_linear_backward(be, dinp, hidden, dweight, dbias, dout, gelu_pre, weight, s->N,
                                  s->IC, s->OC);
    if (hidden) be_read_act(be, o->hidden, hidden, nin);
    be_free(be, hidden);
  } else {
    be->ops->linear_backward(be, dinp, dweight, dbias, dout, inp, weight, s->N, s->IC, s->OC);
  }
  if (dinp) be_read_act(be, o->dinp, dinp, nin);
  be_read_f32(be, o->dweight, dweight, nw);
  if (dbias) be_read_f32(be, o->dbias, dbias, nb);
  void *bufs[] = {dout, inp, weight, gelu_pre, dinp, dweight, dbias};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be_free(be, bufs[i]);
}

static void check_backward(BackendPair *p, const LinearShape *s, const BackwardMode *md,
                           TestRng *rng) {
  const DType dt = p->gpu.act;
  const int64_t nin = s->N * s->IC, nout = s->N * s->OC, nw = (int64_t)s->OC * s->IC;
  char ctx[512];
  describe(ctx, sizeof ctx, "linear_backward", md->name, p->precision, s);
  float ws = 1.0f / sqrtf((float)s->OC);
  BackwardIn in = {.dout = test_random_act(rng, dt, nout, -1.0f, 1.0f),
                   .inp = test_random_act(rng, dt, nin, -1.0f, 1.0f),
                   .weight = test_random_act(rng, dt, nw, -ws, ws),
                   // GELU' varies most over [-3, 3] (0 far left, 1 far right)
                   .gelu_pre = test_random_act(rng, dt, nin, -3.0f, 3.0f),
                   .dweight0 = test_alloc_floats(nw),
                   .dbias0 = test_alloc_floats(bias_width(s, md))};
  const int nb = bias_width(s, md);
  test_fill_uniform(rng, in.dweight0, nw, -1.0f, 1.0f);
  test_fill_uniform(rng, in.dbias0, nb, -1.0f, 1.0f);
  BackwardOut o[3];  // CPU, GPU, GPU again
  for (int k = 0; k < 3; k++) {
    o[k].dinp = test_alloc_floats(nin);
    o[k].dweight = test_alloc_floats(nw);
    o[k].dbias = test_alloc_floats(nb);
    o[k].hidden = test_alloc_floats(nin);
    o[k].hidden_stored = false;
    backward_on(k ? &p->gpu : &p->cpu, s, md, &in, &o[k]);
  }
  // dinp: a product over OC rounded to dt (through GELU': rounded, multiplied, rounded again);
  // dweight: a sum over the N rows into fp32 (with GELU, of the recomputed hidden layer, itself
  // rounded to dt); dbias: fp32 column sums of the same dout. hidden: GELU of the same pre,
  // rounded once (in bf16/f16 from erff where the CPU uses erfc: ~1e-7 apart).
  if (md->gelu && o[1].hidden_stored) {
    test_compare(ctx, "hidden = GELU(pre)", o[1].hidden, o[0].hidden, nin, tol_stored(dt));
    test_same_bits(ctx, "hidden, two GPU runs", o[1].hidden, o[2].hidden, nin);
  } else if (md->gelu) {
    printf("     %s: hidden: not stored by this backend (mlp_hidden_elements 0)\n", ctx);
  }
  const double tol_dinp = md->gelu
                              ? fmax(tol_chained(dt), unit_roundoff(dt) + gemm_tol_sum(dt, s->OC))
                              : unit_roundoff(dt) + gemm_tol_sum(dt, s->OC);
  if (md->dinp) {
    test_compare(ctx, "dinp", o[1].dinp, o[0].dinp, nin, tol_dinp);
    test_same_bits(ctx, "dinp, two GPU runs", o[1].dinp, o[2].dinp, nin);
  }
  test_compare_increment(
      ctx, "dweight", o[1].dweight, o[0].dweight, in.dweight0, nw,
      md->gelu ? gemm_tol_sum(dt, s->N) + tol_stored(dt) : gemm_tol_sum(dt, s->N));
  test_same_bits(ctx, "dweight, two GPU runs", o[1].dweight, o[2].dweight, nw);
  if (md->dbias && !md->gelu) {
    test_compare_increment(ctx, "dbias", o[1].dbias, o[0].dbias, in.dbias0, s->OC,
                           gemm_tol_f32(s->N));
    test_same_bits(ctx, "dbias, two GPU runs", o[1].dbias, o[2].dbias, s->OC);
  }
  if (md->dbias && md->gelu) {
    // dpre_bias: the column sums of dpre as the GPU stores it, so dpre's own differences (its
    // roundings, of random sign) reach them as they reach dpre; against the GPU's own dpre as
    // read back (summed here in double) only the fp32 summation order differs.
    test_compare_increment(ctx, "dpre_bias", o[1].dbias, o[0].dbias, in.dbias0, nb, tol_dinp);
    float *own = test_copy_floats(in.dbias0, nb);
    column_sums_cpu(own, o[1].dinp, s->N, nb);
    test_compare_increment(ctx, "dpre_bias vs the sums of the GPU's own dpre", o[1].dbias, own,
                           in.dbias0, nb, gemm_tol_f32(s->N));
    test_same_bits(ctx, "dpre_bias, two GPU runs", o[1].dbias, o[2].dbias, nb);
    free(own);
  }
  float *bufs[] = {in.dout, in.inp, in.weight, in.gelu_pre, in.dweight0, in.dbias0};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
  for (int k = 0; k < 3; k++) {
    free(o[k].dinp);
    free(o[k].dweight);
    free(o[k].dbias);
    free(o[k].hidden);
  }
}

// ---- head: mean pool + fp32 linear -------------------------------------------------------------

typedef struct {
  int B, L, C, K;
} HeadShape;

static const HeadShape head_shapes[] = {
    {4, 49, 768, 10},    // Swin-T's last stage, 10 classes
    {4, 49, 768, 1000},  // ImageNet
};

typedef struct {
  float *tokens, *weight, *bias, *dlogits, *dweight0, *dbias0;
} HeadIn;
typedef struct {
  float *logits, *pooled, *dtokens, *dweight, *dbias;
} HeadOut;

static void head_on(Backend *be, const HeadShape *s, const HeadIn *in, HeadOut *o) {
  const int64_t nt = (int64_t)s->B * s->L * s->C, nw = (int64_t)s->K * s->C;
  void *tokens = be_copy_act(be, in->tokens, nt);
  float *weight = be_copy_f32(be, in->weight, nw), *bias = be_copy_f32(be, in->bias, s->K);
  float *logits = be_poisoned_f32(be, (int64_t)s->B * s->K);
  float *pooled = be_poisoned_f32(be, (int64_t)s->B * s->C);
  be->ops->head_forward(be, logits, pooled, tokens, weight, bias, s->B, s->L, s->C, s->K);
  be_read_f32(be, o->logits, logits, (int64_t)s->B * s->K);
  be_read_f32(be, o->pooled, pooled, (int64_t)s->B * s->C);
  // The backward from this backend's pooled, as in the model.
  float *dlogits = be_copy_f32(be, in->dlogits, (int64_t)s->B * s->K);
  float *dweight = be_copy_f32(be, in->dweight0, nw), *dbias = be_copy_f32(be, in->dbias0, s->K);
  void *dtokens = be_poisoned_act(be, nt);
  be->ops->head_backward(be, dtokens, dweight, dbias, dlogits, pooled, weight, s->B, s->L, s->C,
                         s->K);
  be_read_act(be, o->dtokens, dtokens, nt);
  be_read_f32(be, o->dweight, dweight, nw);
  be_read_f32(be, o->dbias, dbias, s->K);
  void *bufs[] = {tokens, weight, bias, logits, pooled, dlogits, dweight, dbias, dtokens};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be_free(be, bufs[i]);
}

static void check_head(BackendPair *p, const HeadShape *s, TestRng *rng) {
  const DType dt = p->gpu.act;
  const int64_t nt = (int64_t)s->B * s->L * s->C, nw = (int64_t)s->K * s->C;
  char ctx[512];
  snprintf(ctx, sizeof ctx, "head_forward/backward [%s] B=%d L=%d C=%d K=%d", p->precision, s->B,
           s->L, s->C, s->K);
  HeadIn in = {.tokens = test_random_act(rng, dt, nt, -1.0f, 1.0f),
               .weight = test_alloc_floats(nw),
               .bias = test_alloc_floats(s->K),
               .dlogits = test_alloc_floats((int64_t)s->B * s->K),
               .dweight0 = test_alloc_floats(nw),
               .dbias0 = test_alloc_floats(s->K)};
  // Pooled values of random tokens are small (~0.6 / sqrt(L)): weights of order 1 keep the
  // logits of order 1.
  test_fill_uniform(rng, in.weight, nw, -1.0f, 1.0f);
  test_fill_uniform(rng, in.bias, s->K, -0.5f, 0.5f);
  test_fill_uniform(rng, in.dlogits, (int64_t)s->B * s->K, -1.0f, 1.0f);
  test_fill_uniform(rng, in.dweight0, nw, -1.0f, 1.0f);
  test_fill_uniform(rng, in.dbias0, s->K, -1.0f, 1.0f);
  HeadOut o[3];  // CPU, GPU, GPU again
  for (int k = 0; k < 3; k++) {
    o[k] = (HeadOut){.logits = test_alloc_floats((int64_t)s->B * s->K),
                     .pooled = test_alloc_floats((int64_t)s->B * s->C),
                     .dtokens = test_alloc_floats(nt),
                     .dweight = test_alloc_floats(nw),
                     .dbias = test_alloc_floats(s->K)};
    head_on(k ? &p->gpu : &p->cpu, s, &in, &o[k]);
  }
  // pooled: both sum the L tokens in double from the same values; logits: an fp32 product over
  // C with fp32 weights in every precision; dtokens: d(pooled) / L rounded once to dt; the
  // parameter gradients are fp32 sums over B rows.
  test_compare(ctx, "pooled", o[1].pooled, o[0].pooled, (int64_t)s->B * s->C, TOL_F32);
  test_compare(ctx, "logits", o[1].logits, o[0].logits, (int64_t)s->B * s->K, gemm_tol_f32(s->C));
  test_compare(ctx, "dtokens", o[1].dtokens, o[0].dtokens, nt,
               unit_roundoff(dt) + gemm_tol_f32(s->K));
  test_compare_increment(ctx, "dweight", o[1].dweight, o[0].dweight, in.dweight0, nw, TOL_F32);
  test_compare_increment(ctx, "dbias", o[1].dbias, o[0].dbias, in.dbias0, s->K, TOL_F32);
  test_same_bits(ctx, "dtokens, two GPU runs", o[1].dtokens, o[2].dtokens, nt);
  test_same_bits(ctx, "dweight, two GPU runs", o[1].dweight, o[2].dweight, nw);
  test_same_bits(ctx, "dbias, two GPU runs", o[1].dbias, o[2].dbias, s->K);
  float *bufs[] = {in.tokens, in.weight, in.bias, in.dlogits, in.dweight0, in.dbias0};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
  for (int k = 0; k < 3; k++) {
    float *ob[] = {o[k].logits, o[k].pooled, o[k].dtokens, o[k].dweight, o[k].dbias};
    for (size_t i = 0; i < sizeof ob / sizeof ob[0]; i++) free(ob[i]);
  }
}

// Negative control (fp32): weights off by 1e-4 relative must show against the 1e-5 tolerance.
static void negative_control(BackendPair *p, const LinearShape *s, TestRng *rng) {
  const int64_t nout = s->N * s->OC, nw = (int64_t)s->OC * s->IC;
  const ForwardMode *md = &forward_modes[1];
  char ctx[512];
  describe(ctx, sizeof ctx, "negative control: linear_forward, GPU weights * (1 + 1e-4)", md->name,
           p->precision, s);
  LinearIn in;
  linear_in_make(&in, rng, p->gpu.act, s);
  float *off = test_copy_floats(in.weight, nw);
  for (int64_t i = 0; i < nw; i++) off[i] *= 1.0f + 1e-4f;
  float *want = test_alloc_floats(nout), *got = test_alloc_floats(nout);
  forward_on(&p->cpu, s, md, in.inp, in.weight, in.bias, want, NULL);
  forward_on(&p->gpu, s, md, in.inp, off, in.bias, got, NULL);
  test_must_differ(ctx, "out", got, want, nout, gemm_tol_f32(s->IC));
  linear_in_free(&in);
  free(off);
  free(want);
  free(got);
}

// Tuning's record: a bf16 product (Swin-T's fc1 over 1568 tokens, 96 -> 384) timed in one context,
// its choice written, read into a second context, which must run it untimed with the same bits.
static int64_t report_count(GemmContext *g, const char *what) {
  char *text = NULL;
  size_t size = 0;
  FILE *f = open_memstream(&text, &size);
  gemm_context_report(g, f);
  fclose(f);
  const char *at = strstr(text, what);  // "N read back" / "N timed"
  long long n = -1;
  for (const char *c = at; at && c > text && c[-1] != ','; c--)
    if (c[-1] == ' ' && sscanf(c, "%lld", &n) == 1) break;
  free(text);
  return n;
}

static void product_on(GemmContext *g, cudaStream_t s, const void *A, const void *W, void *C,
                       uint16_t *out, int64_t n) {
  linear_forward_cuda(g, DTYPE_BF16, C, A, W, NULL, 1568, 96, 384);
  CUDA_CHECK(cudaMemcpyAsync(out, C, sizeof(uint16_t) * (size_t)n, cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
}

static void check_choices_round_trip(TestRng *rng) {
  const char *ctx = "gemm choices written and read back (bf16 1568 x 96 -> 384)";
  const int64_t na = 1568 * 96, nw = 384 * 96, nc = 1568 * 384;
  uint16_t *ha = malloc(sizeof(uint16_t) * (size_t)(na + nw));
  for (int64_t i = 0; i < na + nw; i++) ha[i] = f32_to_bf16(test_rng_uniform(rng, -1.0f, 1.0f));
  void *A, *W, *C;
  CUDA_CHECK(cudaMalloc(&A, sizeof(uint16_t) * (size_t)na));
  CUDA_CHECK(cudaMalloc(&W, sizeof(uint16_t) * (size_t)nw));
  CUDA_CHECK(cudaMalloc(&C, sizeof(uint16_t) * (size_t)nc));
  CUDA_CHECK(cudaMemcpy(A, ha, sizeof(uint16_t) * (size_t)na, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(W, ha + na, sizeof(uint16_t) * (size_t)nw, cudaMemcpyHostToDevice));
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreate(&s));
  uint16_t *first = malloc(sizeof(uint16_t) * (size_t)nc),
           *again = malloc(sizeof(uint16_t) * (size_t)nc);
  GemmContext *g1 = gemm_context_create(s);
  gemm_context_set_tuning(g1, true);
  product_on(g1, s, A, W, C, first, nc);
  test_check(report_count(g1, " timed") == 1, "%s: the first context timed the product", ctx);
  test_check(gemm_context_write_choices(g1, NULL) == 1, "%s: one product timed and not written",
             ctx);
  char *text = NULL;
  size_t size = 0;
  FILE *f = open_memstream(&text, &size);
  test_check(gemm_context_write_choices(g1, f) == 0, "%s: written", ctx);
  fclose(f);
  test_check(gemm_context_write_choices(g1, NULL) == 0, "%s: nothing left to write", ctx);
  GemmContext *g2 = gemm_context_create(s);
  gemm_context_set_tuning(g2, true);
  char why[256] = "";
  int taken = gemm_context_read_choices(g2, text, why, sizeof why);
  test_check(taken == 1, "%s: %d line(s) read (%s)", ctx, taken, why);
  CUDA_CHECK(cudaMemset(C, 0xff, sizeof(uint16_t) * (size_t)nc));  // poison
  product_on(g2, s, A, W, C, again, nc);
  test_check(report_count(g2, " read back") == 1 && report_count(g2, " timed") == 0,
             "%s: the second context ran the product untimed with the algorithm read", ctx);
  test_check(memcmp(first, again, sizeof(uint16_t) * (size_t)nc) == 0,
             "%s: the same bits in both contexts", ctx);
  text[0] = 'X';  // another header: refused with a reason
  GemmContext *g3 = gemm_context_create(s);
  test_check(gemm_context_read_choices(g3, text, why, sizeof why) < 0 && why[0],
             "%s: a foreign header is refused (%s)", ctx, why);
  gemm_context_destroy(g3);
  gemm_context_destroy(g2);
  gemm_context_destroy(g1);
  free(text);
  free(first);
  free(again);
  free(ha);
  cudaFree(A);
  cudaFree(W);
  cudaFree(C);
  cudaStreamDestroy(s);
}

// Scratch: the CPU head needs B*C floats; the CUDA bias gradients up to 1024 rows of partials
// (column_sums_cuda_scratch), and the head's d(pooled) (max_batch * max_width) past them.
static BackendNeeds needs_for_shapes(void) {
  BackendNeeds nd = {.max_elements = 1, .max_rows = 1, .max_width = 1, .max_batch = 1};
  for (size_t i = 0; i < sizeof head_shapes / sizeof head_shapes[0]; i++) {
    const HeadShape *h = &head_shapes[i];
    int w = h->C > h->K ? h->C : h->K;
    if (w > nd.max_width) nd.max_width = w;
    if (h->B > nd.max_batch) nd.max_batch = h->B;
    if ((int64_t)h->B * h->C > nd.max_elements) nd.max_elements = (int64_t)h->B * h->C;
  }
  for (int i = 0; i < NUM_LINEAR; i++) {
    const LinearShape *s = &linear_shapes[i];
    int w = s->IC > s->OC ? s->IC : s->OC;
    if (w > nd.max_width) nd.max_width = w;
    if (s->N > nd.max_rows) nd.max_rows = s->N;
  }
  return nd;
}
#endif

int main(void) {
  GPU_TEST_MAIN_BEGIN();
#ifdef SWIN_HAVE_CUDA
  TestRng rng = {.state = 0x6e33};
  BackendNeeds needs = needs_for_shapes();
  for (int run = 0; run < 2 * GPU_TEST_PRECISIONS; run++) {
    const int pi = run % GPU_TEST_PRECISIONS;
    const bool tune = run >= GPU_TEST_PRECISIONS;
    BackendPair p;
    backend_pair_create(&p, gpu_test_precisions[pi], &needs);
    p.gpu.ops->gemm_tuning(&p.gpu, tune);
    printf("-- %s, GEMM tuning %s\n", gpu_test_precisions[pi], tune ? "on" : "off");
    for (int si = 0; si < NUM_LINEAR; si++) {
      const LinearShape *s = &linear_shapes[si];
      if (s->f32_only && p.gpu.act != DTYPE_F32) continue;
      for (size_t m = 0; m < sizeof forward_modes / sizeof forward_modes[0]; m++)
        check_forward(&p, s, &forward_modes[m], &rng);
      for (size_t m = 0; m < sizeof backward_modes / sizeof backward_modes[0]; m++)
        check_backward(&p, s, &backward_modes[m], &rng);
    }
    for (size_t hi = 0; hi < sizeof head_shapes / sizeof head_shapes[0]; hi++)
      check_head(&p, &head_shapes[hi], &rng);
    if (run == 0) negative_control(&p, &linear_shapes[2], &rng);
    backend_pair_destroy(&p);
  }
  check_choices_round_trip(&rng);
#endif
  return test_finish();
}
