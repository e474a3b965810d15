// test_gpu_loss.c: cross_entropy_forward_backward_cuda and topk_correct_cuda against the CPU
// reference (kernels/cpu/loss.c, itself checked against double formulas and finite differences
// in test_loss.c). Hard labels with and without smoothing, soft targets, K = 10 and K = 1000
// (ImageNet), logits around 1000 and +-1000 (naive exp would overflow), an out-of-range label,
// a batch of 300 rows (more than any block), and top-k counts on tied and hand-built rows.
#include "kernels/loss.h"
#include "tests/test_gpu_util.h"

#ifdef SWIN_HAVE_CUDA
static void check_same_bits(const char *what, const float *a, const float *b, int64_t n) {
  int64_t differ = 0;
  for (int64_t i = 0; i < n; i++) differ += memcmp(&a[i], &b[i], sizeof(float)) != 0;
  test_check(differ == 0, "%-48s %lld elements differ", what, (long long)differ);
}

// One row's loss -sum_k t_k log softmax(x)_k in double (t from the label with smoothing, or
// the soft row).
static double row_loss_ref(const float *x, int label, const float *soft, float smoothing, int K) {
  double mx = -INFINITY, sum = 0.0, loss = 0.0;
  for (int k = 0; k < K; k++) mx = fmax(mx, x[k]);
  for (int k = 0; k < K; k++) sum += exp(x[k] - mx);
  double lse = mx + log(sum);
  for (int k = 0; k < K; k++) {
    double t = soft ? soft[k] : (k == label ? 1.0 - smoothing : 0.0) + (double)smoothing / K;
    loss -= t * (x[k] - lse);
  }
  return loss;
}

// bad_label: row 0 gets label K (out of range), which must give a NaN loss and NaN dlogits row.
static void check_loss(TestRng *rng, cudaStream_t stream, const char *what, int B, int K,
                       float smoothing, int soft, float center, float spread, int bad_label) {
  int64_t n = (int64_t)B * K;
  printf("-- %s: B=%d K=%d smoothing %.2f, logits in [%g, %g]%s\n", what, B, K, smoothing,
         center - spread, center + spread, bad_label ? ", row 0 label out of range" : "");
  float *logits = malloc(n * sizeof(float)), *targets = NULL;
  int *labels = NULL;
  test_fill_uniform(rng, logits, n, center - spread, center + spread);
  if (soft) {
    // Mixup-style rows: two classes sharing the mass, plus a little everywhere, summing to 1.
    targets = malloc(n * sizeof(float));
    test_fill_uniform(rng, targets, n, 0.0f, 0.02f);
    for (int b = 0; b < B; b++) {
      float *t = targets + (int64_t)b * K, lam = test_rng_uniform(rng, 0.2f, 0.8f);
      t[test_rng_u64(rng) % K] += lam;
      t[test_rng_u64(rng) % K] += 1.0f - lam;
      double s = 0.0;
      for (int k = 0; k < K; k++) s += t[k];
      for (int k = 0; k < K; k++) t[k] = (float)(t[k] / s);
    }
  } else {
    labels = malloc(B * sizeof(int));
    for (int b = 0; b < B; b++) labels[b] = (int)(test_rng_u64(rng) % K);
    if (bad_label) labels[0] = K;
  }

  float *want = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
  float *again = malloc(n * sizeof(float));
  float *losses = malloc(B * sizeof(float)), *losses2 = malloc(B * sizeof(float));
  float *want_losses = malloc(B * sizeof(float));
  double want_mean =
      cross_entropy_forward_backward_cpu(want, logits, labels, targets, smoothing, B, K);
  for (int b = 0; b < B; b++)
    want_losses[b] = (float)row_loss_ref(logits + (int64_t)b * K, labels ? labels[b] : -1,
                                         targets ? targets + (int64_t)b * K : NULL, smoothing, K);

  float *d_logits = gpu_upload(logits, n), *d_targets = targets ? gpu_upload(targets, n) : NULL;
  int *d_labels = labels ? gpu_upload_bytes(labels, B * sizeof(int)) : NULL;
  float *d_dlogits = gpu_alloc(n * sizeof(float)), *d_losses = gpu_alloc(B * sizeof(float));
  gpu_poison(d_dlogits, n);
  gpu_poison(d_losses, B);
  cross_entropy_forward_backward_cuda(d_losses, d_dlogits, d_logits, d_labels, d_targets, smoothing,
                                      B, K, stream);
  gpu_download(got, d_dlogits, n);
  gpu_download(losses, d_losses, B);

  if (bad_label) {
    // Row 0 is NaN by contract; the other rows are compared as usual.
    int nan_row = isnan(losses[0]);
    for (int k = 0; k < K; k++) nan_row &= isnan(got[k]) != 0;
    test_check(nan_row, "%-48s loss %g", "out-of-range label: NaN loss and dlogits row", losses[0]);
  }
  int64_t skip = bad_label ? K : 0;  // elements of row 0 left out of the comparisons
  int skip_rows = bad_label ? 1 : 0;
  // Both sides evaluate the same double expression per element and round it to fp32; only the
  // order of the exp sum (~1e-16 relative) and CUDA's vs glibc's exp (<= 1 ulp of double)
  // differ, so the floats agree to an ulp: 1e-6.
  test_close("dlogits vs CPU", got + skip, want + skip, n - skip, 1e-6);
  // Each row's loss is a double rounded to fp32 (6e-8 relative) against a double reference.
  test_close("per-row losses vs double reference", losses + skip_rows, want_losses + skip_rows,
             B - skip_rows, 1e-6);
  if (!bad_label) {
    // The caller's mean: the rows in order in double, against the CPU's double mean.
    double mean = 0.0;
    for (int b = 0; b < B; b++) mean += losses[b];
    mean /= B;
    double e = fabs(mean - want_mean) / fabs(want_mean);
    test_check(e <= 1e-6, "%-48s rel_err %.3e (tol 1.0e-06) loss %.6f",
               "host mean of row losses vs CPU mean", e, mean);
  }

  // Run-to-run: the same bits. Then dlogits NULL: the same losses without the gradient.
  gpu_poison(d_dlogits, n);
  gpu_poison(d_losses, B);
  cross_entropy_forward_backward_cuda(d_losses, d_dlogits, d_logits, d_labels, d_targets, smoothing,
                                      B, K, stream);
  gpu_download(again, d_dlogits, n);
  gpu_download(losses2, d_losses, B);
  check_same_bits("dlogits run twice: same bits", got, again, n);
  check_same_bits("losses run twice: same bits", losses, losses2, B);
  gpu_poison(d_losses, B);
  cross_entropy_forward_backward_cuda(d_losses, NULL, d_logits, d_labels, d_targets, smoothing, B,
                                      K, stream);
  gpu_download(losses2, d_losses, B);
  check_same_bits("losses with dlogits NULL: same bits", losses, losses2, B);

  CUDA_CHECK(cudaFree(d_logits));
  if (d_targets) CUDA_CHECK(cudaFree(d_targets));
  if (d_labels) CUDA_CHECK(cudaFree(d_labels));
  CUDA_CHECK(cudaFree(d_dlogits));
  CUDA_CHECK(cudaFree(d_losses));
  free(logits);
  free(targets);
  free(labels);
  free(want);
  free(got);
  free(again);
  free(losses);
  free(losses2);
  free(want_losses);
}

// Logits +-1000: the CPU test's rows with their exact answers.
static void check_extreme_logits(cudaStream_t stream) {
  const float logits[2 * 4] = {1000.0f,  -1000.0f, 0.0f,    999.0f,    // label 3, one below max
                               -1000.0f, 1000.0f,  1000.0f, 1000.0f};  // label 0, 2000 below
  const int labels[2] = {3, 0};
  float *d_logits = gpu_upload(logits, 8), *d_dlogits = gpu_alloc(8 * sizeof(float));
  float *d_losses = gpu_alloc(2 * sizeof(float));
  int *d_labels = gpu_upload_bytes(labels, sizeof labels);
  gpu_poison(d_dlogits, 8);
  gpu_poison(d_losses, 2);
  cross_entropy_forward_backward_cuda(d_losses, d_dlogits, d_logits, d_labels, NULL, 0.0f, 2, 4,
                                      stream);
  float dlogits[8], losses[2];
  gpu_download(dlogits, d_dlogits, 8);
  gpu_download(losses, d_losses, 2);
  // Row 0: log(1 + e) (the rest underflow); row 1: 2000 + log 3. fp32 rounding: 6e-8.
  double want0 = log(1.0 + exp(1.0)), want1 = 2000.0 + log(3.0);
  double e = fmax(fabs(losses[0] - want0) / want0, fabs(losses[1] - want1) / want1);
  test_check(e <= 1e-6, "%-48s rel_err %.3e (losses %.6f, %.6f)", "losses with logits +-1000", e,
             losses[0], losses[1]);
  int finite = 1;
  for (int i = 0; i < 8; i++) finite &= isfinite(dlogits[i]) != 0;
  test_check(finite && dlogits[4] == -0.5f && fabsf(dlogits[5] - 1.0f / 6.0f) < 1e-7f,
             "dlogits with logits +-1000 finite and exact (%g, %g)", dlogits[4], dlogits[5]);
  CUDA_CHECK(cudaFree(d_logits));
  CUDA_CHECK(cudaFree(d_dlogits));
  CUDA_CHECK(cudaFree(d_losses));
  CUDA_CHECK(cudaFree(d_labels));
}

// Counts on the device against topk_correct_cpu; the device ints start as garbage, which the
// kernel must overwrite. Integer counts are exact: compared for equality.
static void check_topk_case(cudaStream_t stream, const char *what, const float *logits,
                            const int *labels, int B, int K) {
  int want1 = -1, want5 = -1;
  topk_correct_cpu(logits, labels, B, K, &want1, &want5);
  float *d_logits = gpu_upload(logits, (int64_t)B * K);
  int *d_labels = gpu_upload_bytes(labels, B * sizeof(int));
  int garbage[2] = {12345, -7};
  int *d_counts = gpu_upload_bytes(garbage, sizeof garbage);
  int counts[2], again[2];
  topk_correct_cuda(d_logits, d_labels, B, K, &d_counts[0], &d_counts[1], stream);
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemcpy(counts, d_counts, sizeof counts, cudaMemcpyDeviceToHost));
  topk_correct_cuda(d_logits, d_labels, B, K, &d_counts[0], &d_counts[1], stream);
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemcpy(again, d_counts, sizeof again, cudaMemcpyDeviceToHost));
  test_check(counts[0] == want1 && counts[1] == want5 && again[0] == want1 && again[1] == want5,
             "topk %s (B=%d K=%d): top1 %d, %d (want %d), top5 %d, %d (want %d)", what, B, K,
             counts[0], again[0], want1, counts[1], again[1], want5);
  CUDA_CHECK(cudaFree(d_logits));
  CUDA_CHECK(cudaFree(d_labels));
  CUDA_CHECK(cudaFree(d_counts));
}

static void check_topk(TestRng *rng, cudaStream_t stream) {
  // The CPU test's hand-built rows (ties go to the smaller class index), plus a row whose label
  // logit is NaN and one whose label is out of range: neither counts.
  const float logits[8 * 8] = {
      0.1f, 0.2f, 3.0f, 0.3f, 0.0f, 0.0f, 0.0f, 0.0f,  // label 2 is the max: top1, top5
      5.0f, 4.0f, 0.0f, 3.0f, 0.0f, 0.0f, 0.0f, 0.0f,  // label 3 is 3rd: top5 only
      8.0f, 7.0f, 6.0f, 5.0f, 4.0f, 3.0f, 2.0f, 1.0f,  // label 5 is 6th: neither
      1.0f, 1.0f, 9.0f, 0.0f, 0.0f, 9.0f, 0.0f, 0.0f,  // label 2 ties 5 at the max: top1
      1.0f, 1.0f, 9.0f, 0.0f, 0.0f, 9.0f, 0.0f, 0.0f,  // label 5 ties 2, loses: top5 only
      8.0f, 7.0f, 6.0f, 5.0f, 4.0f, 3.0f, 2.0f, 1.0f,  // label 4 is 5th: top5 only
      NAN,  0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f,  // label 0 is NaN: neither
      9.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f,  // label 8 out of range: neither
  };
  const int labels[8] = {2, 3, 5, 2, 5, 4, 0, 8};
  check_topk_case(stream, "hand-built rows", logits, labels, 8, 8);
  const float small[2 * 3] = {0.0f, 1.0f, 2.0f, 2.0f, 1.0f, 0.0f};
  const int small_labels[2] = {0, 0};
  check_topk_case(stream, "K=3 (every row in the top 5)", small, small_labels, 2, 3);

  // Random rows with coarse logits (many ties): K = 10, and K = 1000 over more rows than a
  // block holds.
  const int shapes[2][2] = {{500, 10}, {300, 1000}};
  for (int s = 0; s < 2; s++) {
    int B = shapes[s][0], K = shapes[s][1];
    float *x = malloc((size_t)B * K * sizeof(float));
    int *y = malloc(B * sizeof(int));
    // Few distinct values relative to K, so the label often ties or sits near the top.
    int levels = K < 100 ? 6 : 40;
    for (int64_t i = 0; i < (int64_t)B * K; i++) x[i] = (float)(test_rng_u64(rng) % levels);
    for (int b = 0; b < B; b++) y[b] = (int)(test_rng_u64(rng) % K);
    // At K = 1000 a random label is rarely near the top: lift some labels to the row's
    // maximum, alone (top-1) or tied with 2 other classes (rank 0 to 2 by class index), and
    // others to just below 4 to 6 classes placed above them (rank 4 to 6: the top-5 edge).
    for (int b = 0; b < B; b++) {
      float *row = x + (int64_t)b * K;
      int ahead = b % 4 == 1 ? 2 : b % 4 == 2 ? 4 + (b / 4) % 3 : 0;
      if (b % 4 == 3) continue;
      row[y[b]] = (float)(levels + (b % 4 == 2 ? 0 : 1));
      for (int a = 0; a < ahead; a++) row[(y[b] + 1 + 7 * a) % K] = (float)(levels + 1);
    }
    check_topk_case(stream, "random tied rows", x, y, B, K);
    free(x);
    free(y);
  }
}
#endif

int main(void) {
  GPU_TEST_MAIN_BEGIN();
#ifdef SWIN_HAVE_CUDA
  TestRng rng = {.state = 0x1056u};
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  check_loss(&rng, stream, "hard labels", 16, 10, 0.0f, 0, 0.0f, 3.0f, 0);
  check_loss(&rng, stream, "hard labels, smoothing 0.1", 16, 10, 0.1f, 0, 0.0f, 3.0f, 0);
  check_loss(&rng, stream, "soft targets (mixup)", 16, 10, 0.0f, 1, 0.0f, 3.0f, 0);
  check_loss(&rng, stream, "ImageNet width, smoothing 0.1", 8, 1000, 0.1f, 0, 0.0f, 5.0f, 0);
  check_loss(&rng, stream, "ImageNet width, batch 300", 300, 1000, 0.1f, 0, 0.0f, 5.0f, 0);
  check_loss(&rng, stream, "ImageNet width, soft targets", 64, 1000, 0.0f, 1, 0.0f, 5.0f, 0);
  check_loss(&rng, stream, "large logits around 1000", 8, 100, 0.1f, 0, 1000.0f, 20.0f, 0);
  check_loss(&rng, stream, "large logits around 1000, K=1000", 32, 1000, 0.1f, 0, 1000.0f, 20.0f,
             0);
  check_loss(&rng, stream, "K=10, one label out of range", 16, 10, 0.1f, 0, 0.0f, 3.0f, 1);
  check_extreme_logits(stream);
  check_topk(&rng, stream);
  CUDA_CHECK(cudaStreamDestroy(stream));
  return test_finish();
#endif
}
