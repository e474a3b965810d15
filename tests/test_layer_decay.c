// test_layer_decay.c: layer-wise learning-rate decay (train.layer_decay).
//   1. Swin-T's whole parameter table (configs/swin_tiny.ini): each tensor's layer id and lr
//      scale against a transcription, written here from the official code, of how
//      microsoft/Swin-Transformer's optimizer.py numbers parameters for its fine-tuning groups
//      (get_swin_layer on the official names, scales[i] = layer_decay ** (L + 1 - i)), and every
//      chunk of the AdamW table carrying its tensor's scale; with layer_decay 1 every scale is 1.
//   2. The CPU backend's update applies it: the first AdamW step from zero moments moves each
//      element by lr_c * (wd p + sign(g)) (|g| >> eps), lr_c = lr * its tensor's scale, so each
//      tensor's displacement shows its scale; a run with layer_decay 1 moves every tensor by lr.
#include "src/app/learner.h"
#include "src/base/config.h"
#include "src/model/backend.h"
#include "src/model/model.h"
#include "tests/util/test_model_config.h"
#include "tests/util/test_util.h"

// ---- the official numbering, transcribed --------------------------------------------------------

// timm's name of a parameter in the official layout: patch merging at the end of the previous
// stage, the head without .fc (DESIGN.md, "timm state-dict names").
static void official_name(const char *timm, char *out, size_t size) {
  int s;
  char rest[128];
  if (sscanf(timm, "layers.%d.downsample.%127s", &s, rest) == 2)
    snprintf(out, size, "layers.%d.downsample.%s", s - 1, rest);
  else if (strncmp(timm, "head.fc.", 8) == 0)
    snprintf(out, size, "head.%s", timm + 8);
  else
    snprintf(out, size, "%s", timm);
}

// get_swin_layer(name, num_layers, depths) of optimizer.py, line by line; num_layers is what
// build_optimizer passes, sum(depths) + 2.
static int get_swin_layer(const char *name, int num_layers, const int *depths) {
  // `name in ("mask_token")` tests a substring of the string "mask_token".
  if (strstr("mask_token", name)) return 0;
  if (strncmp(name, "patch_embed", 11) == 0) return 0;
  if (strncmp(name, "layers", 6) == 0) {
    char parts[5][64] = {{0}};
    int n = 0;
    const char *p = name;
    while (n < 5 && *p) {
      const char *dot = strchr(p, '.');
      size_t len = dot ? (size_t)(dot - p) : strlen(p);
      snprintf(parts[n++], sizeof parts[0], "%.*s", (int)len, p);
      p += len + (dot ? 1 : 0);
    }
    int layer_id = atoi(parts[1]);
    const char *block_id = parts[3];
    int below = 0;  // sum(depths[:layer_id])
    for (int i = 0; i < layer_id; i++) below += depths[i];
    if (strcmp(block_id, "reduction") == 0 || strcmp(block_id, "norm") == 0)
      return below + depths[layer_id];  // sum(depths[:layer_id + 1])
    return below + atoi(block_id) + 1;
  }
  return num_layers - 1;
}

static void test_swin_tiny_table(void) {
  Config c;
  Error err;
  config_defaults(&c);
  if (config_load_file(&c, SWIN_SOURCE_DIR "/configs/swin_tiny.ini", &err) != 0) {
    test_check(0, "configs/swin_tiny.ini: %s", err.msg);
    return;
  }
  test_check(c.layer_decay == 1.0f, "configs/swin_tiny.ini keeps the official layer decay 1 (%g)",
             (double)c.layer_decay);
  const float decay = 0.75f;
  c.layer_decay = decay;
  Model m;
  if (config_validate(&c, &err) != 0 || model_create(&m, &c, NULL, 0, &err) != 0) {
    test_check(0, "Swin-T: %s", err.msg);
    return;
  }
  int L = 0;
  for (int s = 0; s < c.num_stages; s++) L += c.depths[s];
  const int num_layers = L + 2;
  // scales = [layer_decay ** i for i in reversed(range(num_layers))]: scales[id] below.
  double scales[64];
  for (int i = 0; i < num_layers; i++) scales[num_layers - 1 - i] = pow((double)decay, (double)i);

  int num_chunks = model_adamw_chunks(&m, c.weight_decay, c.layer_decay, NULL);
  AdamWChunk *chunks = malloc_check(sizeof(AdamWChunk) * (size_t)num_chunks);
  model_adamw_chunks(&m, c.weight_decay, c.layer_decay, chunks);
  int wrong_id = 0, wrong_scale = 0, wrong_chunk = 0, k = 0, ids_seen[64] = {0};
  char first_bad[512] = "";
  for (int i = 0; i < m.num_params; i++) {
    const Param *p = &m.params[i];
    char name[256];
    official_name(p->t.name, name, sizeof name);
    int want = get_swin_layer(name, num_layers, c.depths);
    float want_scale = (float)scales[want];
    float got_scale = model_layer_lr_scale(&m, p->layer_id, c.layer_decay);
    if (p->layer_id != want || got_scale != want_scale) {
      wrong_id += p->layer_id != want;
      wrong_scale += got_scale != want_scale;
      if (!first_bad[0])
        snprintf(first_bad, sizeof first_bad,
                 "; first: %s (official %s) id %d scale %.9g, want %d %.9g", p->t.name, name,
                 p->layer_id, (double)got_scale, want, (double)want_scale);
    }
    if (want >= 0 && want < 64) ids_seen[want]++;
    // Its chunks, in table order, cover it with its scale.
    for (int64_t left = tensor_numel(&p->t); left > 0; left -= chunks[k].count, k++)
      if (k >= num_chunks || chunks[k].lr_scale != want_scale) {
        wrong_chunk++;
        break;
      }
  }
  int distinct = 0;
  for (int i = 0; i < 64; i++) distinct += ids_seen[i] > 0;
  test_check(wrong_id == 0 && wrong_scale == 0,
             "Swin-T, layer_decay %g: the layer ids and lr scales of all %d tensors are the "
             "official fine-tuning code's (%d ids 0..%d; %d wrong ids, %d wrong scales%s)",
             (double)decay, m.num_params, distinct, num_layers - 1, wrong_id, wrong_scale,
             first_bad);
  test_check(wrong_chunk == 0 && k == num_chunks,
             "Swin-T: every one of the %d AdamW chunks carries its tensor's scale (%d tensors "
             "with a wrong chunk)",
             num_chunks, wrong_chunk);
  // Landmarks, as numbers a reader can check by hand (L = 12): the stem scaled by 0.75^13, the
  // merging into stage 1 (official layers.0.downsample) with block 2 (the last of stage 0) at
  // 0.75^11, stage 2's block 5 id 10 at 0.75^3, the final norm and the head at 1.
  const struct {
    const char *name;
    int id;
  } marks[] = {{"patch_embed.proj.weight", 0},
               {"layers.0.blocks.0.norm1.weight", 1},
               {"layers.1.downsample.reduction.weight", 2},
               {"layers.1.downsample.norm.bias", 2},
               {"layers.1.blocks.0.attn.qkv.weight", 3},
               {"layers.2.blocks.5.attn.relative_position_bias_table", 10},
               {"layers.3.downsample.norm.weight", 10},
               {"layers.3.blocks.1.mlp.fc2.bias", 12},
               {"norm.weight", 13},
               {"head.fc.weight", 13}};
  for (size_t i = 0; i < sizeof marks / sizeof marks[0]; i++) {
    const Param *p = model_find_param(&m, marks[i].name);
    float want = (float)pow(0.75, (double)(13 - marks[i].id));
    test_check(
        p && p->layer_id == marks[i].id && model_layer_lr_scale(&m, p->layer_id, decay) == want,
        "  %-52s id %2d, lr scale 0.75^%-2d = %.6f (got id %d)", marks[i].name, marks[i].id,
        13 - marks[i].id, (double)want, p ? p->layer_id : -1);
  }
  // Off: every chunk at exactly 1, so the update is the one without layer decay, bit for bit.
  model_adamw_chunks(&m, c.weight_decay, 1.0f, chunks);
  int not_one = 0;
  for (int i = 0; i < num_chunks; i++) not_one += chunks[i].lr_scale != 1.0f;
  test_check(not_one == 0, "layer_decay 1: all %d chunks at lr scale exactly 1 (%d not)",
             num_chunks, not_one);
  free(chunks);
  model_destroy(&m);
}

// ---- the update applies it ----------------------------------------------------------------------

// The largest |displacement / (lr * scale) - expected| over one tensor, from the first step:
// p1 = p0 (1 - lr_c wd) - lr_c g / (|g| + eps), so (p0 - p1) / lr_c = wd p0 + g / (|g| + eps).
static double tensor_step_error(const Param *p, const float *p0, const float *p1, const float *g,
                                double lr_c, double wd) {
  double worst = 0;
  for (int64_t e = 0; e < tensor_numel(&p->t); e++) {
    int64_t i = p->offset + e;
    double want = wd * p0[i] + g[i] / (fabs(g[i]) + 1e-8);
    double got = ((double)p0[i] - (double)p1[i]) / lr_c;
    double d = isfinite(got) ? fabs(got - want) : INFINITY;
    if (d > worst) worst = d;
  }
  return worst;
}

static void test_update_applies_scale(float layer_decay) {
  Config c = test_model_config((TestModel){.img_h = 16,
                                           .chans = 3,
                                           .patch = 2,
                                           .embed = 8,
                                           .window = 4,
                                           .classes = 5,
                                           .depths = {2, 2},
                                           .heads = {2, 4}});
  c.layer_decay = layer_decay;
  c.clip_grad = 0;
  Backend be;
  Model m;
  Error err;
  if (config_validate(&c, &err) != 0 || backend_create(&be, "cpu", "fp32", &err) != 0 ||
      model_create(&m, &c, &be, 1, &err) != 0) {
    test_check(0, "setup: %s", err.msg);
    return;
  }
  const int64_t n = m.num_floats;
  TestRng rng = {0x1ade};
  float *p0 = test_alloc_floats(n), *g = test_alloc_floats(n);
  memset(p0, 0, sizeof(float) * (size_t)n);
  memset(g, 0, sizeof(float) * (size_t)n);
  for (int i = 0; i < m.num_params; i++) {
    const Param *p = &m.params[i];
    test_fill_uniform(&rng, p0 + p->offset, tensor_numel(&p->t), -1.0f, 1.0f);
    for (int64_t e = 0; e < tensor_numel(&p->t); e++) {
      float mag = test_rng_uniform(&rng, 0.1f, 1.0f);  // |g| >= 0.1: eps negligible
      g[p->offset + e] = (test_rng_u64(&rng) & 1) ? mag : -mag;
    }
  }
  memcpy(m.weights, p0, sizeof(float) * (size_t)n);
  model_weights_to_backend(&m);
  memcpy(m.grads, g, sizeof(float) * (size_t)n);  // CPU backend memory is host memory
  Optimizer o;
  optimizer_create(&o, &m, &c);
  OptimState state = {.loss_scale = 1.0f};
  be.ops->upload(&be, o.state, &state, sizeof state);
  const float lr = 0.1f;
  learner_set_step(&m, &o, 0, lr, 0);
  learner_update(&m, &o, &c);
  // Per element: p0 - p1 carries two roundings of p1 (the decay product and the difference, each
  // at most 6e-8 at |p| <= 1) against lr_c >= 0.1 * 0.5^5 = 3.1e-3: under 4e-5, so 1e-4 covers
  // it; a wrong scale is off by |scale_got / scale_want - 1| >= 0.5 of sign(g).
  double worst = 0;
  int wrong = 0;
  char first_bad[256] = "";
  for (int i = 0; i < m.num_params; i++) {
    const Param *p = &m.params[i];
    double scale = pow((double)layer_decay, (double)(m.num_blocks + 1 - p->layer_id));
    double lr_c = (double)(lr * (float)scale);  // the float product the update forms
    double e = tensor_step_error(p, p0, m.master, g, lr_c, p->decay ? c.weight_decay : 0.0);
    if (e > worst) worst = e;
    if (e > 1e-4 && !wrong++)
      snprintf(first_bad, sizeof first_bad, "; first: %s (id %d, scale %.6f) error %.3e", p->t.name,
               p->layer_id, scale, e);
  }
  test_check(wrong == 0,
             "layer_decay %g, CPU backend's AdamW: each of %d tensors moved by lr x "
             "layer_decay^(%d - id) (worst |step / lr_c - (wd p + sign g)| %.2e, tol 1e-4%s)",
             (double)layer_decay, m.num_params, m.num_blocks + 1, worst, first_bad);
  optimizer_destroy(&o, &be);
  model_destroy(&m);
  backend_destroy(&be);
  free(p0);
  free(g);
}

int main(void) {
  test_swin_tiny_table();
  test_update_applies_scale(0.5f);
  test_update_applies_scale(1.0f);
  return test_finish();
}
