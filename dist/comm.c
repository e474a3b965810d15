// comm.c: the communicator over MPI (see comm.h). Without a launcher nothing here calls MPI.
#define _POSIX_C_SOURCE 200809L
#include "dist/comm.h"

#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Longest device id comm_check_distinct_devices compares (a PCI bus id needs 13 characters).
#define DEVICE_ID_MAX 64

const char *comm_detect_launcher(void) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK",
                                     "SLURM_STEP_NUM_TASKS"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i]);
    if (v && v[0]) return vars[i];
  }
  return NULL;
}

// The process count the launcher announced, and the variable that says it; 0 when none does
// (PMIx announces no size). Open MPI's variable comes first: under an allocation, mpirun starts
// its daemons with srun, whose SLURM_STEP_NUM_TASKS then counts daemons, not ranks.
static int launcher_world(const char **var) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i]);
    if (!v || !v[0]) continue;
    char *end;
    long n = strtol(v, &end, 10);
    if (*end || n < 1 || n > INT_MAX) continue;
    *var = vars[i];
    return (int)n;
  }
  return 0;
}

static int mpi_error(const Comm *c, int code, const char *what, Error *err) {
  char text[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  MPI_Error_string(code, text, &len);
  return error_set(err,
                   "rank %d: %s failed: %s\n"
                   "HINT: another rank may have failed first; look for its message",
                   c->rank, what, text);
}

// The first line of MPI_Get_library_version, for messages about mismatched MPIs.
static void mpi_library_name(char *buf, size_t n) {
  char version[MPI_MAX_LIBRARY_VERSION_STRING] = "";
  int len = 0;
  MPI_Get_library_version(version, &len);
  snprintf(buf, n, "%.*s", (int)strcspn(version, "\n,"), version);
}

static int check_launcher_world(const Comm *c, Error *err) {
  const char *var = NULL;
  int expected = launcher_world(&var);
  if (expected == 0 || expected == c->world) return 0;
  char library[128];
  mpi_library_name(library, sizeof library);
  return error_set(err,
                   "rank %d: the launcher started %d processes (%s=%d) but MPI sees a job of %d\n"
                   "HINT: swin_train is built with %s; start it with that MPI's mpirun, or with "
                   "srun --mpi=pmix (or pmi2) where Slurm supports it",
                   c->rank, expected, var, expected, c->world, library);
}

static int init_node_ranks(Comm *c, Error *err) {
  MPI_Comm node;
  int rc = MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &node);
  if (rc != MPI_SUCCESS) return mpi_error(c, rc, "MPI_Comm_split_type (the local rank)", err);
  MPI_Comm_rank(node, &c->local_rank);
  MPI_Comm_size(node, &c->local_world);
  MPI_Comm_free(&node);
  return 0;
}

int comm_init(Comm *c, Error *err) {
  memset(c, 0, sizeof *c);
  c->world = c->local_world = 1;
  c->max_message = (int64_t)1 << 30;
  const char *launcher = comm_detect_launcher();
  if (!launcher) return 0;
  snprintf(c->launcher, sizeof c->launcher, "%s", launcher);

  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    // FUNNELED: the loader's threads never call MPI, only the main thread does.
    int provided = MPI_THREAD_SINGLE;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
      return error_set(err,
                       "MPI_Init_thread failed (a launcher was detected from %s=%s)\n"
                       "HINT: to run as one process outside a launcher, unset %s",
                       launcher, getenv(launcher), launcher);
    c->owns_mpi = true;
    if (provided < MPI_THREAD_FUNNELED) {
      c->mpi = true;
      return error_set(err,
                       "MPI provides thread level %d, below MPI_THREAD_FUNNELED\n"
                       "HINT: use an MPI built with thread support (Debian's Open MPI has it)",
                       provided);
    }
  }
  c->mpi = true;
  // Errors come back as return codes, so each becomes a message naming the rank and the call.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &c->world);
  if (check_launcher_world(c, err) != 0) return -1;
  return init_node_ranks(c, err);
}

int comm_finalize(Comm *c, Error *err) {
  if (!c->owns_mpi) return 0;
  c->owns_mpi = false;
  c->mpi = false;
  int rc = MPI_Finalize();
  if (rc != MPI_SUCCESS) return mpi_error(c, rc, "MPI_Finalize", err);
  return 0;
}

static MPI_Op mpi_op(CommOp op) {
  switch (op) {
    case COMM_MAX:
      return MPI_MAX;
    case COMM_MIN:
      return MPI_MIN;
    case COMM_SUM:
    case COMM_AVG:
      break;
  }
  return MPI_SUM;
}

// In-place MPI_Allreduce of count elements of elem_size bytes, in pieces of max_message.
static int allreduce(Comm *c, void *data, int64_t count, MPI_Datatype type, size_t elem_size,
                     CommOp op, const char *what, Error *err) {
  if (count < 0)
    return error_set(err, "rank %d: %s with a negative count (%lld)", c->rank, what,
                     (long long)count);
  if (!c->mpi) return 0;  // one process: its values are already the sum, average, max and min
  for (int64_t done = 0; done < count;) {
    int64_t left = count - done;
    int n = (int)(left < c->max_message ? left : c->max_message);
    int rc = MPI_Allreduce(MPI_IN_PLACE, (char *)data + (size_t)done * elem_size, n, type,
                           mpi_op(op), MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) {
      char call[128];
      snprintf(call, sizeof call, "%s (MPI_Allreduce of %lld elements)", what, (long long)count);
      return mpi_error(c, rc, call, err);
    }
    done += n;
  }
  return 0;
}

int comm_allreduce_floats(Comm *c, float *data, int64_t count, CommOp op, Error *err) {
  if (allreduce(c, data, count, MPI_FLOAT, sizeof(float), op, "all-reduce of floats", err) != 0)
    return -1;
  if (op == COMM_AVG && c->world > 1) {
    float world = (float)c->world;
    for (int64_t i = 0; i < count; i++) data[i] /= world;
  }
  return 0;
}

int comm_allreduce_doubles(Comm *c, double *data, int64_t count, CommOp op, Error *err) {
  if (allreduce(c, data, count, MPI_DOUBLE, sizeof(double), op, "all-reduce of doubles", err) != 0)
    return -1;
  if (op == COMM_AVG && c->world > 1)
    for (int64_t i = 0; i < count; i++) data[i] /= (double)c->world;
  return 0;
}

int comm_broadcast(Comm *c, void *data, int64_t bytes, int root, Error *err) {
  if (bytes < 0 || root < 0 || root >= c->world)
    return error_set(err, "rank %d: broadcast of %lld bytes from rank %d in a job of %d", c->rank,
                     (long long)bytes, root, c->world);
  if (!c->mpi) return 0;
  for (int64_t done = 0; done < bytes;) {
    int64_t left = bytes - done;
    int n = (int)(left < c->max_message ? left : c->max_message);
    int rc = MPI_Bcast((char *)data + done, n, MPI_BYTE, root, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) return mpi_error(c, rc, "broadcast (MPI_Bcast)", err);
    done += n;
  }
  return 0;
}

int comm_barrier(Comm *c, Error *err) {
  if (!c->mpi) return 0;
  int rc = MPI_Barrier(MPI_COMM_WORLD);
  if (rc != MPI_SUCCESS) return mpi_error(c, rc, "barrier (MPI_Barrier)", err);
  return 0;
}

void comm_abort(const Comm *c, const char *message) {
  fflush(stdout);
  if (c && c->mpi) {
    // Each line carries the rank: the job's ranks share one stderr.
    for (const char *line = message;;) {
      size_t len = strcspn(line, "\n");
      fprintf(stderr, "rank %d: %.*s\n", c->rank, (int)len, line);
      if (!line[len]) break;
      line += len + 1;
    }
  } else {
    fprintf(stderr, "%s\n", message);
  }
  fflush(stderr);
  if (c && c->mpi) MPI_Abort(MPI_COMM_WORLD, 1);
  exit(1);
}

int comm_pick_device(const Comm *c, int visible_devices, int *device, Error *err) {
  if (visible_devices < 1)
    return error_set(err,
                     "rank %d: no CUDA device is visible\n"
                     "HINT: check nvidia-smi and CUDA_VISIBLE_DEVICES, or train with device=cpu",
                     c->rank);
  if (c->local_world <= visible_devices || visible_devices == 1) {
    *device = c->local_world <= visible_devices ? c->local_rank : 0;
    return 0;
  }
  return error_set(err,
                   "rank %d: this node runs %d processes but sees %d CUDA devices; local rank %d "
                   "has none\nHINT: start at most %d processes per node (mpirun -np %d on one "
                   "node, --map-by ppr:%d:node with a hostfile, srun --ntasks-per-node=%d)",
                   c->rank, c->local_world, visible_devices, c->local_rank, visible_devices,
                   visible_devices, visible_devices, visible_devices);
}

int comm_check_distinct_devices(Comm *c, const char *device_id, Error *err) {
  if (!c->mpi || c->world == 1) return 0;
  MPI_Comm node;
  int rc = MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &node);
  if (rc != MPI_SUCCESS) return mpi_error(c, rc, "MPI_Comm_split_type (device check)", err);
  char mine[DEVICE_ID_MAX] = {0};
  snprintf(mine, sizeof mine, "%s", device_id);
  char *ids = calloc_check((size_t)c->local_world, DEVICE_ID_MAX);
  int *ranks = calloc_check((size_t)c->local_world, sizeof(int));
  rc = MPI_Allgather(mine, DEVICE_ID_MAX, MPI_CHAR, ids, DEVICE_ID_MAX, MPI_CHAR, node);
  if (rc == MPI_SUCCESS) rc = MPI_Allgather(&c->rank, 1, MPI_INT, ranks, 1, MPI_INT, node);
  MPI_Comm_free(&node);
  int other = -1;
  for (int i = 0; i < c->local_world && rc == MPI_SUCCESS && other < 0; i++)
    if (i != c->local_rank && strcmp(ids + (size_t)i * DEVICE_ID_MAX, mine) == 0) other = ranks[i];
  free(ids);
  free(ranks);
  if (rc != MPI_SUCCESS) return mpi_error(c, rc, "MPI_Allgather (device check)", err);
  if (other < 0) return 0;
  char host[MPI_MAX_PROCESSOR_NAME] = "";
  int len = 0;
  MPI_Get_processor_name(host, &len);
  return error_set(err,
                   "rank %d: ranks %d and %d on node %s both use CUDA device %s; NCCL needs one "
                   "device per process\nHINT: start at most one process per GPU on each node, "
                   "and give each its own GPU (CUDA_VISIBLE_DEVICES per rank, or all GPUs "
                   "visible to every rank so the local rank picks one)",
                   c->rank, c->rank < other ? c->rank : other, c->rank < other ? other : c->rank,
                   host, mine);
}
