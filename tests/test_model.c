// test_model.c: the whole model. Parameter counts of the official sizes, and the backward of a
// tiny Swin (shifted windows, H != W, a shift along one side only, a map smaller than the
// window, drop path) against finite differences of its forward, tensor by tensor. For data
// parallelism: a batch forwarded in two shares (first_sample) gives the whole batch's logits,
// drop path included; and every gradient that backward reports final (grads_ready) is final.
#include <omp.h>

#include "kernels/loss.h"
#include "src/base/config.h"
#include "src/model/model.h"
#include "tests/util/test_model_config.h"
#include "tests/util/test_util.h"

static Config tiny_config(void) {
  // Patch 2: maps 8x16 (4x4 windows, shift 2,2), 4x8 (shift 0,2), 2x4 (one 2x4 window).
  Config c = test_model_config((TestModel){.img_h = 16,
                                           .img_w = 32,
                                           .chans = 3,
                                           .patch = 2,
                                           .embed = 8,
                                           .window = 4,
                                           .classes = 5,
                                           .depths = {2, 2, 2},
                                           .heads = {2, 2, 4}});
  c.mlp_ratio = 2.0f;
  c.qkv_bias = true;
  c.drop_path_rate = 0.3f;
  c.num_classes = 5;
  return c;
}

// L = sum(logits * R): a loss whose gradient reaches every parameter with O(1) magnitude
// (cross-entropy has its own test); accumulated in double.
static double loss_of(Model *m, const float *images, const float *R, int B, int64_t step) {
  // The CPU backend's memory is host memory: the step's values may live on the stack.
  const StepParams at = {.step = step};
  model_forward(m, images, DTYPE_F32, (Normalize){{0}, {0}}, B, true, 7, &at);
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
  model_backward(&m, B, true);
  float *grads = malloc(sizeof(float) * m.num_floats);
  memcpy(grads, m.grads, sizeof(float) * m.num_floats);

  // Bitwise the same gradients with one thread: kernels partition work independently of the
  // thread count.
  int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  loss_of(&m, images, R, B, step);
  memcpy(m.acts.dlogits, R, sizeof(float) * B * K);
  model_zero_grads(&m);
  model_backward(&m, B, true);
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
    const Param *info = &m.params[p];
    float *w = m.weights + info->offset;
    const float *g = grads + info->offset;
    int64_t n = tensor_numel(&info->t);
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
    if (e > worst) worst = e, worst_name = info->t.name;
    if (e > tol) {
      failures++;
      test_check(0, "grad %-46s numeric %.6e analytic %.6e |g| %.3e err %.2e", info->t.name,
                 numeric, analytic, gnorm, e);
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
    const Param *info = model_find_param(&m, "layers.0.blocks.1.attn.relative_position_bias_table");
    test_check(info != NULL, "bias table of a shifted block exists");
    if (info) {
      int64_t n = tensor_numel(&info->t);
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
  model_forward(&m, images, DTYPE_F32, (Normalize){{0}, {0}}, B, false, 7,
                &(StepParams){.step = step});
  float *eval1 = malloc(sizeof(float) * B * K);
  memcpy(eval1, m.acts.logits, sizeof(float) * B * K);
  model_forward(&m, images, DTYPE_F32, (Normalize){{0}, {0}}, B, false, 99,
                &(StepParams){.step = 12345});
  test_check(memcmp(eval1, m.acts.logits, sizeof(float) * B * K) == 0,
             "eval forward ignores seed and step");
  free(eval1);
  free(images);
  free(R);
  free(grads);
  model_destroy(&m);
  backend_destroy(&be);
}

// A tiny model on the CPU backend with enlarged random weights, and B random images.
static bool tiny_model(Model *m, Backend *be, int B, TestRng *rng, float **images) {
  Config c = tiny_config();
  Error err;
  if (backend_create(be, "cpu", "fp32", &err) != 0 || model_create(m, &c, be, B, &err) != 0) {
    test_check(0, "tiny model_create: %s", err.msg);
    return false;
  }
  test_fill_uniform(rng, m->weights, m->num_floats, -0.15f, 0.15f);
  int64_t n = (int64_t)B * c.img_h * c.img_w * c.in_chans;
  *images = test_alloc_floats(n);
  test_fill_uniform(rng, *images, n, -2, 2);
  return true;
}

// Rank r of a data-parallel job forwards its share of the batch with first_sample = its first
// image's index in the batch: the logits of two shares must be the whole batch's, drop path
// included (each sample's computation does not depend on the others', and its drop-path draws
// are keyed by its global index). Forwarding the second share as if it began the batch must
// not match: the drop pattern of samples 0.. would be applied to samples 2...
static void test_split_batch(void) {
  enum { B = 4, HALF = 2 };
  TestRng rng = {7};
  Model m;
  Backend be;
  float *images;
  if (!tiny_model(&m, &be, B, &rng, &images)) return;
  const int K = m.cfg.num_classes;
  const int64_t per_image = (int64_t)m.cfg.img_h * m.cfg.img_w * m.cfg.in_chans, step = 11;
  float whole[B * 5], split[B * 5], wrong[HALF * 5];
  test_check(K == 5, "tiny model has 5 classes");
  const StepParams at = {.step = step};  // CPU backend memory is host memory
  model_forward(&m, images, DTYPE_F32, (Normalize){{0}, {0}}, B, true, 7, &at);
  memcpy(whole, m.acts.logits, sizeof(float) * B * K);
  int dropped = 0;
  for (int64_t i = 0; i < 2 * (int64_t)m.num_blocks * B; i++) dropped += m.acts.drop_scales[i] == 0;
  for (int share = 0; share < 2; share++) {
    const StepParams share_at = {.step = step, .first_sample = share * HALF};
    model_forward(&m, images + share * HALF * per_image, DTYPE_F32, (Normalize){{0}, {0}}, HALF,
                  true, 7, &share_at);
    memcpy(split + share * HALF * K, m.acts.logits, sizeof(float) * HALF * K);
  }
  double err = test_rel_err(split, whole, B * K);
  test_check(dropped > 0 && err == 0,
             "a batch of %d in two shares (first_sample 0 and %d): the same logits, drop path "
             "included (%d of %d drops; rel err %.1e)",
             B, HALF, dropped, 2 * m.num_blocks * B, err);
  model_forward(&m, images + HALF * per_image, DTYPE_F32, (Normalize){{0}, {0}}, HALF, true, 7,
                &at);
  memcpy(wrong, m.acts.logits, sizeof(float) * HALF * K);
  err = test_rel_err(wrong, whole + HALF * K, HALF * K);
  test_check(err > 1e-3,
             "negative control: the second share drawn as samples 0.. differs (rel err %.2e)", err);
  free(images);
  model_destroy(&m);
  backend_destroy(&be);
}

// Snapshots of the gradient buffer from each grads_ready call, from its offset to the end.
typedef struct {
  const Model *m;
  int calls;
  int64_t offsets[64];
  float *above[64];
  float *whole_at_first;  // the whole buffer at the first call: the negative control
} Marks;

static void record_mark(void *ctx, int64_t lowest) {
  Marks *k = ctx;
  const Model *m = k->m;
  if (k->calls == 0) {
    k->whole_at_first = test_alloc_floats(m->num_floats);
    memcpy(k->whole_at_first, m->grads, sizeof(float) * (size_t)m->num_floats);
  }
  if (k->calls >= 64) return;
  int64_t n = m->num_floats - lowest;
  k->offsets[k->calls] = lowest;
  k->above[k->calls] = test_alloc_floats(n > 0 ? n : 1);
  memcpy(k->above[k->calls], m->grads + lowest, sizeof(float) * (size_t)n);
  k->calls++;
}

// A data-parallel trainer reduces a gradient bucket as soon as backward reports it final: every
// value it reported final must be what backward leaves there at the end. Marks come after every
// block and every patch merging, then 0, at falling offsets.
static void test_grads_ready(void) {
  enum { B = 3 };
  TestRng rng = {11};
  Model m;
  Backend be;
  float *images;
  if (!tiny_model(&m, &be, B, &rng, &images)) return;
  Marks marks = {.m = &m};
  m.grads_ready = record_mark;
  m.grads_ready_ctx = &marks;
  model_forward(&m, images, DTYPE_F32, (Normalize){{0}, {0}}, B, true, 7,
                &(StepParams){.step = 11});
  test_fill_uniform(&rng, m.acts.dlogits, (int64_t)B * m.cfg.num_classes, -1, 1);
  model_zero_grads(&m);
  model_backward(&m, B, true);
  int merges = m.num_stages - 1;
  bool falling = true, final = true;
  for (int i = 0; i < marks.calls; i++) {
    falling &= i == 0 || marks.offsets[i] < marks.offsets[i - 1];
    int64_t n = m.num_floats - marks.offsets[i];
    final &= memcmp(marks.above[i], m.grads + marks.offsets[i], sizeof(float) * (size_t)n) == 0;
  }
  test_check(
      marks.calls == m.num_blocks + merges + 1 && falling && marks.offsets[marks.calls - 1] == 0,
      "grads_ready: %d marks (want %d blocks + %d merges + the end), falling, last at 0",
      marks.calls, m.num_blocks, merges);
  test_check(final, "grads_ready: every gradient at or above each mark is already final there");
  test_check(memcmp(marks.whole_at_first, m.grads, sizeof(float) * (size_t)m.num_floats) != 0,
             "negative control: the buffer below the first mark was not final yet");
  // A micro-batch before the last (gradient accumulation): the same forward and backward again,
  // without report, add the same gradients once more and tell the reducer nothing. Each element
  // is then its value plus the same partial sums again: 2x up to the rounding of each addition
  // (fp32, a few 2^-24 relative; 1e-6 normwise).
  int64_t nd = (int64_t)B * m.cfg.num_classes;
  float *twice = malloc(sizeof(float) * (size_t)m.num_floats),
        *dlogits = malloc(sizeof(float) * nd);
  for (int64_t i = 0; i < m.num_floats; i++) twice[i] = 2 * m.grads[i];
  memcpy(dlogits, m.acts.dlogits, sizeof(float) * nd);
  model_forward(&m, images, DTYPE_F32, (Normalize){{0}, {0}}, B, true, 7,
                &(StepParams){.step = 11});
  memcpy(m.acts.dlogits, dlogits, sizeof(float) * nd);
  int calls = marks.calls;
  model_backward(&m, B, false);
  test_check(marks.calls == calls, "backward without report: no grads_ready call (%d)",
             marks.calls - calls);
  test_close("backward without report: the gradients add up (2x)", m.grads, twice, m.num_floats,
             1e-6);
  free(twice);
  free(dlogits);
  for (int i = 0; i < marks.calls; i++) free(marks.above[i]);
  free(marks.whole_at_first);
  free(images);
  model_destroy(&m);
  backend_destroy(&be);
}

// A backend whose attention serves at most 64-token windows of 64 channels per head (limits of
// the kind the CUDA backend declares, given to the CPU backend's table here so that the check
// runs without a GPU): Swin-T's 7x7 windows pass; a 12x12 window (144 tokens) and 96-channel heads
// are refused with a message naming the key, the stage and the limit.
static void test_backend_limits(void) {
  Backend cpu;
  Error err;
  if (backend_create(&cpu, "cpu", "fp32", &err) != 0) {
    test_check(0, "cpu backend: %s", err.msg);
    return;
  }
  BackendOps limited = *cpu.ops;
  limited.name = "limited";
  limited.max_window_tokens = 64;
  limited.max_head_dim = 64;
  Backend be = cpu;
  be.ops = &limited;
  struct {
    int img, window, heads0;
    const char *want;  // NULL: accepted
  } cases[] = {
      {224, 7, 3, NULL},
      {384, 12, 4,
       "model.window_size = 12: stage 0 has 12x12 windows (144 tokens), but the limited"},
      {224, 7, 1, "model.num_heads: stage 0 has 1 heads of 96 channels"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    Config c;
    config_defaults(&c);
    c.img_h = c.img_w = cases[i].img;
    c.window_size = cases[i].window;
    c.embed_dim = 96;
    c.num_stages = 2;
    c.depths[0] = c.depths[1] = 1;
    c.num_heads[0] = cases[i].heads0, c.num_heads[1] = 6;
    Model m;
    memset(&err, 0, sizeof err);
    int rc = model_create(&m, &c, &be, 1, &err);
    if (!cases[i].want) {
      test_check(rc == 0, "window %d, head dim %d accepted (%s)", c.window_size,
                 96 / cases[i].heads0, rc ? err.msg : "ok");
      if (rc == 0) model_destroy(&m);
    } else {
      test_check(rc != 0 && strstr(err.msg, cases[i].want) && strstr(err.msg, "HINT"),
                 "window %d, head dim %d refused: %s", c.window_size, 96 / cases[i].heads0,
                 err.msg);
    }
  }
  backend_destroy(&cpu);
}

// The parameter table of Swin-T: every row a Param whose tensor describes it (F32, the shape's
// size adding up to the count), with timm's initialization and decay for its kind of tensor,
// decided here from the name independently of model.c's walk; views over a buffer land at the
// row's offset.
static bool has_suffix(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && strcmp(s + n - k, suffix) == 0;
}

static void test_param_table(void) {
  Config c = test_model_config((TestModel){.img_h = 224,
                                           .chans = 3,
                                           .patch = 4,
                                           .embed = 96,
                                           .window = 7,
                                           .classes = 1000,
                                           .depths = {2, 2, 6, 2},
                                           .heads = {3, 6, 12, 24}});
  Model m;
  Error err;
  if (model_create(&m, &c, NULL, 0, &err) != 0) {
    test_check(0, "model_create: %s", err.msg);
    return;
  }
  int64_t total = 0, bad_init = 0, bad_decay = 0, bad_view = 0;
  const char *first_bad = "";
  float *buffer = m.weights;
  for (int i = 0; i < m.num_params; i++) {
    const Param *p = &m.params[i];
    const char *n = p->t.name;
    total += tensor_numel(&p->t);
    ParamInit want = PARAM_INIT_TRUNC_NORMAL;
    if (strncmp(n, "patch_embed.proj.", 17) == 0)
      want = PARAM_INIT_CONV_UNIFORM;
    else if (strstr(n, "norm"))
      want = has_suffix(n, ".weight") ? PARAM_INIT_ONE : PARAM_INIT_ZERO;
    else if (has_suffix(n, ".bias"))
      want = PARAM_INIT_ZERO;
    bool decay = p->t.ndim > 1 && !strstr(n, "relative_position_bias_table");
    Tensor v = model_param_view(&m, i, buffer);
    bool view_ok = v.data == (void *)(buffer + p->offset) && tensor_same_shape(&v, &p->t) &&
                   strcmp(v.name, n) == 0 && p->t.data == NULL && p->t.dtype == DTYPE_F32;
    if (p->init != want || p->decay != decay || !view_ok) {
      bad_init += p->init != want, bad_decay += p->decay != decay, bad_view += !view_ok;
      if (!*first_bad) first_bad = n;
    }
  }
  test_check(total == m.num_values && bad_init == 0 && bad_decay == 0 && bad_view == 0,
             "Swin-T parameter table: %d tensors, %lld values (want %lld); init wrong in %lld, "
             "decay wrong in %lld, views wrong in %lld (first: %s)",
             m.num_params, (long long)total, (long long)m.num_values, (long long)bad_init,
             (long long)bad_decay, (long long)bad_view, first_bad);
  const Param *qkv = model_find_param(&m, "layers.2.blocks.5.attn.qkv.weight");
  char text[160] = "";
  if (qkv) tensor_describe(&qkv->t, text, sizeof text);
  test_check(strcmp(text, "layers.2.blocks.5.attn.qkv.weight (1152, 384) F32") == 0,
             "a row describes itself: %s", text);
  model_destroy(&m);
}

// The activation table describes the arena exactly: every row lies inside it, rows do not
// overlap, the named block buffers are the ones the forward uses, and the shapes follow the
// geometry (the tiny model at batch 3 on the CPU backend).
static int compare_by_address(const void *a, const void *b) {
  const char *x = ((const Tensor *)a)->data, *y = ((const Tensor *)b)->data;
  return x < y ? -1 : x > y;
}

static void test_activation_table(void) {
  Backend be;
  Error err;
  Config c = tiny_config();
  Model m;
  if (backend_create(&be, "cpu", "fp32", &err) != 0 || model_create(&m, &c, &be, 3, &err) != 0) {
    test_check(0, "tiny model on the cpu backend: %s", err.msg);
    return;
  }
  Tensor *rows = malloc_check(sizeof(Tensor) * (size_t)m.num_acts);
  memcpy(rows, m.act_table, sizeof(Tensor) * (size_t)m.num_acts);
  qsort(rows, (size_t)m.num_acts, sizeof(Tensor), compare_by_address);
  const unsigned char *base = m.acts_arena.base, *end = base + m.acts_arena.capacity;
  int outside = 0, overlapping = 0, unnamed = 0;
  size_t bytes = 0;
  for (int i = 0; i < m.num_acts; i++) {
    const unsigned char *d = rows[i].data;
    size_t n = tensor_bytes(&rows[i]);
    bytes += n;
    outside += d < base || d + n > end;
    overlapping += i + 1 < m.num_acts && d + n > (const unsigned char *)rows[i + 1].data;
    unnamed += rows[i].name[0] == '\0' || rows[i].device != DEVICE_CPU;
  }
  test_check(m.num_acts > 0 && outside == 0 && overlapping == 0 && unnamed == 0 &&
                 bytes <= m.acts_arena.capacity,
             "activation table: %d tensors, %zu of %zu arena bytes; outside %d, overlapping %d, "
             "unnamed %d",
             m.num_acts, bytes, m.acts_arena.capacity, outside, overlapping, unnamed);
  // Block 1 of stage 0 (shifted): its qkv is (B * windows, tokens, 3C) and is the forward's.
  const StageGeom *g = &m.stages[0];
  const Tensor *qkv = NULL;
  for (int i = 0; i < m.num_acts; i++)
    if (strcmp(m.act_table[i].name, "layers.0.blocks.1.qkv") == 0) qkv = &m.act_table[i];
  char text[192] = "", want[192];
  if (qkv) tensor_describe(qkv, text, sizeof text);
  snprintf(want, sizeof want, "layers.0.blocks.1.qkv (%d, %d, %d) F32", 3 * g->nW, g->N, 3 * g->C);
  test_check(qkv && qkv->data == m.acts.blocks[1].qkv && strcmp(text, want) == 0,
             "activation table row '%s' is acts.blocks[1].qkv (want '%s')", text, want);
  free(rows);
  model_destroy(&m);
  backend_destroy(&be);
}

int main(void) {
  test_param_counts();
  test_param_table();
  test_gradients();
  test_split_batch();
  test_grads_ready();
  test_backend_limits();
  test_activation_table();
  return test_finish();
}
