// test_onnx_eval.h: a small reference interpreter for the ONNX operators swin.c's graphs use, so
// that CI checks what an exported graph computes without ONNX Runtime or Python.
//
// It follows the ONNX operator specification (opset 17) literally: numpy broadcasting for Add,
// Mul, Div and MatMul batch dimensions, Reshape's 0 and -1, Slice's negative and clamped bounds,
// and so on; values are held in double, so its own rounding is far below what the tests measure.
// An f16 graph is evaluated with its f16 initializers and Cast-to-f16 rounding, the arithmetic in
// double. Attributes it does not implement (Conv pads, Gemm alpha, ...) make it fail loudly
// instead of computing something else.
#pragma once
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/io/onnx.h"
#include "src/io/safetensors.h"

typedef struct {
  char name[ONNX_NAME_MAX];
  int ndim;
  int64_t dims[ONNX_MAX_DIMS];
  double *v;
} EvalValue;

typedef struct {
  EvalValue *vals;
  int n, cap;
  char error[512];
} Eval;

static int64_t eval_numel(int ndim, const int64_t *dims) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= dims[d];
  return n;
}

static int eval_fail(Eval *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int eval_fail(Eval *e, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->error, sizeof e->error, fmt, ap);
  va_end(ap);
  return -1;
}

static EvalValue *eval_find(Eval *e, const char *name) {
  for (int i = e->n - 1; i >= 0; i--)
    if (strcmp(e->vals[i].name, name) == 0) return &e->vals[i];
  return NULL;
}

// A new value (zeroed); the pointer is valid until the next eval_new. name and dims may point
// into a value of e (copied before the table grows, which moves every value).
static EvalValue *eval_new(Eval *e, const char *name_in, int ndim, const int64_t *dims_in) {
  char name[sizeof e->vals[0].name];
  int64_t dims[ONNX_MAX_DIMS];
  snprintf(name, sizeof name, "%s", name_in);
  for (int d = 0; d < ndim && d < ONNX_MAX_DIMS; d++) dims[d] = dims_in[d];
  if (e->n == e->cap) {
    e->cap = e->cap ? 2 * e->cap : 256;
    e->vals = realloc(e->vals, sizeof *e->vals * (size_t)e->cap);
    if (!e->vals) {
      fprintf(stderr, "test_onnx_eval: out of memory for %d values\n", e->cap);
      exit(1);
    }
  }
  EvalValue *v = &e->vals[e->n++];
  memset(v, 0, sizeof *v);
  snprintf(v->name, sizeof v->name, "%s", name);
  v->ndim = ndim;
  for (int d = 0; d < ndim; d++) v->dims[d] = dims[d];
  int64_t n = eval_numel(ndim, dims);
  v->v = calloc((size_t)(n ? n : 1), sizeof *v->v);
  if (!v->v) {
    fprintf(stderr, "test_onnx_eval: out of memory for '%s' (%lld values)\n", name, (long long)n);
    exit(1);
  }
  return v;
}

static void eval_free(Eval *e) {
  for (int i = 0; i < e->n; i++) free(e->vals[i].v);
  free(e->vals);
  memset(e, 0, sizeof *e);
}

static void eval_strides(int ndim, const int64_t *dims, int64_t *strides) {
  int64_t s = 1;
  for (int d = ndim - 1; d >= 0; d--) strides[d] = s, s *= dims[d];
}

// Offset into a value of rank `ndim` broadcast to the index idx of rank `out_ndim`.
static int64_t eval_broadcast_offset(const EvalValue *a, int out_ndim, const int64_t *idx) {
  int64_t strides[ONNX_MAX_DIMS], off = 0;
  eval_strides(a->ndim, a->dims, strides);
  for (int d = 0; d < a->ndim; d++) {
    int od = out_ndim - a->ndim + d;
    if (a->dims[d] != 1) off += idx[od] * strides[d];
  }
  return off;
}

static int eval_broadcast_shape(Eval *e, const char *node, int na, const int64_t *a, int nb,
                                const int64_t *b, int *n, int64_t *out) {
  *n = na > nb ? na : nb;
  for (int d = 0; d < *n; d++) {
    int64_t x = d - (*n - na) >= 0 ? a[d - (*n - na)] : 1;
    int64_t y = d - (*n - nb) >= 0 ? b[d - (*n - nb)] : 1;
    if (x != y && x != 1 && y != 1)
      return eval_fail(e, "%s: shapes do not broadcast (dim %d: %lld vs %lld)", node, d,
                       (long long)x, (long long)y);
    out[d] = x == 1 ? y : x;
  }
  return 0;
}

static void eval_unravel(int64_t flat, int ndim, const int64_t *dims, int64_t *idx) {
  for (int d = ndim - 1; d >= 0; d--) {
    idx[d] = dims[d] ? flat % dims[d] : 0;
    flat = dims[d] ? flat / dims[d] : 0;
  }
}

static const OnnxAttr *eval_attr(const OnnxNode *n, const char *name) {
  return onnx_node_attr(n, name);
}

static int64_t eval_attr_int(const OnnxNode *n, const char *name, int64_t def) {
  const OnnxAttr *a = eval_attr(n, name);
  return a ? a->i : def;
}

// Every attribute of the node must be one of the listed names (NULL-terminated).
static int eval_known_attrs(Eval *e, const OnnxNode *n, ...) {
  for (int i = 0; i < n->num_attrs; i++) {
    bool known = false;
    va_list ap;
    va_start(ap, n);
    for (const char *k = va_arg(ap, const char *); k; k = va_arg(ap, const char *))
      if (strcmp(k, n->attrs[i].name) == 0) known = true;
    va_end(ap);
    if (!known)
      return eval_fail(e, "%s (%s): attribute '%s' is not implemented by the reference", n->name,
                       n->op_type, n->attrs[i].name);
  }
  return 0;
}

static int eval_binary(Eval *e, const OnnxNode *n, const EvalValue *a, const EvalValue *b) {
  int nd;
  int64_t dims[ONNX_MAX_DIMS], idx[ONNX_MAX_DIMS];
  if (eval_broadcast_shape(e, n->name, a->ndim, a->dims, b->ndim, b->dims, &nd, dims) != 0)
    return -1;
  char op = strcmp(n->op_type, "Max") == 0 ? 'X' : n->op_type[0];  // Add, Mul, Div, Max
  EvalValue *o = eval_new(e, n->outputs[0], nd, dims);
  a = eval_find(e, n->inputs[0]), b = eval_find(e, n->inputs[1]);  // eval_new may move them
  for (int64_t i = 0; i < eval_numel(nd, dims); i++) {
    eval_unravel(i, nd, dims, idx);
    double x = a->v[eval_broadcast_offset(a, nd, idx)], y = b->v[eval_broadcast_offset(b, nd, idx)];
    o->v[i] = op == 'A' ? x + y : op == 'M' ? x * y : op == 'X' ? (x > y ? x : y) : x / y;
  }
  return 0;
}

static int eval_matmul(Eval *e, const OnnxNode *n, const EvalValue *a, const EvalValue *b) {
  if (a->ndim < 2 || b->ndim < 2) return eval_fail(e, "%s: MatMul of a 1-D operand", n->name);
  int64_t M = a->dims[a->ndim - 2], K = a->dims[a->ndim - 1], N = b->dims[b->ndim - 1];
  if (b->dims[b->ndim - 2] != K)
    return eval_fail(e, "%s: MatMul inner dimensions %lld vs %lld", n->name, (long long)K,
                     (long long)b->dims[b->ndim - 2]);
  int nb;
  int64_t bdims[ONNX_MAX_DIMS], idx[ONNX_MAX_DIMS], odims[ONNX_MAX_DIMS];
  if (eval_broadcast_shape(e, n->name, a->ndim - 2, a->dims, b->ndim - 2, b->dims, &nb, bdims) != 0)
    return -1;
  memcpy(odims, bdims, sizeof(int64_t) * (size_t)nb);
  odims[nb] = M, odims[nb + 1] = N;
  EvalValue *o = eval_new(e, n->outputs[0], nb + 2, odims);
  a = eval_find(e, n->inputs[0]), b = eval_find(e, n->inputs[1]);
  // Batch offsets: broadcast over the leading dims only (the matrices are contiguous).
  EvalValue ab = *a, bb = *b;
  ab.ndim -= 2, bb.ndim -= 2;
  for (int64_t t = 0; t < eval_numel(nb, bdims); t++) {
    eval_unravel(t, nb, bdims, idx);
    const double *x = a->v + eval_broadcast_offset(&ab, nb, idx) * M * K;
    const double *y = b->v + eval_broadcast_offset(&bb, nb, idx) * K * N;
    double *z = o->v + t * M * N;
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        double s = 0;
        for (int64_t k = 0; k < K; k++) s += x[i * K + k] * y[k * N + j];
        z[i * N + j] = s;
      }
  }
  return 0;
}

static int eval_gemm(Eval *e, const OnnxNode *n, const EvalValue *a, const EvalValue *b,
                     const EvalValue *c) {
  if (eval_known_attrs(e, n, "transB", NULL) != 0) return -1;
  bool tb = eval_attr_int(n, "transB", 0) != 0;
  if (a->ndim != 2 || b->ndim != 2) return eval_fail(e, "%s: Gemm needs 2-D operands", n->name);
  int64_t M = a->dims[0], K = a->dims[1], N = tb ? b->dims[0] : b->dims[1];
  if ((tb ? b->dims[1] : b->dims[0]) != K)
    return eval_fail(e, "%s: Gemm inner dimensions differ", n->name);
  if (c && !(c->ndim == 1 && c->dims[0] == N) &&
      !(c->ndim == 2 && c->dims[0] == M && c->dims[1] == N))
    return eval_fail(e, "%s: Gemm C of an unexpected shape", n->name);
  EvalValue *o = eval_new(e, n->outputs[0], 2, (int64_t[]){M, N});
  a = eval_find(e, n->inputs[0]), b = eval_find(e, n->inputs[1]);
  c = n->num_inputs > 2 && n->inputs[2][0] ? eval_find(e, n->inputs[2]) : NULL;
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      double s = 0;
      for (int64_t k = 0; k < K; k++)
        s += a->v[i * K + k] * (tb ? b->v[j * K + k] : b->v[k * N + j]);
      if (c) s += c->ndim == 1 ? c->v[j] : c->v[i * N + j];
      o->v[i * N + j] = s;
    }
  return 0;
}

static int eval_conv(Eval *e, const OnnxNode *n, const EvalValue *x, const EvalValue *w,
                     const EvalValue *b) {
  if (eval_known_attrs(e, n, "kernel_shape", "strides", NULL) != 0) return -1;
  const OnnxAttr *ks = eval_attr(n, "kernel_shape"), *st = eval_attr(n, "strides");
  if (x->ndim != 4 || w->ndim != 4 || !st || st->num_ints != 2 || w->dims[1] != x->dims[1])
    return eval_fail(e, "%s: Conv of unexpected shapes or attributes", n->name);
  if (ks && (ks->num_ints != 2 || ks->ints[0] != w->dims[2] || ks->ints[1] != w->dims[3]))
    return eval_fail(e, "%s: kernel_shape differs from the weight", n->name);
  int64_t N = x->dims[0], C = x->dims[1], H = x->dims[2], W = x->dims[3], M = w->dims[0];
  int64_t kh = w->dims[2], kw = w->dims[3], sh = st->ints[0], sw = st->ints[1];
  int64_t Ho = (H - kh) / sh + 1, Wo = (W - kw) / sw + 1;
  EvalValue *o = eval_new(e, n->outputs[0], 4, (int64_t[]){N, M, Ho, Wo});
  x = eval_find(e, n->inputs[0]), w = eval_find(e, n->inputs[1]);
  b = n->num_inputs > 2 ? eval_find(e, n->inputs[2]) : NULL;
  for (int64_t i = 0; i < N; i++)
    for (int64_t m = 0; m < M; m++)
      for (int64_t r = 0; r < Ho; r++)
        for (int64_t q = 0; q < Wo; q++) {
          double s = b ? b->v[m] : 0;
          for (int64_t c = 0; c < C; c++)
            for (int64_t u = 0; u < kh; u++)
              for (int64_t t = 0; t < kw; t++)
                s += x->v[((i * C + c) * H + r * sh + u) * W + q * sw + t] *
                     w->v[((m * C + c) * kh + u) * kw + t];
          o->v[((i * M + m) * Ho + r) * Wo + q] = s;
        }
  return 0;
}

static int eval_transpose(Eval *e, const OnnxNode *n, const EvalValue *x) {
  const OnnxAttr *p = eval_attr(n, "perm");
  if (!p || p->num_ints != x->ndim)
    return eval_fail(e, "%s: perm does not match the rank", n->name);
  int64_t dims[ONNX_MAX_DIMS], idx[ONNX_MAX_DIMS], in_idx[ONNX_MAX_DIMS], strides[ONNX_MAX_DIMS];
  for (int d = 0; d < x->ndim; d++) dims[d] = x->dims[p->ints[d]];
  EvalValue *o = eval_new(e, n->outputs[0], x->ndim, dims);
  x = eval_find(e, n->inputs[0]);
  eval_strides(x->ndim, x->dims, strides);
  for (int64_t i = 0; i < eval_numel(x->ndim, dims); i++) {
    eval_unravel(i, x->ndim, dims, idx);
    int64_t off = 0;
    for (int d = 0; d < x->ndim; d++) in_idx[p->ints[d]] = idx[d];
    for (int d = 0; d < x->ndim; d++) off += in_idx[d] * strides[d];
    o->v[i] = x->v[off];
  }
  return 0;
}

static int eval_reshape(Eval *e, const OnnxNode *n, const EvalValue *x, const EvalValue *shape) {
  if (shape->ndim != 1) return eval_fail(e, "%s: shape is not 1-D", n->name);
  int nd = (int)shape->dims[0], infer = -1;
  int64_t dims[ONNX_MAX_DIMS], known = 1;
  for (int d = 0; d < nd; d++) {
    dims[d] = (int64_t)shape->v[d];
    if (dims[d] == 0) dims[d] = x->dims[d];  // allowzero = 0: copy the input's dimension
    if (dims[d] == -1) {
      if (infer >= 0) return eval_fail(e, "%s: two -1 in the shape", n->name);
      infer = d;
    } else {
      known *= dims[d];
    }
  }
  int64_t total = eval_numel(x->ndim, x->dims);
  if (infer >= 0) dims[infer] = known ? total / known : 0;
  if (eval_numel(nd, dims) != total)
    return eval_fail(e, "%s: Reshape of %lld elements to a shape of %lld", n->name,
                     (long long)total, (long long)eval_numel(nd, dims));
  EvalValue *o = eval_new(e, n->outputs[0], nd, dims);
  x = eval_find(e, n->inputs[0]);
  memcpy(o->v, x->v, sizeof(double) * (size_t)total);
  return 0;
}

static int eval_layernorm(Eval *e, const OnnxNode *n, const EvalValue *x, const EvalValue *g,
                          const EvalValue *b) {
  if (eval_known_attrs(e, n, "axis", "epsilon", NULL) != 0) return -1;
  int64_t axis = eval_attr_int(n, "axis", -1);
  const OnnxAttr *eps_attr = eval_attr(n, "epsilon");
  double eps = eps_attr ? eps_attr->f : 1e-5;
  int64_t C = x->dims[x->ndim - 1], rows = eval_numel(x->ndim, x->dims) / C;
  if ((axis != -1 && axis != x->ndim - 1) || g->ndim != 1 || g->dims[0] != C || !b ||
      b->ndim != 1 || b->dims[0] != C)
    return eval_fail(e, "%s: LayerNormalization other than over the last axis", n->name);
  EvalValue *o = eval_new(e, n->outputs[0], x->ndim, x->dims);
  x = eval_find(e, n->inputs[0]), g = eval_find(e, n->inputs[1]), b = eval_find(e, n->inputs[2]);
  for (int64_t r = 0; r < rows; r++) {
    const double *xr = x->v + r * C;
    double mean = 0, var = 0;
    for (int64_t c = 0; c < C; c++) mean += xr[c];
    mean /= (double)C;
    for (int64_t c = 0; c < C; c++) var += (xr[c] - mean) * (xr[c] - mean);
    var /= (double)C;
    double rstd = 1.0 / sqrt(var + eps);
    for (int64_t c = 0; c < C; c++) o->v[r * C + c] = (xr[c] - mean) * rstd * g->v[c] + b->v[c];
  }
  return 0;
}

static int eval_softmax(Eval *e, const OnnxNode *n, const EvalValue *x) {
  int64_t axis = eval_attr_int(n, "axis", -1);
  if (axis != -1 && axis != x->ndim - 1)
    return eval_fail(e, "%s: Softmax other than over the last axis", n->name);
  int64_t C = x->dims[x->ndim - 1], rows = eval_numel(x->ndim, x->dims) / C;
  EvalValue *o = eval_new(e, n->outputs[0], x->ndim, x->dims);
  x = eval_find(e, n->inputs[0]);
  for (int64_t r = 0; r < rows; r++) {
    double mx = -INFINITY, s = 0;
    for (int64_t c = 0; c < C; c++) mx = fmax(mx, x->v[r * C + c]);
    for (int64_t c = 0; c < C; c++) s += o->v[r * C + c] = exp(x->v[r * C + c] - mx);
    for (int64_t c = 0; c < C; c++) o->v[r * C + c] /= s;
  }
  return 0;
}

static int eval_slice(Eval *e, const OnnxNode *n, const EvalValue *x) {
  if (n->num_inputs != 4) return eval_fail(e, "%s: Slice without axes or with steps", n->name);
  const EvalValue *starts = eval_find(e, n->inputs[1]), *ends = eval_find(e, n->inputs[2]),
                  *axes = eval_find(e, n->inputs[3]);
  int64_t lo[ONNX_MAX_DIMS], dims[ONNX_MAX_DIMS], idx[ONNX_MAX_DIMS], strides[ONNX_MAX_DIMS];
  for (int d = 0; d < x->ndim; d++) lo[d] = 0, dims[d] = x->dims[d];
  for (int64_t k = 0; k < axes->dims[0]; k++) {
    int64_t a = (int64_t)axes->v[k], size;
    if (a < 0) a += x->ndim;
    size = x->dims[a];
    int64_t s = (int64_t)starts->v[k], t = (int64_t)ends->v[k];
    if (s < 0) s += size;
    if (t < 0) t += size;
    s = s < 0 ? 0 : s > size ? size : s;
    t = t < 0 ? 0 : t > size ? size : t;
    lo[a] = s;
    dims[a] = t > s ? t - s : 0;
  }
  EvalValue *o = eval_new(e, n->outputs[0], x->ndim, dims);
  x = eval_find(e, n->inputs[0]);
  eval_strides(x->ndim, x->dims, strides);
  for (int64_t i = 0; i < eval_numel(x->ndim, dims); i++) {
    eval_unravel(i, x->ndim, dims, idx);
    int64_t off = 0;
    for (int d = 0; d < x->ndim; d++) off += (idx[d] + lo[d]) * strides[d];
    o->v[i] = x->v[off];
  }
  return 0;
}

static int eval_concat(Eval *e, const OnnxNode *n) {
  const EvalValue *first = eval_find(e, n->inputs[0]);
  int64_t axis = eval_attr_int(n, "axis", 0);
  if (axis < 0) axis += first->ndim;
  int64_t dims[ONNX_MAX_DIMS];
  memcpy(dims, first->dims, sizeof dims);
  dims[axis] = 0;
  for (int i = 0; i < n->num_inputs; i++) {
    const EvalValue *x = eval_find(e, n->inputs[i]);
    for (int d = 0; d < first->ndim; d++)
      if (d != axis && x->dims[d] != first->dims[d])
        return eval_fail(e, "%s: Concat inputs differ off the axis", n->name);
    dims[axis] += x->dims[axis];
  }
  EvalValue *o = eval_new(e, n->outputs[0], first->ndim, dims);
  int64_t outer = eval_numel((int)axis, dims),
          inner = eval_numel(o->ndim - (int)axis - 1, dims + axis + 1);
  int64_t at = 0;  // offset along the axis
  for (int i = 0; i < n->num_inputs; i++) {
    const EvalValue *x = eval_find(e, n->inputs[i]);
    for (int64_t p = 0; p < outer; p++)
      memcpy(o->v + (p * dims[axis] + at) * inner, x->v + p * x->dims[axis] * inner,
             sizeof(double) * (size_t)(x->dims[axis] * inner));
    at += x->dims[axis];
  }
  return 0;
}

static int eval_gather(Eval *e, const OnnxNode *n, const EvalValue *x, const EvalValue *ind) {
  int64_t axis = eval_attr_int(n, "axis", 0);
  if (axis < 0) axis += x->ndim;
  int64_t dims[ONNX_MAX_DIMS];
  int nd = 0;
  for (int d = 0; d < axis; d++) dims[nd++] = x->dims[d];
  for (int d = 0; d < ind->ndim; d++) dims[nd++] = ind->dims[d];
  for (int d = (int)axis + 1; d < x->ndim; d++) dims[nd++] = x->dims[d];
  int64_t outer = eval_numel((int)axis, x->dims),
          inner = eval_numel(x->ndim - (int)axis - 1, x->dims + axis + 1);
  int64_t count = eval_numel(ind->ndim, ind->dims), size = x->dims[axis];
  EvalValue *o = eval_new(e, n->outputs[0], nd, dims);
  x = eval_find(e, n->inputs[0]), ind = eval_find(e, n->inputs[1]);
  for (int64_t p = 0; p < outer; p++)
    for (int64_t k = 0; k < count; k++) {
      int64_t at = (int64_t)ind->v[k];
      if (at < 0) at += size;
      if (at < 0 || at >= size) return eval_fail(e, "%s: Gather index out of range", n->name);
      memcpy(o->v + (p * count + k) * inner, x->v + (p * size + at) * inner,
             sizeof(double) * (size_t)inner);
    }
  return 0;
}

// ReduceMean, or with l2 ReduceL2 (the square root of the sum of squares).
static int eval_reduce(Eval *e, const OnnxNode *n, const EvalValue *x, bool l2) {
  if (eval_known_attrs(e, n, "axes", "keepdims", NULL) != 0) return -1;
  const OnnxAttr *axes = eval_attr(n, "axes");
  bool keep = eval_attr_int(n, "keepdims", 1) != 0, reduced[ONNX_MAX_DIMS] = {0};
  for (int k = 0; axes && k < axes->num_ints; k++)
    reduced[axes->ints[k] < 0 ? axes->ints[k] + x->ndim : axes->ints[k]] = true;
  int64_t dims[ONNX_MAX_DIMS], keep_dims[ONNX_MAX_DIMS], idx[ONNX_MAX_DIMS], count = 1;
  int nd = 0;
  for (int d = 0; d < x->ndim; d++) {
    if (!axes) reduced[d] = true;  // no axes: reduce everything
    keep_dims[d] = reduced[d] ? 1 : x->dims[d];
    if (reduced[d]) count *= x->dims[d];
    if (!reduced[d] || keep) dims[nd++] = keep_dims[d];
  }
  EvalValue *o = eval_new(e, n->outputs[0], nd, dims);
  x = eval_find(e, n->inputs[0]);
  int64_t out_strides[ONNX_MAX_DIMS];
  eval_strides(x->ndim, keep_dims, out_strides);
  for (int64_t i = 0; i < eval_numel(x->ndim, x->dims); i++) {
    eval_unravel(i, x->ndim, x->dims, idx);
    int64_t off = 0;
    for (int d = 0; d < x->ndim; d++) off += reduced[d] ? 0 : idx[d] * out_strides[d];
    o->v[off] += l2 ? x->v[i] * x->v[i] : x->v[i] / (double)count;
  }
  for (int64_t i = 0; l2 && i < eval_numel(nd, dims); i++) o->v[i] = sqrt(o->v[i]);
  return 0;
}

static int eval_unary(Eval *e, const OnnxNode *n, const EvalValue *x) {
  int64_t to = eval_attr_int(n, "to", 0);
  if (strcmp(n->op_type, "Cast") == 0 && to != ONNX_FLOAT && to != ONNX_FLOAT16)
    return eval_fail(e, "%s: Cast to type %lld", n->name, (long long)to);
  EvalValue *o = eval_new(e, n->outputs[0], x->ndim, x->dims);
  x = eval_find(e, n->inputs[0]);
  bool erf_op = strcmp(n->op_type, "Erf") == 0;
  for (int64_t i = 0; i < eval_numel(x->ndim, x->dims); i++)
    o->v[i] = erf_op             ? erf(x->v[i])
              : to == ONNX_FLOAT ? (double)(float)x->v[i]
                                 : (double)f16_to_f32(f32_to_f16((float)x->v[i]));
  return 0;
}

static int eval_node(Eval *e, const OnnxNode *n) {
  const EvalValue *in[ONNX_MAX_IO] = {0};
  for (int i = 0; i < n->num_inputs; i++) {
    if (!n->inputs[i][0]) continue;  // an omitted optional input
    in[i] = eval_find(e, n->inputs[i]);
    if (!in[i])
      return eval_fail(e, "%s: input '%s' is not defined before the node", n->name, n->inputs[i]);
  }
  if (n->num_outputs != 1) return eval_fail(e, "%s: %d outputs", n->name, n->num_outputs);
  if (eval_find(e, n->outputs[0]))
    return eval_fail(e, "%s: value '%s' is assigned twice", n->name, n->outputs[0]);
  const char *op = n->op_type;
  if (!strcmp(op, "Add") || !strcmp(op, "Mul") || !strcmp(op, "Div") || !strcmp(op, "Max"))
    return eval_binary(e, n, in[0], in[1]);
  if (!strcmp(op, "MatMul")) return eval_matmul(e, n, in[0], in[1]);
  if (!strcmp(op, "Gemm")) return eval_gemm(e, n, in[0], in[1], in[2]);
  if (!strcmp(op, "Conv")) return eval_conv(e, n, in[0], in[1], in[2]);
  if (!strcmp(op, "Transpose")) return eval_transpose(e, n, in[0]);
  if (!strcmp(op, "Reshape")) return eval_reshape(e, n, in[0], in[1]);
  if (!strcmp(op, "LayerNormalization")) return eval_layernorm(e, n, in[0], in[1], in[2]);
  if (!strcmp(op, "Softmax")) return eval_softmax(e, n, in[0]);
  if (!strcmp(op, "Slice")) return eval_slice(e, n, in[0]);
  if (!strcmp(op, "Concat")) return eval_concat(e, n);
  if (!strcmp(op, "Gather")) return eval_gather(e, n, in[0], in[1]);
  if (!strcmp(op, "ReduceMean") || !strcmp(op, "ReduceL2"))
    return eval_reduce(e, n, in[0], !strcmp(op, "ReduceL2"));
  if (!strcmp(op, "Erf") || !strcmp(op, "Cast")) return eval_unary(e, n, in[0]);
  return eval_fail(e, "%s: operator %s is not implemented by the reference", n->name, op);
}

// Loads the initializers, binds the one graph input to x (input's shape with the batch filled
// in), runs every node in order. Returns the graph's first output (owned by e) or NULL.
static const EvalValue *eval_model(Eval *e, const OnnxModel *om, int ndim, const int64_t *dims,
                                   const float *x) {
  for (int i = 0; i < om->num_initializers; i++) {
    const OnnxTensor *t = om->initializers[i];
    EvalValue *v = eval_new(e, t->name, t->ndim, t->dims);
    for (int64_t k = 0; k < onnx_tensor_numel(t); k++) {
      const unsigned char *p = (const unsigned char *)t->data;
      if (t->data_type == ONNX_FLOAT) {
        float f;
        memcpy(&f, p + 4 * k, 4);
        v->v[k] = f;
      } else if (t->data_type == ONNX_FLOAT16) {
        uint16_t h;
        memcpy(&h, p + 2 * k, 2);
        v->v[k] = f16_to_f32(h);
      } else {
        int64_t q;
        memcpy(&q, p + 8 * k, 8);
        v->v[k] = (double)q;
      }
    }
  }
  EvalValue *in = eval_new(e, om->inputs[0].name, ndim, dims);
  for (int64_t k = 0; k < eval_numel(ndim, dims); k++) in->v[k] = x[k];
  for (int i = 0; i < om->num_nodes; i++)
    if (eval_node(e, om->nodes[i]) != 0) return NULL;
  const EvalValue *out = eval_find(e, om->outputs[0].name);
  if (!out) eval_fail(e, "no node produces the output '%s'", om->outputs[0].name);
  return out;
}
