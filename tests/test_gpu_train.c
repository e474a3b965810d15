// test_gpu_train.c: the trainer on the GPU, end to end on synthetic data: two runs with the same
// seed give the same bits; a run resumed from its step-3 checkpoint ends with the same weights,
// moments and losses as the straight run; a GPU checkpoint resumes on the CPU and a CPU one on
// the GPU; fp16 with an overflowing loss scale skips the step, halves the scale and leaves the
// weights, moments and the moving average of the weights untouched; fp16 with the default scale
// trains. CUDA graphs (train.cuda_graphs, src/app/step_graph.h): a run whose steps are replayed
// graphs ends bitwise equal to the same run launched kernel by kernel (weights, moments, every
// step's loss), with and without the per-batch augmentations, and with layer decay and the moving
// average (whose decay the captured step reads from the device), and resumes exactly. With
// gemm_tune = on the run writes its timed GEMM choices to run_dir/gemm_choices.txt, and a run
// resumed from its step-3 checkpoint with that file ends bitwise equal to the straight tuned run.
// Gradient accumulation (train.accum_steps): fp32 micro-batches train what one batch trains
// (float tolerance, with a negative control), graphs on vs off bitwise (with the augmentations
// too), resume exact. Swin V2 (model.version = 2): graphs on vs off bitwise, and resume exact.
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <sys/stat.h>

#include "tests/util/test_gpu_util.h"
#include "tests/util/test_model_config.h"

#ifdef SWIN_HAVE_CUDA
#include "src/io/checkpoint.h"
#include "src/model/model.h"
#include "tests/util/test_graph_runs.h"
#include "tests/util/test_train_util.h"

static char tmp_root[256];

// fp32 accumulation against one batch on the GPU (accum_equals_batch). The sources of difference
// are the CPU's (tests/test_train.c: gradient sums grouped differently, weights 1.0e-6 apart after
// 6 steps, losses equal to 6 decimals), plus the GEMMs of 8-image micro-batches being other
// problems than those of 32 images, for which cuBLASLt may pick kernels that round differently:
// 100x the CPU's measurement. The negative control (lr 1% higher, 10x the CPU test's change,
// which moved the weights 1.05e-3 there) must land 10x above the weight tolerance.
#define GPU_ACCUM_LOSS_TOL 1e-4
#define GPU_ACCUM_WEIGHT_TOL 1e-4

static Config gpu_config(const char *run_name, const char *precision) {
  // 8x8 tokens: 4x4 windows shifted 2,2, then one 4x4 window.
  Config c = test_model_config((TestModel){.img_h = 32,
                                           .chans = 3,
                                           .patch = 4,
                                           .embed = 32,
                                           .window = 4,
                                           .classes = 10,
                                           .depths = {2, 2},
                                           .heads = {1, 2}});
  snprintf(c.run_dir, sizeof c.run_dir, "%s/%s", tmp_root, run_name);
  snprintf(c.device, sizeof c.device, "cuda");
  snprintf(c.precision, sizeof c.precision, "%s", precision);
  c.drop_path_rate = 0.1f;  // exercises the drop-path stream across resume
  c.batch_size = 32;
  c.max_steps = 6;
  c.lr = 2e-3f;
  c.lr_scale_batch = 0;
  c.warmup_epochs = 0.2f;
  c.log_every = 1;
  c.eval_every = 1000;
  c.eval_batch_size = 64;
  snprintf(c.dataset, sizeof c.dataset, "synthetic");
  c.train_limit = 128;  // 4 batches per epoch: 6 steps cross an epoch boundary
  c.val_limit = 100;
  c.workers = 2;
  c.ckpt_every = 3;
  c.ckpt_keep = 5;
  return c;
}

static const char *ckpt_of(const Config *c, int step) {
  return train_test_ckpt(c->run_dir, step);
}

static int losses_of(const Config *c, double *loss, int max) {
  return train_test_losses(c->run_dir, loss, max);
}

// A checkpoint's metadata value as a number (NaN if absent).
static double ckpt_meta(const char *path, const char *key) {
  SafeTensors st;
  Error err;
  if (safetensors_read(&st, path, &err) != 0) return NAN;
  const char *v = safetensors_meta_get(&st, key);
  double x = v ? atof(v) : NAN;
  safetensors_free(&st);
  return x;
}

static void test_same_bits_and_resume(void) {
  Config a = gpu_config("det1", "bf16"), b = gpu_config("det2", "bf16");
  test_check(train_test_run(&a) == 0 && train_test_run(&b) == 0, "two bf16 runs of 6 steps");
  test_check(train_test_same_tensors(ckpt_of(&a, 6), ckpt_of(&b, 6)),
             "same seed twice on the GPU: weights and moments bit-identical");
  double la[8] = {0}, lb[8] = {0};
  losses_of(&a, la, 8);
  losses_of(&b, lb, 8);
  bool same = true;
  for (int s = 1; s <= 6; s++) same = same && la[s] == lb[s] && la[s] > 0;
  test_check(same, "same seed twice: losses identical (step 6: %.6f %.6f)", la[6], lb[6]);

  Config r = gpu_config("resumed", "bf16");
  mkdir(r.run_dir, 0755);
  train_test_copy_file(ckpt_of(&a, 3), ckpt_of(&r, 3));
  snprintf(r.resume, sizeof r.resume, "auto");
  test_check(train_test_run(&r) == 0, "bf16 run resumed from step 3");
  test_check(train_test_same_tensors(ckpt_of(&a, 6), ckpt_of(&r, 6)),
             "GPU resume: final weights and moments bit-identical to the straight run");
  double lr[8] = {0};
  int n = losses_of(&r, lr, 8);
  same = n == 3;
  for (int s = 4; s <= 6; s++) same = same && lr[s] == la[s];
  test_check(same, "GPU resume: losses of steps 4..6 identical (%.6f %.6f %.6f)", lr[4], lr[5],
             lr[6]);
}

static void test_tuned_resume(void) {
  Config a = gpu_config("tuned", "bf16");
  snprintf(a.gemm_tune, sizeof a.gemm_tune, "on");
  test_check(train_test_run(&a) == 0, "bf16 run of 6 steps with gemm_tune=on");
  char from[600], to[600];
  snprintf(from, sizeof from, "%s/gemm_choices.txt", a.run_dir);
  struct stat st;
  test_check(stat(from, &st) == 0 && st.st_size > 100, "gemm_tune=on: %s written (%lld bytes)",
             from, (long long)(stat(from, &st) == 0 ? st.st_size : -1));
  Config r = gpu_config("tuned_resumed", "bf16");
  snprintf(r.gemm_tune, sizeof r.gemm_tune, "on");
  mkdir(r.run_dir, 0755);
  train_test_copy_file(ckpt_of(&a, 3), ckpt_of(&r, 3));
  snprintf(to, sizeof to, "%s/gemm_choices.txt", r.run_dir);
  train_test_copy_file(from, to);
  snprintf(r.resume, sizeof r.resume, "auto");
  test_check(train_test_run(&r) == 0, "gemm_tune=on run resumed from step 3");
  test_check(train_test_same_tensors(ckpt_of(&a, 6), ckpt_of(&r, 6)),
             "gemm_tune=on resume: final weights and moments bit-identical to the straight run");
}

// The other device continues a run: it must load, train and stay close to the straight run
// (bf16 on the GPU vs fp32 on the CPU: a few percent in the loss after 3 more steps).
static void test_cross_device(void) {
  Config cpu = gpu_config("cpu_straight", "fp32");
  snprintf(cpu.device, sizeof cpu.device, "cpu");
  test_check(train_test_run(&cpu) == 0, "CPU fp32 run of 6 steps");
  double lc[8] = {0}, lg[8] = {0}, lx[8] = {0};
  losses_of(&cpu, lc, 8);

  Config to_gpu = gpu_config("cpu_to_gpu", "bf16");
  mkdir(to_gpu.run_dir, 0755);
  train_test_copy_file(ckpt_of(&cpu, 3), ckpt_of(&to_gpu, 3));
  snprintf(to_gpu.resume, sizeof to_gpu.resume, "auto");
  test_check(train_test_run(&to_gpu) == 0, "a CPU checkpoint resumes on the GPU (bf16)");
  losses_of(&to_gpu, lg, 8);
  double worst = 0;
  for (int s = 4; s <= 6; s++) worst = fmax(worst, fabs(lg[s] - lc[s]) / lc[s]);
  test_check(worst < 0.05, "CPU -> GPU: losses 4..6 within %.2f%% of the CPU run (tol 5%%)",
             100 * worst);

  Config det = gpu_config("det1", "bf16");  // the straight GPU run of the test above
  Config to_cpu = gpu_config("gpu_to_cpu", "fp32");
  snprintf(to_cpu.device, sizeof to_cpu.device, "cpu");
  mkdir(to_cpu.run_dir, 0755);
  train_test_copy_file(ckpt_of(&det, 3), ckpt_of(&to_cpu, 3));
  snprintf(to_cpu.resume, sizeof to_cpu.resume, "auto");
  test_check(train_test_run(&to_cpu) == 0, "a GPU (bf16) checkpoint resumes on the CPU (fp32)");
  double ld[8] = {0};
  losses_of(&det, ld, 8);
  losses_of(&to_cpu, lx, 8);
  worst = 0;
  for (int s = 4; s <= 6; s++) worst = fmax(worst, fabs(lx[s] - ld[s]) / ld[s]);
  test_check(worst < 0.05, "GPU -> CPU: losses 4..6 within %.2f%% of the GPU run (tol 5%%)",
             100 * worst);
}

// A loss scale that overflows fp16 at once: the one step is skipped on the device.
static void test_fp16_overflow(void) {
  Config c = gpu_config("fp16_overflow", "fp16");
  c.loss_scale = 1e30f;
  c.max_steps = 1;
  c.ema_decay = 0.9;  // starts at the weights; a skipped step leaves it there
  test_check(train_test_run(&c) == 0, "fp16 run with loss scale 1e30 (one step)");
  const char *path = ckpt_of(&c, 1);
  double scale = ckpt_meta(path, "loss_scale"), skipped = ckpt_meta(path, "skipped_steps");
  test_check(scale == (double)(1e30f * 0.5f) && skipped == 1,
             "the overflowing step was skipped and the scale halved (scale %g, skipped %g)", scale,
             skipped);

  // Weights as initialized, moments zero.
  Config v = c;
  Error err;
  Model m;
  config_validate(&v, &err);
  if (model_create(&m, &v, NULL, 0, &err) != 0) {
    test_check(0, "model: %s", err.msg);
    return;
  }
  model_init_weights(&m, v.seed);
  SafeTensors st;
  if (safetensors_read(&st, path, &err) != 0) {
    test_check(0, "read %s: %s", path, err.msg);
    model_destroy(&m);
    return;
  }
  int changed = 0, nonzero_moments = 0, ema_changed = 0;
  for (int i = 0; i < m.num_params; i++) {
    const Param *p = &m.params[i];
    const SafeTensorEntry *e = safetensors_find(&st, p->t.name);
    if (!e || memcmp(safetensors_entry_data(&st, e), m.weights + p->offset,
                     sizeof(float) * (size_t)tensor_numel(&p->t)) != 0)
      changed++;
    char ema_name[160];
    snprintf(ema_name, sizeof ema_name, "ema.%s", p->t.name);
    const SafeTensorEntry *a = safetensors_find(&st, ema_name);
    if (!a || memcmp(safetensors_entry_data(&st, a), m.weights + p->offset,
                     sizeof(float) * (size_t)tensor_numel(&p->t)) != 0)
      ema_changed++;
    const char *prefix[2] = {"optim.exp_avg.", "optim.exp_avg_sq."};
    for (int k = 0; k < 2; k++) {
      char name[160];
      snprintf(name, sizeof name, "%s%s", prefix[k], p->t.name);
      const SafeTensorEntry *me = safetensors_find(&st, name);
      const float *x = me ? safetensors_entry_data(&st, me) : NULL;
      for (int64_t j = 0; x && j < tensor_numel(&p->t); j++) nonzero_moments += x[j] != 0;
      if (!x) nonzero_moments++;
    }
  }
  test_check(changed == 0 && nonzero_moments == 0 && ema_changed == 0,
             "skipped step: weights untouched (%d tensors changed), moments zero (%d nonzero), the "
             "average still the initial weights (%d tensors differ)",
             changed, nonzero_moments, ema_changed);
  safetensors_free(&st);
  model_destroy(&m);

  Config d = gpu_config("fp16_default", "fp16");
  test_check(train_test_run(&d) == 0, "fp16 run with the default dynamic scale (6 steps)");
  double l[8] = {0};
  losses_of(&d, l, 8);
  test_check(isfinite(l[6]) && l[6] > 0, "fp16: finite loss at step 6 (%.4f)", l[6]);
}

// ---- CUDA graphs ------------------------------------------------------------------------------

static bool same_losses(const Config *a, const Config *b, int from, int to) {
  double la[32] = {0}, lb[32] = {0};
  losses_of(a, la, 32);
  losses_of(b, lb, 32);
  bool same = true;
  for (int s = from; s <= to; s++) same = same && la[s] == lb[s] && la[s] > 0;
  if (!same)
    for (int s = from; s <= to; s++)
      if (la[s] != lb[s]) printf("     step %d: loss %.9g vs %.9g\n", s, la[s], lb[s]);
  return same;
}

// The same run with train.cuda_graphs=on and off: 10 steps over two staging slots, so steps 0
// and 1 run plainly (each slot's first), 2 and 3 are captured and replayed, 4..9 replayed; a log
// and a read-back every step, a checkpoint at step 5, the evaluation at the end. Graphs change
// the launches only: the weights, moments and losses must be the same bits.
static void graphs_on_off(const char *name, const char *precision, bool augment, bool ema,
                          int version) {
  char on_name[64], off_name[64];
  snprintf(on_name, sizeof on_name, "%s_graphs_on", name);
  snprintf(off_name, sizeof off_name, "%s_graphs_off", name);
  Config on = gpu_config(on_name, precision), off = gpu_config(off_name, precision);
  Config *both[2] = {&on, &off};
  for (int k = 0; k < 2; k++) {
    Config *c = both[k];
    c->version = version;
    c->max_steps = 10;
    c->ckpt_every = 5;
    if (augment) {  // the recipe's per-batch augmentations: f32 images and soft targets
      c->mixup = 0.8f;
      c->cutmix = 1.0f;
      c->reprob = 0.25f;
    }
    if (ema) {  // per-chunk lr scales; the average's update, its decay warming up every step
      c->layer_decay = 0.8f;
      c->ema_decay = 0.9;
      c->ema_warmup = true;
      c->eval_every = 5;  // the average evaluated in the weights' place before the step-5 save
    }
    snprintf(c->cuda_graphs, sizeof c->cuda_graphs, "%s", k == 0 ? "on" : "off");
  }
  long long replayed, steps, replayed_off, steps_off;
  int rc_on = train_test_run_counting_replays(&on, &replayed, &steps);
  int rc_off = train_test_run_counting_replays(&off, &replayed_off, &steps_off);
  test_check(rc_on == 0 && rc_off == 0, "%s %s%s%s: 10 steps with train.cuda_graphs=on and off",
             name, precision, augment ? " with mixup, cutmix and erasing" : "",
             ema ? " with layer decay 0.8 and an EMA (warmup)" : "");
  if (rc_on != 0 || rc_off != 0) return;
  test_check(replayed == 8 && steps == 10 && replayed_off == 0,
             "%s: graphs on replayed 8 of 10 steps (got %lld of %lld), off none (%lld)", name,
             replayed, steps, replayed_off);
  test_check(train_test_same_tensors(ckpt_of(&on, 5), ckpt_of(&off, 5)) &&
                 train_test_same_tensors(ckpt_of(&on, 10), ckpt_of(&off, 10)),
             "%s: graphs on vs off: weights and moments bit-identical at steps 5 and 10", name);
  test_check(same_losses(&on, &off, 1, 10), "%s: graphs on vs off: losses of steps 1..10 identical",
             name);
  if (ema) {
    SafeTensors st;
    Error err;
    bool has = safetensors_read(&st, ckpt_of(&on, 10), &err) == 0 &&
               safetensors_find(&st, "ema.head.fc.weight") != NULL;
    if (has) safetensors_free(&st);
    test_check(has, "%s: the checkpoints compared hold the average (ema.head.fc.weight)", name);
  }
}

// A run with graphs on resumed from its step-5 checkpoint (graphs on again, the resumed run's
// slots captured anew) ends bitwise where the straight run ends (with ema: the average too).
static void graphs_resume(const char *name, bool ema, int version) {
  char straight[64];
  snprintf(straight, sizeof straight, "%s_graphs_on", name);
  Config a = gpu_config(straight, "bf16");  // the straight run of graphs_on_off
  a.version = version;
  a.max_steps = 10;
  a.ckpt_every = 5;
  if (ema) {  // as graphs_on_off: the straight run evaluated (the weights swapped with the
              // average and back) before its step-5 checkpoint, which the resumed run starts from
    a.layer_decay = 0.8f;
    a.ema_decay = 0.9;
    a.ema_warmup = true;
    a.eval_every = 5;
  }
  Config r = a;
  snprintf(r.run_dir, sizeof r.run_dir, "%s/%s_graphs_resumed", tmp_root, name);
  mkdir(r.run_dir, 0755);
  train_test_copy_file(ckpt_of(&a, 5), ckpt_of(&r, 5));
  snprintf(r.resume, sizeof r.resume, "auto");
  snprintf(r.cuda_graphs, sizeof r.cuda_graphs, "on");
  long long replayed, steps;
  test_check(train_test_run_counting_replays(&r, &replayed, &steps) == 0,
             "%s graphs on: run resumed from step 5 to step 10", name);
  test_check(replayed == 3 && steps == 5,
             "%s resumed with graphs: 3 of 5 steps replayed (%lld of %lld)", name, replayed, steps);
  test_check(train_test_same_tensors(ckpt_of(&a, 10), ckpt_of(&r, 10)),
             "%s graphs on, resumed: final weights and moments%s bit-identical to the straight run",
             name, ema ? " and the average" : "");
  test_check(same_losses(&a, &r, 6, 10), "%s graphs on, resumed: losses of steps 6..10 identical",
             name);
}

// ---- gradient accumulation ----------------------------------------------------------------------

// fp32 on the GPU: 4 micro-batches of 8 train what one batch of 32 trains, within float rounding
// (the same images and drop-path draws at the same global sample indices; the gradient sums
// grouped differently, and cuBLASLt may pick another kernel for 8 rows than for 32); with graphs on
// the two parts are replayed (22 of 24 micro-batches: each part's first use plain, the second
// captured), bitwise equal to plain launches, and resume exactly.
static void accum_equals_batch(void) {
  Config one = gpu_config("accum_one", "fp32"), acc = gpu_config("accum4", "fp32");
  Config off = gpu_config("accum4_off", "fp32");
  acc.accum_steps = off.accum_steps = 4;
  snprintf(acc.cuda_graphs, sizeof acc.cuda_graphs, "on");
  snprintf(off.cuda_graphs, sizeof off.cuda_graphs, "off");
  long long replayed, parts, ignored;
  test_check(train_test_run(&one) == 0, "fp32, one batch of 32: 6 steps");
  int rc = train_test_run_counting_replays(&acc, &replayed, &parts);
  test_check(rc == 0 && train_test_run_counting_replays(&off, &ignored, &ignored) == 0,
             "fp32, train.accum_steps=4 with graphs on and off: 6 steps of 4 x 8");
  if (rc != 0) return;
  test_check(replayed == 22 && parts == 24,
             "accum 4, graphs on: 22 of 24 micro-batches replayed (%lld of %lld)", replayed, parts);
  test_check(
      train_test_same_tensors(ckpt_of(&acc, 6), ckpt_of(&off, 6)) && same_losses(&acc, &off, 1, 6),
      "accum 4: graphs on vs off: weights, moments and losses bit-identical");
  double la[8] = {0}, lb[8] = {0}, ga[8] = {0}, gb[8] = {0}, dl = 0, dg = 0;
  losses_of(&one, la, 8);
  losses_of(&acc, lb, 8);
  train_test_series(one.run_dir, "grad_norm", ga, 8);
  train_test_series(acc.run_dir, "grad_norm", gb, 8);
  for (int s = 1; s <= 6; s++) {
    dl = la[s] > 0 && lb[s] > 0 ? fmax(dl, fabs(la[s] - lb[s]) / la[s]) : INFINITY;
    dg = ga[s] > 0 && gb[s] > 0 ? fmax(dg, fabs(ga[s] - gb[s]) / ga[s]) : INFINITY;
  }
  Model m;
  float *w0 = train_test_initial_weights(&one, &m);
  if (!w0) return;
  double dw = train_test_weight_distance(&m, w0, ckpt_of(&acc, 6), ckpt_of(&one, 6));
  test_check(dl <= GPU_ACCUM_LOSS_TOL && dg <= GPU_ACCUM_LOSS_TOL && dw <= GPU_ACCUM_WEIGHT_TOL,
             "fp32 accum 4 x 8 vs one batch of 32: losses %.1e, gradient norms %.1e (tol %.0e), "
             "weights %.2e apart (tol %.0e)",
             dl, dg, GPU_ACCUM_LOSS_TOL, dw, GPU_ACCUM_WEIGHT_TOL);
  Config lr = gpu_config("accum4_lr", "fp32");
  lr.accum_steps = 4;
  lr.lr *= 1.01f;
  test_check(train_test_run(&lr) == 0, "fp32 accum 4 with lr x 1.01 (negative control)");
  double dc = train_test_weight_distance(&m, w0, ckpt_of(&lr, 6), ckpt_of(&one, 6));
  test_check(dc > 10 * GPU_ACCUM_WEIGHT_TOL,
             "negative control: lr x 1.01 moves the weights %.2e apart (> 10 x tol)", dc);
  model_destroy(&m);

  Config r = acc;
  snprintf(r.run_dir, sizeof r.run_dir, "%s/accum4_resumed", tmp_root);
  mkdir(r.run_dir, 0755);
  train_test_copy_file(ckpt_of(&acc, 3), ckpt_of(&r, 3));
  snprintf(r.resume, sizeof r.resume, "auto");
  test_check(
      train_test_run_counting_replays(&r, &replayed, &parts) == 0 && replayed == 10 && parts == 12,
      "accum 4 with graphs, resumed from step 3: 10 of 12 micro-batches replayed (%lld of "
      "%lld)",
      replayed, parts);
  test_check(
      train_test_same_tensors(ckpt_of(&acc, 6), ckpt_of(&r, 6)) && same_losses(&acc, &r, 4, 6),
      "accum 4 with graphs, resumed: weights, moments and losses bit-identical");
}

// The recipe's per-batch augmentations with accumulation under fp16 (each micro-batch erased,
// mixed and given its soft targets, copied into the buffers the graph reads): graphs on vs off
// bitwise, over 10 steps of 2 micro-batches.
static void accum_graphs_augment(void) {
  Config on = gpu_config("accum_aug_on", "fp16"), off = gpu_config("accum_aug_off", "fp16");
  Config *both[2] = {&on, &off};
  for (int k = 0; k < 2; k++) {
    Config *c = both[k];
    c->max_steps = 10;
    c->ckpt_every = 5;
    c->accum_steps = 2;
    c->mixup = 0.8f;
    c->cutmix = 1.0f;
    c->reprob = 0.25f;
    snprintf(c->cuda_graphs, sizeof c->cuda_graphs, "%s", k == 0 ? "on" : "off");
  }
  long long replayed, parts, ignored;
  int rc = train_test_run_counting_replays(&on, &replayed, &parts);
  test_check(rc == 0 && train_test_run_counting_replays(&off, &ignored, &ignored) == 0,
             "fp16, accum 2 with mixup, cutmix and erasing: 10 steps with graphs on and off");
  if (rc != 0) return;
  test_check(replayed == 18 && parts == 20,
             "accum 2 with augmentations: 18 of 20 micro-batches replayed (%lld of %lld)", replayed,
             parts);
  test_check(train_test_same_tensors(ckpt_of(&on, 5), ckpt_of(&off, 5)) &&
                 train_test_same_tensors(ckpt_of(&on, 10), ckpt_of(&off, 10)) &&
                 same_losses(&on, &off, 1, 10),
             "accum 2 with augmentations: graphs on vs off bit-identical (weights, moments, "
             "losses)");
}

int main(void) {
  GPU_TEST_MAIN_BEGIN();
  snprintf(tmp_root, sizeof tmp_root, "/tmp/swin_test_gpu_train_XXXXXX");
  if (!mkdtemp(tmp_root)) return 1;
  test_same_bits_and_resume();
  test_tuned_resume();
  test_cross_device();
  test_fp16_overflow();
  graphs_on_off("bf16", "bf16", false, false, 1);
  graphs_on_off("fp16_aug", "fp16", true, false, 1);
  graphs_on_off("bf16_ema", "bf16", false, true, 1);
  graphs_on_off("v2_bf16", "bf16", false, false, 2);  // Swin V2
  graphs_resume("bf16", false, 1);
  graphs_resume("bf16_ema", true, 1);
  graphs_resume("v2_bf16", false, 2);
  accum_equals_batch();
  accum_graphs_augment();
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_root);
  if (test_stats.failed == 0 && system(cmd) != 0) printf("note: could not remove %s\n", tmp_root);
  return test_finish();
}
#else
int main(void) {
  GPU_TEST_MAIN_BEGIN();
}
#endif
