// test_step_graph.c: the bookkeeping of src/app/step_graph.c, on the CPU, with a stand-in for a
// backend that captures: the CPU backend's table with graph ops that count their calls (the CPU
// runs a "captured" step at once; on CUDA it would be recorded). Checks how train.cuda_graphs
// resolves (auto / on / off, the CPU, under a launcher), that each batch buffer runs plainly once,
// is captured at its second step and replayed after, that another batch size, buffer or variant
// is another graph, that a paused step runs plainly, that a failed capture warns, frees every
// graph, runs the step plainly and leaves graphs off, and that under a launcher it is an error
// instead; that with gradient accumulation the step's parts are two graphs, only the last part
// updates and reports to the gradient reducer. The GPU side (replays bitwise equal to plain
// launches, with NCCL inside under mpirun) is tests/test_gpu_train.c's and tests/test_gpu_dist.c's.
#include <stdint.h>

#include "src/app/learner.h"
#include "src/app/step_graph.h"
#include "src/base/config.h"
#include "src/model/backend.h"
#include "src/model/model.h"
#include "tests/util/test_model_config.h"
#include "tests/util/test_util.h"

// What the stand-in graph ops saw.
static struct {
  int begins, ends, launches, destroys, live;
  int fail_at_end;  // the graph_end call (1-based) that fails; 0: none
  bool capturing;
  int updates, updates_capturing;  // optimizer_step calls, and those made while "capturing"
} seen;

static BackendOps cpu_table;  // the CPU backend's own ops

static int stand_in_begin(Backend *be, Error *err) {
  (void)be;
  (void)err;
  seen.begins++;
  seen.capturing = true;
  return 0;
}
static void *stand_in_end(Backend *be, int64_t *nodes, Error *err) {
  (void)be;
  seen.capturing = false;
  if (++seen.ends == seen.fail_at_end) {
    error_set(err, "the stand-in's instantiation failed");
    return NULL;
  }
  if (nodes) *nodes = 7;
  seen.live++;
  return (void *)(intptr_t)seen.ends;
}
static void stand_in_launch(Backend *be, void *graph) {
  (void)be;
  (void)graph;
  seen.launches++;
}
static void stand_in_destroy(Backend *be, void *graph) {
  (void)be;
  (void)graph;
  seen.destroys++;
  seen.live--;
}
static void counting_update(Backend *be, float *params, void *compute, const float *grads, float *m,
                            float *v, int64_t n, const AdamWChunk *chunks, int num_chunks,
                            OptimizerStep hyper, const StepParams *step, OptimState *state) {
  seen.updates++;
  seen.updates_capturing += seen.capturing;
  cpu_table.optimizer_step(be, params, compute, grads, m, v, n, chunks, num_chunks, hyper, step,
                           state);
}

static Config tiny_config(void) {
  Config c = test_model_config((TestModel){.img_h = 8,
                                           .chans = 3,
                                           .patch = 2,
                                           .embed = 8,
                                           .window = 2,
                                           .classes = 3,
                                           .depths = {2},
                                           .heads = {2}});
  c.drop_path_rate = 0.1f;
  return c;
}

static void check_resolve(Backend *cpu, Backend *capturing) {
  StepGraphs g;
  Error err;
  test_check(step_graphs_init(&g, capturing, "auto", false, 1, &err) == 0 && g.on,
             "auto on a backend that captures, one process: on");
  test_check(step_graphs_init(&g, capturing, "on", false, 1, &err) == 0 && g.on,
             "on on a backend that captures, one process: on");
  test_check(step_graphs_init(&g, capturing, "off", false, 1, &err) == 0 && !g.on &&
                 strcmp(g.why_off, "train.cuda_graphs=off") == 0,
             "off: off, and the log says train.cuda_graphs=off");
  test_check(step_graphs_init(&g, cpu, "auto", false, 1, &err) == 0 && !g.on &&
                 strstr(g.why_off, "CPU backend"),
             "auto on the CPU: off (the CPU backend)");
  int rc = step_graphs_init(&g, cpu, "on", false, 1, &err);
  test_check(rc != 0 && strstr(err.msg, "train.cuda_graphs=on") && strstr(err.msg, "CPU backend") &&
                 strstr(err.msg, "HINT: set train.cuda_graphs=auto"),
             "on on the CPU: refused with the key, the reason and a HINT (%s)",
             rc ? err.msg : "accepted");
  test_check(step_graphs_init(&g, capturing, "auto", true, 1, &err) == 0 && g.on && g.launched,
             "auto under a launcher: on (the data-parallel step is captured with its all-reduce)");
  test_check(step_graphs_init(&g, capturing, "on", true, 1, &err) == 0 && g.on,
             "on under a launcher: on");
  test_check(step_graphs_init(&g, cpu, "auto", true, 1, &err) == 0 && !g.on,
             "auto under a launcher on the CPU: off");
  step_graphs_init(&g, capturing, "auto", false, 1, &err);
  step_graphs_auto_off(&g, "auto", "the loader's reason");
  test_check(!g.on && strcmp(g.why_off, "the loader's reason") == 0,
             "auto turned off for a reason: off, and the log gives the reason");
  step_graphs_init(&g, capturing, "on", false, 1, &err);
  step_graphs_auto_off(&g, "on", "the loader's reason");
  test_check(g.on, "on is not turned off by a reason that applies to auto");
}

typedef struct {
  Model *m;
  Optimizer *o;
  const Config *cfg;
  StepBatch batch[2];  // two staging slots
  const float *soft;   // soft targets (B, classes), for a batch that has them
} Run;

static int step_part(StepGraphs *g, Run *r, int slot, int B, StepPart part) {
  learner_set_step(r->m, r->o, 0, 1e-3f, 0);
  Error err;
  int rc = step_graphs_step(g, r->m, r->o, r->cfg, (Normalize){{0}, {0}}, &r->batch[slot], B, part,
                            &err);
  if (rc != 0) printf("     (step_graphs_step: %s)\n", err.msg);
  return rc;
}

static int step(StepGraphs *g, Run *r, int slot, int B) {
  return step_part(g, r, slot, B, STEP_WHOLE);
}

static void check_steps(Run *r, Backend *be, Backend *capturing) {
  const int B = 4;
  StepGraphs g;
  Error err;
  memset(&seen, 0, sizeof seen);
  step_graphs_init(&g, capturing, "auto", false, 1, &err);
  char line[256];
  step_graphs_describe(&g, line, sizeof line);
  test_check(strstr(line, "on (") == line, "before any step: '%s'", line);
  for (int k = 0; k < 6; k++) step(&g, r, k % 2, B);
  test_check(seen.begins == 2 && seen.ends == 2 && seen.launches == 4 && g.captured == 2 &&
                 g.replayed == 4 && g.plain == 2,
             "slots 0,1,0,1,0,1: each runs plainly once, is captured at its second step and "
             "replayed from then on (captures %d, launches %d, plain %lld)",
             seen.begins, seen.launches, (long long)g.plain);
  test_check(seen.updates == 4 && seen.updates_capturing == 2,
             "the step was queued 4 times: 2 plain, 2 into captures (%d, %d)", seen.updates,
             seen.updates_capturing);
  step_graphs_describe(&g, line, sizeof line);
  test_check(strcmp(line, "on (2 graphs of 7 nodes; 4 of 6 steps replayed)") == 0, "the log: '%s'",
             line);
  // Another batch size on slot 0 is another graph: plain first, captured second.
  step(&g, r, 0, B / 2);
  step(&g, r, 0, B / 2);
  test_check(seen.begins == 3 && seen.launches == 5 && g.plain == 3,
             "batch %d on slot 0: its own graph, captured at its second step (captures %d)", B / 2,
             seen.begins);
  // Soft targets make a batch another key too.
  r->batch[1].soft_targets = r->soft;
  step(&g, r, 1, B);
  test_check(g.plain == 4 && seen.launches == 5, "slot 1 with soft targets: a new key, plain");
  r->batch[1].soft_targets = NULL;
  g.paused = true;
  step(&g, r, 0, B);
  g.paused = false;
  test_check(g.plain == 5 && seen.launches == 5, "paused: the step runs plainly");
  step(&g, r, 0, B);
  test_check(seen.launches == 6, "unpaused: slot 0 replays its graph again");
  step_graphs_destroy(&g, be);
  test_check(seen.destroys == 3 && seen.live == 0, "destroy frees the 3 graphs (%d freed)",
             seen.destroys);

  // Another variant (the benchmark's step without its all-reduce) is another graph.
  memset(&seen, 0, sizeof seen);
  step_graphs_init(&g, capturing, "auto", false, 1, &err);
  step(&g, r, 0, B);
  step(&g, r, 0, B);
  g.variant = 1;
  step(&g, r, 0, B);
  step(&g, r, 0, B);
  test_check(seen.begins == 2 && seen.launches == 2 && g.plain == 2,
             "variant 1 on slot 0: its own graph, plain first, captured second (captures %d, "
             "plain %lld)",
             seen.begins, (long long)g.plain);
  g.variant = 0;
  step(&g, r, 0, B);
  test_check(seen.begins == 2 && seen.launches == 3, "variant 0 replays its own graph again");
  step_graphs_destroy(&g, be);

  // A capture that fails after one graph was made: a warning, every graph freed, the step run
  // plainly (on CUDA nothing of the failed capture has run), graphs off from then on.
  memset(&seen, 0, sizeof seen);
  seen.fail_at_end = 2;
  step_graphs_init(&g, capturing, "on", false, 1, &err);
  printf("     (a warning about a failed capture follows: it is expected)\n");
  for (int k = 0; k < 4; k++) step(&g, r, k % 2, B);
  test_check(!g.on && seen.begins == 2 && seen.destroys == 1 && seen.live == 0,
             "failed capture: graphs off, the graph made before it freed (%d freed)",
             seen.destroys);
  test_check(g.plain == 3 && seen.updates == 5 && seen.launches == 1,
             "failed capture: the failing step ran plainly after it (plain %lld, updates %d, "
             "launches %d)",
             (long long)g.plain, seen.updates, seen.launches);
  step(&g, r, 0, B);
  test_check(seen.begins == 2 && seen.launches == 1 && g.plain == 4,
             "after a failed capture every step runs plainly");
  step_graphs_describe(&g, line, sizeof line);
  test_check(strstr(line, "off") == line, "the log: '%s'", line);
  step_graphs_destroy(&g, be);

  // Under a launcher a failed capture is an error: no fallback that would leave this rank's
  // NCCL calls out of step with the other ranks' graphs.
  memset(&seen, 0, sizeof seen);
  seen.fail_at_end = 1;
  step_graphs_init(&g, capturing, "auto", true, 1, &err);
  int rc0 = step(&g, r, 0, B), rc1 = step(&g, r, 0, B);
  test_check(rc0 == 0 && rc1 != 0 && !g.on && seen.live == 0 && seen.updates == 2,
             "launcher, failed capture: an error, graphs off, the step not run plainly after it "
             "(updates %d)",
             seen.updates);
  test_check(step(&g, r, 0, B) == 0 && seen.updates == 3,
             "after the error the step runs plainly (a caller that went on)");
  Error why;
  seen.fail_at_end = 2;
  step_graphs_init(&g, capturing, "auto", true, 1, &why);
  step(&g, r, 1, B);
  learner_set_step(r->m, r->o, 0, 1e-3f, 0);
  int rc = step_graphs_step(&g, r->m, r->o, r->cfg, (Normalize){{0}, {0}}, &r->batch[1], B,
                            STEP_WHOLE, &why);
  test_check(
      rc != 0 && strstr(why.msg, "data-parallel") && strstr(why.msg, "HINT: train.cuda_graphs=off"),
      "the error names the data-parallel step and the key (%s)", rc ? why.msg : "none");
  step_graphs_destroy(&g, be);
}

// The gradient reducer's view of a backward (Model.grads_ready): how many reports it received.
static int reports;
static void count_report(void *ctx, int64_t lowest_offset) {
  (void)ctx;
  (void)lowest_offset;
  reports++;
}

// Gradient accumulation (train.accum_steps 3): a step is two STEP_ACCUMULATE parts and a
// STEP_FINISH part on the same micro-batch buffers, so two keys and two graphs whatever the
// number of micro-batches; only the finishing part updates, and only its backward reports to
// the gradient reducer (so under a launcher only the last micro-batch all-reduces).
static void check_accumulation(Run *r, Backend *be, Backend *capturing) {
  const int B = 4, accum = 3;
  StepGraphs g;
  Error err;
  memset(&seen, 0, sizeof seen);
  step_graphs_init(&g, capturing, "auto", false, accum, &err);
  r->m->grads_ready = count_report;
  int accumulate_reports = 0, finish_reports = 0, finish_runs = 0;
  for (int s = 0; s < 3; s++) {
    model_zero_grads(r->m);
    for (int k = 0; k < accum; k++) {
      // The stand-in runs a part's ops when it runs plainly or is captured, not when replayed.
      StepPart part = learner_part(k, accum);
      reports = 0;
      step_part(&g, r, 0, B, part);
      if (part == STEP_ACCUMULATE) accumulate_reports += reports;
      if (part == STEP_FINISH && reports > 0) finish_reports += reports, finish_runs++;
    }
  }
  r->m->grads_ready = NULL;
  int per_backward = r->m->num_blocks + (r->m->num_stages - 1) + 1;
  test_check(learner_part(0, 1) == STEP_WHOLE && learner_part(0, 3) == STEP_ACCUMULATE &&
                 learner_part(1, 3) == STEP_ACCUMULATE && learner_part(2, 3) == STEP_FINISH,
             "learner_part: accum 1 is the whole step; of 3, two accumulate and the last finishes");
  test_check(accumulate_reports == 0 && finish_runs == 2 && finish_reports == 2 * per_backward,
             "accumulating parts report nothing to the reducer (%d reports); the finishing part "
             "reports every bucket each time it runs (%d in %d runs, %d each)",
             accumulate_reports, finish_reports, finish_runs, per_backward);
  test_check(seen.begins == 2 && g.captured == 2 && g.plain == 2 && g.replayed == 7,
             "3 steps of 3 micro-batches: 2 graphs (accumulate, finish), each plain once, then "
             "replayed: %d of 9 parts (captures %d)",
             (int)g.replayed, seen.begins);
  test_check(seen.updates == 2 && seen.updates_capturing == 1,
             "only the finishing part updates: 2 updates queued (plain, into its capture), none "
             "from the accumulating parts (%d, %d)",
             seen.updates, seen.updates_capturing);
  char line[256];
  step_graphs_describe(&g, line, sizeof line);
  test_check(strcmp(line, "on (2 graphs of 7 nodes; 7 of 9 micro-batches replayed)") == 0,
             "the log counts micro-batches: '%s'", line);
  step_graphs_destroy(&g, be);
}

int main(void) {
  Config c = tiny_config();
  Error err;
  Backend be;
  Model m;
  const int B = 4;
  if (config_validate(&c, &err) != 0 || backend_create(&be, "cpu", "fp32", &err) != 0 ||
      model_create(&m, &c, &be, B, &err) != 0) {
    test_check(0, "setup: %s", err.msg);
    return test_finish();
  }
  model_init_weights(&m, 1);
  Optimizer o;
  optimizer_create(&o, &m, &c);
  OptimState state = {.loss_scale = 1.0f};
  be.ops->upload(&be, o.state, &state, sizeof state);

  // The stand-in: the CPU's table with counting graph ops and update, on a backend that says
  // CUDA (only step_graphs_init reads that).
  cpu_table = *be.ops;
  BackendOps stand_in = cpu_table;
  stand_in.graph_begin = stand_in_begin;
  stand_in.graph_end = stand_in_end;
  stand_in.graph_launch = stand_in_launch;
  stand_in.graph_destroy = stand_in_destroy;
  stand_in.optimizer_step = counting_update;
  Backend capturing = be;
  capturing.ops = &stand_in;
  capturing.device = DEVICE_CUDA;
  check_resolve(&be, &capturing);

  be.ops = &stand_in;  // the model's backend: its steps go through the stand-in's ops
  int64_t per_image = (int64_t)c.img_h * c.img_w * c.in_chans;
  float *images = calloc_check((size_t)(2 * B * per_image), sizeof(float));
  int *labels = calloc_check(2 * B, sizeof(int));
  float *soft = calloc_check((size_t)(B * c.num_classes), sizeof(float));
  for (int b = 0; b < B; b++) soft[b * c.num_classes] = 1.0f;
  Run r = {.m = &m, .o = &o, .cfg = &c, .soft = soft};
  for (int s = 0; s < 2; s++)
    r.batch[s] = (StepBatch){
        .images = images + s * B * per_image, .images_dtype = DTYPE_F32, .labels = labels + s * B};
  check_steps(&r, &be, &capturing);
  check_accumulation(&r, &be, &capturing);
  be.ops = &cpu_table;
  free(images);
  free(labels);
  free(soft);
  optimizer_destroy(&o, &be);
  model_destroy(&m);
  backend_destroy(&be);
  return test_finish();
}
