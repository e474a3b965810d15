// nccl.h: the GPU side of the communicator: this process's CUDA device, one NCCL communicator per
// process (its unique id sent from rank 0 over MPI), and the in-place all-reduce of a device range
// of fp32 gradients on a CUDA stream, carried in fp32 or in bf16 (dist.reduce_dtype).
//
// A dead or stuck peer must end the job, not hang it: the communicator is non-blocking, and every
// NCCL call and every wait for a stream that carries NCCL work polls ncclCommGetAsyncError with a
// timeout. On an NCCL error or a timeout the communicator is aborted (ncclCommAbort) and the call
// returns an error that names the rank, for main() to end the job with comm_abort. So the trainer
// waits for streams with NCCL work only through nccl_wait, never cudaStreamSynchronize.
//
// Built when CMake finds NCCL (SWIN_HAVE_NCCL).
#pragma once
#include <stdint.h>

#include "dist/comm.h"
#include "src/base/util.h"

#ifdef SWIN_HAVE_NCCL
#include <cuda_runtime.h>  // outside the extern "C" block: it declares C++ templates

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  REDUCE_FP32,  // exact transport; the sum in NCCL's order
  REDUCE_BF16,  // half the bytes: gradients rounded to bf16, summed in bf16, widened back
} ReduceDtype;

// "fp32" or "bf16" (Config.reduce_dtype) as a ReduceDtype.
ReduceDtype reduce_dtype_from_name(const char *name);

typedef struct NcclComm NcclComm;

// Picks (comm_pick_device over cudaGetDeviceCount) and sets this process's CUDA device, then
// checks with every rank that no two processes of a node got the same GPU (by PCI bus id).
// Collective over every rank.
int nccl_select_device(Comm *c, int *device, Error *err);

// Rank 0 draws the NCCL unique id, comm_broadcast sends it, and every rank joins the NCCL
// communicator of the job (world ranks, MPI's numbering) on the current CUDA device. timeout_s
// bounds the creation and every later call and wait. max_bf16_count: the largest range that
// nccl_allreduce will carry in bf16 (its scratch is allocated here; 0 when only fp32 is used).
// Collective over every rank.
int nccl_comm_create(NcclComm **nc, Comm *c, double timeout_s, int64_t max_bf16_count, Error *err);
// Sets the timeout of later calls and waits: creation and the first collectives (connections)
// may need longer than a step's all-reduce should ever take.
void nccl_set_timeout(NcclComm *nc, double timeout_s);
// Frees the communicator (aborting it if an error left NCCL work pending).
void nccl_comm_destroy(NcclComm *nc);

// In-place all-reduce of data (count device floats) on stream: COMM_SUM, COMM_AVG (sum / world),
// COMM_MAX or COMM_MIN. REDUCE_BF16 rounds to bf16 (round to nearest even) into the scratch,
// reduces there and widens back into data (the average divides in fp32); the communicator has
// one scratch, so its bf16 all-reduces must all go to one stream, whose order protects it.
// Enqueues only: the result is ready when stream reaches it (nccl_wait, or an event for other
// streams).
int nccl_allreduce(NcclComm *nc, float *data, int64_t count, CommOp op, ReduceDtype dtype,
                   cudaStream_t stream, Error *err);
// The same after making stream wait for ready (an event recorded when backward has written the
// range), so a communication stream reduces a bucket while the compute stream goes on.
int nccl_allreduce_after(NcclComm *nc, cudaEvent_t ready, float *data, int64_t count, CommOp op,
                         ReduceDtype dtype, cudaStream_t stream, Error *err);

// Waits until stream has finished everything enqueued so far, polling for NCCL errors; fails
// after the communicator's timeout (a peer that died or stopped calling the collective), having
// aborted the communicator.
int nccl_wait(NcclComm *nc, cudaStream_t stream, Error *err);
// Waits until event has completed, polling for NCCL errors and bounded by the timeout, like
// nccl_wait: for a host wait on work that depends on NCCL work (an event recorded on the stream
// that carries it, or on a stream that waits for it) without waiting for everything queued since.
int nccl_wait_event(NcclComm *nc, cudaEvent_t event, Error *err);
// One non-blocking look for an asynchronous NCCL error (e.g. once per step).
int nccl_check(NcclComm *nc, Error *err);

#ifdef __cplusplus
}
#endif
#endif  // SWIN_HAVE_NCCL
