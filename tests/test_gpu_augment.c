// test_gpu_augment.c: batch_augment_cuda against batch_augment_cpu (the reference, itself checked
// in test_augment.c). The two must agree bit for bit: the erase fill is the same Philox +
// fp32 Box-Muller code on both sides, and mixup's multiplies and add are explicitly rounded on
// the GPU (no FMA), as on the CPU. Cases: erase only (odd batch), erase + mixup, erase + cutmix,
// mixup only, boxes drawn by batch_augment_draw at ImageNet size; each run twice (determinism).
#include "data/batch_augment.h"
#include "kernels/augment.h"
#include "tests/util/test_gpu_util.h"

#ifdef SWIN_HAVE_CUDA
static void check_case(TestRng *rng, cudaStream_t stream, const char *what, int B, int H, int W,
                       int C, const BatchAugment *p) {
  int64_t n = (int64_t)B * H * W * C;
  float *x = test_alloc_floats(n), *want = test_alloc_floats(n), *got = test_alloc_floats(n);
  float *again = test_alloc_floats(n);
  test_fill_uniform(rng, x, n, -2.5f, 2.5f);
  memcpy(want, x, sizeof(float) * (size_t)n);
  batch_augment_cpu(want, p, B, H, W, C);
  float *d_x = gpu_alloc(sizeof(float) * (size_t)n);
  EraseBox *d_boxes = gpu_alloc(sizeof(EraseBox) * (size_t)B);
  for (int run = 0; run < 2; run++) {
    CUDA_CHECK(cudaMemcpy(d_x, x, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice));
    batch_augment_cuda(d_x, p, d_boxes, B, H, W, C, stream);
    gpu_download(run == 0 ? got : again, d_x, n);
  }
  int64_t differ = 0, changed = 0, nondet = 0;
  double worst = 0;
  for (int64_t i = 0; i < n; i++) {
    differ += memcmp(&got[i], &want[i], sizeof(float)) != 0;
    nondet += memcmp(&got[i], &again[i], sizeof(float)) != 0;
    changed += want[i] != x[i];
    double e = fabs((double)got[i] - want[i]);
    if (!(e <= worst)) worst = e;
  }
  test_check(differ == 0 && nondet == 0 && changed > 0,
             "%s %-34s B=%d %dx%dx%d: %lld of %lld differ from the CPU (max |diff| %.2e), "
             "%lld differ between runs, %lld changed",
             differ == 0 && nondet == 0 && changed > 0 ? "PASS" : "FAIL", what, B, H, W, C,
             (long long)differ, (long long)n, worst, (long long)nondet, (long long)changed);
  CUDA_CHECK(cudaFree(d_x));
  CUDA_CHECK(cudaFree(d_boxes));
  free(x);
  free(want);
  free(got);
  free(again);
}

static void fixed_boxes(EraseBox *boxes, int B, int H, int W) {
  memset(boxes, 0, sizeof(EraseBox) * (size_t)B);
  for (int b = 0; b < B; b++) {
    boxes[b].fill = rng_make(3, RNG_STREAM_ERASE_FILL, 1, (uint64_t)b);
    if (b % 3 == 0) {
      boxes[b].top = b % H;
      boxes[b].left = (2 * b) % W;
      boxes[b].h = H - boxes[b].top < 5 ? H - boxes[b].top : 5;
      boxes[b].w = W - boxes[b].left < 7 ? W - boxes[b].left : 7;
    }
  }
}
#endif

int main(void) {
  GPU_TEST_MAIN_BEGIN();
#ifdef SWIN_HAVE_CUDA
  TestRng rng = {20261202};
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  EraseBox boxes[64];
  fixed_boxes(boxes, 7, 13, 17);
  BatchAugment p = {.erase = boxes, .mix = {.mode = MIX_NONE, .lam = 1}};
  check_case(&rng, stream, "erase only, odd batch", 7, 13, 17, 3, &p);
  fixed_boxes(boxes, 8, 13, 17);
  p.mix = (MixParams){.mode = MIX_MIXUP, .lam = 0.42};
  check_case(&rng, stream, "erase + mixup", 8, 13, 17, 3, &p);
  p.mix = batch_augment_cutmix_box(0.55, 13, 17, 12, 2);
  check_case(&rng, stream, "erase + cutmix (clipped box)", 8, 13, 17, 3, &p);
  p.erase = NULL;
  p.mix = (MixParams){.mode = MIX_MIXUP, .lam = 0.987654321};
  check_case(&rng, stream, "mixup only", 8, 13, 17, 1, &p);

  // The recipe at ImageNet size, parameters from the host draws.
  enum { B = 64, K = 1000 };
  int labels[B];
  int64_t samples[B];
  for (int b = 0; b < B; b++) labels[b] = (b * 37) % K, samples[b] = 1000 + b;
  Batch batch = {.labels = labels, .samples = samples, .count = B, .epoch = 3, .index = 5};
  BatchAugmentOptions o = {.seed = 11,
                           .reprob = 0.25f,
                           .mixup_alpha = 0.8f,
                           .cutmix_alpha = 1.0f,
                           .mix_prob = 1.0f,
                           .switch_prob = 0.5f,
                           .smoothing = 0.1f,
                           .num_classes = K};
  Error err;
  for (int index = 5; index < 7; index++) {
    batch.index = index;
    if (batch_augment_draw(&o, &batch, 0, 1, 224, 224, boxes, &p, NULL, &err) != 0) {
      test_check(0, "FAIL draw: %s", err.msg);
      break;
    }
    char what[64];
    snprintf(what, sizeof what, "recipe batch %d (%s)", index,
             p.mix.mode == MIX_CUTMIX  ? "cutmix"
             : p.mix.mode == MIX_MIXUP ? "mixup"
                                       : "no mix");
    check_case(&rng, stream, what, B, 224, 224, 3, &p);
  }
  CUDA_CHECK(cudaStreamDestroy(stream));
#endif
  return test_finish();
}
