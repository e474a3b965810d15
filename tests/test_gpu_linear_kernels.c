// test_gpu_linear_kernels.c: the linear layers of our own kernels (kernels/gemm.h) against the
// fp32 CPU reference, in bf16.
// linear_small_k_forward_cuda, the small-K layer with the bias and GELU in its epilogue:
//   pre (N, OC) against linear_forward_cpu on the same bf16-rounded inputs, element by element;
//   post (N, OC) against gelu_forward_cpu of that reference, element by element, and bitwise
//   against gelu_forward_cuda(DTYPE_BF16) run on the kernel's own pre;
//   post == NULL leaves the post buffer untouched; bias == NULL adds nothing.
//   Shapes: Swin-T's (IC, OC) of stages 0 and 1 with N = 1, 77, 4099 (one and two partial row
//   tiles) and 50,000 (many tiles per CTA); widths that are not multiples of 96 (the 64- and
//   32-column slices) and Swin-B's stage-0 shapes (IC = 128) once each.
// linear_hopper_forward_cuda, the wgmma/TMA layer with the same contract (on a compute capability
//   9.0 device and a build for sm_90a; otherwise these cases print SKIP), the same checks: every
//   forward linear shape of Swin-T (qkv, proj, fc1 with its GELU, fc2 and the patch merging
//   reductions of all four stages) with N = 1, 77 and 4099 (partial tiles of 128 rows), shapes
//   whose K is not a multiple of the 64-element slab and whose OC leaves a partial column tile,
//   with and without the bias and the GELU; and each tile width (linear_hopper_forward_tile).
// linear_hopper_dgelu_cuda, the MLP backward's d(hidden) product with the GELU pass in its
//   epilogue: dpre against the CPU's (dout weight) GELU'(pre), element by element; hidden
//   bitwise against gelu_recompute_backward_cuda's on the same pre; dpre_sums (started from
//   random values: the kernel adds) against the column sums of the downloaded dpre. Swin-T's
//   four MLP shapes with N = 77 and 4099, a K that is not a multiple of 64 with a partial column
//   tile, each tile width, dpre_sums NULL, and N = 50,000 (many tiles per CTA).
// linear_hopper_dgelu_dweight_cuda, the same with fc2's weight gradient in the kernel: dpre
//   bitwise linear_hopper_dgelu_tile's at width 128, dpre_sums as above, dweight (started from
//   random values: the kernel adds) against dout^T hidden in double, hidden being
//   gelu_recompute_backward_cuda's bf16 GELU(pre), and the same bits on a second run. The
//   stage-0 MLPs of Swin-T and Swin-B (C 96, 128) with N = 77, 4099 and 50,000, a K that is not
//   a multiple of 64 (two slabs, the last partial) with a partial column tile, one slab, and
//   dpre_sums NULL.
// linear_hopper_gelu_forward_cuda, the MLP's second layer with the GELU applied to its input in
//   shared memory: out bitwise linear_hopper_forward_tile (same width) of gelu_forward_cuda(pre),
//   and against the CPU's linear_forward_cpu(gelu_forward_cpu(pre)); Swin-T's four fc2 shapes
//   with N = 77 and 4099, a K that is not a multiple of 64 with a partial column tile, each tile
//   width, and no bias.
// linear_small_k_residual_layernorm_cuda, the small-K layer with the residual + LayerNorm forward
//   in its epilogue: x_out, ln_out, mean and rstd bitwise the layer followed by
//   residual_layernorm_forward_cuda (its definition, run on the GPU) on Swin-T's stage-0 map of 2
//   and 16 images, a ragged last tile, an unshifted map without drop path or bias, and Swin-B's
//   stage 0 (C = 128).
// linear_hopper_gelu_residual_layernorm_cuda, the MLP's second layer with the residual +
//   LayerNorm forward in its epilogue: the same bitwise check against
//   linear_hopper_gelu_forward_tile (width C) followed by residual_layernorm_forward_cuda, for C
//   96, 128 and 192, LN into shifted windows, in token order, or absent (a stage's end).
// Outputs start as 0xFF bytes (bf16 NaN), so a missed element fails.
// The two fused kernels' host functions refuse, with a message and an abort, what the backend
// must check before calling them (a width they do not serve, a pointer not 16-byte aligned,
// x_out aliasing x_in, no ln_out for the small-K one): each refusal runs in a forked child on
// fake pointers, since it aborts before touching them or the device.
#define _POSIX_C_SOURCE 200809L
#include "tests/util/test_child.h"
#include "tests/util/test_gpu_util.h"

#ifdef SWIN_HAVE_CUDA
#include "kernels/gelu.h"
#include "kernels/gemm.h"
#include "kernels/layernorm.h"

typedef struct {
  int IC, OC;
} SmallKShape;

static const SmallKShape swin_shapes[] = {
    {96, 96}, {96, 288}, {96, 384}, {192, 192}, {192, 576}, {192, 768},
};
static const int64_t swin_rows[] = {1, 77, 4099, 50000};
// Widths served by the narrower slices (OC % 96 != 0), and Swin-B's stage 0 (IC = 128: proj,
// qkv, fc1).
static const SmallKShape other_shapes[] = {{96, 128},  {192, 64},  {96, 160},
                                           {128, 128}, {128, 384}, {128, 512}};

typedef struct {
  bool bias, post;
} SmallKMode;

// Tolerances, per element, from the sizes of the terms. The kernel and the CPU both sum the K
// products in f32, in different orders (tensor cores align addends to the largest exponent and
// truncate, Fasi et al. 2021): each side is within ~K 2^-24 S of the exact sum, S = sum |x_k w_k|
// + |b|, so the two differ by at most K 2^-23 S; doubled for the tensor cores' truncation,
// K 2^-22 S. The kernel then rounds once to bf16 (8 significant bits, so a relative error of at
// most 2^-8): 2^-8 |y| more. An indexing error moves an element by ~S / sqrt(K), 1000x beyond the
// accumulation term.
static double pre_bound(double y, double S, int K) {
  return 0x1p-8 * fabs(y) + K * 0x1p-22 * S;
}
// post = bf16(G~(p)) against G(y), G~ the GPU's bf16 GELU: |G'| <= 1.13 carries p's error e
// (at most pre_bound) through G; the final rounding adds 2^-8 |G(p)| <= 2^-8 (|G(y)| + 1.13 e);
// G~'s Phi is within 2.5e-7 of Phi (kernels/cuda/gelu.cuh), times |p|: 4e-7 (|y| + e) covers it
// and the CPU's own f32 error.
static double post_bound(double y, double gy, double e) {
  return 1.13 * e + 0x1p-8 * (fabs(gy) + 1.13 * e) + 4e-7 * (fabs(y) + e);
}

static uint16_t *to_bf16_bits(const float *x, int64_t n) {
  uint16_t *b = malloc_check(sizeof(uint16_t) * (size_t)(n > 0 ? n : 1));
  for (int64_t i = 0; i < n; i++) b[i] = f32_to_bf16(x[i]);
  return b;
}
static void *upload_bf16(const float *x, int64_t n) {
  uint16_t *b = to_bf16_bits(x, n);
  void *d = gpu_alloc(sizeof(uint16_t) * (size_t)n);
  CUDA_CHECK(cudaMemcpy(d, b, sizeof(uint16_t) * (size_t)n, cudaMemcpyHostToDevice));
  free(b);
  return d;
}
static uint16_t *download_bits(const void *d, int64_t n) {
  uint16_t *b = malloc_check(sizeof(uint16_t) * (size_t)n);
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemcpy(b, d, sizeof(uint16_t) * (size_t)n, cudaMemcpyDeviceToHost));
  return b;
}
static float *upload_f32(const float *x, int64_t n) {
  float *d = gpu_alloc(sizeof(float) * (size_t)n);
  CUDA_CHECK(cudaMemcpy(d, x, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice));
  return d;
}
static void *poisoned_bf16(int64_t n) {
  void *d = gpu_alloc(sizeof(uint16_t) * (size_t)n);
  CUDA_CHECK(cudaMemset(d, 0xFF, sizeof(uint16_t) * (size_t)n));
  return d;
}

// Every element of got (bf16 bits) within bound(i) of want; prints the worst ratio err / bound
// and where it is.
static int check_within(const char *ctx, const char *tensor, const uint16_t *got, const float *want,
                        const double *bound, int64_t N, int OC) {
  int64_t worst = 0, bad = 0;
  double worst_ratio = -1.0;
  for (int64_t i = 0; i < N * OC; i++) {
    double g = bf16_to_f32(got[i]), err = fabs(g - want[i]);
    double ratio = isfinite(g) ? err / bound[i] : INFINITY;
    if (!(ratio <= 1.0)) bad++;
    if (!(ratio <= worst_ratio)) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  double g = bf16_to_f32(got[worst]);
  return test_check(bad == 0,
                    "%s: %s (%lld, %d) %lld elements out of bound; worst [%lld, %lld] gpu %.7g "
                    "cpu %.7g err %.3e bound %.3e",
                    ctx, tensor, (long long)N, OC, (long long)bad, (long long)(worst / OC),
                    (long long)(worst % OC), g, (double)want[worst], fabs(g - want[worst]),
                    bound[worst]);
}

static int check_same_bits(const char *ctx, const char *what, const uint16_t *a, const uint16_t *b,
                           int64_t N, int OC) {
  int64_t differ = 0, first = -1;
  for (int64_t i = 0; i < N * OC; i++)
    if (a[i] != b[i]) {
      if (first < 0) first = i;
      differ++;
    }
  if (first < 0)
    return test_check(1, "%s: %s bitwise equal (%lld values)", ctx, what, (long long)(N * OC));
  return test_check(0, "%s: %s: %lld of %lld differ, first [%lld, %lld] 0x%04x vs 0x%04x", ctx,
                    what, (long long)differ, (long long)(N * OC), (long long)(first / OC),
                    (long long)(first % OC), a[first], b[first]);
}

// The two kernels' common signature (kernels/gemm.h).
typedef void (*LinearKernel)(void *pre, void *post, const void *inp, const void *weight,
                             const void *bias, int64_t N, int IC, int OC, cudaStream_t stream);

static void check_case(LinearKernel kernel, const char *name, int IC, int OC, int64_t N,
                       SmallKMode mode, TestRng *rng) {
  char ctx[160];
  snprintf(ctx, sizeof ctx, "%s N=%lld IC=%d OC=%d (%s, %s)", name, (long long)N, IC, OC,
           mode.bias ? "bias" : "no bias", mode.post ? "GELU post" : "post NULL");
  const int64_t nin = N * IC, nw = (int64_t)OC * IC, nout = N * OC;
  // Pre-activations of spread ~1.7 (x in [-1, 1), w in [-5, 5) / sqrt(IC), b in [-1, 1)), so
  // GELU is exercised on both sides of 0 and into its tails.
  const float wscale = 5.0f / sqrtf((float)IC);
  float *x = test_random_act(rng, DTYPE_BF16, nin, -1.0f, 1.0f);
  float *w = test_random_act(rng, DTYPE_BF16, nw, -wscale, wscale);
  float *b = test_random_act(rng, DTYPE_BF16, OC, -1.0f, 1.0f);
  const float *bias = mode.bias ? b : NULL;

  // The reference, and S = |x| |w|^T + |b| for the bounds.
  float *y = test_alloc_floats(nout), *S = test_alloc_floats(nout);
  linear_forward_cpu(y, x, w, bias, N, IC, OC);
  float *ax = test_copy_floats(x, nin), *aw = test_copy_floats(w, nw),
        *ab = test_copy_floats(b, OC);
  for (int64_t i = 0; i < nin; i++) ax[i] = fabsf(ax[i]);
  for (int64_t i = 0; i < nw; i++) aw[i] = fabsf(aw[i]);
  for (int i = 0; i < OC; i++) ab[i] = fabsf(ab[i]);
  linear_forward_cpu(S, ax, aw, mode.bias ? ab : NULL, N, IC, OC);

  void *d_x = upload_bf16(x, nin), *d_w = upload_bf16(w, nw), *d_b = upload_bf16(b, OC);
  void *d_pre = poisoned_bf16(nout), *d_post = poisoned_bf16(nout);
  kernel(d_pre, mode.post ? d_post : NULL, d_x, d_w, mode.bias ? d_b : NULL, N, IC, OC, 0);
  CUDA_CHECK(cudaGetLastError());
  uint16_t *pre = download_bits(d_pre, nout), *post = download_bits(d_post, nout);

  double *bound = malloc_check(sizeof(double) * (size_t)nout);
  for (int64_t i = 0; i < nout; i++) bound[i] = pre_bound(y[i], S[i], IC);
  check_within(ctx, "pre", pre, y, bound, N, OC);

  if (mode.post) {
    float *gy = test_alloc_floats(nout);
    gelu_forward_cpu(gy, y, nout);
    for (int64_t i = 0; i < nout; i++) bound[i] = post_bound(y[i], gy[i], bound[i]);
    check_within(ctx, "post", post, gy, bound, N, OC);
    // The GELU pass on this kernel's pre must give the same bits.
    void *d_gelu = poisoned_bf16(nout);
    gelu_forward_cuda(DTYPE_BF16, d_gelu, d_pre, nout, 0);
    uint16_t *gelu = download_bits(d_gelu, nout);
    check_same_bits(ctx, "post vs gelu_forward_cuda(pre)", post, gelu, N, OC);
    free(gelu);
    cudaFree(d_gelu);
    free(gy);
  } else {
    int64_t touched = 0;
    for (int64_t i = 0; i < nout; i++) touched += post[i] != 0xFFFFu;
    test_check(touched == 0, "%s: post buffer untouched (%lld of %lld changed)", ctx,
               (long long)touched, (long long)nout);
  }

  void *bufs[] = {d_x, d_w, d_b, d_pre, d_post};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) CUDA_CHECK(cudaFree(bufs[i]));
  float *hs[] = {x, w, b, y, S, ax, aw, ab};
  for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++) free(hs[i]);
  free(pre);
  free(post);
  free(bound);
}

// Every forward linear layer of Swin-T (C = 96, 192, 384, 768): qkv, proj, fc1, fc2, and the
// patch merging reductions 4C -> 2C.
static const SmallKShape hopper_shapes[] = {
    {96, 288},   {96, 96},    {96, 384},  {384, 96},   {192, 576},  {192, 192},  {192, 768},
    {768, 192},  {384, 1152}, {384, 384}, {384, 1536}, {1536, 384}, {768, 2304}, {768, 768},
    {768, 3072}, {3072, 768}, {384, 192}, {768, 384},  {1536, 768},
};
// K not a multiple of 64, OC leaving partial tiles of 128 and of 256 columns.
static const SmallKShape hopper_ragged[] = {{200, 120}, {40, 264}, {136, 8}};

// linear_hopper_forward_tile at the width in hopper_tile, in check_case's signature.
static int hopper_tile;
static void hopper_at_tile(void *pre, void *post, const void *inp, const void *weight,
                           const void *bias, int64_t N, int IC, int OC, cudaStream_t stream) {
  linear_hopper_forward_tile(pre, post, inp, weight, bias, N, IC, OC, hopper_tile, stream);
}

static void check_hopper(TestRng *rng) {
  if (!linear_hopper_supported(96, 288)) {
    printf(
        "SKIP linear_hopper: not served here (needs a compute capability 9.0 device and a "
        "build for sm_90a)\n");
    return;
  }
  test_check(!linear_hopper_supported(100, 96) && !linear_hopper_supported(96, 100) &&
                 !linear_hopper_supported(0, 96),
             "linear_hopper_supported: IC and OC positive multiples of 8");
  static const int64_t rows[] = {1, 77, 4099};
  const SmallKMode plain = {.bias = true, .post = false}, fused = {.bias = true, .post = true};
  for (size_t s = 0; s < sizeof hopper_shapes / sizeof hopper_shapes[0]; s++)
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++)
      check_case(linear_hopper_forward_cuda, "linear_hopper", hopper_shapes[s].IC,
                 hopper_shapes[s].OC, rows[r],
                 hopper_shapes[s].OC == 4 * hopper_shapes[s].IC ? fused : plain, rng);
  for (size_t s = 0; s < sizeof hopper_ragged / sizeof hopper_ragged[0]; s++)
    check_case(linear_hopper_forward_cuda, "linear_hopper", hopper_ragged[s].IC,
               hopper_ragged[s].OC, 4099, fused, rng);
  check_case(linear_hopper_forward_cuda, "linear_hopper", 768, 3072, 300,
             (SmallKMode){.bias = false, .post = true}, rng);
  check_case(linear_hopper_forward_cuda, "linear_hopper", 384, 1152, 300,
             (SmallKMode){.bias = false, .post = false}, rng);
  // Every tile width on a shape that leaves a partial tile at each (OC = 520) and on one whose
  // K is not a multiple of 64.
  static const int widths[] = {96, 128, 192, 256};
  for (size_t w = 0; w < sizeof widths / sizeof widths[0]; w++) {
    hopper_tile = widths[w];
    char name[48];
    snprintf(name, sizeof name, "linear_hopper tile %d", widths[w]);
    check_case(hopper_at_tile, name, 136, 520, 1000, fused, rng);
    check_case(hopper_at_tile, name, 200, 384, 333, plain, rng);
  }
}

// dweight (OC, IC) from the kernel against dw0 + dout^T hidden (hidden: bf16 bits (N, IC)), summed
// in double. The kernel adds in f32 on the tensor cores, each CTA over its rows in steps of 16
// (at most ceil(N / 16) steps), then the CTAs in double: each step's error within 2^-22 of the
// element's sum of magnitudes S (2^-23 doubled for the tensor cores' truncation), and the final
// f32 rounding. A row missed or counted twice moves an element by ~S / sqrt(N): 60x the bound
// at N = 4099, 6x at 50,000.
static void check_dweight(const char *ctx, const float *got, const float *dw0, const float *dout,
                          const uint16_t *hidden, int64_t N, int IC, int OC) {
  int64_t bad = 0, worst = 0;
  double worst_ratio = -1.0;
  for (int k = 0; k < OC; k++)
    for (int n = 0; n < IC; n++) {
      double exact = dw0[(int64_t)k * IC + n], mag = fabs(exact);
      for (int64_t r = 0; r < N; r++) {
        const double t = (double)dout[r * OC + k] * bf16_to_f32(hidden[r * IC + n]);
        exact += t;
        mag += fabs(t);
      }
      const double b = ((N + 15) / 16 + 1) * 0x1p-22 * mag + 0x1p-23 * fabs(exact);
      const double ratio = fabs(got[(int64_t)k * IC + n] - exact) / b;
      if (!(ratio <= 1.0)) bad++;
      if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = (int64_t)k * IC + n;
    }
  test_check(bad == 0,
             "%s: dweight += dout^T hidden; %lld of %lld out of bound, worst (%lld, %lld) at %.3g "
             "of it",
             ctx, (long long)bad, (long long)OC * IC, (long long)(worst / IC),
             (long long)(worst % IC), worst_ratio);
}

// One linear_hopper_dgelu_tile case, or with dweight one linear_hopper_dgelu_dweight_cuda case
// (see the top of the file).
static void check_dgelu(int64_t N, int IC, int OC, int tile, bool sums, bool dweight,
                        TestRng *rng) {
  char ctx[160];
  snprintf(ctx, sizeof ctx, "linear_hopper_dgelu%s N=%lld IC=%d OC=%d tile %d%s",
           dweight ? "_dweight" : "", (long long)N, IC, OC, dweight ? 128 : tile,
           sums ? "" : " (sums NULL)");
  const int64_t nd = N * OC, nw = (int64_t)OC * IC, nh = N * IC;
  // d(hidden) of spread ~1.7 as in check_case; pre in [-4, 4): GELU' from ~0 through its
  // minimum near -0.75 to ~1.
  const float wscale = 5.0f / sqrtf((float)OC);
  float *dout = test_random_act(rng, DTYPE_BF16, nd, -1.0f, 1.0f);
  float *w = test_random_act(rng, DTYPE_BF16, nw, -wscale, wscale);
  float *pre = test_random_act(rng, DTYPE_BF16, nh, -4.0f, 4.0f);
  float *sums0 = test_random_act(rng, DTYPE_F32, IC, -1.0f, 1.0f);
  float *dw0 = test_random_act(rng, DTYPE_F32, nw, -1.0f, 1.0f);

  // The reference: dh = dout w (N, IC), dpre = dh GELU'(pre); S = |dout| |w| for the bounds.
  float *dh = test_alloc_floats(nh), *S = test_alloc_floats(nh), *want = test_alloc_floats(nh);
  gemm_cpu(false, false, N, IC, OC, 1.0f, dout, OC, w, IC, 0.0f, dh, IC);
  float *ad = test_copy_floats(dout, nd), *aw = test_copy_floats(w, nw);
  for (int64_t i = 0; i < nd; i++) ad[i] = fabsf(ad[i]);
  for (int64_t i = 0; i < nw; i++) aw[i] = fabsf(aw[i]);
  gemm_cpu(false, false, N, IC, OC, 1.0f, ad, OC, aw, IC, 0.0f, S, IC);
  gelu_backward_cpu(want, pre, dh, nh);

  void *d_dout = upload_bf16(dout, nd), *d_w = upload_bf16(w, nw), *d_pre = upload_bf16(pre, nh);
  void *d_dpre = poisoned_bf16(nh), *d_hidden = poisoned_bf16(nh);
  float *d_sums = gpu_alloc(sizeof(float) * (size_t)IC);
  CUDA_CHECK(cudaMemcpy(d_sums, sums0, sizeof(float) * (size_t)IC, cudaMemcpyHostToDevice));
  float *d_dw = gpu_alloc(sizeof(float) * (size_t)nw);
  CUDA_CHECK(cudaMemcpy(d_dw, dw0, sizeof(float) * (size_t)nw, cudaMemcpyHostToDevice));
  const int64_t scratch_floats = dweight ? linear_hopper_dgelu_dweight_scratch(N, IC, OC)
                                         : linear_hopper_dgelu_scratch(N, IC, OC);
  float *d_scratch = gpu_alloc(sizeof(float) * (size_t)scratch_floats);
  CUDA_CHECK(cudaMemset(d_scratch, 0xFF, sizeof(float) * (size_t)scratch_floats));
  if (dweight)
    linear_hopper_dgelu_dweight_cuda(d_dpre, d_dw, sums ? d_sums : NULL, d_scratch, d_dout, d_w,
                                     d_pre, N, IC, OC, 0);
  else
    linear_hopper_dgelu_tile(d_dpre, d_hidden, sums ? d_sums : NULL, d_scratch, d_dout, d_w, d_pre,
                             N, IC, OC, tile, 0);
  CUDA_CHECK(cudaGetLastError());
  uint16_t *dpre = download_bits(d_dpre, nh), *hidden = download_bits(d_hidden, nh);

  // dpre: the product's error (pre_bound) carried through GELU' and the final rounding, as
  // post_bound carries it through GELU (|GELU'| <= 1.13 as |GELU'|'s bound there).
  double *bound = malloc_check(sizeof(double) * (size_t)nh);
  for (int64_t i = 0; i < nh; i++)
    bound[i] = post_bound(dh[i], want[i], pre_bound(dh[i], S[i], OC));
  check_within(ctx, "dpre", dpre, want, bound, N, IC);

  // hidden: the GELU pass on the same pre (any dout) gives the same bits.
  void *d_ref = poisoned_bf16(nh), *d_scratch2 = poisoned_bf16(nh);
  gelu_recompute_backward_cuda(DTYPE_BF16, d_ref, d_scratch2, d_pre, d_pre, N, IC, NULL, NULL, 0);
  uint16_t *ref = download_bits(d_ref, nh);
  if (!dweight) check_same_bits(ctx, "hidden vs gelu_recompute_backward_cuda", hidden, ref, N, IC);

  if (dweight) {
    // dpre: the same product and epilogue as linear_hopper_dgelu_tile's at width 128.
    void *d_dpre2 = poisoned_bf16(nh);
    linear_hopper_dgelu_tile(d_dpre2, d_hidden, NULL, d_scratch, d_dout, d_w, d_pre, N, IC, OC,
                             128, 0);
    uint16_t *dpre2 = download_bits(d_dpre2, nh);
    check_same_bits(ctx, "dpre vs linear_hopper_dgelu_tile (128)", dpre, dpre2, N, IC);
    // dweight against the reference, then the same bits from a second run.
    float *dw = test_alloc_floats(nw), *dw2 = test_alloc_floats(nw);
    CUDA_CHECK(cudaMemcpy(dw, d_dw, sizeof(float) * (size_t)nw, cudaMemcpyDeviceToHost));
    check_dweight(ctx, dw, dw0, dout, ref, N, IC, OC);
    CUDA_CHECK(cudaMemcpy(d_dw, dw0, sizeof(float) * (size_t)nw, cudaMemcpyHostToDevice));
    linear_hopper_dgelu_dweight_cuda(d_dpre2, d_dw, NULL, d_scratch, d_dout, d_w, d_pre, N, IC, OC,
                                     0);
    CUDA_CHECK(cudaMemcpy(dw2, d_dw, sizeof(float) * (size_t)nw, cudaMemcpyDeviceToHost));
    test_check(memcmp(dw, dw2, sizeof(float) * (size_t)nw) == 0, "%s: dweight, two runs: %s", ctx,
               memcmp(dw, dw2, sizeof(float) * (size_t)nw) == 0 ? "same bits" : "bits differ");
    CUDA_CHECK(cudaFree(d_dpre2));
    free(dpre2);
    free(dw);
    free(dw2);
  }

  // dpre_sums: sums0 + the column sums of dpre as stored. The kernel adds in f32 over 64 rows,
  // then over a CTA's tiles (at most ceil(N / 128)), then in double: each term's relative error
  // at most (64 + ceil(N / 128)) 2^-24 of the column's sum of magnitudes, and the final f32
  // rounding; one element missed or counted twice moves a sum by ~1/N of it, 40x more at N=4099.
  float *got = test_alloc_floats(IC);
  CUDA_CHECK(cudaMemcpy(got, d_sums, sizeof(float) * (size_t)IC, cudaMemcpyDeviceToHost));
  int64_t bad = 0, worst = 0;
  double worst_ratio = -1.0;
  for (int c = 0; c < IC; c++) {
    double exact = 0.0, mag = 0.0;
    for (int64_t r = 0; r < N; r++) {
      const double v = bf16_to_f32(dpre[r * IC + c]);
      exact += v;
      mag += fabs(v);
    }
    const double expect = sums ? sums0[c] + exact : sums0[c];
    const double b = (64.0 + (double)((N + 127) / 128)) * 0x1p-24 * mag + 0x1p-23 * fabs(expect);
    const double ratio = sums ? fabs(got[c] - expect) / b : (got[c] == sums0[c] ? 0.0 : INFINITY);
    if (!(ratio <= 1.0)) bad++;
    if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = c;
  }
  test_check(bad == 0, "%s: dpre_sums %s; %lld of %d out of bound, worst column %lld (%.3g of it)",
             ctx, sums ? "+= column sums of dpre" : "untouched", (long long)bad, IC,
             (long long)worst, worst_ratio);

  void *bufs[] = {d_dout, d_w,   d_pre, d_dpre,     d_hidden,
                  d_sums, d_dw, d_scratch, d_ref, d_scratch2};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) CUDA_CHECK(cudaFree(bufs[i]));
  float *hs[] = {dout, w, pre, sums0, dw0, dh, S, want, ad, aw, got};
  for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++) free(hs[i]);
  free(dpre);
  free(hidden);
  free(ref);
  free(bound);
}

// One linear_hopper_gelu_forward_tile case (see the top of the file).
static void check_gelu_input(int64_t N, int IC, int OC, int tile, bool with_bias, TestRng *rng) {
  char ctx[160];
  snprintf(ctx, sizeof ctx, "linear_hopper_gelu_forward N=%lld IC=%d OC=%d tile %d%s", (long long)N,
           IC, OC, tile, with_bias ? "" : " (no bias)");
  const int64_t nin = N * IC, nw = (int64_t)OC * IC, nout = N * OC;
  const float wscale = 5.0f / sqrtf((float)IC);
  float *pre = test_random_act(rng, DTYPE_BF16, nin, -4.0f, 4.0f);
  float *w = test_random_act(rng, DTYPE_BF16, nw, -wscale, wscale);
  float *b = test_random_act(rng, DTYPE_BF16, OC, -1.0f, 1.0f);
  const float *bias = with_bias ? b : NULL;

  // The CPU: y = GELU(pre) w^T + b, S = |GELU(pre)| |w|^T + |b|.
  float *h = test_alloc_floats(nin), *y = test_alloc_floats(nout), *S = test_alloc_floats(nout);
  gelu_forward_cpu(h, pre, nin);
  linear_forward_cpu(y, h, w, bias, N, IC, OC);
  float *aw = test_copy_floats(w, nw), *ab = test_copy_floats(b, OC);
  for (int64_t i = 0; i < nin; i++) h[i] = fabsf(h[i]);
  for (int64_t i = 0; i < nw; i++) aw[i] = fabsf(aw[i]);
  for (int i = 0; i < OC; i++) ab[i] = fabsf(ab[i]);
  linear_forward_cpu(S, h, aw, with_bias ? ab : NULL, N, IC, OC);

  void *d_pre = upload_bf16(pre, nin), *d_w = upload_bf16(w, nw), *d_b = upload_bf16(b, OC);
  void *d_out = poisoned_bf16(nout), *d_hidden = poisoned_bf16(nin), *d_ref = poisoned_bf16(nout);
  linear_hopper_gelu_forward_tile(d_out, d_pre, d_w, with_bias ? d_b : NULL, N, IC, OC, tile, 0);
  CUDA_CHECK(cudaGetLastError());
  // The two passes it replaces, at the same width: the same A values, the same mainloop.
  gelu_forward_cuda(DTYPE_BF16, d_hidden, d_pre, nin, 0);
  linear_hopper_forward_tile(d_ref, NULL, d_hidden, d_w, with_bias ? d_b : NULL, N, IC, OC, tile,
                             0);
  uint16_t *out = download_bits(d_out, nout), *ref = download_bits(d_ref, nout);
  check_same_bits(ctx, "out vs the GELU pass + linear_hopper_forward_tile", out, ref, N, OC);

  // The GPU's hidden layer is rounded to bf16 (each term within 2^-8 of the CPU's): 2^-8 S more
  // than a plain product's bound.
  double *bound = malloc_check(sizeof(double) * (size_t)nout);
  for (int64_t i = 0; i < nout; i++) bound[i] = pre_bound(y[i], S[i], IC) + 0x1p-8 * S[i];
  check_within(ctx, "out", out, y, bound, N, OC);

  void *bufs[] = {d_pre, d_w, d_b, d_out, d_hidden, d_ref};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) CUDA_CHECK(cudaFree(bufs[i]));
  float *hs[] = {pre, w, b, h, y, S, aw, ab};
  for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++) free(hs[i]);
  free(out);
  free(ref);
  free(bound);
}

static void check_hopper_gelu_input(TestRng *rng) {
  if (!linear_hopper_supported(96, 384)) return;  // check_hopper printed the SKIP
  // Swin-T's fc2: IC = 4 C, OC = C.
  static const SmallKShape fc2[] = {{384, 96}, {768, 192}, {1536, 384}, {3072, 768}};
  static const int64_t rows[] = {77, 4099};
  for (size_t s = 0; s < sizeof fc2 / sizeof fc2[0]; s++)
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++)
      check_gelu_input(rows[r], fc2[s].IC, fc2[s].OC, 0, true, rng);
  check_gelu_input(4099, 136, 264, 0, true, rng);  // K = 136: a partial slab; 264 = 256 + 8
  static const int widths[] = {96, 128, 192, 256};
  for (size_t w = 0; w < sizeof widths / sizeof widths[0]; w++)
    check_gelu_input(1000, 520, 136, widths[w], true, rng);
  check_gelu_input(333, 384, 96, 0, false, rng);
}

static void check_hopper_dgelu(TestRng *rng) {
  if (!linear_hopper_supported(96, 384)) return;  // check_hopper printed the SKIP
  // Swin-T's MLPs: IC = hidden = 4 C, OC = C.
  static const SmallKShape mlp[] = {{384, 96}, {768, 192}, {1536, 384}, {3072, 768}};
  static const int64_t rows[] = {77, 4099};
  for (size_t s = 0; s < sizeof mlp / sizeof mlp[0]; s++)
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++)
      check_dgelu(rows[r], mlp[s].IC, mlp[s].OC, 0, true, false, rng);
  check_dgelu(4099, 264, 200, 0, true, false, rng);  // K = 200: a partial slab; 264 = 2 x 128 + 8
  check_dgelu(1000, 520, 136, 96, true, false, rng);
  check_dgelu(1000, 520, 136, 128, true, false, rng);
  check_dgelu(333, 384, 96, 0, false, false, rng);
  check_dgelu(50000, 384, 96, 0, true, false, rng);
}

static void check_hopper_dgelu_dweight(TestRng *rng) {
  if (!linear_hopper_supported(96, 384)) return;  // check_hopper printed the SKIP
  test_check(linear_hopper_dgelu_dweight_supported(384, 96) &&
                 linear_hopper_dgelu_dweight_supported(512, 128) &&
                 !linear_hopper_dgelu_dweight_supported(768, 192) &&
                 !linear_hopper_dgelu_dweight_supported(768, 136) &&
                 !linear_hopper_dgelu_dweight_supported(1536, 384),
             "linear_hopper_dgelu_dweight_supported: OC a multiple of 8 up to 128");
  // The stage-0 MLPs of Swin-T (C 96) and Swin-B (C 128): IC = hidden = 4 C, OC = C.
  static const SmallKShape mlp[] = {{384, 96}, {512, 128}};
  static const int64_t rows[] = {77, 4099};
  for (size_t s = 0; s < sizeof mlp / sizeof mlp[0]; s++)
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++)
      check_dgelu(rows[r], mlp[s].IC, mlp[s].OC, 0, true, true, rng);
  check_dgelu(4099, 264, 72, 0, true, true, rng);   // K = 72: two slabs, the last partial
  check_dgelu(1000, 200, 64, 0, true, true, rng);   // one slab; 200 = 128 + 72
  check_dgelu(333, 384, 96, 0, false, true, rng);
  check_dgelu(50000, 384, 96, 0, true, true, rng);
}

// ---- the layers with the residual + LayerNorm forward in their epilogue ---------------------
// Each case runs the fused kernel and its definition on the GPU (the layer into a branch buffer,
// then residual_layernorm_forward_cuda) and compares x_out, ln_out (bf16) and mean, rstd (f32)
// bitwise (the CPU comparison is test_gpu_ops's rows). What the cases share: B images of H x H
// tokens of C features, residual rows with offsets of their own (means far from 0 in some), the
// LayerNorm's parameters, drop-path scales (0 for every third image) or none, and both runs'
// outputs, all bytes 0xFF to start.
typedef struct {
  int B, C;
  int64_t L, N, n;
  bool ln;  // ln_out asked for (else the residual alone: ln_out NULL)
  float *x, *lnw, *lnb, *sc;
  void *d_x, *d_branch;
  float *d_lnw, *d_lnb, *d_sc;
  void *out[2][2];     // [definition, fused][x_out, ln_out]
  float *stats[2][2];  // [definition, fused][mean, rstd]
} ResLnRun;

static void resln_setup(ResLnRun *r, int B, int H, int C, bool ln, bool scaled, TestRng *rng) {
  *r = (ResLnRun){.B = B, .C = C, .L = (int64_t)H * H, .ln = ln};
  r->N = B * r->L;
  r->n = r->N * C;
  r->x = test_alloc_floats(r->n);
  for (int64_t i = 0; i < r->N; i++) {
    float offset = test_rng_uniform(rng, -2.0f, 2.0f);
    test_fill_uniform(rng, r->x + i * C, C, offset - 1.0f, offset + 1.0f);
  }
  r->lnw = test_alloc_floats(C);
  r->lnb = test_alloc_floats(C);
  r->sc = test_alloc_floats(B);
  test_fill_uniform(rng, r->lnw, C, 0.5f, 1.5f);
  test_fill_uniform(rng, r->lnb, C, -0.5f, 0.5f);
  for (int i = 0; i < B; i++) r->sc[i] = i % 3 == 1 ? 0.0f : 1.0f / 0.9f;
  r->d_x = upload_bf16(r->x, r->n);
  r->d_lnw = upload_f32(r->lnw, C);
  r->d_lnb = upload_f32(r->lnb, C);
  r->d_sc = scaled ? upload_f32(r->sc, B) : NULL;
  r->d_branch = poisoned_bf16(r->n);
  for (int k = 0; k < 2; k++) {
    r->out[k][0] = poisoned_bf16(r->n);
    r->out[k][1] = ln ? poisoned_bf16(r->n) : NULL;
    for (int j = 0; j < 2; j++) {
      r->stats[k][j] = gpu_alloc(sizeof(float) * (size_t)r->N);
      gpu_poison(r->stats[k][j], r->N);
    }
  }
}

// The two runs' outputs compared (without LN, mean and rstd must stay as poisoned), then freed.
static void resln_compare_free(ResLnRun *r, const char *ctx) {
  CUDA_CHECK(cudaGetLastError());
  const char *names[2] = {"x_out", "ln_out"};
  for (int j = 0; j < (r->ln ? 2 : 1); j++) {
    uint16_t *want = download_bits(r->out[0][j], r->n), *got = download_bits(r->out[1][j], r->n);
    int64_t poisoned = 0;
    for (int64_t i = 0; i < r->n; i++) poisoned += want[i] == 0xFFFFu;
    test_check(poisoned == 0, "%s: the definition wrote every %s element (%lld left)", ctx,
               names[j], (long long)poisoned);
    check_same_bits(ctx, names[j], got, want, r->N, r->C);
    free(want);
    free(got);
  }
  const char *snames[2] = {"mean", "rstd"};
  for (int j = 0; j < 2; j++) {
    float *want = test_alloc_floats(r->N), *got = test_alloc_floats(r->N);
    gpu_download(want, r->stats[0][j], r->N);
    gpu_download(got, r->stats[1][j], r->N);
    bool same = memcmp(want, got, sizeof(float) * (size_t)r->N) == 0;
    if (r->ln)
      test_check(same && isfinite(got[r->N - 1]), "%s: %s bitwise equal (%lld values)", ctx,
                 snames[j], (long long)r->N);
    else
      test_check(same, "%s: %s untouched without LN", ctx, snames[j]);
    free(want);
    free(got);
  }
  void *bufs[] = {r->d_x,         r->d_branch,    r->d_lnw,      r->d_lnb,     r->d_sc,
                  r->out[0][0],   r->out[0][1],   r->out[1][0],  r->out[1][1], r->stats[0][0],
                  r->stats[0][1], r->stats[1][0], r->stats[1][1]};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    if (bufs[i]) CUDA_CHECK(cudaFree(bufs[i]));
  free(r->x);
  free(r->lnw);
  free(r->lnb);
  free(r->sc);
}

// linear_small_k_residual_layernorm_cuda (C = 96 or 128): the definition is
// linear_small_k_forward_cuda then the residual LayerNorm with the branch in the windows of side
// `window` shifted by `shift`, LN2 in token order.
static void check_residual_ln(int B, int H, int C, int window, int shift, bool scaled,
                              bool with_bias, TestRng *rng) {
  char ctx[160];
  snprintf(ctx, sizeof ctx,
           "linear_small_k_residual_layernorm B=%d %dx%d C=%d window %d shift %d (%s, %s)", B, H, H,
           C, window, shift, scaled ? "drop path" : "scale NULL", with_bias ? "bias" : "no bias");
  ResLnRun r;
  resln_setup(&r, B, H, C, true, scaled, rng);
  const int64_t nw = (int64_t)C * C;
  const float ws = 1.0f / sqrtf((float)C);  // the layer's outputs ~1
  float *inp = test_random_act(rng, DTYPE_BF16, r.n, -1.0f, 1.0f);
  float *w = test_random_act(rng, DTYPE_BF16, nw, -ws, ws);
  float *b = test_random_act(rng, DTYPE_BF16, C, -0.5f, 0.5f);
  void *d_inp = upload_bf16(inp, r.n), *d_w = upload_bf16(w, nw),
       *d_b = with_bias ? upload_bf16(b, C) : NULL;
  const WindowMap map = {H, H, window, window, shift, shift};
  linear_small_k_forward_cuda(r.d_branch, NULL, d_inp, d_w, d_b, r.N, C, C, 0);
  residual_layernorm_forward_cuda(DTYPE_BF16, r.out[0][0], r.out[0][1], r.stats[0][0],
                                  r.stats[0][1], r.d_x, r.d_branch, &map, r.d_sc, r.d_lnw, r.d_lnb,
                                  NULL, B, r.L, C, 0);
  linear_small_k_residual_layernorm_cuda(r.out[1][0], r.out[1][1], r.stats[1][0], r.stats[1][1],
                                         r.d_x, d_inp, &map, r.d_sc, d_w, d_b, r.d_lnw, r.d_lnb, B,
                                         r.L, C, C, 0);
  resln_compare_free(&r, ctx);
  void *bufs[] = {d_inp, d_w, d_b};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    if (bufs[i]) CUDA_CHECK(cudaFree(bufs[i]));
  free(inp);
  free(w);
  free(b);
}

// linear_hopper_gelu_residual_layernorm_cuda (4C hidden -> C): the definition is
// linear_hopper_gelu_forward_tile at width C then the residual LayerNorm with the branch in token
// order and LN into the windows of side `window` shifted by `shift`, or the residual alone.
static void check_hopper_residual_ln(int B, int H, int C, int window, int shift, bool ln,
                                     bool scaled, TestRng *rng) {
  char ctx[200];
  snprintf(ctx, sizeof ctx,
           "linear_hopper_gelu_residual_layernorm B=%d %dx%d C=%d %s (window %d shift %d, %s)", B,
           H, H, C, ln ? "LN" : "residual alone", window, shift, scaled ? "drop path" : "no scale");
  if (!linear_hopper_gelu_residual_layernorm_supported(4 * C, C)) {
    printf("SKIP %s: not served on this device/build\n", ctx);
    return;
  }
  ResLnRun r;
  resln_setup(&r, B, H, C, ln, scaled, rng);
  const int HID = 4 * C;
  const int64_t nh = r.N * HID, nw = (int64_t)C * HID;
  const float ws = 1.0f / sqrtf((float)HID);
  float *pre = test_random_act(rng, DTYPE_BF16, nh, -3.0f, 3.0f);
  float *w = test_random_act(rng, DTYPE_BF16, nw, -ws, ws);
  float *b = test_random_act(rng, DTYPE_BF16, C, -0.5f, 0.5f);
  void *d_pre = upload_bf16(pre, nh), *d_w = upload_bf16(w, nw), *d_b = upload_bf16(b, C);
  const WindowMap map = {H, H, window, window, shift, shift};
  linear_hopper_gelu_forward_tile(r.d_branch, d_pre, d_w, d_b, r.N, HID, C, C, 0);
  residual_layernorm_forward_cuda(DTYPE_BF16, r.out[0][0], r.out[0][1], r.stats[0][0],
                                  r.stats[0][1], r.d_x, r.d_branch, NULL, r.d_sc, r.d_lnw, r.d_lnb,
                                  &map, B, r.L, C, 0);
  linear_hopper_gelu_residual_layernorm_cuda(r.out[1][0], r.out[1][1], r.stats[1][0], r.stats[1][1],
                                             r.d_x, d_pre, d_w, d_b, r.d_sc, r.d_lnw, r.d_lnb, &map,
                                             B, r.L, HID, C, 0);
  resln_compare_free(&r, ctx);
  void *bufs[] = {d_pre, d_w, d_b};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) CUDA_CHECK(cudaFree(bufs[i]));
  free(pre);
  free(w);
  free(b);
}

// The shape query agrees with the header's limits.
// A fused call on fake addresses (16-byte aligned unless a case says otherwise), one condition
// violated per case; the refusal comes before any address is read.
typedef struct {
  void *x_out, *ln_out;
  const void *x_in;
  int IC, C;
} Refused;

#define FAKE(offset) ((void *)(uintptr_t)(0x10000 + (offset)))

static void small_k_resln_call(void *arg) {
  const Refused *r = arg;
  linear_small_k_residual_layernorm_cuda(r->x_out, r->ln_out, NULL, NULL, r->x_in, FAKE(0x3000),
                                         NULL, NULL, FAKE(0x4000), NULL, NULL, NULL, 2, 3136, r->IC,
                                         r->C, 0);
}

static void hopper_resln_call(void *arg) {
  const Refused *r = arg;
  linear_hopper_gelu_residual_layernorm_cuda(r->x_out, r->ln_out, NULL, NULL, r->x_in, FAKE(0x3000),
                                             FAKE(0x4000), NULL, NULL, NULL, NULL, NULL, 2, 3136,
                                             r->IC, r->C, 0);
}

static void check_refusals(void) {
  const char *sk = "linear_small_k_residual_layernorm_cuda: unsupported call";
  Refused ok = {FAKE(0x0), FAKE(0x1000), FAKE(0x2000), 96, 96};
  Refused r = ok;
  r.IC = r.C = 192;
  test_expect_abort("small-K + residual LN: C = 192", small_k_resln_call, &r,
                    (const char *const[]){sk, "IC 192, C 192", "HINT:", NULL});
  r = ok;
  r.x_in = FAKE(0x2008);
  test_expect_abort("small-K + residual LN: x_in 8 bytes off", small_k_resln_call, &r,
                    (const char *const[]){sk, "16-byte aligned: no", NULL});
  r = ok;
  r.x_out = (void *)r.x_in;
  test_expect_abort("small-K + residual LN: x_out aliasing x_in", small_k_resln_call, &r,
                    (const char *const[]){sk, "x_out aliasing x_in: yes", NULL});
  r = ok;
  r.ln_out = NULL;
  test_expect_abort("small-K + residual LN: no ln_out", small_k_resln_call, &r,
                    (const char *const[]){sk, "ln_out given: no", NULL});

  if (!linear_hopper_supported(384, 96)) {
    printf("SKIP: the Hopper kernel's refusals (no sm_90a build or device)\n");
    return;
  }
  const char *hk = "linear_hopper_gelu_residual_layernorm_cuda: unsupported call";
  ok.IC = 384;
  r = ok;
  r.IC = 1024;
  r.C = 256;
  test_expect_abort("Hopper fc2 + residual LN: C = 256", hopper_resln_call, &r,
                    (const char *const[]){hk, "IC 1024, C 256", "HINT:", NULL});
  r = ok;
  r.ln_out = FAKE(0x1004);
  test_expect_abort("Hopper fc2 + residual LN: ln_out 4 bytes off", hopper_resln_call, &r,
                    (const char *const[]){hk, "16-byte aligned: no", NULL});
  r = ok;
  r.x_out = (void *)r.x_in;
  test_expect_abort("Hopper fc2 + residual LN: x_out aliasing x_in", hopper_resln_call, &r,
                    (const char *const[]){hk, "x_out aliasing x_in: yes", NULL});
}

static void check_supported(void) {
  bool ok = linear_small_k_supported(96, 384) && linear_small_k_supported(192, 768) &&
            linear_small_k_supported(128, 384) && linear_small_k_supported(96, 32) &&
            !linear_small_k_supported(160, 384) && !linear_small_k_supported(384, 96) &&
            !linear_small_k_supported(96, 100) && !linear_small_k_supported(96, 0);
  test_check(ok, "linear_small_k_supported: IC 96, 128 or 192, OC a positive multiple of 32");
  test_check(linear_small_k_residual_layernorm_supported(96, 96) &&
                 linear_small_k_residual_layernorm_supported(128, 128) &&
                 !linear_small_k_residual_layernorm_supported(96, 192) &&
                 !linear_small_k_residual_layernorm_supported(192, 192),
             "linear_small_k_residual_layernorm_supported: IC = C = 96 or 128");
}
#endif

int main(void) {
  GPU_TEST_MAIN_BEGIN();
#ifdef SWIN_HAVE_CUDA
  TestRng rng = {.state = 0x5a11c};
  const SmallKMode fused = {.bias = true, .post = true};
  check_supported();
  check_refusals();
  for (size_t s = 0; s < sizeof swin_shapes / sizeof swin_shapes[0]; s++)
    for (size_t r = 0; r < sizeof swin_rows / sizeof swin_rows[0]; r++)
      check_case(linear_small_k_forward_cuda, "linear_small_k", swin_shapes[s].IC,
                 swin_shapes[s].OC, swin_rows[r], fused, &rng);
  for (size_t s = 0; s < sizeof other_shapes / sizeof other_shapes[0]; s++)
    check_case(linear_small_k_forward_cuda, "linear_small_k", other_shapes[s].IC,
               other_shapes[s].OC, 4099, fused, &rng);
  check_case(linear_small_k_forward_cuda, "linear_small_k", 96, 384, 4099,
             (SmallKMode){.bias = true, .post = false}, &rng);
  check_case(linear_small_k_forward_cuda, "linear_small_k", 192, 192, 77,
             (SmallKMode){.bias = false, .post = true}, &rng);
  // Swin-T's stage 0 (2 images: whole tiles), a ragged last tile (196 rows), 2,352 rows
  // unshifted without scale or bias, and 16 images (two tiles a CTA).
  check_residual_ln(2, 56, 96, 7, 3, true, true, &rng);
  check_residual_ln(1, 14, 96, 7, 3, true, true, &rng);
  check_residual_ln(3, 28, 96, 7, 0, false, false, &rng);
  check_residual_ln(16, 56, 96, 7, 3, true, true, &rng);
  check_residual_ln(2, 56, 128, 7, 3, true, true, &rng);  // Swin-B's stage 0
  // Stage 0 (2 images, LN1 into shifted windows), stage 1's C = 192 (a ragged last tile of
  // 128 rows: 3 images of 14 x 14), a stage's end (the residual alone), Swin-B's C = 128 with
  // LN in token order, and 16 images of stage 0 (several tiles a CTA).
  check_hopper_residual_ln(2, 56, 96, 7, 3, true, true, &rng);
  check_hopper_residual_ln(3, 14, 192, 7, 3, true, true, &rng);
  check_hopper_residual_ln(2, 28, 192, 7, 0, false, true, &rng);
  check_hopper_residual_ln(2, 56, 128, 7, 0, true, false, &rng);
  check_hopper_residual_ln(16, 56, 96, 7, 0, true, true, &rng);
  check_hopper(&rng);
  check_hopper_dgelu(&rng);
  check_hopper_dgelu_dweight(&rng);
  check_hopper_gelu_input(&rng);
#endif
  return test_finish();
}
