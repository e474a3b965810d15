// safetensors.h: the file format of checkpoints, exports and imports.
//
// Layout: 8-byte little-endian header length n, n bytes of JSON
//   {"__metadata__": {"key": "value", ...}, "name": {"dtype": "F32", "shape": [..],
//    "data_offsets": [begin, end]}, ...}
// then the data section; offsets are relative to its start. The reader checks everything a
// malformed or hostile file could get wrong (header length, JSON syntax, dtype names, shapes
// that do not match the byte range, ranges outside the file or overlapping) and reports the file
// and the entry. Files written here carry metadata "swin.checksum" (16 hex digits): FNV-1a 64
// over 8-byte words of every other metadata key and value, every tensor entry (name, dtype,
// shape, offsets) and the data section (exact order in safetensors.c). The reader verifies it
// when present, so a flipped byte anywhere but in the padding is refused instead of trained on.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "src/base/tensor.h"
#include "src/base/util.h"

typedef struct {
  char name[256];
  DType dtype;
  int ndim;
  int64_t shape[TENSOR_MAX_DIMS];
  uint64_t begin, end;  // byte offsets into the data section
} SafeTensorEntry;

typedef struct {
  char *key, *value;
} SafeTensorMeta;

typedef struct {
  char path[512];
  unsigned char *file;  // the whole file
  size_t file_size;
  const unsigned char *data;  // start of the data section
  size_t data_size;
  SafeTensorEntry *entries;
  int count;
  SafeTensorMeta *meta;
  int meta_count;
  bool has_checksum;  // the file carried swin.checksum (and it matched)
} SafeTensors;

// Reads and validates a file. On error fills err (naming the path and the problem) and leaves
// st empty (safe to free).
int safetensors_read(SafeTensors *st, const char *path, Error *err);
// Same, from memory (takes a copy); origin names it in errors.
int safetensors_parse(SafeTensors *st, const unsigned char *bytes, size_t size, const char *origin,
                      Error *err);
void safetensors_free(SafeTensors *st);
const SafeTensorEntry *safetensors_find(const SafeTensors *st, const char *name);
const void *safetensors_entry_data(const SafeTensors *st, const SafeTensorEntry *e);
// Entry e as a tensor over the file's bytes (host memory, valid while st is), for shape checks
// against what a model expects (tensor_same_shape) and messages (tensor_describe); the name
// is cut at TENSOR_NAME_MAX - 1 bytes.
Tensor safetensors_entry_tensor(const SafeTensors *st, const SafeTensorEntry *e);
const char *safetensors_meta_get(const SafeTensors *st, const char *key);  // NULL if absent

// Writer: collect tensors (pointers, not copies: they must stay valid until save) and metadata,
// then save atomically (write_file_atomic, src/base/util.h): write PATH.tmp, fsync it, rename over
// PATH, fsync the directory. A failure leaves any existing PATH untouched and removes the temp
// file.
typedef struct {
  SafeTensorEntry *entries;
  const void **datas;
  int count, capacity;
  SafeTensorMeta *meta;
  int meta_count, meta_capacity;
} SafeTensorWriter;

void safetensors_writer_init(SafeTensorWriter *w);
void safetensors_writer_add(SafeTensorWriter *w, const char *name, DType dtype, int ndim,
                            const int64_t *shape, const void *data);
// The same from a tensor's description: its name, dtype, shape and data.
void safetensors_writer_add_tensor(SafeTensorWriter *w, const Tensor *t);
void safetensors_writer_meta(SafeTensorWriter *w, const char *key, const char *value);
int safetensors_writer_save(SafeTensorWriter *w, const char *path, Error *err);
void safetensors_writer_free(SafeTensorWriter *w);

// fp32 <-> bf16 (round to nearest even, NaN kept) and fp16 (IEEE half, round to nearest even).
uint16_t f32_to_bf16(float x);
float bf16_to_f32(uint16_t x);
uint16_t f32_to_f16(float x);
float f16_to_f32(uint16_t x);
