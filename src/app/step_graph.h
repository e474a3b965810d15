// step_graph.h: the training step as a CUDA graph (train.cuda_graphs): captured once per batch
// buffer, then replayed at every step, so the ~490 kernels of a Swin-T step (cuBLASLt's
// included) cost the host one launch instead of one each, and the GPU no gap between them.
//
// What is captured: a part of a step (learner_run, src/app/learner.h): with train.accum_steps 1
// the whole step, i.e. forward, loss, backward and the optimizer update, every op from the patch
// embedding's input to AdamW's compute copy (and the update of the weights' moving average,
// which reads its decay from the optimizer state on the device), all on the compute queue; with
// accum_steps N > 1 a micro-batch before the last (forward, loss, backward adding to the
// gradients) and the last one (the same, then the update): two graphs, the first replayed N - 1
// times a step. What the caller queues plainly around each part: the part's values
// (learner_set_step: index, learning rate and first sample, copied from page-locked memory to
// where the ops read them), the compute queue's wait for the batch's upload (stage_consume) and
// the slot's release after the step (stage_release), the per-batch augmentations
// (images_normalize + batch_augment, whose parameters are drawn on the host for each batch and
// passed by value), which write the fixed buffer the captured step reads, and with accum_steps >
// 1 the zeroing of the gradients before the first micro-batch and the copy of each
// micro-batch's labels (and pixels or soft targets) into the fixed buffers its graph reads.
//
// A replay repeats the recorded ops with the arguments they were given (pointers, sizes and the
// constants of a run, such as AdamW's betas), reading their inputs anew from memory: so a graph
// serves one batch buffer, batch size and part (StepGraphKey). The trainer alternates two staging
// slots and keeps two graphs (with accumulation, two parts on one set of micro-batch buffers);
// the benchmark's resident batch needs one (two with accumulation). A key is captured the second
// time it is seen: its first use runs plainly, so that what is made on first use (cuBLASLt's
// plans, kernel attributes) exists before a capture, inside which nothing may allocate or wait.
// Results are bitwise those of plain launches: the same kernels with the same arguments in the
// same order on the same stream.
//
// Under a launcher (data parallel) the step is captured too: the gradient reducer's bucket
// events, the communication stream's NCCL all-reduces and the join before the update are
// recorded with it (dist/reducer.h; with accumulation in the last micro-batch's graph only), and
// what the host does per step (errors, the bounded waits) stays outside, in
// grad_reducer_finish_step. Whether an NCCL call is captured must be the same
// on every rank: every rank sees the same keys at the same steps, and a capture that fails
// there is an error that ends the job (a rank falling back to plain launches alone would no
// longer match the others' graphs).
//
// Where graphs are not used: train.cuda_graphs=off; the CPU backend; while paused (the
// benchmark's profiled round, whose per-op timing events cannot be captured). In one process a
// capture that fails prints a warning saying why, and the run goes on with plain launches.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "src/app/learner.h"
#include "src/base/config.h"
#include "src/model/backend.h"
#include "src/model/model.h"

#define STEP_GRAPHS_MAX 4

// Everything a captured part was given that may differ between calls of learner_run.
typedef struct {
  const void *images;
  DType images_dtype;
  const int *labels;
  const float *soft_targets;
  int B;
  StepPart part;
  int variant;
} StepGraphKey;

typedef struct {
  bool on;              // capture and replay (train.cuda_graphs resolved); off after a failure
  bool paused;          // while set, steps run plainly
  bool launched;        // under a launcher: a failed capture is an error, not a fallback
  int accum;            // micro-batches per step (train.accum_steps): what the log counts
  int variant;          // the caller's variant of the step, part of the key (the benchmark's
                        // step without its gradient all-reduce is another graph)
  const char *why_off;  // when not on: why, for the log
  struct {
    StepGraphKey key;
    void *graph;  // the backend's graph; NULL until the key's second step
  } entries[STEP_GRAPHS_MAX];
  int num_entries;
  int64_t captured, replayed, plain;  // graphs captured; parts replayed; parts run plainly
  int64_t nodes;                      // nodes of the last graph captured
} StepGraphs;

// Resolves train.cuda_graphs (`mode`: auto, on or off) for a run on be; launched: the process
// was started by a launcher (data parallel: a failed capture ends the run); accum: the
// micro-batches of a step (train.accum_steps). auto is on where supported, on insists (an error
// saying why not, with a HINT), off never captures.
int step_graphs_init(StepGraphs *g, const Backend *be, const char *mode, bool launched, int accum,
                     Error *err);
// Where train.cuda_graphs is auto, turns graphs off for the reason `why` (printed by
// step_graphs_describe); on and off are left as they are.
void step_graphs_auto_off(StepGraphs *g, const char *mode, const char *why);
// Frees the graphs (before the memory they name: the model, the optimizer, the batch buffers).
void step_graphs_destroy(StepGraphs *g, Backend *be);
// learner_run(m, o, cfg, norm, batch, B, part): a replay of the key's graph when there is one,
// else plain launches (capturing the graph at the key's second use). Queued; nothing waits.
// Fails (err set, nothing of the part queued) only under a launcher, when a capture fails.
int step_graphs_step(StepGraphs *g, Model *m, Optimizer *o, const Config *cfg, Normalize norm,
                     const StepBatch *batch, int B, StepPart part, Error *err);
// One line for the log: "on (2 graphs of 497 nodes; 98 of 100 steps replayed)" (with
// accumulation: "... of 400 micro-batches replayed") or "off (why)".
void step_graphs_describe(const StepGraphs *g, char *buf, size_t size);
