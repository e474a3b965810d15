// train.c: the training loop. One step reads like the algorithm: forward, loss, backward (for each
// micro-batch, with train.accum_steps > 1), global norm, clip and AdamW, all queued on the backend
// (the CPU, or a CUDA stream): batches travel as uint8 from the loader's page-locked ring to the
// device on a copy queue while the previous step computes, and the host reads the loss, gradient
// norm and loss scale back only at logging steps, evaluations and checkpoints.
#define _POSIX_C_SOURCE 200809L  // sigaction: POSIX, not C11
#include "src/app/train.h"

#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/batch_augment.h"
#include "data/dataset.h"
#include "data/jpeg_gpu.h"
#include "data/loader.h"
#include "dist/reducer.h"
#include "optim/schedule.h"
#include "src/app/data_wait.h"
#include "src/app/learner.h"
#include "src/app/metrics.h"
#include "src/app/reduce.h"
#include "src/app/runlock.h"
#include "src/app/step_graph.h"
#include "src/io/checkpoint.h"
#include "src/io/import.h"
#include "src/model/backend.h"
#include "src/model/model.h"

// The one piece of process-wide state: a signal handler can only talk to the loop through a
// flag. Set by SIGINT/SIGTERM/SIGUSR1, read once per step (and agreed among ranks).
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
  // Open MPI's mpirun forwards SIGUSR1 to every rank, where a SIGTERM to mpirun is followed by a
  // SIGKILL a second later: SIGUSR1 is how to stop a job through mpirun with a checkpoint.
  sigaction(SIGUSR1, &sa, NULL);
  // Past a file size limit (ulimit -f) a write would kill the process with SIGXFSZ; ignored, it
  // fails with EFBIG instead, and the run stops with a message naming the file.
  signal(SIGXFSZ, SIG_IGN);
}

// Batch slots in backend memory: 0 and 1 alternate in training, 2 and 3 in evaluation, so an
// evaluation never overwrites the training batch already uploaded for the next step.
#define TRAIN_SLOT 0
#define EVAL_SLOT 2
#define MARK_RING 4

typedef struct {
  const Config *cfg;
  Comm *comm;            // the job; rank 0 alone writes metrics.jsonl and checkpoints
  GradReducer *reducer;  // averages the gradients over the ranks; NULL without a launcher
  LoaderOptions train_opt, eval_opt;  // this rank's share of each step and evaluation batch
  int accum;  // micro-batches per step (train.accum_steps); the loader's batch holds them all
  int micro;  // images per micro-batch on this rank: train_opt.batch_size / accum
  Backend be;
  Normalize norm;  // per input channel (data.mean/std given once apply to all)
  Model model;
  Optimizer opt;
  StepGraphs graphs;    // the step as a replayed CUDA graph (train.cuda_graphs)
  EvalSums *eval_sums;  // backend memory
  uint8_t *pixels[4];   // batch slots (max_batch, H, W, Cin) in backend memory
  int *labels[4];       // (max_batch)
  // Per-batch augmentations (random erasing, mixup / cutmix), drawn when a training batch is
  // staged, applied on the backend to the normalized batch in the step.
  BatchAugmentOptions aug_opts;
  bool augment, soft;    // any per-batch augmentation; soft targets (mixup / cutmix)
  BatchAugment *aug[2];  // (accum) per training slot: one per micro-batch
  EraseBox *boxes[2];    // host (batch) per training slot
  EraseBox *boxes_be;    // backend (micro)
  float *soft_host[2];   // (batch, classes) per training slot, host_alloc'ed
  float *soft_be[2];     // backend
  float *images;         // the normalized f32 micro-batch (micro, H, W, Cin), backend
  // With accum > 1 the step reads each micro-batch from these fixed buffers (backend), into which
  // its slice of the staged batch is copied first: one captured graph then serves every
  // micro-batch (src/app/step_graph.h).
  uint8_t *micro_pixels;  // (micro, H, W, Cin), when the step reads pixels (no augmentation)
  int *micro_labels;      // (micro)
  float *micro_soft;      // (micro, classes), with soft targets
  Dataset *train_set, *val_set;
  char *class_names;  // the train split's, '\n'-joined, for checkpoints (NULL: unnamed)
  Loader *loader;
  TrainState state;
  int64_t skipped_seen;  // state->skipped at the last read-back
  LrSchedule schedule;
  int64_t steps_per_epoch, total_steps;
  MetricsLog metrics;  // run_dir/metrics.jsonl
  RunLock lock;        // held from setup to teardown: one run per run_dir
  bool e2e;            // bench=e2e: train, time it, write nothing (bench_e2e)
  // The data wait (src/app/data_wait.h): each step's begin and end on the compute queue, in a ring,
  // and the host's time in loader_next for its batch; a step's gap is read two steps later,
  // when its marks have long been reached, or at a read-back, which waits for the queue.
  void *mark_begin[MARK_RING], *mark_end[MARK_RING];
  double blocked[MARK_RING];
  int64_t marks_first;  // the first step whose predecessor's end counts (after a break)
  int64_t marks_read;   // steps below this one have been counted
  double blocked_next;  // the host's time in loader_next for the batch of the next step
  DataWait wait;
} Trainer;

static bool is_fp16(const Trainer *t) {
  return t->be.act == DTYPE_F16;
}

static bool is_lead(const Trainer *t) {
  return t->comm->rank == 0;
}

// train.batch_size into world x accum micro-batches: refused naming the keys where it does not
// divide (accum 1: among the processes), or where mixup / cutmix would get an odd micro-batch.
static int check_batch_split(const Config *cfg, int world, Error *err) {
  int batch = cfg->batch_size, accum = cfg->accum_steps, parts = world * accum;
  if (accum > 1 && batch % parts != 0) {
    char choices[64];
    format_multiples_near(choices, sizeof choices, batch, parts);
    return error_set(err,
                     "train.batch_size = %d (the global batch) does not divide into %d process%s "
                     "x train.accum_steps = %d micro-batches\nHINT: set train.batch_size to a "
                     "multiple of %d (%s; each process then runs %d micro-batches of "
                     "train.batch_size / %d images a step), or change train.accum_steps or the "
                     "number of processes",
                     batch, world, world > 1 ? "es" : "", accum, parts, choices, accum, parts);
  }
  if (batch % world != 0) {
    char choices[64];
    format_multiples_near(choices, sizeof choices, batch, world);
    return error_set(err,
                     "train.batch_size = %d (the global batch) does not divide among the %d "
                     "processes of this job\nHINT: set train.batch_size to a multiple of %d (%s; "
                     "each process then takes train.batch_size / %d images a step), or start a "
                     "number of processes that divides %d",
                     batch, world, world, choices, world, batch);
  }
  int micro = batch / parts;
  if ((cfg->mixup > 0 || cfg->cutmix > 0) && micro % 2 != 0)
    return error_set(err,
                     "train.mixup / train.cutmix pair each sample with the reverse of its "
                     "micro-batch, but train.batch_size = %d over %d process%s x train.accum_steps "
                     "= %d leaves %d images in each (odd)\nHINT: set train.batch_size to a "
                     "multiple of %d",
                     batch, world, world > 1 ? "es" : "", accum, micro, 2 * parts);
  return 0;
}

int train_loader_options(const Config *cfg, const Comm *comm, bool train, LoaderOptions *opt,
                         Error *err) {
  int world = comm->world, batch = cfg->batch_size;
  if (check_batch_split(cfg, world, err) != 0) return -1;
  // The evaluation has no backward: by default it runs batches of one micro-batch per rank,
  // which the activations are sized for.
  int eval_batch = cfg->eval_batch_size > 0 ? cfg->eval_batch_size : batch / cfg->accum_steps;
  int online, cores = loader_process_cores(&online);
  LoaderSizing size = loader_sizing(cfg->workers, cfg->prefetch, cores, online, comm->local_world);
  *opt = (LoaderOptions){.batch_size = train ? batch / world : (eval_batch + world - 1) / world,
                         .train = train,
                         .seed = cfg->seed,
                         .workers = size.workers,
                         .prefetch = size.prefetch,
                         .sizing = size,
                         .rank = comm->rank,
                         .world = world};
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Batches: loader buffer (host, page-locked on CUDA) -> a slot in backend memory.

static void stage_batch(Trainer *t, int slot, const Batch *b) {
  const Config *cfg = t->cfg;
  size_t pixel_bytes = (size_t)b->count * cfg->img_h * cfg->img_w * cfg->in_chans;
  void *dst[3] = {t->pixels[slot], t->labels[slot], NULL};
  // From the loader's device batch where it decodes on this GPU (data/loader.h).
  const void *src[3] = {
      b->device_pixels && t->train_opt.device_batch ? b->device_pixels : b->pixels, b->labels,
      NULL};
  size_t bytes[3] = {pixel_bytes, sizeof(int) * (size_t)b->count, 0};
  int count = 2;
  if (t->soft && slot < EVAL_SLOT) {  // the soft targets of this training batch travel with it
    dst[2] = t->soft_be[slot];
    src[2] = t->soft_host[slot];
    bytes[2] = sizeof(float) * (size_t)b->count * (size_t)cfg->num_classes;
    count = 3;
  }
  t->be.ops->stage_upload(&t->be, slot, count, dst, src, bytes);
}

// Draws training batch b's erasing boxes, mixup / cutmix and soft targets into slot's buffers,
// micro-batch by micro-batch (before it is staged: the soft targets are uploaded with it).
static int draw_batch_augment(Trainer *t, int slot, const Batch *b, Error *err) {
  if (!t->augment) return 0;
  for (int k = 0; k < t->accum; k++) {
    int64_t first = (int64_t)k * t->micro;
    float *soft = t->soft ? t->soft_host[slot] + first * t->cfg->num_classes : NULL;
    if (batch_augment_draw(&t->aug_opts, b, k, t->accum, t->cfg->img_h, t->cfg->img_w,
                           t->boxes[slot] + first, &t->aug[slot][k], soft, err) != 0)
      return -1;
  }
  return 0;
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

// The evaluation sums of every rank's share of the val split, added up on every rank.
static int reduce_eval_sums(Trainer *t, EvalSums *s, Error *err) {
  double v[4] = {s->loss_sum, (double)s->top1, (double)s->top5, (double)s->count};
  if (comm_allreduce_doubles(t->comm, v, 4, COMM_SUM, err) != 0) return -1;
  *s = (EvalSums){
      .loss_sum = v[0], .top1 = (int64_t)v[1], .top5 = (int64_t)v[2], .count = (int64_t)v[3]};
  return 0;
}

static int evaluate(Trainer *t, EvalResult *r, Error *err) {
  const Config *cfg = t->cfg;
  Model *m = &t->model;
  Backend *be = &t->be;
  // The host waits below (uploads, the sums) must not wait for a stuck all-reduce.
  if (t->reducer && grad_reducer_sync(t->reducer, err) != 0) return -1;
  LoaderOptions opt = t->eval_opt;
  opt.alloc = be->ops->host_alloc;
  opt.release = be->ops->host_release;
  Loader *loader;
  if (loader_create(&loader, t->val_set, &opt, err) != 0) return -1;
  be->ops->zero(be, t->eval_sums, sizeof(EvalSums));
  int slot = EVAL_SLOT;
  Batch *b;
  if (loader_next(loader, &b, err) != 0) goto fail;
  if (b) stage_batch(t, slot, b);
  while (b) {
    be->ops->stage_consume(be, slot);
    if (b->count > 0) {  // a rank's share of the last batch may be empty
      model_forward(m, t->pixels[slot], DTYPE_U8, t->norm, b->count, false, cfg->seed, NULL);
      be->ops->eval_metrics(be, t->eval_sums, m->acts.logits, t->labels[slot], b->count,
                            cfg->num_classes);
    }
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
  if (reduce_eval_sums(t, &sums, err) != 0) return error_prefix(err, "evaluation: ");
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
  t->be.ops->upload(&t->be, t->opt.state, &s, sizeof s);
  t->skipped_seen = t->state.skipped;
}

// The state every rank agrees on. The loss windows are summed: each rank's losses are means
// over an equal share of the global batch (one per micro-batch with accumulation), so the summed
// loss over the summed count is the global batch's mean loss, and a non-finite loss on any rank
// counts. The skip counts and the
// gradient norm are the same on every rank (each decides from the same averaged gradients);
// taking their largest keeps that true even if it were not. So every rank prints (rank 0) and
// applies train.nonfinite from the same numbers.
static int reduce_optim_state(Trainer *t, OptimState *s, Error *err) {
  double sums[3] = {s->loss_sum, (double)s->loss_steps, (double)s->bad_losses};
  double worst[3] = {s->grad_norm, (double)s->skipped, (double)s->skipped_run};
  if (comm_allreduce_doubles(t->comm, sums, 3, COMM_SUM, err) != 0 ||
      comm_allreduce_doubles(t->comm, worst, 3, COMM_MAX, err) != 0)
    return -1;
  s->loss_sum = sums[0];
  s->loss_steps = (int64_t)sums[1];
  s->bad_losses = (int64_t)sums[2];
  s->grad_norm = worst[0];
  s->skipped = (int64_t)worst[1];
  s->skipped_run = (int64_t)worst[2];
  return 0;
}

// Reads the device-side state (waits for the queued steps), clears the loss window, and agrees
// on it with the other ranks.
static int read_optim_state(Trainer *t, OptimState *out, Error *err) {
  // The download waits for the compute queue, which waits for the all-reduce: wait for that
  // first, bounded, so a stuck peer ends the job instead of hanging it.
  if (t->reducer && grad_reducer_sync(t->reducer, err) != 0) return -1;
  OptimState s;
  t->be.ops->download(&t->be, &s, t->opt.state, sizeof s);
  OptimState cleared = s;
  cleared.loss_sum = 0;
  cleared.loss_steps = 0;
  cleared.bad_losses = 0;
  t->be.ops->upload(&t->be, t->opt.state, &cleared, sizeof cleared);
  if (reduce_optim_state(t, &s, err) != 0) return -1;
  t->state.loss_scale = s.loss_scale;
  t->state.scale_good_steps = s.good_steps;
  t->state.skipped = s.skipped;
  *out = s;
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Setup

static int open_metrics(Trainer *t, Error *err) {
  return metrics_open(&t->metrics, t->cfg->run_dir, stdout, err);
}

static int load_checkpoint(Trainer *t, const char *path, Error *err) {
  return checkpoint_load(path, &t->model, t->opt.host_exp_avg, t->opt.host_exp_avg_sq,
                         t->opt.host_ema, &t->state, err);
}

// resume=auto takes the newest checkpoint that loads; broken newer ones are reported and skipped.
// *loaded says whether a checkpoint was loaded.
static int resume_from(Trainer *t, bool *loaded, Error *err) {
  const Config *cfg = t->cfg;
  *loaded = false;
  if (cfg->resume[0] == 0) return 0;
  if (strcmp(cfg->resume, "auto") != 0) {
    if (load_checkpoint(t, cfg->resume, err) != 0) return error_prefix(err, "resume: ");
    printf("resumed from %s at step %lld\n", cfg->resume, (long long)t->state.step);
    *loaded = true;
    return 0;
  }
  char **paths;
  int count = checkpoint_list(cfg->run_dir, &paths);
  int rc = 0;
  for (int i = 0; i < count && !*loaded; i++) {
    Error e;
    if (load_checkpoint(t, paths[i], &e) == 0) {
      printf("resumed from %s at step %lld\n", paths[i], (long long)t->state.step);
      *loaded = true;
    } else {
      fprintf(stderr, "warning: skipping checkpoint: %s\n", e.msg);
    }
  }
  if (!*loaded && count > 0)
    rc = error_set(err,
                   "resume=auto: no valid checkpoint among the %d in '%s'\n"
                   "HINT: remove the broken files or set resume= to start fresh",
                   count, cfg->run_dir);
  if (!*loaded && count == 0)
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

// The backend memory of each arena, planned before the first step. moments: the optimizer's
// memory but the average, ema: the average (0 without one: no row).
static void print_memory(const Trainer *t, size_t moments, size_t ema, size_t batches) {
  const Model *m = &t->model;
  size_t weights, grads, acts;
  model_memory(m, &weights, &grads, &acts);
  // On the CPU the master weights are the host copy, not an allocation of the backend's.
  size_t counted = weights + grads + acts + moments + ema + batches;
  size_t total = t->be.bytes_in_use > counted ? t->be.bytes_in_use : counted;
  size_t other = total - counted;
  // What activation checkpointing saved, beside the activations it leaves.
  char saved[64] = "", saved_bytes[32];
  if (m->num_recomputed > 0) {
    format_bytes(saved_bytes, sizeof saved_bytes, m->acts_saved_bytes);
    if (t->cfg->recompute < 0)
      snprintf(saved, sizeof saved, "   (recompute all: -%s)", saved_bytes);
    else
      snprintf(saved, sizeof saved, "   (recompute %d: -%s)", t->cfg->recompute, saved_bytes);
  }
  struct {
    const char *name;
    size_t bytes;
    const char *note;
  } rows[] = {{"weights (fp32 master + compute copy)", weights, ""},
              {"gradients (fp32)", grads, ""},
              {"AdamW moments (fp32 x 2)", moments, ""},
              {"EMA of the weights (fp32)", ema, ""},
              {"activations", acts, saved},
              {t->accum > 1 ? "batch slots (x4) and the micro-batch's"
                            : "the step's batch slots (uint8 + labels, x4)",
               batches, ""},
              {"scratch, tables, optimizer state", other, ""},
              {"total", total, ""}};
  printf("memory on %s:\n", t->be.ops->name);
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    if (rows[i].bytes == 0 && strncmp(rows[i].name, "EMA", 3) == 0) continue;
    char b[32];
    format_bytes(b, sizeof b, rows[i].bytes);
    printf("  %-40s %12s%s\n", rows[i].name, b, rows[i].note);
  }
  // The activation table's largest tensor: what a smaller batch or image size shrinks first.
  int largest = 0;
  for (int i = 1; i < m->num_acts; i++)
    if (tensor_bytes(&m->act_table[i]) > tensor_bytes(&m->act_table[largest])) largest = i;
  if (m->num_acts > 0) {
    char d[192], b[32];
    tensor_describe(&m->act_table[largest], d, sizeof d);
    format_bytes(b, sizeof b, tensor_bytes(&m->act_table[largest]));
    printf("  activations: %d tensors, the largest %s (%s)\n", m->num_acts, d, b);
  }
}

int train_check_same_device(Comm *comm, const Backend *be, Error *err) {
  double cuda = be->device == DEVICE_CUDA, v[2] = {cuda, -cuda};
  if (comm_allreduce_doubles(comm, v, 2, COMM_MAX, err) != 0) return -1;
  if (v[0] == -v[1]) return 0;
  return error_set(err,
                   "rank %d trains on the %s, but another rank of the job on the %s\n"
                   "HINT: set device=cuda (one GPU per process) or device=cpu for the whole job",
                   comm->rank, cuda ? "GPU" : "CPU", cuda ? "CPU" : "GPU");
}

// Every rank starts from rank 0's weights, AdamW moments, moving average and training state:
// rank 0 alone initialized them from init_from or resumed a checkpoint (files that may exist only
// on its node). *resumed: rank 0's, whether it resumed, on every rank after the call.
static int share_start(Trainer *t, bool *resumed, Error *err) {
  Comm *c = t->comm;
  Model *m = &t->model;
  int32_t loaded = *resumed;
  size_t bytes = sizeof(float) * (size_t)m->num_floats;
  if (comm_broadcast(c, &loaded, sizeof loaded, 0, err) != 0 ||
      comm_broadcast(c, &t->state, sizeof t->state, 0, err) != 0 ||
      comm_broadcast(c, m->weights, (int64_t)bytes, 0, err) != 0)
    return error_prefix(err, "sharing rank 0's weights: ");
  *resumed = loaded != 0;
  if (loaded && (comm_broadcast(c, t->opt.host_exp_avg, (int64_t)bytes, 0, err) != 0 ||
                 comm_broadcast(c, t->opt.host_exp_avg_sq, (int64_t)bytes, 0, err) != 0))
    return error_prefix(err, "sharing rank 0's AdamW moments: ");
  if (loaded && t->state.has_ema && t->opt.ema &&
      comm_broadcast(c, t->opt.host_ema, (int64_t)bytes, 0, err) != 0)
    return error_prefix(err, "sharing rank 0's moving average of the weights: ");
  // The data order, augmentation and drop path are keyed by global sample indices, and the
  // batch is global, so another process count continues the same run; only the order of the
  // gradient sums changes.
  if (loaded && t->state.world > 0 && t->state.world != c->world)
    printf(
        "resume: the checkpoint was written by a job of %d process%s, this job has %d: the "
        "same run continues (data order, augmentation and drop path do not depend on the "
        "process count), equal to the original up to float rounding\n",
        t->state.world, t->state.world > 1 ? "es" : "", c->world);
  t->state.world = c->world;
  return 0;
}

// Rank 0's part of the start: a checkpoint to resume.
static int lead_start(Trainer *t, bool *resumed, Error *err) {
  const Config *cfg = t->cfg;
  if (resume_from(t, resumed, err) != 0) return -1;
  if (t->state.seed != cfg->seed)
    return error_set(err,
                     "the checkpoint was trained with seed %llu but the config says %llu\n"
                     "HINT: set seed=%llu to continue the same run",
                     (unsigned long long)t->state.seed, (unsigned long long)cfg->seed,
                     (unsigned long long)t->state.seed);
  return 0;
}

// gemm_tune = on: each product's algorithm timed at its first use, in one process only (ranks
// timing apart would choose apart). The choices go to run_dir/gemm_choices.txt before each
// checkpoint and are read back at the start of a run in that run_dir, so a resumed run computes
// with the algorithms of the run it continues (the same bits).
static void gemm_choices_path(const Trainer *t, char *buf, size_t size) {
  snprintf(buf, size, "%s/gemm_choices.txt", t->cfg->run_dir);
}

static void setup_gemm_tuning(Trainer *t) {
  Backend *be = &t->be;
  if (!be->ops->gemm_tuning) return;
  bool on = strcmp(t->cfg->gemm_tune, "on") == 0;
  if (on && t->comm->world > 1) {
    printf(
        "gemm: gemm_tune=on is not applied under a launcher (the ranks would choose apart); "
        "cuBLASLt's heuristic picks each algorithm\n");
    on = false;
  }
  be->ops->gemm_tuning(be, on);
  if (!on) return;
  char path[1024];
  gemm_choices_path(t, path, sizeof path);
  size_t size;
  Error e;
  char *text = t->e2e || access(path, F_OK) != 0 ? NULL : (char *)read_file(path, &size, &e);
  char why[512];
  int n = text ? be->ops->gemm_choices_read(be, text, why, sizeof why) : 0;
  free(text);
  if (n < 0) fprintf(stderr, "warning: %s: %s; every product is timed again\n", path, why);
  if (n > 0)
    printf("gemm: %d algorithms read back from %s; any other product timed at its first use\n", n,
           path);
  else
    printf("gemm: each product's algorithm timed at its first use (gemm_tune=on)%s%s\n",
           t->e2e ? "" : "; the choices saved to ", t->e2e ? "" : path);
}

static int write_gemm_choices(FILE *f, const void *be) {
  Backend *b = (Backend *)be;
  return b->ops->gemm_choices_write(b, f);
}

// The moving average's start: a checkpoint's when it has one, else the weights (init,
// init_from, or a checkpoint written without an average, which is said).
static void start_ema(Trainer *t, bool resumed) {
  if (!t->opt.ema) {
    if (resumed && t->state.has_ema)
      printf(
          "ema: the checkpoint's moving average of the weights (ema.*) is not used: "
          "train.ema_decay = 0, so checkpoints from here on have none\n");
    return;
  }
  if (resumed && t->state.has_ema) {
    optimizer_upload_ema(&t->opt, &t->model);
    return;
  }
  if (resumed)
    printf(
        "ema: the checkpoint has no moving average of the weights (it was trained without "
        "train.ema_decay): the average starts from the checkpoint's weights at step %lld\n",
        (long long)t->state.step);
  optimizer_ema_from_weights(&t->opt, &t->model);
}

// Start-up lines for the optimizer's options beyond AdamW's own: layer decay, the average.
static void print_optimizer_options(const Trainer *t) {
  const Config *cfg = t->cfg;
  const Model *m = &t->model;
  if (cfg->layer_decay != 1.0f)
    printf(
        "layer decay: %g, lr scale %.4g (patch_embed, layer id 0) to 1 (norm and head, id %d): "
        "layer_decay^(%d - id)\n",
        (double)cfg->layer_decay, (double)model_layer_lr_scale(m, 0, cfg->layer_decay),
        m->num_blocks + 1, m->num_blocks + 1);
  if (t->opt.ema) {
    char warmup[96] = "";
    if (cfg->ema_warmup)
      snprintf(warmup, sizeof warmup, " with warmup, min(%g, 1 - t^(-2/3)) after t updates",
               (double)cfg->ema_decay);
    printf(
        "ema: decay %g%s (timm ModelEmaV3, after every applied update); evaluated beside the "
        "model as eval_*_ema\n",
        (double)cfg->ema_decay, warmup);
  }
}

static int trainer_setup(Trainer *t, const Config *cfg, Comm *comm, Error *err) {
  memset(t, 0, sizeof *t);
  t->lock.fd = -1;
  t->cfg = cfg;
  t->comm = comm;
  t->e2e = config_bench_e2e(cfg);
  // The run directory comes first: a second run on it fails at once, before any data is read,
  // and files an interrupted save left behind are only removed under the lock (rank 0's).
  // bench=e2e writes nothing and resumes nothing.
  if (is_lead(t) && !t->e2e) {
    if (make_directories(cfg->run_dir, "check the run_dir key", err) != 0) return -1;
    if (runlock_acquire(&t->lock, cfg->run_dir, err) != 0) return -1;
    int stale = checkpoint_remove_stale_temps(cfg->run_dir, err);
    if (stale < 0) return -1;
    if (stale > 0) printf("removed %d partial checkpoint file(s) of an interrupted save\n", stale);
  }
  t->norm = model_input_normalize(cfg);
  if (cfg->threads > 0) omp_set_num_threads(cfg->threads);
  if (train_loader_options(cfg, comm, true, &t->train_opt, err) != 0 ||
      train_loader_options(cfg, comm, false, &t->eval_opt, err) != 0)
    return -1;
  t->accum = cfg->accum_steps;
  t->micro = t->train_opt.batch_size / t->accum;
  if (model_select_device(comm, cfg, err) != 0) return -1;
  if (backend_create(&t->be, cfg->device, cfg->precision, err) != 0) return -1;
  if (comm->mpi && train_check_same_device(comm, &t->be, err) != 0) return -1;
  setup_gemm_tuning(t);
  // data.decoder = auto takes nvJPEG where it can serve: in the build, on the GPU, gray or RGB.
  bool gpu_decode = strcmp(cfg->decoder, "nvjpeg") == 0 ||
                    (strcmp(cfg->decoder, "auto") == 0 && jpeg_gpu_built() &&
                     t->be.device == DEVICE_CUDA && (cfg->in_chans == 1 || cfg->in_chans == 3));
  t->train_opt.gpu_decode = t->eval_opt.gpu_decode = gpu_decode;
  // Decoded on this GPU, the batches stay on it (data/loader.h).
  t->train_opt.device_batch = t->eval_opt.device_batch = gpu_decode && t->be.device == DEVICE_CUDA;
  for (int i = 0; i < MARK_RING; i++) {
    t->mark_begin[i] = t->be.ops->mark_create(&t->be);
    t->mark_end[i] = t->be.ops->mark_create(&t->be);
  }
  char desc[256];
  backend_describe(&t->be, desc, sizeof desc);
  printf("device: %s%s\n", desc, strcmp(cfg->device, "auto") == 0 ? " (device=auto)" : "");
  if (step_graphs_init(&t->graphs, &t->be, cfg->cuda_graphs, comm->mpi, t->accum, err) != 0)
    return -1;
  if (dataset_open(&t->train_set, cfg, "train", err) != 0) return -1;
  if (dataset_open(&t->val_set, cfg, "val", err) != 0) return -1;
  // Measured on the H200 (data/PERF.md, version 6): while the step replays as a graph, the
  // nvJPEG decoders' work on the same GPU runs 4-5x slower and starves the step (4,950 img/s
  // against 6,240 with plain launches, Swin-T bf16 batch 128; the resident step loses ~2%).
  if (gpu_decode && dataset_has_files(t->train_set))
    step_graphs_auto_off(&t->graphs, cfg->cuda_graphs,
                         "train.cuda_graphs=auto while nvJPEG decodes the training images on this "
                         "GPU (measured faster without; train.cuda_graphs=on forces them)");
  if (t->be.device == DEVICE_CUDA) {
    char graphs[256];
    step_graphs_describe(&t->graphs, graphs, sizeof graphs);
    printf("cuda graphs: %s\n", graphs);
  }
  if (dataset_num_classes(t->train_set) > cfg->num_classes) {
    error_set(err,
              "the dataset has %d classes but model.num_classes is %d\n"
              "HINT: set model.num_classes=%d",
              dataset_num_classes(t->train_set), cfg->num_classes,
              dataset_num_classes(t->train_set));
    return config_error_where(cfg, err);
  }
  printf("data: %s\n      %s\n", dataset_describe(t->train_set), dataset_describe(t->val_set));
  t->class_names = dataset_class_names_joined(t->train_set);
  if (dataset_has_files(t->train_set))
    printf("decoder: %s%s\n",
           gpu_decode ? "nvjpeg (stb for PNGs and what nvJPEG does not take)" : "stb",
           strcmp(cfg->decoder, "auto") == 0 ? " (data.decoder=auto)" : "");

  // The activations serve one micro-batch or one evaluation batch; the staging slots hold a
  // whole step's batch (every micro-batch of it) or an evaluation batch.
  int max_batch = t->micro > t->eval_opt.batch_size ? t->micro : t->eval_opt.batch_size;
  int slot_batch = t->train_opt.batch_size > t->eval_opt.batch_size ? t->train_opt.batch_size
                                                                    : t->eval_opt.batch_size;
  Backend *be = &t->be;
  if (model_create(&t->model, cfg, be, max_batch, err) != 0) return config_error_where(cfg, err);
  Model *m = &t->model;
  model_init_weights(m, cfg->seed);
  if (is_lead(t) && cfg->init_from[0] && import_weights(m, cfg->init_from, stdout, err) != 0)
    return -1;
  model_print_summary(m, stdout);

  // Optimizer: moments, chunk table and state in backend memory; host copies for checkpoints.
  optimizer_create(&t->opt, m, cfg);
  t->eval_sums = be->ops->alloc(be, sizeof(EvalSums));
  size_t image_bytes = (size_t)cfg->img_h * cfg->img_w * cfg->in_chans;
  size_t pixel_bytes = (size_t)slot_batch * image_bytes;
  for (int s = 0; s < 4; s++) {
    t->pixels[s] = be->ops->alloc(be, pixel_bytes);
    t->labels[s] = be->ops->alloc(be, sizeof(int) * (size_t)slot_batch);
  }
  size_t batch_bytes = 4 * (pixel_bytes + sizeof(int) * (size_t)slot_batch);
  t->aug_opts = batch_augment_options(cfg, 0);
  t->augment = batch_augment_active(&t->aug_opts);
  t->soft = batch_augment_soft_targets(&t->aug_opts);
  int B = t->train_opt.batch_size;  // the images of a step on this rank
  if (t->augment) {
    t->images = be->ops->alloc(be, sizeof(float) * (size_t)t->micro * image_bytes);
    t->boxes_be = be->ops->alloc(be, sizeof(EraseBox) * (size_t)t->micro);
    for (int s = 0; s < 2; s++) {
      t->boxes[s] = calloc_check((size_t)B, sizeof(EraseBox));
      t->aug[s] = calloc_check((size_t)t->accum, sizeof(BatchAugment));
      if (!t->soft) continue;
      size_t soft_bytes = sizeof(float) * (size_t)B * (size_t)cfg->num_classes;
      t->soft_host[s] = be->ops->host_alloc(soft_bytes);
      if (!t->soft_host[s])
        return error_set(err, "cannot allocate %zu bytes of host memory", soft_bytes);
      t->soft_be[s] = be->ops->alloc(be, soft_bytes);
    }
  }
  if (t->accum > 1) {
    t->micro_labels = be->ops->alloc(be, sizeof(int) * (size_t)t->micro);
    batch_bytes += sizeof(int) * (size_t)t->micro;
    if (!t->augment) {
      t->micro_pixels = be->ops->alloc(be, (size_t)t->micro * image_bytes);
      batch_bytes += (size_t)t->micro * image_bytes;
    }
    if (t->soft)
      t->micro_soft =
          be->ops->alloc(be, sizeof(float) * (size_t)t->micro * (size_t)cfg->num_classes);
  }
  t->state = (TrainState){.seed = cfg->seed, .loss_scale = 1.0};

  bool resumed = false;
  if (is_lead(t) && !t->e2e && lead_start(t, &resumed, err) != 0) return -1;
  if (share_start(t, &resumed, err) != 0) return -1;
  if (cfg->eval_only && !cfg->init_from[0] && !resumed)
    return error_set(err,
                     "eval = true: resume=%s found no checkpoint in '%s', so there are no weights "
                     "to evaluate\nHINT: set resume=CHECKPOINT or init_from=WEIGHTS",
                     cfg->resume, cfg->run_dir);
  settle_loss_scale(t);
  model_weights_to_backend(m);
  optimizer_upload_moments(&t->opt, m);
  start_ema(t, resumed);
  upload_optim_state(t);
  size_t ema_bytes = optimizer_ema_bytes(&t->opt, m);
  print_memory(t, optimizer_bytes(&t->opt, m) - ema_bytes, ema_bytes, batch_bytes);
  if (t->accum > 1) {
    char ranks[48] = "";
    if (comm->world > 1) snprintf(ranks, sizeof ranks, "%d processes x ", comm->world);
    printf(
        "batch: %d images a step = %s%d micro-batches x %d (train.accum_steps = %d: gradients "
        "summed over the micro-batches, one update a step; activations for %d images)\n",
        cfg->batch_size, ranks, t->accum, t->micro, t->accum, max_batch);
  }
  if (comm->mpi) {
    if (model_reducer_attach(&t->reducer, comm, m, cfg, err) != 0) return -1;
    char each[64];
    if (t->accum > 1)
      snprintf(each, sizeof each, "%d images each per step (%d x %d)", t->train_opt.batch_size,
               t->accum, t->micro);
    else
      snprintf(each, sizeof each, "%d images each per step", t->train_opt.batch_size);
    printf(
        "distributed: %d process%s (launched via %s), %s; gradients averaged in %d bucket%s of "
        "up to %g MiB (%s%s)\n",
        comm->world, comm->world > 1 ? "es" : "", comm->launcher, each,
        grad_reducer_num_buckets(t->reducer), grad_reducer_num_buckets(t->reducer) > 1 ? "s" : "",
        (double)cfg->bucket_mb, be->device == DEVICE_CUDA ? cfg->reduce_dtype : "fp32, MPI",
        t->accum > 1 ? "; after the last micro-batch only" : "");
  }

  LoaderOptions opt = t->train_opt;
  opt.start_epoch = t->state.epoch;
  opt.start_batch = t->state.batch;
  opt.alloc = be->ops->host_alloc;
  opt.release = be->ops->host_release;
  // Its errors are about batch_size against the split's size (train_limit), workers, prefetch.
  if (loader_create(&t->loader, t->train_set, &opt, err) != 0) return config_error_where(cfg, err);
  char sizing[256];
  loader_sizing_describe(&opt.sizing, sizing, sizeof sizing);
  printf("loader: %s\n", sizing);
  if (strcmp(loader_decoder(t->loader), "stb") != 0)
    printf(
        "decoder: %s (one decoder per loader worker, %d); decode, crop, resize, flip and "
        "colour on the GPU, into the ring's %d batches on the device (%.1f MiB beside the "
        "table above)%s\n",
        loader_decoder(t->loader), opt.workers, opt.prefetch,
        (double)opt.prefetch * opt.batch_size * cfg->img_h * cfg->img_w * cfg->in_chans / (1 << 20),
        opt.device_batch ? "" : ", copied back to the host");
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
  print_optimizer_options(t);
  int rc = is_lead(t) && !t->e2e ? open_metrics(t, err) : 0;
  fflush(stdout);  // the setup log (what was resumed from) survives a kill in the first steps
  return rc;
}

static void trainer_teardown(Trainer *t) {
  Backend *be = &t->be;
  model_reducer_detach(t->reducer, &t->model);
  if (t->loader) loader_destroy(t->loader);
  if (t->train_set) dataset_close(t->train_set);
  if (t->val_set) dataset_close(t->val_set);
  free(t->class_names);
  metrics_close(&t->metrics);
  runlock_release(&t->lock);
  if (be->ops) {
    be->ops->synchronize(be);
    for (int i = 0; i < MARK_RING; i++) {
      if (t->mark_begin[i]) be->ops->mark_destroy(be, t->mark_begin[i]);
      if (t->mark_end[i]) be->ops->mark_destroy(be, t->mark_end[i]);
    }
    step_graphs_destroy(&t->graphs, be);
    if (t->opt.state) optimizer_destroy(&t->opt, be);
    be->ops->release(be, t->eval_sums);
    for (int s = 0; s < 4; s++) {
      be->ops->release(be, t->pixels[s]);
      be->ops->release(be, t->labels[s]);
    }
    be->ops->release(be, t->images);
    be->ops->release(be, t->boxes_be);
    be->ops->release(be, t->micro_pixels);
    be->ops->release(be, t->micro_labels);
    be->ops->release(be, t->micro_soft);
    for (int s = 0; s < 2; s++) {
      free(t->boxes[s]);
      free(t->aug[s]);
      if (t->soft_host[s]) be->ops->host_release(t->soft_host[s]);
      be->ops->release(be, t->soft_be[s]);
    }
  }
  if (t->model.params) model_destroy(&t->model);
  backend_destroy(be);
}

// ---------------------------------------------------------------------------------------------
// The step: queued on the backend, nothing waits for it. With several ranks each computes the
// gradient of its share of the batch (drop path keyed by the global sample index), and the
// reducer averages them over the ranks while backward runs, before the optimizer reads them.
// With train.accum_steps = N > 1 the share is N micro-batches, each the next slice of the staged
// batch (so each image keeps the global sample index one batch gives it): their gradients add up
// and only the last one's backward reports to the reducer, so the all-reduce runs once, overlapped
// with that backward, and the update follows it. Each part from forward to backward (and update)
// is one learner_run, which on the GPU is a replayed CUDA graph (src/app/step_graph.h; the
// reducer's all-reduces inside the last); what changes between parts is queued before it: the
// part's values, the wait for the batch's upload, the micro-batch's augmentations or copy.

// Micro-batch k of the batch staged in slot (train_opt.batch_size images on this rank): its images,
// labels and soft targets as the step reads them, after the queued augmentations or copies that
// put them there.
static StepBatch micro_batch(Trainer *t, int slot, int k) {
  const Config *cfg = t->cfg;
  Backend *be = &t->be;
  int n = t->micro;
  size_t image_bytes = (size_t)cfg->img_h * cfg->img_w * cfg->in_chans;
  const uint8_t *pixels = t->pixels[slot] + (size_t)k * n * image_bytes;
  const int *labels = t->labels[slot] + (int64_t)k * n;
  const float *soft = t->soft ? t->soft_be[slot] + (int64_t)k * n * cfg->num_classes : NULL;
  StepBatch batch = {.images = pixels, .images_dtype = DTYPE_U8, .labels = labels};
  if (t->augment) {  // normalize, then erase and mix on the backend
    be->ops->images_normalize(be, t->images, pixels, t->norm, n, cfg->img_h, cfg->img_w,
                              cfg->in_chans);
    be->ops->batch_augment(be, t->images, &t->aug[slot][k], t->boxes_be, n, cfg->img_h, cfg->img_w,
                           cfg->in_chans);
    batch.images = t->images;
    batch.images_dtype = DTYPE_F32;
    batch.soft_targets = soft;
  }
  if (t->accum == 1) return batch;
  if (!t->augment) {
    be->ops->copy(be, t->micro_pixels, pixels, (size_t)n * image_bytes);
    batch.images = t->micro_pixels;
  }
  be->ops->copy(be, t->micro_labels, labels, sizeof(int) * (size_t)n);
  batch.labels = t->micro_labels;
  if (soft) {
    be->ops->copy(be, t->micro_soft, soft, sizeof(float) * (size_t)n * cfg->num_classes);
    batch.soft_targets = t->micro_soft;
  }
  return batch;
}

static int train_step(Trainer *t, int slot, int B, Error *err) {
  const Config *cfg = t->cfg;
  Backend *be = &t->be;
  int64_t step = t->state.step;
  float lr = (float)lr_at_step(&t->schedule, step);
  // A short batch would leave micro-batches without images: the loader drops partial batches.
  if (B != t->train_opt.batch_size)
    return error_set(err, "training batch of %d images, %d expected", B, t->train_opt.batch_size);
  be->ops->stage_consume(be, slot);
  be->ops->mark_record(be, t->mark_begin[step % MARK_RING]);
  t->blocked[step % MARK_RING] = t->blocked_next;
  if (t->accum > 1) model_zero_grads(&t->model);  // before the first micro-batch only
  for (int k = 0; k < t->accum; k++) {
    int64_t first_sample = (int64_t)t->comm->rank * B + (int64_t)k * t->micro;
    learner_set_step(&t->model, &t->opt, step, lr, first_sample);
    StepBatch batch = micro_batch(t, slot, k);
    if (step_graphs_step(&t->graphs, &t->model, &t->opt, cfg, t->norm, &batch, t->micro,
                         learner_part(k, t->accum), err) != 0)
      return -1;
  }
  if (t->reducer && grad_reducer_finish_step(t->reducer, err) != 0) return -1;
  be->ops->stage_release(be, slot);
  be->ops->mark_record(be, t->mark_end[step % MARK_RING]);
  t->state.step = step + 1;
  return 0;
}

// Counts the data wait of the steps in [marks_read, upto): the gap before each, from the end
// of the one before it (none for the first after a break).
static void count_data_wait(Trainer *t, int64_t upto) {
  Backend *be = &t->be;
  for (int64_t k = t->marks_read; k < upto; k++) {
    if (k <= t->marks_first) continue;
    double idle =
        be->ops->mark_seconds(be, t->mark_end[(k - 1) % MARK_RING], t->mark_begin[k % MARK_RING]);
    data_wait_step(&t->wait, idle, t->blocked[k % MARK_RING]);
  }
  if (upto > t->marks_read) t->marks_read = upto;
}

// An evaluation or a checkpoint ran on the queue since the last step: no gap across it counts.
static void break_data_wait(Trainer *t) {
  count_data_wait(t, t->state.step);
  t->marks_first = t->state.step;
}

// loader_next for the next step's batch, timed for the data wait.
static int next_batch(Trainer *t, Batch **b, Error *err) {
  double t0 = time_now_s();
  int rc = loader_next(t->loader, b, err);
  t->blocked_next = time_now_s() - t0;
  return rc;
}

static void format_duration(char *buf, size_t size, double seconds) {
  long s = (long)(seconds + 0.5);
  if (s >= 3600)
    snprintf(buf, size, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else
    snprintf(buf, size, "%ldm%02lds", s / 60, s % 60);
}

// 64-bit FNV-1a over the bits of n floats.
static uint64_t hash_floats(const float *x, int64_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int64_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &x[i], sizeof u);
    h = (h ^ u) * 0x100000001b3ull;
  }
  return h;
}

// The ranks' weights must be the same bits: each applies the same update to the same averaged
// gradients. Compared at every checkpoint (a hash of the host copy), so a divergence stops the
// run instead of forking it silently.
static int check_same_weights(Trainer *t, Error *err) {
  uint64_t h = hash_floats(t->model.weights, t->model.num_floats);
  double hi = (double)(h >> 32), lo = (double)(h & 0xffffffffu), v[4] = {hi, lo, -hi, -lo};
  if (comm_allreduce_doubles(t->comm, v, 4, COMM_MAX, err) != 0) return -1;
  if (v[0] == -v[2] && v[1] == -v[3]) return 0;
  return error_set(err,
                   "rank %d: after step %lld the weights differ between the ranks (hash %016llx "
                   "here)\nHINT: the ranks should apply identical updates; resume=auto from the "
                   "last checkpoint, and report this with the config",
                   t->comm->rank, (long long)t->state.step, (unsigned long long)h);
}

// Writes a checkpoint (rank 0) of the state just read back and checked.
static int save_checkpoint(Trainer *t, Error *err) {
  bool several = t->comm->world > 1;
  if (is_lead(t) || several) model_weights_to_host(&t->model);
  if (several && check_same_weights(t, err) != 0) return -1;
  if (is_lead(t)) {
    Backend *be = &t->be;
    optimizer_download_ema(&t->opt, &t->model);
    char path[1024];
    if (be->ops->gemm_choices_write && be->ops->gemm_choices_write(be, NULL) > 0) {
      gemm_choices_path(t, path, sizeof path);
      if (write_file_atomic(path, write_gemm_choices, be, err) != 0) return -1;
    }
    optimizer_download_moments(&t->opt, &t->model);
    if (checkpoint_save(t->cfg->run_dir, &t->model, t->opt.host_exp_avg, t->opt.host_exp_avg_sq,
                        t->opt.host_ema, &t->state, t->class_names, t->cfg->ckpt_keep, path,
                        sizeof path, err) != 0)
      return error_prefix(err,
                          "checkpoint of step %lld failed; the earlier checkpoints in run_dir "
                          "are untouched and resume=auto continues from the newest:\n",
                          (long long)t->state.step);
    printf("checkpoint: %s%s\n", path, several ? " (weights identical on every rank)" : "");
    fflush(stdout);
  }
  // The others wait here rather than in the next all-reduce, whose timeout is for a step.
  return comm_barrier(t->comm, err);
}

// The model and, when there is one, its moving average (evaluated in the weights' place:
// optimizer_swap_ema, which allocates nothing, and back). ema is left zero without an average.
static int evaluate_both(Trainer *t, EvalResult *r, EvalResult *ema, Error *err) {
  *ema = (EvalResult){0};
  if (evaluate(t, r, err) != 0) return -1;
  if (!t->opt.ema) return 0;
  optimizer_swap_ema(&t->opt, &t->model);
  int rc = evaluate(t, ema, err);
  optimizer_swap_ema(&t->opt, &t->model);
  return rc;
}

// The average's part of an eval line and of its metrics record ("" without an average).
static void format_ema_eval(const Trainer *t, const EvalResult *e, char *line, size_t line_size,
                            char *json, size_t json_size) {
  line[0] = json[0] = 0;
  if (!t->opt.ema) return;
  snprintf(line, line_size, "  ema: top1 %.2f%%  top5 %.2f%%  loss %.4f", e->top1, e->top5,
           e->loss);
  snprintf(json, json_size,
           ", \"eval_top1_ema\": %.4f, \"eval_top5_ema\": %.4f, \"eval_loss_ema\": %.6f", e->top1,
           e->top5, e->loss);
}

static int run_eval(Trainer *t, EvalResult *r, EvalResult *ema, Error *err) {
  double t0 = time_now_s();
  if (evaluate_both(t, r, ema, err) != 0) return -1;
  char line[128], json[160];
  format_ema_eval(t, ema, line, sizeof line, json, sizeof json);
  printf("eval  step %lld: top1 %.2f%%  top5 %.2f%%  loss %.4f%s  (%lld images, %.1fs)\n",
         (long long)t->state.step, r->top1, r->top5, r->loss, line, (long long)r->count,
         time_now_s() - t0);
  fflush(stdout);
  return metrics_write(&t->metrics, err,
                       "{\"step\": %lld, \"epoch\": %lld, \"eval_top1\": %.4f, \"eval_top5\": "
                       "%.4f, \"eval_loss\": %.6f%s}",
                       (long long)t->state.step, (long long)t->state.epoch, r->top1, r->top5,
                       r->loss, json);
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

// Said once a run, when the loader sets the speed: what was measured, and what to change.
static void warn_data_wait(const Trainer *t, double data_wait) {
  const LoaderOptions *o = &t->train_opt;
  char hint[512];
  int n = snprintf(hint, sizeof hint, "%s data.workers (now %d) if this machine has idle cores",
                   o->sizing.auto_workers ? "set" : "raise", o->workers);
  if (!o->sizing.auto_prefetch && n < (int)sizeof hint)
    n += snprintf(hint + n, sizeof hint - n, "; unset data.prefetch (auto: workers + 2)");
  if (strcmp(loader_decoder(t->loader), "stb") == 0 && dataset_has_files(t->train_set) &&
      n < (int)sizeof hint)
    snprintf(hint + n, sizeof hint - n,
             "; data.decoder=nvjpeg (device=cuda, a build with nvJPEG) decodes and augments on "
             "the GPU");
  printf(
      "warning: the device waited for batches %.0f%% of the time up to step %lld: the data "
      "loader, not the model, sets this run's speed\nHINT: %s\n",
      100 * data_wait, (long long)t->state.step, hint);
}

static int log_progress(Trainer *t, const OptimState *s, double lr, double img_s, double eta,
                        double data_wait, Error *err) {
  char eta_s[32], extra[160] = "";
  format_duration(eta_s, sizeof eta_s, eta);
  double loss = s->loss_steps ? s->loss_sum / (double)s->loss_steps : NAN;
  if (t->accum > 1) {  // the step's batch in micro-batches (x ranks)
    int n = snprintf(extra, sizeof extra, "  batch %d = %d x %d", t->cfg->batch_size, t->accum,
                     t->micro);
    if (t->comm->world > 1) snprintf(extra + n, sizeof extra - n, " x %d ranks", t->comm->world);
  }
  if (is_fp16(t))
    snprintf(extra + strlen(extra), sizeof extra - strlen(extra), "  scale %g",
             (double)s->loss_scale);
  if (s->skipped)
    snprintf(extra + strlen(extra), sizeof extra - strlen(extra), "  skipped %lld",
             (long long)s->skipped);
  bool epoch_end = t->state.batch == 0;
  printf(
      "epoch %lld step %lld/%lld  loss %.4f  lr %.3e  grad_norm %.3f  img/s %.0f  data %.0f%%  "
      "eta %s%s\n",
      (long long)(epoch_end ? t->state.epoch : t->state.epoch + 1), (long long)t->state.step,
      (long long)t->total_steps, loss, lr, s->grad_norm, img_s, 100 * data_wait, eta_s, extra);
  if (data_wait_should_warn(&t->wait, data_wait)) warn_data_wait(t, data_wait);
  fflush(stdout);
  return metrics_write(&t->metrics, err,
                       "{\"step\": %lld, \"epoch\": %lld, \"loss\": %.6f, \"lr\": %.6e, "
                       "\"grad_norm\": %.6f, \"img_per_s\": %.1f, \"data_wait\": %.4f, "
                       "\"loss_scale\": %g, \"skipped\": %lld}",
                       (long long)t->state.step, (long long)t->state.epoch, loss, lr, s->grad_norm,
                       img_s, data_wait, (double)s->loss_scale, (long long)s->skipped);
}

// Whether to stop after this step: a stop request (signal) seen by any rank stops every rank
// after the same step, so they all write the same checkpoint decision.
static int stop_agreed(Trainer *t, bool *stop, Error *err) {
  double v = stop_requested;
  if (comm_allreduce_doubles(t->comm, &v, 1, COMM_MAX, err) != 0) return -1;
  *stop = v > 0;
  return 0;
}

// ---------------------------------------------------------------------------------------------
// bench=e2e: the run as configured (dataset, loader, recipe, the step as it trains), timed over
// bench.steps steps after bench.warmup, with epoch boundaries wherever the dataset puts them;
// then the same step on the last batch, resident, for the upper bound beside it.

typedef struct {
  double t0, seconds;      // the timed steps' wall time
  double waited0, waited;  // the data wait's total at the start, and over the steps
  LoaderStageTimes stages0, stages;
  int64_t step0, steps;
  bool done;
} E2eRecord;

static void e2e_begin(Trainer *t, E2eRecord *r) {
  t->be.ops->synchronize(&t->be);
  count_data_wait(t, t->state.step);
  r->waited0 = t->wait.total_s;
  loader_stage_times(t->loader, &r->stages0);
  r->step0 = t->state.step;
  r->t0 = time_now_s();
}

static int e2e_end(Trainer *t, E2eRecord *r, Error *err) {
  if (t->reducer && grad_reducer_sync(t->reducer, err) != 0) return -1;
  t->be.ops->synchronize(&t->be);
  r->seconds = time_now_s() - r->t0;
  count_data_wait(t, t->state.step);
  r->waited = t->wait.total_s - r->waited0;
  r->steps = t->state.step - r->step0;
  loader_stage_times(t->loader, &r->stages);
  for (int k = 0; k < LOADER_STAGES; k++) r->stages.seconds[k] -= r->stages0.seconds[k];
  r->stages.images -= r->stages0.images;
  r->done = true;
  return 0;
}

// The resident step: the steps the trainer ran, on slot's batch, without the loader.
static int e2e_resident(Trainer *t, int slot, int steps, double *seconds, Error *err) {
  int B = t->train_opt.batch_size;
  for (int i = 0; i < 5; i++)
    if (train_step(t, slot, B, err) != 0) return -1;
  if (t->reducer && grad_reducer_sync(t->reducer, err) != 0) return -1;
  t->be.ops->synchronize(&t->be);
  double t0 = time_now_s();
  for (int i = 0; i < steps; i++) {
    if (train_step(t, slot, B, err) != 0) return -1;
    if (t->reducer && grad_reducer_sync_previous(t->reducer, err) != 0) return -1;
  }
  if (t->reducer && grad_reducer_sync(t->reducer, err) != 0) return -1;
  t->be.ops->synchronize(&t->be);
  *seconds = time_now_s() - t0;
  return 0;
}

static int e2e_report(Trainer *t, E2eRecord *r, int slot, Error *err) {
  const Config *cfg = t->cfg;
  if (!r->done) return error_set(err, "bench=e2e: the run stopped before its timed steps ended");
  int resident_steps = cfg->bench_steps < 100 ? cfg->bench_steps : 100;
  double resident_s = 0;
  if (e2e_resident(t, slot, resident_steps, &resident_s, err) != 0) return -1;
  // Every rank's times: the slowest rank's count (the ranks step together).
  double v[3] = {r->seconds, r->waited, resident_s};
  if (comm_allreduce_doubles(t->comm, v, 3, COMM_MAX, err) != 0) return -1;
  double img_s = (double)r->steps * cfg->batch_size / v[0];
  double resident_img_s = (double)resident_steps * cfg->batch_size / v[2];
  double wait = v[1] / v[0];
  if (!is_lead(t)) return 0;
  const char *dataset = cfg->dataset;
  const char *decoder = loader_decoder(t->loader);
  const LoaderOptions *o = &t->train_opt;
  double per_image = r->stages.images > 0 ? 1e3 / (double)r->stages.images : 0;
  char accum[80] = "";
  if (t->accum > 1)
    snprintf(accum, sizeof accum, " of %d micro-batches x %d per rank", t->accum, t->micro);
  printf(
      "\nbench e2e: %s, %s, %d workers, ring of %d; %lld timed steps%s (%lld epochs of %lld "
      "steps) after %d warm-up steps\n",
      dataset, decoder, o->workers, o->prefetch, (long long)r->steps, accum,
      (long long)((r->steps + t->steps_per_epoch - 1) / t->steps_per_epoch),
      (long long)t->steps_per_epoch, cfg->bench_warmup);
  printf("  end to end        %9.1f img/s  %7.2f ms/step\n", img_s, 1e3 * v[0] / (double)r->steps);
  printf(
      "  resident batch    %9.1f img/s  %7.2f ms/step  (the same step, no loader: an upper "
      "bound)\n",
      resident_img_s, 1e3 * v[2] / resident_steps);
  printf("  end to end / resident  %.3f;  data wait %.1f%% of the time\n", img_s / resident_img_s,
         100 * wait);
  printf("  loader, ms per image and stage (summed over workers; %s):\n   ",
         o->gpu_decode ? "device time for what runs on the GPU" : "host time");
  for (int k = 0; k < LOADER_STAGES; k++)
    printf(" %s %.3f", loader_stage_names[k], r->stages.seconds[k] * per_image);
  printf(
      "\n{\"bench\": \"e2e\", \"dataset\": \"%s\", \"decoder\": \"%s\", \"workers\": %d, "
      "\"prefetch\": %d, \"batch\": %d, \"accum_steps\": %d, \"steps\": %lld, \"img_s\": %.1f, "
      "\"synthetic_img_s\": %.1f, \"ratio\": %.4f, \"data_wait\": %.4f, \"stages_ms\": {",
      dataset, decoder, o->workers, o->prefetch, cfg->batch_size, t->accum, (long long)r->steps,
      img_s, resident_img_s, img_s / resident_img_s, wait);
  for (int k = 0; k < LOADER_STAGES; k++)
    printf("%s\"%s\": %.4f", k ? ", " : "", loader_stage_names[k],
           r->stages.seconds[k] * per_image);
  printf("}}\n");
  fflush(stdout);
  return 0;
}

// eval = true: the val split once with the weights set up, one metrics record, nothing else.
static int eval_only(Trainer *t, Error *err) {
  EvalResult r, ema;
  double t0 = time_now_s();
  if (evaluate_both(t, &r, &ema, err) != 0) return -1;
  double seconds = time_now_s() - t0;
  double img_s = seconds > 0 ? (double)(r.count + ema.count) / seconds : 0;
  char line[128], json[160];
  format_ema_eval(t, &ema, line, sizeof line, json, sizeof json);
  char weights[CONFIG_STR_MAX + 16];
  if (t->cfg->init_from[0])
    snprintf(weights, sizeof weights, "%s", t->cfg->init_from);
  else
    snprintf(weights, sizeof weights, "resume=%s", t->cfg->resume);
  printf(
      "eval: top1 %.2f%%  top5 %.2f%%  loss %.4f%s  (%lld images%s in %.1fs, %.0f img/s; "
      "weights %s, step %lld)\n",
      r.top1, r.top5, r.loss, line, (long long)r.count,
      t->opt.ema ? ", each through the weights and the EMA" : "", seconds, img_s, weights,
      (long long)t->state.step);
  return metrics_write(&t->metrics, err,
                       "{\"step\": %lld, \"eval_only\": true, \"eval_top1\": %.4f, "
                       "\"eval_top5\": %.4f, \"eval_loss\": %.6f%s, \"eval_images\": %lld, "
                       "\"eval_img_per_s\": %.1f}",
                       (long long)t->state.step, r.top1, r.top5, r.loss, json, (long long)r.count,
                       img_s);
}

int train_run(const Config *cfg, Comm *comm, Error *err) {
  Trainer t;
  int rc = -1;
  Batch *b = NULL;
  int slot = TRAIN_SLOT;
  if (trainer_setup(&t, cfg, comm, err) != 0) goto done;
  if (cfg->eval_only) {
    rc = eval_only(&t, err);
    goto done;
  }
  if (t.e2e) t.total_steps = t.state.step + cfg->bench_warmup + cfg->bench_steps;

  double t_start = time_now_s(), t_window = t_start;
  int64_t steps_window = 0, start_step = t.state.step;
  t.marks_first = t.marks_read = start_step;
  E2eRecord e2e = {0};
  EvalResult last_eval = {0}, last_eval_ema = {0};
  bool have_eval = false, interrupted = false;
  if (t.state.step < t.total_steps) {
    if (next_batch(&t, &b, err) != 0 || draw_batch_augment(&t, slot, b, err) != 0) goto done;
    stage_batch(&t, slot, b);
  }
  while (t.state.step < t.total_steps) {
    double lr = lr_at_step(&t.schedule, t.state.step);
    if (t.e2e && t.state.step == start_step + cfg->bench_warmup) e2e_begin(&t, &e2e);
    if (train_step(&t, slot, b->count, err) != 0) goto done;
    count_data_wait(&t, t.state.step - 2);
    t.state.epoch = b->epoch;
    t.state.batch = b->index + 1;
    if (t.state.batch == t.steps_per_epoch) {
      t.state.epoch++;
      t.state.batch = 0;
    }
    // The next batch uploads while this step computes.
    Batch *next = NULL;
    if (t.state.step < t.total_steps) {
      if (next_batch(&t, &next, err) != 0) goto done;
      if (draw_batch_augment(&t, slot ^ 1, next, err) != 0) {
        release_batch(&t, t.loader, slot ^ 1, next);
        goto done;
      }
      stage_batch(&t, slot ^ 1, next);
    }
    // Returning the batch waits for its upload, which waited for the compute of an earlier
    // step, which waited for that step's all-reduce: bound that wait first.
    if (t.reducer && grad_reducer_sync_previous(t.reducer, err) != 0) goto done;
    release_batch(&t, t.loader, slot, b);
    b = next;
    slot ^= 1;
    steps_window++;

    int64_t step = t.state.step;
    bool epoch_end = t.state.batch == 0, stop;
    if (stop_agreed(&t, &stop, err) != 0) goto done;
    if (step % cfg->log_every == 0 || step == t.total_steps || step == start_step + 1) {
      OptimState s;
      if (read_optim_state(&t, &s, err) != 0) goto done;
      double now = time_now_s();
      double img_s = (double)steps_window * cfg->batch_size / (now - t_window);
      double eta = (double)(t.total_steps - step) * (now - t_start) / (double)(step - start_step);
      count_data_wait(&t, step);
      double waited = data_wait_interval(&t.wait, now - t_window);
      if (log_progress(&t, &s, lr, img_s, eta, waited, err) != 0) goto done;
      if (check_nonfinite(&t, &s, err) != 0) goto done;
      t_window = time_now_s();
      steps_window = 0;
    }
    bool last = step == t.total_steps;
    if (t.e2e) {  // the benchmark evaluates and checkpoints nothing
      if (stop) {
        printf("stopped by signal at step %lld\n", (long long)step);
        break;
      }
      if (last && e2e_end(&t, &e2e, err) != 0) goto done;
      continue;
    }
    bool eval_now = cfg->eval_every > 0 ? step % cfg->eval_every == 0 : epoch_end;
    if ((eval_now || last) && !stop) {
      if (run_eval(&t, &last_eval, &last_eval_ema, err) != 0) goto done;
      break_data_wait(&t);
      have_eval = true;
    }
    bool ckpt_now = cfg->ckpt_every > 0 ? step % cfg->ckpt_every == 0 : epoch_end;
    if (ckpt_now || last || stop) {
      // A checkpoint is written only after the steps since the last read-back were checked.
      OptimState s;
      if (read_optim_state(&t, &s, err) != 0) goto done;
      if (check_nonfinite(&t, &s, err) != 0) goto done;
      if (save_checkpoint(&t, err) != 0) goto done;
      break_data_wait(&t);
    }
    if (stop) {
      printf("stopped by signal at step %lld; resume with resume=auto\n", (long long)step);
      interrupted = true;
      break;
    }
  }
  if (t.reducer && grad_reducer_sync(t.reducer, err) != 0) goto done;
  if (t.e2e) {
    if (b) release_batch(&t, t.loader, slot, b);
    b = NULL;
    if (e2e_report(&t, &e2e, slot ^ 1, err) != 0) goto done;
    rc = 0;
    goto done;
  }
  double elapsed = time_now_s() - t_start;
  char took[32];
  format_duration(took, sizeof took, elapsed);
  char ema_top1[48] = "";
  if (t.opt.ema) snprintf(ema_top1, sizeof ema_top1, " (ema top1 %.2f%%)", last_eval_ema.top1);
  if (have_eval)
    printf("done: %lld steps in %s (%.0f img/s), eval top1 %.2f%% top5 %.2f%%%s%s\n",
           (long long)(t.state.step - start_step), took,
           elapsed > 0 ? (double)(t.state.step - start_step) * cfg->batch_size / elapsed : 0.0,
           last_eval.top1, last_eval.top5, ema_top1, interrupted ? " (interrupted)" : "");
  else
    printf("done: %lld steps in %s%s\n", (long long)(t.state.step - start_step), took,
           interrupted ? " (interrupted)" : "");
  if (t.be.device == DEVICE_CUDA) {
    char graphs[256];
    step_graphs_describe(&t.graphs, graphs, sizeof graphs);
    printf("cuda graphs: %s\n", graphs);
  }
  rc = 0;
done:
  // A failing rank of a job leaves its memory to the process's end: main() ends the whole job
  // at once, and freeing device memory could wait for a stream that waits for a peer.
  if (rc != 0 && comm->mpi) return rc;
  if (b) release_batch(&t, t.loader, slot, b);
  trainer_teardown(&t);
  return rc;
}
