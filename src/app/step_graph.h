// step_graph.h: the training step as a CUDA graph (train.cuda_graphs): captured once per batch
// buffer, then replayed at every step, so the ~490 kernels of a Swin-T step (cuBLASLt's
// included) cost the host one launch instead of one each, and the GPU no gap between them.
//
// What is captured: learner_step (src/app/learner.h), i.e. forward, loss, backward and the
// optimizer update, every op from the patch embedding's input to AdamW's compute copy (and the
// update of the weights' moving average, which reads its decay from the optimizer state on the
// device), all on the compute queue. What the caller queues plainly around each step: the
// step's values (learner_set_step: index and learning rate, copied from page-locked memory to
// where the ops read them), the compute queue's wait for the batch's upload (stage_consume) and
// the slot's release after the step (stage_release), and the per-batch augmentations
// (images_normalize + batch_augment, whose parameters are drawn on the host for each batch and
// passed by value), which write the fixed buffer the captured step reads.
//
// A replay repeats the recorded ops with the arguments they were given (pointers, sizes and the
// constants of a run, such as AdamW's betas), reading their inputs anew from memory: so a graph
// serves one batch buffer, batch size and first sample (StepGraphKey). The trainer alternates
// two staging slots and keeps two graphs; the benchmark's resident batch needs one. A key is
// captured the second time it is seen: its first step runs plainly, so that what is made on
// first use (cuBLASLt's plans, kernel attributes) exists before a capture, inside which nothing
// may allocate or wait. Results are bitwise those of plain launches: the same kernels with the
// same arguments in the same order on the same stream.
//
// Under a launcher (data parallel) the step is captured too: the gradient reducer's bucket
// events, the communication stream's NCCL all-reduces and the join before the update are
// recorded with it (dist/reducer.h), and what the host does per step (errors, the bounded waits)
// stays outside, in grad_reducer_finish_step. Whether an NCCL call is captured must be the same
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

// Everything a captured step was given that may differ between calls of learner_step.
typedef struct {
  const void *images;
  DType images_dtype;
  const int *labels;
  const float *soft_targets;
  int B;
  int64_t first_sample;
  int variant;
} StepGraphKey;

typedef struct {
  bool on;              // capture and replay (train.cuda_graphs resolved); off after a failure
  bool paused;          // while set, steps run plainly
  bool launched;        // under a launcher: a failed capture is an error, not a fallback
  int variant;          // the caller's variant of the step, part of the key (the benchmark's
                        // step without its gradient all-reduce is another graph)
  const char *why_off;  // when not on: why, for the log
  struct {
    StepGraphKey key;
    void *graph;  // the backend's graph; NULL until the key's second step
  } entries[STEP_GRAPHS_MAX];
  int num_entries;
  int64_t captured, replayed, plain;  // graphs captured; steps replayed; steps run plainly
  int64_t nodes;                      // nodes of the last graph captured
} StepGraphs;

// Resolves train.cuda_graphs (`mode`: auto, on or off) for a run on be; launched: the process
// was started by a launcher (data parallel: a failed capture ends the run). auto is on where
// supported, on insists (an error saying why not, with a HINT), off never captures.
int step_graphs_init(StepGraphs *g, const Backend *be, const char *mode, bool launched, Error *err);
// Where train.cuda_graphs is auto, turns graphs off for the reason `why` (printed by
// step_graphs_describe); on and off are left as they are.
void step_graphs_auto_off(StepGraphs *g, const char *mode, const char *why);
// Frees the graphs (before the memory they name: the model, the optimizer, the batch buffers).
void step_graphs_destroy(StepGraphs *g, Backend *be);
// learner_step(m, o, cfg, norm, batch, B, first_sample): a replay of batch's graph when there is
// one, else plain launches (capturing the graph at the key's second step). Queued; nothing waits.
// Fails (err set, nothing of the step queued) only under a launcher, when a capture fails.
int step_graphs_step(StepGraphs *g, Model *m, Optimizer *o, const Config *cfg, Normalize norm,
                     const StepBatch *batch, int B, int64_t first_sample, Error *err);
// One line for the log: "on (2 graphs of 497 nodes; 98 of 100 steps replayed)" or "off (why)".
void step_graphs_describe(const StepGraphs *g, char *buf, size_t size);
