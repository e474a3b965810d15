// test_recompute.h: what the activation-checkpointing tests (tests/test_recompute.c on the CPU,
// tests/test_gpu_recompute.c on CUDA) share: one training step of a model (forward with drop
// path, the smoothed loss, backward) on any backend with a given train.recompute, its logits and
// gradients copied back, and two ways to tamper with the memory between the forward and the
// backward that show what the backward reads.
#pragma once
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/config.h"
#include "src/model/backend.h"
#include "src/model/model.h"
#include "tests/util/test_util.h"

typedef enum {
  TAMPER_NONE,
  // Every byte of the shared set of the recomputed blocks (the act_table rows "recompute.*")
  // set to 0xFF (NaN in f32, bf16 and f16) after the forward: a backward that read what the
  // forward left there instead of rebuilding it would give NaN gradients.
  TAMPER_REBUILT,
  // The lowest mantissa bit of every element of the first recomputed block's kept input (its
  // residual-stream x) flipped after the forward: the backward rebuilds the block from it, so
  // the gradients must change (the comparison sees a one-ulp difference in one tensor).
  TAMPER_INPUT,
} Tamper;

typedef struct {
  float *logits, *grads;  // host copies: (B, classes), (num_floats)
  int64_t num_logits, num_floats;
  size_t acts_bytes, saved_bytes;  // the activation arena and what recompute saved of it
  int recomputed, dropped;         // recomputed blocks; drop-path scales that are 0
  bool ok;
} RecomputeStep;

static inline void recompute_step_free(RecomputeStep *r) {
  free(r->logits);
  free(r->grads);
  memset(r, 0, sizeof *r);
}

// Tampers with the model's backend memory as `tamper` says (host copies, uploaded).
static inline void recompute_tamper(Backend *be, Model *m, Tamper tamper) {
  if (tamper == TAMPER_REBUILT) {
    for (int i = 0; i < m->num_acts; i++) {
      const Tensor *t = &m->act_table[i];
      if (strncmp(t->name, "recompute.", 10) != 0) continue;
      size_t n = tensor_bytes(t);
      unsigned char *ones = malloc_check(n);
      memset(ones, 0xFF, n);
      be->ops->upload(be, t->data, ones, n);
      free(ones);
    }
  } else if (tamper == TAMPER_INPUT) {
    int gi = 0;
    while (gi < m->num_blocks && !m->block_recompute[gi]) gi++;
    if (gi == m->num_blocks) return;
    int s = 0;
    while (s + 1 < m->num_stages && m->stages[s + 1].first_block <= gi) s++;
    const StageGeom *g = &m->stages[s];
    size_t esize = dtype_size(be->act), n = (size_t)m->max_batch * g->H * g->W * g->C;
    unsigned char *x = malloc_check(n * esize);
    be->ops->download(be, x, m->acts.blocks[gi].x, n * esize);
    for (size_t i = 0; i < n; i++) x[i * esize] ^= 1;  // little-endian: the lowest mantissa bit
    be->ops->upload(be, m->acts.blocks[gi].x, x, n * esize);
    free(x);
  }
}

// One training step of cfg with train.recompute = recompute on be over B images (pixels drawn
// from seed, labels too): weights from model_init_weights(5), drop path keyed by step 11.
static inline RecomputeStep recompute_step(Backend *be, Config cfg, int recompute, int B,
                                           uint64_t seed, Tamper tamper) {
  RecomputeStep r = {0};
  cfg.recompute = recompute;
  Model m;
  Error err;
  if (model_create(&m, &cfg, be, B, &err) != 0) {
    test_check(0, "model_create (train.recompute=%d) on %s: %s", recompute, be->ops->name, err.msg);
    return r;
  }
  model_init_weights(&m, 5);
  model_weights_to_backend(&m);
  TestRng rng = {seed};
  size_t pixel_bytes = (size_t)B * cfg.img_h * cfg.img_w * cfg.in_chans;
  uint8_t *pixels_host = malloc_check(pixel_bytes);
  int *labels_host = malloc_check(sizeof(int) * (size_t)B);
  for (size_t i = 0; i < pixel_bytes; i++) pixels_host[i] = (uint8_t)(test_rng_u64(&rng) >> 56);
  for (int b = 0; b < B; b++)
    labels_host[b] = (int)(test_rng_u64(&rng) % (uint64_t)cfg.num_classes);
  uint8_t *pixels = be->ops->alloc(be, pixel_bytes);
  int *labels = be->ops->alloc(be, sizeof(int) * (size_t)B);
  OptimState *state = be->ops->alloc(be, sizeof(OptimState));
  StepParams *step = be->ops->alloc(be, sizeof(StepParams));
  OptimState init = {.loss_scale = 1.0f};
  StepParams at = {.step = 11};
  be->ops->upload(be, pixels, pixels_host, pixel_bytes);
  be->ops->upload(be, labels, labels_host, sizeof(int) * (size_t)B);
  be->ops->upload(be, state, &init, sizeof init);
  be->ops->upload(be, step, &at, sizeof at);

  model_forward(&m, pixels, DTYPE_U8, model_input_normalize(&cfg), B, true, 7, step);
  be->ops->train_loss(be, m.acts.dlogits, m.acts.logits, labels, NULL, cfg.label_smoothing, B,
                      cfg.num_classes, B, state);
  recompute_tamper(be, &m, tamper);
  model_zero_grads(&m);
  model_backward(&m, B, true);

  r.num_logits = (int64_t)B * cfg.num_classes;
  r.num_floats = m.num_floats;
  r.logits = malloc_check(sizeof(float) * (size_t)r.num_logits);
  r.grads = malloc_check(sizeof(float) * (size_t)r.num_floats);
  be->ops->download(be, r.logits, m.acts.logits, sizeof(float) * (size_t)r.num_logits);
  model_grads_to_host(&m, r.grads);
  int64_t units = 2 * (int64_t)m.num_blocks * B;
  float *scales = malloc_check(sizeof(float) * (size_t)units);
  be->ops->download(be, scales, m.acts.drop_scales, sizeof(float) * (size_t)units);
  for (int64_t i = 0; i < units; i++) r.dropped += scales[i] == 0;
  free(scales);
  size_t weights, grads;
  model_memory(&m, &weights, &grads, &r.acts_bytes);
  r.saved_bytes = m.acts_saved_bytes;
  r.recomputed = m.num_recomputed;
  r.ok = true;
  be->ops->release(be, pixels);
  be->ops->release(be, labels);
  be->ops->release(be, state);
  be->ops->release(be, step);
  free(pixels_host);
  free(labels_host);
  model_destroy(&m);
  return r;
}

// Whether two steps gave the same bits (logits and every gradient); prints the first gradient
// that differs.
static inline bool recompute_same_bits(const RecomputeStep *a, const RecomputeStep *b) {
  if (!a->ok || !b->ok || a->num_floats != b->num_floats) return false;
  bool logits = memcmp(a->logits, b->logits, sizeof(float) * (size_t)a->num_logits) == 0;
  for (int64_t i = 0; i < a->num_floats; i++)
    if (memcmp(&a->grads[i], &b->grads[i], sizeof(float)) != 0) {
      printf("     gradient %lld differs: %.9g vs %.9g\n", (long long)i, (double)a->grads[i],
             (double)b->grads[i]);
      return false;
    }
  return logits;
}
