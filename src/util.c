#define _POSIX_C_SOURCE 200809L  // posix_memalign, clock_gettime
#include "src/util.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int error_set(Error *err, const char *fmt, ...) {
  if (err) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
  }
  return -1;
}

int error_prefix(Error *err, const char *fmt, ...) {
  if (err) {
    char prefix[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    size_t cap = sizeof err->msg, p = strlen(prefix), n = strnlen(err->msg, cap - 1);
    if (p > cap - 1) p = cap - 1;
    if (n > cap - 1 - p) n = cap - 1 - p;  // the message's tail gives way to the prefix
    memmove(err->msg + p, err->msg, n);
    memcpy(err->msg, prefix, p);
    err->msg[p + n] = 0;
  }
  return -1;
}

static void die_oom(size_t size, const char *file, int line) {
  fprintf(stderr,
          "error: out of memory allocating %zu bytes (%s:%d)\n"
          "HINT: lower train.batch_size or use a smaller model\n",
          size, file, line);
  exit(1);
}

void *malloc_check_(size_t size, const char *file, int line) {
  void *p = malloc(size ? size : 1);
  if (!p) die_oom(size, file, line);
  return p;
}

void *calloc_check_(size_t count, size_t size, const char *file, int line) {
  void *p = calloc(count ? count : 1, size ? size : 1);
  if (!p) die_oom(count * size, file, line);
  return p;
}

void *aligned_alloc_check_(size_t size, const char *file, int line) {
  void *p = NULL;
  if (posix_memalign(&p, 64, size ? size : 64) != 0) die_oom(size, file, line);
  return p;
}

unsigned char *read_file(const char *path, size_t *size, Error *err) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    error_set(err, "cannot open '%s': %s", path, strerror(errno));
    return NULL;
  }
  if (fseek(f, 0, SEEK_END) != 0) goto fail;
  long n = ftell(f);
  if (n < 0 || fseek(f, 0, SEEK_SET) != 0) goto fail;
  unsigned char *buf = malloc_check((size_t)n + 1);
  if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    goto fail;
  }
  buf[n] = 0;
  fclose(f);
  *size = (size_t)n;
  return buf;
fail:
  error_set(err, "cannot read '%s': %s", path, strerror(errno ? errno : EIO));
  fclose(f);
  return NULL;
}

// Blocks of floats are tested with integer bit masks and no early exit, so the compiler can
// vectorize the common all-finite case; only a block that holds a bad value is searched.
int64_t first_nonfinite(const float *x, int64_t n) {
  enum { BLOCK = 1024 };
  for (int64_t start = 0; start < n; start += BLOCK) {
    int64_t len = n - start < BLOCK ? n - start : BLOCK;
    unsigned bad = 0;
    for (int64_t i = 0; i < len; i++) {
      uint32_t bits;
      memcpy(&bits, &x[start + i], 4);
      bad |= (bits & 0x7F800000u) == 0x7F800000u;  // exponent all ones: inf or NaN
    }
    if (!bad) continue;
    for (int64_t i = 0; i < len; i++)
      if (!isfinite(x[start + i])) return start + i;
  }
  return -1;
}

const char *nonfinite_name(float x) {
  return isnan(x) ? "nan" : x > 0 ? "inf" : "-inf";
}

double time_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int edit_distance(const char *a, const char *b) {
  size_t n = strlen(a), m = strlen(b);
  if (n > 63 || m > 63) return 64;
  int d[64][64];
  for (size_t i = 0; i <= n; i++) d[i][0] = (int)i;
  for (size_t j = 0; j <= m; j++) d[0][j] = (int)j;
  for (size_t i = 1; i <= n; i++)
    for (size_t j = 1; j <= m; j++) {
      int sub = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
      int del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
      d[i][j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
    }
  return d[n][m];
}
