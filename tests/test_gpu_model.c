// test_gpu_model.c: the whole model on the CUDA backend against the CPU reference, in fp32, bf16
// and fp16: the same weights, the same uint8 batch and the same drop-path draws, then logits,
// the smoothed loss, dlogits and the gradient of every parameter tensor, each as a relative error
// ||gpu - cpu|| / ||cpu||. Three geometries: a three-stage Swin with window 7 like Swin-T's
// (28x28 -> 14x14 -> 7x7 maps, shifted windows of 49 tokens, head_dim 32, drop path), a small
// one with rectangular maps (H != W) and a last stage shifted along one side only, and window 12
// (144-token windows: the flash attention kernels); and two Swin V2 models (model.version = 2),
// window 8 (64-token windows) and window 16 (256 tokens, the flash kernels), whose res-post-norm
// weights are drawn around 1 (timm starts them at 0, where no gradient reaches the blocks).
// fp16 runs with a
// loss scale of 1024 (dlogits scaled, gradients compared after unscaling), as the trainer does. The
// GPU run is repeated to check it is bitwise deterministic.
#include "tests/util/test_gpu_util.h"

#ifdef SWIN_HAVE_CUDA
#include <math.h>

#include "src/base/config.h"
#include "src/model/backend.h"
#include "src/model/model.h"

typedef struct {
  const char *name;
  Config cfg;
  int B;
} Case;

static Config base_config(void) {
  Config c;
  config_defaults(&c);
  memset(c.depths, 0, sizeof c.depths);  // lists end at the first 0
  memset(c.num_heads, 0, sizeof c.num_heads);
  memset(c.mean, 0, sizeof c.mean);
  memset(c.std, 0, sizeof c.std);
  c.num_mean = 1;
  c.mean[0] = 0.45f;
  c.std[0] = 0.25f;
  c.drop_path_rate = 0.3f;
  c.label_smoothing = 0.1f;
  return c;
}

// Swin-T's geometry at 112 pixels: 28x28 tokens (16 shifted 7x7 windows), 14x14, then 7x7 (one
// window, no shift); widths 96/192/384 with 32 channels per head.
static Config swin_like(void) {
  Config c = base_config();
  c.img_h = c.img_w = 112;
  c.in_chans = 3;
  c.patch_size = 4;
  c.embed_dim = 96;
  c.num_stages = 3;
  c.depths[0] = 2, c.depths[1] = 2, c.depths[2] = 2;
  c.num_heads[0] = 3, c.num_heads[1] = 6, c.num_heads[2] = 12;
  c.window_size = 7;
  c.num_classes = 100;
  return c;
}

// 16x32 tokens in 4x4 windows shifted 2,2; 8x16 shifted 2,2; then 4x8, whose height equals the
// window, so it shifts along W only; 1 channel, 10 classes.
static Config small_rect(void) {
  Config c = base_config();
  c.img_h = 32;
  c.img_w = 64;
  c.in_chans = 1;
  c.patch_size = 2;
  c.embed_dim = 32;
  c.num_stages = 3;
  c.depths[0] = 2, c.depths[1] = 2, c.depths[2] = 2;
  c.num_heads[0] = 1, c.num_heads[1] = 2, c.num_heads[2] = 4;
  c.window_size = 4;
  c.mlp_ratio = 2.0f;
  c.num_classes = 10;
  return c;
}

// Window 12 as the 384-pixel models: 24x24 tokens in four shifted 12x12 windows (144 tokens,
// the flash attention kernels), then 12x12 (one window, no shift); 32 channels per head.
static Config window12(void) {
  Config c = base_config();
  c.img_h = c.img_w = 96;
  c.in_chans = 3;
  c.patch_size = 4;
  c.embed_dim = 64;
  c.num_stages = 2;
  c.depths[0] = 2, c.depths[1] = 2;
  c.num_heads[0] = 2, c.num_heads[1] = 4;
  c.window_size = 12;
  c.num_classes = 10;
  return c;
}

// Swin V2 at window 8 as swinv2_tiny_window8_256: 16x16 tokens in four shifted 8x8 windows, then
// 8x8 (one window); 32 channels per head.
static Config v2_window8(void) {
  Config c = base_config();
  c.version = 2;
  c.img_h = c.img_w = 64;
  c.in_chans = 3;
  c.patch_size = 4;
  c.embed_dim = 96;
  c.num_stages = 2;
  c.depths[0] = 2, c.depths[1] = 2;
  c.num_heads[0] = 3, c.num_heads[1] = 6;
  c.window_size = 8;
  c.num_classes = 10;
  return c;
}

// Swin V2 at window 16 (swinv2_base_window16_256's window), pretrained at 8: 32x32 tokens in
// four shifted 16x16 windows, then 16x16.
static Config v2_window16(void) {
  Config c = v2_window8();
  c.patch_size = 2;
  c.embed_dim = 64;
  c.num_heads[0] = 2, c.num_heads[1] = 4;
  c.window_size = 16;
  c.pretrained_windows[0] = 8;
  return c;
}

// V2's res-post-norm weights around 1 instead of timm's 0 (fixed values, the same on both
// backends), so that every block's parameters get gradients.
static void post_norms_around_one(Model *m) {
  for (int p = 0; p < m->num_params; p++) {
    const char *n = m->params[p].t.name;
    size_t len = strlen(n);
    if (len < 12 || (strcmp(n + len - 12, "norm1.weight") && strcmp(n + len - 12, "norm2.weight")))
      continue;
    float *w = m->weights + m->params[p].offset;
    for (int64_t i = 0; i < tensor_numel(&m->params[p].t); i++)
      w[i] = 1.0f + 0.1f * (float)((i * 37 + p) % 11 - 5) / 5.0f;
  }
}

typedef struct {
  float *logits, *dlogits, *grads;
  double loss;
} Result;

// One training forward + loss + backward on backend be; results copied to the host.
static Result run_model(Backend *be, const Config *cfg, int B, const uint8_t *pixels_host,
                        const int *labels_host, float loss_scale) {
  Result r = {0};
  Model m;
  Error err;
  if (model_create(&m, cfg, be, B, &err) != 0) {
    test_check(0, "model_create on %s: %s", be->ops->name, err.msg);
    return r;
  }
  model_init_weights(&m, 5);
  if (cfg->version == 2) post_norms_around_one(&m);
  model_weights_to_backend(&m);
  size_t pixel_bytes = (size_t)B * cfg->img_h * cfg->img_w * cfg->in_chans;
  uint8_t *pixels = be->ops->alloc(be, pixel_bytes);
  int *labels = be->ops->alloc(be, sizeof(int) * (size_t)B);
  OptimState *state = be->ops->alloc(be, sizeof(OptimState));
  StepParams *step = be_step_params(be, 3, 0.0f);
  OptimState init = {.loss_scale = loss_scale};
  be->ops->upload(be, pixels, pixels_host, pixel_bytes);
  be->ops->upload(be, labels, labels_host, sizeof(int) * (size_t)B);
  be->ops->upload(be, state, &init, sizeof init);
  Normalize norm = {{0}, {0}};
  for (int c = 0; c < cfg->in_chans; c++) norm.mean[c] = cfg->mean[0], norm.std[c] = cfg->std[0];

  model_forward(&m, pixels, DTYPE_U8, norm, B, true, 11, step);
  be->ops->train_loss(be, m.acts.dlogits, m.acts.logits, labels, NULL, cfg->label_smoothing, B,
                      cfg->num_classes, B, state);
  model_zero_grads(&m);
  model_backward(&m, B, true);

  int64_t K = (int64_t)B * cfg->num_classes;
  r.logits = malloc(sizeof(float) * (size_t)K);
  r.dlogits = malloc(sizeof(float) * (size_t)K);
  r.grads = malloc(sizeof(float) * (size_t)m.num_floats);
  be->ops->download(be, r.logits, m.acts.logits, sizeof(float) * (size_t)K);
  be->ops->download(be, r.dlogits, m.acts.dlogits, sizeof(float) * (size_t)K);
  model_grads_to_host(&m, r.grads);
  OptimState after;
  be->ops->download(be, &after, state, sizeof after);
  r.loss = after.loss_steps ? after.loss_sum / after.loss_steps : NAN;
  for (int64_t i = 0; i < m.num_floats; i++) r.grads[i] /= loss_scale;
  for (int64_t i = 0; i < K; i++) r.dlogits[i] /= loss_scale;
  be->ops->release(be, pixels);
  be->ops->release(be, labels);
  be->ops->release(be, state);
  be->ops->release(be, step);
  model_destroy(&m);
  return r;
}

static void free_result(Result *r) {
  free(r->logits);
  free(r->dlogits);
  free(r->grads);
}

// Tolerances, relative in the 2-norm. fp32: both sides compute in fp32; the GPU sums in other
// orders (cuBLASLt tiles, fp32 LayerNorm statistics vs the CPU's double) and ~30 ops in a chain
// amplify rounding of ~1e-7 a few hundred times at most. bf16 and fp16: every stored activation
// and weight is rounded (2^-9 and 2^-11 relative), over ~10 rounded tensors per block, errors of
// a few such roundings per output; gradients of small tensors (biases, bias tables) sum many
// such terms. Measured on an H200: fp32 logits 4.5e-7, gradients 4.4e-7 (worst tensor 9.8e-7);
// bf16 5.5e-3 / 5.2e-3 (1.2e-2); fp16 6.0e-4 / 6.1e-4 (1.2e-3): the tolerances leave 2-20x.
typedef struct {
  const char *precision;
  double logits, grads, worst_tensor;
} Tolerance;

static const Tolerance tolerances[] = {
    {"fp32", 1e-5, 1e-5, 1e-4},
    {"bf16", 2e-2, 2e-2, 6e-2},
    {"fp16", 3e-3, 3e-3, 1e-2},
};

static void compare_case(const char *name, const Config *cfg, int B, const Tolerance *tol) {
  printf("-- %s, %s, batch %d\n", name, tol->precision, B);
  TestRng rng = {0xC0FFEE ^ (uint64_t)B};
  size_t pixel_bytes = (size_t)B * cfg->img_h * cfg->img_w * cfg->in_chans;
  uint8_t *pixels = malloc(pixel_bytes);
  int *labels = malloc(sizeof(int) * (size_t)B);
  for (size_t i = 0; i < pixel_bytes; i++) pixels[i] = (uint8_t)(test_rng_u64(&rng) >> 56);
  for (int b = 0; b < B; b++) labels[b] = (int)(test_rng_u64(&rng) % (uint64_t)cfg->num_classes);

  Backend cpu, gpu;
  Error err;
  if (backend_create(&cpu, "cpu", "fp32", &err) != 0 ||
      backend_create(&gpu, "cuda", tol->precision, &err) != 0) {
    test_check(0, "backends: %s", err.msg);
    return;
  }
  float scale = strcmp(tol->precision, "fp16") == 0 ? 1024.0f : 1.0f;
  Result want = run_model(&cpu, cfg, B, pixels, labels, 1.0f);
  Result got = run_model(&gpu, cfg, B, pixels, labels, scale);
  Result again = run_model(&gpu, cfg, B, pixels, labels, scale);
  if (!want.grads || !got.grads || !again.grads) return;

  int64_t K = (int64_t)B * cfg->num_classes;
  double e_logits = test_rel_err(got.logits, want.logits, K);
  test_check(e_logits <= tol->logits, "%s %s logits rel err %.2e (tol %.0e)", name, tol->precision,
             e_logits, tol->logits);
  double e_loss = fabs(got.loss - want.loss) / fabs(want.loss);
  test_check(e_loss <= tol->logits, "%s %s loss %.6f vs cpu %.6f (rel %.2e, tol %.0e)", name,
             tol->precision, got.loss, want.loss, e_loss, tol->logits);
  double e_dlogits = test_rel_err(got.dlogits, want.dlogits, K);
  test_check(e_dlogits <= 3 * tol->logits, "%s %s dlogits rel err %.2e (tol %.0e)", name,
             tol->precision, e_dlogits, 3 * tol->logits);

  // Every parameter gradient: the whole vector, and the worst single tensor.
  Model shape;
  model_create(&shape, cfg, NULL, 0, &err);
  double num = 0, den = 0, worst = 0;
  const char *worst_name = "";
  for (int p = 0; p < shape.num_params; p++) {
    const Param *info = &shape.params[p];
    const float *g = got.grads + info->offset, *w = want.grads + info->offset;
    double e = test_rel_err(g, w, tensor_numel(&info->t));
    for (int64_t i = 0; i < tensor_numel(&info->t); i++) {
      num += ((double)g[i] - w[i]) * ((double)g[i] - w[i]);
      den += (double)w[i] * w[i];
    }
    if (!(e <= worst)) worst = e, worst_name = info->t.name;  // NaN counts as worst
  }
  double e_all = sqrt(num / (den > 0 ? den : 1));
  test_check(e_all <= tol->grads, "%s %s all %d gradients together: rel err %.2e (tol %.0e)", name,
             tol->precision, shape.num_params, e_all, tol->grads);
  test_check(worst <= tol->worst_tensor, "%s %s worst tensor %s: rel err %.2e (tol %.0e)", name,
             tol->precision, worst_name, worst, tol->worst_tensor);
  test_check(memcmp(got.grads, again.grads, sizeof(float) * (size_t)shape.num_floats) == 0 &&
                 memcmp(got.logits, again.logits, sizeof(float) * (size_t)K) == 0,
             "%s %s: a second GPU run gives the same bits", name, tol->precision);
  model_destroy(&shape);
  free_result(&want);
  free_result(&got);
  free_result(&again);
  backend_destroy(&cpu);
  backend_destroy(&gpu);
  free(pixels);
  free(labels);
}

int main(void) {
  GPU_TEST_MAIN_BEGIN();
  Config swin = swin_like(), rect = small_rect(), w12 = window12(), v8 = v2_window8(),
         v16 = v2_window16();
  Error err;
  if (config_validate(&swin, &err) != 0 || config_validate(&rect, &err) != 0 ||
      config_validate(&w12, &err) != 0 || config_validate(&v8, &err) != 0 ||
      config_validate(&v16, &err) != 0) {
    test_check(0, "test configs: %s", err.msg);
    return test_finish();
  }
  for (int t = 0; t < 3; t++) {
    compare_case("swin-like 112px", &swin, 4, &tolerances[t]);
    compare_case("rectangular", &rect, 3, &tolerances[t]);
    compare_case("window 12", &w12, 2, &tolerances[t]);
    compare_case("V2 window 8", &v8, 3, &tolerances[t]);
    compare_case("V2 window 16", &v16, 2, &tolerances[t]);
  }
  return test_finish();
}
#else
int main(void) {
  GPU_TEST_MAIN_BEGIN();
}
#endif
