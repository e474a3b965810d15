// reducer.c: data-parallel gradient averaging (see reducer.h).
#define _POSIX_C_SOURCE 200809L  // setenv
#include "dist/reducer.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "dist/bucket.h"
#ifdef SWIN_HAVE_NCCL
#include "dist/nccl.h"
#include "src/base/cuda_util.h"
#endif

struct GradReducer {
  Comm *comm;
  GradBuffer g;         // tensors NULL after create
  GradBucket *buckets;  // (num_buckets) in the order backward finishes them
  int num_buckets;
  int next;     // the first bucket of this step not reduced yet
  bool failed;  // a reduction of this step failed; err says how
  Error err;
  bool skip;           // buckets are not reduced (grad_reducer_skip_reduction)
  bool profiling;      // each reduction is timed (grad_reducer_profile)
  double profiled_ms;  // the reductions timed and collected since the last report
#ifdef SWIN_HAVE_NCCL
  NcclComm *nccl;  // NULL on the CPU backend
  ReduceDtype dtype;
  cudaStream_t stream;  // the communication stream
  cudaEvent_t *ready;   // (num_buckets) recorded on the compute stream: the bucket is written
  cudaEvent_t joined;   // recorded on the communication stream after the step's last bucket;
                        // the compute stream waits for it before the update
  // Recorded on the compute stream after step s has been queued whole (its update included),
  // outside any captured graph, for the host's bounded waits: [s % 2].
  cudaEvent_t reduced[2];
  int64_t steps;  // steps finished (grad_reducer_finish_step calls)
  // Profiling: a pair of timing events around each reduction on the communication stream,
  // collected when the pool is full or at a report.
  cudaEvent_t *marks;  // (2 * PROFILE_MARKS), created when profiling first starts
  int num_marks;
#endif
};

#define PROFILE_MARKS 256

int dist_select_device(Comm *c, bool cuda, Error *err) {
  if (!c->mpi || !cuda) return 0;
#if defined(SWIN_HAVE_NCCL)
  // NVLink multicast (NVLS) can take a shared machine's GPUs out of service; it stays off unless
  // the user turns it on (NCCL_NVLS_ENABLE=1).
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  int device;
  return nccl_select_device(c, &device, err);
#elif defined(SWIN_HAVE_CUDA)
  return error_set(err,
                   "rank %d: distributed training on the GPU needs NCCL, and this build has none\n"
                   "HINT: install NCCL (it comes with the CUDA toolkit or as libnccl-dev) and "
                   "rebuild, or set device=cpu",
                   c->rank);
#else
  (void)err;
  return 0;  // backend_create says that this build has no CUDA backend
#endif
}

#ifdef SWIN_HAVE_NCCL
// Adds up the timed pairs on the communication stream, after a bounded wait for the last one.
static int collect_marks(GradReducer *r, Error *err) {
  if (r->num_marks == 0) return 0;
  if (nccl_wait_event(r->nccl, r->marks[2 * r->num_marks - 1], err) != 0) return -1;
  for (int i = 0; i < r->num_marks; i++) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, r->marks[2 * i], r->marks[2 * i + 1]));
    r->profiled_ms += ms;
  }
  r->num_marks = 0;
  return 0;
}

// Queues bucket k's all-reduce on the communication stream behind the ready event; when
// profiling, between two timing events: the first completes when the stream takes up the bucket
// (backward has written it and the bucket before it is reduced), the second when its kernels
// (with bf16, the conversions too) have run.
static int reduce_bucket_nccl(GradReducer *r, int k, float *data, int64_t count) {
  r->g.record_event(r->g.queue, r->ready[k]);
  CUDA_CHECK(cudaStreamWaitEvent(r->stream, r->ready[k], 0));
  if (r->skip) return 0;
  cudaEvent_t *mark = NULL;
  if (r->profiling) {
    if (r->num_marks == PROFILE_MARKS && collect_marks(r, &r->err) != 0) return -1;
    mark = &r->marks[2 * r->num_marks++];
    CUDA_CHECK(cudaEventRecord(mark[0], r->stream));
  }
  int rc = nccl_allreduce(r->nccl, data, count, COMM_AVG, r->dtype, r->stream, &r->err);
  if (mark) CUDA_CHECK(cudaEventRecord(mark[1], r->stream));
  return rc;
}
#endif

// Averages bucket k over every rank: at once on the CPU; on the GPU, queued on the communication
// stream behind an event that marks the end of the compute stream's work so far. With skip, the
// same ordering without the reduction.
static int reduce_bucket(GradReducer *r, int k) {
  const GradBucket *b = &r->buckets[k];
  float *data = r->g.grads + b->offset;
#ifdef SWIN_HAVE_NCCL
  if (r->nccl) return reduce_bucket_nccl(r, k, data, b->count);
#endif
  if (r->skip) return 0;
  double start = r->profiling ? time_now_s() : 0;
  int rc = comm_allreduce_floats(r->comm, data, b->count, COMM_AVG, &r->err);
  if (r->profiling) r->profiled_ms += 1e3 * (time_now_s() - start);
  return rc;
}

// Buckets are numbered from the end of the buffer down, as backward finishes them. The compute
// queue's wait for the communication stream after the last is the join of a captured step; only
// device work is queued here, so a captured step holds all of it.
void grad_reducer_grads_ready(void *reducer, int64_t lowest) {
  GradReducer *r = reducer;
  while (!r->failed && r->next < r->num_buckets && r->buckets[r->next].offset >= lowest) {
    if (reduce_bucket(r, r->next) != 0) r->failed = true;
    r->next++;
  }
  if (lowest > 0) return;
  r->next = 0;
#ifdef SWIN_HAVE_NCCL
  if (r->nccl) {
    cudaError_t e = cudaEventRecord(r->joined, r->stream);
    if (e != cudaSuccess && !r->failed) {
      r->failed = true;
      error_set(&r->err, "rank %d: the end of the step's all-reduce: %s", r->comm->rank,
                cudaGetErrorString(e));
    }
    r->g.wait_event(r->g.queue, r->joined);
  }
#endif
}

#ifdef SWIN_HAVE_NCCL
static int create_nccl(GradReducer *r, Comm *c, const Config *cfg, Error *err) {
  r->dtype = reduce_dtype_from_name(cfg->reduce_dtype);
  int64_t largest = 0;
  for (int k = 0; k < r->num_buckets; k++)
    if (r->buckets[k].count > largest) largest = r->buckets[k].count;
  if (nccl_comm_create(&r->nccl, c, cfg->timeout_s, r->dtype == REDUCE_BF16 ? largest : 0, err) !=
      0)
    return -1;
  // The highest priority: the all-reduce kernels get SMs as soon as some free up between
  // backward's kernels, instead of after every kernel queued before them.
  int least, greatest;
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  CUDA_CHECK(cudaStreamCreateWithPriority(&r->stream, cudaStreamNonBlocking, greatest));
  r->ready = calloc_check((size_t)r->num_buckets, sizeof(cudaEvent_t));
  for (int k = 0; k < r->num_buckets; k++)
    CUDA_CHECK(cudaEventCreateWithFlags(&r->ready[k], cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&r->joined, cudaEventDisableTiming));
  for (int k = 0; k < 2; k++)
    CUDA_CHECK(cudaEventCreateWithFlags(&r->reduced[k], cudaEventDisableTiming));
  return 0;
}
#endif

int grad_reducer_create(GradReducer **out, Comm *c, const GradBuffer *g, const Config *cfg,
                        Error *err) {
  *out = NULL;
  bool cuda = g->queue != NULL;
  if (!cuda && strcmp(cfg->reduce_dtype, "bf16") == 0)
    return error_set(err,
                     "rank %d: dist.reduce_dtype = bf16 needs the GPU all-reduce (NCCL), but this "
                     "run is on the CPU\nHINT: set dist.reduce_dtype=fp32",
                     c->rank);
  GradReducer *r = calloc_check(1, sizeof *r);
  r->comm = c;
  r->g = *g;
  r->g.tensors = NULL;
  if (bucket_plan_tensors(g->tensors, g->num_tensors, g->grads, g->num_floats, cfg->bucket_mb,
                          &r->buckets, &r->num_buckets, err) != 0) {
    free(r);
    return -1;
  }
  if (cuda) {
#ifdef SWIN_HAVE_NCCL
    if (create_nccl(r, c, cfg, err) != 0) {
      grad_reducer_destroy(r);
      return -1;
    }
#else
    grad_reducer_destroy(r);
    return error_set(err,
                     "rank %d: distributed training on the GPU needs NCCL, and this build "
                     "has none\nHINT: rebuild with NCCL, or set device=cpu",
                     c->rank);
#endif
  }
  *out = r;
  return 0;
}

void grad_reducer_destroy(GradReducer *r) {
  if (!r) return;
#ifdef SWIN_HAVE_NCCL
  if (r->nccl) nccl_comm_destroy(r->nccl);
  for (int k = 0; r->ready && k < r->num_buckets; k++) cudaEventDestroy(r->ready[k]);
  if (r->joined) cudaEventDestroy(r->joined);
  for (int k = 0; k < 2; k++)
    if (r->reduced[k]) cudaEventDestroy(r->reduced[k]);
  for (int i = 0; r->marks && i < 2 * PROFILE_MARKS; i++) cudaEventDestroy(r->marks[i]);
  if (r->stream) cudaStreamDestroy(r->stream);
  free(r->ready);
  free(r->marks);
#endif
  free(r->buckets);
  free(r);
}

int grad_reducer_num_buckets(const GradReducer *r) {
  return r->num_buckets;
}

int grad_reducer_finish_step(GradReducer *r, Error *err) {
  if (r->failed) {
    r->failed = false;
    return error_set(err, "%s", r->err.msg);
  }
#ifdef SWIN_HAVE_NCCL
  if (r->nccl) {
    r->g.record_event(r->g.queue, r->reduced[r->steps % 2]);
    r->steps++;
    return nccl_check(r->nccl, err);
  }
#endif
  (void)err;
  return 0;
}

int grad_reducer_sync(GradReducer *r, Error *err) {
#ifdef SWIN_HAVE_NCCL
  // The communication stream holds the reductions of steps launched plainly; a replayed graph
  // runs its own on the compute stream, which the last step's event follows.
  if (r->nccl) {
    if (nccl_wait(r->nccl, r->stream, err) != 0) return -1;
    if (r->steps > 0) return nccl_wait_event(r->nccl, r->reduced[(r->steps - 1) % 2], err);
  }
#endif
  (void)r;
  (void)err;
  return 0;
}

int grad_reducer_sync_previous(GradReducer *r, Error *err) {
#ifdef SWIN_HAVE_NCCL
  // The last step's event is reduced[(steps - 1) % 2]; the one before it, reduced[steps % 2].
  if (r->nccl && r->steps >= 2) return nccl_wait_event(r->nccl, r->reduced[r->steps % 2], err);
#endif
  (void)r;
  (void)err;
  return 0;
}

void grad_reducer_skip_reduction(GradReducer *r, bool skip) {
  r->skip = skip;
}

void grad_reducer_profile(GradReducer *r, bool on) {
#ifdef SWIN_HAVE_NCCL
  if (on && r->nccl && !r->marks) {
    r->marks = calloc_check(2 * PROFILE_MARKS, sizeof(cudaEvent_t));
    for (int i = 0; i < 2 * PROFILE_MARKS; i++) CUDA_CHECK(cudaEventCreate(&r->marks[i]));
  }
#endif
  r->profiling = on;
}

int grad_reducer_profile_report(GradReducer *r, double *ms, Error *err) {
#ifdef SWIN_HAVE_NCCL
  if (r->nccl && collect_marks(r, err) != 0) return -1;
#endif
  (void)err;
  *ms = r->profiled_ms;
  r->profiled_ms = 0;
  return 0;
}
