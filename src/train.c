// train.c: the training loop. One step reads like the algorithm: forward, loss, backward, global
// norm, clip and AdamW, all queued on the backend (the CPU, or a CUDA stream): batches travel as
// uint8 from the loader's page-locked ring to the device on a copy queue while the previous step
// computes, and the host reads the loss, gradient norm and loss scale back only at logging steps,
// evaluations and checkpoints.
#define _POSIX_C_SOURCE 200809L  // fsync, sigaction, mkdir
#include "src/train.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/loader.h"
#include "optim/schedule.h"
#include "src/backend.h"
#include "src/checkpoint.h"
#include "src/import.h"
#include "src/model.h"

// The one piece of process-wide state: a signal handler can only talk to the loop through a
// flag. Set by SIGINT/SIGTERM, read once per step.
static volatile sig_atomic_t stop_requested = 0;

static void on_stop_signal(int sig) {
  (void)sig;
  stop_requested = 1;
}

void train_install_signal_handlers(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
}

// Batch slots in backend memory: 0 and 1 alternate in training, 2 and 3 in evaluation, so an
// evaluation never overwrites the training batch already uploaded for the next step.
#define TRAIN_SLOT 0
#define EVAL_SLOT 2

typedef struct {
  const Config *cfg;
  Backend be;
  Normalize norm;  // per input channel (data.mean/std given once apply to all)
  Model model;
  float *exp_avg, *exp_avg_sq;            // AdamW moments in backend memory (num_floats each)
  float *host_exp_avg, *host_exp_avg_sq;  // their host copies for checkpoints (the same on the CPU)
  AdamWChunk *chunks;                     // backend memory
  int num_chunks;
  OptimState *opt;      // backend memory
  EvalSums *eval_sums;  // backend memory
  uint8_t *pixels[4];   // batch slots (max_batch, H, W, Cin) in backend memory
  int *labels[4];       // (max_batch)
  Dataset *train_set, *val_set;
  Loader *loader;
  TrainState state;
  int64_t skipped_seen;  // state->skipped at the last read-back
  LrSchedule schedule;
  int64_t steps_per_epoch, total_steps;
  FILE *metrics;  // run_dir/metrics.jsonl
} Trainer;

static bool is_fp16(const Trainer *t) {
  return t->be.act == DTYPE_F16;
}

// ---------------------------------------------------------------------------------------------
// Batches: loader buffer (host, page-locked on CUDA) -> a slot in backend memory.

static void stage_batch(Trainer *t, int slot, const Batch *b) {
  const Config *cfg = t->cfg;
  size_t pixel_bytes = (size_t)b->count * cfg->img_h * cfg->img_w * cfg->in_chans;
  void *dst[2] = {t->pixels[slot], t->labels[slot]};
  const void *src[2] = {b->pixels, b->labels};
  size_t bytes[2] = {pixel_bytes, sizeof(int) * (size_t)b->count};
  t->be.ops->stage_upload(&t->be, slot, 2, dst, src, bytes);
}

// The loader's buffer goes back to its workers once its upload has run.
static void release_batch(Trainer *t, Loader *loader, int slot, Batch *b) {
  t->be.ops->stage_wait(&t->be, slot);
  loader_release_batch(loader, b);
}

// ---------------------------------------------------------------------------------------------
// Evaluation: top-1, top-5 and plain cross-entropy (no smoothing) over the whole val split.

typedef struct {
  double top1, top5, loss;
  int64_t count;
} EvalResult;

static int evaluate(Trainer *t, EvalResult *r, Error *err) {
  const Config *cfg = t->cfg;
  Model *m = &t->model;
  Backend *be = &t->be;
  int eval_batch = cfg->eval_batch_size > 0 ? cfg->eval_batch_size : cfg->batch_size;
  if (eval_batch > m->max_batch) eval_batch = m->max_batch;
  LoaderOptions opt = {.batch_size = eval_batch,
                       .train = false,
                       .seed = cfg->seed,
                       .workers = cfg->workers,
                       .prefetch = cfg->prefetch,
                       .rank = 0,
                       .world = 1,
                       .alloc = be->ops->host_alloc,
                       .release = be->ops->host_release};
  Loader *loader;
  if (loader_create(&loader, t->val_set, &opt, err) != 0) return -1;
  be->ops->zero(be, t->eval_sums, sizeof(EvalSums));
  int slot = EVAL_SLOT;
  Batch *b;
  if (loader_next(loader, &b, err) != 0) goto fail;
  if (b) stage_batch(t, slot, b);
  while (b) {
    be->ops->stage_consume(be, slot);
    model_forward(m, t->pixels[slot], DTYPE_U8, t->norm, b->count, false, cfg->seed, 0, 0);
    be->ops->eval_metrics(be, t->eval_sums, m->acts.logits, t->labels[slot], b->count,
                          cfg->num_classes);
    be->ops->stage_release(be, slot);
    Batch *next;
    if (loader_next(loader, &next, err) != 0) {
      release_batch(t, loader, slot, b);
      goto fail;
    }
    if (next) stage_batch(t, slot ^ 1, next);
    release_batch(t, loader, slot, b);
    b = next;
    slot ^= 1;
  }
  loader_destroy(loader);
  EvalSums sums;
  be->ops->download(be, &sums, t->eval_sums, sizeof sums);
  r->count = sums.count;
  r->top1 = sums.count ? 100.0 * (double)sums.top1 / (double)sums.count : 0;
  r->top5 = sums.count ? 100.0 * (double)sums.top5 / (double)sums.count : 0;
  r->loss = sums.count ? sums.loss_sum / (double)sums.count : 0;
  return 0;
fail:
  loader_destroy(loader);
  return error_prefix(err, "evaluation: ");
}

// ---------------------------------------------------------------------------------------------
// Optimizer state: the moments and the step's decisions live in backend memory; checkpoints
// carry them through the host.

// The device-side state from a TrainState (fresh start or checkpoint).
static void upload_optim_state(Trainer *t) {
  OptimState s = {.adam_steps = t->state.step - t->state.skipped,
                  .skipped = t->state.skipped,
                  .loss_scale = (float)t->state.loss_scale,
                  .good_steps = t->state.scale_good_steps};
  t->be.ops->upload(&t->be, t->opt, &s, sizeof s);
  t->skipped_seen = t->state.skipped;
}

// Reads the device-side state (waits for the queued steps) and clears the loss window.
static OptimState read_optim_state(Trainer *t) {
  OptimState s;
  t->be.ops->download(&t->be, &s, t->opt, sizeof s);
  OptimState cleared = s;
  cleared.loss_sum = 0;
  cleared.loss_steps = 0;
  cleared.bad_losses = 0;
  t->be.ops->upload(&t->be, t->opt, &cleared, sizeof cleared);
  t->state.loss_scale = s.loss_scale;
  t->state.scale_good_steps = s.good_steps;
  t->state.skipped = s.skipped;
  return s;
}

static void upload_moments(Trainer *t) {
  size_t bytes = sizeof(float) * (size_t)t->model.num_floats;
  t->be.ops->upload(&t->be, t->exp_avg, t->host_exp_avg, bytes);
  t->be.ops->upload(&t->be, t->exp_avg_sq, t->host_exp_avg_sq, bytes);
}

static void download_moments(Trainer *t) {
  size_t bytes = sizeof(float) * (size_t)t->model.num_floats;
  t->be.ops->download(&t->be, t->host_exp_avg, t->exp_avg, bytes);
  t->be.ops->download(&t->be, t->host_exp_avg_sq, t->exp_avg_sq, bytes);
}

// ---------------------------------------------------------------------------------------------
// Setup

static int open_metrics(Trainer *t, Error *err) {
  char path[1024];
  snprintf(path, sizeof path, "%s/metrics.jsonl", t->cfg->run_dir);
  t->metrics = fopen(path, "a");
  if (!t->metrics)
    return error_set(err, "cannot open '%s' for appending: %s\nHINT: check run_dir", path,
                     strerror(errno));
  return 0;
}

static int make_run_dir(const char *dir, Error *err) {
  char path[1024];
  snprintf(path, sizeof path, "%s", dir);
  for (char *p = path + 1;; p++) {
    if (*p == '/' || *p == 0) {
      char c = *p;
      *p = 0;
      if (mkdir(path, 0755) != 0 && errno != EEXIST)
        return error_set(err, "cannot create run_dir '%s': %s\nHINT: check the run_dir key", path,
                         strerror(errno));
      *p = c;
      if (c == 0) break;
    }
  }
  return 0;
}

static int load_checkpoint(Trainer *t, const char *path, Error *err) {
  return checkpoint_load(path, &t->model, t->host_exp_avg, t->host_exp_avg_sq, &t->state, err);
}

// resume=auto takes the newest checkpoint that loads; broken newer ones are reported and skipped.
static int resume_from(Trainer *t, Error *err) {
  const Config *cfg = t->cfg;
  if (cfg->resume[0] == 0) return 0;
  if (strcmp(cfg->resume, "auto") != 0) {
    if (load_checkpoint(t, cfg->resume, err) != 0) return error_prefix(err, "resume: ");
    printf("resumed from %s at step %lld\n", cfg->resume, (long long)t->state.step);
    return 0;
  }
  char **paths;
  int count = checkpoint_list(cfg->run_dir, &paths);
  int rc = 0;
  bool loaded = false;
  for (int i = 0; i < count && !loaded; i++) {
    Error e;
    if (load_checkpoint(t, paths[i], &e) == 0) {
      printf("resumed from %s at step %lld\n", paths[i], (long long)t->state.step);
      loaded = true;
    } else {
      fprintf(stderr, "warning: skipping checkpoint: %s\n", e.msg);
    }
  }
  if (!loaded && count > 0)
    rc = error_set(err,
                   "resume=auto: no valid checkpoint among the %d in '%s'\n"
                   "HINT: remove the broken files or set resume= to start fresh",
                   count, cfg->run_dir);
  if (!loaded && count == 0)
    printf("resume=auto: no checkpoint in %s, starting fresh\n", cfg->run_dir);
  checkpoint_list_free(paths, count);
  return rc;
}

// The loss scale a run continues with: the checkpoint's under fp16 when it was written by fp16
// (a scale of 1 means it was not), the configured start for a fresh fp16 scaler, else 1.
static void settle_loss_scale(Trainer *t) {
  if (!is_fp16(t)) {
    t->state.loss_scale = 1.0;
    t->state.scale_good_steps = 0;
  } else if (t->state.loss_scale == 1.0 && t->state.scale_good_steps == 0) {
    t->state.loss_scale = t->cfg->loss_scale;
  }
}

static void format_bytes(char *buf, size_t size, size_t bytes) {
  double b = (double)bytes;
  if (b >= 1 << 30)
    snprintf(buf, size, "%.2f GiB", b / (1 << 30));
  else
    snprintf(buf, size, "%.1f MiB", b / (1 << 20));
}

// The backend memory of each arena, planned before the first step.
static void print_memory(const Trainer *t, size_t moments, size_t batches) {
  const Model *m = &t->model;
  size_t weights, grads, acts;
  model_memory(m, &weights, &grads, &acts);
  // On the CPU the master weights are the host copy, not an allocation of the backend's.
  size_t counted = weights + grads + acts + moments + batches;
  size_t total = t->be.bytes_in_use > counted ? t->be.bytes_in_use : counted;
  size_t other = total - counted;
  struct {
    const char *name;
    size_t bytes;
  } rows[] = {{"weights (fp32 master + compute copy)", weights},
              {"gradients (fp32)", grads},
              {"AdamW moments (fp32 x 2)", moments},
              {"activations", acts},
              {"batch slots (uint8 + labels, x4)", batches},
              {"scratch, tables, optimizer state", other},
              {"total", total}};
  printf("memory on %s:\n", t->be.ops->name);
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    char b[32];
    format_bytes(b, sizeof b, rows[i].bytes);
    printf("  %-40s %12s\n", rows[i].name, b);
  }
}

static int trainer_setup(Trainer *t, const Config *cfg, Error *err) {
  memset(t, 0, sizeof *t);
  t->cfg = cfg;
  for (int c = 0; c < cfg->in_chans; c++) {
    t->norm.mean[c] = cfg->mean[cfg->num_mean == 1 ? 0 : c];
    t->norm.std[c] = cfg->std[cfg->num_mean == 1 ? 0 : c];
  }
  if (cfg->threads > 0) omp_set_num_threads(cfg->threads);
  if (backend_create(&t->be, cfg->device, cfg->precision, err) != 0) return -1;
  char desc[256];
  backend_describe(&t->be, desc, sizeof desc);
  printf("device: %s%s\n", desc, strcmp(cfg->device, "auto") == 0 ? " (device=auto)" : "");
  if (dataset_open(&t->train_set, cfg, "train", err) != 0) return -1;
  if (dataset_open(&t->val_set, cfg, "val", err) != 0) return -1;
  if (dataset_num_classes(t->train_set) > cfg->num_classes)
    return error_set(err,
                     "the dataset has %d classes but model.num_classes is %d\n"
                     "HINT: set model.num_classes=%d",
                     dataset_num_classes(t->train_set), cfg->num_classes,
                     dataset_num_classes(t->train_set));
  printf("data: %s\n      %s\n", dataset_describe(t->train_set), dataset_describe(t->val_set));

  int eval_batch = cfg->eval_batch_size > 0 ? cfg->eval_batch_size : cfg->batch_size;
  int max_batch = cfg->batch_size > eval_batch ? cfg->batch_size : eval_batch;
  Backend *be = &t->be;
  if (model_create(&t->model, cfg, be, max_batch, err) != 0) return -1;
  Model *m = &t->model;
  model_init_weights(m, cfg->seed);
  if (cfg->init_from[0] && import_weights(m, cfg->init_from, stdout, err) != 0) return -1;
  model_print_summary(m, stdout);

  // Optimizer: moments, chunk table and state in backend memory; host copies for checkpoints.
  size_t bytes = sizeof(float) * (size_t)m->num_floats;
  t->exp_avg = be->ops->alloc(be, bytes);
  t->exp_avg_sq = be->ops->alloc(be, bytes);
  bool host_memory = be->device == DEVICE_CPU;
  t->host_exp_avg = host_memory ? t->exp_avg : calloc_check(1, bytes);
  t->host_exp_avg_sq = host_memory ? t->exp_avg_sq : calloc_check(1, bytes);
  t->num_chunks = model_adamw_chunks(m, cfg->weight_decay, NULL);
  AdamWChunk *chunks = malloc_check(sizeof(AdamWChunk) * (size_t)t->num_chunks);
  model_adamw_chunks(m, cfg->weight_decay, chunks);
  t->chunks = be->ops->alloc(be, sizeof(AdamWChunk) * (size_t)t->num_chunks);
  be->ops->upload(be, t->chunks, chunks, sizeof(AdamWChunk) * (size_t)t->num_chunks);
  free(chunks);
  t->opt = be->ops->alloc(be, sizeof(OptimState));
  t->eval_sums = be->ops->alloc(be, sizeof(EvalSums));
  size_t pixel_bytes = (size_t)max_batch * cfg->img_h * cfg->img_w * cfg->in_chans;
  for (int s = 0; s < 4; s++) {
    t->pixels[s] = be->ops->alloc(be, pixel_bytes);
    t->labels[s] = be->ops->alloc(be, sizeof(int) * (size_t)max_batch);
  }
  t->state = (TrainState){.seed = cfg->seed, .loss_scale = 1.0};

  if (make_run_dir(cfg->run_dir, err) != 0) return -1;
  if (resume_from(t, err) != 0) return -1;
  if (t->state.seed != cfg->seed)
    return error_set(err,
                     "the checkpoint was trained with seed %llu but the config says %llu\n"
                     "HINT: set seed=%llu to continue the same run",
                     (unsigned long long)t->state.seed, (unsigned long long)cfg->seed,
                     (unsigned long long)t->state.seed);
  settle_loss_scale(t);
  model_weights_to_backend(m);
  if (!host_memory) upload_moments(t);
  upload_optim_state(t);
  print_memory(t, 2 * bytes, 4 * (pixel_bytes + sizeof(int) * (size_t)max_batch));

  LoaderOptions opt = {.batch_size = cfg->batch_size,
                       .train = true,
                       .seed = cfg->seed,
                       .workers = cfg->workers,
                       .prefetch = cfg->prefetch,
                       .rank = 0,
                       .world = 1,
                       .start_epoch = t->state.epoch,
                       .start_batch = t->state.batch,
                       .alloc = be->ops->host_alloc,
                       .release = be->ops->host_release};
  if (loader_create(&t->loader, t->train_set, &opt, err) != 0) return -1;
  t->steps_per_epoch = loader_batches_per_epoch(t->loader);
  if (t->steps_per_epoch < 1)
    return error_set(err,
                     "the training split has %lld images, fewer than one batch of %d\n"
                     "HINT: lower train.batch_size",
                     (long long)dataset_size(t->train_set), cfg->batch_size);
  t->total_steps = cfg->max_steps > 0 ? cfg->max_steps : (int64_t)cfg->epochs * t->steps_per_epoch;
  // The official recipe scales all three rates linearly with the total batch.
  double scale = cfg->lr_scale_batch > 0 ? (double)cfg->batch_size / cfg->lr_scale_batch : 1.0;
  t->schedule = (LrSchedule){
      .peak = cfg->lr * scale,
      .warmup_lr = cfg->warmup_lr * scale,
      .min_lr = cfg->min_lr * scale,
      .warmup_steps = (int64_t)llround(cfg->warmup_epochs * (double)t->steps_per_epoch),
      .total_steps = t->total_steps};
  if (t->schedule.warmup_steps > t->total_steps) t->schedule.warmup_steps = t->total_steps;
  printf("schedule: %lld steps (%lld per epoch), peak lr %.3g, warmup %lld steps, min lr %.3g\n",
         (long long)t->total_steps, (long long)t->steps_per_epoch, t->schedule.peak,
         (long long)t->schedule.warmup_steps, t->schedule.min_lr);
  return open_metrics(t, err);
}

static void trainer_teardown(Trainer *t) {
  Backend *be = &t->be;
  if (t->loader) loader_destroy(t->loader);
  if (t->train_set) dataset_close(t->train_set);
  if (t->val_set) dataset_close(t->val_set);
  if (t->metrics) fclose(t->metrics);
  if (be->ops) {
    be->ops->synchronize(be);
    if (t->host_exp_avg != t->exp_avg) free(t->host_exp_avg);
    if (t->host_exp_avg_sq != t->exp_avg_sq) free(t->host_exp_avg_sq);
    be->ops->release(be, t->exp_avg);
    be->ops->release(be, t->exp_avg_sq);
    be->ops->release(be, t->chunks);
    be->ops->release(be, t->opt);
    be->ops->release(be, t->eval_sums);
    for (int s = 0; s < 4; s++) {
      be->ops->release(be, t->pixels[s]);
      be->ops->release(be, t->labels[s]);
    }
  }
  if (t->model.params) model_destroy(&t->model);
  backend_destroy(be);
}

// ---------------------------------------------------------------------------------------------
// The step: queued on the backend, nothing waits for it.

static void train_step(Trainer *t, int slot, int B) {
  const Config *cfg = t->cfg;
  Model *m = &t->model;
  Backend *be = &t->be;
  int64_t step = t->state.step;

  be->ops->stage_consume(be, slot);
  model_forward(m, t->pixels[slot], DTYPE_U8, t->norm, B, true, cfg->seed, step, 0);
  be->ops->train_loss(be, m->acts.dlogits, m->acts.logits, t->labels[slot], cfg->label_smoothing, B,
                      cfg->num_classes, t->opt);
  model_zero_grads(m);
  model_backward(m, B);
  OptimizerStep hyper = {.lr = (float)lr_at_step(&t->schedule, step),
                         .beta1 = cfg->beta1,
                         .beta2 = cfg->beta2,
                         .eps = cfg->eps,
                         .clip_grad = cfg->clip_grad,
                         .dynamic_scale = is_fp16(t),
                         .scale_window = cfg->loss_scale_window};
  be->ops->optimizer_step(be, m->master, m->compute == (void *)m->master ? NULL : m->compute,
                          m->grads, t->exp_avg, t->exp_avg_sq, m->num_floats, t->chunks,
                          t->num_chunks, hyper, t->opt);
  be->ops->stage_release(be, slot);
  t->state.step = step + 1;
}

static void format_duration(char *buf, size_t size, double seconds) {
  long s = (long)(seconds + 0.5);
  if (s >= 3600)
    snprintf(buf, size, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else
    snprintf(buf, size, "%ldm%02lds", s / 60, s % 60);
}

static int save_checkpoint(Trainer *t, Error *err) {
  read_optim_state(t);
  model_weights_to_host(&t->model);
  if (t->host_exp_avg != t->exp_avg) download_moments(t);
  char path[1024];
  if (checkpoint_save(t->cfg->run_dir, &t->model, t->host_exp_avg, t->host_exp_avg_sq, &t->state,
                      t->cfg->ckpt_keep, path, sizeof path, err) != 0)
    return -1;
  printf("checkpoint: %s\n", path);
  fflush(stdout);
  return 0;
}

static int run_eval(Trainer *t, EvalResult *r, Error *err) {
  double t0 = time_now_s();
  if (evaluate(t, r, err) != 0) return -1;
  printf("eval  step %lld: top1 %.2f%%  top5 %.2f%%  loss %.4f  (%lld images, %.1fs)\n",
         (long long)t->state.step, r->top1, r->top5, r->loss, (long long)r->count,
         time_now_s() - t0);
  fprintf(t->metrics,
          "{\"step\": %lld, \"epoch\": %lld, \"eval_top1\": %.4f, \"eval_top5\": %.4f, "
          "\"eval_loss\": %.6f}\n",
          (long long)t->state.step, (long long)t->state.epoch, r->top1, r->top5, r->loss);
  fflush(t->metrics);
  fflush(stdout);
  return 0;
}

// Applies train.nonfinite to what the steps since the last read-back did. Skipped steps were
// never applied (the update is dropped on the device), so the weights in memory stay finite.
static int check_nonfinite(Trainer *t, const OptimState *s, Error *err) {
  const Config *cfg = t->cfg;
  int64_t newly_skipped = s->skipped - t->skipped_seen;
  t->skipped_seen = s->skipped;
  bool stop_policy = strcmp(cfg->nonfinite, "stop") == 0;
  // Under fp16 a skipped step is the loss scaler at work (an overflow), not a failure.
  if (stop_policy && (s->bad_losses > 0 || (!is_fp16(t) && newly_skipped > 0)))
    return error_set(err,
                     "the %s became non-finite in the %lld steps up to step %lld (%lld "
                     "non-finite losses, %lld skipped updates; none was applied)\n"
                     "HINT: lower train.lr or raise train.warmup_epochs; resume=auto restarts "
                     "from the last checkpoint; train.nonfinite=skip drops such steps",
                     s->bad_losses > 0 ? "loss" : "gradient", (long long)cfg->log_every,
                     (long long)t->state.step, (long long)s->bad_losses, (long long)newly_skipped);
  if (s->skipped_run > cfg->nonfinite_max) {
    char scale[64] = "";
    if (is_fp16(t))
      snprintf(scale, sizeof scale, "; the fp16 loss scale fell to %g", (double)s->loss_scale);
    return error_set(err,
                     "%lld steps in a row up to step %lld had a non-finite gradient and were "
                     "skipped (train.nonfinite_max is %d)%s\n"
                     "HINT: lower train.lr, or resume=auto from the last checkpoint",
                     (long long)s->skipped_run, (long long)t->state.step, cfg->nonfinite_max,
                     scale);
  }
  return 0;
}

static void log_progress(Trainer *t, const OptimState *s, double lr, double img_s, double eta) {
  char eta_s[32], extra[96] = "";
  format_duration(eta_s, sizeof eta_s, eta);
  double loss = s->loss_steps ? s->loss_sum / (double)s->loss_steps : NAN;
  if (is_fp16(t)) snprintf(extra, sizeof extra, "  scale %g", (double)s->loss_scale);
  if (s->skipped)
    snprintf(extra + strlen(extra), sizeof extra - strlen(extra), "  skipped %lld",
             (long long)s->skipped);
  bool epoch_end = t->state.batch == 0;
  printf("epoch %lld step %lld/%lld  loss %.4f  lr %.3e  grad_norm %.3f  img/s %.0f  eta %s%s\n",
         (long long)(epoch_end ? t->state.epoch : t->state.epoch + 1), (long long)t->state.step,
         (long long)t->total_steps, loss, lr, s->grad_norm, img_s, eta_s, extra);
  fprintf(t->metrics,
          "{\"step\": %lld, \"epoch\": %lld, \"loss\": %.6f, \"lr\": %.6e, \"grad_norm\": %.6f, "
          "\"img_per_s\": %.1f, \"loss_scale\": %g, \"skipped\": %lld}\n",
          (long long)t->state.step, (long long)t->state.epoch, loss, lr, s->grad_norm, img_s,
          (double)s->loss_scale, (long long)s->skipped);
  fflush(t->metrics);
  fflush(stdout);
}

int train_run(const Config *cfg, Error *err) {
  Trainer t;
  int rc = -1;
  Batch *b = NULL;
  int slot = TRAIN_SLOT;
  if (trainer_setup(&t, cfg, err) != 0) goto done;

  double t_start = time_now_s(), t_window = t_start;
  int64_t steps_window = 0, start_step = t.state.step;
  EvalResult last_eval = {0};
  bool have_eval = false, interrupted = false;
  if (t.state.step < t.total_steps) {
    if (loader_next(t.loader, &b, err) != 0) goto done;
    stage_batch(&t, slot, b);
  }
  while (t.state.step < t.total_steps) {
    double lr = lr_at_step(&t.schedule, t.state.step);
    train_step(&t, slot, b->count);
    t.state.epoch = b->epoch;
    t.state.batch = b->index + 1;
    if (t.state.batch == t.steps_per_epoch) {
      t.state.epoch++;
      t.state.batch = 0;
    }
    // The next batch uploads while this step computes.
    Batch *next = NULL;
    if (t.state.step < t.total_steps) {
      if (loader_next(t.loader, &next, err) != 0) goto done;
      stage_batch(&t, slot ^ 1, next);
    }
    release_batch(&t, t.loader, slot, b);
    b = next;
    slot ^= 1;
    steps_window++;

    int64_t step = t.state.step;
    bool epoch_end = t.state.batch == 0;
    if (step % cfg->log_every == 0 || step == t.total_steps || step == start_step + 1) {
      OptimState s = read_optim_state(&t);
      double now = time_now_s();
      double img_s = (double)steps_window * cfg->batch_size / (now - t_window);
      double eta = (double)(t.total_steps - step) * (now - t_start) / (double)(step - start_step);
      log_progress(&t, &s, lr, img_s, eta);
      if (check_nonfinite(&t, &s, err) != 0) goto done;
      t_window = time_now_s();
      steps_window = 0;
    }
    bool last = step == t.total_steps;
    bool eval_now = cfg->eval_every > 0 ? step % cfg->eval_every == 0 : epoch_end;
    if ((eval_now || last) && !stop_requested) {
      if (run_eval(&t, &last_eval, err) != 0) goto done;
      have_eval = true;
    }
    bool ckpt_now = cfg->ckpt_every > 0 ? step % cfg->ckpt_every == 0 : epoch_end;
    if (ckpt_now || last || stop_requested) {
      // A checkpoint is written only after the steps since the last read-back were checked.
      OptimState s = read_optim_state(&t);
      if (check_nonfinite(&t, &s, err) != 0) goto done;
      if (save_checkpoint(&t, err) != 0) goto done;
    }
    if (stop_requested) {
      printf("stopped by signal at step %lld; resume with resume=auto\n", (long long)step);
      interrupted = true;
      break;
    }
  }
  double elapsed = time_now_s() - t_start;
  char took[32];
  format_duration(took, sizeof took, elapsed);
  if (have_eval)
    printf("done: %lld steps in %s (%.0f img/s), eval top1 %.2f%% top5 %.2f%%%s\n",
           (long long)(t.state.step - start_step), took,
           elapsed > 0 ? (double)(t.state.step - start_step) * cfg->batch_size / elapsed : 0.0,
           last_eval.top1, last_eval.top5, interrupted ? " (interrupted)" : "");
  else
    printf("done: %lld steps in %s%s\n", (long long)(t.state.step - start_step), took,
           interrupted ? " (interrupted)" : "");
  rc = 0;
done:
  if (b) release_batch(&t, t.loader, slot, b);
  trainer_teardown(&t);
  return rc;
}
