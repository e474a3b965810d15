// test_loss.c: kernels/cpu/loss.c against cross-entropy written in double (hard labels with and
// without label smoothing, soft targets), its gradient against finite differences of the loss,
// a micro-batch's gradient as a share of a larger batch's mean (gradient accumulation), logits of
// magnitude 1000, and top-1 / top-5 counting on hand-built rows (ties included).
#include "kernels/loss.h"
#include "tests/util/test_util.h"

// ---- the case under test ------------------------------------------------------------------
typedef struct {
  int B, K;
  float smoothing;
  float *logits, *soft;  // (B, K), (B, K) or NULL
  int *labels;           // (B) or NULL
} LossCase;

// The finite-difference objective is the mean loss itself (a double), so the gradient is
// dlogits.
static double loss_objective(void *ctx) {
  LossCase *c = ctx;
  return cross_entropy_forward_backward_cpu(NULL, c->logits, c->labels, c->soft, c->smoothing, c->B,
                                            c->K, c->B);
}

// Loss and dlogits in double: log-softmax through log-sum-exp, target built as a dense row.
static double loss_reference(float *dlogits, const LossCase *c) {
  double total = 0.0;
  double *target = malloc(c->K * sizeof(double));
  for (int b = 0; b < c->B; b++) {
    const float *x = c->logits + (int64_t)b * c->K;
    for (int k = 0; k < c->K; k++) {
      if (c->labels)
        target[k] = (k == c->labels[b] ? 1.0 - c->smoothing : 0.0) + (double)c->smoothing / c->K;
      else
        target[k] = c->soft[(int64_t)b * c->K + k];
    }
    double mx = -INFINITY, sum = 0.0;
    for (int k = 0; k < c->K; k++) mx = fmax(mx, x[k]);
    for (int k = 0; k < c->K; k++) sum += exp(x[k] - mx);
    double lse = mx + log(sum);
    for (int k = 0; k < c->K; k++) {
      total -= target[k] * (x[k] - lse);
      dlogits[(int64_t)b * c->K + k] = (float)((exp(x[k] - lse) - target[k]) / c->B);
    }
  }
  free(target);
  return total / c->B;
}

// ---- checks -------------------------------------------------------------------------------
static void check_loss(TestRng *rng, const char *what, int B, int K, float smoothing, int soft,
                       float center, float spread) {
  LossCase c = {.B = B, .K = K, .smoothing = smoothing};
  int64_t n = (int64_t)B * K;
  c.logits = malloc(n * sizeof(float));
  test_fill_uniform(rng, c.logits, n, center - spread, center + spread);
  c.labels = NULL;
  c.soft = NULL;
  if (soft) {
    // Mixup-style rows: lam one_hot(a) + (1 - lam) one_hot(b), smoothed, plus random mass,
    // normalized to sum 1.
    c.soft = malloc(n * sizeof(float));
    test_fill_uniform(rng, c.soft, n, 0.0f, 0.02f);
    for (int b = 0; b < B; b++) {
      float lam = test_rng_uniform(rng, 0.2f, 0.8f);
      c.soft[(int64_t)b * K + (int)(test_rng_u64(rng) % K)] += lam;
      c.soft[(int64_t)b * K + (int)(test_rng_u64(rng) % K)] += 1.0f - lam;
      double s = 0.0;
      for (int k = 0; k < K; k++) s += c.soft[(int64_t)b * K + k];
      for (int k = 0; k < K; k++)
        c.soft[(int64_t)b * K + k] = (float)(c.soft[(int64_t)b * K + k] / s);
    }
  } else {
    c.labels = malloc(B * sizeof(int));
    for (int b = 0; b < B; b++) c.labels[b] = (int)(test_rng_u64(rng) % K);
  }
  printf("-- %s: B=%d K=%d smoothing %.2f, logits in [%g, %g]\n", what, B, K, smoothing,
         center - spread, center + spread);

  float *dlogits = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
  double want_loss = loss_reference(want, &c);
  test_poison(dlogits, n);
  double loss =
      cross_entropy_forward_backward_cpu(dlogits, c.logits, c.labels, c.soft, smoothing, B, K, B);
  // Both evaluate the same double formulas from the same fp32 logits, in different orders:
  // they agree to ~1e-15 relative; 1e-10 still flags any formula difference.
  double e = fabs(loss - want_loss) / fabs(want_loss);
  test_check(isfinite(loss) && e <= 1e-10, "%-48s rel_err %.3e (tol 1.0e-10) loss %.6f",
             "loss vs double reference", e, loss);
  // Each element is one double expression rounded to fp32 on both sides.
  test_close("dlogits vs double reference", dlogits, want, n, 1e-6);
  double loss_only = loss_objective(&c);
  test_check(loss_only == loss, "loss with dlogits NULL is the same (%.17g)", loss_only);
  // Gradient accumulation: the first half of the rows as a micro-batch whose gradient is a mean
  // over all B (grad_count B) gets the whole batch's rows of dlogits, bitwise (one expression per
  // element), and its own rows' mean loss.
  int half = B / 2;
  if (half > 0) {
    float *part = malloc((size_t)half * K * sizeof(float));
    test_poison(part, (int64_t)half * K);
    double part_loss =
        cross_entropy_forward_backward_cpu(part, c.logits, c.labels, c.soft, smoothing, half, K, B);
    LossCase first = c;
    first.B = half;
    double want_part = loss_objective(&first);
    test_check(
        memcmp(part, dlogits, (size_t)half * K * sizeof(float)) == 0 && part_loss == want_part,
        "a micro-batch of %d rows of a batch of %d (grad_count %d): the batch's dlogits "
        "rows bitwise, its own mean loss (%.6f)",
        half, B, B, part_loss);
    free(part);
  }

  // The loss is evaluated in double from fp32 logits, so rounding noise is ~1e-16 and only the
  // O(h^2) truncation counts: with h = 1e-3 on logits O(1) apart, ~1e-7 relative. Around 1000
  // the step is quantized to fp32's 6e-5 spacing, which the helpers account for by using the
  // stored perturbation. 1e-5 tolerance.
  const float h = 1e-3f;
  e = test_fd_directional(loss_objective, &c, c.logits, dlogits, n, h, rng);
  test_check(e <= 1e-5, "%-48s rel_err %.3e (tol 1.0e-05)", "finite diff <dlogits, V>", e);
  e = test_fd_elements(loss_objective, &c, c.logits, dlogits, n, h, 8, rng);
  test_check(e <= 1e-5, "%-48s max_err %.3e (tol 1.0e-05)", "finite diff dlogits, 8 elements", e);
  free(c.logits);
  free(c.soft);
  free(c.labels);
  free(dlogits);
  free(want);
}

// Logits far apart (+-1000) make naive exp overflow; the loss must stay finite and exact.
static void check_extreme_logits(void) {
  float logits[2 * 4] = {1000.0f,  -1000.0f, 0.0f,    999.0f,    // label 3, one below the max
                         -1000.0f, 1000.0f,  1000.0f, 1000.0f};  // label 0, 2000 below
  int labels[2] = {3, 0};
  float dlogits[8];
  test_poison(dlogits, 8);
  double loss = cross_entropy_forward_backward_cpu(dlogits, logits, labels, NULL, 0.0f, 2, 4, 2);
  // Row 0: -log p_3 = log(e^1 + e^0 + e^-999 + e^-2000) ~ log(1 + e) (the rest underflow).
  // Row 1: -log p_0 = 2000 + log 3 (label 2000 below three equal logits).
  double want = (log(1.0 + exp(1.0)) + 2000.0 + log(3.0)) / 2.0;
  double e = fabs(loss - want) / want;
  test_check(isfinite(loss) && e <= 1e-12, "%-48s rel_err %.3e (loss %.6f, want %.6f)",
             "loss with logits +-1000", e, loss, want);
  int finite = 1;
  for (int i = 0; i < 8; i++) finite &= isfinite(dlogits[i]) != 0;
  // Row 1's label has p ~ e^-2000 = 0: gradient (0 - 1) / 2 = -0.5; the others 1/3 / 2.
  test_check(finite && dlogits[4] == -0.5f && fabsf(dlogits[5] - 1.0f / 6.0f) < 1e-7f,
             "dlogits with logits +-1000 finite and exact (%g, %g)", dlogits[4], dlogits[5]);
}

// Reference rank: sort class indices by (logit descending, index ascending).
static int rank_ref(const float *x, int K, int y) {
  int ahead = 0;
  for (int k = 0; k < K; k++)
    if (k != y && (x[k] > x[y] || (x[k] == x[y] && k < y))) ahead++;
  return ahead;
}

static void check_topk(TestRng *rng) {
  // Hand-built rows, K = 8. Ties are resolved toward the smaller class index (as a first-
  // occurrence argmax), documented in loss.c.
  const float logits[6 * 8] = {
      0.1f, 0.2f, 3.0f, 0.3f, 0.0f, 0.0f, 0.0f, 0.0f,  // label 2 is the max: top1, top5
      5.0f, 4.0f, 0.0f, 3.0f, 0.0f, 0.0f, 0.0f, 0.0f,  // label 3 is 3rd: top5 only
      8.0f, 7.0f, 6.0f, 5.0f, 4.0f, 3.0f, 2.0f, 1.0f,  // label 5 is 6th: neither
      1.0f, 1.0f, 9.0f, 0.0f, 0.0f, 9.0f, 0.0f, 0.0f,  // label 2 ties 5 at the max: top1
      1.0f, 1.0f, 9.0f, 0.0f, 0.0f, 9.0f, 0.0f, 0.0f,  // label 5 ties 2, loses: top5 only
      8.0f, 7.0f, 6.0f, 5.0f, 4.0f, 3.0f, 2.0f, 1.0f,  // label 4 is 5th: top5 only
  };
  const int labels[6] = {2, 3, 5, 2, 5, 4};
  int top1 = -1, top5 = -1;
  topk_correct_cpu(logits, labels, 6, 8, &top1, &top5);
  test_check(top1 == 2 && top5 == 5, "topk hand-built rows: top1 %d (want 2), top5 %d (want 5)",
             top1, top5);
  // Fewer than 5 classes: every row is in the top 5.
  const float small[2 * 3] = {0.0f, 1.0f, 2.0f, 2.0f, 1.0f, 0.0f};
  const int small_labels[2] = {0, 0};
  topk_correct_cpu(small, small_labels, 2, 3, &top1, &top5);
  test_check(top1 == 1 && top5 == 2, "topk with K=3: top1 %d (want 1), top5 %d (want 2)", top1,
             top5);

  // Random rows with coarse logits (many ties) against the sorting rule.
  const int B = 500, K = 10;
  float *x = malloc((size_t)B * K * sizeof(float));
  int *y = malloc(B * sizeof(int)), want1 = 0, want5 = 0;
  for (int i = 0; i < B * K; i++) x[i] = (float)(test_rng_u64(rng) % 6);
  for (int b = 0; b < B; b++) {
    y[b] = (int)(test_rng_u64(rng) % K);
    int r = rank_ref(x + b * K, K, y[b]);
    want1 += r < 1;
    want5 += r < 5;
  }
  topk_correct_cpu(x, y, B, K, &top1, &top5);
  test_check(top1 == want1 && top5 == want5,
             "topk random tied rows: top1 %d (want %d), top5 %d (want %d)", top1, want1, top5,
             want5);
  free(x);
  free(y);
}

int main(void) {
  TestRng rng = {.state = 0x1055u};
  check_loss(&rng, "hard labels", 16, 10, 0.0f, 0, 0.0f, 3.0f);
  check_loss(&rng, "hard labels, smoothing 0.1", 16, 10, 0.1f, 0, 0.0f, 3.0f);
  check_loss(&rng, "soft targets (mixup)", 16, 10, 0.0f, 1, 0.0f, 3.0f);
  check_loss(&rng, "ImageNet width, smoothing 0.1", 8, 1000, 0.1f, 0, 0.0f, 5.0f);
  check_loss(&rng, "large logits around 1000", 8, 100, 0.1f, 0, 1000.0f, 20.0f);
  check_extreme_logits();
  check_topk(&rng);
  return test_finish();
}
