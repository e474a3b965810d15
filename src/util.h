// util.h: errors that say where and what to do, checked allocation and file helpers, timing.
//
// Library code never exits: a fallible function returns 0 on success and -1 on failure, and
// writes a message into the caller's Error. Only a program's main() decides to exit.
// Messages read "what failed (where)" and, when there is something to do, a last line
// "HINT: ...".
#pragma once
#include <stdarg.h>
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

// Index of the first NaN or infinity in x (n), or -1 when every value is finite. Checkpoints and
// imported weights are checked with it, so that a diverged run is never saved or loaded.
int64_t first_nonfinite(const float *x, int64_t n);
// "nan", "inf" or "-inf", for messages about such a value.
const char *nonfinite_name(float x);

// Wall-clock seconds from a monotonic clock.
double time_now_s(void);

// Levenshtein distance, for "did you mean" hints.
int edit_distance(const char *a, const char *b);

#ifdef __cplusplus
}
#endif
