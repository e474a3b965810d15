// reduce.h: data-parallel training's gradient averaging (dist/reducer.h) attached to a model:
// the reducer gets the model's gradient buffer, its tensor table and its backend's compute
// queue, and the model's backward reports to it (Model.grads_ready).
#pragma once
#include <stdbool.h>

#include "dist/comm.h"
#include "dist/reducer.h"
#include "src/base/config.h"
#include "src/model/model.h"

// dist_select_device for the device cfg names (device = auto: CUDA when it is usable).
int model_select_device(Comm *c, const Config *cfg, Error *err);
// grad_reducer_create over m's gradients, installed as m->grads_ready. Collective.
int model_reducer_attach(GradReducer **out, Comm *c, Model *m, const Config *cfg, Error *err);
// Takes the reducer off m (when it is m's) and destroys it; r may be NULL.
void model_reducer_detach(GradReducer *r, Model *m);
