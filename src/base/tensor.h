// tensor.h: a tensor is a description of memory (dtype, device, shape, name), not an object
// with behaviour; views own nothing. Memory comes from a few arenas planned up front: a
// tensor is a view at an offset in one of them, and nothing is allocated on the hot path.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "src/base/util.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DTYPE_F32, DTYPE_BF16, DTYPE_F16, DTYPE_U8, DTYPE_I32 } DType;
typedef enum { DEVICE_CPU, DEVICE_CUDA } Device;

#define TENSOR_MAX_DIMS 6
#define TENSOR_NAME_MAX 96

typedef struct {
  void *data;
  DType dtype;
  Device device;
  int ndim;
  int64_t shape[TENSOR_MAX_DIMS];
  char name[TENSOR_NAME_MAX];
} Tensor;

size_t dtype_size(DType dtype);
const char *dtype_name(DType dtype);                  // "F32", "BF16", ... (safetensors spelling)
int dtype_from_name(const char *name, DType *dtype);  // 0 ok, -1 unknown

int64_t tensor_numel(const Tensor *t);
size_t tensor_bytes(const Tensor *t);
// "layers.0.blocks.1.attn.qkv.weight (288, 96) F32"
void tensor_describe(const Tensor *t, char *buf, size_t size);
// Builds a view: shape given as ndim values. name may be NULL.
Tensor tensor_view(void *data, DType dtype, Device device, const char *name, int ndim,
                   const int64_t *shape);
bool tensor_same_shape(const Tensor *a, const Tensor *b);

// An arena is one large allocation handed out front to back at 64-byte aligned offsets.
// Plan with a counting pass (base == NULL: only `used` advances), allocate once, then hand out
// the same sequence of views.
typedef struct {
  unsigned char *base;
  size_t capacity;  // bytes
  size_t used;      // bytes
  Device device;
  const char *name;
  bool owned;  // base came from arena_init (freed by arena_free)
} Arena;

void arena_init(Arena *a, const char *name, Device device, size_t capacity_bytes);
// An arena over memory the caller allocated (backend memory); arena_free does not free it.
void arena_init_at(Arena *a, const char *name, Device device, void *base, size_t capacity_bytes);
void arena_free(Arena *a);
void arena_reset(Arena *a);
// Returns a 64-byte aligned block of `bytes` (NULL during a counting pass). Aborts with the
// arena's name if it overflows: that is a planning bug, not a user error.
void *arena_alloc(Arena *a, size_t bytes);
// The same at an offset that is a multiple of align (a power of two, at least 64).
void *arena_alloc_aligned(Arena *a, size_t bytes, size_t align);
float *arena_floats(Arena *a, int64_t count);

#ifdef __cplusplus
}
#endif
