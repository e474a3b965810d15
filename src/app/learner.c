// learner.c: the training step and the optimizer memory (src/app/learner.h).
#include "src/app/learner.h"

#include <stdlib.h>
#include <string.h>

#include "src/base/nvtx.h"
#include "src/model/backend_check.h"

// The optimizer's backend memory, for the backend's checking layer (src/model/backend_check.h):
// the moments as buffers (only ever passed whole), the chunk table and the structs as bytes.
static void register_regions(const Optimizer *o, const Model *m, size_t chunk_bytes) {
  Backend *be = m->be;
  const int64_t floats = m->num_floats;
  Tensor t = tensor_view(o->exp_avg, DTYPE_F32, be->device, "optimizer.exp_avg", 1, &floats);
  backend_check_register_buffer(be, &t);
  t = tensor_view(o->exp_avg_sq, DTYPE_F32, be->device, "optimizer.exp_avg_sq", 1, &floats);
  backend_check_register_buffer(be, &t);
  const struct {
    void *data;
    int64_t bytes;
    const char *name;
  } structs[] = {{o->chunks, (int64_t)chunk_bytes, "optimizer.chunks"},
                 {o->state, sizeof(OptimState), "optimizer.state"},
                 {o->step_params, sizeof(StepParams), "optimizer.step_params"}};
  for (int i = 0; i < 3; i++) {
    t = tensor_view(structs[i].data, DTYPE_U8, be->device, structs[i].name, 1, &structs[i].bytes);
    backend_check_register(be, &t);
  }
  if (o->ema) {
    t = tensor_view(o->ema, DTYPE_F32, be->device, "optimizer.ema", 1, &floats);
    backend_check_register_buffer(be, &t);
  }
}

void optimizer_create(Optimizer *o, const Model *m, const Config *cfg) {
  *o = (Optimizer){0};
  Backend *be = m->be;
  size_t bytes = sizeof(float) * (size_t)m->num_floats;
  o->exp_avg = be->ops->alloc(be, bytes);
  o->exp_avg_sq = be->ops->alloc(be, bytes);
  bool host_memory = be->device == DEVICE_CPU;
  o->host_exp_avg = host_memory ? o->exp_avg : calloc_check(1, bytes);
  o->host_exp_avg_sq = host_memory ? o->exp_avg_sq : calloc_check(1, bytes);
  o->num_chunks = model_adamw_chunks(m, cfg->weight_decay, cfg->layer_decay, NULL);
  size_t chunk_bytes = sizeof(AdamWChunk) * (size_t)o->num_chunks;
  AdamWChunk *chunks = malloc_check(chunk_bytes);
  model_adamw_chunks(m, cfg->weight_decay, cfg->layer_decay, chunks);
  o->chunks = be->ops->alloc(be, chunk_bytes);
  be->ops->upload(be, o->chunks, chunks, chunk_bytes);
  free(chunks);
  o->state = be->ops->alloc(be, sizeof(OptimState));
  o->step_params = be->ops->alloc(be, sizeof(StepParams));
  if (cfg->ema_decay > 0) {
    o->ema = be->ops->alloc(be, bytes);
    o->host_ema = host_memory ? o->ema : calloc_check(1, bytes);
    o->ema_settings = (EmaSettings){.decay = cfg->ema_decay, .warmup = cfg->ema_warmup};
  }
  register_regions(o, m, chunk_bytes);
}

void optimizer_destroy(Optimizer *o, Backend *be) {
  if (o->host_exp_avg != o->exp_avg) free(o->host_exp_avg);
  if (o->host_exp_avg_sq != o->exp_avg_sq) free(o->host_exp_avg_sq);
  if (o->host_ema != o->ema) free(o->host_ema);
  // The checking layer forgets each region before its memory can be handed out again.
  void *memory[] = {o->exp_avg, o->exp_avg_sq, o->chunks, o->state, o->step_params, o->ema};
  for (int i = 0; i < 6; i++) {
    if (!memory[i]) continue;
    backend_check_unregister(be, memory[i]);
    be->ops->release(be, memory[i]);
  }
  *o = (Optimizer){0};
}

size_t optimizer_ema_bytes(const Optimizer *o, const Model *m) {
  return o->ema ? sizeof(float) * (size_t)m->num_floats : 0;
}

size_t optimizer_bytes(const Optimizer *o, const Model *m) {
  return 2 * sizeof(float) * (size_t)m->num_floats + sizeof(AdamWChunk) * (size_t)o->num_chunks +
         sizeof(OptimState) + sizeof(StepParams) + optimizer_ema_bytes(o, m);
}

void optimizer_upload_moments(Optimizer *o, const Model *m) {
  if (o->host_exp_avg == o->exp_avg) return;
  size_t bytes = sizeof(float) * (size_t)m->num_floats;
  m->be->ops->upload(m->be, o->exp_avg, o->host_exp_avg, bytes);
  m->be->ops->upload(m->be, o->exp_avg_sq, o->host_exp_avg_sq, bytes);
}

void optimizer_download_moments(Optimizer *o, const Model *m) {
  if (o->host_exp_avg == o->exp_avg) return;
  size_t bytes = sizeof(float) * (size_t)m->num_floats;
  m->be->ops->download(m->be, o->host_exp_avg, o->exp_avg, bytes);
  m->be->ops->download(m->be, o->host_exp_avg_sq, o->exp_avg_sq, bytes);
}

void optimizer_upload_ema(Optimizer *o, const Model *m) {
  if (!o->ema || o->host_ema == o->ema) return;
  m->be->ops->upload(m->be, o->ema, o->host_ema, sizeof(float) * (size_t)m->num_floats);
}

void optimizer_download_ema(Optimizer *o, const Model *m) {
  if (!o->ema || o->host_ema == o->ema) return;
  m->be->ops->download(m->be, o->host_ema, o->ema, sizeof(float) * (size_t)m->num_floats);
}

void optimizer_ema_from_weights(Optimizer *o, const Model *m) {
  if (!o->ema) return;
  memcpy(o->host_ema, m->weights, sizeof(float) * (size_t)m->num_floats);
  optimizer_upload_ema(o, m);
}

void optimizer_swap_ema(Optimizer *o, Model *m) {
  Backend *be = m->be;
  be->ops->weights_swap(be, m->master, o->ema, m->num_floats);
  if (m->compute != (void *)m->master)
    be->ops->to_compute(be, m->compute, m->master, m->num_floats);
}

StepPart learner_part(int k, int accum) {
  if (accum <= 1) return STEP_WHOLE;
  return k < accum - 1 ? STEP_ACCUMULATE : STEP_FINISH;
}

void learner_set_step(Model *m, Optimizer *o, int64_t step, float lr, int64_t first_sample) {
  StepParams values = {.step = step, .first_sample = first_sample, .lr = lr};
  m->be->ops->step_params_set(m->be, o->step_params, &values);
}

void learner_accumulate(Model *m, Optimizer *o, const Config *cfg, Normalize norm,
                        const StepBatch *batch, int B, bool report) {
  Backend *be = m->be;
  model_forward(m, batch->images, batch->images_dtype, norm, B, true, cfg->seed, o->step_params);
  be->ops->train_loss(be, m->acts.dlogits, m->acts.logits, batch->labels, batch->soft_targets,
                      cfg->label_smoothing, B, cfg->num_classes, B * cfg->accum_steps, o->state);
  model_backward(m, B, report);
}

void learner_backward(Model *m, Optimizer *o, const Config *cfg, Normalize norm,
                      const StepBatch *batch, int B) {
  model_zero_grads(m);
  learner_accumulate(m, o, cfg, norm, batch, B, true);
}

void learner_update(Model *m, Optimizer *o, const Config *cfg) {
  Backend *be = m->be;
  NVTX_PUSH("optimizer");
  OptimizerStep hyper = {.beta1 = cfg->beta1,
                         .beta2 = cfg->beta2,
                         .eps = cfg->eps,
                         .clip_grad = cfg->clip_grad,
                         .dynamic_scale = be->act == DTYPE_F16,
                         .scale_window = cfg->loss_scale_window};
  be->ops->optimizer_step(be, m->master, m->compute == (void *)m->master ? NULL : m->compute,
                          m->grads, o->exp_avg, o->exp_avg_sq, m->num_floats, o->chunks,
                          o->num_chunks, hyper, o->step_params, o->state);
  if (o->ema) be->ops->ema_update(be, o->ema, m->master, m->num_floats, o->ema_settings, o->state);
  NVTX_POP();
}

void learner_run(Model *m, Optimizer *o, const Config *cfg, Normalize norm, const StepBatch *batch,
                 int B, StepPart part) {
  if (part == STEP_WHOLE)
    learner_backward(m, o, cfg, norm, batch, B);
  else
    learner_accumulate(m, o, cfg, norm, batch, B, part == STEP_FINISH);
  if (part != STEP_ACCUMULATE) learner_update(m, o, cfg);
}
