// test_model.c: the whole model. Parameter counts of the official sizes, and the backward of a
// tiny Swin (shifted windows, H != W, a shift along one side only, a map smaller than the
// window, drop path) against finite differences of its forward, tensor by tensor.
#include <omp.h>

#include "kernels/loss.h"
#include "src/config.h"
#include "src/model.h"
#include "tests/test_util.h"

static Config tiny_config(void) {
  Config c;
  config_defaults(&c);
  c.img_h = 16;  // patch 2 -> 8 x 16 tokens
  c.img_w = 32;
  c.in_chans = 3;
  c.patch_size = 2;
  c.embed_dim = 8;
  memset(c.depths, 0, sizeof c.depths);  // lists end at the first 0
  memset(c.num_heads, 0, sizeof c.num_heads);
  c.num_stages = 3;  // maps 8x16 (4x4 windows, shift 2,2), 4x8 (shift 0,2), 2x4 (one 2x4 window)
  c.depths[0] = 2, c.depths[1] = 2, c.depths[2] = 2;
  c.num_heads[0] = 2, c.num_heads[1] = 2, c.num_heads[2] = 4;
  c.window_size = 4;
  c.mlp_ratio = 2.0f;
  c.qkv_bias = true;
  c.drop_path_rate = 0.3f;
  c.num_classes = 5;
  return c;
}

// L = sum(logits * R): a loss whose gradient reaches every parameter with O(1) magnitude
// (cross-entropy has its own test); accumulated in double.
static double loss_of(Model *m, const float *images, const float *R, int B, int64_t step) {
  model_forward(m, images, DTYPE_F32, (Normalize){{0}, {0}}, B, true, 7, step);
  double L = 0;
  for (int i = 0; i < B * m->cfg.num_classes; i++) L += (double)m->acts.logits[i] * R[i];
  return L;
}

// Central difference of L along V (unit) with step h; w is restored from saved.
static double directional(Model *m, const float *images, const float *R, int B, int64_t step,
                          float *w, const float *saved, const double *V, int64_t n, double h) {
  for (int64_t i = 0; i < n; i++) w[i] = (float)(saved[i] + h * V[i]);
  double Lp = loss_of(m, images, R, B, step);
  for (int64_t i = 0; i < n; i++) w[i] = (float)(saved[i] - h * V[i]);
  double Lm = loss_of(m, images, R, B, step);
  memcpy(w, saved, sizeof(float) * (size_t)n);
  return (Lp - Lm) / (2 * h);
}

static void test_param_counts(void) {
  struct {
    const char *name;
    int embed, depths[4], heads[4];
    long long want;  // timm's parameter count (the Swin-T figure is from the design notes)
  } sizes[] = {
      {"swin_tiny", 96, {2, 2, 6, 2}, {3, 6, 12, 24}, 28288354},
  };
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    Config c;
    config_defaults(&c);
    c.img_h = c.img_w = 224;
    c.embed_dim = sizes[i].embed;
    c.num_stages = 4;
    for (int s = 0; s < 4; s++)
      c.depths[s] = sizes[i].depths[s], c.num_heads[s] = sizes[i].heads[s];
    Model m;
    Error err;
    if (model_create(&m, &c, NULL, 0, &err) != 0) {
      test_check(0, "%s: model_create failed: %s", sizes[i].name, err.msg);
      continue;
    }
    test_check(m.num_values == sizes[i].want, "%s parameter count %lld (want %lld)", sizes[i].name,
               (long long)m.num_values, sizes[i].want);
    model_destroy(&m);
  }
}

static void test_gradients(void) {
  Config c = tiny_config();
  Error err;
  Model m;
  Backend be;
  if (backend_create(&be, "cpu", "fp32", &err) != 0 || model_create(&m, &c, &be, 3, &err) != 0) {
    test_check(0, "tiny model_create: %s", err.msg);
    return;
  }
  model_init_weights(&m, 3);
  TestRng rng = {42};
  // Larger-than-init weights so that every path (attention logits, bias table, LN affine)
  // carries signal well above fp32 rounding.
  test_fill_uniform(&rng, m.weights, m.num_floats, -0.15f, 0.15f);
  int B = 3, K = c.num_classes;
  int64_t n_img = (int64_t)B * c.img_h * c.img_w * c.in_chans;
  float *images = malloc(sizeof(float) * n_img), *R = malloc(sizeof(float) * B * K);
  test_fill_uniform(&rng, images, n_img, -2, 2);
  test_fill_uniform(&rng, R, B * K, -1, 1);
  int64_t step = 11;  // drop path draws depend on the step: some samples dropped, some kept

  loss_of(&m, images, R, B, step);
  bool some_dropped = false;
  for (int i = 0; i < m.num_blocks; i++)
    for (int b = 0; b < B && m.acts.blocks[i].dp_attn; b++)
      some_dropped |= m.acts.blocks[i].dp_attn[b] == 0 || m.acts.blocks[i].dp_mlp[b] == 0;
  test_check(some_dropped, "drop path drops some samples at this step (else the test is weaker)");
  memcpy(m.acts.dlogits, R, sizeof(float) * B * K);  // dL/dlogits = R
  model_zero_grads(&m);
  model_backward(&m, B);
  float *grads = malloc(sizeof(float) * m.num_floats);
  memcpy(grads, m.grads, sizeof(float) * m.num_floats);

  // Bitwise the same gradients with one thread: kernels partition work independently of the
  // thread count.
  int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  loss_of(&m, images, R, B, step);
  memcpy(m.acts.dlogits, R, sizeof(float) * B * K);
  model_zero_grads(&m);
  model_backward(&m, B);
  omp_set_num_threads(threads);
  test_check(memcmp(grads, m.grads, sizeof(float) * m.num_floats) == 0,
             "gradients bitwise identical with 1 and %d threads", threads);

  // Per tensor: the directional derivative along a random unit direction V, by central
  // differences with step h, against <g, V>. Error is measured relative to ||g|| of the tensor:
  // fp32 forward rounding (~1e-7 relative on L ~ 10) over 2h gives ~1e-5 absolute, and the
  // O(h^2) truncation term is ~1e-5 for h = 1e-2; with ||g|| >= ~1e-2 a tolerance of 2e-3
  // passes a correct gradient and fails any wrong term of relative size > 0.2%.
  const double h = 3e-2, tol = 2e-3;
  double worst = 0;
  const char *worst_name = "";
  int failures = 0;
  for (int p = 0; p < m.num_params; p++) {
    const ParamInfo *info = &m.params[p];
    float *w = m.weights + info->offset;
    const float *g = grads + info->offset;
    int64_t n = info->numel;
    double *V = malloc(sizeof(double) * n), vnorm = 0, gnorm = 0, analytic = 0;
    for (int64_t i = 0; i < n; i++) V[i] = test_rng_uniform(&rng, -1, 1), vnorm += V[i] * V[i];
    vnorm = sqrt(vnorm);
    float *saved = malloc(sizeof(float) * n);
    memcpy(saved, w, sizeof(float) * n);
    for (int64_t i = 0; i < n; i++) {
      V[i] /= vnorm;
      analytic += (double)g[i] * V[i];
      gnorm += (double)g[i] * g[i];
    }
    gnorm = sqrt(gnorm);
    // Richardson extrapolation over steps h and 2h cancels the O(h^2) truncation term.
    double d1 = directional(&m, images, R, B, step, w, saved, V, n, h);
    double d2 = directional(&m, images, R, B, step, w, saved, V, n, 2 * h);
    double numeric = (4 * d1 - d2) / 3;
    double e = fabs(numeric - analytic) / (gnorm > 1e-3 ? gnorm : 1e-3);
    if (e > worst) worst = e, worst_name = info->name;
    if (e > tol) {
      failures++;
      test_check(0, "grad %-46s numeric %.6e analytic %.6e |g| %.3e err %.2e", info->name, numeric,
                 analytic, gnorm, e);
    }
    free(V);
    free(saved);
  }
  test_check(failures == 0,
             "all %d parameter gradients match finite differences (worst %.2e at %s, "
             "tol %.0e)",
             m.num_params, worst, worst_name, tol);

  // The check can fail: a gradient off by 1% in one tensor is caught.
  {
    const ParamInfo *info =
        model_find_param(&m, "layers.0.blocks.1.attn.relative_position_bias_table");
    test_check(info != NULL, "bias table of a shifted block exists");
    if (info) {
      int64_t n = info->numel;
      float *w = m.weights + info->offset;
      const float *g = grads + info->offset;
      double analytic = 0, gn = 0;
      float *saved = malloc(sizeof(float) * n);
      memcpy(saved, w, sizeof(float) * n);
      for (int64_t i = 0; i < n; i++) gn += (double)g[i] * g[i];
      gn = sqrt(gn);
      for (int64_t i = 0; i < n; i++) analytic += 1.05 * g[i] * (g[i] / gn);  // 5% too large
      for (int64_t i = 0; i < n; i++) w[i] = (float)(saved[i] + h * g[i] / gn);
      double Lp = loss_of(&m, images, R, B, step);
      for (int64_t i = 0; i < n; i++) w[i] = (float)(saved[i] - h * g[i] / gn);
      double Lm = loss_of(&m, images, R, B, step);
      memcpy(w, saved, sizeof(float) * n);
      double e = fabs((Lp - Lm) / (2 * h) - analytic) / gn;
      test_check(e > tol, "negative control: a 5%% gradient error is detected (err %.2e > %.0e)", e,
                 tol);
      free(saved);
    }
  }

  // Eval forward: no drop path, deterministic, and differs from the train forward.
  model_forward(&m, images, DTYPE_F32, (Normalize){{0}, {0}}, B, false, 7, step);
  float *eval1 = malloc(sizeof(float) * B * K);
  memcpy(eval1, m.acts.logits, sizeof(float) * B * K);
  model_forward(&m, images, DTYPE_F32, (Normalize){{0}, {0}}, B, false, 99, 12345);
  test_check(memcmp(eval1, m.acts.logits, sizeof(float) * B * K) == 0,
             "eval forward ignores seed and step");
  free(eval1);
  free(images);
  free(R);
  free(grads);
  model_destroy(&m);
  backend_destroy(&be);
}

int main(void) {
  test_param_counts();
  test_gradients();
  return test_finish();
}
