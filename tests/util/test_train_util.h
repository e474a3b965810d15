// test_train_util.h: what the trainer tests (CPU and GPU) share: running train_run on a Config,
// bitwise comparison of two checkpoints, the losses a run logged, file copies.
#pragma once
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/app/train.h"
#include "src/base/config.h"
#include "src/base/util.h"
#include "src/io/safetensors.h"

// Validates and trains as a single process; prints the error and returns -1 on failure.
static inline int train_test_run(const Config *c) {
  Config v = *c;
  Error err;
  if (config_validate(&v, &err) != 0) {
    printf("config: %s\n", err.msg);
    return -1;
  }
  Comm alone;  // rank 0 of 1: no launcher started a test program
  if (comm_init(&alone, &err) != 0 || alone.mpi) {
    printf("comm_init: %s\n", alone.mpi ? "a launcher started this test" : err.msg);
    return -1;
  }
  int rc = train_run(&v, &alone, &err);
  if (rc != 0) printf("train_run: %s\n", err.msg);
  return rc;
}

// run_dir/ckpt-<step>.safetensors, in one of a few rotating static buffers.
static inline const char *train_test_ckpt(const char *run_dir, int step) {
  static char paths[4][600];
  static int k;
  k = (k + 1) % 4;
  snprintf(paths[k], sizeof paths[k], "%s/ckpt-%08d.safetensors", run_dir, step);
  return paths[k];
}

// Every tensor of two checkpoints bitwise equal (weights and AdamW moments).
static inline bool train_test_same_tensors(const char *a, const char *b) {
  SafeTensors x, y;
  Error err;
  if (safetensors_read(&x, a, &err) != 0) return printf("%s\n", err.msg), false;
  if (safetensors_read(&y, b, &err) != 0)
    return safetensors_free(&x), printf("%s\n", err.msg), false;
  bool same = x.count == y.count && x.count > 0;
  for (int i = 0; same && i < x.count; i++) {
    const SafeTensorEntry *e = &x.entries[i], *f = safetensors_find(&y, e->name);
    same = f && e->end - e->begin == f->end - f->begin &&
           memcmp(safetensors_entry_data(&x, e), safetensors_entry_data(&y, f),
                  e->end - e->begin) == 0;
    if (!same) printf("     tensor %s differs\n", e->name);
  }
  safetensors_free(&x);
  safetensors_free(&y);
  return same;
}

// Training losses by step from run_dir/metrics.jsonl (index = step); returns how many.
static inline int train_test_losses(const char *run_dir, double *loss, int max) {
  char path[700], line[512];
  snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
  FILE *f = fopen(path, "r");
  int n = 0;
  if (!f) return 0;
  while (fgets(line, sizeof line, f)) {
    long long step;
    char *p = strstr(line, "\"loss\": ");
    if (!p || sscanf(line, "{\"step\": %lld", &step) != 1) continue;
    if (step < max) loss[step] = atof(p + 8), n++;
  }
  fclose(f);
  return n;
}

static inline void train_test_copy_file(const char *from, const char *to) {
  size_t n;
  unsigned char *data = read_file(from, &n, NULL);
  FILE *f = fopen(to, "wb");
  if (data && f) fwrite(data, 1, n, f);
  if (f) fclose(f);
  free(data);
}
