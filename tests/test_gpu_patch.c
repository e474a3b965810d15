// test_gpu_patch.c: the CUDA backend's patch-embedding input and drop-path scales against the CPU
// backend's, in fp32, bf16 and fp16.
//   patch_embed_input: uint8 pixels normalized per channel, or f32 images as given; Cin = 1 and 3,
//   p = 4 and 2, Swin-T's 224x224x3 input, and maps that p does not divide (the edge pixels are
//   left out). Both backends compute ((float)v / 255 - mean) / std with IEEE division and no
//   contraction possible (the GPU's strip kernel through a table of those values), so the GPU's
//   patches must be exactly the CPU's rounded to the compute type, bit for bit. The shapes cover
//   both CUDA paths: the strip kernel (16-byte rows of p-row strips, 16-byte output strips) and
//   the per-element fallback.
//   drop_path_scales: both draw the same Philox numbers, so the scales must be the same bits;
//   and a call for samples [k, k + B) of a batch (first_sample = k, as rank r of a data-parallel
//   job or micro-batch k of an accumulating step draws) must give exactly that slice of the scales
//   of the whole batch.
//   step_params_set, which gives drop path its step index and first sample in device memory: many
//   writes queued while the GPU is held up, each read by its own draw, every draw that of its own
//   step and first sample.
#define _POSIX_C_SOURCE 200809L  // nanosleep
#include "tests/util/test_gpu_util.h"

#ifdef SWIN_HAVE_CUDA
#include <stdint.h>
#include <time.h>

typedef struct {
  int B, H, W, Cin, p;
} PatchShape;

// The CUDA path of each (strip: the strip kernel; element: the per-element kernel).
static const PatchShape shapes[] = {
    {2, 16, 24, 3, 4},    // strip (uint8 strips of 288 bytes)
    {2, 16, 24, 3, 2},    // strip (a 16-byte bf16 chunk spans 2/3 of a patch row)
    {3, 32, 32, 1, 4},    // strip; Fashion-MNIST's layout
    {2, 12, 20, 1, 2},    // uint8: element (40-byte strips); f32: strip, a chunk spans 2 patches
    {2, 224, 224, 3, 4},  // strip; Swin-T's input
    {1, 18, 26, 3, 4},    // H, W not multiples of p: uint8 element (78-byte rows), f32 strip
    {2, 8, 10, 3, 2},     // element (60-byte uint8 strips; 120-byte bf16 / fp16 output strips)
};
#define NUM_SHAPES ((int)(sizeof shapes / sizeof shapes[0]))

static const Normalize norm = {{0.485f, 0.456f, 0.406f, 0.5f}, {0.229f, 0.224f, 0.225f, 0.25f}};

static int64_t input_count(const PatchShape *s) {
  return (int64_t)s->B * s->H * s->W * s->Cin;
}
// Pixels in some patch: all of them when p divides H and W.
static int64_t patch_count(const PatchShape *s) {
  return (int64_t)s->B * (s->H / s->p) * (s->W / s->p) * s->Cin * s->p * s->p;
}

// patches (B, H/p, W/p, Cin*p*p) from input (B, H, W, Cin) of input_dtype (U8 or F32).
static void patch_on(Backend *be, const PatchShape *s, const void *input_h, DType input_dtype,
                     Normalize nm, float *patches_h) {
  const int64_t n = patch_count(s);
  void *input = be_copy_bytes(be, input_h, (size_t)input_count(s) * dtype_size(input_dtype));
  void *patches = be_poisoned_act(be, n);
  be->ops->patch_embed_input(be, patches, input, input_dtype, nm, s->B, s->H, s->W, s->Cin, s->p);
  be_read_act(be, patches_h, patches, n);
  be_free(be, input);
  be_free(be, patches);
}

static void check_patch(BackendPair *p, const PatchShape *s, DType input_dtype, TestRng *rng) {
  const DType dt = p->gpu.act;
  const int64_t n = patch_count(s), n_in = input_count(s);
  char ctx[256];
  snprintf(ctx, sizeof ctx, "patch_embed_input [%s] %s input B=%d %dx%d Cin=%d p=%d", p->precision,
           input_dtype == DTYPE_U8 ? "uint8" : "f32", s->B, s->H, s->W, s->Cin, s->p);
  void *input;
  if (input_dtype == DTYPE_U8) {
    uint8_t *px = (uint8_t *)malloc_check((size_t)n_in);
    for (int64_t i = 0; i < n_in; i++) px[i] = (uint8_t)(test_rng_u64(rng) >> 56);
    input = px;
  } else {
    input = test_alloc_floats(n_in);
    test_fill_uniform(rng, (float *)input, n_in, -2.0f, 2.0f);
  }
  float *want = test_alloc_floats(n), *got = test_alloc_floats(n);
  patch_on(&p->cpu, s, input, input_dtype, norm, want);
  patch_on(&p->gpu, s, input, input_dtype, norm, got);
  test_round_all(dt, want, n);
  test_same_bits(ctx, "patches = CPU's rounded to the compute type", got, want, n);
  free(input);
  free(want);
  free(got);
}

// scales (units, B) for `units` drop-path units at rates[u / 2], samples first .. first + B - 1.
static void drop_on(Backend *be, const float *rates_h, int units, int B, int64_t first,
                    uint64_t seed, int64_t step, float *scales_h) {
  float *rates = be_copy_f32(be, rates_h, (units + 1) / 2);
  float *scales = be_poisoned_f32(be, (int64_t)units * B);
  const StepParams values = {.step = step, .first_sample = first};
  StepParams *at = be_copy_bytes(be, &values, sizeof values);
  be->ops->drop_path_scales(be, scales, rates, units, B, seed, at);
  be_read_f32(be, scales_h, scales, (int64_t)units * B);
  be_free(be, rates);
  be_free(be, scales);
  be_free(be, at);
}

static void check_drop_path(BackendPair *p) {
  // Swin-T's 12 blocks (24 units) at rate linspace(0, 0.2), batch 64; the seed and the step use
  // their high 32 bits, which the key folds in.
  enum { BLOCKS = 12, UNITS = 2 * BLOCKS, B = 64 };
  float rates[BLOCKS];
  for (int i = 0; i < BLOCKS; i++) rates[i] = 0.2f * (float)i / (BLOCKS - 1);
  const uint64_t seed = 0x9e3779b97f4a7c15ull;
  const int64_t steps[2] = {7, ((int64_t)1 << 33) + 5};
  for (int k = 0; k < 2; k++) {
    char ctx[256];
    snprintf(ctx, sizeof ctx, "drop_path_scales [%s] %d units x %d samples, step %lld",
             p->precision, UNITS, B, (long long)steps[k]);
    float *want = test_alloc_floats(UNITS * B), *got = test_alloc_floats(UNITS * B);
    drop_on(&p->cpu, rates, UNITS, B, 0, seed, steps[k], want);
    drop_on(&p->gpu, rates, UNITS, B, 0, seed, steps[k], got);
    test_same_bits(ctx, "scales", got, want, UNITS * B);
    // Rank 1 of 2 draws samples [B/2, B): the second half of every unit's row, on both backends.
    enum { HALF = B / 2 };
    float *half_cpu = test_alloc_floats(UNITS * HALF), *half_gpu = test_alloc_floats(UNITS * HALF);
    float *slice = test_alloc_floats(UNITS * HALF);
    drop_on(&p->cpu, rates, UNITS, HALF, HALF, seed, steps[k], half_cpu);
    drop_on(&p->gpu, rates, UNITS, HALF, HALF, seed, steps[k], half_gpu);
    for (int u = 0; u < UNITS; u++)
      memcpy(slice + u * HALF, want + u * B + HALF, sizeof(float) * HALF);
    test_same_bits(ctx, "first_sample 32: the CPU's scales = the batch's second half", half_cpu,
                   slice, UNITS * HALF);
    test_same_bits(ctx, "first_sample 32: the GPU's scales = the batch's second half", half_gpu,
                   slice, UNITS * HALF);
    free(half_cpu);
    free(half_gpu);
    free(slice);
    // The draw must reach both outcomes, or the test would not tell them apart.
    int zeros = 0, kept = 0;
    for (int i = 0; i < UNITS * B; i++) {
      zeros += want[i] == 0.0f;
      kept += want[i] > 1.0f;
    }
    test_check(zeros > 0 && kept > 0, "%s: both outcomes drawn (%d dropped, %d kept and scaled)",
               ctx, zeros, kept);
    free(want);
    free(got);
  }
}

// Holds a stream for 300 ms (a host function), so work queued behind it waits.
static void CUDART_CB hold_stream(void *arg) {
  (void)arg;
  struct timespec t = {.tv_sec = 0, .tv_nsec = 300 * 1000 * 1000};
  nanosleep(&t, NULL);
}

// step_params_set: a copy from page-locked memory reads it when it runs, so the CUDA backend
// writes each step's values into the next slot of a ring (64 slots, src/model/backend_cuda.cu) and
// waits before reusing a slot whose copy has not run. With the compute stream held up, 160 writes
// (each followed by a drop-path draw at its step and first sample into its own buffer) wrap the
// ring: the host must wait for the held copies (host_waits grows), and every draw must be the
// CPU's for its own step and first sample; a slot overwritten before its copy ran would give a
// later write's draws.
static void check_step_params_ring(BackendPair *p) {
  enum { UNITS = 4, B = 64, WRITES = 160 };
  const float rates[UNITS / 2] = {0.3f, 0.5f};
  const uint64_t seed = 0x5eed;
  Backend *be = &p->gpu;
  float *rates_d = be_copy_f32(be, rates, UNITS / 2);
  StepParams *at = be_step_params(be, 0, 0.0f);
  float *scales[WRITES];
  for (int k = 0; k < WRITES; k++) scales[k] = be_poisoned_f32(be, UNITS * B);
  cudaStream_t side;
  cudaEvent_t held;
  CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreateWithFlags(&held, cudaEventDisableTiming));
  CUDA_CHECK(cudaLaunchHostFunc(side, hold_stream, NULL));
  CUDA_CHECK(cudaEventRecord(held, side));
  be->ops->wait_event(be, held);
  int64_t waits0 = be->host_waits;
  for (int k = 0; k < WRITES; k++) {
    StepParams values = {.step = 1000 + 7 * k, .first_sample = 3 * k, .lr = (float)k};
    be->ops->step_params_set(be, at, &values);
    be->ops->drop_path_scales(be, scales[k], rates_d, UNITS, B, seed, at);
  }
  int64_t ring_waits = be->host_waits - waits0;
  int wrong = 0, first_wrong = -1;
  float *want = test_alloc_floats(UNITS * B), *got = test_alloc_floats(UNITS * B);
  for (int k = 0; k < WRITES; k++) {
    drop_on(&p->cpu, rates, UNITS, B, 3 * k, seed, 1000 + 7 * k, want);
    be_read_f32(be, got, scales[k], UNITS * B);
    if (memcmp(got, want, sizeof(float) * UNITS * B) != 0 && wrong++ == 0) first_wrong = k;
  }
  test_check(wrong == 0,
             "step_params_set [%s]: %d writes queued behind a held stream, each draw at its own "
             "step (%d wrong, first at write %d)",
             p->precision, WRITES, wrong, first_wrong);
  test_check(ring_waits > 0,
             "step_params_set [%s]: %d writes wrap the ring, so the host waited for held copies "
             "(%lld waits)",
             p->precision, WRITES, (long long)ring_waits);
  free(want);
  free(got);
  for (int k = 0; k < WRITES; k++) be_free(be, scales[k]);
  be_free(be, at);
  be_free(be, rates_d);
  CUDA_CHECK(cudaEventDestroy(held));
  CUDA_CHECK(cudaStreamDestroy(side));
}

// Negative control: the GPU normalizing with channel 0's mean off by 1e-3 must not match.
static void negative_control(BackendPair *p, TestRng *rng) {
  const PatchShape *s = &shapes[0];
  const int64_t n = patch_count(s), n_in = input_count(s);
  uint8_t *px = (uint8_t *)malloc_check((size_t)n_in);
  for (int64_t i = 0; i < n_in; i++) px[i] = (uint8_t)(test_rng_u64(rng) >> 56);
  Normalize off = norm;
  off.mean[0] += 1e-3f;
  float *want = test_alloc_floats(n), *got = test_alloc_floats(n);
  patch_on(&p->cpu, s, px, DTYPE_U8, norm, want);
  patch_on(&p->gpu, s, px, DTYPE_U8, off, got);
  int64_t differ = 0;
  for (int64_t i = 0; i < n; i++) differ += memcmp(&got[i], &want[i], sizeof(float)) != 0;
  test_check(differ > 0,
             "negative control: patch_embed_input [%s], GPU mean[0] + 1e-3: %lld of "
             "%lld values differ (must be > 0)",
             p->precision, (long long)differ, (long long)n);
  free(px);
  free(want);
  free(got);
}
#endif

int main(void) {
  GPU_TEST_MAIN_BEGIN();
#ifdef SWIN_HAVE_CUDA
  TestRng rng = {.state = 0x9a7c4};
  // The CPU normalizes uint8 input in its scratch (B*H*W*Cin floats).
  BackendNeeds needs = {.max_elements = 1, .max_rows = 1, .max_width = 1, .max_batch = 1};
  for (int i = 0; i < NUM_SHAPES; i++)
    if (input_count(&shapes[i]) > needs.max_elements) needs.max_elements = input_count(&shapes[i]);
  for (int pi = 0; pi < GPU_TEST_PRECISIONS; pi++) {
    BackendPair p;
    backend_pair_create(&p, gpu_test_precisions[pi], &needs);
    for (int si = 0; si < NUM_SHAPES; si++) {
      check_patch(&p, &shapes[si], DTYPE_U8, &rng);
      check_patch(&p, &shapes[si], DTYPE_F32, &rng);
    }
    check_drop_path(&p);
    if (pi == 0) check_step_params_ring(&p);
    if (pi == 0) negative_control(&p, &rng);
    backend_pair_destroy(&p);
  }
#endif
  return test_finish();
}
