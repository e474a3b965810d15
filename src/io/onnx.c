// onnx.c: the ONNX container (OnnxModel) with its builders and lookups, and its protobuf
// encoder (onnx_model_save, written atomically) and decoder (onnx_model_load). The Swin graph
// that fills a container is built in src/onnx_swin.c.
//
// Field numbers are those of onnx/onnx.proto (proto2): repeated scalars are written unpacked,
// as Python's protobuf writes them; the reader accepts packed and unpacked.
#include "src/io/onnx.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---------------------------------------------------------------------------------------------
// The container

void onnx_model_init(OnnxModel *om) {
  memset(om, 0, sizeof *om);
  om->ir_version = ONNX_IR_VERSION;
  om->opset = ONNX_OPSET;
}

void onnx_model_free(OnnxModel *om) {
  for (int i = 0; i < om->num_nodes; i++) free(om->nodes[i]);
  for (int i = 0; i < om->num_initializers; i++) {
    free(om->initializers[i]->owned);
    free(om->initializers[i]);
  }
  for (int i = 0; i < om->num_metadata; i++) free(om->metadata[i].value);
  free(om->nodes);
  free(om->initializers);
  free(om->metadata);
  free(om->file);
  memset(om, 0, sizeof *om);
}

static void copy_name(char *dst, size_t size, const char *src) {
  snprintf(dst, size, "%s", src);
}

OnnxNode *onnx_add_node(OnnxModel *om, const char *op_type, const char *name) {
  if (om->num_nodes == om->cap_nodes) {
    om->cap_nodes = om->cap_nodes ? 2 * om->cap_nodes : 64;
    OnnxNode **grown = malloc_check(sizeof *grown * (size_t)om->cap_nodes);
    if (om->num_nodes) memcpy(grown, om->nodes, sizeof *grown * (size_t)om->num_nodes);
    free(om->nodes);
    om->nodes = grown;
  }
  OnnxNode *n = calloc_check(1, sizeof *n);
  copy_name(n->op_type, sizeof n->op_type, op_type);
  copy_name(n->name, sizeof n->name, name);
  om->nodes[om->num_nodes++] = n;
  return n;
}

// The builders below are called with fixed small counts (by src/io/onnx_swin.c and the tests);
// running past a limit is a programming error, reported loudly rather than truncated silently.
static void check_limit(int count, int limit, const char *what, const char *node) {
  if (count >= limit) {
    fprintf(stderr, "onnx: node '%s' has more than %d %s (onnx.h limit)\n", node, limit, what);
    abort();
  }
}

void onnx_node_input(OnnxNode *n, const char *value) {
  check_limit(n->num_inputs, ONNX_MAX_IO, "inputs", n->name);
  copy_name(n->inputs[n->num_inputs++], ONNX_NAME_MAX, value);
}

void onnx_node_output(OnnxNode *n, const char *value) {
  check_limit(n->num_outputs, ONNX_MAX_IO, "outputs", n->name);
  copy_name(n->outputs[n->num_outputs++], ONNX_NAME_MAX, value);
}

static OnnxAttr *new_attr(OnnxNode *n, const char *name, int type) {
  check_limit(n->num_attrs, ONNX_MAX_ATTRS, "attributes", n->name);
  OnnxAttr *a = &n->attrs[n->num_attrs++];
  memset(a, 0, sizeof *a);
  copy_name(a->name, sizeof a->name, name);
  a->type = type;
  return a;
}

void onnx_attr_int(OnnxNode *n, const char *name, int64_t v) {
  new_attr(n, name, ONNX_ATTR_INT)->i = v;
}

void onnx_attr_float(OnnxNode *n, const char *name, float v) {
  new_attr(n, name, ONNX_ATTR_FLOAT)->f = v;
}

void onnx_attr_ints(OnnxNode *n, const char *name, int count, const int64_t *v) {
  check_limit(count - 1, ONNX_MAX_INTS, "values in one attribute", n->name);
  OnnxAttr *a = new_attr(n, name, ONNX_ATTR_INTS);
  a->num_ints = count;
  memcpy(a->ints, v, sizeof *v * (size_t)count);
}

static size_t element_size(int data_type) {
  return data_type == ONNX_INT64 ? 8 : data_type == ONNX_FLOAT16 ? 2 : 4;
}

OnnxTensor *onnx_add_initializer(OnnxModel *om, const char *name, int data_type, int ndim,
                                 const int64_t *dims, const void *data, void *owned) {
  if (om->num_initializers == om->cap_initializers) {
    om->cap_initializers = om->cap_initializers ? 2 * om->cap_initializers : 64;
    OnnxTensor **grown = malloc_check(sizeof *grown * (size_t)om->cap_initializers);
    if (om->num_initializers)
      memcpy(grown, om->initializers, sizeof *grown * (size_t)om->num_initializers);
    free(om->initializers);
    om->initializers = grown;
  }
  check_limit(ndim - 1, ONNX_MAX_DIMS, "dimensions", name);
  OnnxTensor *t = calloc_check(1, sizeof *t);
  copy_name(t->name, sizeof t->name, name);
  t->data_type = data_type;
  t->ndim = ndim;
  for (int d = 0; d < ndim; d++) t->dims[d] = dims[d];
  t->data = data;
  t->owned = owned;
  t->bytes = onnx_tensor_numel(t) * (int64_t)element_size(data_type);
  om->initializers[om->num_initializers++] = t;
  return t;
}

void onnx_add_metadata(OnnxModel *om, const char *key, const char *value) {
  OnnxMetadata *grown = malloc_check(sizeof *grown * (size_t)(om->num_metadata + 1));
  if (om->num_metadata) memcpy(grown, om->metadata, sizeof *grown * (size_t)om->num_metadata);
  free(om->metadata);
  om->metadata = grown;
  OnnxMetadata *e = &om->metadata[om->num_metadata++];
  copy_name(e->key, sizeof e->key, key);
  size_t n = strlen(value);
  e->value = malloc_check(n + 1);
  memcpy(e->value, value, n + 1);
}

const OnnxNode *onnx_find_node(const OnnxModel *om, const char *name) {
  for (int i = 0; i < om->num_nodes; i++)
    if (strcmp(om->nodes[i]->name, name) == 0) return om->nodes[i];
  return NULL;
}

const OnnxTensor *onnx_find_initializer(const OnnxModel *om, const char *name) {
  for (int i = 0; i < om->num_initializers; i++)
    if (strcmp(om->initializers[i]->name, name) == 0) return om->initializers[i];
  return NULL;
}

const OnnxAttr *onnx_node_attr(const OnnxNode *n, const char *name) {
  for (int i = 0; i < n->num_attrs; i++)
    if (strcmp(n->attrs[i].name, name) == 0) return &n->attrs[i];
  return NULL;
}

int64_t onnx_tensor_numel(const OnnxTensor *t) {
  int64_t n = 1;
  for (int d = 0; d < t->ndim; d++) n *= t->dims[d];
  return n;
}

const char *onnx_metadata_get(const OnnxModel *om, const char *key) {
  for (int i = 0; i < om->num_metadata; i++)
    if (strcmp(om->metadata[i].key, key) == 0) return om->metadata[i].value;
  return NULL;
}

// ---------------------------------------------------------------------------------------------
// Protobuf writer. A length-delimited field needs its length before its bytes, so every
// message is encoded by a function that runs twice: once into a counting sink (f == NULL) for
// the length, then into the file. Nesting is shallow and only small messages are encoded more
// than twice; tensor data is never copied, only counted.

enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_LEN = 2, WIRE_FIXED32 = 5 };

typedef struct {
  FILE *f;         // NULL: count only
  uint64_t bytes;  // written (or counted) so far
  int failed;      // a write failed; errno_at_fail says why
  int errno_at_fail;
} PbOut;

static void pb_raw(PbOut *o, const void *data, uint64_t n) {
  o->bytes += n;
  if (!o->f || o->failed) return;
  const unsigned char *p = data;
  while (n > 0) {  // fwrite takes size_t; write huge tensors in pieces
    size_t piece = n < ((uint64_t)1 << 30) ? (size_t)n : (size_t)1 << 30;
    if (fwrite(p, 1, piece, o->f) != piece) {
      o->failed = 1;
      o->errno_at_fail = errno;
      return;
    }
    p += piece;
    n -= piece;
  }
}

static void pb_varint(PbOut *o, uint64_t v) {
  unsigned char buf[10];
  int n = 0;
  do {
    buf[n] = (unsigned char)(v & 0x7f);
    v >>= 7;
    if (v) buf[n] |= 0x80;
    n++;
  } while (v);
  pb_raw(o, buf, (uint64_t)n);
}

static void pb_tag(PbOut *o, int field, int wire) {
  pb_varint(o, ((uint64_t)field << 3) | (uint64_t)wire);
}

// int64 and int32 fields: negative values as their 64-bit two's complement (10 bytes).
static void pb_int(PbOut *o, int field, int64_t v) {
  pb_tag(o, field, WIRE_VARINT);
  pb_varint(o, (uint64_t)v);
}

static void pb_float(PbOut *o, int field, float v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  unsigned char b[4] = {(unsigned char)u, (unsigned char)(u >> 8), (unsigned char)(u >> 16),
                        (unsigned char)(u >> 24)};
  pb_tag(o, field, WIRE_FIXED32);
  pb_raw(o, b, 4);
}

static void pb_bytes(PbOut *o, int field, const void *data, uint64_t n) {
  pb_tag(o, field, WIRE_LEN);
  pb_varint(o, n);
  pb_raw(o, data, n);
}

static void pb_string(PbOut *o, int field, const char *s) {
  pb_bytes(o, field, s, strlen(s));
}

typedef void (*PbEncodeFn)(PbOut *o, const void *msg);

static void pb_message(PbOut *o, int field, PbEncodeFn encode, const void *msg) {
  PbOut count = {0};
  encode(&count, msg);
  pb_tag(o, field, WIRE_LEN);
  pb_varint(o, count.bytes);
  encode(o, msg);
}

// ---------------------------------------------------------------------------------------------
// ONNX messages, fields in number order

static void encode_attribute(PbOut *o, const void *msg) {
  const OnnxAttr *a = msg;
  pb_string(o, 1, a->name);  // name
  if (a->type == ONNX_ATTR_FLOAT) pb_float(o, 2, a->f);
  if (a->type == ONNX_ATTR_INT) pb_int(o, 3, a->i);
  if (a->type == ONNX_ATTR_INTS)
    for (int i = 0; i < a->num_ints; i++) pb_int(o, 8, a->ints[i]);
  pb_int(o, 20, a->type);  // type
}

static void encode_node(PbOut *o, const void *msg) {
  const OnnxNode *n = msg;
  for (int i = 0; i < n->num_inputs; i++) pb_string(o, 1, n->inputs[i]);
  for (int i = 0; i < n->num_outputs; i++) pb_string(o, 2, n->outputs[i]);
  pb_string(o, 3, n->name);
  pb_string(o, 4, n->op_type);
  for (int i = 0; i < n->num_attrs; i++) pb_message(o, 5, encode_attribute, &n->attrs[i]);
}

static void encode_tensor(PbOut *o, const void *msg) {
  const OnnxTensor *t = msg;
  for (int d = 0; d < t->ndim; d++) pb_int(o, 1, t->dims[d]);  // dims
  pb_int(o, 2, t->data_type);
  pb_string(o, 8, t->name);
  pb_bytes(o, 9, t->data, (uint64_t)t->bytes);  // raw_data
}

typedef struct {
  const OnnxValueInfo *v;
  int d;
} DimRef;

static void encode_dim(PbOut *o, const void *msg) {
  const DimRef *r = msg;
  if (r->v->dims[r->d] >= 0)
    pb_int(o, 1, r->v->dims[r->d]);  // dim_value
  else
    pb_string(o, 2, r->v->dim_params[r->d]);  // dim_param
}

static void encode_shape(PbOut *o, const void *msg) {
  const OnnxValueInfo *v = msg;
  for (int d = 0; d < v->ndim; d++) {
    DimRef r = {v, d};
    pb_message(o, 1, encode_dim, &r);
  }
}

static void encode_tensor_type(PbOut *o, const void *msg) {
  const OnnxValueInfo *v = msg;
  pb_int(o, 1, v->elem_type);
  pb_message(o, 2, encode_shape, v);
}

static void encode_type(PbOut *o, const void *msg) {
  pb_message(o, 1, encode_tensor_type, msg);  // TypeProto.tensor_type
}

static void encode_value_info(PbOut *o, const void *msg) {
  const OnnxValueInfo *v = msg;
  pb_string(o, 1, v->name);
  pb_message(o, 2, encode_type, v);
}

static void encode_graph(PbOut *o, const void *msg) {
  const OnnxModel *om = msg;
  for (int i = 0; i < om->num_nodes; i++) pb_message(o, 1, encode_node, om->nodes[i]);
  pb_string(o, 2, om->graph_name);
  for (int i = 0; i < om->num_initializers; i++)
    pb_message(o, 5, encode_tensor, om->initializers[i]);
  for (int i = 0; i < om->num_inputs; i++) pb_message(o, 11, encode_value_info, &om->inputs[i]);
  for (int i = 0; i < om->num_outputs; i++) pb_message(o, 12, encode_value_info, &om->outputs[i]);
}

static void encode_opset(PbOut *o, const void *msg) {
  const OnnxModel *om = msg;
  pb_string(o, 1, "");  // domain: the default one
  pb_int(o, 2, om->opset);
}

static void encode_metadata(PbOut *o, const void *msg) {
  const OnnxMetadata *e = msg;
  pb_string(o, 1, e->key);
  pb_string(o, 2, e->value);
}

static void encode_model(PbOut *o, const void *msg) {
  const OnnxModel *om = msg;
  pb_int(o, 1, om->ir_version);
  if (om->producer_name[0]) pb_string(o, 2, om->producer_name);
  if (om->producer_version[0]) pb_string(o, 3, om->producer_version);
  pb_message(o, 7, encode_graph, om);
  pb_message(o, 8, encode_opset, om);
  for (int i = 0; i < om->num_metadata; i++) pb_message(o, 14, encode_metadata, &om->metadata[i]);
}

uint64_t onnx_model_size(const OnnxModel *om) {
  PbOut count = {0};
  encode_model(&count, om);
  return count.bytes;
}

// Streams the encoding into f (write_file_atomic's writer): -1 with errno if a write failed.
static int write_model(FILE *f, const void *om) {
  PbOut o = {.f = f};
  encode_model(&o, om);
  if (!o.failed) return 0;
  errno = o.errno_at_fail;
  return -1;
}

int onnx_model_save(const OnnxModel *om, const char *path, Error *err) {
  // Protobuf parsers refuse messages of 2 GiB or more (ONNX moves such weights to external
  // files, which this writer does not do).
  uint64_t size = onnx_model_size(om);
  if (size >= ((uint64_t)1 << 31))
    return error_set(err,
                     "cannot save '%s': the model is %.2f GiB, over protobuf's 2 GiB limit for "
                     "one ONNX file\nHINT: export with dtype=f16 (half the bytes)",
                     path, (double)size / (1 << 30));
  return write_file_atomic(path, write_model, om, err);
}

// ---------------------------------------------------------------------------------------------
// Protobuf reader: walks the fields of one message in a byte range.

typedef struct {
  const unsigned char *p, *end;
} PbIn;

typedef struct {
  int number, wire;
  uint64_t varint;  // WIRE_VARINT
  uint32_t fixed32;
  PbIn bytes;  // WIRE_LEN: the field's payload
} PbField;

static int pb_read_varint(PbIn *in, uint64_t *v) {
  *v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (in->p >= in->end) return -1;
    unsigned char b = *in->p++;
    *v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) return 0;
  }
  return -1;  // more than 10 bytes
}

// Next field of the message; 1 = got one, 0 = end of message, -1 = malformed.
static int pb_next(PbIn *in, PbField *f) {
  memset(f, 0, sizeof *f);
  if (in->p >= in->end) return 0;
  uint64_t key;
  if (pb_read_varint(in, &key) != 0 || (key >> 3) == 0 || (key >> 3) > 0x1fffffff) return -1;
  f->number = (int)(key >> 3);
  f->wire = (int)(key & 7);
  switch (f->wire) {
    case WIRE_VARINT:
      return pb_read_varint(in, &f->varint) == 0 ? 1 : -1;
    case WIRE_FIXED64:
      if (in->end - in->p < 8) return -1;
      in->p += 8;
      return 1;
    case WIRE_FIXED32:
      if (in->end - in->p < 4) return -1;
      f->fixed32 = (uint32_t)in->p[0] | (uint32_t)in->p[1] << 8 | (uint32_t)in->p[2] << 16 |
                   (uint32_t)in->p[3] << 24;
      in->p += 4;
      return 1;
    case WIRE_LEN: {
      uint64_t n;
      if (pb_read_varint(in, &n) != 0 || n > (uint64_t)(in->end - in->p)) return -1;
      f->bytes.p = in->p;
      f->bytes.end = in->p + n;
      in->p += n;
      return 1;
    }
    default:
      return -1;  // groups (wire types 3, 4) are not used by ONNX
  }
}

// Decoding context: the origin names the file in errors; msg is the message being read.
typedef struct {
  const char *origin;
  Error *err;
} PbCtx;

static int bad(PbCtx *c, const char *what) {
  return error_set(c->err,
                   "'%s' is not a valid ONNX file: %s\nHINT: the file is truncated or not "
                   "ONNX; write it again",
                   c->origin, what);
}

static int read_string(PbCtx *c, const PbField *f, char *dst, size_t size, const char *what) {
  size_t n = (size_t)(f->bytes.end - f->bytes.p);
  if (f->wire != WIRE_LEN) return bad(c, what);
  if (n >= size)
    return error_set(c->err, "'%s': %s of %zu bytes is longer than swin.c reads (%zu)", c->origin,
                     what, n, size - 1);
  memcpy(dst, f->bytes.p, n);
  dst[n] = 0;
  return 0;
}

// A repeated int64 field, packed (one WIRE_LEN) or not (one varint per value).
static int read_ints(PbCtx *c, const PbField *f, int64_t *values, int *count, int cap,
                     const char *what) {
  if (f->wire == WIRE_VARINT) {
    if (*count >= cap) return bad(c, what);
    values[(*count)++] = (int64_t)f->varint;
    return 0;
  }
  if (f->wire != WIRE_LEN) return bad(c, what);
  PbIn in = f->bytes;
  while (in.p < in.end) {
    uint64_t v;
    if (pb_read_varint(&in, &v) != 0 || *count >= cap) return bad(c, what);
    values[(*count)++] = (int64_t)v;
  }
  return 0;
}

static int need_wire(PbCtx *c, const PbField *f, int wire, const char *what) {
  return f->wire == wire ? 0 : bad(c, what);
}

static int decode_attribute(PbCtx *c, PbIn in, OnnxAttr *a) {
  memset(a, 0, sizeof *a);
  PbField f;
  int r;
  while ((r = pb_next(&in, &f)) == 1) {
    if (f.number == 1) {
      if (read_string(c, &f, a->name, sizeof a->name, "attribute name") != 0) return -1;
    } else if (f.number == 2) {
      if (need_wire(c, &f, WIRE_FIXED32, "attribute f") != 0) return -1;
      memcpy(&a->f, &f.fixed32, 4);
    } else if (f.number == 3) {
      if (need_wire(c, &f, WIRE_VARINT, "attribute i") != 0) return -1;
      a->i = (int64_t)f.varint;
    } else if (f.number == 8) {
      if (read_ints(c, &f, a->ints, &a->num_ints, ONNX_MAX_INTS, "attribute ints") != 0) return -1;
    } else if (f.number == 20) {
      if (need_wire(c, &f, WIRE_VARINT, "attribute type") != 0) return -1;
      a->type = (int)f.varint;
    }
  }
  return r == 0 ? 0 : bad(c, "malformed AttributeProto");
}

static int decode_node(PbCtx *c, PbIn in, OnnxNode *n) {
  PbField f;
  int r;
  while ((r = pb_next(&in, &f)) == 1) {
    if (f.number == 1 || f.number == 2) {
      bool input = f.number == 1;
      int *count = input ? &n->num_inputs : &n->num_outputs;
      if (*count >= ONNX_MAX_IO) return bad(c, "a node with too many inputs or outputs");
      char *dst = input ? n->inputs[*count] : n->outputs[*count];
      if (read_string(c, &f, dst, ONNX_NAME_MAX, "node input/output name") != 0) return -1;
      (*count)++;
    } else if (f.number == 3) {
      if (read_string(c, &f, n->name, sizeof n->name, "node name") != 0) return -1;
    } else if (f.number == 4) {
      if (read_string(c, &f, n->op_type, sizeof n->op_type, "node op_type") != 0) return -1;
    } else if (f.number == 5) {
      if (need_wire(c, &f, WIRE_LEN, "node attribute") != 0) return -1;
      if (n->num_attrs >= ONNX_MAX_ATTRS) return bad(c, "a node with too many attributes");
      if (decode_attribute(c, f.bytes, &n->attrs[n->num_attrs++]) != 0) return -1;
    }
  }
  return r == 0 ? 0 : bad(c, "malformed NodeProto");
}

static int decode_tensor(PbCtx *c, PbIn in, OnnxTensor *t) {
  PbField f;
  int r;
  bool has_raw = false;
  while ((r = pb_next(&in, &f)) == 1) {
    if (f.number == 1) {
      if (read_ints(c, &f, t->dims, &t->ndim, ONNX_MAX_DIMS, "tensor dims") != 0) return -1;
    } else if (f.number == 2) {
      if (need_wire(c, &f, WIRE_VARINT, "tensor data_type") != 0) return -1;
      t->data_type = (int)f.varint;
    } else if (f.number == 8) {
      if (read_string(c, &f, t->name, sizeof t->name, "tensor name") != 0) return -1;
    } else if (f.number == 9) {
      if (need_wire(c, &f, WIRE_LEN, "tensor raw_data") != 0) return -1;
      t->data = f.bytes.p;
      t->bytes = f.bytes.end - f.bytes.p;
      has_raw = true;
    }
  }
  if (r != 0) return bad(c, "malformed TensorProto");
  if (!has_raw)
    return error_set(c->err, "'%s': initializer '%s' has no raw_data (swin.c reads only those)",
                     c->origin, t->name);
  if (t->data_type != ONNX_FLOAT && t->data_type != ONNX_FLOAT16 && t->data_type != ONNX_INT64)
    return error_set(c->err, "'%s': initializer '%s' has data_type %d (swin.c reads 1, 7, 10)",
                     c->origin, t->name, t->data_type);
  for (int d = 0; d < t->ndim; d++)
    if (t->dims[d] < 0) return bad(c, "a negative tensor dimension");
  if (onnx_tensor_numel(t) * (int64_t)element_size(t->data_type) != t->bytes)
    return error_set(c->err,
                     "'%s': initializer '%s' has %lld bytes of raw_data, its shape needs %lld",
                     c->origin, t->name, (long long)t->bytes,
                     (long long)(onnx_tensor_numel(t) * (int64_t)element_size(t->data_type)));
  return 0;
}

static int decode_dim(PbCtx *c, PbIn in, OnnxValueInfo *v) {
  if (v->ndim >= ONNX_MAX_DIMS) return bad(c, "a value with too many dimensions");
  int d = v->ndim++;
  v->dims[d] = -1;
  PbField f;
  int r;
  while ((r = pb_next(&in, &f)) == 1) {
    if (f.number == 1) {
      if (need_wire(c, &f, WIRE_VARINT, "dim_value") != 0) return -1;
      v->dims[d] = (int64_t)f.varint;
    } else if (f.number == 2) {
      if (read_string(c, &f, v->dim_params[d], sizeof v->dim_params[d], "dim_param") != 0)
        return -1;
    }
  }
  return r == 0 ? 0 : bad(c, "malformed TensorShapeProto.Dimension");
}

// TypeProto -> tensor_type -> {elem_type, shape -> dim*}: depth tells which message in is.
static int decode_type(PbCtx *c, PbIn in, OnnxValueInfo *v, int depth) {
  PbField f;
  int r;
  while ((r = pb_next(&in, &f)) == 1) {
    if (depth == 0 && f.number == 1) {  // TypeProto.tensor_type
      if (need_wire(c, &f, WIRE_LEN, "tensor_type") != 0) return -1;
      if (decode_type(c, f.bytes, v, 1) != 0) return -1;
    } else if (depth == 1 && f.number == 1) {  // elem_type
      if (need_wire(c, &f, WIRE_VARINT, "elem_type") != 0) return -1;
      v->elem_type = (int)f.varint;
    } else if (depth == 1 && f.number == 2) {  // shape
      if (need_wire(c, &f, WIRE_LEN, "shape") != 0) return -1;
      if (decode_type(c, f.bytes, v, 2) != 0) return -1;
    } else if (depth == 2 && f.number == 1) {  // dim
      if (need_wire(c, &f, WIRE_LEN, "dim") != 0) return -1;
      if (decode_dim(c, f.bytes, v) != 0) return -1;
    }
  }
  return r == 0 ? 0 : bad(c, "malformed TypeProto");
}

static int decode_value_info(PbCtx *c, PbIn in, OnnxValueInfo *v) {
  memset(v, 0, sizeof *v);
  PbField f;
  int r;
  while ((r = pb_next(&in, &f)) == 1) {
    if (f.number == 1) {
      if (read_string(c, &f, v->name, sizeof v->name, "value name") != 0) return -1;
    } else if (f.number == 2) {
      if (need_wire(c, &f, WIRE_LEN, "value type") != 0) return -1;
      if (decode_type(c, f.bytes, v, 0) != 0) return -1;
    }
  }
  return r == 0 ? 0 : bad(c, "malformed ValueInfoProto");
}

static int decode_graph(PbCtx *c, PbIn in, OnnxModel *om) {
  PbField f;
  int r;
  while ((r = pb_next(&in, &f)) == 1) {
    if (f.number == 1) {
      if (need_wire(c, &f, WIRE_LEN, "graph node") != 0) return -1;
      if (decode_node(c, f.bytes, onnx_add_node(om, "", "")) != 0) return -1;
    } else if (f.number == 2) {
      if (read_string(c, &f, om->graph_name, sizeof om->graph_name, "graph name") != 0) return -1;
    } else if (f.number == 5) {
      if (need_wire(c, &f, WIRE_LEN, "graph initializer") != 0) return -1;
      OnnxTensor *t = onnx_add_initializer(om, "", 0, 0, NULL, NULL, NULL);
      if (decode_tensor(c, f.bytes, t) != 0) return -1;
    } else if (f.number == 11 || f.number == 12) {
      bool input = f.number == 11;
      int *count = input ? &om->num_inputs : &om->num_outputs;
      if (need_wire(c, &f, WIRE_LEN, "graph input/output") != 0) return -1;
      if (*count >= ONNX_MAX_GRAPH_IO)
        return bad(c, "more graph inputs or outputs than swin.c reads");
      OnnxValueInfo *v = input ? &om->inputs[*count] : &om->outputs[*count];
      if (decode_value_info(c, f.bytes, v) != 0) return -1;
      (*count)++;
    }
  }
  return r == 0 ? 0 : bad(c, "malformed GraphProto");
}

static int decode_opset(PbCtx *c, PbIn in, OnnxModel *om) {
  char domain[64] = "";
  int64_t version = 0;
  PbField f;
  int r;
  while ((r = pb_next(&in, &f)) == 1) {
    if (f.number == 1) {
      if (read_string(c, &f, domain, sizeof domain, "opset domain") != 0) return -1;
    } else if (f.number == 2) {
      if (need_wire(c, &f, WIRE_VARINT, "opset version") != 0) return -1;
      version = (int64_t)f.varint;
    }
  }
  if (r != 0) return bad(c, "malformed OperatorSetIdProto");
  if (domain[0] == 0 || strcmp(domain, "ai.onnx") == 0) om->opset = version;
  return 0;
}

static int decode_metadata(PbCtx *c, PbIn in, OnnxModel *om) {
  char key[64] = "";
  PbIn value = {0};
  PbField f;
  int r;
  while ((r = pb_next(&in, &f)) == 1) {
    if (f.number == 1) {
      if (read_string(c, &f, key, sizeof key, "metadata key") != 0) return -1;
    } else if (f.number == 2) {
      if (need_wire(c, &f, WIRE_LEN, "metadata value") != 0) return -1;
      value = f.bytes;
    }
  }
  if (r != 0) return bad(c, "malformed StringStringEntryProto");
  size_t n = (size_t)(value.end - value.p);
  char *text = malloc_check(n + 1);
  if (n) memcpy(text, value.p, n);
  text[n] = 0;
  onnx_add_metadata(om, key, text);
  free(text);
  return 0;
}

static int decode_model(PbCtx *c, PbIn in, OnnxModel *om) {
  PbField f;
  int r;
  bool has_graph = false;
  while ((r = pb_next(&in, &f)) == 1) {
    if (f.number == 1) {
      if (need_wire(c, &f, WIRE_VARINT, "ir_version") != 0) return -1;
      om->ir_version = (int64_t)f.varint;
    } else if (f.number == 2) {
      if (read_string(c, &f, om->producer_name, sizeof om->producer_name, "producer_name") != 0)
        return -1;
    } else if (f.number == 3) {
      if (read_string(c, &f, om->producer_version, sizeof om->producer_version,
                      "producer_version") != 0)
        return -1;
    } else if (f.number == 7) {
      if (need_wire(c, &f, WIRE_LEN, "graph") != 0) return -1;
      if (decode_graph(c, f.bytes, om) != 0) return -1;
      has_graph = true;
    } else if (f.number == 8) {
      if (need_wire(c, &f, WIRE_LEN, "opset_import") != 0) return -1;
      if (decode_opset(c, f.bytes, om) != 0) return -1;
    } else if (f.number == 14) {
      if (need_wire(c, &f, WIRE_LEN, "metadata_props") != 0) return -1;
      if (decode_metadata(c, f.bytes, om) != 0) return -1;
    }
  }
  if (r != 0) return bad(c, "malformed ModelProto");
  if (!has_graph) return bad(c, "no graph");
  return 0;
}

// Takes ownership of bytes (freed with the model, or here on failure).
static int parse_owned(OnnxModel *om, unsigned char *bytes, size_t size, const char *origin,
                       Error *err) {
  onnx_model_init(om);
  om->ir_version = 0;
  om->opset = 0;
  om->file = bytes;
  PbCtx c = {origin, err};
  PbIn in = {bytes, bytes + size};
  if (decode_model(&c, in, om) != 0) {
    onnx_model_free(om);
    return -1;
  }
  return 0;
}

int onnx_model_parse(OnnxModel *om, const unsigned char *bytes, size_t size, const char *origin,
                     Error *err) {
  unsigned char *copy = malloc_check(size);
  if (size) memcpy(copy, bytes, size);
  return parse_owned(om, copy, size, origin, err);
}

int onnx_model_load(OnnxModel *om, const char *path, Error *err) {
  size_t size;
  unsigned char *bytes = read_file(path, &size, err);
  if (!bytes) {
    onnx_model_init(om);
    return -1;
  }
  return parse_owned(om, bytes, size, path, err);
}
