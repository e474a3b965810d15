// util.h: errors that say where and what to do, checked allocation and file helpers, timing.
//
// Library code never exits: a fallible function returns 0 on success and -1 on failure, and
// writes a message into the caller's Error. Only a program's main() decides to exit.
// Messages read "what failed (where)" and, when there is something to do, a last line
// "HINT: ...".
#pragma once
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  char msg[4096];
} Error;

// Writes a printf-style message into err (if not NULL) and returns -1, so that
// `return error_set(err, "...")` reports and fails in one line.
int error_set(Error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// Prepends context ("while loading X: ") to an existing message; returns -1.
int error_prefix(Error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// Allocation that cannot fail silently: aborts with file:line on out-of-memory
// (there is nothing sensible a trainer can do without its memory).
void *malloc_check_(size_t size, const char *file, int line);
void *calloc_check_(size_t count, size_t size, const char *file, int line);
#define malloc_check(size) malloc_check_((size), __FILE__, __LINE__)
#define calloc_check(count, size) calloc_check_((count), (size), __FILE__, __LINE__)

// 64-byte aligned allocation for arenas (vector loads, cache lines); free with free().
void *aligned_alloc_check_(size_t size, const char *file, int line);
#define aligned_alloc_check(size) aligned_alloc_check_((size), __FILE__, __LINE__)

// Reads a whole file; returns NULL and fills err on failure. *size gets the byte count.
unsigned char *read_file(const char *path, size_t *size, Error *err);

// Writes a file atomically, so that a crash or a full disk leaves PATH either as it was or
// complete: write_contents fills PATH.tmp (returning 0, or -1 with errno set by the write that
// failed), which is flushed, fsynced and renamed over PATH, and then PATH's directory is fsynced
// (the rename lives there). A PATH that exists and is not a regular file (a directory, a
// device such as /dev/null, a FIFO) is refused first. On failure the temp file is removed (an
// existing PATH.tmp that could not be opened, such as a directory, is left alone) and err reads
// "cannot save 'PATH': ..." with the failed step, the temp file, the cause and, for the usual
// causes (missing directory, full disk, size limit, permissions), a HINT; a failed directory sync,
// after the rename, reads "saved 'PATH' but could not sync its directory ...". A process killed
// mid-write leaves PATH.tmp behind (checkpoint_remove_stale_temps clears a run directory's).
typedef int (*FileWriteFn)(FILE *f, const void *ctx);
int write_file_atomic(const char *path, FileWriteFn write_contents, const void *ctx, Error *err);

// mkdir -p: creates dir and whichever of its parents are missing (mode 0755); existing ones are
// fine. A failure ("" included) names the directory that could not be made and the cause, then
// "HINT: <hint>".
int make_directories(const char *dir, const char *hint, Error *err);

// Index of the first NaN or infinity in x (n), or -1 when every value is finite. Checkpoints and
// imported weights are checked with it, so that a diverged run is never saved or loaded.
int64_t first_nonfinite(const float *x, int64_t n);
// "nan", "inf" or "-inf", for messages about such a value.
const char *nonfinite_name(float x);

// Wall-clock seconds from a monotonic clock.
double time_now_s(void);

// Levenshtein distance, for "did you mean" hints.
int edit_distance(const char *a, const char *b);

// Whether s ends with suffix (file kinds by their names: ".onnx", ".safetensors").
bool ends_with(const char *s, const char *suffix);

// The multiples of step nearest value, for a HINT: "48 or 64" around 50 by 16, "16" below it.
void format_multiples_near(char *buf, size_t size, int value, int step);

#ifdef __cplusplus
}
#endif
