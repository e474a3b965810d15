// test_gpu_gelu.c: kernels/cuda/gelu.cu against the CPU reference (kernels/cpu/gelu.c) on the
// same random inputs as norms, element by element against the exact GELU written with erfc in
// double (1e6 points, the far left tail, next to the root of GELU'), at edge and non-finite
// inputs, in place (dinp == dout), on the 16-byte and the scalar path (misaligned pointers,
// ragged tails), at a Swin-T MLP size, and for bitwise-repeatable results.
#include "tests/test_gpu_util.h"

#ifdef SWIN_HAVE_CUDA
#include "kernels/gelu.h"

// The root of GELU'(x) = Phi(x) + x phi(x).
#define GELU_GRAD_ROOT -0.7517915368

static float *host_alloc(int64_t n) {
  return malloc(sizeof(float) * (size_t)(n ? n : 1));
}

// x Phi(x) with Phi(x) = erfc(-x / sqrt 2) / 2 in double: accurate in the left tail, where
// 1 + erf cancels. Non-finite inputs give what the formula gives (GELU(-inf) = -inf * 0 = NaN).
static double gelu_ref(double x) {
  return x * 0.5 * erfc(-x / sqrt(2.0));
}
static double gelu_grad_ref(double x) {
  return 0.5 * erfc(-x / sqrt(2.0)) + x * exp(-0.5 * x * x) / sqrt(2.0 * acos(-1.0));
}

// GPU forward and backward (dout = 1, so dinp is GELU' itself) of host x (n); out and grad
// receive the results.
static void gpu_gelu_and_grad(float *out, float *grad, const float *x, int64_t n) {
  float *ones = host_alloc(n);
  for (int64_t i = 0; i < n; i++) ones[i] = 1.0f;
  float *d_x = gpu_upload(x, n), *d_ones = gpu_upload(ones, n);
  float *d_out = gpu_alloc(sizeof(float) * (size_t)(n ? n : 1));
  gpu_poison(d_out, n);
  gelu_forward_cuda(d_out, d_x, n, 0);
  gpu_download(out, d_out, n);
  gpu_poison(d_out, n);
  gelu_backward_cuda(d_out, d_x, d_ones, n, 0);
  gpu_download(grad, d_out, n);
  CUDA_CHECK(cudaFree(d_x));
  CUDA_CHECK(cudaFree(d_ones));
  CUDA_CHECK(cudaFree(d_out));
  free(ones);
}

// |got - want| / max(|want|, 1e-6): relative where the value is not tiny, absolute 1e-12 per
// 1e-6 of tolerance below; NaN counts as an infinite error.
static double contract_err(float got, double want) {
  double e = fabs(got - want) / fmax(fabs(want), 1e-6);
  return isnan(e) ? INFINITY : e;
}

// The GPU's error bounds, from CUDA's documented accuracy (normcdff <= 5 ulp, expf <= 2 ulp) and
// the few roundings added here:
//  - GELU = x Phi: <= 6 ulp, 7.2e-7 relative: tolerance 1e-6 (the CPU's contract).
//  - GELU' = Phi + x phi, away from its root: each term within ~6e-7 relative, and there the sum
//    is at least half its larger term (kernels/cpu/gelu.c), so 2e-6 relative.
//  - GELU' within 0.6 of its root x0 = -0.7518: the terms (Phi <= 0.44, |x phi| <= 0.25) cancel;
//    5 ulp of Phi (<= 1.5e-7) plus 3 ulp of x phi (<= 0.5e-7) is the absolute error: 5e-7.
// Any formula mistake (the tanh approximation is 1e-4 off at x = 1) fails these by far.
#define TOL_FORWARD 1e-6
#define TOL_GRAD 2e-6
#define TOL_GRAD_NEAR_ROOT_ABS 5e-7

// Element-by-element check of x (n) against the double formula. relative: plain relative error
// (for the left tail, where the contract's absolute floor would pass anything).
static void check_elements(const char *what, const float *x, int64_t n, int relative) {
  float *out = host_alloc(n), *grad = host_alloc(n);
  gpu_gelu_and_grad(out, grad, x, n);
  double worst_f = 0, worst_g = 0, worst_root = 0;
  float at_f = 0, at_g = 0, at_root = 0;
  int64_t near_root = 0;
  for (int64_t i = 0; i < n; i++) {
    double want = gelu_ref(x[i]), want_d = gelu_grad_ref(x[i]);
    double ef = relative ? fabs(out[i] / want - 1) : contract_err(out[i], want);
    if (!(ef <= worst_f)) worst_f = ef, at_f = x[i];
    if (fabs(x[i] - GELU_GRAD_ROOT) < 0.6) {
      near_root++;
      double e = fabs(grad[i] - want_d);
      if (!(e <= worst_root)) worst_root = e, at_root = x[i];
    } else {
      double eg = relative ? fabs(grad[i] / want_d - 1) : contract_err(grad[i], want_d);
      if (!(eg <= worst_g)) worst_g = eg, at_g = x[i];
    }
  }
  char name[96];
  snprintf(name, sizeof name, "%s forward", what);
  test_check(worst_f <= TOL_FORWARD, "%-52s max err %.3e at x = %.9g (tol %.0e)", name, worst_f,
             at_f, TOL_FORWARD);
  snprintf(name, sizeof name, "%s GELU'", what);
  test_check(worst_g <= TOL_GRAD, "%-52s max err %.3e at x = %.9g (tol %.0e)", name, worst_g, at_g,
             TOL_GRAD);
  if (near_root > 0) {
    snprintf(name, sizeof name, "%s GELU' near its root (absolute)", what);
    test_check(worst_root <= TOL_GRAD_NEAR_ROOT_ABS, "%-52s max err %.3e at x = %.9g (tol %.0e)",
               name, worst_root, at_root, TOL_GRAD_NEAR_ROOT_ABS);
  }
  free(out);
  free(grad);
}

static void check_accuracy(TestRng *rng) {
  const int64_t n = 1000000;
  float *x = host_alloc(n);
  // Half over [-10, 10], half over [-1.5, 1.5] where GELU' crosses zero and Phi is near 1/2.
  for (int64_t i = 0; i < n; i++)
    x[i] = i % 2 ? test_rng_uniform(rng, -10.0f, 10.0f) : test_rng_uniform(rng, -1.5f, 1.5f);
  check_elements("1e6 points vs double", x, n, 0);
  // The left tail down to -12.5, below which Phi(x) is no longer a normal float.
  test_fill_uniform(rng, x, n, -12.5f, -5.0f);
  check_elements("tail [-12.5, -5] vs double (relative)", x, n, 1);
  free(x);
}

// Edge inputs: finite ones within the bounds above (none is near the root), non-finite ones as
// the double formula: GELU(+inf) = +inf, NaN for the rest.
static void check_edges(void) {
  const float x[] = {0.0f,   -0.0f,  1e-8f,   -1e-8f, 5.0f,   -5.0f,    10.0f,     -10.0f, 20.0f,
                     -20.0f, 100.0f, -100.0f, 1e30f,  -1e30f, INFINITY, -INFINITY, NAN};
  const int n = sizeof x / sizeof x[0];
  float out[sizeof x / sizeof x[0]], grad[sizeof x / sizeof x[0]];
  gpu_gelu_and_grad(out, grad, x, n);
  double worst = 0;
  int bad_nonfinite = 0;
  for (int i = 0; i < n; i++) {
    double want = gelu_ref(x[i]), want_d = gelu_grad_ref(x[i]);
    if (isfinite(x[i])) {
      worst = fmax(worst, fmax(contract_err(out[i], want) / TOL_FORWARD,
                               contract_err(grad[i], want_d) / TOL_GRAD));
    } else {
      bad_nonfinite += !(isnan(want) ? isnan(out[i]) : out[i] == want);
      bad_nonfinite += !(isnan(want_d) ? isnan(grad[i]) : grad[i] == want_d);
    }
  }
  test_check(worst <= 1.0, "%-52s max err %.3f of the tolerance",
             "edges 0, +-1e-8, +-5, +-10, +-20, +-100, +-1e30", worst);
  test_check(bad_nonfinite == 0, "%-52s %d wrong", "inf, -inf, NaN as in the double formula",
             bad_nonfinite);
}

// Against the CPU kernel on n elements, device pointers shifted by `offset` floats (1: the
// scalar path). Also in place, and twice for bitwise repeatability.
static void check_against_cpu(TestRng *rng, const char *what, int64_t n, int offset) {
  printf("-- %s: n=%lld%s\n", what, (long long)n, offset ? " (misaligned by one float)" : "");
  float *x = host_alloc(n), *dout = host_alloc(n);
  float *want = host_alloc(n), *want_dinp = host_alloc(n);
  float *out = host_alloc(n), *dinp = host_alloc(n), *again = host_alloc(n);
  test_fill_uniform(rng, x, n, -6.0f, 6.0f);
  test_fill_uniform(rng, dout, n, -1.0f, 1.0f);
  gelu_forward_cpu(want, x, n);
  gelu_backward_cpu(want_dinp, x, dout, n);

  float *base_x = gpu_alloc(sizeof(float) * (size_t)(n + offset));
  float *base_dout = gpu_alloc(sizeof(float) * (size_t)(n + offset));
  float *base_out = gpu_alloc(sizeof(float) * (size_t)(n + offset));
  float *d_x = base_x + offset, *d_dout = base_dout + offset, *d_out = base_out + offset;
  CUDA_CHECK(cudaMemcpy(d_x, x, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_dout, dout, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice));

  gpu_poison(d_out, n);
  gelu_forward_cuda(d_out, d_x, n, 0);
  gpu_download(out, d_out, n);
  // Both sides within ~7e-7 of the exact value element by element, far less on average; as a
  // norm, 1e-6.
  test_close("forward out vs CPU", out, want, n, 1e-6);
  gpu_poison(d_out, n);
  gelu_forward_cuda(d_out, d_x, n, 0);
  gpu_download(again, d_out, n);
  test_check(memcmp(out, again, sizeof(float) * (size_t)n) == 0,
             "forward bitwise equal on a second run");

  gpu_poison(d_out, n);
  gelu_backward_cuda(d_out, d_x, d_dout, n, 0);
  gpu_download(dinp, d_out, n);
  // GELU' is within 2e-6 relative away from its root and 5e-7 absolute near it; next to the
  // O(1) values elsewhere that is below 1e-6 as a norm.
  test_close("backward dinp vs CPU", dinp, want_dinp, n, 1e-6);
  // In place: dinp == dout, the same arithmetic, so the same bits.
  gelu_backward_cuda(d_dout, d_x, d_dout, n, 0);
  gpu_download(again, d_dout, n);
  test_check(memcmp(dinp, again, sizeof(float) * (size_t)n) == 0,
             "backward in place (dinp == dout) bitwise equal to out of place");

  CUDA_CHECK(cudaFree(base_x));
  CUDA_CHECK(cudaFree(base_dout));
  CUDA_CHECK(cudaFree(base_out));
  free(x), free(dout), free(want), free(want_dinp), free(out), free(dinp), free(again);
}
#endif

int main(void) {
  GPU_TEST_MAIN_BEGIN();
#ifdef SWIN_HAVE_CUDA
  TestRng rng = {.state = 0x6e1cu};
  check_accuracy(&rng);
  check_edges();
  check_against_cpu(&rng, "odd size (16-byte body, ragged tail)", 100003, 0);
  check_against_cpu(&rng, "misaligned (scalar path)", 1001, 1);
  check_against_cpu(&rng, "one element", 1, 0);
  check_against_cpu(&rng, "five elements (one vector and a tail of one)", 5, 0);
  check_against_cpu(&rng, "Swin-T stage 1 MLP hidden (B=4, 56x56, 384)", 4 * 56 * 56 * 384, 0);
#endif
  return test_finish();
}
