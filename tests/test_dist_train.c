// test_dist_train.c: data-parallel training as a user meets it: swin_train under
// `mpirun --allow-run-as-root --oversubscribe -np N` on the CPU (a Fashion-MNIST subset and a
// small Swin, as tests/test_train.c), against one process with the same global batch:
//   - 2 processes train what 1 process trains (losses, evaluation and weights within float
//     tolerance: the gradient sums are grouped differently), with a negative control;
//     `mpirun -np 1` is the single process bit for bit; a batch that does not divide is refused;
//   - with gradient accumulation (train.accum_steps): 2 ranks x 2 micro-batches train what one
//     process trains with 4 micro-batches and with one batch, within the same tolerance; under
//     `mpirun -np 1` bit for bit the single process;
//   - the shares of two epochs and of an evaluation are disjoint and complete, under mpirun -np 2
//     and 3 (this program in --shards mode, with the trainer's own loader options);
//   - a rank whose share holds a corrupt image ends the job within seconds, naming the rank and
//     the file, with a non-zero exit;
//   - a 2-process run resumed from its checkpoint ends bit-identical to the straight run; one
//     process resumes it too (another world size continues the same run, within tolerance);
//     with the moving average of the weights (train.ema_decay), every rank resumes rank 0's
//     average: checkpoints and the evaluation of the average (summed over the ranks) identical;
//   - SIGTERM to every rank, to one rank, or SIGUSR1 to mpirun: one checkpoint, exit 0;
//   - configs/fashion_mnist.ini runs under mpirun -np 2;
//   - its benchmark (bench=1) under mpirun -np 2 measures the data-parallel step: the all-reduce
//     rows, a JSON line with world 2, global img/s; with train.accum_steps 2 the accumulating
//     step; alone it is the one-process benchmark; a batch that does not divide is refused as the
//     trainer refuses it.
//
//   test_dist_train            the checks above (ctest); it starts the jobs itself
//   test_dist_train --shards   (under mpirun) every rank loads its shares; rank 0 checks them
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <math.h>
#include <sys/stat.h>

#include "data/dataset.h"
#include "data/loader.h"
#include "data/transform.h"
#include "dist/comm.h"
#include "src/app/train.h"
#include "src/base/config.h"
#include "src/base/rng.h"
#include "src/io/checkpoint.h"
#include "src/io/safetensors.h"
#include "src/model/model.h"
#include "tests/util/test_jobs.h"
#include "tests/util/test_model_config.h"
#include "tests/util/test_train_util.h"
#include "tests/util/test_util.h"

#define STB_IMAGE_WRITE_IMPLEMENTATION
#include "stb_image_write.h"

#define FASHION_DIR "/usr/share/datasets/fashion-mnist"

// A failing rank must end its job within FAIL_LIMIT_S, as tests/test_dist.sh allows (mpirun
// starts and tears down a local job in about a second here).
#define FAIL_LIMIT_S 10.0

// Two runs that differ only in how the batch's gradient sums are grouped (two halves, each
// rank's mean, averaged by MPI, vs one mean over the batch) start identical and drift by float
// rounding, so they are not bitwise equal: gradient elements differ by a few ulps (2^-24
// relative), and AdamW passes relative gradient differences through to the update, most of all
// for elements whose gradient is near zero (an update of lr * sign(g) at the first step).
// Measured here over 6 steps: weights 2.0e-6 of the distance training moved them apart (2 ranks
// vs 1) and 1.5e-7 (1 process continuing a 2-rank run); the losses metrics.jsonl keeps (6
// decimals) identical. WEIGHT_TOL leaves 10x margin; the negative control (lr 0.1% higher, a
// real change of the run) lands at 1.05e-3, 50x above it. LOSS_TOL: 1e-5 relative is 23 units of
// the 6th decimal of a loss near 2.3.
#define LOSS_TOL 1e-5
#define WEIGHT_TOL 2e-5

static char tmp_root[256];

// ---------------------------------------------------------------------------------------------
// Runs and what they leave

static Config small_config(const char *run_name) {
  Config c = test_model_config((TestModel){.img_h = 16,
                                           .chans = 1,
                                           .patch = 2,
                                           .embed = 16,
                                           .window = 4,
                                           .classes = 10,
                                           .depths = {2, 2},
                                           .heads = {2, 4}});
  snprintf(c.run_dir, sizeof c.run_dir, "%s/%s", tmp_root, run_name);
  c.drop_path_rate = 0.1f;  // drawn by global sample index: the same on 1 and 2 ranks
  c.batch_size = 32;        // the global batch: 16 per rank on 2 ranks
  c.epochs = 1;
  c.max_steps = 6;
  c.lr = 1e-3f;
  c.lr_scale_batch = 0;
  c.warmup_epochs = 0.1f;
  c.log_every = 1;
  c.eval_every = 1000;  // once, at the last step
  c.eval_batch_size = 64;
  snprintf(c.dataset, sizeof c.dataset, "fashion_mnist");
  snprintf(c.path, sizeof c.path, FASHION_DIR);
  c.workers = 2;
  c.threads = 1;  // one core per rank: 2 ranks share CI's 2 cores
  c.num_mean = 1;
  memset(c.mean, 0, sizeof c.mean);
  memset(c.std, 0, sizeof c.std);  // lists end at the first 0
  c.mean[0] = 0.286f;
  c.std[0] = 0.353f;
  c.scale_min = 0.5f;
  c.train_limit = 128;  // 4 steps per epoch: 6 steps cross an epoch boundary
  c.val_limit = 90;     // eval batches of 64 (32 per rank): rank 1's share of the last is empty
  c.ckpt_every = 3;
  c.ckpt_keep = 5;
  c.bucket_mb = 0.02f;  // ~5k floats: the 35k-parameter model reduces in several buckets
  snprintf(c.device, sizeof c.device, "cpu");
  return c;
}

// Writes c as <run_dir>.ini; returns the path (in path).
static const char *write_ini(const Config *c, char *path, size_t size) {
  snprintf(path, size, "%s.ini", c->run_dir);
  return job_write_ini(c, path);
}

static const char *log_of(const Config *c, char *path, size_t size) {
  snprintf(path, size, "%s.log", c->run_dir);
  return path;
}

// Trains c as np ranks (0: alone); returns the exit code, prints the log on failure.
static int train(const Config *c, int np) {
  char ini[600], log[600];
  double took;
  int rc = job_run(np, "./swin_train", log_of(c, log, sizeof log), &took,
                   write_ini(c, ini, sizeof ini), (const char *)NULL);
  if (rc != 0) job_show_log(log);
  return rc;
}

// The largest relative difference of the losses of steps first..last (+inf if one is missing).
static double loss_distance(const Config *a, const Config *b, int first, int last) {
  double la[64] = {0}, lb[64] = {0}, worst = 0;
  train_test_losses(a->run_dir, la, 64);
  train_test_losses(b->run_dir, lb, 64);
  for (int s = first; s <= last; s++) {
    if (!(la[s] > 0 && lb[s] > 0)) return INFINITY;
    worst = fmax(worst, fabs(la[s] - lb[s]) / lb[s]);
  }
  return worst;
}

// The evaluation record of a run's metrics.jsonl (the last one); false if none.
static bool eval_of(const Config *c, double *top1, double *loss) {
  char path[700], line[512];
  snprintf(path, sizeof path, "%s/metrics.jsonl", c->run_dir);
  FILE *f = fopen(path, "r");
  bool found = false;
  while (f && fgets(line, sizeof line, f)) {
    const char *t = strstr(line, "\"eval_top1\": "), *l = strstr(line, "\"eval_loss\": ");
    if (t && l) *top1 = atof(t + 13), *loss = atof(l + 13), found = true;
  }
  if (f) fclose(f);
  return found;
}

static int checkpoints_in(const char *dir) {
  char **paths;
  int n = checkpoint_list(dir, &paths);
  checkpoint_list_free(paths, n);
  return n;
}

// ---------------------------------------------------------------------------------------------
// The checks

static void test_two_equal_one(void) {
  Config one = small_config("one"), two = small_config("two"), np1 = small_config("np1");
  test_check(train(&one, 0) == 0, "1 process, global batch 32: 6 steps");
  test_check(train(&two, 2) == 0, "mpirun -np 2, global batch 32 (16 per rank): 6 steps");
  char log[600];
  char *text = job_log(log_of(&two, log, sizeof log));
  test_check(job_count(text, "distributed: 2 processes") == 1 && strstr(text, " buckets of up") &&
                 job_count(text, "eval  step 6") == 1 && job_count(text, "checkpoint: ") == 2,
             "2 ranks: rank 0 alone prints (one banner with several buckets, one eval line, "
             "two checkpoint lines)");
  test_check(strstr(text, "(weights identical on every rank)") != NULL,
             "2 ranks: the weights are the same bits on both ranks at every checkpoint");
  free(text);

  double dl = loss_distance(&two, &one, 1, 6);
  test_check(dl <= LOSS_TOL, "2 ranks vs 1: losses of steps 1..6 within %.1e relative (tol %.0e)",
             dl, LOSS_TOL);
  double t1 = -1, t2 = -2, e1 = 0, e2 = 0;
  bool evals = eval_of(&one, &t1, &e1) && eval_of(&two, &t2, &e2);
  test_check(evals && t1 == t2 && fabs(e1 - e2) <= LOSS_TOL * e1,
             "2 ranks vs 1: evaluation of the 90 val images agrees (top1 %.2f%% / %.2f%%, loss "
             "%.6f / %.6f), rank 1's empty share of the last batch skipped",
             t2, t1, e2, e1);
  Model m;
  float *w0 = train_test_initial_weights(&one, &m);
  if (!w0) return;
  double dw = train_test_weight_distance(&m, w0, train_test_ckpt(two.run_dir, 6),
                                         train_test_ckpt(one.run_dir, 6));
  test_check(dw <= WEIGHT_TOL,
             "2 ranks vs 1: weights after 6 steps %.2e of the distance training moved them "
             "apart (tol %.0e)",
             dw, WEIGHT_TOL);
  // Negative control: a real change of the run (lr 0.1% higher) must exceed the tolerance.
  Config lr = small_config("lr_control");
  lr.lr *= 1.001f;
  test_check(train(&lr, 0) == 0, "1 process with lr x 1.001 (negative control)");
  double dc = train_test_weight_distance(&m, w0, train_test_ckpt(lr.run_dir, 6),
                                         train_test_ckpt(one.run_dir, 6));
  test_check(dc > 10 * WEIGHT_TOL,
             "negative control: lr x 1.001 moves the weights %.2e apart (> 10 x tol = %.0e)", dc,
             10 * WEIGHT_TOL);
  model_destroy(&m);

  // One rank under mpirun takes the whole distributed path (broadcast, MPI all-reduce of every
  // bucket, agreed metrics): with one process each of those is exact.
  test_check(train(&np1, 1) == 0, "mpirun -np 1: 6 steps");
  test_check(
      train_test_same_tensors(train_test_ckpt(np1.run_dir, 6), train_test_ckpt(one.run_dir, 6)),
      "mpirun -np 1 = the single process, bit for bit (weights and moments)");
}

// Gradient accumulation under mpirun: 2 ranks x 2 micro-batches of 8 train what 1 process trains
// with 4 micro-batches of 8 and with one batch of 32 (the same images at the same global sample
// indices; only the gradient sums are grouped differently: within tolerance). Each rank's
// micro-batches accumulate locally and only the last one's backward all-reduces (the model's
// reports, tests/test_step_graph.c); mpirun -np 1 with accumulation is the single process bit for
// bit.
static void test_accum(void) {
  Config one = small_config("one"), two = small_config("two_accum2");
  Config four = small_config("one_accum4"), np1 = small_config("np1_accum4");
  two.accum_steps = 2;
  four.accum_steps = np1.accum_steps = 4;
  test_check(train(&two, 2) == 0, "mpirun -np 2, train.accum_steps=2 (2 x 8 per rank): 6 steps");
  test_check(train(&four, 0) == 0, "1 process, train.accum_steps=4 (4 x 8): 6 steps");
  char log[600];
  char *text = job_log(log_of(&two, log, sizeof log));
  test_check(
      job_count(text, "16 images each per step (2 x 8)") == 1 &&
          job_count(text, "after the last micro-batch only") == 1 &&
          job_count(text, "batch: 32 images a step = 2 processes x 2 micro-batches x 8") == 1 &&
          job_count(text, "batch 32 = 2 x 8 x 2 ranks") == 6 &&
          strstr(text, "(weights identical on every rank)"),
      "2 ranks with accumulation: the start-up lines and each progress line say 2 x 8 per "
      "rank, the weights stay the same bits on both ranks");
  free(text);
  Model m;
  float *w0 = train_test_initial_weights(&one, &m);
  if (!w0) return;
  const Config *others[2] = {&four, &one};
  const char *names[2] = {"1 process x 4 micro-batches", "1 process, one batch of 32"};
  for (int i = 0; i < 2; i++) {
    double dl = loss_distance(&two, others[i], 1, 6);
    double dw = train_test_weight_distance(&m, w0, train_test_ckpt(two.run_dir, 6),
                                           train_test_ckpt(others[i]->run_dir, 6));
    test_check(dl <= LOSS_TOL && dw <= WEIGHT_TOL,
               "2 ranks x 2 micro-batches vs %s: losses 1..6 within %.1e (tol %.0e), weights "
               "%.2e apart (tol %.0e)",
               names[i], dl, LOSS_TOL, dw, WEIGHT_TOL);
  }
  model_destroy(&m);
  test_check(train(&np1, 1) == 0, "mpirun -np 1, train.accum_steps=4: 6 steps");
  test_check(
      train_test_same_tensors(train_test_ckpt(np1.run_dir, 6), train_test_ckpt(four.run_dir, 6)),
      "mpirun -np 1 with accumulation = the single process with accumulation, bit for bit");
}

static void test_batch_must_divide(void) {
  Config c = small_config("three");
  char log[600];
  double took;
  char ini[600];
  int rc = job_run(3, "./swin_train", log_of(&c, log, sizeof log), &took,
                   write_ini(&c, ini, sizeof ini), (const char *)NULL);
  char *text = job_log(log);
  test_check(rc != 0 && rc != -1 &&
                 strstr(text,
                        "train.batch_size = 32 (the global batch) does not divide among the "
                        "3 processes") &&
                 strstr(text, "multiple of 3 (30 or 33"),
             "mpirun -np 3 with train.batch_size 32: refused, naming the key, its value and the "
             "process count (exit %d)",
             rc);
  if (rc == 0) job_show_log(log);
  free(text);
}

static void test_resume(void) {
  Config two = small_config("two");  // the straight 2-rank run of test_two_equal_one
  Config again = small_config("two_resumed"), one = small_config("two_resumed_on_one");
  const char *from = train_test_ckpt(two.run_dir, 3);
  mkdir(again.run_dir, 0755);
  mkdir(one.run_dir, 0755);
  train_test_copy_file(from, train_test_ckpt(again.run_dir, 3));
  train_test_copy_file(from, train_test_ckpt(one.run_dir, 3));
  snprintf(again.resume, sizeof again.resume, "auto");
  snprintf(one.resume, sizeof one.resume, "auto");
  test_check(train(&again, 2) == 0, "2 ranks resume the 2-rank run from step 3");
  test_check(
      train_test_same_tensors(train_test_ckpt(two.run_dir, 6), train_test_ckpt(again.run_dir, 6)),
      "2-rank resume: weights and moments at step 6 bit-identical to the straight run");
  double la[8] = {0}, lb[8] = {0};
  train_test_losses(two.run_dir, la, 8);
  int n = train_test_losses(again.run_dir, lb, 8);
  bool same = n == 3;
  for (int s = 4; s <= 6; s++) same = same && la[s] == lb[s] && la[s] > 0;
  test_check(same, "2-rank resume: losses of steps 4..6 identical (%.6f %.6f %.6f)", lb[4], lb[5],
             lb[6]);

  test_check(train(&one, 0) == 0, "1 process resumes the 2-rank run from step 3");
  char log[600];
  char *text = job_log(log_of(&one, log, sizeof log));
  test_check(strstr(text, "written by a job of 2 processes, this job has 1") != NULL,
             "another world size: the resume says so");
  free(text);
  Model m;
  float *w0 = train_test_initial_weights(&two, &m);
  if (!w0) return;
  double dw = train_test_weight_distance(&m, w0, train_test_ckpt(one.run_dir, 6),
                                         train_test_ckpt(two.run_dir, 6));
  double dl = loss_distance(&one, &two, 4, 6);
  test_check(dw <= WEIGHT_TOL && dl <= LOSS_TOL,
             "1 process continues the 2-rank run: weights %.2e apart (tol %.0e), losses 4..6 "
             "within %.1e (tol %.0e)",
             dw, WEIGHT_TOL, dl, LOSS_TOL);
  model_destroy(&m);
}

// The value of `key` ("\"eval_loss_ema\": ") in the last record of a run's metrics.jsonl that has
// it; NAN if none.
static double last_metric(const Config *c, const char *key) {
  char path[700], line[1024];
  snprintf(path, sizeof path, "%s/metrics.jsonl", c->run_dir);
  FILE *f = fopen(path, "r");
  double v = NAN;
  while (f && fgets(line, sizeof line, f)) {
    const char *p = strstr(line, key);
    if (p) v = atof(p + strlen(key));
  }
  if (f) fclose(f);
  return v;
}

// A 2-rank run with an EMA resumed on 2 ranks: rank 1 takes rank 0's average (broadcast), so the
// evaluation of the average, whose sums include rank 1's share, is the straight run's.
static void test_resume_ema(void) {
  Config two = small_config("two_ema"), again = small_config("two_ema_resumed");
  two.ema_decay = again.ema_decay = 0.9;
  two.ema_warmup = again.ema_warmup = true;
  test_check(train(&two, 2) == 0, "2 ranks train 6 steps with an EMA (warmup)");
  mkdir(again.run_dir, 0755);
  train_test_copy_file(train_test_ckpt(two.run_dir, 3), train_test_ckpt(again.run_dir, 3));
  snprintf(again.resume, sizeof again.resume, "auto");
  test_check(train(&again, 2) == 0, "2 ranks resume it from step 3");
  test_check(
      train_test_same_tensors(train_test_ckpt(two.run_dir, 6), train_test_ckpt(again.run_dir, 6)),
      "2-rank EMA resume: weights, moments and the average at step 6 bit-identical");
  double a = last_metric(&two, "\"eval_loss_ema\": "),
         b = last_metric(&again, "\"eval_loss_ema\": ");
  double ta = last_metric(&two, "\"eval_top1_ema\": "),
         tb = last_metric(&again, "\"eval_top1_ema\": ");
  test_check(isfinite(a) && a == b && ta == tb,
             "2-rank EMA resume: the evaluation of the average over both ranks' shares identical "
             "(loss %.6f vs %.6f, top-1 %.2f vs %.2f)",
             a, b, ta, tb);
}

// Rank r's share of a batch holds the samples the loader's permutation puts there: epoch 0's
// permutation of n samples, as data/loader.c draws it (Fisher-Yates from (seed, SHUFFLE, 0, 0)).
static void epoch0_permutation(int64_t *perm, int64_t n, uint64_t seed) {
  for (int64_t i = 0; i < n; i++) perm[i] = i;
  Rng rng = rng_make(seed, RNG_STREAM_SHUFFLE, 0, 0);
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = rng_below(&rng, (uint32_t)(i + 1)), t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
}

static void write_png(const char *path, int seed) {
  uint8_t px[8 * 8 * 3];
  for (int i = 0; i < (int)sizeof px; i++) px[i] = (uint8_t)(i * 7 + seed * 31);
  if (!stbi_write_png(path, 8, 8, 3, px, 8 * 3)) printf("cannot write %s\n", path);
}

// An imagefolder of 8 train images, one of them garbage, placed in rank 1's share of the first
// batch (global batch 4: rank 0 takes samples perm[0..1], rank 1 perm[2..3]).
static void test_corrupt_image(void) {
  Config c = small_config("corrupt");
  char root[400], dir[500], path[600];
  snprintf(root, sizeof root, "%s/folder", tmp_root);
  const char *const subdirs[] = {"", "/train", "/train/a", "/val", "/val/a"};
  for (int i = 0; i < 5; i++) {
    snprintf(dir, sizeof dir, "%s%s", root, subdirs[i]);
    mkdir(dir, 0755);
  }
  int64_t perm[8];
  epoch0_permutation(perm, 8, c.seed);
  for (int i = 0; i < 8; i++) {
    snprintf(path, sizeof path, "%s/train/a/%02d.png", root, i);
    write_png(path, i);
  }
  for (int i = 0; i < 2; i++) {
    snprintf(path, sizeof path, "%s/val/a/%02d.png", root, i);
    write_png(path, 10 + i);
  }
  char bad[600];
  snprintf(bad, sizeof bad, "%s/train/a/%02d.png", root, (int)perm[2]);
  FILE *f = fopen(bad, "wb");
  if (f) {
    fputs("this is not a PNG image\n", f);
    fclose(f);
  }
  snprintf(c.dataset, sizeof c.dataset, "imagefolder");
  snprintf(c.path, sizeof c.path, "%s", root);
  c.batch_size = 4;
  c.eval_batch_size = 4;
  c.train_limit = c.val_limit = 0;
  c.scale_min = 1;
  char ini[600], log[600], want[800];
  double took;
  int rc = job_run(2, "./swin_train", log_of(&c, log, sizeof log), &took,
                   write_ini(&c, ini, sizeof ini), (const char *)NULL);
  char *text = job_log(log);
  snprintf(want, sizeof want, "rank 1: error: loader: batch 0 of epoch 0: cannot decode image '%s'",
           bad);
  test_check(rc != 0 && rc != -1 && strstr(text, want) && strstr(text, "rank 1: HINT:") &&
                 !strstr(text, "rank 0: error") && took < FAIL_LIMIT_S,
             "a corrupt image in rank 1's share ends the job: exit %d after %.1f s (limit %.0f s), "
             "naming rank 1 and the file",
             rc, took, FAIL_LIMIT_S);
  if (!strstr(text, want)) job_show_log(log);
  free(text);
}

// The pids of the processes whose parent is pid (mpirun's ranks).
static int children_of(pid_t parent, pid_t *out, int max) {
  DIR *d = opendir("/proc");
  int n = 0;
  struct dirent *e;
  while (d && (e = readdir(d)) && n < max) {
    char path[300], buf[512];
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = 0;
    const char *close_paren = strrchr(buf, ')');  // the name may hold spaces
    int ppid = 0;
    char state;
    if (close_paren && sscanf(close_paren + 1, " %c %d", &state, &ppid) == 2 && ppid == parent)
      out[n++] = (pid_t)atoi(e->d_name);
  }
  if (d) closedir(d);
  return n;
}

// A long 2-rank run, stopped by a signal once it has logged 3 steps: SIGTERM to every rank (as
// Slurm's scancel does), to one rank only (the ranks agree to stop after the same step), or
// SIGUSR1 to mpirun (which forwards it; after its own SIGTERM it kills the ranks a second later).
typedef enum { TO_EVERY_RANK, TO_ONE_RANK, USR1_TO_MPIRUN } StopHow;

static void test_stop(StopHow how, const char *name, const char *what) {
  Config c = small_config(name);
  c.max_steps = 100000;
  c.ckpt_every = 0;       // only the stop writes one (epochs are long)
  c.train_limit = 20000;  // 625 steps per epoch
  mkdir(c.run_dir, 0755);
  char ini[600], log[600], metrics[700];
  snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", c.run_dir);
  double t0 = time_now_s();
  pid_t job = job_start(2, "./swin_train", log_of(&c, log, sizeof log),
                        write_ini(&c, ini, sizeof ini), (const char *)NULL);
  int lines = 0;
  while (lines < 3 && time_now_s() - t0 < 60) {
    nanosleep(&(struct timespec){0, 100000000}, NULL);
    lines = 0;
    FILE *m = fopen(metrics, "r");
    char buf[512];
    while (m && fgets(buf, sizeof buf, m)) lines++;
    if (m) fclose(m);
  }
  pid_t ranks[8];
  int n = children_of(job, ranks, 8);
  if (how == USR1_TO_MPIRUN) kill(job, SIGUSR1);
  for (int i = 0; i < n && how != USR1_TO_MPIRUN; i++)
    if (how == TO_EVERY_RANK || i == n - 1) kill(ranks[i], SIGTERM);
  int rc = job_finish(job, t0, JOB_LIMIT_S, NULL);
  char *text = job_log(log);
  test_check(lines >= 3 && n == 2 && rc == 0 && checkpoints_in(c.run_dir) == 1 &&
                 job_count(text, "stopped by signal at step") == 1,
             "%s after %d logged steps: exit %d, %d checkpoint, one 'stopped' line", what, lines,
             rc, checkpoints_in(c.run_dir));
  if (rc != 0) job_show_log(log);
  free(text);
}

// The default config under mpirun, shortened, on the CPU (with device=auto, two ranks on a
// machine with one GPU would be refused: NCCL needs a GPU per rank).
static void test_default_config(void) {
  char run_dir[600], log[600];
  snprintf(run_dir, sizeof run_dir, "run_dir=%s/default", tmp_root);
  snprintf(log, sizeof log, "%s/default.log", tmp_root);
  double took;
  int rc = job_run(2, "./swin_train", log, &took, SWIN_SOURCE_DIR "/configs/fashion_mnist.ini",
                   run_dir, "device=cpu", "train.max_steps=3", "train.log_every=1",
                   "data.val_limit=256", "threads=1", (const char *)NULL);
  char *text = job_log(log);
  test_check(rc == 0 && job_count(text, "distributed: 2 processes") == 1 &&
                 job_count(text, "eval  step 3:") == 1,
             "mpirun -np 2 swin_train configs/fashion_mnist.ini (3 steps): exit %d in %.1f s", rc,
             took);
  if (rc != 0) job_show_log(log);
  free(text);
}

// The line of the bench's JSON in text, or NULL.
static const char *bench_json(const char *text) {
  return strstr(text, "{\"bench\": \"swin.c\"");
}

// bench=1 under mpirun -np 2 on the CPU: every step the trainer's data-parallel step, rank 0
// printing the table with the all-reduce rows and one JSON line; alone, no all-reduce at all.
static void test_bench(void) {
  char log[600];
  snprintf(log, sizeof log, "%s/bench.log", tmp_root);
  double took;
  const char *config = SWIN_SOURCE_DIR "/configs/fashion_mnist.ini";
  int rc = job_run(2, "./swin_train", log, &took, config, "bench=1", "device=cpu", "bench.steps=2",
                   "bench.warmup=1", "threads=1", "train.batch_size=32", (const char *)NULL);
  char *text = job_log(log);
  test_check(rc == 0 && job_count(text, "bench: cpu") == 1 &&
                 strstr(text, "batch 32 (2 processes x 16)") &&
                 strstr(text, "data parallel: 2 processes") &&
                 job_count(text, "    all-reduce (MPI) ") == 1 &&
                 job_count(text, "    all-reduce exposed ") == 1 &&
                 job_count(text, "    all-reduce hidden ") == 1,
             "mpirun -np 2 swin_train configs/fashion_mnist.ini bench=1 device=cpu: exit %d in "
             "%.1f s, rank 0 alone prints the table, with the all-reduce rows",
             rc, took);
  const char *json = bench_json(text);
  double world = job_json_number(json, "world"), share = job_json_number(json, "batch_per_rank");
  double ms = job_json_number(json, "ms_per_step"), img_s = job_json_number(json, "img_s");
  double unreduced = job_json_number(json, "ms_per_step_unreduced");
  double total = job_json_number(json, "allreduce_ms");
  double exposed = job_json_number(json, "allreduce_exposed_ms");
  double hidden = job_json_number(json, "allreduce_hidden_ms");
  test_check(json && job_count(text, "{\"bench\": ") == 1 && world == 2 && share == 16,
             "one JSON line, world %g, %g images per rank", world, share);
  // The JSON keeps 0.1 img/s and 1e-3 ms: img/s agrees with 32 images per ms_per_step to that.
  test_check(
      ms > 0 && img_s > 0 && fabs(img_s * ms / 32e3 - 1) <= 0.05 / img_s + 0.6e-3 / ms + 1e-4,
      "img/s %.1f counts both ranks' images: 32 per %.3f ms step", img_s, ms);
  test_check(total > 0 && unreduced > 0 && fabs(exposed - (ms - unreduced)) <= 2e-3 &&
                 fabs(hidden - (total - exposed)) <= 2e-4,
             "all-reduce %.3f ms a step (MPI, host clock), exposed %.3f = %.3f - %.3f ms (with "
             "and without the reduction), hidden %.3f = the rest",
             total, exposed, ms, unreduced, hidden);
  if (rc != 0 || !json) job_show_log(log);
  free(text);

  snprintf(log, sizeof log, "%s/bench_alone.log", tmp_root);
  rc = job_run(0, "./swin_train", log, &took, config, "bench=1", "device=cpu", "bench.steps=2",
               "bench.warmup=1", "threads=1", "train.batch_size=32", (const char *)NULL);
  text = job_log(log);
  json = bench_json(text);
  test_check(rc == 0 && json && job_json_number(json, "world") == 1 &&
                 !strstr(text, "all-reduce") && !strstr(json, "allreduce") &&
                 strstr(text, "batch 32, "),
             "without a launcher: the one-process benchmark (world 1, no all-reduce), exit %d", rc);
  if (rc != 0) job_show_log(log);
  free(text);

  // With accumulation: the step is 2 micro-batches of 8 per rank, img/s still counts 32 a step.
  snprintf(log, sizeof log, "%s/bench_accum.log", tmp_root);
  rc = job_run(2, "./swin_train", log, &took, config, "bench=1", "device=cpu", "bench.steps=2",
               "bench.warmup=1", "threads=1", "train.batch_size=32", "train.accum_steps=2",
               (const char *)NULL);
  text = job_log(log);
  json = bench_json(text);
  test_check(rc == 0 && json && strstr(text, "batch 32 (2 processes x 2 micro-batches x 8)") &&
                 job_json_number(json, "accum_steps") == 2 &&
                 job_json_number(json, "batch_per_rank") == 16 &&
                 job_count(text, "    all-reduce exposed ") == 1,
             "bench=1 under mpirun -np 2 with train.accum_steps=2: the accumulating step, 2 "
             "micro-batches of 8 per rank (exit %d)",
             rc);
  if (rc != 0 || !json) job_show_log(log);
  free(text);

  snprintf(log, sizeof log, "%s/bench_three.log", tmp_root);
  rc = job_run(3, "./swin_train", log, &took, config, "bench=1", "device=cpu", "bench.steps=2",
               "threads=1", (const char *)NULL);
  text = job_log(log);
  test_check(rc != 0 && rc != -1 &&
                 strstr(text,
                        "train.batch_size = 128 (the global batch) does not divide among the "
                        "3 processes") &&
                 !bench_json(text),
             "bench=1 under mpirun -np 3 with train.batch_size 128: refused with the trainer's "
             "message (exit %d)",
             rc);
  if (rc == 0) job_show_log(log);
  free(text);
}

static void test_shards(int np) {
  char log[600], want[64];
  snprintf(log, sizeof log, "%s/shards%d.log", tmp_root, np);
  double took;
  int rc = job_run(np, "./test_dist_train", log, &took, "--shards", (const char *)NULL);
  char *text = job_log(log);
  snprintf(want, sizeof want, "shards: %d ranks:", np);
  test_check(rc == 0 && strstr(text, want) && !strstr(text, "FAIL"),
             "mpirun -np %d: each epoch's and the evaluation's shares are disjoint and complete",
             np);
  if (rc != 0 || !strstr(text, want)) job_show_log(log);
  free(text);
}

// ---------------------------------------------------------------------------------------------
// --shards: run by every rank of a job

// A sample's identity: a hash of its pixels and label (synthetic pixels are random per index).
static uint64_t sample_hash(const uint8_t *px, int64_t bytes, int label) {
  uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t)label;
  for (int64_t i = 0; i < bytes; i++) h = (h ^ px[i]) * 0x100000001b3ull;
  return h;
}

// Counts, in seen (n), every sample of `batches` batches from this rank's loader.
static int count_share(const Dataset *ds, const LoaderOptions *o, int64_t batches,
                       const uint64_t *ids, int64_t n, double *seen, Error *err) {
  Loader *L;
  if (loader_create(&L, ds, o, err) != 0) return -1;
  int64_t bytes = dataset_sample_bytes(ds);
  for (int64_t k = 0; k < batches; k++) {
    Batch *b;
    int rc = loader_next(L, &b, err);
    if (rc == 0 && !b) rc = error_set(err, "the loader ended after %lld batches", (long long)k);
    if (rc != 0) {
      loader_destroy(L);
      return -1;
    }
    for (int j = 0; j < b->count; j++) {
      uint64_t h = sample_hash(b->pixels + j * bytes, bytes, b->labels[j]);
      for (int64_t i = 0; i < n; i++)
        if (ids[i] == h) seen[i]++;
    }
    loader_release_batch(L, b);
  }
  loader_destroy(L);
  return 0;
}

// How many samples were seen exactly once over the ranks; the others must be seen 0 times.
static int64_t seen_once(const double *seen, int64_t n, bool *others_zero) {
  int64_t once = 0;
  *others_zero = true;
  for (int64_t i = 0; i < n; i++) {
    once += seen[i] == 1;
    *others_zero &= seen[i] == 1 || seen[i] == 0;
  }
  return once;
}

static void must(Comm *c, int rc, const Error *err) {
  if (rc != 0) comm_abort(c, err->msg);
}

static int shards_main(void) {
  Comm c;
  Error err;
  must(&c, comm_init(&c, &err), &err);
  Config cfg;
  config_defaults(&cfg);
  snprintf(cfg.dataset, sizeof cfg.dataset, "synthetic");
  cfg.img_h = cfg.img_w = 8;
  cfg.in_chans = 3;
  cfg.train_limit = 200;  // global batch 24: 8 batches an epoch, 8 samples left out
  cfg.val_limit = 100;    // 5 evaluation batches of 24, the last one partial
  cfg.batch_size = cfg.eval_batch_size = 24;
  cfg.workers = 2;
  Dataset *train_set, *val_set;
  must(&c, dataset_open(&train_set, &cfg, "train", &err), &err);
  must(&c, dataset_open(&val_set, &cfg, "val", &err), &err);
  LoaderOptions train, eval;
  must(&c, train_loader_options(&cfg, &c, true, &train, &err), &err);
  must(&c, train_loader_options(&cfg, &c, false, &eval, &err), &err);

  bool ok = train.batch_size * c.world == 24 && eval.batch_size * c.world >= 24;
  const Dataset *sets[2] = {train_set, val_set};
  for (int s = 0; s < 2; s++) {
    int64_t n = dataset_size(sets[s]), bytes = dataset_sample_bytes(sets[s]);
    uint64_t *ids = malloc(sizeof(uint64_t) * (size_t)n);
    uint8_t *px = malloc((size_t)bytes);
    for (int64_t i = 0; i < n; i++) {
      int label;
      must(&c, dataset_load_sample(sets[s], i, false, 0, 0, px, &label, &err), &err);
      ids[i] = sample_hash(px, bytes, label);
    }
    // Training: epochs 0 and 1 each cover 192 distinct samples once; evaluation all 100.
    int epochs = s == 0 ? 2 : 1;
    int64_t per_epoch = s == 0 ? n / 24 : (n + 23) / 24, want = s == 0 ? per_epoch * 24 : n;
    double *seen = calloc((size_t)n, sizeof(double));
    LoaderOptions o = s == 0 ? train : eval;
    for (int e = 0; e < epochs; e++) {
      memset(seen, 0, sizeof(double) * (size_t)n);
      o.start_epoch = e;
      must(&c, count_share(sets[s], &o, per_epoch, ids, n, seen, &err), &err);
      must(&c, comm_allreduce_doubles(&c, seen, n, COMM_SUM, &err), &err);
      bool others_zero;
      int64_t once = seen_once(seen, n, &others_zero);
      if (c.rank == 0 && (once != want || !others_zero)) {
        printf("FAIL %s epoch %d: %lld samples seen once (want %lld), others %s\n",
               s == 0 ? "train" : "eval", e, (long long)once, (long long)want,
               others_zero ? "unseen" : "seen twice or more");
        ok = false;
      }
    }
    free(seen);
    free(ids);
    free(px);
  }
  if (c.rank == 0 && ok)
    printf(
        "shards: %d ranks: epochs 0 and 1 of the train split (%d a rank per step) and the "
        "evaluation (%d a rank per batch) disjoint and complete\n",
        c.world, train.batch_size, eval.batch_size);
  double failed = !ok;
  must(&c, comm_allreduce_doubles(&c, &failed, 1, COMM_MAX, &err), &err);
  dataset_close(train_set);
  dataset_close(val_set);
  must(&c, comm_finalize(&c, &err), &err);
  return failed > 0;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--shards") == 0) return shards_main();
  struct stat sb;
  if (stat(FASHION_DIR, &sb) != 0) {
    printf("SKIP: %s not found (apt-get install dataset-fashion-mnist)\n", FASHION_DIR);
    return 77;
  }
  if (!job_have_mpirun()) {
    test_check(0, "mpirun not found. HINT: bash scripts/setup.sh installs openmpi-bin");
    return test_finish();
  }
  snprintf(tmp_root, sizeof tmp_root, "/tmp/swin_test_dist_train_XXXXXX");
  if (!mkdtemp(tmp_root)) return 1;
  test_two_equal_one();
  test_accum();
  test_batch_must_divide();
  test_resume();
  test_resume_ema();
  test_shards(2);
  test_shards(3);
  test_corrupt_image();
  test_stop(TO_EVERY_RANK, "stop_all", "SIGTERM to both ranks");
  test_stop(TO_ONE_RANK, "stop_one", "SIGTERM to one rank only");
  test_stop(USR1_TO_MPIRUN, "stop_usr1", "SIGUSR1 to mpirun");
  test_default_config();
  test_bench();
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_root);
  if (test_stats.failed == 0 && system(cmd) != 0) printf("note: could not remove %s\n", tmp_root);
  return test_finish();
}
