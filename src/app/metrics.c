// metrics.c: the metrics.jsonl writer (src/app/metrics.h).
#define _XOPEN_SOURCE 700  // pread, ftruncate, fdopen
#define _FILE_OFFSET_BITS 64
#include "src/app/metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *write_hint(int e) {
  return e == ENOSPC  ? "\nHINT: the disk is full; free space, then resume=auto"
         : e == EFBIG ? "\nHINT: the file reached the size limit (ulimit -f); raise it, then "
                        "resume=auto"
                      : "";
}

// The length the file should have: up to and including its last newline. Reads backwards in
// blocks, so a long history costs one block in the common case (a complete last line).
static int complete_length(int fd, off_t size, off_t *length) {
  char block[4096];
  off_t end = size;
  while (end > 0) {
    off_t start = end > (off_t)sizeof block ? end - (off_t)sizeof block : 0;
    ssize_t n = pread(fd, block, (size_t)(end - start), start);
    if (n != end - start) return -1;
    for (ssize_t i = n - 1; i >= 0; i--)
      if (block[i] == '\n') {
        *length = start + i + 1;
        return 0;
      }
    end = start;
  }
  *length = 0;
  return 0;
}

int metrics_open(MetricsLog *metrics, const char *dir, FILE *log, Error *err) {
  metrics->file = NULL;
  snprintf(metrics->path, sizeof metrics->path, "%s/metrics.jsonl", dir);
  int fd = open(metrics->path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0)
    return error_set(err, "cannot open '%s' for appending: %s\nHINT: check run_dir", metrics->path,
                     strerror(errno));
  struct stat info;
  off_t keep = 0;
  if (fstat(fd, &info) != 0 || complete_length(fd, info.st_size, &keep) != 0 ||
      (keep < info.st_size && ftruncate(fd, keep) != 0)) {
    int e = errno;
    close(fd);
    return error_set(err, "cannot read or repair '%s': %s", metrics->path, strerror(e));
  }
  if (keep < info.st_size && log)
    fprintf(log, "metrics: dropped the incomplete last record of %s (%lld bytes)\n", metrics->path,
            (long long)(info.st_size - keep));
  metrics->file = fdopen(fd, "a");
  if (!metrics->file) {
    int e = errno;
    close(fd);
    return error_set(err, "cannot open '%s': %s", metrics->path, strerror(e));
  }
  return 0;
}

int metrics_write(MetricsLog *metrics, Error *err, const char *fmt, ...) {
  if (!metrics->file) return 0;  // not opened: a rank other than 0 of a job
  va_list ap;
  va_start(ap, fmt);
  errno = 0;
  bool ok = vfprintf(metrics->file, fmt, ap) >= 0 && fputc('\n', metrics->file) != EOF &&
            fflush(metrics->file) == 0;
  va_end(ap);
  if (ok) return 0;
  int e = errno ? errno : EIO;
  return error_set(err, "cannot write to '%s': %s%s", metrics->path, strerror(e), write_hint(e));
}

void metrics_close(MetricsLog *metrics) {
  if (metrics->file) fclose(metrics->file);
  metrics->file = NULL;
}
