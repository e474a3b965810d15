// test_gpu_curve.c: 200 steps of bf16 training on the GPU follow the CPU's fp32 loss curve on
// Fashion-MNIST (configs/fashion_mnist.ini: the same data order, initialization and drop-path
// draws). The mean training loss of every 10 steps is compared. bf16 rounds activations and the
// GEMM weights to 8 significant bits, so the two runs drift apart slowly: the windows must stay
// within CURVE_TOL of each other and the last one within CURVE_FINAL_TOL (relative).
// The dataset comes from SWIN_FASHION_DIR or /usr/share/datasets/fashion-mnist.
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <sys/stat.h>

#include "tests/util/test_gpu_util.h"

#ifdef SWIN_HAVE_CUDA
#include "tests/util/test_train_util.h"

#define CURVE_STEPS 200
#define CURVE_WINDOW 10
#define CURVE_TOL 0.05
#define CURVE_FINAL_TOL 0.03

static int run_default(const char *run_dir, const char *data, const char *device,
                       const char *precision) {
  Config c;
  Error err;
  config_defaults(&c);
  if (config_load_file(&c, SWIN_SOURCE_DIR "/configs/fashion_mnist.ini", &err) != 0) {
    printf("%s\n", err.msg);
    return -1;
  }
  char overrides[8][600];
  snprintf(overrides[0], sizeof overrides[0], "run_dir=%s", run_dir);
  snprintf(overrides[1], sizeof overrides[1], "data.path=%s", data);
  snprintf(overrides[2], sizeof overrides[2], "device=%s", device);
  snprintf(overrides[3], sizeof overrides[3], "precision=%s", precision);
  snprintf(overrides[4], sizeof overrides[4], "train.max_steps=%d", CURVE_STEPS);
  snprintf(overrides[5], sizeof overrides[5], "train.log_every=%d", CURVE_WINDOW);
  snprintf(overrides[6], sizeof overrides[6], "train.eval_every=%d", CURVE_STEPS);
  snprintf(overrides[7], sizeof overrides[7], "ckpt.every=%d", CURVE_STEPS);
  for (int i = 0; i < 8; i++)
    if (config_apply_override(&c, overrides[i], &err) != 0) {
      printf("%s\n", err.msg);
      return -1;
    }
  return train_test_run(&c);
}

int main(void) {
  GPU_TEST_MAIN_BEGIN();
  const char *data = getenv("SWIN_FASHION_DIR");
  if (!data) data = "/usr/share/datasets/fashion-mnist";
  struct stat sb;
  if (stat(data, &sb) != 0) {
    printf("SKIP: Fashion-MNIST not found at %s (set SWIN_FASHION_DIR)\n", data);
    return 77;
  }
  char root[] = "/tmp/swin_test_gpu_curve_XXXXXX";
  if (!mkdtemp(root)) return 1;
  char gpu_dir[300], cpu_dir[300];
  snprintf(gpu_dir, sizeof gpu_dir, "%s/gpu", root);
  snprintf(cpu_dir, sizeof cpu_dir, "%s/cpu", root);
  test_check(run_default(gpu_dir, data, "cuda", "bf16") == 0, "bf16 GPU run of %d steps",
             CURVE_STEPS);
  test_check(run_default(cpu_dir, data, "cpu", "fp32") == 0, "fp32 CPU run of %d steps",
             CURVE_STEPS);
  double g[CURVE_STEPS + 1] = {0}, c[CURVE_STEPS + 1] = {0};
  train_test_losses(gpu_dir, g, CURVE_STEPS + 1);
  train_test_losses(cpu_dir, c, CURVE_STEPS + 1);
  double worst = 0, last = NAN;
  printf("  step   gpu bf16   cpu fp32   rel diff\n");
  for (int s = CURVE_WINDOW; s <= CURVE_STEPS; s += CURVE_WINDOW) {
    double d = fabs(g[s] - c[s]) / c[s];
    printf("  %4d   %8.4f   %8.4f   %7.2f%%\n", s, g[s], c[s], 100 * d);
    if (!(d <= worst)) worst = d;
    last = d;
  }
  test_check(worst <= CURVE_TOL, "every %d-step mean loss within %.2f%% (tol %.0f%%)", CURVE_WINDOW,
             100 * worst, 100 * CURVE_TOL);
  test_check(last <= CURVE_FINAL_TOL, "last window within %.2f%% (tol %.0f%%)", 100 * last,
             100 * CURVE_FINAL_TOL);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf %s", root);
  if (test_stats.failed == 0 && system(cmd) != 0) printf("note: could not remove %s\n", root);
  return test_finish();
}
#else
int main(void) {
  GPU_TEST_MAIN_BEGIN();
}
#endif
