// test_gpu_image_aug.c: image_aug_batch_cuda against image_aug_batch_cpu (kernels/image_aug.h;
// the CPU form is checked against the Pillow-exact CPU path by tests/test_image_aug.c) on the same
// inputs: batches of 128 textured 224x224 images, RGB and gray, with every op at fixed arguments
// (tests/util/test_image_aug.h's cases: each case in some image's list, and one batch per kind of
// step where every image runs the same one), and random draws from rand-m9-mstd0.5-inc1 and
// ColorJitter 0.4. Tolerance 0 bytes: the kernels run the CPU form's per-pixel code, compiled
// with --fmad=false, and exact integer histograms. The images are updated in place, so the
// scratch buffer is what gets poisoned: 0xAB before one run, 0x00 before a second (which is also
// the timed one, printed, not checked).
#include "tests/util/test_gpu_util.h"
#include "tests/util/test_image_aug.h"

#ifdef SWIN_HAVE_CUDA
#include "data/randaugment.h"

enum { BATCH = 128, SIDE = 224 };

typedef struct {
  uint8_t *images, *scratch;  // (BATCH, SIDE, SIDE, 3) each
  ImageAugStep *steps;        // (BATCH, IMAGE_AUG_MAX_STEPS)
  cudaStream_t stream;
  cudaEvent_t start, stop;
} GpuBatch;

static ImageAugFill fill_of(int chans) {
  ImageAugFill f = {{124, 116, 104, 0}};
  if (chans == 1) f.v[0] = 117;
  return f;
}

// Runs steps (count * nsteps) on images (count, h, w, chans) with both forms and compares them
// image by image; names[i] says what image i ran. Returns the bytes that differ; *ms is the
// second GPU run's time.
static int64_t run_case(GpuBatch *d, const uint8_t *images, const ImageAugStep *steps, int count,
                        int nsteps, int h, int w, int chans, const char *const *names, float *ms) {
  size_t bytes = (size_t)count * h * w * chans;
  ImageAugFill fill = fill_of(chans);
  uint8_t *want = malloc_check(bytes), *scratch = malloc_check(bytes), *got = malloc_check(bytes);
  memcpy(want, images, bytes);
  image_aug_batch_cpu(want, scratch, steps, count, nsteps, h, w, chans, fill.v);
  CUDA_CHECK(cudaMemcpy(d->steps, steps, sizeof(ImageAugStep) * (size_t)count * nsteps,
                        cudaMemcpyHostToDevice));
  int64_t differ = 0;
  for (int run = 0; run < 2; run++) {
    CUDA_CHECK(cudaMemcpy(d->images, images, bytes, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(d->scratch, run == 0 ? 0xAB : 0x00, bytes));
    CUDA_CHECK(cudaEventRecord(d->start, d->stream));
    cudaError_t e = image_aug_batch_cuda(d->images, d->scratch, d->steps, count, nsteps, h, w,
                                         chans, fill, d->stream);
    CUDA_CHECK(cudaEventRecord(d->stop, d->stream));
    if (e != cudaSuccess) {
      test_check(0, "image_aug_batch_cuda (%s, ...): launch failed: %s", names[0],
                 cudaGetErrorString(e));
      differ++;
      break;
    }
    CUDA_CHECK(cudaEventSynchronize(d->stop));
    CUDA_CHECK(cudaEventElapsedTime(ms, d->start, d->stop));
    CUDA_CHECK(cudaMemcpy(got, d->images, bytes, cudaMemcpyDeviceToHost));
    for (int i = 0; i < count; i++) {
      size_t off = (size_t)i * h * w * chans;
      char what[200];
      snprintf(what, sizeof what, "image_aug_batch_cuda: %s, scratch poison 0x%02x", names[i],
               run == 0 ? 0xAB : 0x00);
      differ += test_aug_compare(what, i, got + off, want + off, h, w, chans);
    }
  }
  free(want);
  free(scratch);
  free(got);
  return differ;
}

static uint8_t *textured_batch(TestRng *r, int count, int h, int w, int chans) {
  size_t one = (size_t)h * w * chans;
  uint8_t *images = malloc_check(one * (size_t)count);
  for (int i = 0; i < count; i++) test_aug_image(r, images + i * one, h, w, chans);
  return images;
}

// Every fixed-argument case in some image's two-step list, over as many batches as that takes;
// then one batch per kind of step (and per filter for the affine ones) where all images run the
// kind's first case, timed.
static void test_fixed(GpuBatch *d, TestRng *r, int chans) {
  enum { MAX_CASES = 512 };
  static const double mags[] = {0, 5, 9, 10};
  TestAugCase *cases = malloc_check(sizeof(TestAugCase) * MAX_CASES);
  int ncases = test_aug_cases(SIDE, SIDE, mags, 4, cases, MAX_CASES);
  ImageAugStep *steps = malloc_check(sizeof(ImageAugStep) * 2 * BATCH);
  char(*names)[160] = malloc_check(sizeof *names * BATCH);
  const char *name_ptrs[BATCH];
  int64_t differ = 0;
  int batches = 0;
  for (int first = 0; first < ncases; first += BATCH, batches++) {
    uint8_t *images = textured_batch(r, BATCH, SIDE, SIDE, chans);
    for (int i = 0; i < BATCH; i++) {
      const TestAugCase *a = &cases[(first + i) % ncases], *b = &cases[(first + i + 61) % ncases];
      steps[2 * i] = a->step;
      steps[2 * i + 1] = b->step;
      snprintf(names[i], sizeof names[i], "steps %s, %s", a->what, b->what);
      name_ptrs[i] = names[i];
    }
    float ms;
    differ += run_case(d, images, steps, BATCH, 2, SIDE, SIDE, chans, name_ptrs, &ms);
    free(images);
  }
  test_check(differ == 0,
             "image_aug_batch_cuda = image_aug_batch_cpu, %d fixed-argument cases in %d mixed "
             "batches of %d %dx%dx%d images (2 steps each): %lld bytes differ (tol 0)",
             ncases, batches, BATCH, SIDE, SIDE, chans, (long long)differ);
  // One batch per kind of step.
  for (int op = 1; op < IMAGE_AUG_OPS; op++) {
    for (int bicubic = 0; bicubic <= (op == IMAGE_AUG_AFFINE); bicubic++) {
      int k = 0;
      while (k < ncases && !(cases[k].step.op == op && cases[k].step.bicubic == bicubic &&
                             (op != IMAGE_AUG_TRANSPOSE || cases[k].step.level != 0)))
        k++;
      if (k == ncases) continue;
      uint8_t *images = textured_batch(r, BATCH, SIDE, SIDE, chans);
      for (int i = 0; i < BATCH; i++) steps[i] = cases[k].step, name_ptrs[i] = cases[k].what;
      float ms = 0;
      int64_t dk = run_case(d, images, steps, BATCH, 1, SIDE, SIDE, chans, name_ptrs, &ms);
      test_check(dk == 0,
                 "image_aug_batch_cuda = image_aug_batch_cpu, every image %-30s (%s) %dx%dx%dx%d: "
                 "%lld bytes differ (tol 0); %.3f ms",
                 cases[k].what, test_aug_op_name(op), BATCH, SIDE, SIDE, chans, (long long)dk, ms);
      free(images);
    }
  }
  free(names);
  free(steps);
  free(cases);
}

// A batch of random draws: image i's steps from rng_make(seed, RNG_STREAM_AUGMENT, epoch, i),
// as the loader keys them, padded with NONE to the longest list.
static void test_random(GpuBatch *d, TestRng *r, const char *spec, int chans) {
  RandAugmentPolicy p;
  Error err;
  if (spec && randaugment_parse(&p, spec, &err) != 0) {
    test_check(0, "randaugment_parse '%s': %s", spec, err.msg);
    return;
  }
  ImageAugStep drawn[BATCH][IMAGE_AUG_MAX_STEPS];
  int counts[BATCH], nsteps = 0, total = 0;
  for (int i = 0; i < BATCH; i++) {
    Rng rng = rng_make(20261202, RNG_STREAM_AUGMENT, 5, (uint64_t)i);
    counts[i] = spec ? randaugment_draw(&p, RESAMPLE_RANDOM, SIDE, SIDE, &rng, drawn[i],
                                        IMAGE_AUG_MAX_STEPS)
                     : color_jitter_draw(0.4f, &rng, drawn[i], IMAGE_AUG_MAX_STEPS);
    if (counts[i] > nsteps) nsteps = counts[i];
    total += counts[i];
  }
  ImageAugStep *steps = calloc_check((size_t)BATCH * (nsteps ? nsteps : 1), sizeof *steps);
  char(*names)[160] = malloc_check(sizeof *names * BATCH);
  const char *name_ptrs[BATCH];
  for (int i = 0; i < BATCH; i++) {
    int at = snprintf(names[i], sizeof names[i], "%s draw %d:", spec ? spec : "jitter 0.4", i);
    for (int s = 0; s < counts[i]; s++) {
      steps[(size_t)i * nsteps + s] = drawn[i][s];
      if (at < (int)sizeof names[i])
        at += snprintf(names[i] + at, sizeof names[i] - (size_t)at, " %s",
                       test_aug_op_name(drawn[i][s].op));
    }
    name_ptrs[i] = names[i];
  }
  uint8_t *images = textured_batch(r, BATCH, SIDE, SIDE, chans);
  float ms = 0;
  int64_t differ = run_case(d, images, steps, BATCH, nsteps, SIDE, SIDE, chans, name_ptrs, &ms);
  test_check(differ == 0,
             "image_aug_batch_cuda = image_aug_batch_cpu, random draws of %s, %dx%dx%dx%d, %d "
             "steps (lists of up to %d): %lld bytes differ (tol 0); %.3f ms for the batch, %.3f "
             "ms per step index",
             spec ? spec : "ColorJitter 0.4", BATCH, SIDE, SIDE, chans, total, nsteps,
             (long long)differ, ms, nsteps ? ms / nsteps : 0.0);
  free(images);
  free(names);
  free(steps);
}

// The launch refuses what it does not build, and does nothing for an empty batch.
static void test_refusals(GpuBatch *d) {
  ImageAugFill fill = fill_of(3);
  cudaError_t two =
      image_aug_batch_cuda(d->images, d->scratch, d->steps, 1, 1, 8, 8, 2, fill, d->stream);
  cudaError_t none =
      image_aug_batch_cuda(d->images, d->scratch, d->steps, 0, 1, 8, 8, 3, fill, d->stream);
  test_check(two == cudaErrorInvalidValue && none == cudaSuccess,
             "image_aug_batch_cuda: 2 channels refused (%s), an empty batch queues nothing (%s)",
             cudaGetErrorName(two), cudaGetErrorName(none));
}
#endif

int main(void) {
  GPU_TEST_MAIN_BEGIN();
#ifdef SWIN_HAVE_CUDA
  GpuBatch d;
  size_t bytes = (size_t)BATCH * SIDE * SIDE * 3;
  d.images = gpu_alloc(bytes);
  d.scratch = gpu_alloc(bytes);
  d.steps = gpu_alloc(sizeof(ImageAugStep) * BATCH * IMAGE_AUG_MAX_STEPS);
  CUDA_CHECK(cudaStreamCreate(&d.stream));
  CUDA_CHECK(cudaEventCreate(&d.start));
  CUDA_CHECK(cudaEventCreate(&d.stop));
  TestRng r = {20261203};
  for (int chans = 3; chans >= 1; chans -= 2) {
    test_fixed(&d, &r, chans);
    test_random(&d, &r, "rand-m9-mstd0.5-inc1", chans);
    test_random(&d, &r, "rand-m9-n4-mstd0.5-inc1", chans);
    test_random(&d, &r, NULL, chans);
  }
  test_refusals(&d);
  CUDA_CHECK(cudaEventDestroy(d.start));
  CUDA_CHECK(cudaEventDestroy(d.stop));
  CUDA_CHECK(cudaStreamDestroy(d.stream));
  CUDA_CHECK(cudaFree(d.images));
  CUDA_CHECK(cudaFree(d.scratch));
  CUDA_CHECK(cudaFree(d.steps));
  return test_finish();
#endif
}
