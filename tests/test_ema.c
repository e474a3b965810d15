// test_ema.c: the moving average of the weights (train.ema_decay, optim/ema.h).
//   1. The CPU backend's ema_update over 12 steps of changing weights, warmup on and off, against
//      a transcription written here of timm's ModelEmaV3 (get_decay with update_after_step 0,
//      min_decay 0, warmup_gamma 1, warmup_power 2/3; lerp with weight 1 - decay as ATen's
//      kernel computes it): bitwise equal; step 1 copies the weights; within float rounding of
//      ema + (1 - decay) (weights - ema) in double; the warmup's decay landmarks; the decay key a
//      double, as timm's.
//   2. A skipped step (skipped_run > 0) leaves the average bitwise as it was.
//   3. Checkpoints: the average saved as ema.<name> and loaded bit for bit; a checkpoint without
//      one says so; a checkpoint missing one ema tensor is refused, naming it.
//   4. swin_export CKPT OUT weights=ema writes the average (bit for bit in f32), weights=model
//      the weights, and weights=ema on a checkpoint without an average fails with a HINT.
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "src/io/checkpoint.h"
#include "src/io/safetensors.h"
#include "src/model/backend.h"
#include "src/model/model.h"
#include "tests/util/test_model_config.h"
#include "tests/util/test_util.h"

static char dir[] = "/tmp/swin_test_ema_XXXXXX";

// ---- timm's ModelEmaV3, transcribed ---------------------------------------------------------

typedef struct {
  double decay, min_decay;
  int64_t update_after_step;
  bool use_warmup;
  double warmup_gamma, warmup_power;
} ModelEmaV3;

// get_decay(step), line by line (Python floats are doubles; ** is pow).
static double timm_get_decay(const ModelEmaV3 *e, int64_t step_in) {
  int64_t step = step_in - e->update_after_step - 1;
  if (step < 0) step = 0;  // max(0, step - update_after_step - 1)
  if (step <= 0) return 0.0;
  double decay;
  if (e->use_warmup) {
    decay = 1 - pow(1 + (double)step / e->warmup_gamma, -e->warmup_power);
    decay = fmax(fmin(decay, e->decay), e->min_decay);
  } else {
    decay = e->decay;
  }
  return decay;
}

// ema_v.lerp_(model_v, weight=1. - decay): the Python double 1 - decay becomes the float kernel's
// scalar; ATen's lerp takes self + w (end - self) below |w| 0.5, end - (end - self)(1 - w) above,
// each as one fused multiply-add (its vectorized CPU kernel: fmadd(w or w - 1, end - self, self or
// end); its CUDA kernel compiles the same expressions to fma).
static void timm_apply_update(float *ema, const float *model, int64_t n, double decay) {
  const float w = (float)(1. - decay);
  for (int64_t i = 0; i < n; i++) {
    float self = ema[i], end = model[i];
    ema[i] = fabsf(w) < 0.5f ? fmaf(w, end - self, self) : fmaf(w - 1.0f, end - self, end);
  }
}

static int64_t count_differ(const float *a, const float *b, int64_t n) {
  int64_t d = 0;
  for (int64_t i = 0; i < n; i++) d += memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return d;
}

// ---- 1, 2: the update ---------------------------------------------------------------------------

enum { N = 10007, STEPS = 12, SKIP_AT = 7 };

static void test_update(Backend *be, bool warmup) {
  const double decay = 0.9;  // timm's Python float
  const ModelEmaV3 timm = {.decay = decay,
                           .min_decay = 0.0,
                           .update_after_step = 0,
                           .use_warmup = warmup,
                           .warmup_gamma = 1.0,
                           .warmup_power = 2.0 / 3.0};
  const EmaSettings s = {.decay = decay, .warmup = warmup};
  TestRng rng = {warmup ? 0xe3a1u : 0xe3a2u};
  // CPU backend memory is host memory.
  float *ema = be->ops->alloc(be, sizeof(float) * N),
        *weights = be->ops->alloc(be, sizeof(float) * N);
  OptimState *state = be->ops->alloc(be, sizeof(OptimState));
  float *want = test_alloc_floats(N), *before = test_alloc_floats(N);
  double *ref = malloc(sizeof(double) * N);
  test_fill_uniform(&rng, ema, N, -1.0f, 1.0f);  // timm's deepcopy of the model at the start
  test_fill_uniform(&rng, weights, N, -1.0f, 1.0f);
  memcpy(want, ema, sizeof(float) * N);
  const char *tag = warmup ? "warmup" : "no warmup";
  int64_t t = 0;  // applied updates
  for (int k = 1; k <= STEPS; k++) {
    // The weights move as training moves them: a small random step each update.
    for (int i = 0; i < N; i++) weights[i] += test_rng_uniform(&rng, -0.05f, 0.05f);
    bool skip = k == SKIP_AT;
    memcpy(before, ema, sizeof(float) * N);
    if (skip) {
      state->skipped_run = 1;  // as optimizer_decide leaves it after a skip; adam_steps stays
    } else {
      state->skipped_run = 0;
      state->adam_steps = ++t;
    }
    be->ops->ema_update(be, ema, weights, N, s, state);
    if (skip) {
      test_check(count_differ(ema, before, N) == 0,
                 "ema %-9s step %2d: a skipped step leaves the average bitwise unchanged", tag, k);
      continue;
    }
    double d = timm_get_decay(&timm, t);
    for (int i = 0; i < N; i++) ref[i] = want[i] + (1.0 - d) * ((double)weights[i] - want[i]);
    timm_apply_update(want, weights, N, d);
    int64_t differ = count_differ(ema, want, N);
    // Against the formula in double from the same starting average: each element is one fma
    // (one rounding) of |ema| <= ~2: within 2^-24 relative.
    double num = 0, den = 0;
    for (int i = 0; i < N; i++) {
      num += ((double)ema[i] - ref[i]) * ((double)ema[i] - ref[i]);
      den += ref[i] * ref[i];
    }
    double rel = sqrt(num / den);
    test_check(differ == 0 && rel <= 1e-7,
               "ema %-9s step %2d (t %2lld, decay %.6f): bitwise timm's ModelEmaV3 (%lld of %d "
               "differ), rel err %.1e vs ema + (1 - decay)(w - ema) in double (tol 1e-7)",
               tag, k, (long long)t, d, (long long)differ, N, rel);
    if (t == 1)
      test_check(count_differ(ema, weights, N) == 0,
                 "ema %-9s the first update copies the weights exactly", tag);
    memcpy(want, ema, sizeof(float) * N);  // the next step starts from the same average
  }
  // The decay itself, at landmarks a reader can check: 1 - t^(-2/3) with warmup.
  if (warmup) {
    test_check(fabs(ema_decay_at(s, 2) - (1 - pow(2.0, -2.0 / 3.0))) < 1e-15 &&
                   ema_decay_at(s, 2) > 0.37 && ema_decay_at(s, 2) < 0.371,
               "warmup: decay after 2 updates %.6f = 1 - 2^(-2/3)", ema_decay_at(s, 2));
    test_check(ema_decay_at(s, 31) < 0.9 && ema_decay_at(s, 32) == (double)decay,
               "warmup: decay below %g after 31 updates (%.6f), capped at it after 32",
               (double)decay, ema_decay_at(s, 31));
    EmaSettings long_run = {.decay = 0.9998, .warmup = true};
    test_check(fabs(ema_decay_at(long_run, 31623) - 0.999) < 1e-6,
               "warmup: decay 0.999 after 31,623 updates (%.7f)", ema_decay_at(long_run, 31623));
  } else {
    test_check(ema_decay_at(s, 1) == 0.0 && ema_decay_at(s, 2) == (double)decay,
               "no warmup: decay 0 at the first update, %g from the second", (double)decay);
  }
  be->ops->release(be, ema);
  be->ops->release(be, weights);
  be->ops->release(be, state);
  free(want);
  free(before);
  free(ref);
}

// train.ema_decay is kept as the double written, as timm's Python float: 1 - 0.9998 is 2e-4 to the
// float the lerp takes, where a float key would give 1 - 0.99980003 = 1.99974e-4 (0.013% off), and
// the value travels through a checkpoint's config text unchanged.
static void test_decay_is_a_double(void) {
  Config c, back;
  Error err;
  config_defaults(&c);
  config_defaults(&back);
  int rc = config_apply_override(&c, "train.ema_decay=0.9998", &err);
  char *ini = config_to_ini(&c);
  if (rc == 0) rc = config_load_string(&back, ini, "the config text", &err);
  free(ini);
  EmaSettings s = {.decay = back.ema_decay};
  test_check(rc == 0 && c.ema_decay == 0.9998 && back.ema_decay == 0.9998 &&
                 ema_step_weight(&(OptimState){.adam_steps = 5}, s, &(float){0}) &&
                 (float)(1.0 - ema_decay_at(s, 5)) == (float)(1.0 - 0.9998),
             "train.ema_decay=0.9998 is the double 0.9998, through config text too (%.17g); the "
             "lerp weight %.9g",
             back.ema_decay, (double)(float)(1.0 - ema_decay_at(s, 5)));
}

// ---- 3: checkpoints -----------------------------------------------------------------------------

static Config small_config(void) {
  Config c = test_model_config((TestModel){.img_h = 16,
                                           .chans = 3,
                                           .patch = 2,
                                           .embed = 8,
                                           .window = 4,
                                           .classes = 5,
                                           .depths = {2, 2},
                                           .heads = {2, 4}});
  c.ema_decay = 0.99;
  config_validate(&c, NULL);
  return c;
}

// Random values in every tensor (the alignment gaps stay zero, as the model keeps them).
static void fill_params(const Model *m, float *x, TestRng *r, float lo, float hi) {
  memset(x, 0, sizeof(float) * (size_t)m->num_floats);
  for (int i = 0; i < m->num_params; i++)
    test_fill_uniform(r, x + m->params[i].offset, tensor_numel(&m->params[i].t), lo, hi);
}

typedef struct {
  Model m;
  float *exp_avg, *exp_avg_sq, *ema;
} Fixture;

static int fixture_create(Fixture *f, uint64_t seed) {
  Config c = small_config();
  Error err;
  if (model_create(&f->m, &c, NULL, 0, &err) != 0) {
    test_check(0, "model_create: %s", err.msg);
    return -1;
  }
  size_t bytes = sizeof(float) * (size_t)f->m.num_floats;
  f->exp_avg = malloc_check(bytes);
  f->exp_avg_sq = malloc_check(bytes);
  f->ema = malloc_check(bytes);
  TestRng r = {seed};
  fill_params(&f->m, f->m.weights, &r, -1, 1);
  fill_params(&f->m, f->exp_avg, &r, -1e-3f, 1e-3f);
  fill_params(&f->m, f->exp_avg_sq, &r, 1e-8f, 1e-6f);
  fill_params(&f->m, f->ema, &r, -1, 1);
  return 0;
}

static void fixture_destroy(Fixture *f) {
  free(f->exp_avg);
  free(f->exp_avg_sq);
  free(f->ema);
  model_destroy(&f->m);
}

static char *path_in_dir(const char *name) {
  static char p[4][512];
  static int k;
  k = (k + 1) % 4;
  snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
  return p[k];
}

// Rewrites checkpoint `from` into `to` without tensor `drop` (metadata kept).
static void copy_without(const char *from, const char *to, const char *drop) {
  SafeTensors st;
  Error err;
  if (safetensors_read(&st, from, &err) != 0) {
    test_check(0, "read %s: %s", from, err.msg);
    return;
  }
  SafeTensorWriter w;
  safetensors_writer_init(&w);
  for (int i = 0; i < st.meta_count; i++)  // the writer computes the checksum anew
    if (strcmp(st.meta[i].key, "swin.checksum") != 0)
      safetensors_writer_meta(&w, st.meta[i].key, st.meta[i].value);
  for (int i = 0; i < st.count; i++) {
    const SafeTensorEntry *e = &st.entries[i];
    if (strcmp(e->name, drop) == 0) continue;
    Tensor t = safetensors_entry_tensor(&st, e);
    safetensors_writer_add(&w, e->name, t.dtype, t.ndim, t.shape, t.data);
  }
  if (safetensors_writer_save(&w, to, &err) != 0) test_check(0, "write %s: %s", to, err.msg);
  safetensors_writer_free(&w);
  safetensors_free(&st);
}

static void test_checkpoints(char *with_ema, char *without_ema, size_t size) {
  Fixture f, g;
  if (fixture_create(&f, 21) != 0 || fixture_create(&g, 22) != 0) return;
  TrainState s = {.step = 7, .epoch = 1, .batch = 2, .seed = 0, .loss_scale = 1};
  Error err;
  int rc =
      checkpoint_save(dir, &f.m, f.exp_avg, f.exp_avg_sq, f.ema, &s, NULL, 5, with_ema, size, &err);
  test_check(rc == 0, "checkpoint with the average saved%s%s", rc ? ": " : "", rc ? err.msg : "");
  s.step = 8;
  rc = checkpoint_save(dir, &f.m, f.exp_avg, f.exp_avg_sq, NULL, &s, NULL, 5, without_ema, size,
                       &err);
  test_check(rc == 0, "checkpoint without an average saved%s%s", rc ? ": " : "", rc ? err.msg : "");
  SafeTensors st;
  if (safetensors_read(&st, with_ema, &err) == 0) {
    const SafeTensorEntry *e = safetensors_find(&st, "ema.layers.1.blocks.1.mlp.fc2.weight");
    const Param *p = model_find_param(&f.m, "layers.1.blocks.1.mlp.fc2.weight");
    Tensor t = e ? safetensors_entry_tensor(&st, e) : (Tensor){0};
    test_check(e && p && t.dtype == DTYPE_F32 && tensor_same_shape(&t, &p->t) &&
                   memcmp(t.data, f.ema + p->offset, tensor_bytes(&p->t)) == 0 &&
                   st.count == 4 * f.m.num_params,
               "the file holds the average as ema.<name>, fp32, the weights' shapes (%d tensors "
               "= 4 x %d)",
               st.count, f.m.num_params);
    safetensors_free(&st);
  }

  // Loaded into the other fixture: everything bit for bit.
  TrainState got;
  rc = checkpoint_load(with_ema, &g.m, g.exp_avg, g.exp_avg_sq, g.ema, &got, &err);
  size_t bytes = sizeof(float) * (size_t)f.m.num_floats;
  test_check(rc == 0 && got.has_ema && memcmp(g.ema, f.ema, bytes) == 0 &&
                 memcmp(g.m.weights, f.m.weights, bytes) == 0 && got.step == 7,
             "loaded: the average bit for bit, has_ema set, weights and step as saved%s%s",
             rc ? ": " : "", rc ? err.msg : "");
  // Without an average: loads, says so, leaves the caller's buffer alone.
  float *untouched = test_alloc_floats(f.m.num_floats);
  memcpy(untouched, g.ema, bytes);
  rc = checkpoint_load(without_ema, &g.m, g.exp_avg, g.exp_avg_sq, g.ema, &got, &err);
  test_check(rc == 0 && !got.has_ema && memcmp(g.ema, untouched, bytes) == 0,
             "a checkpoint without an average loads, has_ema false, the buffer untouched%s%s",
             rc ? ": " : "", rc ? err.msg : "");
  // With one but not wanted (NULL): loads the rest.
  rc = checkpoint_load(with_ema, &g.m, g.exp_avg, g.exp_avg_sq, NULL, &got, &err);
  test_check(rc == 0 && got.has_ema, "a checkpoint with an average loads with ema NULL%s%s",
             rc ? ": " : "", rc ? err.msg : "");
  // One ema tensor missing: refused, naming it.
  char *partial = path_in_dir("partial.safetensors");
  copy_without(with_ema, partial, "ema.norm.bias");
  rc = checkpoint_load(partial, &g.m, g.exp_avg, g.exp_avg_sq, g.ema, &got, &err);
  test_check(rc != 0 && strstr(err.msg, "ema.norm.bias") && memcmp(g.ema, untouched, bytes) == 0,
             "a checkpoint missing ema.norm.bias is refused, naming it, nothing loaded: %s",
             rc ? err.msg : "(loaded)");
  free(untouched);
  fixture_destroy(&g);
  fixture_destroy(&f);
}

// ---- 4: swin_export weights=ema ----------------------------------------------------------------

// Runs a shell command; returns its exit code, its output (stdout and stderr) in out.
static int run(const char *cmd, char *out, size_t size) {
  char full[2048], log[512];
  snprintf(log, sizeof log, "%s", path_in_dir("cmd.log"));
  snprintf(full, sizeof full, "%s >%s 2>&1", cmd, log);
  int status = system(full);
  out[0] = 0;
  FILE *f = fopen(log, "rb");
  if (f) {
    size_t n = fread(out, 1, size - 1, f);
    out[n] = 0;
    fclose(f);
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Every tensor of the export equals the same tensor of src (num_floats, laid out as the model).
static int64_t tensors_differing(const char *path, const Model *m, const float *src) {
  SafeTensors st;
  Error err;
  if (safetensors_read(&st, path, &err) != 0) return -1;
  int64_t bad = st.count == m->num_params ? 0 : 1;
  for (int i = 0; i < m->num_params; i++) {
    const SafeTensorEntry *e = safetensors_find(&st, m->params[i].t.name);
    Tensor t = e ? safetensors_entry_tensor(&st, e) : (Tensor){0};
    bad += !e || t.dtype != DTYPE_F32 || !tensor_same_shape(&t, &m->params[i].t) ||
           memcmp(t.data, src + m->params[i].offset, tensor_bytes(&m->params[i].t)) != 0;
  }
  safetensors_free(&st);
  return bad;
}

static void test_export(const char *with_ema, const char *without_ema) {
  if (access("./swin_export", X_OK) != 0) {
    test_check(0, "./swin_export is not in the test's directory (the build directory)");
    return;
  }
  Fixture f;
  if (fixture_create(&f, 21) != 0) return;  // the values saved in test_checkpoints
  char cmd[2048], out[4096], ema_out[512], model_out[512];
  snprintf(ema_out, sizeof ema_out, "%s", path_in_dir("ema.safetensors"));
  snprintf(model_out, sizeof model_out, "%s", path_in_dir("model.safetensors"));
  snprintf(cmd, sizeof cmd, "./swin_export '%s' '%s' weights=ema", with_ema, ema_out);
  int code = run(cmd, out, sizeof out);
  int64_t bad = code == 0 ? tensors_differing(ema_out, &f.m, f.ema) : -1;
  test_check(code == 0 && bad == 0 && strstr(out, "moving average"),
             "swin_export CKPT OUT weights=ema: exit %d, the average's tensors bit for bit (%lld "
             "differ): %.200s",
             code, (long long)bad, out);
  snprintf(cmd, sizeof cmd, "./swin_export '%s' '%s' weights=model", with_ema, model_out);
  code = run(cmd, out, sizeof out);
  bad = code == 0 ? tensors_differing(model_out, &f.m, f.m.weights) : -1;
  test_check(code == 0 && bad == 0,
             "swin_export CKPT OUT weights=model: exit %d, the weights (%lld differ)", code,
             (long long)bad);
  snprintf(cmd, sizeof cmd, "./swin_export '%s' '%s' weights=ema", without_ema, ema_out);
  code = run(cmd, out, sizeof out);
  test_check(code == 1 && strstr(out, "no moving average") && strstr(out, "HINT"),
             "weights=ema on a checkpoint without an average: exit %d, says so with a HINT: %.300s",
             code, out);
  fixture_destroy(&f);
}

int main(void) {
  if (!mkdtemp(dir)) return 1;
  Backend be;
  Error err;
  if (backend_create(&be, "cpu", "fp32", &err) != 0) {
    printf("FAIL backend: %s\n", err.msg);
    return 1;
  }
  test_update(&be, false);
  test_update(&be, true);
  test_decay_is_a_double();
  backend_destroy(&be);
  char with_ema[512], without_ema[512];
  test_checkpoints(with_ema, without_ema, sizeof with_ema);
  test_export(with_ema, without_ema);
  char rm[600];
  snprintf(rm, sizeof rm, "rm -rf %s", dir);
  if (test_stats.failed == 0 && system(rm) != 0) printf("note: could not remove %s\n", dir);
  return test_finish();
}
