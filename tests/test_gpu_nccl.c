// test_gpu_nccl.c: dist/nccl.cu on the GPU. Runs as one process on one GPU (ctest -L gpu), or as
// a job under mpirun with one GPU per process (mpirun -np 2 build/test_gpu_nccl on a machine with
// two GPUs), where the same checks cover a real exchange.
//
// In-place all-reduce of device ranges (odd sizes, a start one float off 16-byte alignment) in
// fp32 (sum, average, max) against a double reference over every rank's fresh random data, and in
// bf16 (one rank: exactly the round-to-nearest-even bf16 of the data); the same bits on every
// rank; a reduction on a communication stream that waits for an event of the compute stream; a
// wait that times out when the stream never finishes (the communicator is then aborted and
// refuses further work); a bf16 range beyond the scratch. With several ranks it prints the
// all-reduce time and bus bandwidth of a 25 MiB bucket.
//
//   --skip-rank R   (mpirun, >= 2 GPUs) rank R never joins an all-reduce: the others must end
//                   the job within the timeout (5 s) with a message naming their rank
#define _POSIX_C_SOURCE 200809L
#include "tests/util/test_dist_util.h"
#include "tests/util/test_gpu_util.h"

#if defined(SWIN_HAVE_CUDA) && defined(SWIN_HAVE_NCCL)
#include <time.h>

#include "dist/comm.h"
#include "dist/nccl.h"

#define U_FP32 0x1p-24
#define U_BF16 0x1p-8  // bf16 keeps 8 significant bits

// Each case's data: rank_data with this test's seed.
#define DATA_SEED 0x6C1000ull

// Round to nearest even bf16, as __float2bfloat16_rn does for finite values.
static float bf16_round(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  memcpy(&x, &u, 4);
  return x;
}

static int same_bits_everywhere(Comm *c, const float *x, int64_t n) {
  float *root = test_alloc_floats(n);
  memcpy(root, x, sizeof(float) * (size_t)n);
  Error err;
  must(c, comm_broadcast(c, root, (int64_t)sizeof(float) * n, 0, &err), &err);
  int same = memcmp(root, x, sizeof(float) * (size_t)n) == 0;
  free(root);
  return same;
}

// Error bound per element: fp32 sums (W-1) u sum|x| (1.01 for second order); ncclAvg may
// pre-multiply each term by 1/W (u sum|x| / W more) and the division rounds (u |mean|). bf16:
// the inputs round (u_bf16 sum|x|) and so may each of the W-1 partial sums on the wire
// ((W-1) u_bf16 sum|x|); 1.05 covers the second order at u = 2^-8.
static double element_bound(ReduceDtype dtype, CommOp op, int W, double abs_sum, double want) {
  if (op == COMM_MAX) return 0;
  if (dtype == REDUCE_BF16) {
    double b = 1.05 * W * U_BF16 * abs_sum;
    if (W == 1) b = U_BF16 * abs_sum;  // exact check separately
    return op == COMM_AVG ? b / W + U_FP32 * fabs(want) : b;
  }
  double b = 1.01 * (W - 1) * U_FP32 * abs_sum;
  return op == COMM_AVG ? (b + U_FP32 * abs_sum) / W + U_FP32 * fabs(want) : b;
}

static const char *op_name(CommOp op) {
  return op == COMM_SUM ? "sum" : op == COMM_AVG ? "average" : op == COMM_MAX ? "max" : "min";
}

static void check_reduce(Comm *c, NcclComm *nc, cudaStream_t stream, int64_t n, CommOp op,
                         ReduceDtype dtype, int id) {
  int W = c->world;
  const char *dt = dtype == REDUCE_BF16 ? "bf16" : "fp32";
  float *x = test_alloc_floats(n), *other = test_alloc_floats(n), *got = test_alloc_floats(n);
  double *want = malloc(sizeof(double) * (size_t)n), *abs_sum = malloc(sizeof(double) * (size_t)n);
  for (int64_t i = 0; i < n; i++) want[i] = op == COMM_MAX ? -INFINITY : 0, abs_sum[i] = 0;
  for (int r = 0; r < W; r++) {
    rank_data(other, n, r, id, DATA_SEED);
    for (int64_t i = 0; i < n; i++) {
      want[i] = op == COMM_MAX ? fmax(want[i], other[i]) : want[i] + other[i];
      abs_sum[i] += fabs(other[i]);
    }
  }
  if (op == COMM_AVG)
    for (int64_t i = 0; i < n; i++) want[i] /= W;
  rank_data(x, n, c->rank, id, DATA_SEED);
  // One float past a 16-byte boundary: buckets start wherever a tensor starts.
  float *base = gpu_alloc(sizeof(float) * (size_t)(n + 1)), *d = base + 1;
  CUDA_CHECK(cudaMemcpy(d, x, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice));
  Error err;
  must(c, nccl_allreduce(nc, d, n, op, dtype, stream, &err), &err);
  must(c, nccl_wait(nc, stream, &err), &err);
  gpu_download(got, d, n);
  double worst = 0;
  int64_t worst_i = 0, exact_misses = 0;
  for (int64_t i = 0; i < n; i++) {
    double e = fabs((double)got[i] - want[i]);
    double bound = element_bound(dtype, op, W, abs_sum[i], want[i]);
    double ratio = e == 0 ? 0 : bound > 0 ? e / bound : INFINITY;
    if (!(ratio <= worst)) worst = ratio, worst_i = i;
    if (W == 1 && dtype == REDUCE_BF16 && got[i] != bf16_round(x[i])) exact_misses++;
  }
  if (!(worst <= 1))
    printf("rank %d: %s %s element %lld is %.9g, want %.9g\n", c->rank, dt, op_name(op),
           (long long)worst_i, (double)got[worst_i], want[worst_i]);
  worst = max_over_ranks(c, worst);
  check_all(c, worst <= 1, "%s %-7s n=%-8lld worst |err|/bound %.3f", dt, op_name(op), (long long)n,
            worst);
  if (W == 1 && dtype == REDUCE_BF16)
    check_all(c, exact_misses == 0, "%s %-7s n=%-8lld one rank: exactly bf16(x) (%lld misses)", dt,
              op_name(op), (long long)n, (long long)exact_misses);
  check_all(c, same_bits_everywhere(c, got, n), "%s %-7s n=%-8lld the same bits on every rank", dt,
            op_name(op), (long long)n);
  CUDA_CHECK(cudaFree(base));
  free(x);
  free(other);
  free(got);
  free(want);
  free(abs_sum);
}

static void sleep_host(void *seconds) {
  double s = *(const double *)seconds;
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

// The compute stream writes the range late (after a 0.2 s stall); the reduction on the
// communication stream waits for its event, so it must see the new values, not the NaN poison.
static void test_event_ordering(Comm *c, NcclComm *nc, cudaStream_t comm_stream) {
  const int64_t n = 100003;
  float *host, *got = test_alloc_floats(n);
  CUDA_CHECK(cudaMallocHost((void **)&host, sizeof(float) * (size_t)n));  // async copies
  rank_data(host, n, c->rank, 90, DATA_SEED);
  float *d = gpu_alloc(sizeof(float) * (size_t)n);
  gpu_poison(d, n);
  cudaStream_t compute;
  cudaEvent_t ready;
  CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  CUDA_CHECK(cudaDeviceSynchronize());
  static double stall = 0.2;
  CUDA_CHECK(cudaLaunchHostFunc(compute, sleep_host, &stall));
  CUDA_CHECK(cudaMemcpyAsync(d, host, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice, compute));
  CUDA_CHECK(cudaEventRecord(ready, compute));
  Error err;
  must(c, nccl_allreduce_after(nc, ready, d, n, COMM_SUM, REDUCE_FP32, comm_stream, &err), &err);
  must(c, nccl_wait(nc, comm_stream, &err), &err);
  gpu_download(got, d, n);
  double sum_want = 0, sum_got = 0;
  float *other = test_alloc_floats(n);
  for (int r = 0; r < c->world; r++) {
    rank_data(other, n, r, 90, DATA_SEED);
    for (int64_t i = 0; i < n; i++) sum_want += other[i];
  }
  for (int64_t i = 0; i < n; i++) sum_got += got[i];
  check_all(c, isfinite(sum_got) && fabs(sum_got - sum_want) <= 1e-4 * n * c->world,
            "all-reduce after an event waits for the compute stream (sum %.4f, want %.4f)", sum_got,
            sum_want);
  CUDA_CHECK(cudaStreamDestroy(compute));
  CUDA_CHECK(cudaEventDestroy(ready));
  CUDA_CHECK(cudaFree(d));
  CUDA_CHECK(cudaFreeHost(host));
  free(got);
  free(other);
}

// A stream that does not finish within the communicator's timeout: nccl_wait fails naming the
// rank, the communicator is aborted and refuses more work.
static void test_timeout(Comm *c, cudaStream_t stream) {
  NcclComm *nc;
  Error err;
  must(c, nccl_comm_create(&nc, c, 60.0, 0, &err), &err);  // creation may take seconds
  nccl_set_timeout(nc, 0.5);
  static double stall = 2.0;
  CUDA_CHECK(cudaLaunchHostFunc(stream, sleep_host, &stall));
  double start = time_now_s();
  int rc = nccl_wait(nc, stream, &err);
  double waited = time_now_s() - start;
  char want[64];
  snprintf(want, sizeof want, "rank %d: NCCL all-reduce did not finish within 0.5 s", c->rank);
  // The wait notices the timeout at 0.5 s; aborting the communicator then returns once the
  // stream's running host function (the 2 s stall standing in for stuck work) has ended
  // (measured on an H200: 2.01 s), so the bound is the stall plus a second.
  check_all(c, rc == -1 && strstr(err.msg, want) && waited < stall + 1.0,
            "a stream stuck past the timeout: an error naming the rank after %.2f s",
            max_over_ranks(c, waited));
  float dummy[1];
  rc = nccl_allreduce(nc, dummy, 1, COMM_SUM, REDUCE_FP32, stream, &err);
  check_all(c, rc == -1 && strstr(err.msg, "aborted after an earlier error"),
            "the aborted communicator refuses further all-reduces");
  CUDA_CHECK(cudaStreamSynchronize(stream));
  nccl_comm_destroy(nc);
}

// Time of an n-float bucket's all-reduce, and the bus bandwidth NCCL's tests report:
// 2 (W-1)/W bytes / time per rank.
static void bench(Comm *c, NcclComm *nc, cudaStream_t stream, ReduceDtype dtype, int64_t n) {
  float *d = gpu_alloc(sizeof(float) * (size_t)n);
  CUDA_CHECK(cudaMemset(d, 0, sizeof(float) * (size_t)n));
  Error err;
  for (int i = 0; i < 3; i++)
    must(c, nccl_allreduce(nc, d, n, COMM_AVG, dtype, stream, &err), &err);
  must(c, nccl_wait(nc, stream, &err), &err);
  const int reps = 20;
  double start = time_now_s();
  for (int i = 0; i < reps; i++)
    must(c, nccl_allreduce(nc, d, n, COMM_AVG, dtype, stream, &err), &err);
  must(c, nccl_wait(nc, stream, &err), &err);
  double t = max_over_ranks(c, (time_now_s() - start) / reps);
  double wire = (double)n * (dtype == REDUCE_BF16 ? 2 : 4);
  if (c->rank == 0)
    printf("bench: %d ranks, %.0f MiB fp32 bucket as %s: %.3f ms, bus bandwidth %.1f GB/s\n",
           c->world, (double)n * 4 / 1048576, dtype == REDUCE_BF16 ? "bf16" : "fp32", t * 1e3,
           2.0 * (c->world - 1) / c->world * wire / t / 1e9);
  CUDA_CHECK(cudaFree(d));
}

static int run_skip(Comm *c, int skipper) {
  int device;
  Error err;
  must(c, nccl_select_device(c, &device, &err), &err);
  NcclComm *nc;
  must(c, nccl_comm_create(&nc, c, 60.0, 0, &err), &err);
  nccl_set_timeout(nc, 5.0);
  float *d = gpu_alloc(sizeof(float) * 1024);
  CUDA_CHECK(cudaMemset(d, 0, sizeof(float) * 1024));
  if (c->rank != skipper) {
    must(c, nccl_allreduce(nc, d, 1024, COMM_SUM, REDUCE_FP32, 0, &err), &err);
    must(c, nccl_wait(nc, 0, &err), &err);  // never completes: comm_abort ends the job
  }
  must(c, comm_barrier(c, &err), &err);
  printf("rank %d: an all-reduce completed without rank %d\n", c->rank, skipper);
  return 3;
}

int main(int argc, char **argv) {
  GPU_TEST_MAIN_BEGIN();
  Comm c;
  Error err;
  must(&c, comm_init(&c, &err), &err);
  if (argc > 2 && strcmp(argv[1], "--skip-rank") == 0) return run_skip(&c, atoi(argv[2]));
  int device;
  must(&c, nccl_select_device(&c, &device, &err), &err);
  NcclComm *nc;
  const int64_t bucket = 25 * 262144;  // 25 MiB of floats: the default bucket, the bf16 scratch
  must(&c, nccl_comm_create(&nc, &c, 60.0, bucket, &err), &err);
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  if (c.rank == 0)
    printf("-- %d rank%s, rank 0 on CUDA device %d\n", c.world, c.world > 1 ? "s" : "", device);

  const int64_t sizes[] = {1, 1001, (1 << 22) + 5};
  for (int s = 0; s < 3; s++) {
    check_reduce(&c, nc, stream, sizes[s], COMM_SUM, REDUCE_FP32, 10 + s);
    check_reduce(&c, nc, stream, sizes[s], COMM_AVG, REDUCE_FP32, 20 + s);
    check_reduce(&c, nc, stream, sizes[s], COMM_SUM, REDUCE_BF16, 30 + s);
    check_reduce(&c, nc, stream, sizes[s], COMM_AVG, REDUCE_BF16, 40 + s);
  }
  check_reduce(&c, nc, stream, 1001, COMM_MAX, REDUCE_FP32, 50);
  float *big = gpu_alloc(sizeof(float) * (size_t)(bucket + 1));
  int rc = nccl_allreduce(nc, big, bucket + 1, COMM_SUM, REDUCE_BF16, stream, &err);
  char want[64];
  snprintf(want, sizeof want, "rank %d: bf16 all-reduce of %lld floats", c.rank,
           (long long)(bucket + 1));
  check_all(&c, rc == -1 && strstr(err.msg, want), "a bf16 range beyond the scratch is an error");
  CUDA_CHECK(cudaFree(big));
  test_event_ordering(&c, nc, stream);
  if (c.world > 1) {
    bench(&c, nc, stream, REDUCE_FP32, bucket);
    bench(&c, nc, stream, REDUCE_BF16, bucket);
  }
  test_timeout(&c, stream);
  nccl_comm_destroy(nc);
  CUDA_CHECK(cudaStreamDestroy(stream));
  double failed = test_stats.failed;
  must(&c, comm_allreduce_doubles(&c, &failed, 1, COMM_MAX, &err), &err);
  must(&c, comm_finalize(&c, &err), &err);
  if (c.rank != 0) return failed > 0;
  return test_finish();
}
#elif defined(SWIN_HAVE_CUDA)
int main(void) {
  printf("SKIP: built without NCCL\n");
  return 77;
}
#else
int main(void) {
  GPU_TEST_MAIN_BEGIN();
}
#endif
