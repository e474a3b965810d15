// reducer.h: the gradient averaging of data-parallel training. After each backward every rank's
// gradient buffer holds the mean of all ranks' gradients, reduced bucket by bucket (bucket.h) as
// soon as backward has finished each bucket (grad_reducer_grads_ready, which the model calls as
// backward goes: src/app/reduce.h attaches the two), so the reduction of the upper layers'
// gradients overlaps the backward of the lower ones.
//
// CPU backend: each finished bucket is averaged at once with MPI (comm_allreduce_floats); the
// CPU's ops have run when they return, so that is all the ordering there is.
// CUDA backend (built with NCCL): each finished bucket's all-reduce is queued on a communication
// stream after an event recorded on the compute queue (GradBuffer.record_event), so it runs
// while the compute stream goes on with backward; the compute stream waits for the communication
// stream (wait_event) only before the optimizer reads the gradients. All of that is device work
// queued from inside backward (grad_reducer_grads_ready), so the trainer's CUDA graph of the step
// (src/app/step_graph.h) captures it with the rest; the host's part of a step (its errors, the
// events for the host waits) is grad_reducer_finish_step, after the step. The host never blocks on
// work that depends on another rank except through nccl_wait / nccl_wait_event, which end in an
// error naming the rank after dist.timeout_s instead of hanging on a dead or stuck peer.
//
// Every rank gets the same bits (MPI's and NCCL's all-reduce are deterministic and give every
// rank the same result), so the optimizer takes the same decision everywhere and the weights stay
// identical across ranks.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "dist/comm.h"
#include "src/base/config.h"
#include "src/base/tensor.h"
#include "src/base/util.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct GradReducer GradReducer;

// In a job started by a launcher, with cuda (the run's device is CUDA): takes this process's GPU
// from its local rank (nccl_select_device) before the backend is created, and turns NVLink
// multicast off in NCCL unless the environment says otherwise (NCCL_NVLS_ENABLE=0; see
// dist/README.md). Fails when this build has no NCCL. Collective over every rank.
int dist_select_device(Comm *c, bool cuda, Error *err);

// The gradients a reducer averages, as the model's backend holds them.
typedef struct {
  float *grads;  // one flat fp32 buffer (device memory with a queue)
  int64_t num_floats;
  const Tensor *tensors;  // (num_tensors) its tensors in forward order, views into grads; read
  int num_tensors;        // by grad_reducer_create only
  // The compute queue backward runs on (NULL on the CPU, whose ops have run when they return):
  // record_event(queue, e): e completes when the work queued so far there has run;
  // wait_event(queue, e): work queued there later waits for e (a cudaEvent_t, as void *).
  void *queue;
  void (*record_event)(void *queue, void *event);
  void (*wait_event)(void *queue, void *event);
} GradBuffer;

// Plans the buckets of g's buffer (dist.bucket_mb) and, with a queue, creates the NCCL
// communicator (dist.reduce_dtype, dist.timeout_s), the communication stream and its events.
// Collective over every rank.
int grad_reducer_create(GradReducer **out, Comm *c, const GradBuffer *g, const Config *cfg,
                        Error *err);
// Backward's report (the model's grads_ready, with the reducer as ctx): every gradient at or
// above float lowest_offset is final; reduces the buckets that lie wholly there and are not
// reduced yet. 0 comes last: then every bucket has been queued, and the compute queue waits for
// the communication stream before the update. Only device work is queued.
void grad_reducer_grads_ready(void *reducer, int64_t lowest_offset);
void grad_reducer_destroy(GradReducer *r);
int grad_reducer_num_buckets(const GradReducer *r);

// After a whole step (backward and update, plainly or as a replayed graph) has been queued: marks
// its end for the host waits below, returns the first error of the step's reductions (when they
// were queued, i.e. not replayed), then looks once for an asynchronous NCCL error. The
// reductions themselves and the compute queue's wait for them before the update were queued by
// backward (its last grads_ready report).
int grad_reducer_finish_step(GradReducer *r, Error *err);
// Host waits, bounded by dist.timeout_s. grad_reducer_sync: every reduction queued so far has
// run, and every step finished with grad_reducer_finish_step (before reading anything back from
// the device). grad_reducer_sync_previous: the step before the last one has run, its reductions
// included: enough before a host wait on a batch upload (which waits for the compute of two
// steps ago), and the host may still queue a step ahead of the GPU. Both return at once on the
// CPU.
int grad_reducer_sync(GradReducer *r, Error *err);
int grad_reducer_sync_previous(GradReducer *r, Error *err);

// ---- for the benchmark (src/app/bench.c), which measures what the reduction costs a step ----
// While skip is on, the buckets are not reduced (no NCCL or MPI call) and everything else stays
// as it is: the events on the compute stream, the communication stream's waits for them, the
// compute stream's wait before the optimizer, the host waits. So a step with skip on is the
// same step without its reduction, and the difference of the two step times is the time the
// reduction adds to the step. Each rank keeps its own gradients meanwhile (the ranks' weights
// drift apart): for timing only, never for training.
void grad_reducer_skip_reduction(GradReducer *r, bool skip);
// While on, every bucket's reduction is timed. On the GPU, by a pair of timing events on the
// communication stream around its all-reduce: from when the stream takes the bucket up (its
// backward part done, the bucket before it reduced) to the end of its kernels (with bf16, the
// conversions included); that includes a wait for SMs held by backward's kernels. On the CPU, by
// the host clock around the MPI call, which includes the wait for the other ranks to arrive.
void grad_reducer_profile(GradReducer *r, bool on);
// The milliseconds of the reductions timed since the last report, which it clears; waits (bounded
// like grad_reducer_sync) for the timed reductions to have run.
int grad_reducer_profile_report(GradReducer *r, double *ms, Error *err);

#ifdef __cplusplus
}
#endif
