// test_parity.c: swin.c against timm. Each tests/fixtures/*.safetensors was computed by timm in
// float64 (scripts/make_fixtures.py): weights, an input batch, logits, the label-smoothed loss,
// every parameter gradient, and the weights after 1 and 5 AdamW steps with clipping, the
// no-decay set and the warmup + cosine schedule. swin.c computes in fp32, so against a float64
// reference the errors are fp32 rounding: ~1e-7 per op, growing with depth to ~1e-6.
//   logits rel err <= 1e-5, |loss - ref| <= 1e-6, each gradient rel err <= 1e-4,
//   weights after the steps rel err <= 1e-5.
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>

#include "kernels/loss.h"
#include "optim/schedule.h"
#include "src/app/train.h"
#include "src/base/config.h"
#include "src/io/safetensors.h"
#include "src/model/model.h"
#include "tests/util/test_util.h"

#ifndef SWIN_SOURCE_DIR
#define SWIN_SOURCE_DIR "."
#endif

static const float *tensor(const SafeTensors *st, const char *name, int64_t numel) {
  const SafeTensorEntry *e = safetensors_find(st, name);
  if (!e || (int64_t)(e->end - e->begin) != numel * (e->dtype == DTYPE_F32 ? 4 : 4)) {
    test_check(0, "%s: tensor '%s' missing or of the wrong size", st->path, name);
    return NULL;
  }
  return safetensors_entry_data(st, e);
}

// Copies the fixture's tensors "<prefix><timm name>" for every parameter into dst.
static bool load_params(const SafeTensors *st, const Model *m, const char *prefix, float *dst) {
  for (int i = 0; i < m->num_params; i++) {
    char name[160];
    snprintf(name, sizeof name, "%s%s", prefix, m->params[i].t.name);
    const float *src = tensor(st, name, tensor_numel(&m->params[i].t));
    if (!src) return false;
    memcpy(dst + m->params[i].offset, src, sizeof(float) * (size_t)tensor_numel(&m->params[i].t));
  }
  return true;
}

// Compares every parameter of `got` with the fixture's "<prefix>*"; one line per failure and a
// summary line with the worst tensor.
static void compare_params(const SafeTensors *st, const Model *m, const char *prefix,
                           const float *got, double tol, const char *what) {
  float *want = malloc(sizeof(float) * (size_t)m->num_floats);
  if (!load_params(st, m, prefix, want)) return free(want);
  double worst = 0;
  const char *worst_name = "";
  int bad = 0;
  for (int i = 0; i < m->num_params; i++) {
    const Param *p = &m->params[i];
    double e = test_rel_err(got + p->offset, want + p->offset, tensor_numel(&p->t));
    if (e > worst) worst = e, worst_name = p->t.name;
    if (e > tol)
      bad++, test_check(0, "%s %s%s rel_err %.3e (tol %.0e)", what, prefix, p->t.name, e, tol);
  }
  test_check(bad == 0, "%-28s %-10s all %d tensors, worst rel_err %.2e (%s), tol %.0e",
             strrchr(st->path, '/') + 1, what, m->num_params, worst, worst_name, tol);
  free(want);
}

static void check_fixture(const char *path) {
  SafeTensors st;
  Error err;
  if (safetensors_read(&st, path, &err) != 0) {
    test_check(0, "read fixture: %s", err.msg);
    return;
  }
  const char *name = strrchr(path, '/') + 1;
  Config cfg;
  config_defaults(&cfg);
  const char *ini = safetensors_meta_get(&st, "config");
  if (!ini || config_load_string(&cfg, ini, path, &err) != 0 || config_validate(&cfg, &err) != 0) {
    test_check(0, "%s: config: %s", name, ini ? err.msg : "missing");
    safetensors_free(&st);
    return;
  }
  const SafeTensorEntry *in = safetensors_find(&st, "input");
  int B = in ? (int)in->shape[0] : 0, K = cfg.num_classes;
  Model m;
  Backend be;
  if (!in || backend_create(&be, "cpu", "fp32", &err) != 0 ||
      model_create(&m, &cfg, &be, B, &err) != 0) {
    test_check(0, "%s: no input or model: %s", name, err.msg);
    safetensors_free(&st);
    return;
  }
  const float *input = tensor(&st, "input", (int64_t)B * cfg.img_h * cfg.img_w * cfg.in_chans);
  const float *logits_ref = tensor(&st, "logits", (int64_t)B * K);
  const SafeTensorEntry *le = safetensors_find(&st, "labels");
  const int *labels = le ? safetensors_entry_data(&st, le) : NULL;
  const char *loss_text = safetensors_meta_get(&st, "loss");
  if (!input || !logits_ref || !labels || !loss_text || !load_params(&st, &m, "w.", m.weights)) {
    test_check(0, "%s: fixture incomplete", name);
    model_destroy(&m);
    backend_destroy(&be);
    safetensors_free(&st);
    return;
  }

  // Forward, loss, gradients: the trainer's path through the CPU backend.
  float *dlogits = m.acts.dlogits;
  const Normalize none = {{0}, {0}};
  // The CPU backend's memory is host memory: the step's values may live on the stack.
  StepParams at = {.step = 0};
  model_forward(&m, input, DTYPE_F32, none, B, true, cfg.seed, &at);
  test_close("logits", m.acts.logits, logits_ref, (int64_t)B * K, 1e-5);
  double loss = cross_entropy_forward_backward_cpu(dlogits, m.acts.logits, labels, NULL,
                                                   cfg.label_smoothing, B, K, B);
  double loss_ref = atof(loss_text);
  test_check(fabs(loss - loss_ref) <= 1e-6, "%-28s loss %.9f vs timm %.9f (diff %.1e, tol 1e-6)",
             name, loss, loss_ref, fabs(loss - loss_ref));
  model_zero_grads(&m);
  model_backward(&m, B, true);
  compare_params(&st, &m, "grad.", m.grads, 1e-4, "gradients");

  // Five AdamW steps on the same batch.
  LrSchedule sched = {.peak = cfg.lr,
                      .warmup_lr = cfg.warmup_lr,
                      .min_lr = cfg.min_lr,
                      .warmup_steps = atoi(safetensors_meta_get(&st, "warmup_steps")),
                      .total_steps = atoi(safetensors_meta_get(&st, "total_steps"))};
  float *ea = calloc(m.num_floats, sizeof(float)), *eas = calloc(m.num_floats, sizeof(float));
  int num_chunks = model_adamw_chunks(&m, cfg.weight_decay, cfg.layer_decay, NULL);
  AdamWChunk *chunks = malloc(sizeof(AdamWChunk) * (size_t)num_chunks);
  model_adamw_chunks(&m, cfg.weight_decay, cfg.layer_decay, chunks);
  OptimState state = {.loss_scale = 1.0f};
  for (int step = 0; step < 5; step++) {
    at = (StepParams){.step = step, .lr = (float)lr_at_step(&sched, step)};
    model_forward(&m, input, DTYPE_F32, none, B, true, cfg.seed, &at);
    be.ops->train_loss(&be, dlogits, m.acts.logits, labels, NULL, cfg.label_smoothing, B, K, B,
                       &state);
    model_zero_grads(&m);
    model_backward(&m, B, true);
    OptimizerStep hyper = {
        .beta1 = cfg.beta1, .beta2 = cfg.beta2, .eps = cfg.eps, .clip_grad = cfg.clip_grad};
    be.ops->optimizer_step(&be, m.master, NULL, m.grads, ea, eas, m.num_floats, chunks, num_chunks,
                           hyper, &at, &state);
    if (step == 0) compare_params(&st, &m, "step1.", m.weights, 1e-5, "1 step");
  }
  compare_params(&st, &m, "step5.", m.weights, 1e-5, "5 steps");
  free(chunks);
  free(ea);
  free(eas);
  model_destroy(&m);
  backend_destroy(&be);
  safetensors_free(&st);
}

int main(void) {
  const char *dir = SWIN_SOURCE_DIR "/tests/fixtures";
  DIR *d = opendir(dir);
  int found = 0;
  struct dirent *e;
  while (d && (e = readdir(d))) {
    size_t n = strlen(e->d_name);
    if (n < 12 || strcmp(e->d_name + n - 12, ".safetensors") != 0) continue;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    printf("fixture %s\n", path);
    check_fixture(path);
    found++;
  }
  if (d) closedir(d);
  test_check(found >= 5, "found %d timm fixtures in %s (expected 5: 3 V1, 2 V2)", found, dir);
  return test_finish();
}
