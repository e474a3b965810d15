// bench.c: `swin_train CONFIG bench=1`: the training step's speed on the configured device and
// precision, with nothing in the way: one synthetic batch resident in backend memory (no loader,
// no upload), warm-up steps, then timed rounds of 10 steps each (of bench.steps when fewer; the
// host waits once per round), the median round giving ms/step and img/s; MFU from
// model_train_flops; the backend memory, all of it taken before the first step; host waits per step
// inside a round; and a profiled round giving the GPU time per op family. Writes nothing; prints a
// table and one JSON line.
#include "src/bench.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/backend.h"
#include "src/learner.h"
#include "src/model.h"
#include "src/rng.h"

#define BENCH_ROUND 10

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

int bench_run(const Config *cfg, Error *err) {
  Backend be;
  Model m = {0};
  Optimizer opt = {0};
  int rc = -1;
  uint8_t *pixels = NULL;
  int *labels = NULL;
  if (backend_create(&be, cfg->device, cfg->precision, err) != 0) return -1;
  char desc[256];
  backend_describe(&be, desc, sizeof desc);
  int B = cfg->batch_size;
  if (model_create(&m, cfg, &be, B, err) != 0) goto done;
  model_init_weights(&m, cfg->seed);
  model_weights_to_backend(&m);
  optimizer_create(&opt, &m, cfg);
  OptimState state = {.loss_scale = be.act == DTYPE_F16 ? cfg->loss_scale : 1.0f};
  be.ops->upload(&be, opt.state, &state, sizeof state);

  // One batch of random pixels and labels, resident for every step.
  size_t pixel_bytes = (size_t)B * cfg->img_h * cfg->img_w * cfg->in_chans;
  uint8_t *host_pixels = malloc_check(pixel_bytes);
  int *host_labels = malloc_check(sizeof(int) * (size_t)B);
  Rng r = rng_make(cfg->seed, RNG_STREAM_AUGMENT, UINT32_MAX, UINT32_MAX);
  for (size_t i = 0; i < pixel_bytes; i++) host_pixels[i] = (uint8_t)rng_u32(&r);
  for (int b = 0; b < B; b++) host_labels[b] = (int)rng_below(&r, (uint32_t)cfg->num_classes);
  pixels = be.ops->alloc(&be, pixel_bytes);
  labels = be.ops->alloc(&be, sizeof(int) * (size_t)B);
  be.ops->upload(&be, pixels, host_pixels, pixel_bytes);
  be.ops->upload(&be, labels, host_labels, sizeof(int) * (size_t)B);
  free(host_pixels);
  free(host_labels);
  Normalize norm = {{0}, {0}};
  for (int c = 0; c < cfg->in_chans; c++) {
    norm.mean[c] = cfg->mean[cfg->num_mean == 1 ? 0 : c];
    norm.std[c] = cfg->std[cfg->num_mean == 1 ? 0 : c];
  }

  const StepBatch batch = {.images = pixels, .images_dtype = DTYPE_U8, .labels = labels};
  int64_t step = 0;
  for (int i = 0; i < cfg->bench_warmup; i++, step++)
    learner_step(&m, &opt, cfg, norm, &batch, B, step, cfg->lr);
  be.ops->synchronize(&be);

  // Rounds of 10 steps, or one round_steps of bench.steps when fewer (a profiler's short run).
  int round_steps = cfg->bench_steps < BENCH_ROUND ? cfg->bench_steps : BENCH_ROUND;
  int rounds = (cfg->bench_steps + round_steps - 1) / round_steps;
  double *ms = malloc_check(sizeof(double) * (size_t)rounds);
  int64_t waits = 0;
  for (int k = 0; k < rounds; k++) {
    int64_t waits0 = be.host_waits;
    double t0 = time_now_s();
    for (int i = 0; i < round_steps; i++, step++)
      learner_step(&m, &opt, cfg, norm, &batch, B, step, cfg->lr);
    waits += be.host_waits - waits0;
    be.ops->synchronize(&be);
    ms[k] = 1e3 * (time_now_s() - t0) / round_steps;
  }
  qsort(ms, (size_t)rounds, sizeof(double), compare_doubles);
  double ms_step = ms[rounds / 2], best = ms[0];
  free(ms);

  // A profiled round: GPU time per op family (events around each op: a little slower).
  double family[OP_FAMILIES] = {0}, profiled = 0;
  be.ops->profile(&be, true);
  for (int i = 0; i < round_steps; i++, step++)
    learner_step(&m, &opt, cfg, norm, &batch, B, step, cfg->lr);
  be.ops->profile_report(&be, family);
  be.ops->profile(&be, false);
  for (int f = 0; f < OP_FAMILIES; f++) profiled += family[f] / round_steps;

  OptimState after;
  be.ops->download(&be, &after, opt.state, sizeof after);
  double flops = model_train_flops(&m, B), peak = peak_flops(&be);
  double img_s = B * 1e3 / ms_step, tflops = flops / (ms_step * 1e-3) / 1e12;
  double gib = (double)be.bytes_in_use / (1 << 30);
  printf("bench: %s, batch %d, %lld parameters\n", desc, B, (long long)m.num_values);
  printf("  %-34s %10.1f\n", "img/s (median round)", img_s);
  printf("  %-34s %10.2f   (best round %.2f)\n", "ms/step", ms_step, best);
  printf("  %-34s %10.1f   (%.2f GFLOP/step: matrix products)\n", "TFLOP/s", tflops, flops / 1e9);
  if (peak > 0)
    printf("  %-34s %9.1f%%   (of %.0f TFLOP/s dense peak)\n", "MFU", 100 * tflops * 1e12 / peak,
           peak / 1e12);
  printf("  %-34s %10.2f   (all taken before the first step)\n", "device memory (GiB)", gib);
  printf("  %-34s %10.2f\n", "host waits per step", (double)waits / (rounds * round_steps));
  printf("  %-34s %10.4f   (loss scale %g, %lld skipped)\n", "last loss",
         after.loss_steps ? after.loss_sum / after.loss_steps : NAN, (double)after.loss_scale,
         (long long)after.skipped);
  if (profiled > 0) {
    printf("  GPU time per op family (profiled round, %.2f ms/step):\n", profiled);
    for (int f = 0; f < OP_FAMILIES; f++)
      printf("    %-24s %8.3f ms  %5.1f%%\n", op_family_name((OpFamily)f), family[f] / round_steps,
             100 * family[f] / round_steps / profiled);
    printf("    %-24s %8s     %5s   (folded into LayerNorm)\n", "window permutations", "-", "-");
  }
  printf(
      "{\"bench\": \"swin.c\", \"device\": \"%s\", \"precision\": \"%s\", \"batch\": %d, "
      "\"img_s\": %.1f, \"ms_per_step\": %.3f, \"tflops\": %.1f, \"mfu\": %.4f, "
      "\"memory_gib\": %.3f, \"host_waits_per_step\": %.2f",
      be.ops->name, cfg->precision, B, img_s, ms_step, tflops,
      peak > 0 ? tflops * 1e12 / peak : 0.0, gib, (double)waits / (rounds * round_steps));
  for (int f = 0; f < OP_FAMILIES; f++) printf(", \"ms_%d\": %.4f", f, family[f] / round_steps);
  printf("}\n");
  rc = 0;
done:
  if (pixels) be.ops->release(&be, pixels);
  if (labels) be.ops->release(&be, labels);
  if (opt.state) optimizer_destroy(&opt, &be);
  if (m.params) model_destroy(&m);
  backend_destroy(&be);
  return rc;
}
