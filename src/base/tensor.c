#include "src/base/tensor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
  const char *name;
  size_t size;
} dtype_info[] = {
    [DTYPE_F32] = {"F32", 4}, [DTYPE_BF16] = {"BF16", 2}, [DTYPE_F16] = {"F16", 2},
    [DTYPE_U8] = {"U8", 1},   [DTYPE_I32] = {"I32", 4},
};

size_t dtype_size(DType dtype) {
  return dtype_info[dtype].size;
}
const char *dtype_name(DType dtype) {
  return dtype_info[dtype].name;
}

int dtype_from_name(const char *name, DType *dtype) {
  for (int i = 0; i < (int)(sizeof dtype_info / sizeof dtype_info[0]); i++)
    if (strcmp(name, dtype_info[i].name) == 0) {
      *dtype = (DType)i;
      return 0;
    }
  return -1;
}

int64_t tensor_numel(const Tensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}

size_t tensor_bytes(const Tensor *t) {
  return (size_t)tensor_numel(t) * dtype_size(t->dtype);
}

void tensor_describe(const Tensor *t, char *buf, size_t size) {
  int n = snprintf(buf, size, "%s (", t->name);
  for (int i = 0; i < t->ndim && n > 0 && (size_t)n < size; i++)
    n += snprintf(buf + n, size - (size_t)n, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
  if (n > 0 && (size_t)n < size) snprintf(buf + n, size - (size_t)n, ") %s", dtype_name(t->dtype));
}

Tensor tensor_view(void *data, DType dtype, Device device, const char *name, int ndim,
                   const int64_t *shape) {
  Tensor t = {.data = data, .dtype = dtype, .device = device, .ndim = ndim};
  for (int i = 0; i < ndim && i < TENSOR_MAX_DIMS; i++) t.shape[i] = shape[i];
  snprintf(t.name, sizeof t.name, "%s", name ? name : "");
  return t;
}

bool tensor_same_shape(const Tensor *a, const Tensor *b) {
  if (a->ndim != b->ndim) return false;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i]) return false;
  return true;
}

void arena_init(Arena *a, const char *name, Device device, size_t capacity_bytes) {
  *a = (Arena){.capacity = capacity_bytes, .device = device, .name = name, .owned = true};
  if (capacity_bytes) {
    a->base = aligned_alloc_check(capacity_bytes);
    memset(a->base, 0, capacity_bytes);
  }
}

void arena_init_at(Arena *a, const char *name, Device device, void *base, size_t capacity_bytes) {
  *a = (Arena){.base = base, .capacity = capacity_bytes, .device = device, .name = name};
}

void arena_free(Arena *a) {
  if (a->owned) free(a->base);
  *a = (Arena){0};
}

void arena_reset(Arena *a) {
  a->used = 0;
}

void *arena_alloc(Arena *a, size_t bytes) {
  return arena_alloc_aligned(a, bytes, 64);
}

void *arena_alloc_aligned(Arena *a, size_t bytes, size_t align) {
  size_t offset = (a->used + align - 1) & ~(align - 1);
  a->used = offset + bytes;
  if (!a->base) return NULL;  // counting pass
  if (a->used > a->capacity) {
    fprintf(stderr, "internal error: arena '%s' overflow (%zu > %zu bytes)\n", a->name, a->used,
            a->capacity);
    abort();
  }
  return a->base + offset;
}

float *arena_floats(Arena *a, int64_t count) {
  return (float *)arena_alloc(a, (size_t)count * sizeof(float));
}
