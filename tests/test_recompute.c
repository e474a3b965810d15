// test_recompute.c: activation checkpointing (train.recompute) on the CPU backend. One training
// step of a small Swin with drop path (three stages of 3, 2 and 1 blocks, shifted windows) gives
// bitwise the same logits and gradients with recompute none, all, 1 and 2 (2 is clamped to the
// last stage's depth); the activation plan shrinks by what it reports saved, recomputed blocks
// have no saved rows of their own and share one set; the backward rebuilds that set (0xFF
// written over it after the forward changes nothing) from the kept input (one flipped bit of it
// changes the gradients). The trainer end to end: a few steps with recompute none, all and 1
// end with the same weights, moments and losses.
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <unistd.h>

#include "tests/util/test_model_config.h"
#include "tests/util/test_recompute.h"
#include "tests/util/test_train_util.h"
#include "tests/util/test_util.h"

static char tmp_root[256];

// Patch 2: maps 8x16 (4x4 windows, shift 2,2), 4x8 (shift 0,2), 2x4 (one 2x4 window).
static Config small_config(void) {
  Config c = test_model_config((TestModel){.img_h = 16,
                                           .img_w = 32,
                                           .chans = 3,
                                           .patch = 2,
                                           .embed = 8,
                                           .window = 4,
                                           .classes = 5,
                                           .depths = {3, 2, 1},
                                           .heads = {2, 2, 4}});
  c.mlp_ratio = 2.0f;
  c.drop_path_rate = 0.3f;
  snprintf(c.device, sizeof c.device, "cpu");
  return c;
}

static const Tensor *find_act(const Model *m, const char *name) {
  for (int i = 0; i < m->num_acts; i++)
    if (strcmp(m->act_table[i].name, name) == 0) return &m->act_table[i];
  return NULL;
}

// The plan of train.recompute=1: stage 0's block 0 keeps x alone and its views are the shared
// set's; block 1 keeps its own.
static void test_plan(Backend *be) {
  Config c = small_config();
  c.recompute = 1;
  Model m;
  Error err;
  if (model_create(&m, &c, be, 4, &err) != 0) {
    test_check(0, "model_create: %s", err.msg);
    return;
  }
  const BlockActs *b0 = &m.acts.blocks[0], *b1 = &m.acts.blocks[1], *r = &m.acts.rebuilt;
  test_check(m.num_recomputed == 3 && m.block_recompute[0] && !m.block_recompute[1] &&
                 m.block_recompute[3] && m.block_recompute[5],
             "train.recompute=1: the first block of each of the 3 stages (%d recomputed)",
             m.num_recomputed);
  test_check(find_act(&m, "layers.0.blocks.0.x") && !find_act(&m, "layers.0.blocks.0.qkv") &&
                 !find_act(&m, "layers.0.blocks.0.fc1") && find_act(&m, "layers.0.blocks.1.qkv") &&
                 find_act(&m, "recompute.qkv") && find_act(&m, "recompute.fc1"),
             "recomputed block 0 keeps only its x row; block 1 its own rows; the shared set has "
             "rows recompute.*");
  test_check(r->qkv && b0->qkv == r->qkv && b0->fc1 == r->fc1 && b0->x1 == r->x1 &&
                 b0->ln1_mean == r->ln1_mean && m.acts.blocks[3].qkv == r->qkv &&
                 b1->qkv != r->qkv && b0->x != b1->x,
             "recomputed blocks' views are the shared set's (stages 0 and 1 alike), x their own");
  // Sized for stage 0, the largest: (B, L, C) tokens for x1, (B, L, hidden) for fc1.
  const StageGeom *g = &m.stages[0];
  int64_t BL = 4LL * g->H * g->W;
  const Tensor *x1 = find_act(&m, "recompute.x1"), *fc1 = find_act(&m, "recompute.fc1");
  test_check(x1 && fc1 && tensor_numel(x1) == BL * g->C && tensor_numel(fc1) == BL * g->hidden,
             "the shared set is sized for stage 0: x1 %lld (want %lld), fc1 %lld (want %lld)",
             x1 ? (long long)tensor_numel(x1) : -1LL, (long long)(BL * g->C),
             fc1 ? (long long)tensor_numel(fc1) : -1LL, (long long)(BL * g->hidden));
  model_destroy(&m);
}

// One step with each setting against none: the same bits, less memory by what is reported.
static void test_same_bits(Backend *be) {
  Config c = small_config();
  enum { B = 4 };
  RecomputeStep none = recompute_step(be, c, 0, B, 99, TAMPER_NONE);
  test_check(none.ok && none.dropped > 0 && none.recomputed == 0,
             "recompute none: a step with drop path (%d of %d scales dropped)", none.dropped,
             2 * 6 * B);
  struct {
    int recompute, blocks;
    const char *name;
  } cases[] = {{-1, 6, "all"}, {1, 3, "1"}, {2, 5, "2 (the last stage's 1 block)"}};
  size_t prev_bytes = 0;
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    RecomputeStep r = recompute_step(be, c, cases[k].recompute, B, 99, TAMPER_NONE);
    test_check(recompute_same_bits(&none, &r),
               "recompute %s: logits and every gradient bitwise those of none", cases[k].name);
    test_check(r.recomputed == cases[k].blocks && r.saved_bytes > 0 &&
                   r.acts_bytes + r.saved_bytes == none.acts_bytes,
               "recompute %s: %d blocks recomputed (want %d); activations %zu + saved %zu = "
               "none's %zu",
               cases[k].name, r.recomputed, cases[k].blocks, r.acts_bytes, r.saved_bytes,
               none.acts_bytes);
    if (k > 0)
      test_check(k == 1 ? r.acts_bytes > prev_bytes : r.acts_bytes < prev_bytes,
                 "recompute %s keeps %s than the previous setting (%zu vs %zu bytes)",
                 cases[k].name, k == 1 ? "more" : "less", r.acts_bytes, prev_bytes);
    prev_bytes = r.acts_bytes;
    recompute_step_free(&r);
  }
  // What the backward reads: the shared set it rebuilds, from the kept input.
  RecomputeStep poisoned = recompute_step(be, c, -1, B, 99, TAMPER_REBUILT);
  test_check(recompute_same_bits(&none, &poisoned),
             "recompute all with 0xFF over the shared set after the forward: the same bits (the "
             "backward rebuilds it)");
  RecomputeStep flipped = recompute_step(be, c, -1, B, 99, TAMPER_INPUT);
  test_check(flipped.ok && !recompute_same_bits(&none, &flipped),
             "negative control: one flipped bit per element of block 0's kept input changes the "
             "gradients");
  recompute_step_free(&poisoned);
  recompute_step_free(&flipped);
  recompute_step_free(&none);
}

// The trainer: 5 steps on synthetic images with drop path, with recompute none, all and 1.
static Config run_config(const char *name, int recompute) {
  Config c = small_config();
  c.num_classes = 10;
  snprintf(c.run_dir, sizeof c.run_dir, "%s/%s", tmp_root, name);
  snprintf(c.dataset, sizeof c.dataset, "synthetic");
  c.recompute = recompute;
  c.batch_size = 8;
  c.max_steps = 5;
  c.lr = 2e-3f;
  c.lr_scale_batch = 0;
  c.warmup_epochs = 0;
  c.log_every = 1;
  c.eval_every = 1000;
  c.eval_batch_size = 16;
  c.train_limit = 32;
  c.val_limit = 16;
  c.workers = 2;
  c.ckpt_every = 5;
  return c;
}

static void test_trainer(void) {
  Config none = run_config("none", 0), all = run_config("all", -1), one = run_config("one", 1);
  test_check(train_test_run(&none) == 0 && train_test_run(&all) == 0 && train_test_run(&one) == 0,
             "trainer: 5 steps with train.recompute none, all and 1");
  const char *want = train_test_ckpt(none.run_dir, 5);
  test_check(train_test_same_tensors(want, train_test_ckpt(all.run_dir, 5)) &&
                 train_test_same_tensors(want, train_test_ckpt(one.run_dir, 5)),
             "trainer: weights and moments after 5 steps bitwise equal (none, all, 1)");
  double ln[8] = {0}, la[8] = {0}, l1[8] = {0};
  int n = train_test_losses(none.run_dir, ln, 8);
  train_test_losses(all.run_dir, la, 8);
  train_test_losses(one.run_dir, l1, 8);
  bool same = n == 5;
  for (int s = 1; s <= 5; s++) same = same && ln[s] > 0 && ln[s] == la[s] && ln[s] == l1[s];
  test_check(same,
             "trainer: the losses of steps 1..5 identical (%d logged; step 5: %.6f %.6f %.6f)", n,
             ln[5], la[5], l1[5]);
}

int main(void) {
  Backend be;
  Error err;
  if (backend_create(&be, "cpu", "fp32", &err) != 0) {
    test_check(0, "cpu backend: %s", err.msg);
    return test_finish();
  }
  Config c = small_config();
  if (config_validate(&c, &err) != 0) {
    test_check(0, "test config: %s", err.msg);
    return test_finish();
  }
  test_plan(&be);
  test_same_bits(&be);
  backend_destroy(&be);
  snprintf(tmp_root, sizeof tmp_root, "/tmp/swin_test_recompute_XXXXXX");
  if (!mkdtemp(tmp_root)) return 1;
  test_trainer();
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_root);
  if (test_stats.failed == 0 && system(cmd) != 0) printf("note: could not remove %s\n", tmp_root);
  return test_finish();
}
