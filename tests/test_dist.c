// test_dist.c: dist/ as a specification, on the CPU.
//
// Run alone (ctest's test_dist) it is the single-process job: world 1, no MPI call at all, every
// collective the identity; plus the pure parts: the gradient bucket planner and the choice of a
// CUDA device per local rank. Run under mpirun (tests/test_dist.sh: 2 and 3 processes) the same
// checks cover the collectives: sums and averages against a double reference on fresh random
// data of every rank, the same bits on every rank, ranges longer than one MPI message, broadcast,
// barrier, and the device clash check. Every check's outcome is agreed over the ranks and rank 0
// prints it; a rank that sees a failure prints the detail with its rank.
//
// Other modes, for tests/test_dist.sh:
//   --fail-rank R    rank R ends the job with comm_abort while the others wait in a barrier
//   --kill-rank R    rank R is killed (SIGKILL, as the out-of-memory killer does) instead
//   --init           comm_init only: prints "world W rank R mpi yes|no" or the error, exit 0 or 1
#define _POSIX_C_SOURCE 200809L  // nanosleep, kill
#include <mpi.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dist/bucket.h"
#include "dist/comm.h"
#include "src/base/config.h"
#include "src/model/model.h"
#include "tests/util/test_dist_util.h"
#include "tests/util/test_util.h"

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

// Each case's data: rank_data with this test's seed.
#define DATA_SEED 0xD157000ull

// Every rank's copy of data equals rank 0's, bit for bit.
static int same_bits_everywhere(Comm *c, const void *data, int64_t bytes) {
  unsigned char *root = malloc_check((size_t)bytes + 1);
  memcpy(root, data, (size_t)bytes);
  Error err;
  must(c, comm_broadcast(c, root, bytes, 0, &err), &err);
  int same = memcmp(root, data, (size_t)bytes) == 0;
  free(root);
  return same;
}

// ---- identity -------------------------------------------------------------------------------

static void test_identity(Comm *c) {
  const char *launcher = comm_detect_launcher();
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!launcher) {
    test_check(c->rank == 0 && c->world == 1 && c->local_rank == 0 && c->local_world == 1 &&
                   !c->mpi && !c->owns_mpi,
               "no launcher: rank 0 of 1, local rank 0 of 1, MPI not in use");
    test_check(!initialized, "no launcher: MPI was never initialized (no MPI call)");
    return;
  }
  check_all(c, c->mpi && initialized && strcmp(c->launcher, launcher) == 0,
            "launched (%s): MPI initialized, world %d", launcher, c->world);
  double ranks = c->rank, expect = (double)c->world * (c->world - 1) / 2;
  Error err;
  must(c, comm_allreduce_doubles(c, &ranks, 1, COMM_SUM, &err), &err);
  check_all(c, ranks == expect && c->rank >= 0 && c->rank < c->world,
            "ranks are 0..world-1 (sum of ranks %.0f, expected %.0f)", ranks, expect);
  // mpirun here starts every process on this machine, so the node holds the whole job.
  check_all(c, c->local_world == c->world && c->local_rank == c->rank,
            "one node: local rank = rank, local world = world");
}

// ---- float all-reduce -----------------------------------------------------------------------

// Sums (or averages) of n floats from every rank against a double reference. A float sum of W
// terms in any order is within (W-1) u sum|x| of the exact sum (u = 2^-24, to first order; the
// factor 1.01 covers the second order); the average's division adds u |mean|. So the bound is
// per element, exact (0) for one rank, and a wrong element, a missing rank or a stale value
// breaks it by orders of magnitude.
static void check_float_reduce(Comm *c, int64_t n, CommOp op, int id, const char *label) {
  int W = c->world;
  float *x = test_alloc_floats(n), *other = test_alloc_floats(n);
  double *ref = malloc_check(sizeof(double) * (size_t)n);
  double *abs_sum = malloc_check(sizeof(double) * (size_t)n);
  memset(ref, 0, sizeof(double) * (size_t)n);
  memset(abs_sum, 0, sizeof(double) * (size_t)n);
  for (int r = 0; r < W; r++) {
    rank_data(other, n, r, id, DATA_SEED);
    for (int64_t i = 0; i < n; i++) ref[i] += other[i], abs_sum[i] += fabs(other[i]);
  }
  rank_data(x, n, c->rank, id, DATA_SEED);
  Error err;
  must(c, comm_allreduce_floats(c, x, n, op, &err), &err);
  const double u = 1.0 / 16777216.0;
  double worst = 0, num = 0, den = 0;
  int64_t worst_i = 0;
  for (int64_t i = 0; i < n; i++) {
    double want = op == COMM_AVG ? ref[i] / W : ref[i];
    double bound = 1.01 * (W - 1) * u * abs_sum[i] / (op == COMM_AVG ? W : 1);
    if (op == COMM_AVG) bound += u * fabs(want);
    double e = fabs((double)x[i] - want);
    double ratio = e == 0 ? 0 : bound > 0 ? e / bound : INFINITY;
    if (!(ratio <= worst)) worst = ratio, worst_i = i;  // keeps NaN
    num += e * e;
    den += want * want;
  }
  if (!(worst <= 1))
    printf("rank %d: %s element %lld is %.9g, want %.9g\n", c->rank, label, (long long)worst_i,
           (double)x[worst_i], op == COMM_AVG ? ref[worst_i] / W : ref[worst_i]);
  double rel = max_over_ranks(c, sqrt(num / den));
  worst = max_over_ranks(c, worst);
  check_all(c, worst <= 1,
            "%-30s n=%-8lld worst |err|/bound %.3f (bound (W-1) 2^-24 sum|x|), rel_err %.2e", label,
            (long long)n, worst, rel);
  check_all(c, same_bits_everywhere(c, x, (int64_t)sizeof(float) * n),
            "%-30s n=%-8lld the same bits on every rank", label, (long long)n);
  free(x);
  free(other);
  free(ref);
  free(abs_sum);
}

static void test_float_allreduce(Comm *c) {
  const int64_t sizes[] = {1, 7, 1000, (1 << 20) + 3};
  for (int s = 0; s < 4; s++) {
    check_float_reduce(c, sizes[s], COMM_SUM, 10 + s, "float sum");
    check_float_reduce(c, sizes[s], COMM_AVG, 20 + s, "float average");
  }
  // A range longer than one MPI message goes in pieces: 2507 floats in messages of 1000.
  int64_t saved = c->max_message;
  c->max_message = 1000;
  check_float_reduce(c, 2507, COMM_SUM, 30, "float sum in 1000-float pieces");
  check_float_reduce(c, 2507, COMM_AVG, 31, "float avg in 1000-float pieces");
  c->max_message = saved;
  float none = 5.0f;
  Error err;
  check_all(c, comm_allreduce_floats(c, &none, 0, COMM_SUM, &err) == 0 && none == 5.0f,
            "empty all-reduce leaves memory alone");
  int rc = comm_allreduce_floats(c, &none, -1, COMM_SUM, &err);
  char want[32];
  snprintf(want, sizeof want, "rank %d:", c->rank);
  check_all(c, rc == -1 && strstr(err.msg, want) != NULL,
            "negative count is an error naming the rank");
}

// ---- doubles (metrics) ----------------------------------------------------------------------

// The few doubles a trainer reduces per step or evaluation: a loss sum, a count, a flag.
// Integer-valued sums are exact; the max and min are exact whatever the order.
static void test_double_allreduce(Comm *c) {
  int W = c->world, r = c->rank;
  TestRng rng = {.state = 0xD0B1Eull + (uint64_t)r};
  double loss = test_rng_uniform(&rng, 0.5f, 3.0f);  // this rank's mean loss
  double values[4] = {loss, 100.0 + r, (double)(r + 1), (double)(r == W - 1)};
  double sum = 0;
  for (int q = 0; q < W; q++) {
    TestRng other = {.state = 0xD0B1Eull + (uint64_t)q};
    sum += test_rng_uniform(&other, 0.5f, 3.0f);
  }
  double got[4];
  Error err;
  memcpy(got, values, sizeof got);
  must(c, comm_allreduce_doubles(c, got, 4, COMM_SUM, &err), &err);
  double count_want = 100.0 * W + (double)W * (W - 1) / 2;
  double loss_err = fabs(got[0] - sum) / sum;
  check_all(c,
            loss_err <= 2.02 * (W - 1) * 0x1p-53 && got[1] == count_want &&
                got[2] == (double)W * (W + 1) / 2 && got[3] == 1,
            "double sum: loss rel_err %.1e, counts exact (%.0f)", max_over_ranks(c, loss_err),
            got[1]);
  memcpy(got, values, sizeof got);
  must(c, comm_allreduce_doubles(c, got, 4, COMM_AVG, &err), &err);
  check_all(c, fabs(got[0] - sum / W) <= 1e-15 * sum && got[1] == count_want / W, "double average");
  memcpy(got, values, sizeof got);
  must(c, comm_allreduce_doubles(c, got, 4, COMM_MAX, &err), &err);
  check_all(c, got[1] == 100.0 + W - 1 && got[2] == W && got[3] == 1,
            "double max (a stop flag raised on one rank reaches all)");
  memcpy(got, values, sizeof got);
  must(c, comm_allreduce_doubles(c, got, 4, COMM_MIN, &err), &err);
  check_all(c, got[1] == 100.0 && got[2] == 1 && got[3] == (W == 1), "double min");
}

// ---- broadcast and barrier ------------------------------------------------------------------

static void check_broadcast(Comm *c, int64_t bytes, int root, int id, const char *label) {
  unsigned char *data = malloc_check((size_t)bytes + 1), *want = malloc_check((size_t)bytes + 1);
  TestRng mine = {.state = 0xB0Aull + 31ull * (uint64_t)id + (uint64_t)c->rank};
  TestRng roots = {.state = 0xB0Aull + 31ull * (uint64_t)id + (uint64_t)root};
  for (int64_t i = 0; i < bytes; i++) data[i] = (unsigned char)test_rng_u64(&mine);
  for (int64_t i = 0; i < bytes; i++) want[i] = (unsigned char)test_rng_u64(&roots);
  Error err;
  must(c, comm_broadcast(c, data, bytes, root, &err), &err);
  check_all(c, memcmp(data, want, (size_t)bytes) == 0, "%s: %lld bytes from rank %d", label,
            (long long)bytes, root);
  free(data);
  free(want);
}

static void test_broadcast(Comm *c) {
  check_broadcast(c, (1 << 20) + 5, c->world - 1, 1, "broadcast");
  check_broadcast(c, 128, 0, 2, "broadcast of an NCCL unique id's size");
  int64_t saved = c->max_message;
  c->max_message = 1000;
  check_broadcast(c, 4321, c->world - 1, 3, "broadcast in 1000-byte pieces");
  c->max_message = saved;
  char byte = 1;
  Error err;
  int rc = comm_broadcast(c, &byte, 1, c->world, &err);
  check_all(c, rc == -1 && strstr(err.msg, "from rank") != NULL,
            "broadcast from a rank outside the job is an error");
}

// Rank 0 arrives late; nobody may leave the barrier before it arrives.
static void test_barrier(Comm *c) {
  Error err;
  must(c, comm_barrier(c, &err), &err);
  const double late = 0.3;
  double start = time_now_s();
  if (c->rank == 0) sleep_s(late);
  must(c, comm_barrier(c, &err), &err);
  double waited = time_now_s() - start;
  // Ranks leave the first barrier within milliseconds of each other; asking for 0.2 of rank 0's
  // 0.3 s leaves room for that.
  int ok = c->rank == 0 || waited >= late - 0.1;
  if (!ok)
    printf("rank %d: left the barrier after %.3f s, rank 0 came at %.1f s\n", c->rank, waited,
           late);
  check_all(c, ok, "barrier holds every rank until the last one (rank 0, %.1f s late) arrives",
            late);
}

// ---- device choice --------------------------------------------------------------------------

static void test_pick_device(void) {
  Comm node = {.rank = 13, .world = 16, .local_rank = 5, .local_world = 8};
  Error err;
  int device = -1;
  int rc = comm_pick_device(&node, 8, &device, &err);
  test_check(rc == 0 && device == 5, "8 processes, 8 GPUs: local rank 5 takes device 5 (got %d)",
             device);
  device = -1;
  rc = comm_pick_device(&node, 1, &device, &err);
  test_check(rc == 0 && device == 0,
             "one visible GPU per process (launcher binding): device 0 (got %d)", device);
  rc = comm_pick_device(&node, 4, &device, &err);
  test_check(rc == -1 && strstr(err.msg, "rank 13: this node runs 8 processes but sees 4 CUDA") &&
                 strstr(err.msg, "HINT: start at most 4 processes per node"),
             "more local ranks than GPUs: a clear error (%s)", rc ? "refused" : "accepted");
  rc = comm_pick_device(&node, 0, &device, &err);
  test_check(rc == -1 && strstr(err.msg, "rank 13: no CUDA device"), "no GPU: an error");
}

// Two processes of a node on one GPU are refused by name; distinct ids pass.
static void test_distinct_devices(Comm *c) {
  char id[32];
  snprintf(id, sizeof id, "0000:%02x:00.0", 0x10 + c->local_rank);
  Error err;
  check_all(c, comm_check_distinct_devices(c, id, &err) == 0, "distinct GPUs per process pass");
  int rc = comm_check_distinct_devices(c, "0000:1b:00.0", &err);
  if (c->world == 1) {
    check_all(c, rc == 0, "one process: nothing to clash with");
    return;
  }
  int ok = rc == -1 && strstr(err.msg, "both use CUDA device 0000:1b:00.0") &&
           strstr(err.msg, c->rank == 0 ? "ranks 0 and 1" : "ranks 0 and");
  if (!ok) printf("rank %d: rc %d, message: %s\n", c->rank, rc, err.msg);
  check_all(c, ok, "two processes on one GPU: every clashing rank reports it");
}

// ---- bucket planner -------------------------------------------------------------------------

// The planner's promises on any tensor list: buckets in backward order tile [0, total) exactly,
// each within max_floats, boundaries on tensor boundaries unless a tensor alone is too big, and
// greedy (a bucket of whole tensors could not also take the next tensor down).
static int plan_is_valid(const int64_t *numel, int n, int64_t max_floats, const GradBucket *b,
                         int count, char *why, size_t why_n) {
  int64_t *start = malloc_check(sizeof(int64_t) * (size_t)(n + 1));
  start[0] = 0;
  for (int t = 0; t < n; t++) start[t + 1] = start[t] + numel[t];
  int64_t end = start[n];
  int ok = 1;
  for (int k = 0; k < count && ok; k++) {
    const GradBucket *g = &b[k];
    bool whole =
        g->offset == start[g->first_tensor] && g->offset + g->count == start[g->last_tensor + 1];
    bool piece = g->first_tensor == g->last_tensor && numel[g->first_tensor] > max_floats;
    if (g->offset + g->count != end)
      ok = 0, snprintf(why, why_n, "bucket %d ends at %lld, not %lld", k,
                       (long long)(g->offset + g->count), (long long)end);
    else if (g->count < 1 || g->count > max_floats)
      ok = 0, snprintf(why, why_n, "bucket %d holds %lld floats (max %lld)", k, (long long)g->count,
                       (long long)max_floats);
    else if (!whole && !piece)
      ok = 0, snprintf(why, why_n, "bucket %d splits a tensor that fits", k);
    else if (whole && g->first_tensor > 0 && !piece && numel[g->first_tensor - 1] <= max_floats &&
             g->count + numel[g->first_tensor - 1] <= max_floats)
      ok = 0, snprintf(why, why_n, "bucket %d could also take tensor %d", k, g->first_tensor - 1);
    end = g->offset;
  }
  if (ok && end != 0)
    ok = 0, snprintf(why, why_n, "the buckets stop at %lld, not 0", (long long)end);
  free(start);
  return ok;
}

static void test_bucket_plan(void) {
  // Worked by hand, max 8: from the end, [2] (2 + 8 > 8), [8], [3, 4] (7; + 10 > 8), then the
  // 10-float tensor alone in two pieces of 5.
  const int64_t numel[] = {10, 3, 4, 8, 2};
  const GradBucket want[] = {
      {25, 2, 4, 4}, {17, 8, 3, 3}, {10, 7, 1, 2}, {5, 5, 0, 0}, {0, 5, 0, 0}};
  GradBucket got[8];
  int count = bucket_plan(numel, 5, 8, NULL);
  int written = bucket_plan(numel, 5, 8, got);
  test_check(count == 5 && written == 5 && memcmp(got, want, sizeof want) == 0,
             "planner: the worked example (5 buckets, a 10-float tensor in 2 pieces)");
  test_check(bucket_plan(numel, 5, 1000, got) == 1 && got[0].offset == 0 && got[0].count == 27,
             "planner: everything fits one bucket");
  test_check(bucket_floats(25) == 25 * 262144 && bucket_floats(1e-9) == 1,
             "bucket_floats: 25 MiB = 6553600 floats; never below 1");

  // Random tensor lists, sizes spread over 1 .. 3x the bucket.
  TestRng rng = {.state = 0xB0C4E7ull};
  int bad = 0;
  char why[160] = "";
  for (int trial = 0; trial < 200 && !bad; trial++) {
    int n = 1 + (int)(test_rng_u64(&rng) % 60);
    int64_t max_floats = 1 + (int64_t)(test_rng_u64(&rng) % 5000);
    int64_t sizes[60];
    for (int t = 0; t < n; t++)
      sizes[t] = 1 + (int64_t)(test_rng_u64(&rng) % (uint64_t)(3 * max_floats));
    int m = bucket_plan(sizes, n, max_floats, NULL);
    GradBucket *b = malloc_check(sizeof(GradBucket) * (size_t)m);
    bucket_plan(sizes, n, max_floats, b);
    if (!plan_is_valid(sizes, n, max_floats, b, m, why, sizeof why)) bad = trial + 1;
    free(b);
  }
  test_check(!bad, "planner: 200 random tensor lists tile exactly, within the size, greedy%s%s",
             bad ? ": " : "", why);

  // Swin-T's parameter table with the default 25 MiB.
  Config cfg;
  config_defaults(&cfg);
  Model m;
  Error err;
  if (model_create(&m, &cfg, NULL, 0, &err) != 0) {
    test_check(0, "swin_tiny model: %s", err.msg);
    return;
  }
  GradBucket *b;
  int nb;
  Tensor *grads = malloc_check(sizeof(Tensor) * (size_t)m.num_params);
  float *buffer = malloc_check(sizeof(float) * (size_t)m.num_floats);  // a model without backend
  for (int i = 0; i < m.num_params; i++) grads[i] = model_param_view(&m, i, buffer);
  int rc =
      bucket_plan_tensors(grads, m.num_params, buffer, m.num_floats, cfg.bucket_mb, &b, &nb, &err);
  // A table out of order is refused, naming the tensor.
  Tensor swapped = grads[1];
  grads[1] = grads[2];
  grads[2] = swapped;
  GradBucket *refused = NULL;
  int bad_count = 0;
  Error bad_err;
  test_check(bucket_plan_tensors(grads, m.num_params, buffer, m.num_floats, cfg.bucket_mb, &refused,
                                 &bad_count, &bad_err) != 0 &&
                 strstr(bad_err.msg, grads[1].name) != NULL,
             "a gradient table out of order is refused naming the tensor: %s", bad_err.msg);
  free(grads);
  free(buffer);
  int64_t *sizes = malloc_check(sizeof(int64_t) * (size_t)m.num_params);
  // Each tensor's extent includes the alignment gap after it (src/model/model.h).
  for (int i = 0; i < m.num_params; i++)
    sizes[i] = (i + 1 < m.num_params ? m.params[i + 1].offset : m.num_floats) - m.params[i].offset;
  int valid = rc == 0 && plan_is_valid(sizes, m.num_params, bucket_floats(cfg.bucket_mb), b, nb,
                                       why, sizeof why);
  int64_t largest = 0;
  for (int k = 0; rc == 0 && k < nb; k++) largest = b[k].count > largest ? b[k].count : largest;
  test_check(valid,
             "planner on swin_tiny (%lld floats, %d tensors): %d buckets of <= 25 MiB, largest "
             "%.1f MiB%s%s",
             (long long)m.num_floats, m.num_params, nb, (double)largest * 4 / 1048576,
             valid ? "" : ": ", valid ? "" : why);
  test_check(
      rc == 0 && b[0].last_tensor == m.num_params - 1 && b[nb - 1].first_tensor == 0,
      "swin_tiny: bucket 0 holds the head (reduced first), the last holds the patch embedding");
  free(sizes);
  if (rc == 0) free(b);
  model_destroy(&m);
}

// ---- modes for the failure tests ------------------------------------------------------------

static int run_failure(Comm *c, int victim, bool kill_it) {
  Error err;
  must(c, comm_barrier(c, &err), &err);
  if (c->rank == victim) {
    sleep_s(0.2);  // the others are waiting in the barrier by now
    if (kill_it) kill(getpid(), SIGKILL);
    comm_abort(c,
               "error: cannot decode 'train/n01440764/broken.jpg' (simulated failure)\n"
               "HINT: remove or replace the file");
  }
  must(c, comm_barrier(c, &err), &err);  // never completes: the victim is gone
  printf("rank %d: passed a barrier the failed rank %d never reached\n", c->rank, victim);
  return 3;
}

int main(int argc, char **argv) {
  Comm c;
  Error err;
  int rc = comm_init(&c, &err);
  if (argc > 1 && strcmp(argv[1], "--init") == 0) {
    if (rc != 0) {
      printf("error: %s\n", err.msg);
      return 1;
    }
    printf("world %d rank %d mpi %s\n", c.world, c.rank, c.mpi ? "yes" : "no");
    must(&c, comm_finalize(&c, &err), &err);
    return 0;
  }
  if (rc != 0) comm_abort(&c, err.msg);
  if (argc > 2 && (strcmp(argv[1], "--fail-rank") == 0 || strcmp(argv[1], "--kill-rank") == 0))
    return run_failure(&c, atoi(argv[2]), strcmp(argv[1], "--kill-rank") == 0);

  if (c.rank == 0)
    printf("-- %d process%s%s%s\n", c.world, c.world > 1 ? "es" : "",
           c.mpi ? ", launched by " : ", no launcher", c.launcher);
  test_identity(&c);
  test_float_allreduce(&c);
  test_double_allreduce(&c);
  test_broadcast(&c);
  test_barrier(&c);
  test_distinct_devices(&c);
  if (c.rank == 0) {
    test_pick_device();
    test_bucket_plan();
  }
  // Every rank ends with the job's verdict (rank 0 ran the single-process checks above).
  double failed = test_stats.failed;
  must(&c, comm_allreduce_doubles(&c, &failed, 1, COMM_MAX, &err), &err);
  must(&c, comm_finalize(&c, &err), &err);
  if (c.rank != 0 && c.world > 1) return failed > 0;
  return test_finish();
}
