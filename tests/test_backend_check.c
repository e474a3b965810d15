// test_backend_check.c: the checking layer at the backend's op boundary
// (src/model/backend_check.h), on the CPU backend.
//   1. Violations abort with a message that names the op, the argument and the tensor: an extent
//      past the end of an activation, a parameter gradient smaller than the op's shape, a dtype
//      mismatch, a pointer into the alignment gap of the flat weights, V2's post-norm branch and
//      merge gradient shorter than their shapes, an MLP's hidden NULL where the backend stores
//      GELU(pre), two registrations that overlap. Each runs in a child process; the same call
//      with the right arguments runs to its end there (the negative control: the check is what
//      aborts).
//   2. A tiny Swin (patch merging, shifted windows, drop path, qkv bias, layer decay, a moving
//      average of the weights; in V1 each stage's first block recomputed) trains two steps the
//      way the trainer queues them (normalize, mixup, forward, loss, backward, optimizer,
//      average) and evaluates the weights and the average (swapped in and back): every pointer
//      of an op that takes only model and optimizer memory lies in a registered region (the
//      registration is complete), the batch's pointers are exactly the unchecked ones, and the
//      checked table computes the same bits as the backend's
//      own. The ops of the other Swin version are not called at all: the test trains a V1
//      and a V2 model, and each op must run, checked, in at least one of them.
//   3. What the model and the optimizer register, they unregister when destroyed.
#define _POSIX_C_SOURCE 200809L

#include "kernels/attention.h"
#include "src/app/learner.h"
#include "src/model/backend_check.h"
#include "src/model/model.h"
#include "tests/util/test_child.h"
#include "tests/util/test_model_config.h"
#include "tests/util/test_util.h"

enum { BATCH = 4 };

static Config tiny_config(void) {
  // Patch 2: maps 8x16 (4x4 windows, shift 2,2) and 4x8 (4x4 windows, shift 0,2).
  Config c = test_model_config((TestModel){.img_h = 16,
                                           .img_w = 32,
                                           .chans = 3,
                                           .patch = 2,
                                           .embed = 8,
                                           .window = 4,
                                           .classes = 5,
                                           .depths = {2, 2},
                                           .heads = {2, 4}});
  c.mlp_ratio = 2.0f;
  c.qkv_bias = true;
  c.drop_path_rate = 0.3f;
  c.layer_decay = 0.8f;
  c.ema_decay = 0.9;
  c.ema_warmup = true;
  return c;
}

// A model with its optimizer and a batch in backend memory that nobody registers (as the
// trainer's staging is not): uint8 pixels, the normalized images, labels, eval sums.
typedef struct {
  Model m;
  Optimizer o;
  uint8_t *pixels;
  float *images;
  int *labels;
  EvalSums *sums;
} Run;

static int64_t batch_values(const Config *c) {
  return (int64_t)BATCH * c->img_h * c->img_w * c->in_chans;
}

static int run_create(Run *r, Backend *be, const Config *c, Error *err) {
  if (model_create(&r->m, c, be, BATCH, err) != 0) return -1;
  model_init_weights(&r->m, 5);
  model_weights_to_backend(&r->m);
  optimizer_create(&r->o, &r->m, c);
  optimizer_ema_from_weights(&r->o, &r->m);
  OptimState state = {.loss_scale = 1.0f};
  be->ops->upload(be, r->o.state, &state, sizeof state);
  int64_t n = batch_values(c);
  r->pixels = be->ops->alloc(be, (size_t)n);
  r->images = be->ops->alloc(be, sizeof(float) * (size_t)n);
  r->labels = be->ops->alloc(be, sizeof(int) * BATCH);
  r->sums = be->ops->alloc(be, sizeof(EvalSums));
  uint8_t *pixels = malloc((size_t)n);
  TestRng rng = {11};
  for (int64_t i = 0; i < n; i++) pixels[i] = (uint8_t)(test_rng_u64(&rng) >> 56);
  int labels[BATCH] = {0, 3, 1, 4};
  be->ops->upload(be, r->pixels, pixels, (size_t)n);
  be->ops->upload(be, r->labels, labels, sizeof labels);
  free(pixels);
  return 0;
}

static void run_destroy(Run *r, Backend *be) {
  be->ops->release(be, r->pixels);
  be->ops->release(be, r->images);
  be->ops->release(be, r->labels);
  be->ops->release(be, r->sums);
  optimizer_destroy(&r->o, be);
  model_destroy(&r->m);
}

// Two training steps as the trainer queues them, an evaluation of the weights and one of the
// average (swapped into the weights' place and back), and the compute-copy refresh (whole-buffer
// arguments; a copy onto itself in f32).
static void run_steps(Run *r, Backend *be, const Config *c) {
  Normalize norm = model_input_normalize(c);
  BatchAugment mixup = {.mix = {.mode = MIX_MIXUP, .lam = 0.7}};
  for (int step = 0; step < 2; step++) {
    be->ops->images_normalize(be, r->images, r->pixels, norm, BATCH, c->img_h, c->img_w,
                              c->in_chans);
    be->ops->batch_augment(be, r->images, &mixup, NULL, BATCH, c->img_h, c->img_w, c->in_chans);
    learner_set_step(&r->m, &r->o, step, 1e-3f, 0);
    StepBatch batch = {.images = r->images, .images_dtype = DTYPE_F32, .labels = r->labels};
    learner_run(&r->m, &r->o, c, norm, &batch, BATCH, STEP_WHOLE);
  }
  model_forward(&r->m, r->pixels, DTYPE_U8, norm, BATCH, false, c->seed, NULL);
  be->ops->eval_metrics(be, r->sums, r->m.acts.logits, r->labels, BATCH, c->num_classes);
  optimizer_swap_ema(&r->o, &r->m);
  model_forward(&r->m, r->pixels, DTYPE_U8, norm, BATCH, false, c->seed, NULL);
  be->ops->eval_metrics(be, r->sums, r->m.acts.logits, r->labels, BATCH, c->num_classes);
  optimizer_swap_ema(&r->o, &r->m);
  be->ops->to_compute(be, r->m.compute, r->m.master, r->m.num_floats);
}

// ---- violations, each in a child ---------------------------------------------------------------

// Stage 0, block 1's attention (a shifted block), as block_forward calls it, with qkv and mask
// as given.
static void attention_call(Model *m, const void *qkv, const float *mask) {
  const StageGeom *g = &m->stages[0];
  BlockActs *a = &m->acts.blocks[1];
  m->be->ops->attention_forward(m->be, a->attn_out, a->att, qkv, m->w.blocks[1].rel_table,
                                g->index_be, mask, BATCH * g->nW, g->nW, g->N, g->C, g->heads,
                                attention_head_dim_scale(g->head_dim));
}

static void attention_right(void *arg) {
  Model *m = arg;
  attention_call(m, m->acts.blocks[1].qkv, m->stages[0].mask_be);
}

// qkv of stage 1 (half the tokens, twice the width: half the elements) for stage 0's shapes.
static void attention_short_qkv(void *arg) {
  Model *m = arg;
  attention_call(m, m->acts.blocks[m->stages[1].first_block].qkv, m->stages[0].mask_be);
}

// The relative-position index (i32) where the f32 mask belongs.
static void attention_index_as_mask(void *arg) {
  Model *m = arg;
  attention_call(m, m->acts.blocks[1].qkv, (const float *)m->stages[0].index_be);
}

// The qkv layer's weight gradient (3C, C) is asked for, but proj's (C, C) is passed.
static void linear_backward_small_dweight(void *arg) {
  Model *m = arg;
  const StageGeom *g = &m->stages[0];
  int64_t rows = (int64_t)BATCH * g->H * g->W;
  m->be->ops->linear_backward(m->be, NULL, m->g.blocks[0].proj_w, NULL, m->acts.dqkv, m->acts.xw,
                              model_compute_weight(m, m->w.blocks[0].qkv_w), rows, g->C, 3 * g->C);
}

// The patch embedding with a bias pointer just past patch_embed.proj.bias: inside the flat
// weights, in the alignment gap before the next tensor.
static void linear_forward_bias_in_gap(void *arg) {
  Model *m = arg;
  const Config *c = &m->cfg;
  int64_t rows = (int64_t)BATCH * m->Hp * m->Wp;
  m->be->ops->linear_forward(m->be, m->acts.pe, m->acts.patches,
                             model_compute_weight(m, m->w.patch_w), m->w.patch_b + c->embed_dim,
                             rows, m->patch_dim, c->embed_dim, ACTIVATION_NONE, NULL);
}

// Stage 0, block 0's fc2 backward as block_backward calls it, but with hidden NULL: the CPU
// stores GELU(pre) there (its mlp_hidden_elements is N * H), so the model must give it room.
static void gelu_linear_backward_hidden_null(void *arg) {
  Model *m = arg;
  const StageGeom *g = &m->stages[0];
  int64_t rows = (int64_t)BATCH * g->H * g->W;
  m->be->ops->gelu_linear_backward(
      m->be, m->acts.dhidden, NULL, m->g.blocks[0].fc2_w, m->g.blocks[0].fc1_b, m->acts.dbranch,
      m->acts.blocks[0].fc1, model_compute_weight(m, m->w.blocks[0].fc2_w), rows, g->hidden, g->C);
}

// A tensor registered over the second half of the patches and beyond.
static void register_overlap(void *arg) {
  Model *m = arg;
  Tensor t = m->act_table[0];
  snprintf(t.name, sizeof t.name, "test.overlap");
  t.data = (char *)t.data + tensor_bytes(&t) / 2;
  backend_check_register(m->be, &t);
}

// Stage 0's residual-post-norm as a V2 block would call it, with a branch of stage 1 (half the
// elements: a quarter of the tokens, twice the width).
static void postnorm_short_branch(void *arg) {
  Model *m = arg;
  const StageGeom *g = &m->stages[0];
  m->be->ops->postnorm_residual_forward(m->be, m->acts.blocks[0].x1, NULL, NULL, NULL,
                                        m->acts.blocks[0].x,
                                        m->acts.blocks[m->stages[1].first_block].x, NULL, NULL,
                                        NULL, NULL, NULL, BATCH, (int64_t)g->H * g->W, g->C);
}

// Stage 0's merge backward with stage 1's block input as dmerged (half the merged elements).
static void patch_merge_short_dmerged(void *arg) {
  Model *m = arg;
  const StageGeom *g = &m->stages[0];
  m->be->ops->patch_merge_backward(m->be, m->acts.dres, m->acts.blocks[m->stages[1].first_block].x,
                                   BATCH, g->H, g->W, g->C);
}

static void test_violations(Model *m) {
  char msg[4096];
  int how = test_run_child(attention_right, m, msg, sizeof msg);
  test_check(how == 0 && msg[0] == 0,
             "negative control: the right attention_forward runs to its end (%d, stderr '%s')", how,
             msg);
  test_expect_abort("qkv shorter than the op's shape", attention_short_qkv, m,
                    (const char *const[]){"attention_forward: qkv needs 12288 F32 elements",
                                          "layers.1.blocks.0.qkv (8, 16, 48) F32", "6144 too few",
                                          "HINT:", NULL});
  test_expect_abort("an i32 tensor for an f32 argument", attention_index_as_mask, m,
                    (const char *const[]){"attention_forward: mask needs 2048 F32 elements",
                                          "layers.0.attn.relative_position_index (16, 16) I32",
                                          "which is I32, not F32", NULL});
  test_expect_abort("a gradient smaller than the shape", linear_backward_small_dweight, m,
                    (const char *const[]){"linear_backward: dweight needs 192 F32 elements",
                                          "layers.0.blocks.0.attn.proj.weight.grad (8, 8) F32",
                                          "(in grads (", "128 too few", NULL});
  test_expect_abort(
      "a pointer between tensors", linear_forward_bias_in_gap, m,
      (const char *const[]){"linear_forward: bias needs 8 F32 elements", "of weights (",
                            "outside every tensor of that buffer", NULL});
  test_expect_abort(
      "a V2 post-norm branch shorter than the shape", postnorm_short_branch, m,
      (const char *const[]){"postnorm_residual_forward: branch needs 4096 F32 elements",
                            "layers.1.blocks.0.x", "2048 too few", NULL});
  test_expect_abort("a merge gradient shorter than the shape", patch_merge_short_dmerged, m,
                    (const char *const[]){"patch_merge_backward: dmerged needs 4096 F32 elements",
                                          "layers.1.blocks.0.x", "2048 too few", NULL});
  test_expect_abort("no room for GELU(pre) where the backend stores it",
                    gelu_linear_backward_hidden_null, m,
                    (const char *const[]){"gelu_linear_backward: hidden needs 8192 F32 elements",
                                          "but is NULL", "HINT:", NULL});
  test_expect_abort("overlapping registrations", register_overlap, m,
                    (const char *const[]){"tensor test.overlap (", "overlaps patches (", NULL});
}

// ---- a training step, checked ----------------------------------------------------------------

// The unregistered pointers an op gets per call from the batch, and whether they are all it
// gets (then nothing of it is checked).
typedef struct {
  int per_call;
  bool only;
} BatchPointers;

static BatchPointers batch_pointers(const char *op) {
  static const struct {
    const char *op;
    BatchPointers p;
  } batch[] = {{"images_normalize", {2, true}},  // images, pixels
               {"batch_augment", {1, true}},     // images
               {"patch_embed_input", {1, false}},
               {"train_loss", {1, false}},     // labels
               {"eval_metrics", {2, false}}};  // sums, labels
  for (size_t i = 0; i < sizeof batch / sizeof batch[0]; i++)
    if (strcmp(batch[i].op, op) == 0) return batch[i].p;
  return (BatchPointers){0, false};
}

// The ops only one Swin version calls: V1's merge with its LayerNorm first, its proj + LN2, its
// MLP + residual and the input gradients with the LayerNorm backward after them; V2's
// res-post-norm, plain merge, cosine q / k and position-bias MLP. A model of the other version must
// not call them (their wrappers' checks are exercised by the violations above and by the other
// model).
static int op_version(const char *op) {
  static const char *const v1[] = {
      "merge_layernorm_forward", "merge_layernorm_backward", "linear_residual_layernorm_forward",
      "mlp_residual_layernorm_forward", "linear_residual_layernorm_backward"};
  static const char *const v2[] = {"postnorm_residual_forward",
                                   "postnorm_residual_backward",
                                   "patch_merge_forward",
                                   "patch_merge_backward",
                                   "cosine_qk_forward",
                                   "cosine_qk_backward",
                                   "cpb_forward",
                                   "cpb_backward"};
  for (size_t i = 0; i < sizeof v1 / sizeof v1[0]; i++)
    if (strcmp(v1[i], op) == 0) return 1;
  for (size_t i = 0; i < sizeof v2 / sizeof v2[0]; i++)
    if (strcmp(v2[i], op) == 0) return 2;
  return 0;
}

// ran[i]: how many of the models ran op i with its checks as expected.
static void test_training_checked(Backend *be, const Config *c, int *ran) {
  Error err;
  Run a, b;
  if (run_create(&a, be, c, &err) != 0 || run_create(&b, be, c, &err) != 0) {
    test_check(0, "setup: %s", err.msg);
    return;
  }
  backend_check_reset_counts(be);
  run_steps(&a, be, c);
  for (int i = 0; i < backend_check_op_count(); i++) {
    const char *op = backend_check_op_name(i);
    BackendCheckCounts n;
    backend_check_counts(be, op, &n);
    BatchPointers batch = batch_pointers(op);
    int64_t want_unchecked = batch.per_call * n.calls;
    int only = op_version(op);
    if (only && only != c->version) {
      test_check(n.calls == 0, "%-28s %3lld calls (a V%d op: this V%d model calls none)", op,
                 (long long)n.calls, only, c->version);
      continue;
    }
    bool ok = n.calls > 0 && (n.checked > 0) != batch.only && n.unchecked == want_unchecked;
    ran[i] += ok;
    test_check(ok, "V%d: %-28s %3lld calls, %4lld pointers checked, %3lld unchecked (want %lld%s)",
               c->version, op, (long long)n.calls, (long long)n.checked, (long long)n.unchecked,
               (long long)want_unchecked,
               batch.only       ? ": the batch's, all it takes"
               : want_unchecked ? ": the batch's"
                                : "");
  }
  BackendCheckCounts none;
  test_check(backend_check_counts(be, "no_such_op", &none) == -1, "an unknown op name is refused");

  // The same run through the backend's own table: the same bits everywhere.
  const BackendOps *checked = be->ops;
  be->ops = backend_check_inner(be);
  run_steps(&b, be, c);
  be->ops = checked;
  size_t weights = sizeof(float) * (size_t)a.m.num_floats;
  test_check(memcmp(a.m.weights, b.m.weights, weights) == 0 &&
                 memcmp(a.o.exp_avg, b.o.exp_avg, weights) == 0 &&
                 memcmp(a.o.exp_avg_sq, b.o.exp_avg_sq, weights) == 0 &&
                 memcmp(a.o.ema, b.o.ema, weights) == 0,
             "weights, AdamW moments and the average after two steps: bitwise those of the "
             "unchecked table");
  test_check(memcmp(a.o.state, b.o.state, sizeof(OptimState)) == 0 &&
                 memcmp(a.sums, b.sums, sizeof(EvalSums)) == 0 &&
                 memcmp(a.m.acts.logits, b.m.acts.logits,
                        sizeof(float) * BATCH * (size_t)c->num_classes) == 0,
             "optimizer state, eval sums and logits: bitwise the same (loss sum %.6f, %lld top-1)",
             a.o.state->loss_sum, (long long)a.sums->top1);
  run_destroy(&b, be);
  run_destroy(&a, be);
}

int main(void) {
  Config c = tiny_config();
  Error err;
  Backend be;
  if (config_validate(&c, &err) != 0 || backend_create(&be, "cpu", "fp32", &err) != 0) {
    test_check(0, "setup: %s", err.msg);
    return test_finish();
  }
  test_check(backend_check_inner(&be) != be.ops, "backend_create installs the checking layer");
  test_check(backend_check_region_count(&be) == 0, "no regions before a model");

  // The violations first, before this process has started OpenMP's threads (a forked child
  // could not use them).
  Run r;
  if (run_create(&r, &be, &c, &err) != 0) {
    test_check(0, "setup: %s", err.msg);
    return test_finish();
  }
  int regions = backend_check_region_count(&be);
  test_check(regions > r.m.num_acts + 2 * r.m.num_params,
             "the model and optimizer registered %d regions (%d activations, 2 x %d parameters, "
             "flat buffers, geometry, optimizer)",
             regions, r.m.num_acts, r.m.num_params);
  test_violations(&r.m);
  run_destroy(&r, &be);
  test_check(backend_check_region_count(&be) == 0,
             "model_destroy and optimizer_destroy unregister everything (%d left)",
             backend_check_region_count(&be));

  // A V1 and a V2 model: every checked op runs, checked, in one of them, and only the batch's
  // pointers go unchecked.
  int ran[64] = {0}, complete = 0;
  // The V1 model rebuilds each stage's first block in the backward (train.recompute 1): the only
  // V1 caller of mlp_forward, its forward running each MLP with the residual after it.
  Config v1 = c;
  v1.recompute = 1;
  if (config_validate(&v1, &err) != 0) test_check(0, "V1 config: %s", err.msg);
  test_training_checked(&be, &v1, ran);
  Config v2 = c;
  v2.version = 2;
  if (config_validate(&v2, &err) != 0) test_check(0, "V2 config: %s", err.msg);
  test_training_checked(&be, &v2, ran);
  for (int i = 0; i < backend_check_op_count(); i++) complete += ran[i] > 0;
  test_check(complete == backend_check_op_count(),
             "every checked op ran in the V1 or the V2 model (%d of %d ops)", complete,
             backend_check_op_count());
  test_check(backend_check_region_count(&be) == 0, "no regions left after the training runs");
  backend_destroy(&be);
  return test_finish();
}
