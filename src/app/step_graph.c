// step_graph.c: the training step captured into a CUDA graph and replayed (src/app/step_graph.h).
// The one place that captures: step_graphs_step.
#include "src/app/step_graph.h"

#include <stdio.h>
#include <string.h>

#include "src/base/nvtx.h"

int step_graphs_init(StepGraphs *g, const Backend *be, const char *mode, bool launched, int accum,
                     Error *err) {
  memset(g, 0, sizeof *g);
  g->launched = launched;
  g->accum = accum;
  const char *unsupported = NULL;
  if (be->device != DEVICE_CUDA || !be->ops->graph_begin) unsupported = "the CPU backend";
  if (strcmp(mode, "off") == 0) {
    g->why_off = "train.cuda_graphs=off";
    return 0;
  }
  if (unsupported && strcmp(mode, "on") == 0)
    return error_set(err,
                     "train.cuda_graphs=on, but the step cannot be a CUDA graph here: %s\n"
                     "HINT: set train.cuda_graphs=auto (on wherever it is supported) or off",
                     unsupported);
  g->on = !unsupported;
  g->why_off = unsupported;
  return 0;
}

void step_graphs_auto_off(StepGraphs *g, const char *mode, const char *why) {
  if (strcmp(mode, "auto") != 0 || !g->on) return;
  g->on = false;
  g->why_off = why;
}

void step_graphs_destroy(StepGraphs *g, Backend *be) {
  for (int i = 0; i < g->num_entries; i++)
    if (g->entries[i].graph) be->ops->graph_destroy(be, g->entries[i].graph);
  g->num_entries = 0;
}

static bool same_key(const StepGraphKey *a, const StepGraphKey *b) {
  return a->images == b->images && a->images_dtype == b->images_dtype && a->labels == b->labels &&
         a->soft_targets == b->soft_targets && a->B == b->B && a->part == b->part &&
         a->variant == b->variant;
}

// Records learner_run into a graph; NULL (and err) when the backend could not capture it, in
// which case none of it has run.
static void *capture_step(Model *m, Optimizer *o, const Config *cfg, Normalize norm,
                          const StepBatch *batch, int B, StepPart part, int64_t *nodes,
                          Error *err) {
  Backend *be = m->be;
  if (be->ops->graph_begin(be, err) != 0) return NULL;
  learner_run(m, o, cfg, norm, batch, B, part);
  return be->ops->graph_end(be, nodes, err);
}

int step_graphs_step(StepGraphs *g, Model *m, Optimizer *o, const Config *cfg, Normalize norm,
                     const StepBatch *batch, int B, StepPart part, Error *err) {
  Backend *be = m->be;
  StepGraphKey key = {.images = batch->images,
                      .images_dtype = batch->images_dtype,
                      .labels = batch->labels,
                      .soft_targets = batch->soft_targets,
                      .B = B,
                      .part = part,
                      .variant = g->variant};
  int i = 0;
  while (i < g->num_entries && !same_key(&g->entries[i].key, &key)) i++;
  bool known = i < g->num_entries;
  if (!g->on || g->paused || !known) {
    // The first step of a key runs plainly (and makes what is made on first use); so does every
    // step of a key beyond the graphs kept.
    if (g->on && !known && g->num_entries < STEP_GRAPHS_MAX) g->entries[g->num_entries++].key = key;
    learner_run(m, o, cfg, norm, batch, B, part);
    g->plain++;
    return 0;
  }
  if (!g->entries[i].graph) {
    Error why;
    void *graph = capture_step(m, o, cfg, norm, batch, B, part, &g->nodes, &why);
    if (!graph) {
      step_graphs_destroy(g, be);
      g->on = false;
      g->why_off = "a capture failed";
      if (g->launched)
        return error_set(err,
                         "train.cuda_graphs: capturing the data-parallel training step failed "
                         "(%s)\nHINT: train.cuda_graphs=off launches every kernel from the host",
                         why.msg);
      fprintf(stderr,
              "warning: train.cuda_graphs: capturing the training step failed (%s); the run "
              "goes on with every kernel launched from the host\n",
              why.msg);
      learner_run(m, o, cfg, norm, batch, B, part);  // nothing captured has run
      g->plain++;
      return 0;
    }
    g->entries[i].graph = graph;
    g->captured++;
  }
  NVTX_PUSH("step (CUDA graph)");
  be->ops->graph_launch(be, g->entries[i].graph);
  NVTX_POP();
  g->replayed++;
  return 0;
}

void step_graphs_describe(const StepGraphs *g, char *buf, size_t size) {
  int64_t parts = g->replayed + g->plain;
  const char *unit = g->accum > 1 ? "micro-batches" : "steps";
  if (g->captured > 0)
    snprintf(buf, size, "%s (%lld graph%s of %lld nodes; %lld of %lld %s replayed)",
             g->on ? "on" : "off after a failed capture", (long long)g->captured,
             g->captured > 1 ? "s" : "", (long long)g->nodes, (long long)g->replayed,
             (long long)parts, unit);
  else if (g->on && g->accum > 1)
    snprintf(buf, size,
             "on (train.accum_steps = %d: a micro-batch before the last and the last one with the "
             "update are two graphs, each captured at its second use, then replayed)",
             g->accum);
  else if (g->on)
    snprintf(buf, size,
             "on (the training step is captured at the second step on each batch buffer, then "
             "replayed)");
  else
    snprintf(buf, size, "off (%s)", g->why_off ? g->why_off : "unsupported");
}
