// test_gpu_loss.c: the CUDA backend's train_loss and eval_metrics against the CPU backend's, with
// K = 10 and 1000 classes, under each compute precision (logits, dlogits and the sums are f32 and
// double in all of them).
//   train_loss: label smoothing 0.1, OptimState in backend memory with loss_scale 1 and 1024
//   (dlogits scaled by it); loss_sum and loss_steps accumulate over two batches; a third batch
//   with a NaN logit in one row adds 1 to bad_losses and nothing to the sum; the fields the loss
//   does not own stay as they were.
//   eval_metrics: EvalSums in backend memory accumulate over two batches; logits quantized to a
//   few levels, so ties are everywhere (they go to the lower class index on both backends).
#include "tests/util/test_gpu_util.h"

#ifdef SWIN_HAVE_CUDA

enum { BATCHES = 3, NAN_BATCH = 2, NAN_ROW = 5, BATCH = 16 };

typedef struct {
  int K;
  float loss_scale;
} LossCase;

static const LossCase cases[] = {{10, 1.0f}, {10, 1024.0f}, {1000, 1.0f}, {1000, 1024.0f}};

// Both sides compute each row in double and round once to fp32 (the GPU also rounds each row's
// loss to fp32 before the double sum): a few 1e-8 relative.
#define TOL_LOSS 1e-6

// An OptimState whose fields the loss does not own hold recognizable values.
static OptimState state_init(float loss_scale) {
  OptimState s;
  memset(&s, 0, sizeof s);
  s.grad_norm = 1.25;
  s.adam_steps = 7;
  s.skipped = 2;
  s.skipped_run = 1;
  s.loss_scale = loss_scale;
  s.good_steps = 3;
  return s;
}

typedef struct {
  float *logits[BATCHES];
  int *labels[BATCHES];
} Batches;

static void batches_make(Batches *b, TestRng *rng, int K) {
  for (int i = 0; i < BATCHES; i++) {
    b->logits[i] = test_alloc_floats((int64_t)BATCH * K);
    test_fill_uniform(rng, b->logits[i], (int64_t)BATCH * K, -4.0f, 4.0f);
    b->labels[i] = (int *)malloc_check(sizeof(int) * BATCH);
    for (int r = 0; r < BATCH; r++) b->labels[i][r] = (int)(test_rng_u64(rng) % (uint64_t)K);
  }
  b->logits[NAN_BATCH][(int64_t)NAN_ROW * K + K / 2] = NAN;
}
static void batches_free(Batches *b) {
  for (int i = 0; i < BATCHES; i++) {
    free(b->logits[i]);
    free(b->labels[i]);
  }
}

// The batches through train_loss on be, one OptimState throughout: dlogits and the state after
// each call.
static void train_loss_on(Backend *be, const Batches *b, int K, OptimState init,
                          float *dlogits_h[BATCHES], OptimState st_h[BATCHES]) {
  const int64_t n = (int64_t)BATCH * K;
  OptimState *st = (OptimState *)be_copy_bytes(be, &init, sizeof init);
  for (int i = 0; i < BATCHES; i++) {
    float *logits = be_copy_f32(be, b->logits[i], n);
    int *labels = (int *)be_copy_bytes(be, b->labels[i], sizeof(int) * BATCH);
    float *dlogits = be_poisoned_f32(be, n);
    be->ops->train_loss(be, dlogits, logits, labels, NULL, 0.1f, BATCH, K, BATCH, st);
    be_read_f32(be, dlogits_h[i], dlogits, n);
    be->ops->download(be, &st_h[i], st, sizeof *st);
    be_free(be, logits);
    be_free(be, labels);
    be_free(be, dlogits);
  }
  be_free(be, st);
}

static double rel_diff(double got, double want) {
  return fabs(got - want) / fmax(fabs(want), 1e-300);
}

// The fields train_loss does not own: as they were.
static bool state_others_equal(const OptimState *a, const OptimState *b) {
  return a->grad_norm == b->grad_norm && a->adam_steps == b->adam_steps &&
         a->skipped == b->skipped && a->skipped_run == b->skipped_run &&
         a->loss_scale == b->loss_scale && a->good_steps == b->good_steps;
}

static void check_train_loss(BackendPair *p, const LossCase *c, TestRng *rng) {
  const int K = c->K;
  const int64_t n = (int64_t)BATCH * K;
  Batches b;
  batches_make(&b, rng, K);
  OptimState init = state_init(c->loss_scale);
  float *want[BATCHES], *got[BATCHES];
  OptimState want_st[BATCHES], got_st[BATCHES];
  for (int i = 0; i < BATCHES; i++) {
    want[i] = test_alloc_floats(n);
    got[i] = test_alloc_floats(n);
  }
  train_loss_on(&p->cpu, &b, K, init, want, want_st);
  train_loss_on(&p->gpu, &b, K, init, got, got_st);

  for (int i = 0; i < BATCHES; i++) {
    char ctx[256];
    snprintf(ctx, sizeof ctx, "train_loss [%s] B=%d K=%d loss_scale %g, batch %d%s", p->precision,
             BATCH, K, (double)c->loss_scale, i + 1, i == NAN_BATCH ? " (a NaN logit)" : "");
    if (i == NAN_BATCH) {
      // The NaN row's gradient is NaN on both; the other rows are compared as usual.
      bool nan_row = true;
      for (int k = 0; k < K; k++) {
        float *g = &got[i][(int64_t)NAN_ROW * K + k], *w = &want[i][(int64_t)NAN_ROW * K + k];
        nan_row = nan_row && !isfinite(*g) && !isfinite(*w);
        *g = *w = 0.0f;
      }
      test_check(nan_row, "%s: dlogits of the NaN row non-finite on both", ctx);
    }
    test_compare(ctx, "dlogits", got[i], want[i], n, TOL_LOSS);
    const OptimState *g = &got_st[i], *w = &want_st[i];
    double e = rel_diff(g->loss_sum, w->loss_sum);
    test_check(e <= TOL_LOSS, "%s: loss_sum %.9g vs cpu %.9g, rel_err %.2e (tol %.0e)", ctx,
               g->loss_sum, w->loss_sum, e, TOL_LOSS);
    int64_t steps = i < NAN_BATCH ? i + 1 : NAN_BATCH, bad = i < NAN_BATCH ? 0 : 1;
    test_check(g->loss_steps == steps && w->loss_steps == steps && g->bad_losses == bad &&
                   w->bad_losses == bad,
               "%s: loss_steps %lld (cpu %lld), bad_losses %lld (cpu %lld), want %lld and %lld",
               ctx, (long long)g->loss_steps, (long long)w->loss_steps, (long long)g->bad_losses,
               (long long)w->bad_losses, (long long)steps, (long long)bad);
    if (i == NAN_BATCH)
      test_check(g->loss_sum == got_st[i - 1].loss_sum,
                 "%s: loss_sum unchanged by the non-finite batch (%.9g, before %.9g)", ctx,
                 g->loss_sum, got_st[i - 1].loss_sum);
    test_check(state_others_equal(g, &init) && state_others_equal(w, &init),
               "%s: grad_norm, adam_steps, skipped, skipped_run, loss_scale, good_steps untouched",
               ctx);
  }
  batches_free(&b);
  for (int i = 0; i < BATCHES; i++) {
    free(want[i]);
    free(got[i]);
  }
}

// Two batches through eval_metrics on be, one EvalSums: the sums after each.
static void eval_on(Backend *be, float *const logits_h[2], int *const labels_h[2], int B, int K,
                    EvalSums out[2]) {
  EvalSums zero = {0};
  EvalSums *sums = (EvalSums *)be_copy_bytes(be, &zero, sizeof zero);
  for (int i = 0; i < 2; i++) {
    float *logits = be_copy_f32(be, logits_h[i], (int64_t)B * K);
    int *labels = (int *)be_copy_bytes(be, labels_h[i], sizeof(int) * (size_t)B);
    be->ops->eval_metrics(be, sums, logits, labels, B, K);
    be->ops->download(be, &out[i], sums, sizeof *sums);
    be_free(be, logits);
    be_free(be, labels);
  }
  be_free(be, sums);
}

static void check_eval(BackendPair *p, int K, TestRng *rng) {
  enum { B = 64 };
  float *logits[2];
  int *labels[2];
  for (int i = 0; i < 2; i++) {
    logits[i] = test_alloc_floats((int64_t)B * K);
    labels[i] = (int *)malloc_check(sizeof(int) * B);
    // Five levels: many classes share the label's logit, so the tie rule decides many ranks.
    for (int64_t j = 0; j < (int64_t)B * K; j++)
      logits[i][j] = (float)(test_rng_u64(rng) % 5) - 2.0f;
    for (int r = 0; r < B; r++) {
      int y = (int)(test_rng_u64(rng) % (uint64_t)(K - 1)) + 1;  // 1..K-1: a class below exists
      float *x = logits[i] + (int64_t)r * K;
      labels[i][r] = y;
      // Rows by r % 4: the label alone on top (top-1); tied on top with a lower class (rank 1:
      // top-5 only); tied on top with a higher class (rank 0: top-1); as drawn.
      if (r % 4 < 3) x[y] = 3.0f;
      if (r % 4 == 1) x[y - 1] = 3.0f;
      if (r % 4 == 2 && y + 1 < K) x[y + 1] = 3.0f;
    }
  }
  EvalSums want[2], got[2];
  eval_on(&p->cpu, logits, labels, B, K, want);
  eval_on(&p->gpu, logits, labels, B, K, got);
  for (int i = 0; i < 2; i++) {
    char ctx[256];
    snprintf(ctx, sizeof ctx, "eval_metrics [%s] B=%d K=%d, after batch %d", p->precision, B, K,
             i + 1);
    double e = rel_diff(got[i].loss_sum, want[i].loss_sum);
    test_check(e <= TOL_LOSS, "%s: loss_sum %.9g vs cpu %.9g, rel_err %.2e (tol %.0e)", ctx,
               got[i].loss_sum, want[i].loss_sum, e, TOL_LOSS);
    test_check(got[i].top1 == want[i].top1 && got[i].top5 == want[i].top5 &&
                   got[i].count == want[i].count && got[i].count == (int64_t)B * (i + 1),
               "%s: top1 %lld top5 %lld count %lld (cpu %lld %lld %lld)", ctx,
               (long long)got[i].top1, (long long)got[i].top5, (long long)got[i].count,
               (long long)want[i].top1, (long long)want[i].top5, (long long)want[i].count);
  }
  // Meaningful counts: some hits and some misses in both top-1 and top-5.
  test_check(want[1].top1 > 0 && want[1].top1 < want[1].top5 && want[1].top5 < 2 * B,
             "eval_metrics [%s] K=%d: the batches have top-1 hits, top-5-only hits and misses "
             "(%lld, %lld of %d)",
             p->precision, K, (long long)want[1].top1, (long long)want[1].top5, 2 * B);
  for (int i = 0; i < 2; i++) {
    free(logits[i]);
    free(labels[i]);
  }
}

// Negative control: the GPU given every label shifted by one class.
static void negative_control(BackendPair *p, TestRng *rng) {
  const int K = 10;
  const int64_t n = (int64_t)BATCH * K;
  Batches b, shifted;
  batches_make(&b, rng, K);
  shifted = b;
  int *labels[BATCHES];
  for (int i = 0; i < BATCHES; i++) {
    labels[i] = (int *)malloc_check(sizeof(int) * BATCH);
    for (int r = 0; r < BATCH; r++) labels[i][r] = (b.labels[i][r] + 1) % K;
    shifted.labels[i] = labels[i];
  }
  float *want[BATCHES], *got[BATCHES];
  OptimState want_st[BATCHES], got_st[BATCHES];
  for (int i = 0; i < BATCHES; i++) {
    want[i] = test_alloc_floats(n);
    got[i] = test_alloc_floats(n);
  }
  train_loss_on(&p->cpu, &b, K, state_init(1.0f), want, want_st);
  train_loss_on(&p->gpu, &shifted, K, state_init(1.0f), got, got_st);
  test_must_differ("negative control: train_loss [fp32], GPU labels + 1", "dlogits of batch 1",
                   got[0], want[0], n, TOL_LOSS);
  batches_free(&b);
  for (int i = 0; i < BATCHES; i++) {
    free(labels[i]);
    free(want[i]);
    free(got[i]);
  }
}
#endif

int main(void) {
  GPU_TEST_MAIN_BEGIN();
#ifdef SWIN_HAVE_CUDA
  TestRng rng = {.state = 0x1055};
  BackendNeeds needs = {.max_elements = 1, .max_rows = 1, .max_width = 1000, .max_batch = 64};
  for (int pi = 0; pi < GPU_TEST_PRECISIONS; pi++) {
    BackendPair p;
    backend_pair_create(&p, gpu_test_precisions[pi], &needs);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
      check_train_loss(&p, &cases[i], &rng);
    check_eval(&p, 10, &rng);
    check_eval(&p, 1000, &rng);
    if (pi == 0) negative_control(&p, &rng);
    backend_pair_destroy(&p);
  }
#endif
  return test_finish();
}
