// profile_loader.c: where one loader thread's time goes, per training image: reading the file,
// decoding it (stb_image), RandomResizedCrop + flip (Pillow-exact bicubic resize), and
// RandAugment rand-m9-mstd0.5-inc1; and how often a decoder that scales while decoding (JPEG's
// DCT scaling by 1/2, 1/4, 1/8) could have served the crop: the largest such factor s with the
// crop box still at least s times the output size on both axes (a smaller decode loses nothing
// the resize keeps only when that holds).
//
// Build (repo root, after cmake --build build; not part of the CMake build):
//   gcc -std=c11 -O3 -march=native -fopenmp -I. -I/usr/include/stb scripts/profile_loader.c
//       build/libswincore.a -lm -lpthread -o /tmp/profile_loader
// Run:
//   /tmp/profile_loader ROOT [IMAGES=500] [SIZE=224]
// ROOT/train is an ImageFolder (scripts/make_jpegs.py writes one). One thread, so the figures
// are per core; the loader runs this per image on data.workers threads.
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/image.h"
#include "data/transform.h"
#include "src/base/util.h"

enum { MAX_FILES = 100000 };

static int list_jpegs(const char *dir, char **paths, int n, int max) {
  DIR *d = opendir(dir);
  if (!d) return n;
  struct dirent *e;
  while ((e = readdir(d)) && n < max) {
    if (e->d_name[0] == '.') continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    size_t len = strlen(path);
    if (len > 4 && strcmp(path + len - 4, ".jpg") == 0)
      paths[n++] = strdup(path);
    else
      n = list_jpegs(path, paths, n, max);
  }
  closedir(d);
  return n;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s ROOT [IMAGES=500] [SIZE=224]\n", argv[0]);
    return 2;
  }
  int want = argc > 2 ? atoi(argv[2]) : 500, size = argc > 3 ? atoi(argv[3]) : 224;
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/train", argv[1]);
  char **paths = calloc(MAX_FILES, sizeof *paths);
  int n = list_jpegs(dir, paths, 0, want < MAX_FILES ? want : MAX_FILES);
  if (n == 0) {
    fprintf(stderr, "error: no .jpg under %s\n", dir);
    return 1;
  }
  TransformParams p = {.out_h = size,
                       .out_w = size,
                       .chans = 3,
                       .scale_min = 0.08f,
                       .scale_max = 1.0f,
                       .ratio_min = 3.0f / 4,
                       .ratio_max = 4.0f / 3,
                       .hflip = 0.5f,
                       .crop_pct = 0.875f,
                       .resample = RESAMPLE_BICUBIC,
                       .fill = {124, 116, 104}};
  Error err;
  if (randaugment_parse(&p.randaugment, "rand-m9-mstd0.5-inc1", &err) != 0) {
    fprintf(stderr, "error: %s\n", err.msg);
    return 1;
  }
  uint8_t *out = malloc((size_t)size * size * 3);
  double t_read = 0, t_decode = 0, t_crop = 0, t_aug = 0, t_eval = 0, bytes = 0, pixels = 0;
  int scalable[4] = {0};  // crops a decode at 1, 1/2, 1/4, 1/8 scale could serve, largest s
  for (int i = 0; i < n; i++) {
    double t0 = time_now_s();
    size_t fsize;
    uint8_t *file = read_file(paths[i], &fsize, &err);
    if (!file) {
      fprintf(stderr, "error: %s\n", err.msg);
      return 1;
    }
    double t1 = time_now_s();
    int h, w;
    char why[256];
    uint8_t *img = image_decode(file, fsize, 3, &h, &w, why, sizeof why);
    if (!img) {
      fprintf(stderr, "error: %s: %s\n", paths[i], why);
      return 1;
    }
    double t2 = time_now_s();
    Rng rng = rng_make(0, RNG_STREAM_AUGMENT, 0, (uint64_t)i);
    Rng box_rng = rng;
    transform_train(&p, img, h, w, &rng, out);
    double t3 = time_now_s();
    transform_train_color(&p, out, 3, &rng);
    double t4 = time_now_s();
    transform_eval(&p, img, h, w, out);
    double t5 = time_now_s();
    CropBox box = transform_rrc_box(&p, h, w, &box_rng);
    int k = 0;
    while (k < 3 && box.h >= (2 << k) * size && box.w >= (2 << k) * size) k++;
    scalable[k]++;
    t_read += t1 - t0, t_decode += t2 - t1, t_crop += t3 - t2, t_aug += t4 - t3, t_eval += t5 - t4;
    bytes += (double)fsize, pixels += (double)h * w;
    image_free(img);
    free(file);
  }
  double train = t_read + t_decode + t_crop + t_aug;
  printf("# %d JPEGs from %s: mean %.1f KB, %.0f kpixels; one thread, output %dx%d\n", n, dir,
         bytes / n / 1024, pixels / n / 1000, size, size);
  printf("| stage | ms per image | share of train |\n|---|---|---|\n");
  printf("| read file | %.3f | %.1f%% |\n", 1e3 * t_read / n, 100 * t_read / train);
  printf("| decode (stb_image) | %.3f | %.1f%% |\n", 1e3 * t_decode / n, 100 * t_decode / train);
  printf("| RandomResizedCrop + flip | %.3f | %.1f%% |\n", 1e3 * t_crop / n, 100 * t_crop / train);
  printf("| RandAugment m9 mstd0.5 inc1 | %.3f | %.1f%% |\n", 1e3 * t_aug / n, 100 * t_aug / train);
  printf("| train total | %.3f | %.0f img/s per core |\n", 1e3 * train / n, n / train);
  printf("| eval resize + center crop (after decode) | %.3f | |\n", 1e3 * t_eval / n);
  printf(
      "RandomResizedCrop boxes a scaled decode could serve: 1/2 %.1f%%, 1/4 %.1f%%, "
      "1/8 %.1f%%; full size needed %.1f%%\n",
      100.0 * scalable[1] / n, 100.0 * scalable[2] / n, 100.0 * scalable[3] / n,
      100.0 * scalable[0] / n);
  // Each RandAugment op at magnitude 9 on a decoded, cropped image, both interpolations for the
  // geometric ones (RandAugment picks one of them at random).
  uint8_t *scratch = malloc((size_t)size * size * 3), *work = malloc((size_t)size * size * 3);
  printf("| RandAugment op (magnitude 9, %dx%dx3) | ms per call |\n|---|---|\n", size, size);
  for (int op = 0; op < RA_NUM_OPS; op++) {
    double arg = randaugment_op_arg((RandAugmentOp)op, true, 9.0, false), t = 0;
    int calls = 0;
    for (int interp = 0; interp < 2; interp++)
      for (int rep = 0; rep < 20; rep++, calls++) {
        memcpy(work, out, (size_t)size * size * 3);
        double t0 = time_now_s();
        randaugment_apply((RandAugmentOp)op, arg, (Interp)interp, p.fill, work, size, size, 3,
                          scratch);
        t += time_now_s() - t0;
      }
    printf("| %s | %.3f |\n", randaugment_op_name((RandAugmentOp)op, true), 1e3 * t / calls);
  }
  free(scratch);
  free(work);
  free(out);
  for (int i = 0; i < n; i++) free(paths[i]);
  free(paths);
  return 0;
}
