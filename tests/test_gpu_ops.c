// test_gpu_ops.c: every model op of the backend table (src/model/backend.h) on the CUDA backend
// against the CPU backend, in fp32, bf16 and fp16, from one table. A row is one case of one op: a
// function that draws the op's random inputs for a small shape from a seed and runs the op on a
// Backend, and the list of outputs to compare, each with the error it may carry (a tolerance per
// compute type). A new op gets its check by adding a row; the op's own tests/test_gpu_<op>.c goes
// deeper (Swin-T's shapes, every kernel path, repeatability, negative controls).
//
// Each row runs twice from the same seed: on the CPU (fp32, the reference kernels: the spec) and
// on the CUDA backend. Inputs of act tensors are drawn rounded to the CUDA backend's compute type,
// so both backends see the same values; outputs start with every byte 0xFF (NaN in f32, bf16 and
// f16: an element the op forgets fails), except those the op accumulates into, which start from
// random values and whose increments are compared. A value that is not finite on either side
// fails. One line per row and precision: PASS or FAIL, the largest normwise relative error
// ||cuda - cpu|| / ||cpu|| over the row's outputs, and each output's error against its tolerance.
#include "tests/util/test_gpu_util.h"

#ifdef SWIN_HAVE_CUDA
#include "data/batch_augment.h"
#include "kernels/attention.h"
#include "kernels/cosine_attention.h"
#include "kernels/layernorm.h"
#include "kernels/patch.h"
#include "kernels/window.h"

// ---- what an output may differ by ---------------------------------------------------------------
// Normwise: a value stored in the compute type dt is its fp32 value rounded, |round(y) - y| <= u
// |y| element by element with u = 2^-8 (bf16), 2^-11 (fp16), 2^-24 (fp32), so one rounding moves
// a tensor by at most u of its norm, whatever its values: the tolerances below are a few u, plus
// TOL_F32 for the fp32 arithmetic both backends do in different orders (tests/util/test_gpu_util.h
// gives the measurements behind tol_stored and tol_chained).
typedef enum {
  EXACT,          // bitwise equal: counter-based draws, integer counts, copies, and the same IEEE
                  // operations in the same order on both backends
  EXACT_ROUNDED,  // an act output of exact arithmetic: bitwise the CPU's value rounded to dt
  FP32,           // fp32 (or double) arithmetic on both sides from the same values: TOL_F32
  ROUNDED,        // that, then stored once in dt: u + TOL_F32
  ROUNDED_TWICE,  // two roundings to dt, or one the op amplifies (a LayerNorm of a rounded sum
                  // scales it by |x| / std; GELU of a rounded pre-activation): 2.6 u (bf16), 6 u
                  // (fp16)
  TC,             // an f32 result of products on tensor cores (the bf16 / fp16 GEMMs)
  TC_ROUNDED,     // that, stored in dt or computed from an operand the GPU rounded: + u
  TC_ROUNDED_TWICE,  // the larger of TC_ROUNDED and ROUNDED_TWICE
  ADAMW,             // the increment of an AdamW update
} ErrorModel;

// The tensor cores' fp32 accumulation is not IEEE (addends aligned to the largest exponent and
// truncated, Fasi et al. 2021): 1e-3 on top of the fp32 differences, as tests/test_gpu_gemm.c
// allows and measures; 4x below one bf16 rounding, and the products here are short (K <= 128),
// where fp32 GEMMs stay within TOL_F32.
#define TENSOR_CORE_SUM 1e-3
// AdamW's update is ~lr per element; the GPU fuses p * decay - update into one fma where the CPU
// rounds twice, so an element may differ by an ulp of |p| (1.2e-7 at |p| ~ 1) against an update
// of ~1e-3: 1e-4 per element at worst; a lost bias correction, decay or clip is 1e-2 or more
// (tests/test_gpu_optim.c's TOL_UPDATE).
#define TOL_ADAMW 1e-3

static double tolerance(ErrorModel e, DType dt) {
  const double tc = TOL_F32 + (dt == DTYPE_F32 ? 0.0 : TENSOR_CORE_SUM);
  switch (e) {
    case EXACT:
    case EXACT_ROUNDED:
      return 0.0;
    case FP32:
      return TOL_F32;
    case ROUNDED:
      return tol_stored(dt);
    case ROUNDED_TWICE:
      return tol_chained(dt);
    case TC:
      return tc;
    case TC_ROUNDED:
      return unit_roundoff(dt) + tc;
    case TC_ROUNDED_TWICE:
      return fmax(tol_chained(dt), unit_roundoff(dt) + tc);
    case ADAMW:
      return TOL_ADAMW;
  }
  return 0.0;
}

static bool is_exact(ErrorModel e) {
  return e == EXACT || e == EXACT_ROUNDED;
}

// ---- one run of a row on one backend ------------------------------------------------------------

enum { MAX_OUTPUTS = 8, MAX_BUFFERS = 24 };

// An output as a run read it back, as host floats.
typedef struct {
  const char *name;
  int64_t n;
  float *values;  // (n)
  float *init;    // (n) its values before the op, when the op accumulates into it; else NULL
  // Why the run has no values for it, though the row lists it (a tensor the CUDA backend never
  // stores); else NULL.
  const char *absent;
} Output;

typedef struct {
  Backend *be;
  DType dt;     // the CUDA backend's compute type: the values act inputs take on both backends
  TestRng rng;  // the row's draws: the same sequence on both backends
  Output out[MAX_OUTPUTS];
  int num_out;
  void *dev[MAX_BUFFERS];  // backend memory, released after the run
  int num_dev;
  void *host[MAX_BUFFERS];  // host inputs, freed after the run
  int num_host;
} OpRun;

// The test cannot set itself up: exit 2, as test_write_file does.
static void setup_failed(const char *what) {
  printf("FAIL test setup: %s\n", what);
  exit(2);
}

static void *keep_dev(OpRun *r, void *dev) {
  if (r->num_dev == MAX_BUFFERS) setup_failed("a row allocates more than MAX_BUFFERS buffers");
  r->dev[r->num_dev++] = dev;
  return dev;
}
static void *keep_host(OpRun *r, void *host) {
  if (r->num_host == MAX_BUFFERS) setup_failed("a row draws more than MAX_BUFFERS inputs");
  r->host[r->num_host++] = host;
  return host;
}

// Host inputs: f32 tensors as drawn, act tensors rounded to dt.
static float *draw_f32(OpRun *r, int64_t n, float lo, float hi) {
  float *x = keep_host(r, test_alloc_floats(n));
  test_fill_uniform(&r->rng, x, n, lo, hi);
  return x;
}
static float *draw_act(OpRun *r, int64_t n, float lo, float hi) {
  float *x = draw_f32(r, n, lo, hi);
  test_round_all(r->dt, x, n);
  return x;
}
// rows x C act values, each row around its own offset in [-1, 1), so that a LayerNorm's mean
// subtraction matters.
static float *draw_rows(OpRun *r, int64_t rows, int C) {
  float *x = keep_host(r, test_alloc_floats(rows * C));
  for (int64_t i = 0; i < rows; i++) {
    float offset = test_rng_uniform(&r->rng, -1.0f, 1.0f);
    test_fill_uniform(&r->rng, x + i * C, C, offset - 1.0f, offset + 1.0f);
  }
  test_round_all(r->dt, x, rows * C);
  return x;
}
static int *draw_labels(OpRun *r, int B, int K) {
  int *labels = keep_host(r, malloc_check(sizeof(int) * (size_t)B));
  for (int b = 0; b < B; b++) labels[b] = (int)(test_rng_u64(&r->rng) % (uint64_t)K);
  return labels;
}
static uint8_t *draw_pixels(OpRun *r, int64_t n) {
  uint8_t *px = keep_host(r, malloc_check((size_t)n));
  for (int64_t i = 0; i < n; i++) px[i] = (uint8_t)(test_rng_u64(&r->rng) >> 56);
  return px;
}

// Backend copies of host inputs.
static void *dev_act(OpRun *r, const float *host, int64_t n) {
  return keep_dev(r, be_copy_act(r->be, host, n));
}
static float *dev_f32(OpRun *r, const float *host, int64_t n) {
  return keep_dev(r, be_copy_f32(r->be, host, n));
}
static void *dev_bytes(OpRun *r, const void *host, size_t bytes) {
  return keep_dev(r, be_copy_bytes(r->be, host, bytes));
}
// Outputs the op overwrites: poisoned.
static void *dev_poisoned_act(OpRun *r, int64_t n) {
  return keep_dev(r, be_poisoned_act(r->be, n));
}
static float *dev_poisoned_f32(OpRun *r, int64_t n) {
  return keep_dev(r, be_poisoned_f32(r->be, n));
}

// Room for output `name` (n values); init (n), when given, is copied as its starting values.
static float *result_slot(OpRun *r, const char *name, int64_t n, const float *init) {
  if (r->num_out == MAX_OUTPUTS) setup_failed("a row reads back more than MAX_OUTPUTS outputs");
  Output *o = &r->out[r->num_out++];
  *o = (Output){.name = name, .n = n, .values = test_alloc_floats(n)};
  if (init) o->init = test_copy_floats(init, n);
  return o->values;
}
static void result_act(OpRun *r, const char *name, const void *dev, int64_t n) {
  be_read_act(r->be, result_slot(r, name, n, NULL), dev, n);
}
static void result_f32(OpRun *r, const char *name, const float *dev, int64_t n) {
  be_read_f32(r->be, result_slot(r, name, n, NULL), dev, n);
}
// An output the op does not write on this backend, for the reason given.
static void result_absent(OpRun *r, const char *name, const char *why) {
  if (r->num_out == MAX_OUTPUTS) setup_failed("a row reads back more than MAX_OUTPUTS outputs");
  r->out[r->num_out++] = (Output){.name = name, .absent = why};
}
// An output the op accumulated onto init (n, host).
static void result_increment(OpRun *r, const char *name, const float *dev, const float *init,
                             int64_t n) {
  be_read_f32(r->be, result_slot(r, name, n, init), dev, n);
}
// Host values the run derived (counts, fields of a state struct it downloaded).
static void result_values(OpRun *r, const char *name, const double *values, int64_t n) {
  float *v = result_slot(r, name, n, NULL);
  for (int64_t i = 0; i < n; i++) v[i] = (float)values[i];
}
static void result_scalar_increment(OpRun *r, const char *name, double after, double before) {
  float b = (float)before, *v = result_slot(r, name, 1, &b);
  v[0] = (float)after;
}

static void run_release(OpRun *r) {
  for (int i = 0; i < r->num_dev; i++) be_free(r->be, r->dev[i]);
  for (int i = 0; i < r->num_host; i++) free(r->host[i]);
  r->num_dev = r->num_host = 0;
}
static void outputs_free(OpRun *r) {
  for (int i = 0; i < r->num_out; i++) {
    free(r->out[i].values);
    free(r->out[i].init);
  }
  r->num_out = 0;
}

// ---- the ops' cases -----------------------------------------------------------------------------
// Each run function draws its inputs from r->rng (draws that depend on the case only, never on
// the backend), runs the op on r->be and reads its outputs back under the names its rows list.

static const Normalize input_norm = {{0.485f, 0.456f, 0.406f, 0.5f},
                                     {0.229f, 0.224f, 0.225f, 0.25f}};

// Drop-path scales (B): even samples kept (1 / keep, keep 0.8), odd ones dropped (0).
static float *drop_scales(OpRun *r, int B) {
  float *s = keep_host(r, test_alloc_floats(B));
  for (int b = 0; b < B; b++) s[b] = b % 2 ? 0.0f : 1.0f / 0.8f;
  return s;
}

// mean and rstd (rows) of x (rows, C) as a LayerNorm forward saves them: in double, rounded once.
static void layernorm_stats(const float *x, int64_t rows, int C, float *mean, float *rstd) {
  for (int64_t i = 0; i < rows; i++) {
    const float *row = x + i * C;
    double m = 0, var = 0;
    for (int c = 0; c < C; c++) m += row[c];
    m /= C;
    for (int c = 0; c < C; c++) var += (row[c] - m) * (row[c] - m);
    mean[i] = (float)m;
    rstd[i] = (float)(1.0 / sqrt(var / C + LAYERNORM_EPS));
  }
}

static void run_to_compute(OpRun *r, const void *arg) {
  const int64_t n = *(const int64_t *)arg;
  float *src = dev_f32(r, draw_f32(r, n, -3.0f, 3.0f), n);  // (n)
  void *dst = dev_poisoned_act(r, n);                       // (n, act)
  r->be->ops->to_compute(r->be, dst, src, n);
  result_act(r, "dst", dst, n);
}

typedef struct {
  int B, H, W, Cin, p;  // p: the patch side (patch_embed_input)
  DType input;          // U8 pixels or F32 normalized images
} ImageCase;

static void run_patch_embed_input(OpRun *r, const void *arg) {
  const ImageCase *c = arg;
  const int64_t n_in = (int64_t)c->B * c->H * c->W * c->Cin;
  const int64_t n = (int64_t)c->B * (c->H / c->p) * (c->W / c->p) * c->Cin * c->p * c->p;
  const void *input = c->input == DTYPE_U8 ? dev_bytes(r, draw_pixels(r, n_in), (size_t)n_in)
                                           : dev_f32(r, draw_f32(r, n_in, -2.0f, 2.0f), n_in);
  void *patches = dev_poisoned_act(r, n);  // (B, H/p, W/p, Cin*p*p, act)
  r->be->ops->patch_embed_input(r->be, patches, input, c->input, input_norm, c->B, c->H, c->W,
                                c->Cin, c->p);
  result_act(r, "patches", patches, n);
}

static void run_images_normalize(OpRun *r, const void *arg) {
  const ImageCase *c = arg;
  const int64_t n = (int64_t)c->B * c->H * c->W * c->Cin;
  const uint8_t *pixels = dev_bytes(r, draw_pixels(r, n), (size_t)n);  // (B, H, W, Cin)
  float *images = dev_poisoned_f32(r, n);                              // (B, H, W, Cin)
  r->be->ops->images_normalize(r->be, images, pixels, input_norm, c->B, c->H, c->W, c->Cin);
  result_f32(r, "images", images, n);
}

typedef struct {
  int units, B;
  int64_t first_sample, step;
} DropPathCase;

static void run_drop_path_scales(OpRun *r, const void *arg) {
  const DropPathCase *c = arg;
  const int64_t n = (int64_t)c->units * c->B;
  const uint64_t seed = test_rng_u64(&r->rng);
  float *rates = dev_f32(r, draw_f32(r, (c->units + 1) / 2, 0.1f, 0.5f), (c->units + 1) / 2);
  const StepParams values = {.step = c->step, .first_sample = c->first_sample, .lr = 1e-3f};
  StepParams *step = keep_dev(r, be_copy_bytes(r->be, &values, sizeof values));
  float *scales = dev_poisoned_f32(r, n);  // (units, B)
  r->be->ops->drop_path_scales(r->be, scales, rates, c->units, c->B, seed, step);
  result_f32(r, "scales", scales, n);
}

typedef struct {
  int B, H, W, C;
  bool cutmix;  // else mixup
} AugmentCase;

// Random erasing (half the samples) and mixup or cutmix, drawn by batch_augment_draw as the
// trainer draws them.
static void run_batch_augment(OpRun *r, const void *arg) {
  const AugmentCase *c = arg;
  const int64_t n = (int64_t)c->B * c->H * c->W * c->C;
  enum { K = 10 };
  BatchAugmentOptions o = {.seed = test_rng_u64(&r->rng),
                           .reprob = 0.5f,
                           .mixup_alpha = 0.8f,
                           .cutmix_alpha = 1.0f,
                           .mix_prob = 1.0f,
                           .switch_prob = c->cutmix ? 1.0f : 0.0f,
                           .smoothing = 0.1f,
                           .num_classes = K};
  int64_t *samples = keep_host(r, malloc_check(sizeof(int64_t) * (size_t)c->B));
  for (int b = 0; b < c->B; b++) samples[b] = 100 + 7 * b;
  Batch batch = {
      .labels = draw_labels(r, c->B, K), .samples = samples, .count = c->B, .epoch = 2, .index = 3};
  EraseBox *boxes = keep_host(r, calloc_check((size_t)c->B, sizeof(EraseBox)));
  BatchAugment aug;
  Error err;
  if (batch_augment_draw(&o, &batch, 0, 1, c->H, c->W, boxes, &aug, NULL, &err) != 0)
    setup_failed(err.msg);
  float *images = dev_f32(r, draw_f32(r, n, -2.5f, 2.5f), n);  // (B, H, W, C), in place
  EraseBox *dev_boxes = keep_dev(r, r->be->ops->alloc(r->be, sizeof(EraseBox) * (size_t)c->B));
  r->be->ops->batch_augment(r->be, images, &aug, dev_boxes, c->B, c->H, c->W, c->C);
  result_f32(r, "images", images, n);
}

typedef struct {
  int64_t N;
  int IC, OC;
  bool bias, gelu;   // forward: a bias; GELU with the pre-activation kept
  bool dinp, dbias;  // backward: dinp written (else NULL), mlp_forward: out written (else NULL);
                     // dbias (gelu_linear_backward: dpre_bias)
} LinearCase;

static void run_linear_forward(OpRun *r, const void *arg) {
  const LinearCase *c = arg;
  const int64_t nin = c->N * c->IC, nout = c->N * c->OC, nw = (int64_t)c->OC * c->IC;
  const float ws = 1.0f / sqrtf((float)c->IC);                 // outputs of order 1
  void *inp = dev_act(r, draw_act(r, nin, -1.0f, 1.0f), nin);  // (N, IC, act)
  void *weight = dev_act(r, draw_act(r, nw, -ws, ws), nw);     // (OC, IC, act)
  void *bias = c->bias ? dev_act(r, draw_act(r, c->OC, -0.5f, 0.5f), c->OC) : NULL;  // (OC, act)
  void *out = dev_poisoned_act(r, nout);                                             // (N, OC, act)
  void *pre = c->gelu ? dev_poisoned_act(r, nout) : NULL;                            // (N, OC, act)
  r->be->ops->linear_forward(r->be, out, inp, weight, bias, c->N, c->IC, c->OC,
                             c->gelu ? ACTIVATION_GELU : ACTIVATION_NONE, pre);
  result_act(r, "out", out, nout);
  if (pre) result_act(r, "pre", pre, nout);
}

// An MLP: IC is C, OC the hidden width H; with c->dinp unset, out NULL (the pre-activation
// alone, as a block's rebuild asks).
static void run_mlp_forward(OpRun *r, const void *arg) {
  const LinearCase *c = arg;
  const int C = c->IC, H = c->OC;
  const int64_t nin = c->N * C, nh = c->N * H, nw = (int64_t)H * C;
  void *inp = dev_act(r, draw_act(r, nin, -1.0f, 1.0f), nin);  // (N, C, act)
  // fc1's pre-activations of spread ~1.7 (GELU on both sides of 0), fc2's outputs of order 1.
  const float ws1 = 3.0f / sqrtf((float)C), ws2 = 1.0f / sqrtf((float)H);
  void *w1 = dev_act(r, draw_act(r, nw, -ws1, ws1), nw);  // (H, C, act)
  void *b1 = dev_act(r, draw_act(r, H, -0.5f, 0.5f), H);  // (H, act)
  void *w2 = dev_act(r, draw_act(r, nw, -ws2, ws2), nw);  // (C, H, act)
  void *b2 = dev_act(r, draw_act(r, C, -0.5f, 0.5f), C);  // (C, act)
  void *pre = dev_poisoned_act(r, nh);                    // (N, H, act)
  void *out = c->dinp ? dev_poisoned_act(r, nin) : NULL;  // (N, C, act)
  // Room for GELU(pre) only where the backend stores it: NULL, as the model passes, elsewhere.
  bool stored = r->be->ops->mlp_hidden_elements(r->be, c->N, C, H) > 0;
  void *hidden = stored ? dev_poisoned_act(r, nh) : NULL;  // (N, H, act)
  r->be->ops->mlp_forward(r->be, out, pre, hidden, inp, w1, b1, w2, b2, c->N, C, H);
  result_act(r, "pre", pre, nh);
  if (out) result_act(r, "out", out, nin);
}

static void run_linear_backward(OpRun *r, const void *arg) {
  const LinearCase *c = arg;
  const int64_t nin = c->N * c->IC, nout = c->N * c->OC, nw = (int64_t)c->OC * c->IC;
  const float ws = 1.0f / sqrtf((float)c->OC);
  void *dout = dev_act(r, draw_act(r, nout, -1.0f, 1.0f), nout);  // (N, OC, act)
  void *inp = dev_act(r, draw_act(r, nin, -1.0f, 1.0f), nin);     // (N, IC, act)
  void *weight = dev_act(r, draw_act(r, nw, -ws, ws), nw);        // (OC, IC, act)
  const float *dweight0 = draw_f32(r, nw, -1.0f, 1.0f);
  const float *dbias0 = c->dbias ? draw_f32(r, c->OC, -1.0f, 1.0f) : NULL;
  float *dweight = dev_f32(r, dweight0, nw);                   // (OC, IC), +=
  float *dbias = c->dbias ? dev_f32(r, dbias0, c->OC) : NULL;  // (OC), +=
  void *dinp = c->dinp ? dev_poisoned_act(r, nin) : NULL;      // (N, IC, act)
  r->be->ops->linear_backward(r->be, dinp, dweight, dbias, dout, inp, weight, c->N, c->IC, c->OC);
  if (dinp) result_act(r, "dinp", dinp, nin);
  result_increment(r, "dweight", dweight, dweight0, nw);
  if (dbias) result_increment(r, "dbias", dbias, dbias0, c->OC);
}

// An MLP's fc2 backward: IC is the hidden width, pre fc1's output. hidden is given and compared
// only where the backend stores it (mlp_hidden_elements of the MLP: C = OC, H = IC), as the
// model passes it.
static void run_gelu_linear_backward(OpRun *r, const void *arg) {
  const LinearCase *c = arg;
  const int64_t nin = c->N * c->IC, nout = c->N * c->OC, nw = (int64_t)c->OC * c->IC;
  const float ws = 1.0f / sqrtf((float)c->OC);
  void *dout = dev_act(r, draw_act(r, nout, -1.0f, 1.0f), nout);  // (N, OC, act)
  // GELU' varies most over [-3, 3] (0 far left, 1 far right).
  void *pre = dev_act(r, draw_act(r, nin, -3.0f, 3.0f), nin);  // (N, IC, act)
  void *weight = dev_act(r, draw_act(r, nw, -ws, ws), nw);     // (OC, IC, act)
  const float *dweight0 = draw_f32(r, nw, -1.0f, 1.0f);
  const float *dbias0 = c->dbias ? draw_f32(r, c->IC, -1.0f, 1.0f) : NULL;
  float *dweight = dev_f32(r, dweight0, nw);                       // (OC, IC), +=
  float *dpre_bias = c->dbias ? dev_f32(r, dbias0, c->IC) : NULL;  // (IC), +=
  void *dpre = dev_poisoned_act(r, nin);                           // (N, IC, act)
  bool stored = r->be->ops->mlp_hidden_elements(r->be, c->N, c->OC, c->IC) > 0;
  void *hidden = stored ? dev_poisoned_act(r, nin) : NULL;  // (N, IC, act)
  r->be->ops->gelu_linear_backward(r->be, dpre, hidden, dweight, dpre_bias, dout, pre, weight, c->N,
                                   c->IC, c->OC);
  if (stored)
    result_act(r, "hidden", hidden, nin);
  else
    result_absent(r, "hidden", "not stored by this backend (mlp_hidden_elements 0)");
  result_act(r, "dpre", dpre, nin);
  result_increment(r, "dweight", dweight, dweight0, nw);
  if (dpre_bias) result_increment(r, "dpre_bias", dpre_bias, dbias0, c->IC);
}

// Which window order a tensor of the fused LayerNorm ops is in: token order (no map), the
// unshifted windows or the shifted ones.
typedef enum { MAP_NONE, MAP_PLAIN, MAP_SHIFTED } MapKind;
typedef enum { DRES_NONE, DRES_ALIAS, DRES_SEPARATE } DresOut;

typedef struct {
  int B, H, W, C, window, shift;  // square windows and shift, as Swin's
  // forward: x_out = x_in + scale * branch[bmap], ln_out[lmap] = LN(x_out), x_out in place or not
  bool branch, scale, ln, in_place;
  // backward: dres_in given, dres_out, the LayerNorm term, dbranch's column sums
  bool dres_in;
  DresOut dres_out;
  bool dln, dbranch_bias;
  MapKind bmap, lmap;
} LnCase;

static WindowMap ln_map(const LnCase *c, MapKind k) {
  int shift = k == MAP_SHIFTED ? c->shift : 0;
  return (WindowMap){c->H, c->W, c->window, c->window, shift, shift};
}

static void run_residual_layernorm_forward(OpRun *r, const void *arg) {
  const LnCase *c = arg;
  const int64_t L = (int64_t)c->H * c->W, rows = c->B * L, n = rows * c->C;
  void *x_in = dev_act(r, draw_rows(r, rows, c->C), n);                          // (B, L, C, act)
  void *branch = c->branch ? dev_act(r, draw_act(r, n, -1.0f, 1.0f), n) : NULL;  // (B*L, C, act)
  float *scale = c->scale ? dev_f32(r, drop_scales(r, c->B), c->B) : NULL;       // (B)
  float *weight = dev_f32(r, draw_f32(r, c->C, 0.5f, 1.5f), c->C);
  float *bias = dev_f32(r, draw_f32(r, c->C, -0.5f, 0.5f), c->C);
  void *x_out = c->in_place ? x_in : c->branch ? dev_poisoned_act(r, n) : NULL;  // (B, L, C, act)
  void *ln_out = c->ln ? dev_poisoned_act(r, n) : NULL;                          // (B*L, C, act)
  float *mean = dev_poisoned_f32(r, rows), *rstd = dev_poisoned_f32(r, rows);    // (B*L)
  WindowMap bm = ln_map(c, c->bmap), lm = ln_map(c, c->lmap);
  r->be->ops->residual_layernorm_forward(r->be, x_out, ln_out, mean, rstd, x_in, branch,
                                         c->bmap == MAP_NONE ? NULL : &bm, scale, weight, bias,
                                         c->lmap == MAP_NONE ? NULL : &lm, c->B, L, c->C);
  if (x_out) result_act(r, "x_out", x_out, n);
  if (ln_out) {
    result_act(r, "ln_out", ln_out, n);
    result_f32(r, "mean", mean, rows);
    result_f32(r, "rstd", rstd, rows);
  }
}

// A block's proj + LN2: the layer (C -> C) from inputs in bmap's window order, its output the
// residual's branch, LN2 in token order. branch is the op's scratch (not compared: a backend that
// fuses the two leaves it untouched).
static void run_linear_residual_layernorm_forward(OpRun *r, const void *arg) {
  const LnCase *c = arg;
  const int64_t L = (int64_t)c->H * c->W, rows = c->B * L, n = rows * c->C;
  const int64_t nw = (int64_t)c->C * c->C;
  const float ws = 1.0f / sqrtf((float)c->C);
  void *x_in = dev_act(r, draw_rows(r, rows, c->C), n);                     // (B, L, C, act)
  void *inp = dev_act(r, draw_act(r, n, -1.0f, 1.0f), n);                   // (B*L, C, act)
  void *weight = dev_act(r, draw_act(r, nw, -ws, ws), nw);                  // (C, C, act)
  void *lin_bias = dev_act(r, draw_act(r, c->C, -0.5f, 0.5f), c->C);        // (C, act)
  float *scale = c->scale ? dev_f32(r, drop_scales(r, c->B), c->B) : NULL;  // (B)
  float *ln_weight = dev_f32(r, draw_f32(r, c->C, 0.5f, 1.5f), c->C);
  float *ln_bias = dev_f32(r, draw_f32(r, c->C, -0.5f, 0.5f), c->C);
  void *branch = dev_poisoned_act(r, n);                                       // scratch
  void *x_out = dev_poisoned_act(r, n), *ln_out = dev_poisoned_act(r, n);      // (B, L, C, act)
  float *mean = dev_poisoned_f32(r, rows), *rstd = dev_poisoned_f32(r, rows);  // (B*L)
  WindowMap bm = ln_map(c, c->bmap);
  r->be->ops->linear_residual_layernorm_forward(r->be, x_out, ln_out, mean, rstd, branch, x_in, inp,
                                                weight, lin_bias, c->bmap == MAP_NONE ? NULL : &bm,
                                                scale, ln_weight, ln_bias, c->B, L, c->C, c->C);
  result_act(r, "x_out", x_out, n);
  result_act(r, "ln_out", ln_out, n);
  result_f32(r, "mean", mean, rows);
  result_f32(r, "rstd", rstd, rows);
}

// A block's MLP and the residual after it: the MLP (C -> 4C -> C) on LN2's output, its output
// the residual's branch, with LN1 into lmap's windows (c->ln) or the residual alone (a stage's
// end). The MLP's output is scaled to ~0.3 (w2 0.5 / sqrt(H)), a branch smaller than the stream.
// pre is compared; hidden and branch are the op's (not compared).
static void run_mlp_residual_layernorm_forward(OpRun *r, const void *arg) {
  const LnCase *c = arg;
  const int C = c->C, H = 4 * c->C;
  const int64_t L = (int64_t)c->H * c->W, rows = c->B * L, n = rows * C, nh = rows * H;
  const int64_t nw = (int64_t)H * C;
  const float ws1 = 3.0f / sqrtf((float)C), ws2 = 0.5f / sqrtf((float)H);
  void *x_in = dev_act(r, draw_rows(r, rows, C), n);       // (B, L, C, act)
  void *inp = dev_act(r, draw_act(r, n, -1.0f, 1.0f), n);  // (B*L, C, act): LN2's output
  void *w1 = dev_act(r, draw_act(r, nw, -ws1, ws1), nw);   // (H, C, act)
  void *b1 = dev_act(r, draw_act(r, H, -0.5f, 0.5f), H);   // (H, act)
  void *w2 = dev_act(r, draw_act(r, nw, -ws2, ws2), nw);   // (C, H, act)
  void *b2 = dev_act(r, draw_act(r, C, -0.1f, 0.1f), C);   // (C, act)
  float *scale = c->scale ? dev_f32(r, drop_scales(r, c->B), c->B) : NULL;  // (B)
  float *ln_weight = dev_f32(r, draw_f32(r, C, 0.5f, 1.5f), C);
  float *ln_bias = dev_f32(r, draw_f32(r, C, -0.5f, 0.5f), C);
  bool stored = r->be->ops->mlp_hidden_elements(r->be, rows, C, H) > 0;
  void *hidden = stored ? dev_poisoned_act(r, nh) : NULL;  // (B*L, H, act)
  void *pre = dev_poisoned_act(r, nh);                     // (B*L, H, act)
  void *branch = dev_poisoned_act(r, n);                   // scratch
  void *x_out = dev_poisoned_act(r, n);                    // (B, L, C, act)
  void *ln_out = c->ln ? dev_poisoned_act(r, n) : NULL;    // (B*L, C, act) in lmap's order
  float *mean = dev_poisoned_f32(r, rows), *rstd = dev_poisoned_f32(r, rows);  // (B*L)
  WindowMap lm = ln_map(c, c->lmap);
  r->be->ops->mlp_residual_layernorm_forward(r->be, x_out, ln_out, mean, rstd, branch, pre, hidden,
                                             x_in, inp, w1, b1, w2, b2, scale, ln_weight, ln_bias,
                                             c->lmap == MAP_NONE ? NULL : &lm, c->B, L, C, H);
  result_act(r, "pre", pre, nh);
  result_act(r, "x_out", x_out, n);
  if (ln_out) {
    result_act(r, "ln_out", ln_out, n);
    result_f32(r, "mean", mean, rows);
    result_f32(r, "rstd", rstd, rows);
  }
}

static void run_residual_layernorm_backward(OpRun *r, const void *arg) {
  const LnCase *c = arg;
  const int64_t L = (int64_t)c->H * c->W, rows = c->B * L, n = rows * c->C;
  float *dres_in = c->dres_in ? dev_f32(r, draw_f32(r, n, -1.0f, 1.0f), n) : NULL;  // (B, L, C)
  float *dres_out = c->dres_out == DRES_ALIAS      ? dres_in
                    : c->dres_out == DRES_SEPARATE ? dev_poisoned_f32(r, n)
                                                   : NULL;  // (B, L, C)
  void *dbranch = dev_poisoned_act(r, n);                   // (B*L, C, act) in bmap's order
  void *dln = NULL, *x = NULL;
  float *weight = NULL, *mean = NULL, *rstd = NULL, *dweight = NULL, *dbias = NULL;
  const float *dweight0 = NULL, *dbias0 = NULL;
  if (c->dln) {
    dln = dev_act(r, draw_act(r, n, -1.0f, 1.0f), n);  // (B*L, C, act) in lmap's order
    const float *x_h = draw_rows(r, rows, c->C);       // the forward's x_out (B, L, C)
    x = dev_act(r, x_h, n);
    weight = dev_f32(r, draw_f32(r, c->C, 0.5f, 1.5f), c->C);
    float *mean_h = keep_host(r, test_alloc_floats(rows));
    float *rstd_h = keep_host(r, test_alloc_floats(rows));
    layernorm_stats(x_h, rows, c->C, mean_h, rstd_h);
    mean = dev_f32(r, mean_h, rows);
    rstd = dev_f32(r, rstd_h, rows);
    dweight0 = draw_f32(r, c->C, -1.0f, 1.0f);
    dbias0 = draw_f32(r, c->C, -1.0f, 1.0f);
    dweight = dev_f32(r, dweight0, c->C);  // (C), +=
    dbias = dev_f32(r, dbias0, c->C);      // (C), +=
  }
  float *scale = c->scale ? dev_f32(r, drop_scales(r, c->B), c->B) : NULL;
  const float *dbranch_bias0 = c->dbranch_bias ? draw_f32(r, c->C, -1.0f, 1.0f) : NULL;
  float *dbranch_bias = c->dbranch_bias ? dev_f32(r, dbranch_bias0, c->C) : NULL;  // (C), +=
  WindowMap bm = ln_map(c, c->bmap), lm = ln_map(c, c->lmap);
  r->be->ops->residual_layernorm_backward(
      r->be, dres_out, dbranch, dbranch_bias, dweight, dbias, dres_in, dln, x, weight, mean, rstd,
      c->bmap == MAP_NONE ? NULL : &bm, scale, c->lmap == MAP_NONE ? NULL : &lm, c->B, L, c->C);
  if (dres_out) result_f32(r, "dres_out", dres_out, n);
  result_act(r, "dbranch", dbranch, n);
  if (c->dln) {
    result_increment(r, "dweight", dweight, dweight0, c->C);
    result_increment(r, "dbias", dbias, dbias0, c->C);
  }
  if (dbranch_bias) result_increment(r, "dbranch_bias", dbranch_bias, dbranch_bias0, c->C);
}

typedef struct {
  int B, H, W, C;  // the map before the merge
} MergeCase;

static void run_merge_layernorm_forward(OpRun *r, const void *arg) {
  const MergeCase *c = arg;
  const int64_t n = (int64_t)c->B * c->H * c->W * c->C, rows = n / (4 * c->C);
  const int C4 = 4 * c->C;
  void *tokens = dev_act(r, draw_rows(r, n / c->C, c->C), n);  // (B, H, W, C, act)
  float *weight = dev_f32(r, draw_f32(r, C4, 0.5f, 1.5f), C4);
  float *bias = dev_f32(r, draw_f32(r, C4, -0.5f, 0.5f), C4);
  void *out = dev_poisoned_act(r, n);                                          // (B, H/2, W/2, 4C)
  float *mean = dev_poisoned_f32(r, rows), *rstd = dev_poisoned_f32(r, rows);  // (B*H/2*W/2)
  r->be->ops->merge_layernorm_forward(r->be, out, mean, rstd, tokens, weight, bias, c->B, c->H,
                                      c->W, c->C);
  result_act(r, "out", out, n);
  result_f32(r, "mean", mean, rows);
  result_f32(r, "rstd", rstd, rows);
}

static void run_merge_layernorm_backward(OpRun *r, const void *arg) {
  const MergeCase *c = arg;
  const int64_t n = (int64_t)c->B * c->H * c->W * c->C, rows = n / (4 * c->C);
  const int C4 = 4 * c->C;
  void *dout = dev_act(r, draw_act(r, n, -1.0f, 1.0f), n);  // (B, H/2, W/2, 4C, act)
  const float *tokens_h = draw_rows(r, n / c->C, c->C);     // (B, H, W, C)
  void *tokens = dev_act(r, tokens_h, n);
  float *weight = dev_f32(r, draw_f32(r, C4, 0.5f, 1.5f), C4);
  // The statistics of the merged rows, as the forward saves them.
  float *merged = keep_host(r, test_alloc_floats(n));
  float *mean_h = keep_host(r, test_alloc_floats(rows)),
        *rstd_h = keep_host(r, test_alloc_floats(rows));
  patch_merge_forward_cpu(merged, tokens_h, c->B, c->H, c->W, c->C);
  layernorm_stats(merged, rows, C4, mean_h, rstd_h);
  float *mean = dev_f32(r, mean_h, rows), *rstd = dev_f32(r, rstd_h, rows);
  const float *dweight0 = draw_f32(r, C4, -1.0f, 1.0f), *dbias0 = draw_f32(r, C4, -1.0f, 1.0f);
  float *dweight = dev_f32(r, dweight0, C4), *dbias = dev_f32(r, dbias0, C4);  // (4C), +=
  float *dtokens = dev_poisoned_f32(r, n);                                     // (B, H, W, C)
  r->be->ops->merge_layernorm_backward(r->be, dtokens, dweight, dbias, dout, tokens, weight, mean,
                                       rstd, c->B, c->H, c->W, c->C);
  result_f32(r, "dtokens", dtokens, n);
  result_increment(r, "dweight", dweight, dweight0, C4);
  result_increment(r, "dbias", dbias, dbias0, C4);
}

// The res-post-norm residual (Swin V2): which optional arrays a use gives and which tensors are
// in which window order.
typedef struct {
  int B, H, W, C, window, shift;
  // forward: x_out = x_in + scale * LN(branch[bmap]), xw_out[omap] = x_out
  bool x_in, scale, xw_out, in_place;
  MapKind bmap, omap;
  // backward: g = dres_in + dx[xmap] (xmap = omap), dres_out, dweight / dbias, dbranch_bias
  bool dres_in, dx;
  DresOut dres_out;
  bool params, dbranch_bias;
} PostCase;

static WindowMap post_map(const PostCase *c, MapKind k) {
  int shift = k == MAP_SHIFTED ? c->shift : 0;
  return (WindowMap){c->H, c->W, c->window, c->window, shift, shift};
}

static void run_postnorm_residual_forward(OpRun *r, const void *arg) {
  const PostCase *c = arg;
  const int64_t L = (int64_t)c->H * c->W, rows = c->B * L, n = rows * c->C;
  void *x_in = c->x_in ? dev_act(r, draw_act(r, n, -1.0f, 1.0f), n) : NULL;  // (B, L, C, act)
  void *branch = dev_act(r, draw_rows(r, rows, c->C), n);  // (B*L, C, act) in bmap's order
  float *scale = c->scale ? dev_f32(r, drop_scales(r, c->B), c->B) : NULL;  // (B)
  float *weight = dev_f32(r, draw_f32(r, c->C, 0.5f, 1.5f), c->C);
  float *bias = dev_f32(r, draw_f32(r, c->C, -0.5f, 0.5f), c->C);
  void *x_out = c->in_place ? x_in : dev_poisoned_act(r, n);                   // (B, L, C, act)
  void *xw_out = c->xw_out ? dev_poisoned_act(r, n) : NULL;                    // omap's order
  float *mean = dev_poisoned_f32(r, rows), *rstd = dev_poisoned_f32(r, rows);  // (B*L)
  WindowMap bm = post_map(c, c->bmap), om = post_map(c, c->omap);
  r->be->ops->postnorm_residual_forward(r->be, x_out, xw_out, mean, rstd, x_in, branch,
                                        c->bmap == MAP_NONE ? NULL : &bm, scale, weight, bias,
                                        c->omap == MAP_NONE ? NULL : &om, c->B, L, c->C);
  result_act(r, "x_out", x_out, n);
  if (xw_out) result_act(r, "xw_out", xw_out, n);
  result_f32(r, "mean", mean, rows);
  result_f32(r, "rstd", rstd, rows);
}

static void run_postnorm_residual_backward(OpRun *r, const void *arg) {
  const PostCase *c = arg;
  const int64_t L = (int64_t)c->H * c->W, rows = c->B * L, n = rows * c->C;
  const WindowMap bm = post_map(c, c->bmap), om = post_map(c, c->omap);
  float *dres_in = c->dres_in ? dev_f32(r, draw_f32(r, n, -1.0f, 1.0f), n) : NULL;  // (B, L, C)
  float *dres_out = c->dres_out == DRES_ALIAS      ? dres_in
                    : c->dres_out == DRES_SEPARATE ? dev_poisoned_f32(r, n)
                                                   : NULL;               // (B, L, C)
  void *dx = c->dx ? dev_act(r, draw_act(r, n, -1.0f, 1.0f), n) : NULL;  // omap's order, act
  const float *branch_h = draw_rows(r, rows, c->C);                      // bmap's order
  void *branch = dev_act(r, branch_h, n);
  float *weight = dev_f32(r, draw_f32(r, c->C, 0.5f, 1.5f), c->C);
  // The forward's statistics, saved in token order: token t's are those of row bmap(t).
  float *row_mean = keep_host(r, test_alloc_floats(rows)),
        *row_rstd = keep_host(r, test_alloc_floats(rows));
  float *mean_h = keep_host(r, test_alloc_floats(rows)),
        *rstd_h = keep_host(r, test_alloc_floats(rows));
  layernorm_stats(branch_h, rows, c->C, row_mean, row_rstd);
  for (int64_t t = 0; t < rows; t++) {
    int64_t b = t / L, yx = t % L;
    int64_t row = c->bmap == MAP_NONE ? t : window_row(&bm, b, (int)(yx / c->W), (int)(yx % c->W));
    mean_h[t] = row_mean[row];
    rstd_h[t] = row_rstd[row];
  }
  float *mean = dev_f32(r, mean_h, rows), *rstd = dev_f32(r, rstd_h, rows);
  float *scale = c->scale ? dev_f32(r, drop_scales(r, c->B), c->B) : NULL;
  const float *dweight0 = c->params ? draw_f32(r, c->C, -1.0f, 1.0f) : NULL;
  const float *dbias0 = c->params ? draw_f32(r, c->C, -1.0f, 1.0f) : NULL;
  float *dweight = c->params ? dev_f32(r, dweight0, c->C) : NULL;  // (C), +=
  float *dbias = c->params ? dev_f32(r, dbias0, c->C) : NULL;      // (C), +=
  const float *dbranch_bias0 = c->dbranch_bias ? draw_f32(r, c->C, -1.0f, 1.0f) : NULL;
  float *dbranch_bias = c->dbranch_bias ? dev_f32(r, dbranch_bias0, c->C) : NULL;  // (C), +=
  void *dbranch = dev_poisoned_act(r, n);  // (B*L, C, act) in bmap's order
  r->be->ops->postnorm_residual_backward(r->be, dres_out, dbranch, dbranch_bias, dweight, dbias,
                                         dres_in, dx, c->omap == MAP_NONE ? NULL : &om, branch,
                                         weight, mean, rstd, c->bmap == MAP_NONE ? NULL : &bm,
                                         scale, c->B, L, c->C);
  if (dres_out) result_f32(r, "dres_out", dres_out, n);
  result_act(r, "dbranch", dbranch, n);
  if (c->params) {
    result_increment(r, "dweight", dweight, dweight0, c->C);
    result_increment(r, "dbias", dbias, dbias0, c->C);
  }
  if (dbranch_bias) result_increment(r, "dbranch_bias", dbranch_bias, dbranch_bias0, c->C);
}

static void run_patch_merge_forward(OpRun *r, const void *arg) {
  const MergeCase *c = arg;
  const int64_t n = (int64_t)c->B * c->H * c->W * c->C;
  const int64_t nm = (int64_t)c->B * (c->H / 2) * (c->W / 2) * 4 * c->C;
  void *tokens = dev_act(r, draw_act(r, n, -2.0f, 2.0f), n);  // (B, H, W, C, act)
  void *merged = dev_poisoned_act(r, nm);                     // (B, H/2, W/2, 4C, act)
  r->be->ops->patch_merge_forward(r->be, merged, tokens, c->B, c->H, c->W, c->C);
  result_act(r, "merged", merged, nm);
}

static void run_patch_merge_backward(OpRun *r, const void *arg) {
  const MergeCase *c = arg;
  const int64_t n = (int64_t)c->B * c->H * c->W * c->C;
  const int64_t nm = (int64_t)c->B * (c->H / 2) * (c->W / 2) * 4 * c->C;
  void *dmerged = dev_act(r, draw_act(r, nm, -1.0f, 1.0f), nm);  // (B, H/2, W/2, 4C, act)
  float *dtokens = dev_poisoned_f32(r, n);                       // (B, H, W, C)
  r->be->ops->patch_merge_backward(r->be, dtokens, dmerged, c->B, c->H, c->W, c->C);
  result_f32(r, "dtokens", dtokens, n);
}

typedef struct {
  int B, H, W, window, shift;  // square windows, as the model's (shift 0: no mask)
  int C, heads;
  float scale;  // of q k^T; 0: attention_head_dim_scale(C / heads), Swin V1's (V2: 1)
} AttnCase;

// The inputs of both attention ops on the backend, with the geometry the model derives
// (src/model/model.c build_geometry): relative_position_index, and attention_mask_build when
// shifted.
typedef struct {
  int N, nW, BW, table_rows;  // tokens per window, windows per image, windows, bias-table rows
  int64_t n_qkv, n_out;       // elements of qkv (BW, N, 3C) and out (BW, N, C)
  float scale;                // of q k^T
  void *qkv;
  float *table, *mask;  // table (table_rows, heads); mask (nW, N, N) or NULL
  int *index;           // (N, N)
} AttnInputs;

static AttnInputs attention_inputs(OpRun *r, const AttnCase *c) {
  AttnInputs a;
  a.N = c->window * c->window;
  a.nW = (c->H / c->window) * (c->W / c->window);
  a.BW = c->B * a.nW;
  a.table_rows = (2 * c->window - 1) * (2 * c->window - 1);
  a.n_out = (int64_t)a.BW * a.N * c->C;
  a.n_qkv = 3 * a.n_out;
  // Scores q.k of spread ~1 over the head's channels: the softmax neither flat nor one-hot (q
  // and k of U(-1.5, 1.5) at V1's scale, smaller by sqrt(v1 / scale) at another).
  const float v1 = attention_head_dim_scale(c->C / c->heads);
  a.scale = c->scale > 0 ? c->scale : v1;
  const float amp = 1.5f * sqrtf(v1 / a.scale);
  a.qkv = dev_act(r, draw_act(r, a.n_qkv, -amp, amp), a.n_qkv);
  const int64_t nt = (int64_t)a.table_rows * c->heads;
  a.table = dev_f32(r, draw_f32(r, nt, -1.0f, 1.0f), nt);
  int *index = keep_host(r, malloc_check(sizeof(int) * (size_t)a.N * a.N));
  relative_position_index(index, c->window, c->window);
  a.index = dev_bytes(r, index, sizeof(int) * (size_t)a.N * a.N);
  a.mask = NULL;
  if (c->shift) {
    const int64_t nm = (int64_t)a.nW * a.N * a.N;
    float *mask = keep_host(r, test_alloc_floats(nm));
    attention_mask_build(mask, c->H, c->W, c->window, c->window, c->shift, c->shift);
    a.mask = dev_f32(r, mask, nm);
  }
  return a;
}

// out (BW, N, C, act) and saved (what the backend keeps; private to it, so never compared).
static void *attention_forward_on(OpRun *r, const AttnCase *c, const AttnInputs *a, float **saved) {
  Backend *be = r->be;
  void *out = dev_poisoned_act(r, a->n_out);
  *saved = dev_poisoned_f32(r, be->ops->attention_saved_floats(be, a->BW, a->N, c->C, c->heads));
  be->ops->attention_forward(be, out, *saved, a->qkv, a->table, a->index, a->mask, a->BW, a->nW,
                             a->N, c->C, c->heads, a->scale);
  return out;
}

static void run_attention_forward(OpRun *r, const void *arg) {
  const AttnCase *c = arg;
  AttnInputs a = attention_inputs(r, c);
  float *saved;
  void *out = attention_forward_on(r, c, &a, &saved);
  result_act(r, "out", out, a.n_out);
}

// From this backend's own forward, as in the model.
static void run_attention_backward(OpRun *r, const void *arg) {
  const AttnCase *c = arg;
  AttnInputs a = attention_inputs(r, c);
  float *saved;
  void *out = attention_forward_on(r, c, &a, &saved);
  const int64_t nt = (int64_t)a.table_rows * c->heads;
  void *dout = dev_act(r, draw_act(r, a.n_out, -1.0f, 1.0f), a.n_out);  // (BW, N, C, act)
  const float *dtable0 = draw_f32(r, nt, -1.0f, 1.0f);
  const float *dqkv_bias0 = draw_f32(r, 3 * c->C, -1.0f, 1.0f);
  float *dtable = dev_f32(r, dtable0, nt);              // (table_rows, heads), +=
  float *dqkv_bias = dev_f32(r, dqkv_bias0, 3 * c->C);  // (3C), +=
  void *dqkv = dev_poisoned_act(r, a.n_qkv);            // (BW, N, 3C, act)
  r->be->ops->attention_backward(r->be, dqkv, dqkv_bias, dtable, dout, a.qkv, out, a.table, a.index,
                                 a.mask, saved, a.BW, a.nW, a.N, c->C, c->heads, a.scale);
  result_act(r, "dqkv", dqkv, a.n_qkv);
  result_increment(r, "dtable", dtable, dtable0, nt);
  result_increment(r, "dqkv_bias", dqkv_bias, dqkv_bias0, 3 * c->C);
}

// Swin V2's scaled-cosine q, k on the qkv linear's output (rows, 3C), C = heads * head_dim.
typedef struct {
  int64_t rows;
  int heads, head_dim;
  bool bias;  // q_bias and v_bias (else both NULL)
} CosineCase;

// Logit scales around timm's init ln 10, the last head's above the clamp at ln 100 (no gradient).
static float *draw_logit_scale(OpRun *r, int heads) {
  float *ls = draw_f32(r, heads, 1.5f, 3.5f);
  ls[heads - 1] = 5.0f;
  return ls;
}

static void run_cosine_qk_forward(OpRun *r, const void *arg) {
  const CosineCase *c = arg;
  const int C = c->heads * c->head_dim;
  const int64_t n = c->rows * 3 * C, nn = c->rows * 2 * c->heads;
  void *qkv = dev_act(r, draw_act(r, n, -1.0f, 1.0f), n);  // (rows, 3C, act), in place
  float *q_bias = c->bias ? dev_f32(r, draw_f32(r, C, -0.5f, 0.5f), C) : NULL;
  float *v_bias = c->bias ? dev_f32(r, draw_f32(r, C, -0.5f, 0.5f), C) : NULL;
  float *ls = dev_f32(r, draw_logit_scale(r, c->heads), c->heads);
  float *norms = dev_poisoned_f32(r, nn);  // (rows, 2, heads)
  r->be->ops->cosine_qk_forward(r->be, qkv, norms, q_bias, v_bias, ls, c->rows, C, c->heads);
  result_act(r, "qkv", qkv, n);
  result_f32(r, "norms", norms, nn);
}

// The forward's output and norms as the backward reads them: the CPU reference's, the output
// rounded to dt, the same on both backends.
static void run_cosine_qk_backward(OpRun *r, const void *arg) {
  const CosineCase *c = arg;
  const int C = c->heads * c->head_dim;
  const int64_t n = c->rows * 3 * C, nn = c->rows * 2 * c->heads;
  float *saved = draw_f32(r, n, -1.0f, 1.0f);
  const float *q_bias = c->bias ? draw_f32(r, C, -0.5f, 0.5f) : NULL;
  const float *v_bias = c->bias ? draw_f32(r, C, -0.5f, 0.5f) : NULL;
  const float *ls_h = draw_logit_scale(r, c->heads);
  float *norms_h = keep_host(r, test_alloc_floats(nn));
  cosine_qk_forward_cpu(saved, norms_h, q_bias, v_bias, ls_h, c->rows, C, c->heads);
  test_round_all(r->dt, saved, n);
  const void *qkv = dev_act(r, saved, n);  // (rows, 3C, act)
  const float *norms = dev_f32(r, norms_h, nn), *ls = dev_f32(r, ls_h, c->heads);
  void *dqkv = dev_act(r, draw_act(r, n, -1.0f, 1.0f), n);  // (rows, 3C, act), in place
  const float *gq0 = draw_f32(r, C, -1.0f, 1.0f), *gv0 = draw_f32(r, C, -1.0f, 1.0f);
  const float *gl0 = draw_f32(r, c->heads, -1.0f, 1.0f);
  float *dq_bias = c->bias ? dev_f32(r, gq0, C) : NULL;  // (C), +=
  float *dv_bias = c->bias ? dev_f32(r, gv0, C) : NULL;  // (C), +=
  float *dlogit_scale = dev_f32(r, gl0, c->heads);       // (heads), +=
  r->be->ops->cosine_qk_backward(r->be, dqkv, dq_bias, dv_bias, dlogit_scale, qkv, norms, ls,
                                 c->rows, C, c->heads);
  result_act(r, "dqkv", dqkv, n);
  if (c->bias) {
    result_increment(r, "dq_bias", dq_bias, gq0, C);
    result_increment(r, "dv_bias", dv_bias, gv0, C);
  }
  result_increment(r, "dlogit_scale", dlogit_scale, gl0, c->heads);
}

// The continuous position bias of a square window: T = (2 window - 1)^2 rows.
typedef struct {
  int window, heads;
} CpbCase;

// coords (T, 2) as the model builds them, w1 (512, 2), b1 (512), w2 (heads, 512): hidden units of
// O(1), half of them off, and out = hidden w2 of spread ~0.7, so the sigmoid is neither flat nor
// saturated.
typedef struct {
  int T;
  float *coords_h, *w1_h, *b1_h, *w2_h;  // host
  float *coords, *w1, *b1, *w2;          // backend
} CpbInputs;

static CpbInputs cpb_inputs(OpRun *r, const CpbCase *c) {
  CpbInputs a = {.T = (2 * c->window - 1) * (2 * c->window - 1)};
  a.coords_h = keep_host(r, test_alloc_floats(2 * (int64_t)a.T));
  if (cpb_coords_build(a.coords_h, c->window, c->window, 0, 0) != 0)
    setup_failed("cpb_coords_build refused the window");
  a.w1_h = draw_f32(r, 2 * CPB_HIDDEN, -1.0f, 1.0f);
  a.b1_h = draw_f32(r, CPB_HIDDEN, -0.5f, 0.5f);
  a.w2_h = draw_f32(r, (int64_t)c->heads * CPB_HIDDEN, -0.1f, 0.1f);
  a.coords = dev_f32(r, a.coords_h, 2 * (int64_t)a.T);
  a.w1 = dev_f32(r, a.w1_h, 2 * CPB_HIDDEN);
  a.b1 = dev_f32(r, a.b1_h, CPB_HIDDEN);
  a.w2 = dev_f32(r, a.w2_h, (int64_t)c->heads * CPB_HIDDEN);
  return a;
}

static void run_cpb_forward(OpRun *r, const void *arg) {
  const CpbCase *c = arg;
  CpbInputs a = cpb_inputs(r, c);
  const int64_t nt = (int64_t)a.T * c->heads, nh = (int64_t)a.T * CPB_HIDDEN;
  float *table = dev_poisoned_f32(r, nt), *hidden = dev_poisoned_f32(r, nh);
  r->be->ops->cpb_forward(r->be, table, hidden, a.coords, a.w1, a.b1, a.w2, a.T, c->heads);
  result_f32(r, "table", table, nt);
  result_f32(r, "hidden", hidden, nh);
}

// From the CPU reference's forward (the same table and hidden layer on both backends).
static void run_cpb_backward(OpRun *r, const void *arg) {
  const CpbCase *c = arg;
  CpbInputs a = cpb_inputs(r, c);
  const int64_t nt = (int64_t)a.T * c->heads, nh = (int64_t)a.T * CPB_HIDDEN;
  const int64_t nw2 = (int64_t)c->heads * CPB_HIDDEN;
  float *table_h = keep_host(r, test_alloc_floats(nt)),
        *hidden_h = keep_host(r, test_alloc_floats(nh));
  cpb_forward_cpu(table_h, hidden_h, a.coords_h, a.w1_h, a.b1_h, a.w2_h, a.T, c->heads);
  const float *table = dev_f32(r, table_h, nt), *hidden = dev_f32(r, hidden_h, nh);
  const float *dtable = dev_f32(r, draw_f32(r, nt, -1.0f, 1.0f), nt);  // (T, heads)
  const float *g1 = draw_f32(r, 2 * CPB_HIDDEN, -1.0f, 1.0f);
  const float *gb = draw_f32(r, CPB_HIDDEN, -1.0f, 1.0f), *g2 = draw_f32(r, nw2, -1.0f, 1.0f);
  float *dw1 = dev_f32(r, g1, 2 * CPB_HIDDEN), *db1 = dev_f32(r, gb, CPB_HIDDEN);  // +=
  float *dw2 = dev_f32(r, g2, nw2);                                                // +=
  r->be->ops->cpb_backward(r->be, dw1, db1, dw2, dtable, table, hidden, a.coords, a.w2, a.T,
                           c->heads);
  result_increment(r, "dw1", dw1, g1, 2 * CPB_HIDDEN);
  result_increment(r, "db1", db1, gb, CPB_HIDDEN);
  result_increment(r, "dw2", dw2, g2, nw2);
}

typedef struct {
  int B, L, C, K;
} HeadCase;

static void run_head_forward(OpRun *r, const void *arg) {
  const HeadCase *c = arg;
  const int64_t nt = (int64_t)c->B * c->L * c->C, nw = (int64_t)c->K * c->C;
  void *tokens = dev_act(r, draw_act(r, nt, -1.0f, 1.0f), nt);  // (B, L, C, act)
  // Pooled values of random tokens are small (~0.6 / sqrt(L)): weights of order 1 keep the
  // logits of order 1.
  float *weight = dev_f32(r, draw_f32(r, nw, -1.0f, 1.0f), nw);    // (K, C)
  float *bias = dev_f32(r, draw_f32(r, c->K, -0.5f, 0.5f), c->K);  // (K)
  float *logits = dev_poisoned_f32(r, (int64_t)c->B * c->K);       // (B, K)
  float *pooled = dev_poisoned_f32(r, (int64_t)c->B * c->C);       // (B, C)
  r->be->ops->head_forward(r->be, logits, pooled, tokens, weight, bias, c->B, c->L, c->C, c->K);
  result_f32(r, "logits", logits, (int64_t)c->B * c->K);
  result_f32(r, "pooled", pooled, (int64_t)c->B * c->C);
}

static void run_head_backward(OpRun *r, const void *arg) {
  const HeadCase *c = arg;
  const int64_t nt = (int64_t)c->B * c->L * c->C, nw = (int64_t)c->K * c->C;
  float *dlogits = dev_f32(r, draw_f32(r, (int64_t)c->B * c->K, -1.0f, 1.0f), (int64_t)c->B * c->K);
  float *pooled = dev_f32(r, draw_f32(r, (int64_t)c->B * c->C, -0.5f, 0.5f), (int64_t)c->B * c->C);
  float *weight = dev_f32(r, draw_f32(r, nw, -1.0f, 1.0f), nw);
  const float *dweight0 = draw_f32(r, nw, -1.0f, 1.0f), *dbias0 = draw_f32(r, c->K, -1.0f, 1.0f);
  float *dweight = dev_f32(r, dweight0, nw), *dbias = dev_f32(r, dbias0, c->K);  // +=
  void *dtokens = dev_poisoned_act(r, nt);                                       // (B, L, C, act)
  r->be->ops->head_backward(r->be, dtokens, dweight, dbias, dlogits, pooled, weight, c->B, c->L,
                            c->C, c->K);
  result_act(r, "dtokens", dtokens, nt);
  result_increment(r, "dweight", dweight, dweight0, nw);
  result_increment(r, "dbias", dbias, dbias0, c->K);
}

typedef struct {
  int B, K;
  bool soft;  // soft targets (mixup), else hard labels with smoothing
  float smoothing, loss_scale;
  int grad_count;  // the images the gradient is a mean over; 0: B (a micro-batch: more)
} LossCase;

// The OptimState a loss or an update starts from: every field recognizable.
static OptimState state_start(float loss_scale) {
  return (OptimState){.grad_norm = 1.25,
                      .loss_sum = 2.5,
                      .loss_steps = 3,
                      .bad_losses = 1,
                      .adam_steps = 4,
                      .skipped = 2,
                      .skipped_run = 1,
                      .loss_scale = loss_scale,
                      .good_steps = 1};
}

static void run_train_loss(OpRun *r, const void *arg) {
  const LossCase *c = arg;
  const int64_t n = (int64_t)c->B * c->K;
  float *logits = dev_f32(r, draw_f32(r, n, -4.0f, 4.0f), n);  // (B, K)
  const int *labels_h = draw_labels(r, c->B, c->K);
  int *labels = dev_bytes(r, labels_h, sizeof(int) * (size_t)c->B);
  float *soft = NULL;  // (B, K)
  if (c->soft) {
    float *t = keep_host(r, test_alloc_floats(n));
    batch_augment_soft_targets_fill(t, labels_h, c->B, c->K, test_rng_uniform(&r->rng, 0.2f, 0.8f),
                                    0.1f);
    soft = dev_f32(r, t, n);
  }
  const OptimState s0 = state_start(c->loss_scale);
  OptimState *state = dev_bytes(r, &s0, sizeof s0), s;
  float *dlogits = dev_poisoned_f32(r, n);  // (B, K)
  int grad_count = c->grad_count > 0 ? c->grad_count : c->B;
  r->be->ops->train_loss(r->be, dlogits, logits, labels, soft, c->smoothing, c->B, c->K, grad_count,
                         state);
  r->be->ops->download(r->be, &s, state, sizeof s);
  result_f32(r, "dlogits", dlogits, n);
  result_scalar_increment(r, "loss_sum", s.loss_sum, s0.loss_sum);
  const double counts[] = {(double)s.loss_steps, (double)s.bad_losses};
  result_values(r, "loss_steps, bad_losses", counts, 2);
  const double others[] = {s.grad_norm,           (double)s.adam_steps, (double)s.skipped,
                           (double)s.skipped_run, s.loss_scale,         s.good_steps};
  result_values(r, "the state the loss does not own", others, 6);
}

static void run_eval_metrics(OpRun *r, const void *arg) {
  const LossCase *c = arg;  // B and K
  const int64_t n = (int64_t)c->B * c->K;
  // Five levels, so ties are everywhere (they go to the lower class index on both backends);
  // rows by b % 3: the label alone on top (top-1), tied on top with the class below it (rank 1:
  // top-5 only), as drawn.
  float *logits_h = keep_host(r, test_alloc_floats(n));
  int *labels_h = keep_host(r, malloc_check(sizeof(int) * (size_t)c->B));
  for (int64_t i = 0; i < n; i++) logits_h[i] = (float)(test_rng_u64(&r->rng) % 5) - 2.0f;
  for (int b = 0; b < c->B; b++) {
    int y = 1 + (int)(test_rng_u64(&r->rng) % (uint64_t)(c->K - 1));
    float *x = logits_h + (int64_t)b * c->K;
    labels_h[b] = y;
    if (b % 3 < 2) x[y] = 3.0f;
    if (b % 3 == 1) x[y - 1] = 3.0f;
  }
  float *logits = dev_f32(r, logits_h, n);
  int *labels = dev_bytes(r, labels_h, sizeof(int) * (size_t)c->B);
  const EvalSums s0 = {.loss_sum = 12.5, .top1 = 3, .top5 = 5, .count = 9};
  EvalSums *sums = dev_bytes(r, &s0, sizeof s0), s;
  r->be->ops->eval_metrics(r->be, sums, logits, labels, c->B, c->K);
  r->be->ops->download(r->be, &s, sums, sizeof s);
  result_scalar_increment(r, "loss_sum", s.loss_sum, s0.loss_sum);
  const double counts[] = {(double)s.top1, (double)s.top5, (double)s.count};
  result_values(r, "top1, top5, count", counts, 3);
}

// Fake parameter tensors laid out as the model lays out its own: each at a multiple of
// OPT_ALIGN floats (chunk offsets must be multiples of 4), the gaps in no chunk (zero gradients,
// parameters the update leaves alone), each cut into chunks of at most OPT_CHUNK elements as
// model_adamw_chunks cuts them, ragged (chunks of 232, 37, 3 and 1), each with its own lr scale
// (train.layer_decay 0.8 at several depths, and 1).
typedef struct {
  int numel;
  bool decay;
  float lr_scale;
} FakeTensor;

static const FakeTensor opt_tensors[] = {
    {1000, true, 0.512f}, {37, false, 0.64f}, {515, true, 0.8f}, {1, false, 1.0f}};
enum { OPT_TENSORS = sizeof opt_tensors / sizeof opt_tensors[0], OPT_ALIGN = 16, OPT_CHUNK = 256 };
#define OPT_WEIGHT_DECAY 0.05f

static int64_t opt_floats(void) {
  int64_t n = 0;
  for (int i = 0; i < OPT_TENSORS; i++)
    n += (opt_tensors[i].numel + OPT_ALIGN - 1) / OPT_ALIGN * OPT_ALIGN;
  return n;
}

// The chunk table (NULL: just count), and which elements a chunk covers.
static int opt_chunks(AdamWChunk *chunks, bool *in_chunk) {
  int k = 0;
  int64_t base = 0;
  for (int i = 0; i < OPT_TENSORS; i++) {
    const FakeTensor *t = &opt_tensors[i];
    for (int off = 0; off < t->numel; off += OPT_CHUNK, k++) {
      if (!chunks) continue;
      int count = t->numel - off < OPT_CHUNK ? t->numel - off : OPT_CHUNK;
      chunks[k] = (AdamWChunk){.offset = base + off,
                               .count = count,
                               .weight_decay = t->decay ? OPT_WEIGHT_DECAY : 0.0f,
                               .lr_scale = t->lr_scale};
      for (int e = 0; e < count; e++) in_chunk[base + off + e] = true;
    }
    base += (t->numel + OPT_ALIGN - 1) / OPT_ALIGN * OPT_ALIGN;
  }
  return k;
}

typedef struct {
  bool clip;           // clip at half the gradient norm (else off)
  bool dynamic_scale;  // window 2 from good_steps 1: the scale doubles after a clean step
  bool inf_grad;       // one infinite gradient: the step is skipped
  float loss_scale;
} OptimCase;

// One AdamW update from random moments at step 5 of a run; gradients handed in multiplied by the
// loss scale, as the backward produces them. The compute copy (bf16 / fp16) as the model makes
// it (to_compute of the parameters), which the update must refresh: the run reports how many of
// its elements are not the rounding of the updated parameters (none on the CPU, which has none).
static void run_optimizer_step(OpRun *r, const void *arg) {
  const OptimCase *c = arg;
  Backend *be = r->be;
  const int64_t n = opt_floats();
  const int num_chunks = opt_chunks(NULL, NULL);
  AdamWChunk *chunks_h = keep_host(r, malloc_check(sizeof(AdamWChunk) * (size_t)num_chunks));
  bool *in_chunk = keep_host(r, calloc_check((size_t)n, sizeof(bool)));
  opt_chunks(chunks_h, in_chunk);
  const float *params0 = draw_f32(r, n, -1.0f, 1.0f);
  // Moments of the size 4 steps of such gradients leave, (1 - beta1^4) g and (1 - beta2^4) g^2:
  // after the bias corrections m / sqrt(v) is of order 1, so the update is of order lr.
  const float *m0 = draw_f32(r, n, -4e-3f, 4e-3f), *v0 = draw_f32(r, n, 1e-8f, 3e-7f);
  float *grads_h = draw_f32(r, n, -0.01f, 0.01f);
  double sum = 0;
  for (int64_t i = 0; i < n; i++) {
    grads_h[i] = in_chunk[i] ? grads_h[i] : 0.0f;
    sum += (double)grads_h[i] * grads_h[i];
    grads_h[i] *= c->loss_scale;
  }
  if (c->inf_grad) grads_h[5] = INFINITY;
  OptimizerStep hyper = {.beta1 = 0.9f,
                         .beta2 = 0.999f,
                         .eps = 1e-8f,
                         .clip_grad = c->clip ? (float)(0.5 * sqrt(sum)) : 0.0f,
                         .dynamic_scale = c->dynamic_scale,
                         .scale_window = 2};
  float *params = dev_f32(r, params0, n), *m = dev_f32(r, m0, n), *v = dev_f32(r, v0, n);
  float *grads = dev_f32(r, grads_h, n);
  AdamWChunk *chunks = dev_bytes(r, chunks_h, sizeof(AdamWChunk) * (size_t)num_chunks);
  const OptimState s0 = state_start(c->loss_scale);
  OptimState *state = dev_bytes(r, &s0, sizeof s0), s;
  StepParams *step = keep_dev(r, be_step_params(be, 5, 1e-3f));
  void *compute = NULL;  // (n, act)
  if (be->act != DTYPE_F32) {
    compute = keep_dev(r, be->ops->alloc(be, dtype_size(be->act) * (size_t)n));
    be->ops->to_compute(be, compute, params, n);
  }
  be->ops->optimizer_step(be, params, compute, grads, m, v, n, chunks, num_chunks, hyper, step,
                          state);
  be->ops->download(be, &s, state, sizeof s);
  result_increment(r, "params", params, params0, n);
  result_f32(r, "m", m, n);
  result_f32(r, "v", v, n);
  const double decisions[] = {(double)s.adam_steps, (double)s.skipped, (double)s.skipped_run,
                              s.loss_scale, s.good_steps};
  result_values(r, "adam_steps, skipped, skipped_run, loss_scale, good_steps", decisions, 5);
  // A skipped step's norm is +inf on both: reported as whether it is finite.
  const double norm = c->inf_grad ? (double)isfinite(s.grad_norm) : s.grad_norm;
  result_values(r, c->inf_grad ? "grad_norm is finite" : "grad_norm", &norm, 1);
  double stale = 0;
  if (compute) {
    float *p = test_alloc_floats(n), *cc = test_alloc_floats(n);
    be_read_f32(be, p, params, n);
    be_read_act(be, cc, compute, n);
    test_round_all(be->act, p, n);
    for (int64_t i = 0; i < n; i++) stale += memcmp(&p[i], &cc[i], sizeof(float)) != 0;
    free(p);
    free(cc);
  }
  result_values(r, "compute copy: elements not the rounded params", &stale, 1);
}

typedef struct {
  EmaSettings s;
  int64_t t;     // the optimizer state's adam_steps: the update's index
  bool skipped;  // the optimizer step before it was skipped (skipped_run 1)
} EmaCase;

// The average's update after an optimizer step, from a random average towards random weights
// over a ragged length (tail n % 4 = 3).
static void run_ema_update(OpRun *r, const void *arg) {
  const EmaCase *c = arg;
  const int64_t n = 4099;
  float *ema = dev_f32(r, draw_f32(r, n, -1.0f, 1.0f), n);
  const float *weights = dev_f32(r, draw_f32(r, n, -1.0f, 1.0f), n);
  OptimState s0 = state_start(1.0f);
  s0.adam_steps = c->t;
  s0.skipped_run = c->skipped ? 1 : 0;
  const OptimState *state = dev_bytes(r, &s0, sizeof s0);
  r->be->ops->ema_update(r->be, ema, weights, n, c->s, state);
  result_f32(r, "ema", ema, n);
}

static void run_weights_swap(OpRun *r, const void *arg) {
  const int64_t n = *(const int64_t *)arg;
  float *a = dev_f32(r, draw_f32(r, n, -1.0f, 1.0f), n);
  float *b = dev_f32(r, draw_f32(r, n, -1.0f, 1.0f), n);
  r->be->ops->weights_swap(r->be, a, b, n);
  result_f32(r, "a", a, n);
  result_f32(r, "b", b, n);
}

// ---- the table ----------------------------------------------------------------------------------

typedef struct {
  const char *name;
  ErrorModel error;
} OutputSpec;

typedef struct {
  const char *op;    // the BackendOps member
  const char *what;  // the case
  void (*run)(OpRun *r, const void *arg);
  const void *arg;                      // the case's shape and mode, for run
  OutputSpec outputs[MAX_OUTPUTS + 1];  // ends at a NULL name
} OpRow;

// Shapes: a map of 8x8 tokens in 4x4 windows shifted by 2 (4 windows per image), batch 2; widths
// multiples of 8 (the 16-bit GEMMs' alignment).
#define LN(...)                                                           \
  &(const LnCase) {                                                       \
    .B = 2, .H = 8, .W = 8, .C = 32, .window = 4, .shift = 2, __VA_ARGS__ \
  }
// The same with the map's side and the width given (windows of 4 shifted by 2, batch 2).
#define LN_HC(H_, C_, ...)                                                  \
  &(const LnCase) {                                                         \
    .B = 2, .H = H_, .W = H_, .C = C_, .window = 4, .shift = 2, __VA_ARGS__ \
  }

// Res-post-norm cases on LN's map, batch 2 and width 32 unless given (POST_BC).
#define POST_BC(B_, C_, ...)                                               \
  &(const PostCase) {                                                      \
    .B = B_, .H = 8, .W = 8, .C = C_, .window = 4, .shift = 2, __VA_ARGS__ \
  }
#define POST(...) POST_BC(2, 32, __VA_ARGS__)

static const OpRow rows[] = {
    {"to_compute",
     "1027 values (a ragged tail)",
     run_to_compute,
     &(const int64_t){1027},
     {{"dst", EXACT_ROUNDED}}},
    // The same IEEE division on both, no contraction possible: exact (tests/test_gpu_patch.c).
    {"patch_embed_input",
     "uint8 pixels normalized, B=2 8x12 Cin=3 p=2",
     run_patch_embed_input,
     &(const ImageCase){2, 8, 12, 3, 2, DTYPE_U8},
     {{"patches", EXACT_ROUNDED}}},
    {"patch_embed_input",
     "f32 images, B=2 10x14 Cin=1 p=4 (edge pixels left out)",
     run_patch_embed_input,
     &(const ImageCase){2, 10, 14, 1, 4, DTYPE_F32},
     {{"patches", EXACT_ROUNDED}}},
    // The same Philox draws on both.
    {"drop_path_scales",
     "6 units x 8 samples from sample 8, step 12345",
     run_drop_path_scales,
     &(const DropPathCase){6, 8, 8, 12345},
     {{"scales", EXACT}}},
    {"images_normalize",
     "B=2 5x7 Cin=3",
     run_images_normalize,
     &(const ImageCase){2, 5, 7, 3, 1, DTYPE_U8},
     {{"images", EXACT}}},
    // The same fill and explicitly rounded mixing on both (kernels/augment.h).
    {"batch_augment",
     "erasing + mixup, B=8 16x16x3",
     run_batch_augment,
     &(const AugmentCase){8, 16, 16, 3, false},
     {{"images", EXACT}}},
    {"batch_augment",
     "erasing + cutmix, B=8 16x16x3",
     run_batch_augment,
     &(const AugmentCase){8, 16, 16, 3, true},
     {{"images", EXACT}}},

    {"linear_forward",
     "no bias, N=64 32 -> 48",
     run_linear_forward,
     &(const LinearCase){.N = 64, .IC = 32, .OC = 48},
     {{"out", TC_ROUNDED}}},
    {"linear_forward",
     "bias, N=64 32 -> 48",
     run_linear_forward,
     &(const LinearCase){.N = 64, .IC = 32, .OC = 48, .bias = true},
     {{"out", TC_ROUNDED}}},
    // GELU of the rounded pre-activation, rounded again.
    {"linear_forward",
     "bias + GELU, N=64 32 -> 48",
     run_linear_forward,
     &(const LinearCase){.N = 64, .IC = 32, .OC = 48, .bias = true, .gelu = true},
     {{"pre", TC_ROUNDED}, {"out", TC_ROUNDED_TWICE}}},
    {"linear_forward",
     "bias + GELU, N=64 96 -> 128 (bf16: the small-K kernel)",
     run_linear_forward,
     &(const LinearCase){.N = 64, .IC = 96, .OC = 128, .bias = true, .gelu = true},
     {{"pre", TC_ROUNDED}, {"out", TC_ROUNDED_TWICE}}},
    // out: a product of GELU of the rounded pre-activation, rounded (bf16: on the Hopper GEMM
    // with the GELU in its operand load, where the device is Hopper).
    {"mlp_forward",
     "N=64 32 -> 128 -> 32",
     run_mlp_forward,
     &(const LinearCase){.N = 64, .IC = 32, .OC = 128, .dinp = true},
     {{"pre", TC_ROUNDED}, {"out", TC_ROUNDED_TWICE}}},
    {"mlp_forward",
     "out NULL: pre alone",
     run_mlp_forward,
     &(const LinearCase){.N = 64, .IC = 32, .OC = 128},
     {{"pre", TC_ROUNDED}}},
    // dbias: fp32 column sums of the same dout on both.
    {"linear_backward",
     "dinp, dweight, dbias, N=64 32 -> 48",
     run_linear_backward,
     &(const LinearCase){.N = 64, .IC = 32, .OC = 48, .dinp = true, .dbias = true},
     {{"dinp", TC_ROUNDED}, {"dweight", TC}, {"dbias", FP32}}},
    {"linear_backward",
     "dinp, dweight, no dbias",
     run_linear_backward,
     &(const LinearCase){.N = 64, .IC = 32, .OC = 48, .dinp = true},
     {{"dinp", TC_ROUNDED}, {"dweight", TC}}},
    {"linear_backward",
     "dinp NULL, dweight, dbias",
     run_linear_backward,
     &(const LinearCase){.N = 64, .IC = 32, .OC = 48, .dbias = true},
     {{"dweight", TC}, {"dbias", FP32}}},
    {"linear_backward",
     "dinp NULL, dweight only (the patch embedding)",
     run_linear_backward,
     &(const LinearCase){.N = 64, .IC = 32, .OC = 48},
     {{"dweight", TC}}},
    // dpre: a product rounded, times GELU', rounded again; dweight from the recomputed hidden
    // layer, which the GPU rounds to dt; dpre_bias: the column sums of dpre as stored. hidden:
    // only where the GPU stores it (run_gelu_linear_backward).
    {"gelu_linear_backward",
     "dpre_bias, N=64 48 (hidden) -> 32",
     run_gelu_linear_backward,
     &(const LinearCase){.N = 64, .IC = 48, .OC = 32, .dbias = true},
     {{"hidden", ROUNDED},
      {"dpre", TC_ROUNDED_TWICE},
      {"dweight", TC_ROUNDED},
      {"dpre_bias", TC_ROUNDED_TWICE}}},
    {"gelu_linear_backward",
     "no dpre_bias",
     run_gelu_linear_backward,
     &(const LinearCase){.N = 64, .IC = 48, .OC = 32},
     {{"hidden", ROUNDED}, {"dpre", TC_ROUNDED_TWICE}, {"dweight", TC_ROUNDED}}},

    // x_out: one fp32 add rounded once. With a branch the GPU normalizes that rounded sum (the
    // CPU the exact one): the rounding, amplified by |x| / std, reaches ln_out, and the
    // statistics move by its row mean. Without one both normalize the same values.
    {"residual_layernorm_forward",
     "LN1 + MLP residual into shifted windows, drop path",
     run_residual_layernorm_forward,
     LN(.branch = true, .scale = true, .ln = true, .lmap = MAP_SHIFTED),
     {{"x_out", ROUNDED}, {"ln_out", ROUNDED_TWICE}, {"mean", ROUNDED}, {"rstd", ROUNDED}}},
    {"residual_layernorm_forward",
     "attention residual from shifted windows + LN2, drop path",
     run_residual_layernorm_forward,
     LN(.branch = true, .bmap = MAP_SHIFTED, .scale = true, .ln = true),
     {{"x_out", ROUNDED}, {"ln_out", ROUNDED_TWICE}, {"mean", ROUNDED}, {"rstd", ROUNDED}}},
    {"residual_layernorm_forward",
     "no branch: LN1 into unshifted windows",
     run_residual_layernorm_forward,
     LN(.ln = true, .lmap = MAP_PLAIN),
     {{"ln_out", ROUNDED}, {"mean", FP32}, {"rstd", FP32}}},
    {"residual_layernorm_forward",
     "residual only, in place, drop path (a stage's end)",
     run_residual_layernorm_forward,
     LN(.branch = true, .scale = true, .in_place = true),
     {{"x_out", ROUNDED}}},
    // The branch is a product the GPU rounds to dt before the residual adds it (the CPU keeps it
    // in fp32): one rounding more than the rows above on every output. C = 96: Swin-T's stage 0
    // (in bf16 the small-K layer; 12 x 12 images of 2: 288 rows, the last of 5 tiles of 64
    // partial).
    {"linear_residual_layernorm_forward",
     "proj from shifted windows + LN2, drop path, C=96",
     run_linear_residual_layernorm_forward,
     LN_HC(12, 96, .bmap = MAP_SHIFTED, .scale = true),
     {{"x_out", TC_ROUNDED_TWICE},
      {"ln_out", TC_ROUNDED_TWICE},
      {"mean", TC_ROUNDED_TWICE},
      {"rstd", TC_ROUNDED_TWICE}}},
    {"linear_residual_layernorm_forward",
     "proj from unshifted windows + LN2, no drop path, C=96",
     run_linear_residual_layernorm_forward,
     LN_HC(8, 96, .bmap = MAP_PLAIN),
     {{"x_out", TC_ROUNDED_TWICE},
      {"ln_out", TC_ROUNDED_TWICE},
      {"mean", TC_ROUNDED_TWICE},
      {"rstd", TC_ROUNDED_TWICE}}},
    {"linear_residual_layernorm_forward",
     "token order, C=32 (the two ops)",
     run_linear_residual_layernorm_forward,
     LN(.scale = true),
     {{"x_out", TC_ROUNDED_TWICE},
      {"ln_out", TC_ROUNDED_TWICE},
      {"mean", TC_ROUNDED_TWICE},
      {"rstd", TC_ROUNDED_TWICE}}},
    // The branch is the MLP's output, rounded by the GPU at each layer (mlp_forward's
    // TC_ROUNDED_TWICE), then added to a stream ~3x larger and rounded: the same bound on x_out
    // and what LN1 makes of it. C = 96, 128 and 192: in bf16 fc2 on the Hopper GEMM with the GELU
    // in its operand load, where the device is Hopper.
    {"mlp_residual_layernorm_forward",
     "MLP + residual + LN1 into shifted windows, drop path, C=96",
     run_mlp_residual_layernorm_forward,
     LN_HC(8, 96, .scale = true, .ln = true, .lmap = MAP_SHIFTED),
     {{"pre", TC_ROUNDED},
      {"x_out", TC_ROUNDED_TWICE},
      {"ln_out", TC_ROUNDED_TWICE},
      {"mean", TC_ROUNDED_TWICE},
      {"rstd", TC_ROUNDED_TWICE}}},
    {"mlp_residual_layernorm_forward",
     "MLP + residual alone (a stage's end), no drop path, C=192, 12 x 12 tokens",
     run_mlp_residual_layernorm_forward,
     LN_HC(12, 192),
     {{"pre", TC_ROUNDED}, {"x_out", TC_ROUNDED_TWICE}}},
    {"mlp_residual_layernorm_forward",
     "MLP + residual + LN in token order (the final norm), C=128",
     run_mlp_residual_layernorm_forward,
     LN_HC(8, 128, .scale = true, .ln = true),
     {{"pre", TC_ROUNDED},
      {"x_out", TC_ROUNDED_TWICE},
      {"ln_out", TC_ROUNDED_TWICE},
      {"mean", TC_ROUNDED_TWICE},
      {"rstd", TC_ROUNDED_TWICE}}},
    {"mlp_residual_layernorm_forward",
     "C=32 (the two ops)",
     run_mlp_residual_layernorm_forward,
     LN(.scale = true, .ln = true, .lmap = MAP_PLAIN),
     {{"pre", TC_ROUNDED},
      {"x_out", TC_ROUNDED_TWICE},
      {"ln_out", TC_ROUNDED_TWICE},
      {"mean", TC_ROUNDED_TWICE},
      {"rstd", TC_ROUNDED_TWICE}}},
    // Gradients in fp32 from the same inputs; dbranch stored once in dt; its column sums are
    // those of the stored values on the GPU, so they carry its roundings (random signs: u).
    {"residual_layernorm_backward",
     "LN1 of block j > 0: dres aliased, dln from shifted windows, drop path, fc2 bias",
     run_residual_layernorm_backward,
     LN(.dres_in = true, .dres_out = DRES_ALIAS, .dln = true, .lmap = MAP_SHIFTED, .scale = true,
        .dbranch_bias = true),
     {{"dres_out", FP32},
      {"dbranch", ROUNDED},
      {"dweight", FP32},
      {"dbias", FP32},
      {"dbranch_bias", ROUNDED}}},
    {"residual_layernorm_backward",
     "LN2: dbranch to shifted windows, drop path, proj bias",
     run_residual_layernorm_backward,
     LN(.dres_in = true, .dres_out = DRES_ALIAS, .dln = true, .bmap = MAP_SHIFTED, .scale = true,
        .dbranch_bias = true),
     {{"dres_out", FP32},
      {"dbranch", ROUNDED},
      {"dweight", FP32},
      {"dbias", FP32},
      {"dbranch_bias", ROUNDED}}},
    {"residual_layernorm_backward",
     "final norm: no dres_in, dres_out of its own, fc2 bias",
     run_residual_layernorm_backward,
     LN(.dres_out = DRES_SEPARATE, .dln = true, .scale = true, .dbranch_bias = true),
     {{"dres_out", FP32},
      {"dbranch", ROUNDED},
      {"dweight", FP32},
      {"dbias", FP32},
      {"dbranch_bias", ROUNDED}}},
    {"residual_layernorm_backward",
     "stage end: pure residual (no dln), drop path, fc2 bias",
     run_residual_layernorm_backward,
     LN(.dres_in = true, .dres_out = DRES_ALIAS, .scale = true, .dbranch_bias = true),
     {{"dres_out", FP32}, {"dbranch", ROUNDED}, {"dbranch_bias", ROUNDED}}},
    {"residual_layernorm_backward",
     "patch embedding: no dres, projection bias",
     run_residual_layernorm_backward,
     LN(.dln = true, .dbranch_bias = true),
     {{"dbranch", ROUNDED}, {"dweight", FP32}, {"dbias", FP32}, {"dbranch_bias", ROUNDED}}},
    // The same gather and fp32 LayerNorm; the output rounded once. The backward in fp32.
    {"merge_layernorm_forward",
     "B=2 8x8 C=16 -> 4x4 x 64",
     run_merge_layernorm_forward,
     &(const MergeCase){2, 8, 8, 16},
     {{"out", ROUNDED}, {"mean", FP32}, {"rstd", FP32}}},
    {"merge_layernorm_backward",
     "B=2 8x8 C=16",
     run_merge_layernorm_backward,
     &(const MergeCase){2, 8, 8, 16},
     {{"dtokens", FP32}, {"dweight", FP32}, {"dbias", FP32}}},

    // Res-post-norm (Swin V2): the same fp32 LayerNorm of the same branch values (statistics in
    // fp32 shuffles on the GPU, double on the CPU), then one add rounded once to dt; xw_out is
    // the same stored value. The backward in fp32 from the same inputs, dbranch stored once;
    // dbranch_bias the sums of the stored dbranch on the GPU (random-sign roundings: u).
    {"postnorm_residual_forward",
     "attention unit: branch from shifted windows, x_in, drop path",
     run_postnorm_residual_forward,
     POST(.x_in = true, .scale = true, .bmap = MAP_SHIFTED),
     {{"x_out", ROUNDED}, {"mean", FP32}, {"rstd", FP32}}},
    {"postnorm_residual_forward",
     "MLP unit: in place, xw_out into shifted windows, drop path",
     run_postnorm_residual_forward,
     POST(.x_in = true, .scale = true, .in_place = true, .xw_out = true, .omap = MAP_SHIFTED),
     {{"x_out", ROUNDED}, {"xw_out", ROUNDED}, {"mean", FP32}, {"rstd", FP32}}},
    {"postnorm_residual_forward",
     "stage input: no x_in, no scale, xw_out into windows",
     run_postnorm_residual_forward,
     POST(.xw_out = true, .omap = MAP_PLAIN),
     {{"x_out", ROUNDED}, {"xw_out", ROUNDED}, {"mean", FP32}, {"rstd", FP32}}},
    {"postnorm_residual_forward",
     "C = 1536 (Swin-L's last stage), B=1 8x8, branch shifted, xw_out shifted",
     run_postnorm_residual_forward,
     POST_BC(1, 1536, .x_in = true, .scale = true, .xw_out = true, .bmap = MAP_SHIFTED,
             .omap = MAP_SHIFTED),
     {{"x_out", ROUNDED}, {"xw_out", ROUNDED}, {"mean", FP32}, {"rstd", FP32}}},
    {"postnorm_residual_forward",
     "C = 30 (scalar path), branch shifted",
     run_postnorm_residual_forward,
     POST_BC(2, 30, .x_in = true, .scale = true, .bmap = MAP_SHIFTED),
     {{"x_out", ROUNDED}, {"mean", FP32}, {"rstd", FP32}}},
    {"postnorm_residual_backward",
     "attention unit: dres aliased, dbranch to shifted windows, drop path, proj bias",
     run_postnorm_residual_backward,
     POST(.scale = true, .bmap = MAP_SHIFTED, .dres_in = true, .dres_out = DRES_ALIAS,
          .params = true, .dbranch_bias = true),
     {{"dres_out", FP32},
      {"dbranch", ROUNDED},
      {"dweight", FP32},
      {"dbias", FP32},
      {"dbranch_bias", ROUNDED}}},
    {"postnorm_residual_backward",
     "MLP unit: dres aliased, dx from shifted windows, drop path, fc2 bias",
     run_postnorm_residual_backward,
     POST(.scale = true, .omap = MAP_SHIFTED, .dres_in = true, .dx = true, .dres_out = DRES_ALIAS,
          .params = true, .dbranch_bias = true),
     {{"dres_out", FP32},
      {"dbranch", ROUNDED},
      {"dweight", FP32},
      {"dbias", FP32},
      {"dbranch_bias", ROUNDED}}},
    {"postnorm_residual_backward",
     "stage input: dx from windows only, no dres_out, patch-embedding bias",
     run_postnorm_residual_backward,
     POST(.omap = MAP_PLAIN, .dx = true, .params = true, .dbranch_bias = true),
     {{"dbranch", ROUNDED}, {"dweight", FP32}, {"dbias", FP32}, {"dbranch_bias", ROUNDED}}},
    {"postnorm_residual_backward",
     "merge's norm: dx only, dres_out of its own, no dbranch_bias",
     run_postnorm_residual_backward,
     POST(.dx = true, .dres_out = DRES_SEPARATE, .params = true),
     {{"dres_out", FP32}, {"dbranch", ROUNDED}, {"dweight", FP32}, {"dbias", FP32}}},
    {"postnorm_residual_backward",
     "C = 1536, B=1 8x8: dres + dx shifted, dbranch shifted, all sums",
     run_postnorm_residual_backward,
     POST_BC(1, 1536, .scale = true, .bmap = MAP_SHIFTED, .omap = MAP_SHIFTED, .dres_in = true,
             .dx = true, .dres_out = DRES_ALIAS, .params = true, .dbranch_bias = true),
     {{"dres_out", FP32},
      {"dbranch", ROUNDED},
      {"dweight", FP32},
      {"dbias", FP32},
      {"dbranch_bias", ROUNDED}}},
    {"postnorm_residual_backward",
     "C = 30 (scalar path): dres + dx shifted, all sums",
     run_postnorm_residual_backward,
     POST_BC(2, 30, .scale = true, .omap = MAP_SHIFTED, .dres_in = true, .dx = true,
             .dres_out = DRES_SEPARATE, .params = true, .dbranch_bias = true),
     {{"dres_out", FP32},
      {"dbranch", ROUNDED},
      {"dweight", FP32},
      {"dbias", FP32},
      {"dbranch_bias", ROUNDED}}},
    // A permutation of values already in dt (to f32 in the backward): bitwise.
    {"patch_merge_forward",
     "B=2 8x8 C=16 -> 4x4 x 64",
     run_patch_merge_forward,
     &(const MergeCase){2, 8, 8, 16},
     {{"merged", EXACT}}},
    {"patch_merge_forward",
     "odd map B=2 7x10 C=12 (scalar in bf16 / fp16) -> 3x5 x 48",
     run_patch_merge_forward,
     &(const MergeCase){2, 7, 10, 12},
     {{"merged", EXACT}}},
    {"patch_merge_backward",
     "B=2 8x8 C=16",
     run_patch_merge_backward,
     &(const MergeCase){2, 8, 8, 16},
     {{"dtokens", EXACT}}},
    {"patch_merge_backward",
     "odd map B=2 7x10 C=12: the last row's gradient 0",
     run_patch_merge_backward,
     &(const MergeCase){2, 7, 10, 12},
     {{"dtokens", EXACT}}},

    // In bf16 / fp16 (the tensor-core kernels) P is rounded to dt before P v, and out after it:
    // two roundings (one in fp32); dqkv likewise, and its column sums carry them. dtable: fp32
    // sums of fp32 dS on both (tests/test_gpu_attention.c measured 2.7e-7).
    {"attention_forward",
     "4x4 windows shifted (mask), 8x8 map, B=2, C=64, 2 heads",
     run_attention_forward,
     &(const AttnCase){2, 8, 8, 4, 2, 64, 2, 0},
     {{"out", ROUNDED_TWICE}}},
    {"attention_forward",
     "4x4 windows unshifted",
     run_attention_forward,
     &(const AttnCase){2, 8, 8, 4, 0, 64, 2, 0},
     {{"out", ROUNDED_TWICE}}},
    {"attention_backward",
     "4x4 windows shifted (mask), qkv bias",
     run_attention_backward,
     &(const AttnCase){2, 8, 8, 4, 2, 64, 2, 0},
     {{"dqkv", ROUNDED_TWICE}, {"dtable", FP32}, {"dqkv_bias", ROUNDED_TWICE}}},
    {"attention_backward",
     "4x4 windows unshifted, qkv bias",
     run_attention_backward,
     &(const AttnCase){2, 8, 8, 4, 0, 64, 2, 0},
     {{"dqkv", ROUNDED_TWICE}, {"dtable", FP32}, {"dqkv_bias", ROUNDED_TWICE}}},
    // Swin V2's scale 1 (q normalized and scaled by the logit scale before the op).
    {"attention_forward",
     "V2 scale 1: 4x4 windows shifted (mask), C=64, 2 heads",
     run_attention_forward,
     &(const AttnCase){2, 8, 8, 4, 2, 64, 2, 1.0f},
     {{"out", ROUNDED_TWICE}}},
    {"attention_backward",
     "V2 scale 1: 4x4 windows shifted (mask), qkv bias",
     run_attention_backward,
     &(const AttnCase){2, 8, 8, 4, 2, 64, 2, 1.0f},
     {{"dqkv", ROUNDED_TWICE}, {"dtable", FP32}, {"dqkv_bias", ROUNDED_TWICE}}},
    // Swin V2's cosine q, k: the same f32 arithmetic from the same values (the norms' sums in
    // f32 on the GPU, in a shuffle tree over a pair's lanes, double on the CPU), q', k', v' stored
    // once in dt; the backward's logit-scale sums of f32 values on both, its bias sums those of
    // dqkv as stored on the GPU (its roundings, random signs). 200 rows: a ragged last block of
    // pairs. The last head's logit scale is clamped: no gradient on both.
    {"cosine_qk_forward",
     "q/v bias, 200 rows, 3 heads of 32",
     run_cosine_qk_forward,
     &(const CosineCase){200, 3, 32, true},
     {{"qkv", ROUNDED}, {"norms", FP32}}},
    {"cosine_qk_forward",
     "no bias, 200 rows, 24 heads of 32",
     run_cosine_qk_forward,
     &(const CosineCase){200, 24, 32, false},
     {{"qkv", ROUNDED}, {"norms", FP32}}},
    {"cosine_qk_backward",
     "q/v bias, 200 rows, 3 heads of 32",
     run_cosine_qk_backward,
     &(const CosineCase){200, 3, 32, true},
     {{"dqkv", ROUNDED}, {"dq_bias", ROUNDED}, {"dv_bias", ROUNDED}, {"dlogit_scale", FP32}}},
    {"cosine_qk_backward",
     "no bias, 200 rows, 24 heads of 32",
     run_cosine_qk_backward,
     &(const CosineCase){200, 24, 32, false},
     {{"dqkv", ROUNDED}, {"dlogit_scale", FP32}}},
    // head_dim 12: in bf16 / fp16 not a whole 16-byte vector (a warp per pair, one element a
    // lane), in f32 3 vectors over 4 lanes (one idle).
    {"cosine_qk_forward",
     "q/v bias, 200 rows, 4 heads of 12",
     run_cosine_qk_forward,
     &(const CosineCase){200, 4, 12, true},
     {{"qkv", ROUNDED}, {"norms", FP32}}},
    {"cosine_qk_backward",
     "q/v bias, 200 rows, 4 heads of 12",
     run_cosine_qk_backward,
     &(const CosineCase){200, 4, 12, true},
     {{"dqkv", ROUNDED}, {"dq_bias", ROUNDED}, {"dv_bias", ROUNDED}, {"dlogit_scale", FP32}}},
    {"cosine_qk_backward",
     "q/v bias, 2500 rows (235 blocks of 256 pairs, the last one partial), 24 heads of 32",
     run_cosine_qk_backward,
     &(const CosineCase){2500, 24, 32, true},
     {{"dqkv", ROUNDED}, {"dq_bias", ROUNDED}, {"dv_bias", ROUNDED}, {"dlogit_scale", FP32}}},
    // The continuous position bias: f32 in every precision, the same double sums on both.
    {"cpb_forward",
     "window 8 (T=225), 3 heads",
     run_cpb_forward,
     &(const CpbCase){8, 3},
     {{"table", FP32}, {"hidden", FP32}}},
    {"cpb_forward",
     "window 16 (T=961), 32 heads",
     run_cpb_forward,
     &(const CpbCase){16, 32},
     {{"table", FP32}, {"hidden", FP32}}},
    {"cpb_backward",
     "window 8 (T=225), 3 heads",
     run_cpb_backward,
     &(const CpbCase){8, 3},
     {{"dw1", FP32}, {"db1", FP32}, {"dw2", FP32}}},
    {"cpb_backward",
     "window 16 (T=961), 32 heads",
     run_cpb_backward,
     &(const CpbCase){16, 32},
     {{"dw1", FP32}, {"db1", FP32}, {"dw2", FP32}}},
    // The pool sums in double on both, the linear is fp32 with fp32 weights in every precision;
    // dtokens (d(pooled) / L) rounded once.
    {"head_forward",
     "B=4, 16 tokens, C=64, K=10",
     run_head_forward,
     &(const HeadCase){4, 16, 64, 10},
     {{"logits", FP32}, {"pooled", FP32}}},
    {"head_backward",
     "B=4, 16 tokens, C=64, K=10",
     run_head_backward,
     &(const HeadCase){4, 16, 64, 10},
     {{"dtokens", ROUNDED}, {"dweight", FP32}, {"dbias", FP32}}},

    // Rows in double on both; the counts and the fields the op does not own exact.
    {"train_loss",
     "hard labels, smoothing 0.1, loss scale 1024, B=8 K=10",
     run_train_loss,
     &(const LossCase){8, 10, false, 0.1f, 1024.0f, 0},
     {{"dlogits", FP32},
      {"loss_sum", FP32},
      {"loss_steps, bad_losses", EXACT},
      {"the state the loss does not own", EXACT}}},
    {"train_loss",
     "soft targets (mixup), loss scale 1, B=8 K=10",
     run_train_loss,
     &(const LossCase){8, 10, true, 0.1f, 1.0f, 0},
     {{"dlogits", FP32},
      {"loss_sum", FP32},
      {"loss_steps, bad_losses", EXACT},
      {"the state the loss does not own", EXACT}}},
    {"train_loss",
     "a micro-batch of 6 of a batch of 18 (train.accum_steps 3), loss scale 8, K=10",
     run_train_loss,
     &(const LossCase){6, 10, false, 0.1f, 8.0f, 18},
     {{"dlogits", FP32},
      {"loss_sum", FP32},
      {"loss_steps, bad_losses", EXACT},
      {"the state the loss does not own", EXACT}}},
    {"eval_metrics",
     "ties everywhere, B=32 K=10",
     run_eval_metrics,
     &(const LossCase){.B = 32, .K = 10},
     {{"loss_sum", FP32}, {"top1, top5, count", EXACT}}},

    // The moments in fp32 on both (an fma's rounding apart); the decisions exact; the skipped
    // step leaves everything bitwise as it was.
    {"optimizer_step",
     "AdamW, clip active, dynamic loss scale 1024 (doubles)",
     run_optimizer_step,
     &(const OptimCase){.clip = true, .dynamic_scale = true, .loss_scale = 1024.0f},
     {{"params", ADAMW},
      {"m", FP32},
      {"v", FP32},
      {"adam_steps, skipped, skipped_run, loss_scale, good_steps", EXACT},
      {"grad_norm", FP32},
      {"compute copy: elements not the rounded params", EXACT}}},
    {"optimizer_step",
     "AdamW, no clip, loss scale 1",
     run_optimizer_step,
     &(const OptimCase){.loss_scale = 1.0f},
     {{"params", ADAMW},
      {"m", FP32},
      {"v", FP32},
      {"adam_steps, skipped, skipped_run, loss_scale, good_steps", EXACT},
      {"grad_norm", FP32},
      {"compute copy: elements not the rounded params", EXACT}}},
    {"optimizer_step",
     "an infinite gradient: skipped, the dynamic scale halves",
     run_optimizer_step,
     &(const OptimCase){.dynamic_scale = true, .inf_grad = true, .loss_scale = 1024.0f},
     {{"params", EXACT},
      {"m", EXACT},
      {"v", EXACT},
      {"adam_steps, skipped, skipped_run, loss_scale, good_steps", EXACT},
      {"grad_norm is finite", EXACT},
      {"compute copy: elements not the rounded params", EXACT}}},

    // The same fma per element from the same float weight on both (the decay is a double pow,
    // glibc's on the CPU and CUDA's on the GPU, within an ulp of each other in double, far below
    // the rounding of 1 - decay to float): bitwise.
    {"ema_update",
     "warmup, 3rd update: decay 1 - 3^(-2/3), lerp weight 0.48 (the self + w d form)",
     run_ema_update,
     &(const EmaCase){{0.9, true}, 3, false},
     {{"ema", EXACT}}},
    {"ema_update",
     "warmup, 2nd update: lerp weight 0.63 (the end - (1 - w) d form)",
     run_ema_update,
     &(const EmaCase){{0.9, true}, 2, false},
     {{"ema", EXACT}}},
    {"ema_update",
     "decay 0.9998, update 100, no warmup",
     run_ema_update,
     &(const EmaCase){{0.9998, false}, 100, false},
     {{"ema", EXACT}}},
    {"ema_update",
     "the first update: a copy of the weights",
     run_ema_update,
     &(const EmaCase){{0.9998, false}, 1, false},
     {{"ema", EXACT}}},
    {"ema_update",
     "after a skipped step: unchanged",
     run_ema_update,
     &(const EmaCase){{0.9, true}, 5, true},
     {{"ema", EXACT}}},
    {"weights_swap",
     "n = 1027 (a ragged tail)",
     run_weights_swap,
     &(const int64_t){1027},
     {{"a", EXACT}, {"b", EXACT}}},
};
#define NUM_ROWS ((int)(sizeof rows / sizeof rows[0]))

// Scratch for the largest operand of any row (a backend aborts naming the op when one outgrows
// it): the CPU composes its fused ops in 2 * max_elements floats; the CUDA backend sizes its bias
// gradients' partials by max_rows x max_width, the attention backward's by the window and the
// heads, the cosine q, k backward's by the rows, the width and the heads (3C = 2304 at 24 heads
// of 32), the optimizer's by the parameters.
static BackendNeeds row_needs(void) {
  return (BackendNeeds){.max_elements = 2 * 12 * 12 * 192,  // 2 images of 12 x 12 at C = 192
                        .max_rows = 2500,
                        .max_width = 3 * 768,
                        .max_batch = 64,
                        .num_params = opt_floats(),
                        .max_window_tokens = 16,
                        .max_heads = 24};
}

// ---- the driver ---------------------------------------------------------------------------------

static void run_on(OpRun *r, Backend *be, DType dt, uint64_t seed, const OpRow *row) {
  *r = (OpRun){.be = be, .dt = dt, .rng = {.state = seed}};
  row->run(r, row->arg);
  run_release(r);
}

static const Output *find_output(const OpRun *r, const char *name) {
  for (int i = 0; i < r->num_out; i++)
    if (strcmp(r->out[i].name, name) == 0) return &r->out[i];
  return NULL;
}

static bool listed(const OpRow *row, const char *name) {
  for (const OutputSpec *s = row->outputs; s->name; s++)
    if (strcmp(s->name, name) == 0) return true;
  return false;
}

// One output of the CUDA run (got) against the CPU's (want): its error into *err, what went
// wrong (if anything) into why.
static bool compare_output(const OutputSpec *spec, DType dt, const char *gpu, const Output *want,
                           const Output *got, double *err, char *why, size_t size) {
  *err = INFINITY;
  if (!want || want->absent || !got) {
    snprintf(why, size, "not produced by the %s run", want && !want->absent ? gpu : "cpu");
    return false;
  }
  if (want->n != got->n) {
    snprintf(why, size, "%lld values from the cpu, %lld from %s", (long long)want->n,
             (long long)got->n, gpu);
    return false;
  }
  const int64_t n = want->n;
  float *ref = test_copy_floats(want->values, n);
  if (spec->error == EXACT_ROUNDED) test_round_all(dt, ref, n);
  int64_t worst = 0, differ = 0;
  *err = test_rel_err_worst(got->values, ref, want->init, n, &worst);
  for (int64_t i = 0; i < n; i++) differ += memcmp(&got->values[i], &ref[i], sizeof(float)) != 0;
  const double tol = tolerance(spec->error, dt);
  bool ok = isfinite(*err) && (is_exact(spec->error) ? differ == 0 : *err <= tol);
  if (!ok)
    snprintf(why, size, "%s[%lld]: %s %.9g, cpu %.9g%s; %lld of %lld values differ",
             !isfinite(*err) ? "not finite at " : "worst ", (long long)worst, gpu,
             (double)got->values[worst], (double)ref[worst],
             spec->error == EXACT_ROUNDED ? " (rounded)" : "", (long long)differ, (long long)n);
  free(ref);
  return ok;
}

static void check_row(const OpRow *row, BackendPair *p, uint64_t seed) {
  const DType dt = p->gpu.act;
  const char *gpu = p->gpu.ops->name;
  OpRun want, got;
  run_on(&want, &p->cpu, dt, seed, row);
  run_on(&got, &p->gpu, dt, seed, row);
  bool ok = true;
  double max_err = 0;
  char line[2048], failures[4096];
  int len = 0, flen = 0;
  for (const OutputSpec *s = row->outputs; s->name; s++) {
    const Output *w = find_output(&want, s->name), *g = find_output(&got, s->name);
    // A tensor the GPU does not store has nothing to compare; the CPU, the spec, stores all.
    if (g && g->absent && w && !w->absent) {
      len += snprintf(line + len, sizeof line - len, " | %s: %s", s->name, g->absent);
      if (len >= (int)sizeof line) len = sizeof line - 1;
      continue;
    }
    double err;
    char why[512];
    bool out_ok = compare_output(s, dt, gpu, w, g, &err, why, sizeof why);
    ok = ok && out_ok;
    if (err > max_err || !isfinite(err)) max_err = err;
    if (is_exact(s->error))
      len += snprintf(line + len, sizeof line - len, " | %s %.1e (exact)", s->name, err);
    else
      len += snprintf(line + len, sizeof line - len, " | %s %.1e (tol %.1e)", s->name, err,
                      tolerance(s->error, dt));
    if (!out_ok)
      flen += snprintf(failures + flen, sizeof failures - flen, "\n     %s: %s", s->name, why);
    if (len >= (int)sizeof line) len = sizeof line - 1;
    if (flen >= (int)sizeof failures) flen = sizeof failures - 1;
  }
  // An output the run read back that the row does not list: the row is out of date.
  for (int i = 0; i < got.num_out; i++)
    if (!listed(row, got.out[i].name)) {
      ok = false;
      flen += snprintf(failures + flen, sizeof failures - flen,
                       "\n     %s: read back but not in the row's outputs", got.out[i].name);
      if (flen >= (int)sizeof failures) flen = sizeof failures - 1;
    }
  printf("%s [%s] %s: %s: max rel_err %.2e%s%s\n", ok ? "PASS" : "FAIL", p->precision, row->op,
         row->what, max_err, len ? line : "", flen ? failures : "");
  fflush(stdout);
  if (ok)
    test_stats.passed++;
  else
    test_stats.failed++;
  outputs_free(&want);
  outputs_free(&got);
}
#endif

int main(void) {
  GPU_TEST_MAIN_BEGIN();
#ifdef SWIN_HAVE_CUDA
  const BackendNeeds needs = row_needs();
  for (int pi = 0; pi < GPU_TEST_PRECISIONS; pi++) {
    BackendPair p;
    backend_pair_create(&p, gpu_test_precisions[pi], &needs);
    for (int i = 0; i < NUM_ROWS; i++)
      check_row(&rows[i], &p, 0x6f7073ull + 7919ull * (uint64_t)i + 104729ull * (uint64_t)pi);
    backend_pair_destroy(&p);
  }
#endif
  return test_finish();
}
