// reduce.c: the gradient reducer attached to a model (see reduce.h).
#include "src/app/reduce.h"

#include <stdlib.h>
#include <string.h>

int model_select_device(Comm *c, const Config *cfg, Error *err) {
  bool cuda = strcmp(cfg->device, "cuda") == 0 ||
              (strcmp(cfg->device, "auto") == 0 && backend_cuda_usable());
  return dist_select_device(c, cuda, err);
}

static void record_event(void *queue, void *event) {
  Backend *be = queue;
  be->ops->record_event(be, event);
}

static void wait_event(void *queue, void *event) {
  Backend *be = queue;
  be->ops->wait_event(be, event);
}

int model_reducer_attach(GradReducer **out, Comm *c, Model *m, const Config *cfg, Error *err) {
  Tensor *grads = malloc_check(sizeof(Tensor) * (size_t)(m->num_params > 0 ? m->num_params : 1));
  for (int i = 0; i < m->num_params; i++) grads[i] = model_param_view(m, i, m->grads);
  GradBuffer g = {
      .grads = m->grads,
      .num_floats = m->num_floats,
      .tensors = grads,
      .num_tensors = m->num_params,
      .queue = m->be->device == DEVICE_CUDA ? m->be : NULL,
      .record_event = record_event,
      .wait_event = wait_event,
  };
  int rc = grad_reducer_create(out, c, &g, cfg, err);
  free(grads);
  if (rc != 0) return -1;
  m->grads_ready = grad_reducer_grads_ready;
  m->grads_ready_ctx = *out;
  return 0;
}

void model_reducer_detach(GradReducer *r, Model *m) {
  if (!r) return;
  if (m->grads_ready_ctx == r) {
    m->grads_ready = NULL;
    m->grads_ready_ctx = NULL;
  }
  grad_reducer_destroy(r);
}
