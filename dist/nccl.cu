// nccl.cu: the NCCL communicator of dist/nccl.h: device choice, creation from an id sent over MPI,
// in-place all-reduce of fp32 device ranges (in fp32 or through a bf16 scratch), and every wait
// bounded by a timeout with ncclCommGetAsyncError polled on the way.
#include <cuda_bf16.h>
#include <nccl.h>

#include <cstdio>
#include <cstring>
#include <ctime>

extern "C" {
#include "src/base/util.h"  // util.c is C and its header declares no C linkage of its own
}
#include "dist/nccl.h"
#include "src/base/cuda_util.h"

struct NcclComm {
  ncclComm_t comm;
  int rank, world;
  double timeout_s;
  __nv_bfloat16 *scratch;  // (scratch_count) bf16 copy of the range being reduced
  int64_t scratch_count;
  bool aborted;  // after an error or a timeout: nothing may be enqueued any more
};

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;
// Between two polls of a stream or of NCCL's state: short next to a bucket's all-reduce
// (hundreds of microseconds and up), long enough not to keep a core spinning.
constexpr long kPollPauseNs = 50 * 1000;

// Grid-stride conversions. Neighbouring threads touch neighbouring elements, so every access is
// coalesced whatever the alignment of the range (buckets start at tensor boundaries).
__global__ void float_to_bf16(__nv_bfloat16 *__restrict__ out, const float *__restrict__ in,
                              int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    out[i] = __float2bfloat16_rn(in[i]);
}

// divisor: 1 for a sum, world for an average (divided in fp32, after the bf16 sum).
__global__ void bf16_to_float(float *__restrict__ out, const __nv_bfloat16 *__restrict__ in,
                              int64_t n, float divisor) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    out[i] = __bfloat162float(in[i]) / divisor;
}

unsigned blocks_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  return (unsigned)(b < 1 ? 1 : b > kMaxBlocks ? kMaxBlocks : b);
}

void pause_briefly() {
  struct timespec ts = {0, kPollPauseNs};
  nanosleep(&ts, nullptr);
}

void abort_comm(NcclComm *nc) {
  if (nc->aborted) return;
  nc->aborted = true;
  if (nc->comm) ncclCommAbort(nc->comm);
}

const char *nccl_hint(ncclResult_t r) {
  switch (r) {
    case ncclRemoteError:
      return "a peer failed or went away; its rank's own message, if any, is above";
    case ncclSystemError:
      return "a system call or the network failed; NCCL_DEBUG=WARN shows which";
    case ncclInvalidUsage:
      return "NCCL refused how it was called (two ranks on one GPU?); NCCL_DEBUG=WARN says why";
    default:
      return "NCCL_DEBUG=WARN in the environment makes NCCL say more";
  }
}

int nccl_failed(NcclComm *nc, ncclResult_t r, const char *what, Error *err) {
  const char *detail = nc->comm ? ncclGetLastError(nc->comm) : "";
  abort_comm(nc);
  return error_set(err, "rank %d: NCCL %s failed: %s%s%s\nHINT: %s", nc->rank, what,
                   ncclGetErrorString(r), detail && detail[0] ? ": " : "", detail ? detail : "",
                   nccl_hint(r));
}

int timed_out(NcclComm *nc, const char *what, Error *err) {
  abort_comm(nc);
  return error_set(err,
                   "rank %d: NCCL %s did not finish within %.1f s\n"
                   "HINT: another rank has probably died or stopped at a different step (look "
                   "for its message); NCCL_DEBUG=WARN shows NCCL's view",
                   nc->rank, what, nc->timeout_s);
}

int check_usable(NcclComm *nc, const char *what, Error *err) {
  if (!nc->aborted) return 0;
  return error_set(err, "rank %d: NCCL %s on a communicator aborted after an earlier error",
                   nc->rank, what);
}

// The asynchronous error state once: 0 while healthy (or still in progress).
int poll_async(NcclComm *nc, const char *what, ncclResult_t *state, Error *err) {
  ncclResult_t r = ncclCommGetAsyncError(nc->comm, state);
  if (r != ncclSuccess) return nccl_failed(nc, r, what, err);
  if (*state != ncclSuccess && *state != ncclInProgress) return nccl_failed(nc, *state, what, err);
  return 0;
}

// A call on the non-blocking communicator may return ncclInProgress while NCCL finishes setting
// it up (creation, connections at a first collective); it is done when the async state leaves
// ncclInProgress.
int settle(NcclComm *nc, ncclResult_t r, const char *what, Error *err) {
  if (r != ncclSuccess && r != ncclInProgress) return nccl_failed(nc, r, what, err);
  double start = time_now_s();
  while (r == ncclInProgress) {
    if (time_now_s() - start > nc->timeout_s) return timed_out(nc, what, err);
    pause_briefly();
    if (poll_async(nc, what, &r, err) != 0) return -1;
  }
  return 0;
}

ncclRedOp_t nccl_op(CommOp op) {
  switch (op) {
    case COMM_AVG:
      return ncclAvg;
    case COMM_MAX:
      return ncclMax;
    case COMM_MIN:
      return ncclMin;
    case COMM_SUM:
      break;
  }
  return ncclSum;
}

int allreduce_bf16(NcclComm *nc, float *data, int64_t count, CommOp op, cudaStream_t stream,
                   Error *err) {
  if (count > nc->scratch_count)
    return error_set(err,
                     "rank %d: bf16 all-reduce of %lld floats, but the communicator's bf16 "
                     "scratch holds %lld\nHINT: create it with max_bf16_count >= the largest "
                     "bucket",
                     nc->rank, (long long)count, (long long)nc->scratch_count);
  float_to_bf16<<<blocks_for(count), kThreads, 0, stream>>>(nc->scratch, data, count);
  CUDA_CHECK_LAUNCH();
  // The average divides after the sum, in fp32: an ncclAvg in bf16 would round once more.
  ncclRedOp_t o = op == COMM_AVG ? ncclSum : nccl_op(op);
  ncclResult_t r =
      ncclAllReduce(nc->scratch, nc->scratch, (size_t)count, ncclBfloat16, o, nc->comm, stream);
  if (settle(nc, r, "bf16 all-reduce", err) != 0) return -1;
  float divisor = op == COMM_AVG ? (float)nc->world : 1.0f;
  bf16_to_float<<<blocks_for(count), kThreads, 0, stream>>>(data, nc->scratch, count, divisor);
  CUDA_CHECK_LAUNCH();
  return 0;
}

}  // namespace

ReduceDtype reduce_dtype_from_name(const char *name) {
  return strcmp(name, "bf16") == 0 ? REDUCE_BF16 : REDUCE_FP32;
}

int nccl_select_device(Comm *c, int *device, Error *err) {
  int visible = 0;
  if (cudaGetDeviceCount(&visible) != cudaSuccess) visible = 0;
  if (comm_pick_device(c, visible, device, err) != 0) return -1;
  cudaError_t e = cudaSetDevice(*device);
  char bus_id[32] = "";
  if (e == cudaSuccess) e = cudaDeviceGetPCIBusId(bus_id, (int)sizeof bus_id, *device);
  if (e != cudaSuccess)
    return error_set(err, "rank %d: cannot use CUDA device %d: %s", c->rank, *device,
                     cudaGetErrorString(e));
  return comm_check_distinct_devices(c, bus_id, err);
}

int nccl_comm_create(NcclComm **out, Comm *c, double timeout_s, int64_t max_bf16_count,
                     Error *err) {
  *out = nullptr;
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  if (c->rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess)
      return error_set(err, "rank 0: ncclGetUniqueId failed: %s\nHINT: %s", ncclGetErrorString(r),
                       nccl_hint(r));
  }
  if (comm_broadcast(c, &id, (int64_t)sizeof id, 0, err) != 0) return -1;

  NcclComm *nc = (NcclComm *)calloc_check(1, sizeof *nc);
  nc->rank = c->rank;
  nc->world = c->world;
  nc->timeout_s = timeout_s;
  // Non-blocking: creation returns at once and is polled, so a peer that never joins ends in a
  // timeout instead of a hang; collectives then poll the same way.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&nc->comm, c->world, id, c->rank, &config);
  if (settle(nc, r, "communicator creation", err) != 0) {
    free(nc);
    return -1;
  }
  if (max_bf16_count > 0) {
    cudaError_t e = cudaMalloc(&nc->scratch, sizeof(__nv_bfloat16) * (size_t)max_bf16_count);
    if (e != cudaSuccess) {
      nccl_comm_destroy(nc);
      return error_set(err,
                       "rank %d: cannot allocate the bf16 all-reduce scratch (%lld elements): "
                       "%s\nHINT: lower dist.bucket_mb",
                       c->rank, (long long)max_bf16_count, cudaGetErrorString(e));
    }
    nc->scratch_count = max_bf16_count;
  }
  *out = nc;
  return 0;
}

void nccl_set_timeout(NcclComm *nc, double timeout_s) {
  nc->timeout_s = timeout_s;
}

void nccl_comm_destroy(NcclComm *nc) {
  if (!nc) return;
  if (!nc->aborted) {
    // Finalize flushes pending work (polled like any call), then destroy frees; an error or a
    // timeout on the way aborts instead.
    Error ignored;
    if (settle(nc, ncclCommFinalize(nc->comm), "finalize", &ignored) == 0)
      ncclCommDestroy(nc->comm);
  }
  if (nc->scratch) cudaFree(nc->scratch);
  free(nc);
}

int nccl_allreduce(NcclComm *nc, float *data, int64_t count, CommOp op, ReduceDtype dtype,
                   cudaStream_t stream, Error *err) {
  if (check_usable(nc, "all-reduce", err) != 0) return -1;
  if (count < 0)
    return error_set(err, "rank %d: all-reduce of %lld floats", nc->rank, (long long)count);
  if (count == 0) return 0;
  if (dtype == REDUCE_BF16) return allreduce_bf16(nc, data, count, op, stream, err);
  ncclResult_t r =
      ncclAllReduce(data, data, (size_t)count, ncclFloat32, nccl_op(op), nc->comm, stream);
  return settle(nc, r, "all-reduce", err);
}

int nccl_allreduce_after(NcclComm *nc, cudaEvent_t ready, float *data, int64_t count, CommOp op,
                         ReduceDtype dtype, cudaStream_t stream, Error *err) {
  CUDA_CHECK(cudaStreamWaitEvent(stream, ready, 0));
  return nccl_allreduce(nc, data, count, op, dtype, stream, err);
}

namespace {

// Polls query() (a stream's or an event's state) until it reports completion, looking for NCCL
// errors in between, for at most the communicator's timeout.
template <typename Query>
int wait_polling(NcclComm *nc, Query query, Error *err) {
  if (check_usable(nc, "wait", err) != 0) return -1;
  double start = time_now_s();
  for (;;) {
    cudaError_t q = query();
    if (q == cudaSuccess) return nccl_check(nc, err);
    if (q != cudaErrorNotReady)
      return error_set(err, "rank %d: CUDA error while waiting for NCCL work: %s", nc->rank,
                       cudaGetErrorString(q));
    ncclResult_t state;
    if (poll_async(nc, "all-reduce", &state, err) != 0) return -1;
    if (time_now_s() - start > nc->timeout_s) return timed_out(nc, "all-reduce", err);
    pause_briefly();
  }
}

}  // namespace

int nccl_wait(NcclComm *nc, cudaStream_t stream, Error *err) {
  return wait_polling(
      nc, [stream] { return cudaStreamQuery(stream); }, err);
}

int nccl_wait_event(NcclComm *nc, cudaEvent_t event, Error *err) {
  return wait_polling(
      nc, [event] { return cudaEventQuery(event); }, err);
}

int nccl_check(NcclComm *nc, Error *err) {
  if (check_usable(nc, "check", err) != 0) return -1;
  ncclResult_t state;
  return poll_async(nc, "all-reduce", &state, err);
}
