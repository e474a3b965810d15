// test_gpu_recompute.c: activation checkpointing (train.recompute) on the CUDA backend, in fp32,
// bf16 and fp16. One training step (drop path, smoothed loss, backward) gives bitwise the same
// logits and gradients with recompute none, all and 1, in two geometries that take different
// attention kernels: Swin-T's 7x7 windows (49 tokens, on chip) and 12x12 windows (144 tokens, the
// flash kernels, whose saved state includes the dense bias); the activation arena shrinks by what
// it reports saved; 0xFF written over the shared set after the forward changes nothing (the
// backward rebuilds it). The trainer end to end in bf16 and fp32: 6 steps with recompute all and
// 1, their steps replayed as CUDA graphs (the recompute is more kernels in the captured step),
// end with the weights, moments and losses of recompute none launched kernel by kernel.
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>

#include "tests/util/test_gpu_util.h"
#include "tests/util/test_model_config.h"

#ifdef SWIN_HAVE_CUDA
#include "tests/util/test_graph_runs.h"
#include "tests/util/test_recompute.h"
#include "tests/util/test_train_util.h"

static char tmp_root[256];

// Swin-T's geometry at 112 pixels: 28x28 tokens in shifted 7x7 windows, 14x14, then one 7x7
// window; 32 channels per head.
static Config swin_like(void) {
  Config c = test_model_config((TestModel){.img_h = 112,
                                           .chans = 3,
                                           .patch = 4,
                                           .embed = 96,
                                           .window = 7,
                                           .classes = 100,
                                           .depths = {2, 2, 2},
                                           .heads = {3, 6, 12}});
  c.drop_path_rate = 0.3f;
  return c;
}

// Window 12 as the 384-pixel models: 24x24 tokens in four shifted 12x12 windows, then 12x12.
static Config window12(void) {
  Config c = test_model_config((TestModel){.img_h = 96,
                                           .chans = 3,
                                           .patch = 4,
                                           .embed = 64,
                                           .window = 12,
                                           .classes = 10,
                                           .depths = {2, 2},
                                           .heads = {2, 4}});
  c.drop_path_rate = 0.3f;
  return c;
}

static void step_case(const char *name, const Config *cfg, int B, const char *precision) {
  Backend be;
  Error err;
  if (backend_create(&be, "cuda", precision, &err) != 0) {
    test_check(0, "cuda backend (%s): %s", precision, err.msg);
    return;
  }
  RecomputeStep none = recompute_step(&be, *cfg, 0, B, 17, TAMPER_NONE);
  test_check(none.ok && none.dropped > 0, "%s %s: a step with drop path (%d scales dropped)", name,
             precision, none.dropped);
  const struct {
    int recompute;
    const char *what;
  } cases[] = {{-1, "all"}, {1, "1"}};
  for (int k = 0; k < 2; k++) {
    RecomputeStep r = recompute_step(&be, *cfg, cases[k].recompute, B, 17, TAMPER_NONE);
    test_check(recompute_same_bits(&none, &r),
               "%s %s recompute %s: logits and every gradient bitwise those of none", name,
               precision, cases[k].what);
    test_check(
        r.recomputed > 0 && r.saved_bytes > 0 && r.acts_bytes + r.saved_bytes == none.acts_bytes,
        "%s %s recompute %s: %d blocks; activations %.1f MiB + saved %.1f MiB = none's %.1f", name,
        precision, cases[k].what, r.recomputed, r.acts_bytes / 1048576.0, r.saved_bytes / 1048576.0,
        none.acts_bytes / 1048576.0);
    recompute_step_free(&r);
  }
  RecomputeStep poisoned = recompute_step(&be, *cfg, -1, B, 17, TAMPER_REBUILT);
  test_check(recompute_same_bits(&none, &poisoned),
             "%s %s recompute all, 0xFF over the shared set after the forward: the same bits", name,
             precision);
  RecomputeStep flipped = recompute_step(&be, *cfg, -1, B, 17, TAMPER_INPUT);
  test_check(flipped.ok && !recompute_same_bits(&none, &flipped),
             "%s %s negative control: a flipped bit in block 0's kept input changes the gradients",
             name, precision);
  recompute_step_free(&poisoned);
  recompute_step_free(&flipped);
  recompute_step_free(&none);
  backend_destroy(&be);
}

// The trainer on synthetic images: 8x8 tokens in shifted 4x4 windows, then one 4x4 window.
static Config run_config(const char *name, const char *precision, int recompute,
                         const char *graphs) {
  Config c = test_model_config((TestModel){.img_h = 32,
                                           .chans = 3,
                                           .patch = 4,
                                           .embed = 32,
                                           .window = 4,
                                           .classes = 10,
                                           .depths = {3, 2},
                                           .heads = {1, 2}});
  snprintf(c.run_dir, sizeof c.run_dir, "%s/%s_%s", tmp_root, name, precision);
  snprintf(c.device, sizeof c.device, "cuda");
  snprintf(c.precision, sizeof c.precision, "%s", precision);
  snprintf(c.cuda_graphs, sizeof c.cuda_graphs, "%s", graphs);
  snprintf(c.dataset, sizeof c.dataset, "synthetic");
  c.recompute = recompute;
  c.drop_path_rate = 0.2f;
  c.batch_size = 32;
  c.max_steps = 6;
  c.lr = 2e-3f;
  c.lr_scale_batch = 0;
  c.warmup_epochs = 0.2f;
  c.log_every = 1;
  c.eval_every = 1000;
  c.eval_batch_size = 64;
  c.train_limit = 128;
  c.val_limit = 64;
  c.workers = 2;
  c.ckpt_every = 6;
  return c;
}

static void trainer_case(const char *precision) {
  Config none = run_config("none", precision, 0, "off");
  Config all = run_config("all", precision, -1, "on");
  Config one = run_config("one", precision, 1, "on");
  long long replayed[3], steps[3];
  int rc = train_test_run_counting_replays(&none, &replayed[0], &steps[0]) |
           train_test_run_counting_replays(&all, &replayed[1], &steps[1]) |
           train_test_run_counting_replays(&one, &replayed[2], &steps[2]);
  test_check(rc == 0, "%s: 6 steps with recompute none (graphs off), all and 1 (graphs on)",
             precision);
  if (rc != 0) return;
  // Two staging slots: each slot's first step runs plainly, the rest are replays.
  test_check(replayed[1] == 4 && replayed[2] == 4 && steps[1] == 6 && replayed[0] == 0,
             "%s: recompute all and 1 replayed 4 of 6 steps as graphs (%lld, %lld of %lld)",
             precision, replayed[1], replayed[2], steps[1]);
  const char *want = train_test_ckpt(none.run_dir, 6);
  test_check(train_test_same_tensors(want, train_test_ckpt(all.run_dir, 6)) &&
                 train_test_same_tensors(want, train_test_ckpt(one.run_dir, 6)),
             "%s: weights and moments after 6 steps bitwise equal (none, all, 1)", precision);
  double ln[8] = {0}, la[8] = {0}, l1[8] = {0};
  int n = train_test_losses(none.run_dir, ln, 8);
  train_test_losses(all.run_dir, la, 8);
  train_test_losses(one.run_dir, l1, 8);
  bool same = n == 6;
  for (int s = 1; s <= 6; s++) same = same && ln[s] > 0 && ln[s] == la[s] && ln[s] == l1[s];
  test_check(same, "%s: the losses of steps 1..6 identical (step 6: %.6f %.6f %.6f)", precision,
             ln[6], la[6], l1[6]);
}

int main(void) {
  GPU_TEST_MAIN_BEGIN();
  Config swin = swin_like(), w12 = window12();
  Error err;
  if (config_validate(&swin, &err) != 0 || config_validate(&w12, &err) != 0) {
    test_check(0, "test configs: %s", err.msg);
    return test_finish();
  }
  const char *precisions[] = {"fp32", "bf16", "fp16"};
  for (int p = 0; p < 3; p++) {
    step_case("swin-like 112px", &swin, 4, precisions[p]);
    step_case("window 12", &w12, 2, precisions[p]);
  }
  snprintf(tmp_root, sizeof tmp_root, "/tmp/swin_test_gpu_recompute_XXXXXX");
  if (!mkdtemp(tmp_root)) return 1;
  trainer_case("bf16");
  trainer_case("fp32");
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
