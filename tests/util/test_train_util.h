// test_train_util.h: what the trainer tests (CPU and GPU) share: running train_run on a Config,
// bitwise comparison of two checkpoints, the distance between two checkpoints' weights relative
// to how far training moved them, the losses a run logged, file copies.
#pragma once
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/app/train.h"
#include "src/base/config.h"
#include "src/base/util.h"
#include "src/io/safetensors.h"
#include "src/model/model.h"

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

// The initial weights of c's model (host), for measuring how far training moved them.
static inline float *train_test_initial_weights(const Config *c, Model *m) {
  Config v = *c;
  Error err;
  if (config_validate(&v, &err) != 0 || model_create(m, &v, NULL, 0, &err) != 0) {
    printf("model: %s\n", err.msg);
    return NULL;
  }
  model_init_weights(m, v.seed);
  return m->weights;
}

// ||w_a - w_b|| / ||w_b - w_0|| over every parameter of checkpoints a and b: how far apart two
// runs ended, relative to how far training moved the weights from w_0. +inf if unreadable.
static inline double train_test_weight_distance(const Model *m, const float *w0, const char *a,
                                                const char *b) {
  SafeTensors x, y;
  Error err;
  if (safetensors_read(&x, a, &err) != 0) return printf("%s\n", err.msg), INFINITY;
  if (safetensors_read(&y, b, &err) != 0)
    return safetensors_free(&x), printf("%s\n", err.msg), INFINITY;
  double diff = 0, moved = 0;
  for (int i = 0; i < m->num_params; i++) {
    const Param *p = &m->params[i];
    const SafeTensorEntry *e = safetensors_find(&x, p->t.name),
                          *f = safetensors_find(&y, p->t.name);
    if (!e || !f) {
      diff = INFINITY;
      break;
    }
    const float *u = safetensors_entry_data(&x, e), *v = safetensors_entry_data(&y, f);
    for (int64_t j = 0; j < tensor_numel(&p->t); j++) {
      double d = (double)u[j] - v[j], g = (double)v[j] - w0[p->offset + j];
      diff += d * d;
      moved += g * g;
    }
  }
  safetensors_free(&x);
  safetensors_free(&y);
  return moved > 0 ? sqrt(diff / moved) : INFINITY;
}

// A training record's field by step from run_dir/metrics.jsonl (index = step; key as "loss" or
// "grad_norm"); returns how many.
static inline int train_test_series(const char *run_dir, const char *key, double *value, int max) {
  char path[700], line[512], field[64];
  snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
  snprintf(field, sizeof field, "\"%s\": ", key);
  FILE *f = fopen(path, "r");
  int n = 0;
  if (!f) return 0;
  while (fgets(line, sizeof line, f)) {
    long long step;
    char *p = strstr(line, field);
    if (!p || sscanf(line, "{\"step\": %lld", &step) != 1) continue;
    if (step < max) value[step] = atof(p + strlen(field)), n++;
  }
  fclose(f);
  return n;
}

// Training losses by step from run_dir/metrics.jsonl (index = step); returns how many.
static inline int train_test_losses(const char *run_dir, double *loss, int max) {
  return train_test_series(run_dir, "loss", loss, max);
}

static inline void train_test_copy_file(const char *from, const char *to) {
  size_t n;
  unsigned char *data = read_file(from, &n, NULL);
  FILE *f = fopen(to, "wb");
  if (data && f) fwrite(data, 1, n, f);
  if (f) fclose(f);
  free(data);
}
