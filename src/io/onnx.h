// onnx.h: ONNX models written by swin.c itself (no libprotobuf), read back for checks, and the
// inference graph of a Swin Transformer.
//
// An ONNX file is one protobuf ModelProto. swin.c needs only a few of its messages (ModelProto,
// GraphProto, NodeProto, AttributeProto, TensorProto, ValueInfoProto and the type/shape
// messages); OnnxModel holds exactly those fields, onnx_model_save writes them in field-number
// order (the order Python's protobuf writes, so the same model gives the same bytes) and
// onnx_model_load reads them back, skipping any field it does not know. Tensors are stored as
// raw little-endian bytes (TensorProto.raw_data).
//
// The Swin graph (onnx_build_swin), opset 17 (the first with LayerNormalization), IR version 8:
//   images (N, Cin, H, W) float32, normalized  ->  logits (N, classes) float32
//   patch_embed.proj  Conv p x p, stride p, then tokens as rows (N*Hp*Wp, E); patch_embed.norm
//   per stage: layers.s.downsample (Reshape/Transpose 2x2 gather, LayerNorm, Gemm) for s > 0;
//   per block, with tokens x (N*H*W, C) as rows:
//     norm1 -> [shift: Slice/Concat roll by (-sh, -sw)] -> window partition (Reshape/Transpose)
//     -> attn.qkv Gemm -> q, k, v (Reshape/Transpose/Gather) -> q * hd^-0.5 -> MatMul q k^T
//     -> Add attn.relative_position_bias (heads, N, N), or for shifted blocks Add
//        attn.relative_position_bias_masked (nW, heads, N, N) = bias + shift mask
//     -> Softmax -> MatMul v -> attn.proj Gemm -> window reverse [+ roll back] -> residual Add
//     -> norm2 -> mlp.fc1 Gemm -> exact GELU x * (erf(x / sqrt 2) + 1) * 0.5 (the pattern ONNX
//        Runtime and TensorRT fuse into one GELU) -> mlp.fc2 Gemm -> residual Add
//   norm -> head.global_pool ReduceMean over tokens -> head.fc Gemm -> logits
// Swin V2 (model.version = 2) blocks: [roll] -> window partition of x itself -> attn.qkv Gemm
// (bias attn.qkv_bias = q_bias, 0, v_bias) -> q, k -> attn.{q,k}_normalized (ReduceL2, Max eps,
// Div) -> q * attn.logit_scale_clamped_exp (heads, 1, 1) -> MatMul q k^T -> Add the bias as
// above, from the table 16 sigmoid(cpb_mlp(coords)) -> Softmax -> MatMul v -> attn.proj ->
// window reverse [+ roll back] -> norm1 -> residual Add -> mlp.fc1, GELU, mlp.fc2 -> norm2 ->
// residual Add; layers.s.downsample gathers, reduces, then normalizes. What depends on the
// weights alone (the qkv bias, the clamped logit scales, the position-bias MLP) is computed at
// export: attn.q_bias, v_bias, logit_scale and cpb_mlp.* are not initializers.
// Nodes are named after the timm module they compute (patch_embed.proj, layers.0.blocks.1.attn.
// qkv, head.fc, ...) and each node's output value has the node's name (the last one is
// "logits"). Initializers are the timm parameters under their timm names and shapes (bit for bit
// in f32), except each relative_position_bias_table, which is replaced by the block's bias
// gathered through the relative position index (plus the mask in shifted blocks); shape and
// scalar constants are initializers named after their values ("i64[-1,8,8,48]", "f.sqrt2").
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "src/base/tensor.h"
#include "src/base/util.h"
#include "src/model/model.h"

#define ONNX_IR_VERSION 8  // ONNX 1.12, the IR version of opset 17; read by ORT and TensorRT 10
#define ONNX_OPSET 17
#define ONNX_NAME_MAX 128
#define ONNX_MAX_DIMS 8
#define ONNX_MAX_IO 4     // inputs or outputs of one node
#define ONNX_MAX_ATTRS 4  // attributes of one node
#define ONNX_MAX_INTS 8   // values of one INTS attribute
#define ONNX_MAX_GRAPH_IO 4

// TensorProto.DataType values used here.
enum { ONNX_FLOAT = 1, ONNX_INT64 = 7, ONNX_FLOAT16 = 10 };
// AttributeProto.AttributeType values used here.
enum { ONNX_ATTR_FLOAT = 1, ONNX_ATTR_INT = 2, ONNX_ATTR_INTS = 7 };

typedef struct {
  char name[32];
  int type;  // ONNX_ATTR_*
  float f;
  int64_t i;
  int num_ints;
  int64_t ints[ONNX_MAX_INTS];
} OnnxAttr;

typedef struct {
  char name[ONNX_NAME_MAX];
  char op_type[32];
  int num_inputs, num_outputs;
  char inputs[ONNX_MAX_IO][ONNX_NAME_MAX];  // "" = an omitted optional input
  char outputs[ONNX_MAX_IO][ONNX_NAME_MAX];
  int num_attrs;
  OnnxAttr attrs[ONNX_MAX_ATTRS];
} OnnxNode;

typedef struct {
  char name[ONNX_NAME_MAX];
  int data_type;  // ONNX_FLOAT, ONNX_FLOAT16, ONNX_INT64
  int ndim;       // 0 = a scalar
  int64_t dims[ONNX_MAX_DIMS];
  const void *data;  // raw little-endian bytes
  int64_t bytes;
  void *owned;  // freed with the model; NULL when data lives elsewhere (the model's weights)
} OnnxTensor;

// A graph input or output: element type and shape; a dimension with dims[d] < 0 is symbolic,
// named dim_params[d].
typedef struct {
  char name[ONNX_NAME_MAX];
  int elem_type;
  int ndim;
  int64_t dims[ONNX_MAX_DIMS];
  char dim_params[ONNX_MAX_DIMS][32];
} OnnxValueInfo;

typedef struct {
  char key[64];
  char *value;  // owned
} OnnxMetadata;

typedef struct {
  int64_t ir_version;
  int64_t opset;  // of the default ("") domain
  char producer_name[32], producer_version[32];
  char graph_name[64];
  OnnxNode **nodes;  // each allocated on its own, so pointers to a node stay valid
  int num_nodes, cap_nodes;
  OnnxTensor **initializers;
  int num_initializers, cap_initializers;
  OnnxValueInfo inputs[ONNX_MAX_GRAPH_IO], outputs[ONNX_MAX_GRAPH_IO];
  int num_inputs, num_outputs;
  OnnxMetadata *metadata;
  int num_metadata;
  unsigned char *file;  // onnx_model_load: the file the initializers' data point into
} OnnxModel;

void onnx_model_init(OnnxModel *om);
void onnx_model_free(OnnxModel *om);

// Building: names are copied. onnx_add_node returns the node (add inputs with onnx_node_input,
// attributes with onnx_attr_*). onnx_add_initializer takes data by pointer (owned: freed with
// the model).
OnnxNode *onnx_add_node(OnnxModel *om, const char *op_type, const char *name);
void onnx_node_input(OnnxNode *n, const char *value);
void onnx_node_output(OnnxNode *n, const char *value);
void onnx_attr_int(OnnxNode *n, const char *name, int64_t v);
void onnx_attr_float(OnnxNode *n, const char *name, float v);
void onnx_attr_ints(OnnxNode *n, const char *name, int count, const int64_t *v);
OnnxTensor *onnx_add_initializer(OnnxModel *om, const char *name, int data_type, int ndim,
                                 const int64_t *dims, const void *data, void *owned);
void onnx_add_metadata(OnnxModel *om, const char *key, const char *value);

const OnnxNode *onnx_find_node(const OnnxModel *om, const char *name);
const OnnxTensor *onnx_find_initializer(const OnnxModel *om, const char *name);
const OnnxAttr *onnx_node_attr(const OnnxNode *n, const char *name);  // NULL if absent
int64_t onnx_tensor_numel(const OnnxTensor *t);
const char *onnx_metadata_get(const OnnxModel *om, const char *key);  // NULL if absent

// Serialized size in bytes (what onnx_model_save writes).
uint64_t onnx_model_size(const OnnxModel *om);
// Writes the model to path atomically (write_file_atomic in src/base/util.h: PATH.tmp, fsync,
// rename over PATH). Refuses a model over protobuf's 2 GiB message limit.
int onnx_model_save(const OnnxModel *om, const char *path, Error *err);
// Reads a model written by any ONNX writer, keeping the fields OnnxModel has. Refuses a file
// that is not a well-formed protobuf of these messages (truncated, lengths past the end, wrong
// wire types, names or lists too long for OnnxModel), naming the file and the message.
int onnx_model_load(OnnxModel *om, const char *path, Error *err);
int onnx_model_parse(OnnxModel *om, const unsigned char *bytes, size_t size, const char *origin,
                     Error *err);

// The Swin inference graph of m's weights (see the top of this file). dtype DTYPE_F32 or
// DTYPE_F16 (weights and arithmetic in f16; images and logits stay float32 through Cast nodes at
// both ends). batch 0 = a dynamic batch dimension named "batch", else that fixed batch size.
// In f32 the parameter initializers point into m->weights: keep m alive until om is freed.
int onnx_build_swin(OnnxModel *om, const Model *m, DType dtype, int64_t batch, Error *err);
// Builds and saves in one step.
int onnx_export_swin(const Model *m, const char *path, DType dtype, int64_t batch, Error *err);
