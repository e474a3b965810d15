// test_gpu_util.h: what the GPU tests share on top of test_util.h. A GPU test runs one op of the
// backend table (src/model/backend.h) on the CUDA backend, in each compute precision, and on the
// CPU backend (fp32, the reference kernels: the spec), from the same host inputs, and compares what
// comes back tensor by tensor.
//
// The helpers take any Backend, so one function runs a case on either backend: inputs are copied
// into fresh backend memory (act tensors converted to the backend's compute type), outputs are
// fresh backend memory with every byte 0xFF (NaN in f32, bf16 and f16, so an element the op
// forgets to write fails the comparison), and results come back as host floats. Inputs meant for
// act tensors are rounded to the compute type first (test_round_all), so both backends see the
// same values and only the op's own arithmetic and the roundings of its stored outputs differ.
//
// Without the CUDA backend in the build, or without a device at run time, a GPU test prints a
// SKIP line and exits 77 (ctest shows it as skipped).
#pragma once
#include "tests/util/test_util.h"

#ifdef SWIN_HAVE_CUDA
#include <stdbool.h>

#include "src/base/cuda_util.h"
#include "src/io/safetensors.h"
#include "src/model/backend.h"

static inline void gpu_test_require_device(void) {
  if (!cuda_device_available() || !backend_cuda_usable()) {
    printf("SKIP: no CUDA device\n");
    exit(77);
  }
}
#define GPU_TEST_MAIN_BEGIN() gpu_test_require_device()

// Raw device buffers, for tests of code below the backend table (the NCCL all-reduce).
static inline void *gpu_alloc(size_t bytes) {
  void *p = NULL;
  CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 4));
  return p;
}
// Host copy of n device floats (synchronizes).
static inline void gpu_download(float *host, const float *dev, int64_t n) {
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemcpy(host, dev, sizeof(float) * (size_t)n, cudaMemcpyDeviceToHost));
}
// All bits set: a NaN in every float.
static inline void gpu_poison(float *dev, int64_t n) {
  CUDA_CHECK(cudaMemset(dev, 0xFF, sizeof(float) * (size_t)n));
}

// ---- the two backends -------------------------------------------------------------------------

// The compute precisions of the CUDA backend, each compared with the fp32 CPU backend.
static const char *const gpu_test_precisions[] = {"fp32", "bf16", "fp16"};
#define GPU_TEST_PRECISIONS 3

typedef struct {
  Backend cpu;  // the reference: fp32
  Backend gpu;  // the CUDA backend in `precision`
  const char *precision;
} BackendPair;

// Both backends, with their scratch reserved for needs (as model_create does); exits on failure.
static inline void backend_pair_create(BackendPair *p, const char *precision,
                                       const BackendNeeds *needs) {
  Error err;
  memset(p, 0, sizeof *p);
  if (backend_create(&p->cpu, "cpu", "fp32", &err) != 0 ||
      backend_create(&p->gpu, "cuda", precision, &err) != 0) {
    printf("FAIL cannot create the backends (cuda %s): %s\n", precision, err.msg);
    exit(1);
  }
  p->precision = precision;
  p->cpu.ops->reserve(&p->cpu, needs);
  p->gpu.ops->reserve(&p->gpu, needs);
}

static inline void backend_pair_destroy(BackendPair *p) {
  backend_destroy(&p->gpu);
  backend_destroy(&p->cpu);
}

// ---- rounding to the compute type -------------------------------------------------------------

// x as it reads back after a store as dt (round to nearest even, as the CUDA conversions do).
static inline float test_round(DType dt, float x) {
  if (dt == DTYPE_BF16) return bf16_to_f32(f32_to_bf16(x));
  if (dt == DTYPE_F16) return f16_to_f32(f32_to_f16(x));
  return x;
}
static inline void test_round_all(DType dt, float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) x[i] = test_round(dt, x[i]);
}

// ---- backend memory ---------------------------------------------------------------------------

static inline void *be_copy_bytes(Backend *be, const void *host, size_t bytes) {
  void *d = be->ops->alloc(be, bytes);
  be->ops->upload(be, d, host, bytes);
  return d;
}
// Overwrites n elements of an act tensor with host floats converted to the compute type.
// StepParams {step, lr} (first sample 0) in fresh backend memory (for the ops that read the step's
// values there).
static inline StepParams *be_step_params(Backend *be, int64_t step, float lr) {
  StepParams values = {.step = step, .lr = lr};
  return (StepParams *)be_copy_bytes(be, &values, sizeof values);
}
static inline void be_write_act(Backend *be, void *dev, const float *host, int64_t n) {
  if (be->act == DTYPE_F32) {
    be->ops->upload(be, dev, host, sizeof(float) * (size_t)n);
    return;
  }
  uint16_t *staging = (uint16_t *)malloc_check(sizeof(uint16_t) * (size_t)n);
  for (int64_t i = 0; i < n; i++)
    staging[i] = be->act == DTYPE_BF16 ? f32_to_bf16(host[i]) : f32_to_f16(host[i]);
  be->ops->upload(be, dev, staging, sizeof(uint16_t) * (size_t)n);
  free(staging);
}
static inline float *be_copy_f32(Backend *be, const float *host, int64_t n) {
  return (float *)be_copy_bytes(be, host, sizeof(float) * (size_t)n);
}
// n host floats as a new act tensor (in the compute type be->act).
static inline void *be_copy_act(Backend *be, const float *host, int64_t n) {
  void *d = be->ops->alloc(be, dtype_size(be->act) * (size_t)n);
  be_write_act(be, d, host, n);
  return d;
}
// Backend memory of `bytes` with every byte 0xFF.
static inline void *be_poisoned(Backend *be, size_t bytes) {
  unsigned char *ones = (unsigned char *)malloc_check(bytes);
  memset(ones, 0xFF, bytes);
  void *d = be_copy_bytes(be, ones, bytes);
  free(ones);
  return d;
}
static inline float *be_poisoned_f32(Backend *be, int64_t n) {
  return (float *)be_poisoned(be, sizeof(float) * (size_t)n);
}
static inline void *be_poisoned_act(Backend *be, int64_t n) {
  return be_poisoned(be, dtype_size(be->act) * (size_t)n);
}
// Host floats from backend memory (waits for the queue).
static inline void be_read_f32(Backend *be, float *host, const float *dev, int64_t n) {
  be->ops->download(be, host, dev, sizeof(float) * (size_t)n);
}
static inline void be_read_act(Backend *be, float *host, const void *dev, int64_t n) {
  if (be->act == DTYPE_F32) {
    be_read_f32(be, host, (const float *)dev, n);
    return;
  }
  uint16_t *staging = (uint16_t *)malloc_check(sizeof(uint16_t) * (size_t)n);
  be->ops->download(be, staging, dev, sizeof(uint16_t) * (size_t)n);
  for (int64_t i = 0; i < n; i++)
    host[i] = be->act == DTYPE_BF16 ? bf16_to_f32(staging[i]) : f16_to_f32(staging[i]);
  free(staging);
}
static inline void be_free(Backend *be, void *dev) {
  if (dev) be->ops->release(be, dev);
}

// ---- tolerances -------------------------------------------------------------------------------
// Relative, normwise: ||got - want|| / ||want||.
//
// The same fp32 math in another order: the GPU reduces in fp32 (warp shuffles, cuBLAS's
// blocking) and fuses multiply-adds where the CPU reduces in double or in another fp32 order.
// That is a few 1e-7 relative at these sizes; 1e-5 leaves room, and an indexing error is O(1).
#define TOL_F32 1e-5

// Unit roundoff of dt: one rounding moves a value by at most u of itself (bf16 keeps 8
// significant bits: 2^-8; f16 11: 2^-11; f32 24: 2^-24).
static inline double unit_roundoff(DType dt) {
  return dt == DTYPE_BF16 ? 0x1p-8 : dt == DTYPE_F16 ? 0x1p-11 : 0x1p-24;
}
// An output both backends compute in fp32 from the same inputs and the GPU rounds once to dt
// when it stores it: |round(y) - y| <= u |y| element by element, so at most u normwise, plus the
// fp32 differences. (Typical roundings are well inside the bound: a host emulation of the GPU's
// stores measured 1.7e-3 in bf16 and 2.1e-4 in fp16 on these tests' inputs.)
static inline double tol_stored(DType dt) {
  return unit_roundoff(dt) + TOL_F32;
}
// An output behind two roundings to dt, or one the op amplifies (a LayerNorm of a rounded sum
// scales its rounding by |x| / std, up to 3.5 for these tests' rows; GELU of a rounded
// pre-activation): a few u at worst, ~1 u in practice since roundings are not all worst case.
// The emulation measured 2.7e-3 in bf16 and 3.3e-4 in fp16; 1e-2 (2.6 u) and 3e-3 (6 u).
static inline double tol_chained(DType dt) {
  return dt == DTYPE_BF16 ? 1e-2 : dt == DTYPE_F16 ? 3e-3 : TOL_F32;
}

// ---- comparisons ------------------------------------------------------------------------------

// Relative error of got against want; with init, of the increments got - init and want - init
// (outputs accumulated onto init: init does not hide the op's share, and an op that overwrote
// instead of adding fails). All in double. worst: the element with the largest difference, or
// the first non-finite one (then the error is +inf).
static inline double test_rel_err_worst(const float *got, const float *want, const float *init,
                                        int64_t n, int64_t *worst) {
  double num = 0, den = 0, big = -1;
  *worst = 0;
  for (int64_t i = 0; i < n; i++) {
    double g = got[i], w = want[i], z = init ? init[i] : 0.0;
    if (!isfinite(g) || !isfinite(w)) {
      *worst = i;
      return INFINITY;
    }
    double d = (g - z) - (w - z);
    num += d * d;
    den += (w - z) * (w - z);
    if (fabs(d) > big) {
      big = fabs(d);
      *worst = i;
    }
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

// One check of a CUDA result against the CPU's: ctx names the op, case and precision, tensor the
// output. must_fail turns it into a negative control (passes when the error exceeds tol).
static inline int test_compare_ex(const char *ctx, const char *tensor, const float *got,
                                  const float *want, const float *init, int64_t n, double tol,
                                  bool must_fail) {
  int64_t w = 0;
  double e = test_rel_err_worst(got, want, init, n, &w);
  bool ok = must_fail ? !(e <= tol) : e <= tol;
  return test_check(ok, "%s: %s%s rel_err %.3e (%s %.1e), worst [%lld] gpu %.7g cpu %.7g", ctx,
                    tensor, init ? " (increment)" : "", e, must_fail ? "must exceed" : "tol", tol,
                    (long long)w, n ? (double)got[w] : 0.0, n ? (double)want[w] : 0.0);
}
static inline int test_compare(const char *ctx, const char *tensor, const float *got,
                               const float *want, int64_t n, double tol) {
  return test_compare_ex(ctx, tensor, got, want, NULL, n, tol, false);
}
// An output accumulated (+=) onto init by both backends.
static inline int test_compare_increment(const char *ctx, const char *tensor, const float *got,
                                         const float *want, const float *init, int64_t n,
                                         double tol) {
  return test_compare_ex(ctx, tensor, got, want, init, n, tol, false);
}
// A negative control: a deliberately wrong GPU result the comparison must reject.
static inline int test_must_differ(const char *ctx, const char *tensor, const float *got,
                                   const float *want, int64_t n, double tol) {
  return test_compare_ex(ctx, tensor, got, want, NULL, n, tol, true);
}

// Bitwise equality of n floats (two runs of one op, or a result and the bits it must have).
static inline int test_same_bits(const char *ctx, const char *what, const float *a, const float *b,
                                 int64_t n) {
  int64_t differ = 0, first = -1;
  for (int64_t i = 0; i < n; i++)
    if (memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      if (first < 0) first = i;
      differ++;
    }
  if (first < 0)
    return test_check(1, "%s: %s bitwise equal (%lld values)", ctx, what, (long long)n);
  return test_check(0, "%s: %s bitwise equal: %lld of %lld differ, first [%lld] %.9g vs %.9g", ctx,
                    what, (long long)differ, (long long)n, (long long)first, (double)a[first],
                    (double)b[first]);
}

// Host floats (at least one), filled uniformly in [lo, hi) and rounded to dt.
static inline float *test_random_act(TestRng *r, DType dt, int64_t n, float lo, float hi) {
  float *x = test_alloc_floats(n);
  test_fill_uniform(r, x, n, lo, hi);
  test_round_all(dt, x, n);
  return x;
}
static inline float *test_copy_floats(const float *src, int64_t n) {
  float *x = test_alloc_floats(n);
  memcpy(x, src, sizeof(float) * (size_t)(n > 0 ? n : 0));
  return x;
}
#else
#define GPU_TEST_MAIN_BEGIN()                         \
  do {                                                \
    printf("SKIP: built without the CUDA backend\n"); \
    return 77;                                        \
  } while (0)
#endif
