#define _POSIX_C_SOURCE 200809L  // posix_memalign, clock_gettime, fsync, fileno, open, mkdir
#include "src/base/util.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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

// What to do about a failed create or write, by its errno.
static const char *write_error_hint(int e) {
  switch (e) {
    case ENOENT:
      return "\nHINT: the directory does not exist; create it first";
    case EISDIR:
      return "\nHINT: remove the directory that has the temp file's name";
    case ENOSPC:
    case EDQUOT:
      return "\nHINT: the disk is full (or over quota); free space or save elsewhere";
    case EFBIG:
      return "\nHINT: the file is over the size limit (ulimit -f); raise it or save elsewhere";
    case EACCES:
    case EPERM:
    case EROFS:
      return "\nHINT: the directory is not writable; fix its permissions or save elsewhere";
    default:
      return "";
  }
}

// Makes the rename durable: the directory entry lives in the directory, not in the file.
static int sync_directory_of(const char *path, Error *err) {
  size_t len = strlen(path);
  char *dir = malloc_check(len + 2);
  const char *slash = strrchr(path, '/');
  if (!slash)
    strcpy(dir, ".");
  else if (slash == path)
    strcpy(dir, "/");
  else {
    memcpy(dir, path, (size_t)(slash - path));
    dir[slash - path] = 0;
  }
  int rc = 0;
  int fd = open(dir, O_RDONLY);
  // Some file systems cannot sync a directory (EINVAL); the rename is then as durable as they
  // make it.
  if (fd < 0 || (fsync(fd) != 0 && errno != EINVAL))
    rc = error_set(err, "saved '%s' but could not sync its directory '%s': %s", path, dir,
                   strerror(errno));
  if (fd >= 0) close(fd);
  free(dir);
  return rc;
}

int write_file_atomic(const char *path, FileWriteFn write_contents, const void *ctx, Error *err) {
  // The rename would replace whatever PATH names: as root, a device such as /dev/null.
  struct stat st;
  if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
    return error_set(err,
                     "cannot save '%s': it exists and is not a regular file (%s)\n"
                     "HINT: name a new file, or an existing file to replace",
                     path, S_ISDIR(st.st_mode) ? "a directory" : "a device, pipe or socket");
  size_t size = strlen(path) + sizeof ".tmp";
  char *tmp = malloc_check(size);
  snprintf(tmp, size, "%s.tmp", path);
  FILE *f = fopen(tmp, "wb");
  if (!f) {
    // Nothing was created (an existing PATH.tmp that is not a file stays as it was).
    int e = errno;
    error_set(err, "cannot save '%s': cannot create the temp file '%s': %s%s", path, tmp,
              strerror(e), write_error_hint(e));
    free(tmp);
    return -1;
  }
  const char *failed = NULL;  // the step that failed, with its errno in failed_errno
  int failed_errno = 0;
  if (write_contents(f, ctx) != 0 || fflush(f) != 0) failed = "write", failed_errno = errno;
  if (!failed && fsync(fileno(f)) != 0) failed = "fsync", failed_errno = errno;
  if (fclose(f) != 0 && !failed) failed = "close", failed_errno = errno;
  bool renaming = !failed;
  if (renaming && rename(tmp, path) != 0) failed = "rename to the final name", failed_errno = errno;
  int rc = 0;
  if (failed) {
    remove(tmp);
    // A rename fails with EISDIR when PATH itself is the directory.
    const char *hint = renaming && failed_errno == EISDIR
                           ? "\nHINT: the file's name is taken by a directory; remove it or save "
                             "elsewhere"
                           : write_error_hint(failed_errno);
    rc = error_set(err, "cannot save '%s': %s of '%s' failed: %s%s", path, failed, tmp,
                   strerror(failed_errno), hint);
  }
  free(tmp);
  return rc != 0 ? rc : sync_directory_of(path, err);
}

int make_directories(const char *dir, const char *hint, Error *err) {
  size_t len = strlen(dir);
  char *path = malloc_check(len + 1);
  memcpy(path, dir, len + 1);
  int rc = 0;
  // Each prefix that ends before a '/' (parents first), then dir itself; "" fails in mkdir.
  for (size_t i = len > 0 ? 1 : 0; i <= len && rc == 0; i++) {
    if (path[i] != '/' && path[i] != 0) continue;
    char c = path[i];
    path[i] = 0;
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
      rc =
          error_set(err, "cannot create directory '%s': %s\nHINT: %s", path, strerror(errno), hint);
    path[i] = c;
  }
  free(path);
  return rc;
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

void format_multiples_near(char *buf, size_t size, int value, int step) {
  int below = value / step * step;
  if (below > 0)
    snprintf(buf, size, "%d or %d", below, below + step);
  else
    snprintf(buf, size, "%d", step);
}

bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && strcmp(s + n - k, suffix) == 0;
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
