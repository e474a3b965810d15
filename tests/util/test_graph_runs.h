// test_graph_runs.h: a training run whose CUDA-graph replays are counted, for the GPU tests that
// check train.cuda_graphs (tests/test_gpu_train.c, tests/test_gpu_recompute.c). Uses dup/dup2:
// the including file defines _POSIX_C_SOURCE before its first include.
#pragma once
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include "tests/util/test_train_util.h"

// Trains c with its stdout also kept in run_dir.log; *replayed and *steps get the counts of the
// last "cuda graphs:" line ("... N of M steps replayed", or "micro-batches" with accumulation; 0
// and 0 when it names none).
static inline int train_test_run_counting_replays(const Config *c, long long *replayed,
                                                  long long *steps) {
  char path[600], line[512];
  snprintf(path, sizeof path, "%s.log", c->run_dir);
  fflush(stdout);
  int saved = dup(1), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (saved < 0 || fd < 0) return -1;
  dup2(fd, 1);
  close(fd);
  int rc = train_test_run(c);
  fflush(stdout);
  dup2(saved, 1);
  close(saved);
  *replayed = *steps = 0;
  FILE *f = fopen(path, "r");
  while (f && fgets(line, sizeof line, f)) {
    const char *p = strstr(line, "cuda graphs: ");
    if (p) printf("     %s", p);
    const char *q = p ? strstr(p, "; ") : NULL;
    if (q && sscanf(q, "; %lld of %lld", replayed, steps) != 2) *replayed = *steps = 0;
  }
  if (f) fclose(f);
  if (rc != 0) printf("     (the run's output is in %s)\n", path);
  return rc;
}
