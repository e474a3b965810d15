// test_gpu_optim.c: the CUDA backend's optimizer_step and ema_update against the CPU backend's
// on a fake flat parameter buffer laid out as the model lays out its own (tensors at 16-float
// boundaries, with and without weight decay, each with its own layer-decay lr scale, cut into
// chunks as model_adamw_chunks cuts them, some chunks with a count that is not a multiple of 4,
// gaps between tensors that no chunk covers), with the moving average of the weights updated
// after every step (train.ema_decay; warmup in the dynamic-scale run).
//
// Five steps from zero moments, so the bias corrections change every step: clean without
// clipping, clean with the clip active, a gradient with an inf (skipped: parameters, moments and
// compute copy and the average bitwise unchanged, skipped and skipped_run counted, adam_steps not
// advanced), clean
// with the clip inactive, clean again. Run once with a fixed loss scale of 1 and once with a
// dynamic scale from 1024 (window 2: the scale doubles after steps 2 and 5, halves at the skip);
// gradients are handed in multiplied by the current scale, as the backward produces them. In fp32
// the compute copy is NULL; in bf16 and fp16 it must equal the rounding of the updated parameters
// bit for bit. The OptimState fields are compared after every step, and every GPU step runs
// twice from the same state and must give the same bits.
#include "tests/util/test_gpu_util.h"

#ifdef SWIN_HAVE_CUDA
#include "src/model/model.h"

// Fake tensors: sizes chosen for ragged chunk tails (count % 4 = 1, 2, 3), a tensor of exactly one
// chunk, one of several, a single value; lr scales as train.layer_decay 0.8 gives them at several
// depths (and 1, the head's), different between neighbours.
typedef struct {
  int64_t numel;
  bool decay;
  float lr_scale;
} FakeParam;

static const FakeParam layout[] = {
    {2 * MODEL_ADAMW_CHUNK + 1000, true, 0.32768f},  // three chunks; 0.8^5
    {37, false, 0.4096f},
    {4 * 96 + 3, false, 0.4096f},
    {MODEL_ADAMW_CHUNK, true, 0.512f},
    {4099, true, 0.64f},
    {1, false, 0.8f},
    {5002, false, 1.0f},
};
#define NUM_FAKE ((int)(sizeof layout / sizeof layout[0]))
#define WEIGHT_DECAY 0.05f
#define STEPS 5
#define SKIP_STEP 2  // 0-based: the step with an inf gradient

// The flat buffer's length, and the chunk table model_adamw_chunks would make (NULL: count).
static int64_t layout_floats(void) {
  int64_t off = 0;
  for (int i = 0; i < NUM_FAKE; i++)
    off += (layout[i].numel + MODEL_PARAM_ALIGN - 1) / MODEL_PARAM_ALIGN * MODEL_PARAM_ALIGN;
  return off;
}
static int layout_chunks(AdamWChunk *chunks, bool *in_chunk) {
  int n = 0;
  int64_t base = 0;
  for (int i = 0; i < NUM_FAKE; i++) {
    for (int64_t off = 0; off < layout[i].numel; off += MODEL_ADAMW_CHUNK, n++) {
      int64_t left = layout[i].numel - off;
      if (!chunks) continue;
      chunks[n] =
          (AdamWChunk){.offset = base + off,
                       .count = (int32_t)(left < MODEL_ADAMW_CHUNK ? left : MODEL_ADAMW_CHUNK),
                       .weight_decay = layout[i].decay ? WEIGHT_DECAY : 0.0f,
                       .lr_scale = layout[i].lr_scale};
      for (int64_t e = 0; e < chunks[n].count; e++) in_chunk[chunks[n].offset + e] = true;
    }
    base += (layout[i].numel + MODEL_PARAM_ALIGN - 1) / MODEL_PARAM_ALIGN * MODEL_PARAM_ALIGN;
  }
  return n;
}

// One backend's optimizer: the buffers live in its memory across the steps.
typedef struct {
  Backend *be;
  int64_t n;
  float *params, *m, *v, *grads;
  float *ema;     // the moving average of params (n), started at params0
  void *compute;  // (n, act), or NULL in fp32
  AdamWChunk *chunks;
  int num_chunks;
  OptimState *state;
  StepParams *step_params;  // the learning rate of the next update
} OptSide;

// Host copies of a side's state.
typedef struct {
  float *params, *m, *v, *ema, *compute;  // compute as floats, or NULL
  OptimState state;
} Snapshot;

static void side_create(OptSide *s, Backend *be, const float *params0, const AdamWChunk *chunks,
                        int num_chunks, OptimState state0, bool with_compute) {
  int64_t n = layout_floats();
  float *zeros = test_alloc_floats(n);
  memset(zeros, 0, sizeof(float) * (size_t)n);
  s->be = be;
  s->n = n;
  s->params = be_copy_f32(be, params0, n);
  s->m = be_copy_f32(be, zeros, n);
  s->v = be_copy_f32(be, zeros, n);
  s->grads = be_copy_f32(be, zeros, n);
  s->ema = be_copy_f32(be, params0, n);
  s->compute = NULL;
  if (with_compute) {
    // The compute copy as model_weights_to_backend makes it.
    s->compute = be->ops->alloc(be, dtype_size(be->act) * (size_t)n);
    be->ops->to_compute(be, s->compute, s->params, n);
  }
  s->chunks = (AdamWChunk *)be_copy_bytes(be, chunks, sizeof(AdamWChunk) * (size_t)num_chunks);
  s->num_chunks = num_chunks;
  s->state = (OptimState *)be_copy_bytes(be, &state0, sizeof state0);
  s->step_params = be_step_params(be, 0, 0.0f);
  free(zeros);
}
static void side_destroy(OptSide *s) {
  void *bufs[] = {s->params,  s->m,      s->v,     s->grads,      s->ema,
                  s->compute, s->chunks, s->state, s->step_params};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be_free(s->be, bufs[i]);
}

static void snapshot_alloc(Snapshot *t, int64_t n) {
  t->params = test_alloc_floats(n);
  t->m = test_alloc_floats(n);
  t->v = test_alloc_floats(n);
  t->ema = test_alloc_floats(n);
  t->compute = test_alloc_floats(n);
}
static void snapshot_free(Snapshot *t) {
  free(t->params);
  free(t->m);
  free(t->v);
  free(t->ema);
  free(t->compute);
}
static void side_save(OptSide *s, Snapshot *t) {
  be_read_f32(s->be, t->params, s->params, s->n);
  be_read_f32(s->be, t->m, s->m, s->n);
  be_read_f32(s->be, t->v, s->v, s->n);
  be_read_f32(s->be, t->ema, s->ema, s->n);
  if (s->compute) be_read_act(s->be, t->compute, s->compute, s->n);
  s->be->ops->download(s->be, &t->state, s->state, sizeof t->state);
}
static void side_restore(OptSide *s, const Snapshot *t) {
  Backend *be = s->be;
  be->ops->upload(be, s->params, t->params, sizeof(float) * (size_t)s->n);
  be->ops->upload(be, s->m, t->m, sizeof(float) * (size_t)s->n);
  be->ops->upload(be, s->v, t->v, sizeof(float) * (size_t)s->n);
  be->ops->upload(be, s->ema, t->ema, sizeof(float) * (size_t)s->n);
  if (s->compute) be_write_act(be, s->compute, t->compute, s->n);
  be->ops->upload(be, s->state, &t->state, sizeof t->state);
}
// One update at learning rate lr (in backend memory, where the trainer's update reads it), then
// the average's, as learner_update queues them.
static void side_step(OptSide *s, const float *grads, OptimizerStep hyper, float lr,
                      EmaSettings ema) {
  Backend *be = s->be;
  StepParams at = {.lr = lr};
  be->ops->upload(be, s->grads, grads, sizeof(float) * (size_t)s->n);
  be->ops->upload(be, s->step_params, &at, sizeof at);
  be->ops->optimizer_step(be, s->params, s->compute, s->grads, s->m, s->v, s->n, s->chunks,
                          s->num_chunks, hyper, s->step_params, s->state);
  be->ops->ema_update(be, s->ema, s->params, s->n, ema, s->state);
}

// ---- checks ------------------------------------------------------------------------------------

// AdamW's update is ~lr per element per step; the GPU fuses p * decay - update into one fma
// where the CPU rounds twice, so each step's parameter may differ by an ulp of |p| (1.2e-7 at
// |p| ~ 1) against an update of ~1e-3: 1e-4 per element, less normwise; 1e-3 leaves room and a
// wrong update (a lost bias correction, decay, clip) is O(1e-2) or more.
#define TOL_UPDATE 1e-3
// grad_norm is a double sum of squares in another order: ~1e-16 relative.
#define TOL_NORM 1e-12

// Cumulative updates of both sides from params0. The average is the same lerp on both (bitwise
// for the same inputs: tests/test_gpu_ops.c's ema_update rows), of parameters that differ by
// AdamW's fma: its increment carries theirs, weighted by at most 1, so TOL_UPDATE again.
static void check_params(const char *ctx, const Snapshot *got, const Snapshot *want,
                         const float *params0, int64_t n) {
  test_compare_increment(ctx, "params", got->params, want->params, params0, n, TOL_UPDATE);
  test_compare(ctx, "m", got->m, want->m, n, TOL_F32);
  test_compare(ctx, "v", got->v, want->v, n, TOL_F32);
  test_compare_increment(ctx, "ema", got->ema, want->ema, params0, n, TOL_UPDATE);
}

static void check_state(const char *ctx, const OptimState *g, const OptimState *w) {
  double e = g->grad_norm == w->grad_norm
                 ? 0.0
                 : fabs(g->grad_norm - w->grad_norm) / fmax(fabs(w->grad_norm), 1e-300);
  test_check(e <= TOL_NORM, "%s: grad_norm %.12g vs cpu %.12g (rel %.1e, tol %.0e)", ctx,
             g->grad_norm, w->grad_norm, e, TOL_NORM);
  test_check(g->adam_steps == w->adam_steps && g->skipped == w->skipped &&
                 g->skipped_run == w->skipped_run && g->loss_scale == w->loss_scale &&
                 g->good_steps == w->good_steps && g->loss_sum == w->loss_sum &&
                 g->loss_steps == w->loss_steps && g->bad_losses == w->bad_losses,
             "%s: state adam_steps %lld skipped %lld skipped_run %lld loss_scale %g good_steps %d "
             "(cpu %lld %lld %lld %g %d), loss fields untouched",
             ctx, (long long)g->adam_steps, (long long)g->skipped, (long long)g->skipped_run,
             (double)g->loss_scale, g->good_steps, (long long)w->adam_steps, (long long)w->skipped,
             (long long)w->skipped_run, (double)w->loss_scale, w->good_steps);
}

// What step k must have done to the state, whatever the backends agree on.
static void check_expected_state(const char *ctx, int k, const OptimState *before,
                                 const OptimState *after, const OptimizerStep *h) {
  bool skip = k == SKIP_STEP;
  bool steps_ok = after->adam_steps == before->adam_steps + (skip ? 0 : 1) &&
                  after->skipped == before->skipped + (skip ? 1 : 0) &&
                  after->skipped_run == (skip ? before->skipped_run + 1 : 0);
  float scale = before->loss_scale;
  if (h->dynamic_scale && skip) scale *= 0.5f;
  if (h->dynamic_scale && !skip && before->good_steps + 1 >= h->scale_window) scale *= 2.0f;
  test_check(steps_ok && after->loss_scale == scale,
             "%s: %s: adam_steps %lld -> %lld, skipped %lld -> %lld, skipped_run %lld, "
             "loss_scale %g -> %g (want %g)",
             ctx, skip ? "skipped" : "applied", (long long)before->adam_steps,
             (long long)after->adam_steps, (long long)before->skipped, (long long)after->skipped,
             (long long)after->skipped_run, (double)before->loss_scale, (double)after->loss_scale,
             (double)scale);
}

// ---- one run of STEPS steps --------------------------------------------------------------------

typedef struct {
  const char *name;
  bool dynamic_scale;
  float loss_scale;
  EmaSettings ema;
} RunKind;

static const RunKind runs[] = {
    {"fixed loss scale 1, EMA 0.5", false, 1.0f, {0.5, false}},
    {"dynamic loss scale from 1024, window 2, EMA 0.9 with warmup", true, 1024.0f, {0.9, true}},
};

// Gradients of step k: U(-0.01, 0.01) on the chunks (zero in the gaps, as in the model) times
// the loss scale; an inf at the skip step. The clip: off, active (30% of the norm), -, inactive
// (10x the norm), off.
static void make_grads(TestRng *rng, int k, const bool *in_chunk, int64_t n, float loss_scale,
                       float *grads, float *clip) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; i++) {
    float g = in_chunk[i] ? test_rng_uniform(rng, -0.01f, 0.01f) : 0.0f;
    sum += (double)g * g;
    grads[i] = g * loss_scale;
  }
  if (k == SKIP_STEP) grads[n / 2] = INFINITY;
  double norm = sqrt(sum);
  *clip = k == 1 ? (float)(0.3 * norm) : k == 3 ? (float)(10.0 * norm) : 0.0f;
}

static const char *step_name(int k) {
  static const char *const names[STEPS] = {"no clip", "clip active", "inf gradient",
                                           "clip inactive", "no clip"};
  return names[k];
}

static void run_steps(BackendPair *p, const RunKind *run, TestRng *rng) {
  const DType dt = p->gpu.act;
  const int64_t n = layout_floats();
  bool *in_chunk = (bool *)calloc_check((size_t)n, sizeof(bool));
  int num_chunks = layout_chunks(NULL, NULL);
  AdamWChunk *chunks = (AdamWChunk *)malloc_check(sizeof(AdamWChunk) * (size_t)num_chunks);
  layout_chunks(chunks, in_chunk);
  float *params0 = test_alloc_floats(n), *grads = test_alloc_floats(n);
  test_fill_uniform(rng, params0, n, -1.0f, 1.0f);
  OptimState state0;
  memset(&state0, 0, sizeof state0);
  state0.loss_scale = run->loss_scale;
  OptSide cpu, gpu;
  side_create(&cpu, &p->cpu, params0, chunks, num_chunks, state0, false);
  side_create(&gpu, &p->gpu, params0, chunks, num_chunks, state0, dt != DTYPE_F32);
  Snapshot cb, ca, gb, ga, ga2;  // cpu before/after, gpu before/after/after again
  Snapshot *snaps[] = {&cb, &ca, &gb, &ga, &ga2};
  for (int i = 0; i < 5; i++) snapshot_alloc(snaps[i], n);

  char ctx[512];
  if (gpu.compute) {
    snprintf(ctx, sizeof ctx, "optimizer_step [%s] %s, initial compute copy", p->precision,
             run->name);
    side_save(&gpu, &gb);
    float *rounded = test_copy_floats(params0, n);
    test_round_all(dt, rounded, n);
    test_same_bits(ctx, "to_compute = the rounded parameters", gb.compute, rounded, n);
    free(rounded);
  }
  for (int k = 0; k < STEPS; k++) {
    side_save(&cpu, &cb);
    side_save(&gpu, &gb);
    const float lr = 1e-3f;
    OptimizerStep h = {.beta1 = 0.9f,
                       .beta2 = 0.999f,
                       .eps = 1e-8f,
                       .dynamic_scale = run->dynamic_scale,
                       .scale_window = 2};
    make_grads(rng, k, in_chunk, n, cb.state.loss_scale, grads, &h.clip_grad);
    snprintf(ctx, sizeof ctx, "optimizer_step [%s] %s, step %d (%s)", p->precision, run->name,
             k + 1, step_name(k));
    side_step(&cpu, grads, h, lr, run->ema);
    side_save(&cpu, &ca);
    side_step(&gpu, grads, h, lr, run->ema);
    side_save(&gpu, &ga);
    side_restore(&gpu, &gb);
    side_step(&gpu, grads, h, lr, run->ema);
    side_save(&gpu, &ga2);

    check_params(ctx, &ga, &ca, params0, n);
    check_state(ctx, &ga.state, &ca.state);
    check_expected_state(ctx, k, &gb.state, &ga.state, &h);
    if (k == SKIP_STEP) {
      test_same_bits(ctx, "params unchanged by the skipped step", ga.params, gb.params, n);
      test_same_bits(ctx, "m unchanged", ga.m, gb.m, n);
      test_same_bits(ctx, "v unchanged", ga.v, gb.v, n);
      test_same_bits(ctx, "the average unchanged", ga.ema, gb.ema, n);
    } else if (k == 0) {
      test_same_bits(ctx, "the first update's average = the params", ga.ema, ga.params, n);
    }
    if (gpu.compute) {
      float *rounded = test_copy_floats(ga.params, n);
      test_round_all(dt, rounded, n);
      test_same_bits(ctx, "compute copy = the rounded params", ga.compute, rounded, n);
      free(rounded);
    }
    test_same_bits(ctx, "params, two GPU runs", ga.params, ga2.params, n);
    test_same_bits(ctx, "m, two GPU runs", ga.m, ga2.m, n);
    test_same_bits(ctx, "v, two GPU runs", ga.v, ga2.v, n);
    test_same_bits(ctx, "ema, two GPU runs", ga.ema, ga2.ema, n);
    if (gpu.compute) test_same_bits(ctx, "compute, two GPU runs", ga.compute, ga2.compute, n);
    test_check(memcmp(&ga.state, &ga2.state, sizeof ga.state) == 0,
               "%s: OptimState, two GPU runs bitwise equal", ctx);
  }
  for (int i = 0; i < 5; i++) snapshot_free(snaps[i]);
  side_destroy(&cpu);
  side_destroy(&gpu);
  free(in_chunk);
  free(chunks);
  free(params0);
  free(grads);
}

// Negative control: one fp32 step where the GPU's learning rate is 1% high.
static void negative_control(BackendPair *p, TestRng *rng) {
  const int64_t n = layout_floats();
  bool *in_chunk = (bool *)calloc_check((size_t)n, sizeof(bool));
  int num_chunks = layout_chunks(NULL, NULL);
  AdamWChunk *chunks = (AdamWChunk *)malloc_check(sizeof(AdamWChunk) * (size_t)num_chunks);
  layout_chunks(chunks, in_chunk);
  float *params0 = test_alloc_floats(n), *grads = test_alloc_floats(n), clip;
  test_fill_uniform(rng, params0, n, -1.0f, 1.0f);
  OptimState state0;
  memset(&state0, 0, sizeof state0);
  state0.loss_scale = 1.0f;
  OptSide cpu, gpu;
  side_create(&cpu, &p->cpu, params0, chunks, num_chunks, state0, false);
  side_create(&gpu, &p->gpu, params0, chunks, num_chunks, state0, false);
  make_grads(rng, 0, in_chunk, n, 1.0f, grads, &clip);
  OptimizerStep h = {.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
  EmaSettings ema = {.decay = 0.5};
  side_step(&cpu, grads, h, 1e-3f, ema);
  side_step(&gpu, grads, h, 1e-3f * 1.01f, ema);
  Snapshot c, g;
  snapshot_alloc(&c, n);
  snapshot_alloc(&g, n);
  side_save(&cpu, &c);
  side_save(&gpu, &g);
  test_compare_ex("negative control: optimizer_step [fp32], GPU lr * 1.01", "params", g.params,
                  c.params, params0, n, TOL_UPDATE, true);
  snapshot_free(&c);
  snapshot_free(&g);
  side_destroy(&cpu);
  side_destroy(&gpu);
  free(in_chunk);
  free(chunks);
  free(params0);
  free(grads);
}
#endif

int main(void) {
  GPU_TEST_MAIN_BEGIN();
#ifdef SWIN_HAVE_CUDA
  TestRng rng = {.state = 0xada3};
  BackendNeeds needs = {.max_elements = 1,
                        .max_rows = 1,
                        .max_width = 1,
                        .max_batch = 1,
                        .num_params = layout_floats()};
  for (int pi = 0; pi < GPU_TEST_PRECISIONS; pi++) {
    BackendPair p;
    backend_pair_create(&p, gpu_test_precisions[pi], &needs);
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) run_steps(&p, &runs[r], &rng);
    if (pi == 0) negative_control(&p, &rng);
    backend_pair_destroy(&p);
  }
#endif
  return test_finish();
}
