// fuzz.h: what the fuzz harnesses (tests/fuzz/fuzz_<name>.c) share.
//
// A harness defines LLVMFuzzerTestOneInput, the libFuzzer entry point. It is linked twice: with
// libFuzzer (clang -fsanitize=fuzzer, SWIN_FUZZ=ON) for fuzzing, and with replay.c in every
// build, where ctest runs it over tests/fuzz/corpus/<name>/ (the seeds and the inputs of every
// fixed finding). A harness aborts, with a message, when the code under test breaks a promise
// that is not a crash (a round trip that changes a value, a loaded NaN), so the fuzzer reports
// it like one.
//
// libFuzzer gives the entry point no context, so each harness keeps what it sets up once (a
// scratch directory, a model) in function-local statics: test scaffolding, not a pattern for
// the program.
#pragma once
// Its includers define _XOPEN_SOURCE 700 (mkdtemp, nftw) before any header.
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/base/config.h"

// Stops the run like a crash, saying which promise broke.
#define FUZZ_REQUIRE(cond, ...)                                             \
  do {                                                                      \
    if (!(cond)) {                                                          \
      fprintf(stderr, "fuzz: %s:%d: broken promise: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                                         \
      fputc('\n', stderr);                                                  \
      abort();                                                              \
    }                                                                       \
  } while (0)

static inline int fuzz_remove_entry(const char *path, const struct stat *sb, int flag,
                                    struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

static inline char *fuzz_scratch_storage(void) {
  static char path[256];  // short: callers append names to it
  return path;
}

static inline void fuzz_remove_scratch(void) {
  const char *path = fuzz_scratch_storage();
  if (path[0]) nftw(path, fuzz_remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

// This process's scratch directory (created on the first call, removed at exit): in /dev/shm
// when there is one, so that the many small files a fuzzer writes never wait for a disk.
static inline const char *fuzz_scratch(void) {
  char *path = fuzz_scratch_storage();
  if (path[0]) return path;
  struct stat sb;
  const char *base = stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) ? "/dev/shm" : "/tmp";
  snprintf(path, 256, "%s/swin_fuzz_XXXXXX", base);
  if (!mkdtemp(path)) {
    perror("fuzz: mkdtemp");
    abort();
  }
  atexit(fuzz_remove_scratch);
  return path;
}

// scratch/name (directories below scratch must exist), written with bytes; returns the path.
static inline const char *fuzz_write(const char *name, const uint8_t *data, size_t size) {
  static char path[1024];
  snprintf(path, sizeof path, "%s/%s", fuzz_scratch(), name);
  FILE *f = fopen(path, "wb");
  if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
    perror(path);
    abort();
  }
  return path;
}

static inline void fuzz_mkdir(const char *name) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", fuzz_scratch(), name);
  if (mkdir(path, 0755) != 0) {
    perror(path);
    abort();
  }
}

// The model of fuzz_checkpoint and of its seeds (make_seeds.c): two stages, so that the
// official layout's downsample renaming applies, and small, so that inputs stay small.
static inline void fuzz_tiny_config(Config *c) {
  config_defaults(c);
  c->img_h = c->img_w = 8;
  c->in_chans = 1;
  c->patch_size = 2;
  c->embed_dim = 4;
  memset(c->depths, 0, sizeof c->depths);  // lists end at the first 0
  memset(c->num_heads, 0, sizeof c->num_heads);
  c->num_stages = 2;
  c->depths[0] = c->depths[1] = 1;
  c->num_heads[0] = 1, c->num_heads[1] = 2;
  c->window_size = 2;
  c->mlp_ratio = 1;
  c->num_classes = 3;
  c->num_mean = 1;
  memset(c->mean, 0, sizeof c->mean);
  memset(c->std, 0, sizeof c->std);
  c->mean[0] = 0.5f;
  c->std[0] = 0.25f;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
