// bench.c: `swin_train CONFIG bench=1`: the training step's speed on the configured device and
// precision, with nothing in the way: one synthetic batch resident in backend memory (no loader,
// no upload), warm-up steps, then timed rounds of 10 steps each (of bench.steps when fewer; the
// host waits once per round), the median round giving ms/step and img/s; MFU from
// model_train_flops; the backend memory, all of it taken before the first step; host waits per step
// inside a round; and a profiled round giving the GPU time per op family. Writes nothing; prints a
// table and one JSON line.
//
// With train.accum_steps = N > 1 a step is the trainer's accumulating step: N forward and backward
// passes of one resident micro-batch (train.batch_size / (processes x N) images; drop path keyed as
// for N slices of a batch), their gradients summed, then one update; img/s counts train.batch_size
// images per step, and the memory is that of one micro-batch's activations.
//
// Under a launcher (mpirun -np N, srun; also -np 1) a step is the trainer's data-parallel step:
// this rank's share of train.batch_size (the global batch), its gradients averaged over the ranks
// by the trainer's GradReducer while backward runs. Each timed round then has a twin beside it
// (after it, or before it every other round) with the reduction skipped and nothing else changed
// (grad_reducer_skip_reduction): the difference of their medians is how much the reduction
// lengthens the step ("exposed"). The profiled round also times the reduction itself, on the
// communication stream on the GPU (the host clock around MPI on the CPU); what of it did not
// lengthen the step was hidden behind backward. Every time is the slowest rank's (the maximum
// over the ranks, so rank 0, which prints, reports the slowest), and img/s counts the images of
// every rank.
//
// The step is the trainer's CUDA graph where train.cuda_graphs allows it (src/app/step_graph.h;
// under a launcher with the all-reduces inside it): captured in the warm-up, replayed in the timed
// rounds (the twin without the reduction is a graph of its own, captured in the warm-up too);
// the profiled round launches every op from the host, so that each can be timed.
#include "src/app/bench.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/reducer.h"
#include "src/app/learner.h"
#include "src/app/reduce.h"
#include "src/app/step_graph.h"
#include "src/app/train.h"
#include "src/base/rng.h"
#include "src/model/backend.h"
#include "src/model/model.h"

#define BENCH_ROUND 10

typedef struct {
  const Config *cfg;
  Comm *comm;
  GradReducer *reducer;  // averages the gradients over the ranks; NULL without a launcher
  Backend be;
  Model m;
  Optimizer opt;
  StepGraphs graphs;  // the step as a replayed CUDA graph (train.cuda_graphs)
  Normalize norm;     // per input channel
  uint8_t *pixels;    // (B, H, W, Cin) backend memory, random, resident for every step
  int *labels;        // (B)
  int B;              // this rank's share of train.batch_size
  int accum, micro;   // micro-batches per step (train.accum_steps) and their size: B / accum
  int64_t step;       // steps queued so far
  bool wait_reduced;  // the host waits for each step's reduction before its update (profiling)
} Bench;

// What the rounds measured, each time the slowest rank's.
typedef struct {
  double ms_step, best;                  // median and best round, ms per step
  double ms_unreduced;                   // median round with the reduction skipped (launcher)
  double waits_per_step;                 // host waits per step inside the timed rounds
  double family[OP_FAMILIES], profiled;  // the profiled round: GPU ms per step per op family
  double reduce_ms;                      // the profiled round: the reduction's ms per step
  double gib;                            // backend memory
  double loss;                           // mean training loss over every step and rank
  OptimState after;                      // rank 0's optimizer state after the last step
} BenchResult;

// Dense peak rates for the MFU, per device and precision (NVIDIA's H100/H200 SXM datasheet: bf16
// and fp16 989 TFLOP/s with fp32 accumulation, fp32 67 TFLOP/s without TF32). The CPU has none.
static double peak_flops(const Backend *be) {
  if (be->device != DEVICE_CUDA) return 0;
  return be->act == DTYPE_F32 ? 67e12 : 989e12;
}

static int compare_doubles(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

// ---------------------------------------------------------------------------------------------
// Setup: the trainer's device choice, batch share and reducer; one resident random batch.

// This rank's (micro-)batch of random pixels and labels, in backend memory (each rank its own
// images).
static void upload_batch(Bench *b) {
  const Config *cfg = b->cfg;
  Backend *be = &b->be;
  size_t pixel_bytes = (size_t)b->micro * cfg->img_h * cfg->img_w * cfg->in_chans;
  uint8_t *host_pixels = malloc_check(pixel_bytes);
  int *host_labels = malloc_check(sizeof(int) * (size_t)b->micro);
  Rng r = rng_make(cfg->seed, RNG_STREAM_AUGMENT, UINT32_MAX, UINT32_MAX - (uint32_t)b->comm->rank);
  for (size_t i = 0; i < pixel_bytes; i++) host_pixels[i] = (uint8_t)rng_u32(&r);
  for (int i = 0; i < b->micro; i++)
    host_labels[i] = (int)rng_below(&r, (uint32_t)cfg->num_classes);
  b->pixels = be->ops->alloc(be, pixel_bytes);
  b->labels = be->ops->alloc(be, sizeof(int) * (size_t)b->micro);
  be->ops->upload(be, b->pixels, host_pixels, pixel_bytes);
  be->ops->upload(be, b->labels, host_labels, sizeof(int) * (size_t)b->micro);
  free(host_pixels);
  free(host_labels);
}

static int bench_setup(Bench *b, const Config *cfg, Comm *comm, Error *err) {
  memset(b, 0, sizeof *b);
  b->cfg = cfg;
  b->comm = comm;
  // The trainer's share of the global batch, and its refusal of a batch that does not divide.
  LoaderOptions share;
  if (train_loader_options(cfg, comm, true, &share, err) != 0) return -1;
  b->B = share.batch_size;
  b->accum = cfg->accum_steps;
  b->micro = b->B / b->accum;
  if (model_select_device(comm, cfg, err) != 0) return -1;
  Backend *be = &b->be;
  if (backend_create(be, cfg->device, cfg->precision, err) != 0) return -1;
  if (be->ops->gemm_tuning) be->ops->gemm_tuning(be, strcmp(cfg->gemm_tune, "on") == 0);
  if (comm->mpi && train_check_same_device(comm, be, err) != 0) return -1;
  if (model_create(&b->m, cfg, be, b->micro, err) != 0) return -1;
  model_init_weights(&b->m, cfg->seed);
  model_weights_to_backend(&b->m);
  optimizer_create(&b->opt, &b->m, cfg);
  OptimState state = {.loss_scale = be->act == DTYPE_F16 ? cfg->loss_scale : 1.0f};
  be->ops->upload(be, b->opt.state, &state, sizeof state);
  upload_batch(b);
  b->norm = model_input_normalize(cfg);
  if (comm->mpi && model_reducer_attach(&b->reducer, comm, &b->m, cfg, err) != 0) return -1;
  return step_graphs_init(&b->graphs, be, cfg->cuda_graphs, comm->mpi, b->accum, err);
}

static void bench_teardown(Bench *b) {
  Backend *be = &b->be;
  model_reducer_detach(b->reducer, &b->m);
  if (be->ops) {
    step_graphs_destroy(&b->graphs, be);
    be->ops->release(be, b->pixels);
    be->ops->release(be, b->labels);
    if (b->opt.state) optimizer_destroy(&b->opt, be);
  }
  if (b->m.params) model_destroy(&b->m);
  backend_destroy(be);
}

// ---------------------------------------------------------------------------------------------
// Steps and rounds

// One step, the trainer's (src/app/train.c) on the resident batch: for each micro-batch (one with
// train.accum_steps 1) its values, then its learner_run (backward of this rank's share, drop path
// keyed by the global index of its first image; under a launcher the reduction inside the last;
// the update after the last), as a replayed CUDA graph where it can be; then, as the trainer does,
// a bounded host wait for the step before the last, so the host never runs unboundedly ahead of
// work that depends on another rank. When profiling, the host waits (bounded) for the reduction
// between the last backward and the update instead.
static int bench_step(Bench *b, Error *err) {
  const StepBatch batch = {.images = b->pixels, .images_dtype = DTYPE_U8, .labels = b->labels};
  if (b->accum > 1) model_zero_grads(&b->m);  // before the first micro-batch only
  for (int k = 0; k < b->accum; k++) {
    StepPart part = learner_part(k, b->accum);
    int64_t first_sample = (int64_t)b->comm->rank * b->B + (int64_t)k * b->micro;
    learner_set_step(&b->m, &b->opt, b->step, b->cfg->lr, first_sample);
    if (b->wait_reduced && part != STEP_ACCUMULATE) {
      if (part == STEP_WHOLE)
        learner_backward(&b->m, &b->opt, b->cfg, b->norm, &batch, b->micro);
      else
        learner_accumulate(&b->m, &b->opt, b->cfg, b->norm, &batch, b->micro, true);
      if (grad_reducer_sync(b->reducer, err) != 0) return -1;
      learner_update(&b->m, &b->opt, b->cfg);
    } else if (step_graphs_step(&b->graphs, &b->m, &b->opt, b->cfg, b->norm, &batch, b->micro, part,
                                err) != 0) {
      return -1;
    }
  }
  b->step++;
  if (!b->reducer) return 0;
  if (grad_reducer_finish_step(b->reducer, err) != 0) return -1;
  return grad_reducer_sync_previous(b->reducer, err);
}

// The step with the reduction skipped (the benchmark's twin rounds): its own graph.
static void skip_reduction(Bench *b, bool skip) {
  grad_reducer_skip_reduction(b->reducer, skip);
  b->graphs.variant = skip;
}

// Waits for every queued step: the reductions first, bounded by dist.timeout_s (the compute
// queue waits for them), then the compute queue.
static int bench_wait(Bench *b, Error *err) {
  if (b->reducer && grad_reducer_sync(b->reducer, err) != 0) return -1;
  b->be.ops->synchronize(&b->be);
  return 0;
}

// A timed round of `steps` steps, started by every rank together (the device idle); *ms: this
// rank's wall time per step to the end of its work; *waits counts the host waits inside it.
static int timed_round(Bench *b, int steps, double *ms, int64_t *waits, Error *err) {
  if (comm_barrier(b->comm, err) != 0) return -1;
  int64_t waits0 = b->be.host_waits;
  double t0 = time_now_s();
  for (int i = 0; i < steps; i++)
    if (bench_step(b, err) != 0) return -1;
  *waits += b->be.host_waits - waits0;
  if (bench_wait(b, err) != 0) return -1;
  *ms = 1e3 * (time_now_s() - t0) / steps;
  return 0;
}

// A profiled round: the GPU time per op family (events around each op on the compute stream: a
// little slower) and the reduction's time, in ms per step. Here the host waits (bounded) for each
// step's reduction before queuing its update: the backend's profiler waits for the compute queue
// when its pool of events fills, and that wait must not depend on another rank. GPU times do not
// see the host's pauses, and the reductions overlap backward as in any step.
static int profiled_round(Bench *b, int steps, BenchResult *r, Error *err) {
  Backend *be = &b->be;
  b->graphs.paused = true;  // every op launched from the host, between its timing events
  be->ops->profile(be, true);
  if (b->reducer) grad_reducer_profile(b->reducer, true);
  b->wait_reduced = b->reducer != NULL;
  for (int i = 0; i < steps; i++)
    if (bench_step(b, err) != 0) return -1;
  b->wait_reduced = false;
  r->reduce_ms = 0;
  if (b->reducer) {
    grad_reducer_profile(b->reducer, false);
    if (grad_reducer_profile_report(b->reducer, &r->reduce_ms, err) != 0) return -1;
  }
  if (bench_wait(b, err) != 0) return -1;
  be->ops->profile_report(be, r->family);
  be->ops->profile(be, false);
  b->graphs.paused = false;
  r->reduce_ms /= steps;
  for (int f = 0; f < OP_FAMILIES; f++) r->family[f] /= steps;
  return 0;
}

// The slowest rank's time of each round (in place), then their median and best.
static int slowest_median(Comm *c, double *ms, int rounds, double *median, double *best,
                          Error *err) {
  if (comm_allreduce_doubles(c, ms, rounds, COMM_MAX, err) != 0) return -1;
  qsort(ms, (size_t)rounds, sizeof(double), compare_doubles);
  *median = ms[rounds / 2];
  if (best) *best = ms[0];
  return 0;
}

// Warm-up, the timed rounds (each with its twin without the reduction under a launcher) and the
// profiled round; every number is the slowest rank's.
static int bench_measure(Bench *b, BenchResult *r, Error *err) {
  const Config *cfg = b->cfg;
  Backend *be = &b->be;
  memset(r, 0, sizeof *r);
  for (int i = 0; i < cfg->bench_warmup; i++)
    if (bench_step(b, err) != 0) return -1;
  if (b->reducer) {  // the twin's step too: its graph is captured at its second step
    skip_reduction(b, true);
    for (int i = 0; i < 2 && i < cfg->bench_warmup; i++)
      if (bench_step(b, err) != 0) return -1;
    skip_reduction(b, false);
  }
  if (bench_wait(b, err) != 0) return -1;

  // Rounds of 10 steps, or one round of bench.steps when fewer (a profiler's short run).
  int round_steps = cfg->bench_steps < BENCH_ROUND ? cfg->bench_steps : BENCH_ROUND;
  int rounds = (cfg->bench_steps + round_steps - 1) / round_steps;
  double *ms = calloc_check((size_t)rounds, sizeof(double));
  double *unreduced = calloc_check((size_t)rounds, sizeof(double));
  int64_t waits = 0, ignored = 0;
  int rc = -1;
  for (int k = 0; k < rounds; k++) {
    // The twin without the reduction goes after its round, or before it every other time, so a
    // drift of the machine's speed (clocks, temperature) weighs on both sides alike.
    bool twin_first = b->reducer && k % 2 == 1;
    for (int side = 0; side < (b->reducer ? 2 : 1); side++) {
      bool twin = (side == 0) == twin_first;
      if (twin) skip_reduction(b, true);
      int failed = twin ? timed_round(b, round_steps, &unreduced[k], &ignored, err)
                        : timed_round(b, round_steps, &ms[k], &waits, err);
      if (twin) skip_reduction(b, false);
      if (failed) goto done;
    }
  }
  if (slowest_median(b->comm, ms, rounds, &r->ms_step, &r->best, err) != 0) goto done;
  if (b->reducer && slowest_median(b->comm, unreduced, rounds, &r->ms_unreduced, NULL, err) != 0)
    goto done;
  if (profiled_round(b, round_steps, r, err) != 0) goto done;

  be->ops->download(be, &r->after, b->opt.state, sizeof r->after);
  double worst[OP_FAMILIES + 3], sums[2] = {r->after.loss_sum, (double)r->after.loss_steps};
  memcpy(worst, r->family, sizeof r->family);
  worst[OP_FAMILIES] = r->reduce_ms;
  worst[OP_FAMILIES + 1] = (double)waits / (rounds * round_steps);
  worst[OP_FAMILIES + 2] = (double)be->bytes_in_use / (1 << 30);
  if (comm_allreduce_doubles(b->comm, worst, OP_FAMILIES + 3, COMM_MAX, err) != 0 ||
      comm_allreduce_doubles(b->comm, sums, 2, COMM_SUM, err) != 0)
    goto done;
  memcpy(r->family, worst, sizeof r->family);
  r->profiled = 0;  // the sum of the slowest ranks' families, so the shares add up to 100%
  for (int f = 0; f < OP_FAMILIES; f++) r->profiled += r->family[f];
  r->reduce_ms = worst[OP_FAMILIES];
  r->waits_per_step = worst[OP_FAMILIES + 1];
  r->gib = worst[OP_FAMILIES + 2];
  r->loss = sums[1] > 0 ? sums[0] / sums[1] : NAN;
  rc = 0;
done:
  free(ms);
  free(unreduced);
  return rc;
}

// ---------------------------------------------------------------------------------------------
// The table and the JSON line (rank 0's stdout)

static const char *reduce_transport(const Bench *b) {
  return b->be.device == DEVICE_CUDA ? b->cfg->reduce_dtype : "fp32, MPI";
}

// The reduction's rows: its time in the profiled round, how much it lengthened the step (the
// median with it minus the median without), and the rest, hidden behind backward.
static void print_allreduce(const Bench *b, const BenchResult *r) {
  bool gpu = b->be.device == DEVICE_CUDA;
  double exposed = r->ms_step - r->ms_unreduced, hidden = r->reduce_ms - exposed;
  double base = gpu ? r->profiled : r->ms_step;  // the share column: of the compute / the step
  int buckets = grad_reducer_num_buckets(b->reducer);
  if (!gpu) printf("  gradient all-reduce (profiled round, host clock):\n");
  printf("    %-24s %8.3f ms  %5.1f%%   (%d bucket%s a step, %s; %s)\n",
         gpu ? "all-reduce (comm stream)" : "all-reduce (MPI)", r->reduce_ms,
         base > 0 ? 100 * r->reduce_ms / base : 0.0, buckets, buckets > 1 ? "s" : "",
         reduce_transport(b),
         gpu ? "beside the compute stream, not in its sum" : "blocking; % of the step");
  char share_exposed[16] = "    -", share_hidden[16] = "    -";
  if (r->reduce_ms > 0) {
    snprintf(share_exposed, sizeof share_exposed, "%5.1f%%", 100 * exposed / r->reduce_ms);
    snprintf(share_hidden, sizeof share_hidden, "%5.1f%%", 100 * hidden / r->reduce_ms);
  }
  printf(
      "    %-24s %8.3f ms  %s   (of the all-reduce: a step takes %.2f ms with it, %.2f "
      "without)\n",
      "all-reduce exposed", exposed, share_exposed, r->ms_step, r->ms_unreduced);
  printf("    %-24s %8.3f ms  %s   (of the all-reduce: behind backward%s)\n", "all-reduce hidden",
         hidden, share_hidden, b->comm->world > 1 ? " or a slower rank's step" : "");
}

// The matrix-product FLOP of one step on this rank: every micro-batch's.
static double step_flops(const Bench *b) {
  return model_train_flops(&b->m, b->micro) * b->accum;
}

static void print_table(const Bench *b, const BenchResult *r) {
  const Config *cfg = b->cfg;
  const Backend *be = &b->be;
  int world = b->comm->world;
  char desc[256], share[64] = "";
  backend_describe(be, desc, sizeof desc);
  double flops = step_flops(b), peak = peak_flops(be);
  double img_s = cfg->batch_size * 1e3 / r->ms_step, tflops = flops / (r->ms_step * 1e-3) / 1e12;
  if (b->accum > 1) snprintf(share, sizeof share, "%d micro-batches x %d", b->accum, b->micro);
  if (b->reducer) {
    char per_rank[80];
    if (b->accum > 1)
      snprintf(per_rank, sizeof per_rank, "%s", share);
    else
      snprintf(per_rank, sizeof per_rank, "%d", b->B);
    printf("bench: %s, batch %d (%d process%s x %s), %lld parameters\n", desc, cfg->batch_size,
           world, world > 1 ? "es" : "", per_rank, (long long)b->m.num_values);
    printf(
        "  data parallel: %d process%s (launched via %s), gradients averaged in %d bucket%s "
        "of up to %g MiB (%s)\n",
        world, world > 1 ? "es" : "", b->comm->launcher, grad_reducer_num_buckets(b->reducer),
        grad_reducer_num_buckets(b->reducer) > 1 ? "s" : "", (double)cfg->bucket_mb,
        reduce_transport(b));
    printf("  %-34s %10.1f   (the images of all %d process%s)\n", "img/s (median round)", img_s,
           world, world > 1 ? "es" : "");
  } else if (b->accum > 1) {
    printf("bench: %s, batch %d (%s), %lld parameters\n", desc, cfg->batch_size, share,
           (long long)b->m.num_values);
    printf("  %-34s %10.1f\n", "img/s (median round)", img_s);
  } else {
    printf("bench: %s, batch %d, %lld parameters\n", desc, cfg->batch_size,
           (long long)b->m.num_values);
    printf("  %-34s %10.1f\n", "img/s (median round)", img_s);
  }
  printf("  %-34s %10.2f   (best round %.2f)\n", "ms/step", r->ms_step, r->best);
  printf("  %-34s %10.1f   (%.2f GFLOP/step%s: matrix products%s)\n", "TFLOP/s", tflops,
         flops / 1e9, b->reducer ? " per process" : "",
         b->m.num_recomputed > 0 ? ", the recompute's not counted" : "");
  if (peak > 0)
    printf("  %-34s %9.1f%%   (of %.0f TFLOP/s dense peak)\n", "MFU", 100 * tflops * 1e12 / peak,
           peak / 1e12);
  printf("  %-34s %10.2f   (all taken before the first step)\n", "device memory (GiB)", r->gib);
  size_t weights, grads, acts;
  model_memory(&b->m, &weights, &grads, &acts);
  printf("  %-34s %10.2f", "activations (GiB)", (double)acts / (1 << 30));
  if (b->m.num_recomputed > 0)
    printf("   (train.recompute: %d of %d blocks rebuilt in the backward, -%.2f GiB)",
           b->m.num_recomputed, b->m.num_blocks, (double)b->m.acts_saved_bytes / (1 << 30));
  printf("\n");
  printf("  %-34s %10.2f\n", "host waits per step", r->waits_per_step);
  if (be->device == DEVICE_CUDA) {
    char graphs[256];
    step_graphs_describe(&b->graphs, graphs, sizeof graphs);
    printf("  %-34s %s\n", "cuda graphs", graphs);
  }
  printf("  %-34s %10.4f   (loss scale %g, %lld skipped)\n", "last loss", r->loss,
         (double)r->after.loss_scale, (long long)r->after.skipped);
  if (r->profiled > 0) {
    printf("  GPU time per op family (profiled round, %.2f ms/step):\n", r->profiled);
    for (int f = 0; f < OP_FAMILIES; f++)
      printf("    %-24s %8.3f ms  %5.1f%%\n", op_family_name((OpFamily)f), r->family[f],
             100 * r->family[f] / r->profiled);
    printf("    %-24s %8s     %5s   (folded into LayerNorm)\n", "window permutations", "-", "-");
  }
  if (b->reducer) print_allreduce(b, r);
}

static void print_json(const Bench *b, const BenchResult *r) {
  const Config *cfg = b->cfg;
  const Backend *be = &b->be;
  double flops = step_flops(b), peak = peak_flops(be);
  double img_s = cfg->batch_size * 1e3 / r->ms_step, tflops = flops / (r->ms_step * 1e-3) / 1e12;
  printf(
      "{\"bench\": \"swin.c\", \"device\": \"%s\", \"precision\": \"%s\", \"batch\": %d, "
      "\"accum_steps\": %d, \"world\": %d, \"img_s\": %.1f, \"ms_per_step\": %.3f, \"tflops\": "
      "%.1f, \"mfu\": %.4f, \"memory_gib\": %.3f, \"host_waits_per_step\": %.2f, \"cuda_graphs\": "
      "%s, \"recomputed_blocks\": %d",
      be->ops->name, cfg->precision, cfg->batch_size, b->accum, b->comm->world, img_s, r->ms_step,
      tflops, peak > 0 ? tflops * 1e12 / peak : 0.0, r->gib, r->waits_per_step,
      b->graphs.on && b->graphs.captured > 0 ? "true" : "false", b->m.num_recomputed);
  if (b->reducer) {
    double exposed = r->ms_step - r->ms_unreduced;
    printf(
        ", \"batch_per_rank\": %d, \"buckets\": %d, \"reduce_dtype\": \"%s\", "
        "\"ms_per_step_unreduced\": %.3f, \"allreduce_ms\": %.4f, \"allreduce_exposed_ms\": "
        "%.4f, \"allreduce_hidden_ms\": %.4f",
        b->B, grad_reducer_num_buckets(b->reducer),
        be->device == DEVICE_CUDA ? cfg->reduce_dtype : "fp32", r->ms_unreduced, r->reduce_ms,
        exposed, r->reduce_ms - exposed);
  }
  for (int f = 0; f < OP_FAMILIES; f++) printf(", \"ms_%d\": %.4f", f, r->family[f]);
  printf("}\n");
}

int bench_run(const Config *cfg, Comm *comm, Error *err) {
  Bench b;
  BenchResult r;
  int rc = -1;
  if (bench_setup(&b, cfg, comm, err) != 0 || bench_measure(&b, &r, err) != 0) goto done;
  print_table(&b, &r);
  if (b.be.ops->gemm_report) b.be.ops->gemm_report(&b.be, stdout);
  print_json(&b, &r);
  rc = 0;
done:
  // A failing rank of a job leaves its memory to the process's end, as the trainer does: main()
  // ends the whole job at once, and freeing device memory could wait for a peer.
  if (rc != 0 && comm->mpi) return rc;
  bench_teardown(&b);
  return rc;
}
