// test_gpu_attention.c: the CUDA backend's window attention (attention_forward/backward) against
// the CPU backend's, in fp32, bf16 and fp16: 7x7 windows (N = 49, C = 96, 3 heads) shifted (the
// mask of attention_mask_build) and not, 4x4 windows (N = 16, C = 64, 2 heads), a rectangular 2x4
// window shifted along both sides, each with several windows per image and 2 images, 64
// windows per image with 8 and 12 heads (1 image), and 8x8 windows (N = 64) with head_dim 64;
// windows past one 64-token tile (the flash kernels): 12x12 (N = 144) with head_dim 32, 64 and 48,
// shifted and not, 64 windows per image, 12x7, 9x9 (N odd), 10x10, 16x16 and 24x24 (N = 576);
// Swin V2's scale 1 (its q carries the logit scale) on 8x8 and 16x16 windows, elsewhere V1's
// head_dim^-0.5.
// The backward starts from each backend's own forward (its `saved`, which the backward may
// overwrite, is put back before each run), dtable and dqkv_bias (dqkv's column sums: the qkv
// layer's bias gradient) accumulate onto random values, and the CUDA backward runs twice and
// must give the same bits.
#include "tests/util/test_gpu_util.h"

#ifdef SWIN_HAVE_CUDA
#include "kernels/attention.h"
#include "kernels/gemm.h"
#include "kernels/window.h"

typedef struct {
  const char *name;
  int B, H, W;  // images and map
  int wh, ww;   // window
  int sh, sw;   // shift (0, 0: no mask)
  int C, heads;
  float scale;  // of q k^T; 0: attention_head_dim_scale(C / heads), Swin V1's
} AttnShape;

static const AttnShape shapes[] = {
    {"7x7 windows (N=49), C=96, 3 heads", 2, 14, 14, 7, 7, 0, 0, 96, 3, 0},
    {"7x7 windows, shifted (mask)", 2, 14, 14, 7, 7, 3, 3, 96, 3, 0},
    {"4x4 windows (N=16), C=64, 2 heads, shifted", 2, 8, 8, 4, 4, 2, 2, 64, 2, 0},
    {"4x4 windows, unshifted", 2, 8, 8, 4, 4, 0, 0, 64, 2, 0},
    {"2x4 windows (rectangular), C=32, 2 heads, shifted", 2, 4, 8, 2, 4, 1, 2, 32, 2, 0},
    // 64 windows per image and 8 heads: the tensor-core backward's window groups (396 / 8 = 49)
    // are not a multiple of the 64 window types, so its blocks meet several masks
    {"7x7 windows, shifted, 8x8 windows per image, C=256, 8 heads", 1, 56, 56, 7, 7, 3, 3, 256, 8,
     0},
    // The forward's window groups (660 / 12 = 55) are below the 64 window types as well
    {"7x7 windows, shifted, 8x8 windows per image, C=384, 12 heads", 1, 56, 56, 7, 7, 3, 3, 384, 12,
     0},
    // 64 tokens: the tensor-core kernels' 8-tile key rows; head_dim 64
    {"8x8 windows (N=64), C=128, 2 heads, shifted", 2, 16, 16, 8, 8, 4, 4, 128, 2, 0},
    // More than 64 tokens: the flash kernels, keys and queries in tiles (tensor cores: of 48
    // where that pads less, else 64; SIMT: 64): 144 = 3 x 48, 84 = 1.75 x 48, 81 = 1.69 x 48
    // with N odd (no paired bias loads), 100 = 1.56 x 64
    {"12x12 windows (N=144), C=128, 4 heads, shifted", 2, 24, 24, 12, 12, 6, 6, 128, 4, 0},
    {"12x12 windows, C=256, 4 heads (head_dim 64)", 2, 24, 24, 12, 12, 0, 0, 256, 4, 0},
    {"12x7 windows (N=84, rectangular), C=96, 3 heads, shifted", 2, 24, 14, 12, 7, 6, 3, 96, 3, 0},
    {"9x9 windows (N=81, odd), C=64, 2 heads, shifted", 2, 18, 18, 9, 9, 4, 4, 64, 2, 0},
    {"10x10 windows (N=100), C=64, 2 heads, shifted", 2, 20, 20, 10, 10, 5, 5, 64, 2, 0},
    // 64 windows per image: the dk/dv blocks each sum a strided set of several windows
    {"12x12 windows, shifted, 8x8 windows per image, C=128, 4 heads", 1, 96, 96, 12, 12, 6, 6, 128,
     4, 0},
    {"16x16 windows (N=256), C=64, 2 heads, shifted", 1, 32, 32, 16, 16, 8, 8, 64, 2, 0},
    {"24x24 windows (N=576), C=128, 2 heads (head_dim 64), shifted", 1, 48, 48, 24, 24, 12, 12, 128,
     2, 0},
    // head_dim 48: no tensor-core kernel, so bf16 and f16 take the flash SIMT ones too
    {"12x12 windows, C=96, 2 heads (head_dim 48), shifted", 1, 24, 24, 12, 12, 6, 6, 96, 2, 0},
    // Swin V2 (swinv2_*_window8 / window16): scale 1, the tensor-core and the flash kernels
    {"V2: 8x8 windows (N=64), C=96, 3 heads, shifted, scale 1", 2, 16, 16, 8, 8, 4, 4, 96, 3, 1.0f},
    {"V2: 16x16 windows (N=256), C=96, 3 heads, shifted, scale 1", 1, 32, 32, 16, 16, 8, 8, 96, 3,
     1.0f},
};
#define NUM_SHAPES ((int)(sizeof shapes / sizeof shapes[0]))

// The geometry the model derives from a shape (src/model/model.c build_geometry).
typedef struct {
  int N, nW, BW, rows;  // tokens per window, windows per image, windows, bias-table rows
  float scale;          // of q k^T
  int64_t qkv, out;     // elements of qkv (BW, N, 3C) and out (BW, N, C)
} AttnGeom;

static AttnGeom geom_of(const AttnShape *s) {
  AttnGeom g;
  g.N = s->wh * s->ww;
  g.nW = (s->H / s->wh) * (s->W / s->ww);
  g.BW = s->B * g.nW;
  g.rows = (2 * s->wh - 1) * (2 * s->ww - 1);
  g.scale = s->scale > 0 ? s->scale : attention_head_dim_scale(s->C / s->heads);
  g.out = (int64_t)g.BW * g.N * s->C;
  g.qkv = 3 * g.out;
  return g;
}

// Host inputs of one case.
typedef struct {
  float *qkv, *table, *mask, *dout, *dtable0, *dqkv_bias0;  // mask NULL when unshifted
  int *index;
} AttnIn;

static void inputs_make(AttnIn *in, TestRng *rng, DType dt, const AttnShape *s) {
  AttnGeom g = geom_of(s);
  // q.k over 32 channels of U(-1.5, 1.5), scaled by 32^-0.5: scores of spread ~1, so the softmax
  // is neither flat nor one-hot; at another scale q and k smaller by sqrt(32^-0.5 / scale).
  float amp = 1.5f * sqrtf(attention_head_dim_scale(s->C / s->heads) / g.scale);
  in->qkv = test_random_act(rng, dt, g.qkv, -amp, amp);
  in->table = test_alloc_floats((int64_t)g.rows * s->heads);
  test_fill_uniform(rng, in->table, (int64_t)g.rows * s->heads, -1.0f, 1.0f);
  in->dtable0 = test_alloc_floats((int64_t)g.rows * s->heads);
  test_fill_uniform(rng, in->dtable0, (int64_t)g.rows * s->heads, -1.0f, 1.0f);
  in->dout = test_random_act(rng, dt, g.out, -1.0f, 1.0f);
  in->dqkv_bias0 = test_alloc_floats(3 * s->C);
  test_fill_uniform(rng, in->dqkv_bias0, 3 * s->C, -1.0f, 1.0f);
  in->index = (int *)malloc_check(sizeof(int) * (size_t)g.N * g.N);
  relative_position_index(in->index, s->wh, s->ww);
  in->mask = NULL;
  if (s->sh || s->sw) {
    in->mask = test_alloc_floats((int64_t)g.nW * g.N * g.N);
    attention_mask_build(in->mask, s->H, s->W, s->wh, s->ww, s->sh, s->sw);
  }
}
static void inputs_free(AttnIn *in) {
  free(in->qkv);
  free(in->table);
  free(in->dtable0);
  free(in->dout);
  free(in->dqkv_bias0);
  free(in->index);
  free(in->mask);
}

// Results of one backend: the forward's out and saved, the backward's dqkv, dqkv_bias, dtable.
typedef struct {
  float *out, *saved, *dqkv, *dqkv_bias, *dtable;
  int64_t saved_floats;
} AttnOut;

static void outputs_alloc(AttnOut *o, Backend *be, const AttnShape *s) {
  AttnGeom g = geom_of(s);
  o->saved_floats = be->ops->attention_saved_floats(be, g.BW, g.N, s->C, s->heads);
  o->out = test_alloc_floats(g.out);
  o->saved = test_alloc_floats(o->saved_floats);
  o->dqkv = test_alloc_floats(g.qkv);
  o->dqkv_bias = test_alloc_floats(3 * s->C);
  o->dtable = test_alloc_floats((int64_t)g.rows * s->heads);
}
static void outputs_free(AttnOut *o) {
  free(o->out);
  free(o->saved);
  free(o->dqkv);
  free(o->dqkv_bias);
  free(o->dtable);
}

// The forward on be (with_mask false drops the mask: the negative control).
static void forward_on(Backend *be, const AttnShape *s, const AttnIn *in, bool with_mask,
                       AttnOut *o) {
  AttnGeom g = geom_of(s);
  void *qkv = be_copy_act(be, in->qkv, g.qkv);
  float *table = be_copy_f32(be, in->table, (int64_t)g.rows * s->heads);
  int *index = (int *)be_copy_bytes(be, in->index, sizeof(int) * (size_t)g.N * g.N);
  float *mask = in->mask && with_mask ? be_copy_f32(be, in->mask, (int64_t)g.nW * g.N * g.N) : NULL;
  void *out = be_poisoned_act(be, g.out);
  float *saved = be_poisoned_f32(be, o->saved_floats);
  be->ops->attention_forward(be, out, saved, qkv, table, index, mask, g.BW, g.nW, g.N, s->C,
                             s->heads, g.scale);
  be_read_act(be, o->out, out, g.out);
  be_read_f32(be, o->saved, saved, o->saved_floats);
  void *bufs[] = {qkv, table, index, mask, out, saved};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be_free(be, bufs[i]);
}

// The backward on be from o->saved (this backend's forward), dtable starting from dtable0.
static void backward_on(Backend *be, const AttnShape *s, const AttnIn *in, AttnOut *o) {
  AttnGeom g = geom_of(s);
  void *qkv = be_copy_act(be, in->qkv, g.qkv), *dout = be_copy_act(be, in->dout, g.out);
  float *table = be_copy_f32(be, in->table, (int64_t)g.rows * s->heads);
  int *index = (int *)be_copy_bytes(be, in->index, sizeof(int) * (size_t)g.N * g.N);
  float *mask = in->mask ? be_copy_f32(be, in->mask, (int64_t)g.nW * g.N * g.N) : NULL;
  void *out = be_copy_act(be, o->out, g.out);
  float *saved = be_copy_f32(be, o->saved, o->saved_floats);
  float *dtable = be_copy_f32(be, in->dtable0, (int64_t)g.rows * s->heads);
  float *dqkv_bias = be_copy_f32(be, in->dqkv_bias0, 3 * s->C);
  void *dqkv = be_poisoned_act(be, g.qkv);
  be->ops->attention_backward(be, dqkv, dqkv_bias, dtable, dout, qkv, out, table, index, mask,
                              saved, g.BW, g.nW, g.N, s->C, s->heads, g.scale);
  be_read_act(be, o->dqkv, dqkv, g.qkv);
  be_read_f32(be, o->dqkv_bias, dqkv_bias, 3 * s->C);
  be_read_f32(be, o->dtable, dtable, (int64_t)g.rows * s->heads);
  void *bufs[] = {qkv, dout, table, index, mask, out, saved, dtable, dqkv_bias, dqkv};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be_free(be, bufs[i]);
}

static void describe(char *ctx, size_t size, const char *op, const char *prec, const AttnShape *s) {
  AttnGeom g = geom_of(s);
  snprintf(ctx, size, "%s [%s] %s: B=%d map %dx%d window %dx%d shift %d,%d BW=%d scale %g", op,
           prec, s->name, s->B, s->H, s->W, s->wh, s->ww, s->sh, s->sw, g.BW, g.scale);
}

static void check_shape(BackendPair *p, const AttnShape *s, TestRng *rng) {
  const DType dt = p->gpu.act;
  AttnGeom g = geom_of(s);
  char ctx[512];
  AttnIn in;
  inputs_make(&in, rng, dt, s);
  AttnOut want, got, again;
  outputs_alloc(&want, &p->cpu, s);
  outputs_alloc(&got, &p->gpu, s);
  outputs_alloc(&again, &p->gpu, s);

  // Forward: the same fp32 scores and softmax (expf vs the CPU's fast_expf, 2e-7), out rounded
  // once to dt, and with bf16/f16 (the tensor-core path) P rounded to dt before P v as well:
  // two roundings. saved is P (BW, heads, N, N) in fp32 on both backends' f32 paths; the
  // tensor-core path keeps the log-sum-exp instead (then not compared).
  const bool tc = dt != DTYPE_F32;
  const double tol_out = tc ? tol_chained(dt) : tol_stored(dt);
  // dtable: fp32 sums of fp32 dS on both sides, also on the tensor-core path (which recomputes
  // the scores as (q k) * scale instead of the CPU's (q * scale) k): measured 1.4e-7 to 2.7e-7.
  // The flash kernels (N > 64) form dS = P (dP - delta) with delta = rowsum(dO * out) from out
  // as stored in dt (the CPU: rowsum(P * dP) in f32), so with bf16/f16 each dS carries out's
  // rounding, u of delta's scale: measured up to 5.6e-4 (bf16) and 6.4e-5 (f16), within
  // tol_stored; in fp32 out is exact to f32 and TOL_F32 holds.
  const bool delta_rounded = tc && g.N > 64;
  const double tol_table = delta_rounded ? tol_stored(dt) : TOL_F32;
  describe(ctx, sizeof ctx, "attention_forward", p->precision, s);
  forward_on(&p->cpu, s, &in, true, &want);
  forward_on(&p->gpu, s, &in, true, &got);
  test_compare(ctx, "out", got.out, want.out, g.out, tol_out);
  if (got.saved_floats == want.saved_floats)
    test_compare(ctx, "saved softmax P", got.saved, want.saved, got.saved_floats, TOL_F32);
  else
    printf("note %s: saved sizes differ (cpu %lld, cuda %lld floats): not compared\n", ctx,
           (long long)want.saved_floats, (long long)got.saved_floats);

  // Backward, twice on the GPU from the same saved: dqkv in fp32 from the same inputs (dS's
  // rowsum cancels a little), rounded once to dt; dtable a fixed-order fp32/double sum of dS.
  describe(ctx, sizeof ctx, "attention_backward", p->precision, s);
  memcpy(again.saved, got.saved, sizeof(float) * (size_t)got.saved_floats);
  memcpy(again.out, got.out, sizeof(float) * (size_t)g.out);
  backward_on(&p->cpu, s, &in, &want);
  backward_on(&p->gpu, s, &in, &got);
  backward_on(&p->gpu, s, &in, &again);
  int64_t ntab = (int64_t)g.rows * s->heads;
  const double tol_dqkv = tc ? tol_chained(dt) : tol_stored(dt);
  test_compare(ctx, "dqkv", got.dqkv, want.dqkv, g.qkv, tol_dqkv);
  test_compare_increment(ctx, "dtable", got.dtable, want.dtable, in.dtable0, ntab, tol_table);
  test_same_bits(ctx, "dqkv, two GPU runs", got.dqkv, again.dqkv, g.qkv);
  test_same_bits(ctx, "dtable, two GPU runs", got.dtable, again.dtable, ntab);
  // dqkv_bias: dqkv's column sums, so dqkv's differences from the CPU (roundings of random
  // sign) reach them as they reach dqkv. Against the GPU's own dqkv as read back (summed here in
  // double): the SIMT path sums the stored values (only the fp32 summation order differs); the
  // tensor-core kernel sums its f32 values before their rounding to dt, so there the sums of
  // the stored values differ by the roundings' sum, within u of each sum's scale (random signs).
  const int nb = 3 * s->C;
  test_compare_increment(ctx, "dqkv_bias", got.dqkv_bias, want.dqkv_bias, in.dqkv_bias0, nb,
                         tol_dqkv);
  float *own = test_copy_floats(in.dqkv_bias0, nb);
  column_sums_cpu(own, got.dqkv, (int64_t)g.BW * g.N, nb);
  test_compare_increment(ctx, "dqkv_bias vs the sums of the GPU's own dqkv", got.dqkv_bias, own,
                         in.dqkv_bias0, nb, tc ? tol_stored(dt) : TOL_F32);
  test_same_bits(ctx, "dqkv_bias, two GPU runs", got.dqkv_bias, again.dqkv_bias, nb);
  free(own);

  inputs_free(&in);
  outputs_free(&want);
  outputs_free(&got);
  outputs_free(&again);
}

// Negative control: a shifted case where the GPU is not given the mask.
static void negative_control(BackendPair *p, const AttnShape *s, TestRng *rng) {
  char ctx[512];
  describe(ctx, sizeof ctx, "negative control: attention_forward, GPU without the mask",
           p->precision, s);
  AttnIn in;
  inputs_make(&in, rng, p->gpu.act, s);
  AttnOut want, got;
  outputs_alloc(&want, &p->cpu, s);
  outputs_alloc(&got, &p->gpu, s);
  forward_on(&p->cpu, s, &in, true, &want);
  forward_on(&p->gpu, s, &in, false, &got);
  test_must_differ(ctx, "out", got.out, want.out, geom_of(s).out, tol_stored(p->gpu.act));
  inputs_free(&in);
  outputs_free(&want);
  outputs_free(&got);
}
#endif

int main(void) {
  GPU_TEST_MAIN_BEGIN();
#ifdef SWIN_HAVE_CUDA
  TestRng rng = {.state = 0xa77e7710};
  // The tensor-core backward's scratch is reserved by every backend (src/model/backend_cuda.cu);
  // the qkv bias gradient's partials need the rows and width of dqkv.
  BackendNeeds needs = {.max_elements = 1, .max_rows = 1, .max_width = 1, .max_batch = 1};
  for (int si = 0; si < NUM_SHAPES; si++) {
    AttnGeom g = geom_of(&shapes[si]);
    int64_t rows = (int64_t)g.BW * g.N;
    if (rows > needs.max_rows) needs.max_rows = rows;
    if (3 * shapes[si].C > needs.max_width) needs.max_width = 3 * shapes[si].C;
    if (g.N > needs.max_window_tokens) needs.max_window_tokens = g.N;
    if (shapes[si].heads > needs.max_heads) needs.max_heads = shapes[si].heads;
  }
  for (int pi = 0; pi < GPU_TEST_PRECISIONS; pi++) {
    BackendPair p;
    backend_pair_create(&p, gpu_test_precisions[pi], &needs);
    for (int si = 0; si < NUM_SHAPES; si++) check_shape(&p, &shapes[si], &rng);
    if (pi == 0) negative_control(&p, &shapes[1], &rng);
    backend_pair_destroy(&p);
  }
#endif
  return test_finish();
}
