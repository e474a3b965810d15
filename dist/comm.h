// comm.h: the communicator of a training job: which process this is (rank, world, local rank on
// its node), and the collectives the trainer needs on host memory (all-reduce of float gradients
// and of a few double metrics, broadcast, barrier), with MPI underneath.
//
// Launched by mpirun or srun, comm_init initializes MPI; otherwise it makes a single-process
// communicator (world 1) and never calls MPI, so swin_train runs as one process without any MPI
// runtime. Every collective returns an error naming the rank; a process that cannot go on ends
// the whole job with comm_abort (MPI_Abort) rather than leave its peers waiting in a collective.
// The communicator is a plain struct passed explicitly: MPI's own state is the only global.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "src/base/util.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { COMM_SUM, COMM_AVG, COMM_MAX, COMM_MIN } CommOp;

typedef struct {
  int rank, world;              // this process in the job, and the job's process count
  int local_rank, local_world;  // the same among the processes of this node (shared memory)
  bool mpi;                     // MPI is in use (a launcher started the job)
  bool owns_mpi;                // comm_init initialized MPI, so comm_finalize finalizes it
  char launcher[32];            // the environment variable that showed the launcher, or ""
  // Elements (or bytes, for broadcast) per MPI call: MPI counts are int, so longer ranges go in
  // pieces. comm_init sets 2^30; tests lower it to exercise the pieces.
  int64_t max_message;
} Comm;

// The environment variable by which a launcher announces the job (OMPI_COMM_WORLD_SIZE from
// Open MPI's mpirun, PMI_SIZE from MPICH/Hydra or srun --mpi=pmi2, PMIX_RANK from PMIx launchers,
// SLURM_STEP_NUM_TASKS from srun), or NULL when the process was started on its own. sbatch's
// batch script sets SLURM_PROCID but is not a job step, so SLURM_PROCID alone does not count.
const char *comm_detect_launcher(void);

// Under a launcher: MPI_Init_thread (MPI_THREAD_FUNNELED: only the main thread calls MPI),
// rank and world of MPI_COMM_WORLD, the local rank from a shared-memory split, and MPI errors
// returned rather than fatal. Refuses a world that differs from the launcher's process count
// (a program built against one MPI and started by another's mpirun would otherwise run world
// copies of a one-process job side by side). Without a launcher: rank 0 of 1, no MPI call.
int comm_init(Comm *c, Error *err);
// MPI_Finalize when comm_init initialized MPI (every rank must call it).
int comm_finalize(Comm *c, Error *err);

// In-place all-reduce over every rank of data (count elements). COMM_AVG is the sum divided by
// world. Every rank gets the same bits (tests/test_dist.c checks it on this MPI); the sum's
// order is MPI's, so it matches a single-process sum only to float rounding.
int comm_allreduce_floats(Comm *c, float *data, int64_t count, CommOp op, Error *err);
int comm_allreduce_doubles(Comm *c, double *data, int64_t count, CommOp op, Error *err);
// Copies bytes from root's data into every other rank's data.
int comm_broadcast(Comm *c, void *data, int64_t bytes, int root, Error *err);
int comm_barrier(Comm *c, Error *err);

// Ends the whole job: prints message to stderr with every line prefixed "rank R: " (plain in a
// single process), flushes stdout and stderr, then MPI_Abort(1) (exit(1) without MPI). For
// main() only: library code returns errors.
void comm_abort(const Comm *c, const char *message) __attribute__((noreturn));

// The CUDA device of this process, given how many it sees: its local rank, so the processes of
// a node take devices 0..local_world-1. One visible device is taken as the launcher's binding of
// one GPU per process (srun --gpus-per-task=1, CUDA_VISIBLE_DEVICES set per rank); whether two
// processes of a node then share it is for comm_check_distinct_devices. Otherwise more local
// processes than devices is an error that says how to launch.
int comm_pick_device(const Comm *c, int visible_devices, int *device, Error *err);
// Fails, naming the ranks, when two processes of a node report the same device_id (e.g. a PCI bus
// id): NCCL cannot put two ranks on one GPU. Collective over every rank.
int comm_check_distinct_devices(Comm *c, const char *device_id, Error *err);

#ifdef __cplusplus
}
#endif
