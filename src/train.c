// train.c: the training loop. One step reads like the algorithm: load a batch, normalize,
// forward, loss, backward, global norm and clip, AdamW at the scheduled learning rate.
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
#include "kernels/loss.h"
#include "kernels/patch.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/schedule.h"
#include "src/checkpoint.h"
#include "src/import.h"
#include "src/metrics.h"
#include "src/model.h"
#include "src/runlock.h"

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
  // Past a file size limit (ulimit -f) a write would kill the process with SIGXFSZ; ignored, it
  // fails with EFBIG instead, and the run stops with a message naming the file.
  signal(SIGXFSZ, SIG_IGN);
}

typedef struct {
  const Config *cfg;
  float mean[4], std[4];  // per input channel (data.mean/std given once apply to all)
  Model model;
  float *exp_avg, *exp_avg_sq;  // AdamW moments (num_floats each)
  float *dlogits;               // (batch, classes)
  Dataset *train_set, *val_set;
  Loader *loader;
  TrainState state;
  LrSchedule schedule;
  int64_t steps_per_epoch, total_steps;
  MetricsLog metrics;  // run_dir/metrics.jsonl
  RunLock lock;        // held from setup to teardown: one run per run_dir
} Trainer;

// ---------------------------------------------------------------------------------------------
// Evaluation: top-1, top-5 and plain cross-entropy (no smoothing) over the whole val split.

typedef struct {
  double top1, top5, loss;
  int64_t count;
} EvalResult;

static int evaluate(Trainer *t, EvalResult *r, Error *err) {
  const Config *cfg = t->cfg;
  Model *m = &t->model;
  int eval_batch = cfg->eval_batch_size > 0 ? cfg->eval_batch_size : cfg->batch_size;
  if (eval_batch > m->max_batch) eval_batch = m->max_batch;
  LoaderOptions opt = {.batch_size = eval_batch,
                       .train = false,
                       .seed = cfg->seed,
                       .workers = cfg->workers,
                       .prefetch = cfg->prefetch,
                       .rank = 0,
                       .world = 1};
  Loader *loader;
  if (loader_create(&loader, t->val_set, &opt, err) != 0) return -1;
  int64_t top1 = 0, top5 = 0, count = 0;
  double loss_sum = 0;
  for (;;) {
    Batch *b;
    if (loader_next(loader, &b, err) != 0) {
      loader_destroy(loader);
      return error_prefix(err, "evaluation: ");
    }
    if (!b) break;
    images_normalize_cpu(m->acts.images, b->pixels, b->count, cfg->img_h, cfg->img_w, cfg->in_chans,
                         t->mean, t->std);
    model_forward(m, m->acts.images, b->count, false, cfg->seed, 0);
    int c1, c5;
    topk_correct_cpu(m->acts.logits, b->labels, b->count, cfg->num_classes, &c1, &c5);
    double loss = cross_entropy_forward_backward_cpu(NULL, m->acts.logits, b->labels, NULL, 0.0f,
                                                     b->count, cfg->num_classes);
    loss_sum += loss * b->count;
    top1 += c1;
    top5 += c5;
    count += b->count;
    loader_release_batch(loader, b);
  }
  loader_destroy(loader);
  r->count = count;
  r->top1 = count ? 100.0 * (double)top1 / (double)count : 0;
  r->top5 = count ? 100.0 * (double)top5 / (double)count : 0;
  r->loss = count ? loss_sum / (double)count : 0;
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Setup

static int open_metrics(Trainer *t, Error *err) {
  return metrics_open(&t->metrics, t->cfg->run_dir, stdout, err);
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

// resume=auto takes the newest checkpoint that loads; broken newer ones are reported and skipped.
static int resume_from(Trainer *t, Error *err) {
  const Config *cfg = t->cfg;
  if (cfg->resume[0] == 0) return 0;
  Model *m = &t->model;
  if (strcmp(cfg->resume, "auto") != 0) {
    if (checkpoint_load(cfg->resume, m, t->exp_avg, t->exp_avg_sq, &t->state, err) != 0)
      return error_prefix(err, "resume: ");
    printf("resumed from %s at step %lld\n", cfg->resume, (long long)t->state.step);
    return 0;
  }
  char **paths;
  int count = checkpoint_list(cfg->run_dir, &paths);
  int rc = 0;
  bool loaded = false;
  for (int i = 0; i < count && !loaded; i++) {
    Error e;
    if (checkpoint_load(paths[i], m, t->exp_avg, t->exp_avg_sq, &t->state, &e) == 0) {
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

static int trainer_setup(Trainer *t, const Config *cfg, Error *err) {
  memset(t, 0, sizeof *t);
  t->lock.fd = -1;
  t->cfg = cfg;
  // The run directory comes first: a second run on it fails at once, before any data is read,
  // and files an interrupted save left behind are only removed under the lock.
  if (make_run_dir(cfg->run_dir, err) != 0) return -1;
  if (runlock_acquire(&t->lock, cfg->run_dir, err) != 0) return -1;
  int stale = checkpoint_remove_stale_temps(cfg->run_dir, err);
  if (stale < 0) return -1;
  if (stale > 0) printf("removed %d partial checkpoint file(s) of an interrupted save\n", stale);
  for (int c = 0; c < cfg->in_chans; c++) {
    t->mean[c] = cfg->mean[cfg->num_mean == 1 ? 0 : c];
    t->std[c] = cfg->std[cfg->num_mean == 1 ? 0 : c];
  }
  if (cfg->threads > 0) omp_set_num_threads(cfg->threads);
  if (dataset_open(&t->train_set, cfg, "train", err) != 0) return -1;
  if (dataset_open(&t->val_set, cfg, "val", err) != 0) return -1;
  if (dataset_num_classes(t->train_set) > cfg->num_classes) {
    error_set(err,
              "the dataset has %d classes but model.num_classes is %d\n"
              "HINT: set model.num_classes=%d",
              dataset_num_classes(t->train_set), cfg->num_classes,
              dataset_num_classes(t->train_set));
    return config_error_where(cfg, err);
  }
  printf("data: %s\n      %s\n", dataset_describe(t->train_set), dataset_describe(t->val_set));

  int eval_batch = cfg->eval_batch_size > 0 ? cfg->eval_batch_size : cfg->batch_size;
  int max_batch = cfg->batch_size > eval_batch ? cfg->batch_size : eval_batch;
  if (model_create(&t->model, cfg, max_batch, err) != 0) return -1;
  Model *m = &t->model;
  model_init_weights(m, cfg->seed);
  if (cfg->init_from[0] && import_weights(m, cfg->init_from, stdout, err) != 0) return -1;
  model_print_summary(m, stdout);
  size_t bytes = sizeof(float) * (size_t)m->num_floats;
  t->exp_avg = calloc_check(1, bytes);
  t->exp_avg_sq = calloc_check(1, bytes);
  t->dlogits = malloc_check(sizeof(float) * (size_t)cfg->batch_size * (size_t)cfg->num_classes);
  t->state = (TrainState){.seed = cfg->seed, .loss_scale = 1.0};

  if (resume_from(t, err) != 0) return -1;
  if (t->state.seed != cfg->seed)
    return error_set(err,
                     "the checkpoint was trained with seed %llu but the config says %llu\n"
                     "HINT: set seed=%llu to continue the same run",
                     (unsigned long long)t->state.seed, (unsigned long long)cfg->seed,
                     (unsigned long long)t->state.seed);

  LoaderOptions opt = {.batch_size = cfg->batch_size,
                       .train = true,
                       .seed = cfg->seed,
                       .workers = cfg->workers,
                       .prefetch = cfg->prefetch,
                       .rank = 0,
                       .world = 1,
                       .start_epoch = t->state.epoch,
                       .start_batch = t->state.batch};
  // Its errors are about batch_size against the split's size (train_limit), workers, prefetch.
  if (loader_create(&t->loader, t->train_set, &opt, err) != 0) return config_error_where(cfg, err);
  t->steps_per_epoch = loader_batches_per_epoch(t->loader);
  if (t->steps_per_epoch < 1) {
    error_set(err,
              "the training split has %lld images, fewer than one batch of %d\n"
              "HINT: lower train.batch_size",
              (long long)dataset_size(t->train_set), cfg->batch_size);
    return config_error_where(cfg, err);
  }
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
  int rc = open_metrics(t, err);
  fflush(stdout);  // the setup log (what was resumed from) survives a kill in the first steps
  return rc;
}

static void trainer_teardown(Trainer *t) {
  if (t->loader) loader_destroy(t->loader);
  if (t->train_set) dataset_close(t->train_set);
  if (t->val_set) dataset_close(t->val_set);
  metrics_close(&t->metrics);
  runlock_release(&t->lock);
  free(t->exp_avg);
  free(t->exp_avg_sq);
  free(t->dlogits);
  model_destroy(&t->model);
}

// ---------------------------------------------------------------------------------------------
// The step

typedef struct {
  double loss, grad_norm, lr;
} StepResult;

double optimizer_step(Model *m, float *exp_avg, float *exp_avg_sq, const Config *cfg, double lr,
                      int64_t step) {
  double norm = sqrt(grad_sum_squares_cpu(m->grads, m->num_floats));
  float clip = clip_coefficient(norm, cfg->clip_grad);
  for (int i = 0; i < m->num_params; i++) {
    const ParamInfo *p = &m->params[i];
    AdamWHyper h = {.lr = (float)lr,
                    .beta1 = cfg->beta1,
                    .beta2 = cfg->beta2,
                    .eps = cfg->eps,
                    .weight_decay = p->decay ? cfg->weight_decay : 0.0f};
    adamw_update_cpu(m->weights + p->offset, m->grads + p->offset, exp_avg + p->offset,
                     exp_avg_sq + p->offset, p->numel, h, step + 1, clip);
  }
  return norm;
}

static StepResult train_step(Trainer *t, const Batch *b) {
  const Config *cfg = t->cfg;
  Model *m = &t->model;
  int B = b->count;
  int64_t step = t->state.step;

  images_normalize_cpu(m->acts.images, b->pixels, B, cfg->img_h, cfg->img_w, cfg->in_chans, t->mean,
                       t->std);
  model_forward(m, m->acts.images, B, true, cfg->seed, step);
  double loss = cross_entropy_forward_backward_cpu(t->dlogits, m->acts.logits, b->labels, NULL,
                                                   cfg->label_smoothing, B, cfg->num_classes);
  model_zero_grads(m);
  model_backward(m, t->dlogits, B);

  double lr = lr_at_step(&t->schedule, step);
  double norm = optimizer_step(m, t->exp_avg, t->exp_avg_sq, cfg, lr, step);
  t->state.step = step + 1;
  return (StepResult){.loss = loss, .grad_norm = norm, .lr = lr};
}

static void format_duration(char *buf, size_t size, double seconds) {
  long s = (long)(seconds + 0.5);
  if (s >= 3600)
    snprintf(buf, size, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else
    snprintf(buf, size, "%ldm%02lds", s / 60, s % 60);
}

static int save_checkpoint(Trainer *t, Error *err) {
  char path[1024];
  if (checkpoint_save(t->cfg->run_dir, &t->model, t->exp_avg, t->exp_avg_sq, &t->state,
                      t->cfg->ckpt_keep, path, sizeof path, err) != 0)
    return error_prefix(err,
                        "checkpoint of step %lld failed; the earlier checkpoints in run_dir "
                        "are untouched and resume=auto continues from the newest:\n",
                        (long long)t->state.step);
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
  fflush(stdout);
  return metrics_write(&t->metrics, err,
                       "{\"step\": %lld, \"epoch\": %lld, \"eval_top1\": %.4f, \"eval_top5\": "
                       "%.4f, \"eval_loss\": %.6f}",
                       (long long)t->state.step, (long long)t->state.epoch, r->top1, r->top5,
                       r->loss);
}

int train_run(const Config *cfg, Error *err) {
  Trainer t;
  int rc = -1;
  if (trainer_setup(&t, cfg, err) != 0) goto done;

  double t_start = time_now_s(), t_window = t_start, loss_window = 0;
  int64_t steps_window = 0, start_step = t.state.step;
  EvalResult last_eval = {0};
  bool have_eval = false, interrupted = false;
  while (t.state.step < t.total_steps) {
    Batch *b;
    if (loader_next(t.loader, &b, err) != 0) goto done;
    StepResult r = train_step(&t, b);
    t.state.epoch = b->epoch;
    t.state.batch = b->index + 1;
    if (t.state.batch == t.steps_per_epoch) {
      t.state.epoch++;
      t.state.batch = 0;
    }
    loader_release_batch(t.loader, b);
    if (!isfinite(r.loss)) {
      error_set(err,
                "the loss became %g at step %lld\n"
                "HINT: lower train.lr or raise train.warmup_epochs; resume=auto restarts "
                "from the last checkpoint",
                r.loss, (long long)t.state.step);
      goto done;
    }
    loss_window += r.loss;
    steps_window++;

    int64_t step = t.state.step;
    bool epoch_end = t.state.batch == 0;
    if (step % cfg->log_every == 0 || step == t.total_steps || step == start_step + 1) {
      double now = time_now_s();
      double img_s = (double)steps_window * cfg->batch_size / (now - t_window);
      double eta = (double)(t.total_steps - step) * (now - t_start) / (double)(step - start_step);
      char eta_s[32];
      format_duration(eta_s, sizeof eta_s, eta);
      printf("epoch %lld step %lld/%lld  loss %.4f  lr %.3e  grad_norm %.3f  img/s %.0f  eta %s\n",
             (long long)(epoch_end ? t.state.epoch : t.state.epoch + 1), (long long)step,
             (long long)t.total_steps, loss_window / steps_window, r.lr, r.grad_norm, img_s, eta_s);
      fflush(stdout);
      if (metrics_write(&t.metrics, err,
                        "{\"step\": %lld, \"epoch\": %lld, \"loss\": %.6f, \"lr\": %.6e, "
                        "\"grad_norm\": %.6f, \"img_per_s\": %.1f}",
                        (long long)step, (long long)t.state.epoch, loss_window / steps_window, r.lr,
                        r.grad_norm, img_s) != 0)
        goto done;
      t_window = now;
      loss_window = 0;
      steps_window = 0;
    }
    bool last = step == t.total_steps;
    bool eval_now = cfg->eval_every > 0 ? step % cfg->eval_every == 0 : epoch_end;
    if ((eval_now || last) && !stop_requested) {
      if (run_eval(&t, &last_eval, err) != 0) goto done;
      have_eval = true;
    }
    bool ckpt_now = cfg->ckpt_every > 0 ? step % cfg->ckpt_every == 0 : epoch_end;
    if (ckpt_now || last || stop_requested)
      if (save_checkpoint(&t, err) != 0) goto done;
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
  trainer_teardown(&t);
  return rc;
}
