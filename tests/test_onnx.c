// test_onnx.c: the ONNX export, checked without Python.
//  1. The protobuf encoder writes the same bytes as the onnx package for the same small model
//     (tests/fixtures/onnx_reference.onnx, scripts/make_onnx_fixture.py), and the decoder reads
//     that file back field for field; malformed files are refused.
//  2. Swin graphs of several shapes (shifted windows on both sides, a shift along one side only,
//     rectangular windows, a window larger than the map, 1 and 4 channels, 1 class, no qkv
//     bias) in f32 and f16, dynamic and fixed batch, written and read back: opset, IR version,
//     inputs and outputs, nodes named after timm modules holding the timm-named initializers,
//     initializers equal to the weights bit for bit, the attention bias equal to the table
//     gathered through the relative position index (plus the shift mask), every value defined
//     once before use, and the expected count of each operator.
//  3. What the graph computes: a reference interpreter (test_onnx_eval.h) runs it on random
//     images and its logits are compared with model_forward's.
//  4. swin_export itself, from a checkpoint, and the errors (unwritable path, unknown dtype,
//     bad batch, over 2 GiB).
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/cosine_attention.h"
#include "src/base/config.h"
#include "src/base/util.h"
#include "src/io/checkpoint.h"
#include "src/io/onnx.h"
#include "src/io/safetensors.h"
#include "src/model/model.h"
#include "tests/util/test_onnx_eval.h"
#include "tests/util/test_util.h"

static char dir[] = "/tmp/swin_test_onnx_XXXXXX";

static const char *tmp_path(char *buf, size_t size, const char *name) {
  snprintf(buf, size, "%s/%s", dir, name);
  return buf;
}

// ---------------------------------------------------------------------------------------------
// 1. Encoder and decoder against the onnx package

// The model of scripts/make_onnx_fixture.py, built with our API (attributes in name order, as
// onnx.helper.make_node sorts them).
static void build_reference(OnnxModel *om, float *w, float *b, float *gamma, float *beta,
                            uint16_t *half, int64_t *shape) {
  onnx_model_init(om);
  for (int i = 0; i < 6; i++) w[i] = (float)i * 0.75f - 1.5f;
  const float bv[3] = {0.5f, -0.25f, 2.0f}, gv[3] = {1.0f, 0.5f, -2.0f},
              betav[3] = {0.0f, 0.125f, -1.0f};
  memcpy(b, bv, sizeof bv), memcpy(gamma, gv, sizeof gv), memcpy(beta, betav, sizeof betav);
  *half = f32_to_f16(0.5f);
  shape[0] = -1, shape[1] = 3;
  snprintf(om->producer_name, sizeof om->producer_name, "swin.c");
  snprintf(om->producer_version, sizeof om->producer_version, "swin_export");
  snprintf(om->graph_name, sizeof om->graph_name, "reference");
  struct {
    const char *op, *name, *in[3];
  } nodes[] = {{"Gemm", "fc", {"x", "fc.weight", "fc.bias"}},
               {"LayerNormalization", "norm", {"fc", "norm.weight", "norm.bias"}},
               {"Cast", "norm.f16", {"norm"}},
               {"Mul", "scaled", {"norm.f16", "f.half"}},
               {"Cast", "scaled.f32", {"scaled"}},
               {"Reshape", "rows", {"scaled.f32", "i64[-1,3]"}},
               {"Gemm", "proj", {"rows", "fc.weight", ""}},
               {"Transpose", "y", {"proj"}}};
  for (size_t i = 0; i < sizeof nodes / sizeof nodes[0]; i++) {
    OnnxNode *n = onnx_add_node(om, nodes[i].op, nodes[i].name);
    for (int k = 0; k < 3 && nodes[i].in[k]; k++) onnx_node_input(n, nodes[i].in[k]);
    onnx_node_output(n, nodes[i].name);
  }
  onnx_attr_int(om->nodes[0], "transB", 1);
  onnx_attr_int(om->nodes[1], "axis", -1);
  onnx_attr_float(om->nodes[1], "epsilon", 1e-5f);
  onnx_attr_int(om->nodes[2], "to", ONNX_FLOAT16);
  onnx_attr_int(om->nodes[4], "to", ONNX_FLOAT);
  onnx_attr_ints(om->nodes[7], "perm", 2, (int64_t[]){1, 0});
  onnx_add_initializer(om, "fc.weight", ONNX_FLOAT, 2, (int64_t[]){3, 2}, w, NULL);
  onnx_add_initializer(om, "fc.bias", ONNX_FLOAT, 1, (int64_t[]){3}, b, NULL);
  onnx_add_initializer(om, "norm.weight", ONNX_FLOAT, 1, (int64_t[]){3}, gamma, NULL);
  onnx_add_initializer(om, "norm.bias", ONNX_FLOAT, 1, (int64_t[]){3}, beta, NULL);
  onnx_add_initializer(om, "f.half", ONNX_FLOAT16, 0, NULL, half, NULL);
  onnx_add_initializer(om, "i64[-1,3]", ONNX_INT64, 1, (int64_t[]){2}, shape, NULL);
  OnnxValueInfo *x = &om->inputs[om->num_inputs++], *y = &om->outputs[om->num_outputs++];
  *x = (OnnxValueInfo){.name = "x", .elem_type = ONNX_FLOAT, .ndim = 2, .dims = {-1, 2}};
  snprintf(x->dim_params[0], sizeof x->dim_params[0], "batch");
  *y = (OnnxValueInfo){.name = "y", .elem_type = ONNX_FLOAT, .ndim = 2, .dims = {2, -1}};
  snprintf(y->dim_params[1], sizeof y->dim_params[1], "batch");
  onnx_add_metadata(om, "swin.config", "[model]\nembed_dim = 8\n");
}

static void test_reference_bytes(void) {
  char ref_path[512], our_path[512];
  snprintf(ref_path, sizeof ref_path, "%s/tests/fixtures/onnx_reference.onnx", SWIN_SOURCE_DIR);
  float w[6], b[3], gamma[3], beta[3];
  uint16_t half;
  int64_t shape[2];
  OnnxModel om;
  build_reference(&om, w, b, gamma, beta, &half, shape);
  Error err;
  int rc = onnx_model_save(&om, tmp_path(our_path, sizeof our_path, "reference.onnx"), &err);
  test_check(rc == 0, "save the reference model%s%s", rc ? ": " : "", rc ? err.msg : "");
  size_t ref_size = 0, our_size = 0;
  unsigned char *ref = read_file(ref_path, &ref_size, &err);
  unsigned char *ours = rc == 0 ? read_file(our_path, &our_size, &err) : NULL;
  size_t at = 0;
  while (ref && ours && at < ref_size && at < our_size && ref[at] == ours[at]) at++;
  test_check(ref && ours && ref_size == our_size && at == ref_size,
             "encoder bytes equal the onnx package's (%zu vs %zu bytes, the same up to byte %zu)",
             our_size, ref_size, at);
  test_check(onnx_model_size(&om) == our_size, "onnx_model_size %llu = bytes written %zu",
             (unsigned long long)onnx_model_size(&om), our_size);
  onnx_model_free(&om);

  // The decoder on the reference file: every field we write comes back.
  OnnxModel r;
  rc = onnx_model_load(&r, ref_path, &err);
  test_check(rc == 0, "decode the onnx package's file%s%s", rc ? ": " : "", rc ? err.msg : "");
  if (rc == 0) {
    const OnnxNode *ln = onnx_find_node(&r, "norm"), *proj = onnx_find_node(&r, "proj"),
                   *t = onnx_find_node(&r, "y");
    const OnnxTensor *h = onnx_find_initializer(&r, "f.half"),
                     *s = onnx_find_initializer(&r, "i64[-1,3]"),
                     *fw = onnx_find_initializer(&r, "fc.weight");
    int64_t s1 = 0;
    if (s) memcpy(&s1, (const char *)s->data, 8);
    uint16_t hv = 0;
    if (h) memcpy(&hv, h->data, 2);
    test_check(r.ir_version == 8 && r.opset == 17 && r.num_nodes == 8 && r.num_initializers == 6 &&
                   !strcmp(r.producer_name, "swin.c") && !strcmp(r.graph_name, "reference"),
               "decoded header: ir %lld, opset %lld, %d nodes, %d initializers",
               (long long)r.ir_version, (long long)r.opset, r.num_nodes, r.num_initializers);
    test_check(ln && !strcmp(ln->op_type, "LayerNormalization") && ln->num_attrs == 2 &&
                   ln->attrs[0].type == ONNX_ATTR_INT && ln->attrs[0].i == -1 &&
                   ln->attrs[1].type == ONNX_ATTR_FLOAT && ln->attrs[1].f == 1e-5f,
               "decoded INT -1 and FLOAT attributes");
    test_check(proj && proj->num_inputs == 3 && proj->inputs[2][0] == 0 && t &&
                   t->attrs[0].num_ints == 2 && t->attrs[0].ints[0] == 1 &&
                   t->attrs[0].ints[1] == 0,
               "decoded an omitted input and an INTS attribute");
    test_check(h && h->ndim == 0 && h->data_type == ONNX_FLOAT16 && hv == f32_to_f16(0.5f) && s &&
                   s->ndim == 1 && s->dims[0] == 2 && s1 == -1 && fw && fw->dims[0] == 3 &&
                   fw->dims[1] == 2 && memcmp(fw->data, w, sizeof w) == 0,
               "decoded f16 scalar, int64 and f32 initializers");
    test_check(r.num_inputs == 1 && r.inputs[0].dims[0] < 0 &&
                   !strcmp(r.inputs[0].dim_params[0], "batch") && r.inputs[0].dims[1] == 2 &&
                   r.num_outputs == 1 && r.outputs[0].dims[0] == 2 &&
                   !strcmp(r.outputs[0].dim_params[1], "batch"),
               "decoded symbolic and fixed dimensions");
    const char *meta = onnx_metadata_get(&r, "swin.config");
    test_check(meta && !strcmp(meta, "[model]\nembed_dim = 8\n"), "decoded metadata_props");
    // The reference interpreter on it: y = (LN(x W^T + b) * 0.5 rounded to f16) W, transposed.
    float xf[4] = {0.3f, -1.2f, 2.0f, 0.7f};
    double x[4] = {xf[0], xf[1], xf[2], xf[3]}, want[4];
    for (int i = 0; i < 2; i++) {
      double hrow[3], mean = 0, var = 0, nrow[3];
      for (int o = 0; o < 3; o++)
        hrow[o] = x[2 * i] * w[2 * o] + x[2 * i + 1] * w[2 * o + 1] + b[o];
      for (int o = 0; o < 3; o++) mean += hrow[o] / 3;
      for (int o = 0; o < 3; o++) var += (hrow[o] - mean) * (hrow[o] - mean) / 3;
      for (int o = 0; o < 3; o++) {
        double v = (hrow[o] - mean) / sqrt(var + (double)1e-5f) * gamma[o] + beta[o];
        nrow[o] = f16_to_f32(f32_to_f16((float)v)) * 0.5;
      }
      for (int o = 0; o < 2; o++)
        want[o * 2 + i] = nrow[0] * w[o] + nrow[1] * w[2 + o] + nrow[2] * w[4 + o];
    }
    Eval e = {0};
    const EvalValue *y = eval_model(&e, &r, 2, (int64_t[]){2, 2}, xf);
    double err_max = y ? 0 : INFINITY;
    for (int i = 0; y && i < 4; i++) err_max = fmax(err_max, fabs(y->v[i] - want[i]));
    // The f16 rounding is the same on both sides; what remains is double rounding.
    test_check(y && y->ndim == 2 && y->dims[0] == 2 && y->dims[1] == 2 && err_max < 1e-9,
               "reference interpreter on the reference model: max abs err %.2e (tol 1e-9)%s%s",
               err_max, y ? "" : ": ", y ? "" : e.error);
    eval_free(&e);

    // Malformed: cut in the middle of the graph, or bytes that are no protobuf.
    OnnxModel bad;
    rc = onnx_model_parse(&bad, ref, ref_size / 2, "half.onnx", &err);
    test_check(rc != 0 && strstr(err.msg, "half.onnx") && strstr(err.msg, "HINT"),
               "a truncated file is refused: %s", rc ? err.msg : "(accepted)");
    unsigned char junk[64];
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (unsigned char)(0xff - i);
    rc = onnx_model_parse(&bad, junk, sizeof junk, "junk.onnx", &err);
    test_check(rc != 0 && strstr(err.msg, "junk.onnx"), "bytes that are not ONNX are refused: %s",
               rc ? err.msg : "(accepted)");
    onnx_model_free(&r);
  }
  free(ref);
  free(ours);
}

// ---------------------------------------------------------------------------------------------
// 2. and 3. Swin graphs

typedef struct {
  const char *what;
  int img_h, img_w, in_chans, patch, embed, window, classes;
  int depths[3], heads[3], stages;
  bool qkv_bias;
  int version;  // 0 or 1: Swin; 2: Swin V2
} Case;

static const Case cases[] = {
    {"16x16, shifted 4x4 windows, then one window",
     16,
     16,
     3,
     2,
     8,
     4,
     10,
     {2, 2},
     {2, 4},
     2,
     true,
     1},
    {"16x32: shift 2,2, shift along W only, window 2x4",
     16,
     32,
     3,
     2,
     8,
     4,
     5,
     {2, 2, 2},
     {1, 2, 4},
     3,
     true,
     1},
    {"1 channel, 1 class, 14x14 shift 3 then 7x7", 28, 28, 1, 2, 8, 7, 1, {2, 2}, {2, 2}, 2, true, 1},
    {"4 channels, window 8 > map 4x6, no qkv bias", 8, 12, 4, 2, 8, 8, 7, {3}, {2}, 1, false, 1},
    {"V2: 16x16, shifted 4x4 windows, then one window",
     16,
     16,
     3,
     2,
     8,
     4,
     10,
     {2, 2},
     {2, 4},
     2,
     true,
     2},
    {"V2: 16x32, three stages, no qkv bias",
     16,
     32,
     3,
     2,
     8,
     4,
     5,
     {2, 2, 2},
     {1, 2, 4},
     3,
     false,
     2},
};

static Config case_config(const Case *k) {
  Config c;
  config_defaults(&c);
  c.img_h = k->img_h, c.img_w = k->img_w, c.in_chans = k->in_chans;
  c.patch_size = k->patch, c.embed_dim = k->embed, c.window_size = k->window;
  c.num_classes = k->classes, c.qkv_bias = k->qkv_bias;
  c.version = k->version ? k->version : 1;
  memset(c.depths, 0, sizeof c.depths);  // lists end at the first 0
  memset(c.num_heads, 0, sizeof c.num_heads);
  c.num_stages = k->stages;
  for (int s = 0; s < k->stages; s++) c.depths[s] = k->depths[s], c.num_heads[s] = k->heads[s];
  c.num_mean = 1;  // one mean and std for every channel (a list ends at its first 0)
  c.mean[0] = 0.5f;
  memset(c.std, 0, sizeof c.std);
  c.std[0] = 0.25f;
  return c;
}

// The parameters the graph folds into constants at export: V1's bias tables (gathered into
// each block's bias), V2's position-bias MLP (likewise), logit scales and q / v biases.
static bool is_table(const char *name) {
  return ends_with(name, ".relative_position_bias_table") || strstr(name, ".attn.cpb_mlp.") ||
         ends_with(name, ".attn.logit_scale") || ends_with(name, ".attn.q_bias") ||
         ends_with(name, ".attn.v_bias");
}

// The value an initializer must hold for float x: x itself, or x rounded to f16.
static bool tensor_equals(const OnnxTensor *t, const float *x, int64_t n, bool f16) {
  if (onnx_tensor_numel(t) != n || t->data_type != (f16 ? ONNX_FLOAT16 : ONNX_FLOAT)) return false;
  if (!f16) return memcmp(t->data, x, sizeof(float) * (size_t)n) == 0;
  for (int64_t i = 0; i < n; i++) {
    uint16_t h;
    memcpy(&h, (const char *)t->data + 2 * i, 2);
    if (h != f32_to_f16(x[i])) return false;
  }
  return true;
}

// Parameters: each under its timm name and shape, equal to the weights, consumed by the node
// named after its module; no bias table.
static void check_parameters(const OnnxModel *om, const Model *m, bool f16, const char *tag) {
  int missing = 0, wrong = 0, orphan = 0, tables = 0;
  char first[256] = "";
  for (int i = 0; i < m->num_params; i++) {
    const Param *p = &m->params[i];
    const OnnxTensor *t = onnx_find_initializer(om, p->t.name);
    if (is_table(p->t.name)) {
      tables += t != NULL;
      continue;
    }
    bool same_shape = t && t->ndim == p->t.ndim;
    for (int d = 0; same_shape && d < p->t.ndim; d++) same_shape = t->dims[d] == p->t.shape[d];
    if (!t) {
      if (!missing++ && !first[0]) snprintf(first, sizeof first, "missing %s", p->t.name);
      continue;
    }
    if (!same_shape || !tensor_equals(t, m->weights + p->offset, tensor_numel(&p->t), f16)) {
      if (!wrong++ && !first[0]) snprintf(first, sizeof first, "differs: %s", p->t.name);
    }
    // The consumer is the module: name minus .weight / .bias.
    char module[ONNX_NAME_MAX];
    snprintf(module, sizeof module, "%.*s", (int)(strrchr(p->t.name, '.') - p->t.name), p->t.name);
    const OnnxNode *n = onnx_find_node(om, module);
    bool consumes = false;
    for (int k = 0; n && k < n->num_inputs; k++) consumes |= !strcmp(n->inputs[k], p->t.name);
    const char *op = !strcmp(module, "patch_embed.proj") ? "Conv"
                     : strstr(module, "norm")            ? "LayerNormalization"
                                                         : "Gemm";
    if (!consumes || strcmp(n->op_type, op) != 0) {
      if (!orphan++ && !first[0])
        snprintf(first, sizeof first, "node '%s' (%s) does not take %s", module, op, p->t.name);
    }
  }
  test_check(!missing && !wrong && !orphan && !tables,
             "%s: parameters: %d missing, %d not bit-equal or misshapen, %d not taken by their "
             "module's node, %d bias tables left in%s%s",
             tag, missing, wrong, orphan, tables, first[0] ? "; first: " : "", first);
}

// Bias per block: table[index[i][j]][h] (+ mask[w][i][j] in shifted blocks), the index
// written out from its definition here.
static void check_attention_bias(const OnnxModel *om, const Model *m, bool f16, const char *tag) {
  int bad = 0;
  char first[256] = "";
  for (int s = 0; s < m->num_stages; s++) {
    const StageGeom *g = &m->stages[s];
    for (int j = 0; j < g->depth; j++) {
      bool shifted = j % 2 == 1 && (g->sh || g->sw);
      int64_t N = g->N, H = g->heads, nW = shifted ? g->nW : 1;
      char name[ONNX_NAME_MAX];
      snprintf(name, sizeof name, "layers.%d.blocks.%d.attn.relative_position_bias%s", s, j,
               shifted ? "_masked" : "");
      const OnnxTensor *t = onnx_find_initializer(om, name);
      const BlockWeights *bw = &m->w.blocks[g->first_block + j];
      float *v2_table = NULL;
      if (m->cfg.version == 2) {  // the position-bias MLP's table, as the CPU reference makes it
        v2_table = malloc(sizeof(float) * (size_t)g->cpb_rows * (size_t)H);
        float *hidden = malloc(sizeof(float) * (size_t)g->cpb_rows * CPB_HIDDEN);
        cpb_forward_cpu(v2_table, hidden, g->cpb_coords, bw->cpb_w1, bw->cpb_b1, bw->cpb_w2,
                        g->cpb_rows, (int)H);
        free(hidden);
      }
      const float *table = v2_table ? v2_table : bw->rel_table;
      float *want = malloc(sizeof(float) * (size_t)(nW * H * N * N));
      for (int64_t w = 0; w < nW; w++)
        for (int64_t h = 0; h < H; h++)
          for (int64_t i = 0; i < N; i++)
            for (int64_t k = 0; k < N; k++) {
              int64_t ri = i / g->ww, ci = i % g->ww, rk = k / g->ww, ck = k % g->ww;
              int64_t index = (ri - rk + g->wh - 1) * (2 * g->ww - 1) + (ci - ck + g->ww - 1);
              float v = table[index * H + h];
              if (shifted) v += g->mask[(w * N + i) * N + k];
              want[((w * H + h) * N + i) * N + k] = v;
            }
      bool ok = t && t->ndim == (shifted ? 4 : 3) && t->dims[t->ndim - 3] == H &&
                t->dims[t->ndim - 2] == N && t->dims[t->ndim - 1] == N &&
                (!shifted || t->dims[0] == nW) && tensor_equals(t, want, nW * H * N * N, f16);
      if (!ok && !bad++) snprintf(first, sizeof first, "%s", name);
      free(want);
      free(v2_table);
    }
  }
  test_check(!bad, "%s: attention bias (+ mask) of every block equals table[index] (+ mask)%s%s",
             tag, bad ? "; first wrong: " : "", first);
}

static int count_op(const OnnxModel *om, const char *op) {
  int n = 0;
  for (int i = 0; i < om->num_nodes; i++) n += !strcmp(om->nodes[i]->op_type, op);
  return n;
}

// Values defined once, before use; node names unique; every initializer used; constants
// named as onnx.h says; operator counts.
static void check_graph(const OnnxModel *om, const Model *m, bool f16, const char *tag) {
  int undefined = 0, twice = 0, unused = 0, stray = 0;
  char first[256] = "";
  for (int i = 0; i < om->num_nodes; i++) {
    const OnnxNode *n = om->nodes[i];
    for (int k = 0; k < n->num_inputs; k++) {
      const char *in = n->inputs[k];
      bool defined = !in[0] || onnx_find_initializer(om, in) || !strcmp(in, "images");
      for (int q = 0; q < i && !defined; q++) defined = !strcmp(om->nodes[q]->outputs[0], in);
      if (!defined && !undefined++) snprintf(first, sizeof first, "'%s' used by %s", in, n->name);
    }
    for (int q = 0; q < i; q++)
      if (!strcmp(om->nodes[q]->name, n->name) || !strcmp(om->nodes[q]->outputs[0], n->outputs[0]))
        twice++;
  }
  int params = 0, biases = 0, constants = 0;
  for (int t = 0; t < om->num_initializers; t++) {
    const char *name = om->initializers[t]->name;
    bool used = false;
    for (int i = 0; i < om->num_nodes && !used; i++)
      for (int k = 0; k < om->nodes[i]->num_inputs; k++)
        used |= !strcmp(om->nodes[i]->inputs[k], name);
    unused += !used;
    if (model_find_param(m, name))
      params++;
    else if (strstr(name, ".attn.relative_position_bias") || ends_with(name, ".attn.qkv_bias") ||
             ends_with(name, ".attn.logit_scale_clamped_exp"))
      biases++;
    else if (!strncmp(name, "i64", 3) || !strncmp(name, "f.", 2))
      constants++;
    else
      stray++;
  }
  test_check(
      !undefined && !twice && !unused && !stray,
      "%s: %d nodes: %d inputs undefined before use, %d names twice, %d initializers unused, "
      "%d unexplained (%d parameters, %d biases, %d constants)%s%s",
      tag, om->num_nodes, undefined, twice, unused, stray, params, biases, constants,
      first[0] ? "; first: " : "", first);

  int blocks = m->num_blocks, merges = m->num_stages - 1, rolls = 0;
  int v2 = m->cfg.version == 2;  // q and k normalized: ReduceL2, Max, Div each
  for (int s = 0; s < m->num_stages; s++)
    for (int j = 1; j < m->stages[s].depth; j += 2)
      rolls += 2 * ((m->stages[s].sh > 0) + (m->stages[s].sw > 0));  // there and back
  struct {
    const char *op;
    int want;
  } ops[] = {{"Conv", 1},
             {"LayerNormalization", 2 + 2 * blocks + merges},
             {"Gemm", 4 * blocks + merges + 1},
             {"MatMul", 2 * blocks},
             {"Softmax", blocks},
             {"Erf", blocks},
             {"Gather", 3 * blocks},
             {"Concat", rolls},
             {"Slice", 2 * rolls},
             {"ReduceMean", 1},
             {"ReduceL2", 2 * v2 * blocks},
             {"Max", 2 * v2 * blocks},
             {"Div", blocks + 2 * v2 * blocks},
             {"Cast", f16 ? 2 : 0}};
  char got[512] = "";
  int o = 0, off = 0;
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
    int n = count_op(om, ops[i].op);
    if (n != ops[i].want) {
      off++;
      o += snprintf(got + o, sizeof got - (size_t)o, " %s %d (want %d)", ops[i].op, n, ops[i].want);
    }
  }
  test_check(!off, "%s: operator counts (Gemm %d, LayerNormalization %d, Concat %d)%s", tag,
             count_op(om, "Gemm"), count_op(om, "LayerNormalization"), count_op(om, "Concat"), got);
  const OnnxNode *ln = onnx_find_node(om, "layers.0.blocks.0.norm1");
  const OnnxAttr *eps = ln ? onnx_node_attr(ln, "epsilon") : NULL;
  const OnnxNode *fc = onnx_find_node(om, "head.fc");
  const OnnxAttr *tb = fc ? onnx_node_attr(fc, "transB") : NULL;
  test_check(eps && eps->f == 1e-5f && tb && tb->i == 1,
             "%s: LayerNorm epsilon 1e-5, Gemm transB 1 (timm's (out, in) weights)", tag);
}

static void check_header(const OnnxModel *om, const Model *m, int64_t batch, const char *tag) {
  const Config *c = &m->cfg;
  const OnnxValueInfo *in = &om->inputs[0], *out = &om->outputs[0];
  bool batch_ok = batch > 0 ? in->dims[0] == batch && out->dims[0] == batch
                            : in->dims[0] < 0 && !strcmp(in->dim_params[0], "batch") &&
                                  out->dims[0] < 0 && !strcmp(out->dim_params[0], "batch");
  char *ini = config_to_ini(c);
  const char *meta = onnx_metadata_get(om, "swin.config");
  test_check(om->ir_version == ONNX_IR_VERSION && om->opset == ONNX_OPSET && om->num_inputs == 1 &&
                 om->num_outputs == 1 && !strcmp(in->name, "images") &&
                 in->elem_type == ONNX_FLOAT && in->ndim == 4 && in->dims[1] == c->in_chans &&
                 in->dims[2] == c->img_h && in->dims[3] == c->img_w &&
                 !strcmp(out->name, "logits") && out->elem_type == ONNX_FLOAT && out->ndim == 2 &&
                 out->dims[1] == c->num_classes && batch_ok && meta && !strcmp(meta, ini),
             "%s: IR %lld opset %lld, images (%s, %lld, %lld, %lld) -> logits (%s, %lld), config "
             "in metadata",
             tag, (long long)om->ir_version, (long long)om->opset,
             in->dims[0] < 0 ? in->dim_params[0] : "N", (long long)in->dims[1],
             (long long)in->dims[2], (long long)in->dims[3],
             out->dims[0] < 0 ? out->dim_params[0] : "N", (long long)out->dims[1]);
  free(ini);
}

// Runs the graph on B random images and compares with model_forward. tol: f32 graphs differ
// from the f32 trainer only by the trainer's own rounding (~1e-6 over a small net); f16 graphs
// hold every weight and the input rounded to 11 significant bits (2^-12 relative each), which
// moves the logits by ~1e-3 here.
static void check_logits(const OnnxModel *om, Model *m, int B, bool f16, const char *tag) {
  const Config *c = &m->cfg;
  int64_t per = (int64_t)c->img_h * c->img_w * c->in_chans;
  float *nhwc = malloc(sizeof(float) * (size_t)(B * per)),
        *nchw = malloc(sizeof(float) * (size_t)(B * per));
  TestRng r = {77 + (uint64_t)B};
  test_fill_uniform(&r, nhwc, B * per, -2, 2);
  for (int b = 0; b < B; b++)
    for (int y = 0; y < c->img_h; y++)
      for (int x = 0; x < c->img_w; x++)
        for (int ch = 0; ch < c->in_chans; ch++)
          nchw[((b * c->in_chans + ch) * c->img_h + y) * c->img_w + x] =
              nhwc[((b * c->img_h + y) * c->img_w + x) * c->in_chans + ch];
  model_forward(m, nhwc, DTYPE_F32, (Normalize){{0}, {0}}, B, false, 0, NULL);
  Eval e = {0};
  const EvalValue *y = eval_model(&e, om, 4, (int64_t[]){B, c->in_chans, c->img_h, c->img_w}, nchw);
  int64_t n = (int64_t)B * c->num_classes;
  float *got = malloc(sizeof(float) * (size_t)n);
  bool shape_ok = y && y->ndim == 2 && y->dims[0] == B && y->dims[1] == c->num_classes;
  for (int64_t i = 0; i < n; i++) got[i] = shape_ok ? (float)y->v[i] : NAN;
  double tol = f16 ? 1e-2 : 1e-5, rel = test_rel_err(got, m->acts.logits, n);
  test_check(shape_ok && rel <= tol,
             "%s: logits (%d, %d) of the graph vs model_forward: rel err %.3e (tol %.0e)%s%s", tag,
             B, c->num_classes, rel, tol, y ? "" : ": ", y ? "" : e.error);
  eval_free(&e);
  free(got);
  free(nhwc);
  free(nchw);
}

static void test_case(const Case *k, int index) {
  Config cfg = case_config(k);
  Error err;
  if (config_validate(&cfg, &err) != 0) {
    test_check(0, "case '%s' config: %s", k->what, err.msg);
    return;
  }
  Model m;
  Backend be;
  if (backend_create(&be, "cpu", "fp32", &err) != 0 || model_create(&m, &cfg, &be, 3, &err) != 0) {
    test_check(0, "case '%s' model: %s", k->what, err.msg);
    return;
  }
  model_init_weights(&m, 5 + (uint64_t)index);
  TestRng r = {100 + (uint64_t)index};  // non-trivial values everywhere (init leaves zeros, ones)
  test_fill_uniform(&r, m.weights, m.num_floats, -1, 1);
  if (cfg.version == 2) m.w.blocks[1].logit_scale[0] = 5.0f;  // above ln 100: clamped
  const struct {
    bool f16;
    int64_t batch;
  } variants[] = {{false, 0}, {false, 3}, {true, 0}};
  for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
    bool f16 = variants[v].f16;
    int64_t batch = variants[v].batch;
    char tag[256], path[512], file[64];
    snprintf(tag, sizeof tag, "[%s | %s batch %s]", k->what, f16 ? "f16" : "f32",
             batch ? "3" : "dynamic");
    snprintf(file, sizeof file, "case%d_%zu.onnx", index, v);
    int rc = onnx_export_swin(&m, tmp_path(path, sizeof path, file), f16 ? DTYPE_F16 : DTYPE_F32,
                              batch, &err);
    OnnxModel om;
    if (rc == 0) rc = onnx_model_load(&om, path, &err);
    if (!test_check(rc == 0, "%s: export and read back%s%s", tag, rc ? ": " : "",
                    rc ? err.msg : ""))
      continue;
    check_header(&om, &m, batch, tag);
    check_parameters(&om, &m, f16, tag);
    check_attention_bias(&om, &m, f16, tag);
    check_graph(&om, &m, f16, tag);
    check_logits(&om, &m, batch ? (int)batch : 2, f16, tag);
    onnx_model_free(&om);
  }
  model_destroy(&m);
  backend_destroy(&be);
}

// ---------------------------------------------------------------------------------------------
// 4. swin_export and errors

// Runs a shell command; returns its exit code, its output (stdout and stderr) in out.
static int run(const char *cmd, char *out, size_t size) {
  char full[2048], log[512];
  tmp_path(log, sizeof log, "cmd.log");
  snprintf(full, sizeof full, "%s >%s 2>&1", cmd, log);
  int status = system(full);
  out[0] = 0;
  FILE *f = fopen(log, "rb");
  if (f) {
    size_t n = fread(out, 1, size - 1, f);
    out[n] = 0;
    fclose(f);
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void test_swin_export_program(void) {
  Config cfg = case_config(&cases[0]);
  Error err;
  Model m;
  Backend be;
  if (backend_create(&be, "cpu", "fp32", &err) != 0 || model_create(&m, &cfg, &be, 2, &err) != 0) {
    test_check(0, "swin_export test model: %s", err.msg);
    return;
  }
  model_init_weights(&m, 9);
  TestRng r = {9};
  test_fill_uniform(&r, m.weights, m.num_floats, -1, 1);
  float *moments = calloc((size_t)m.num_floats, sizeof(float));
  TrainState state = {.step = 1, .seed = 0, .loss_scale = 1};
  char ckpt[512], onnx_path[512], cmd[2048], out[4096];
  int rc =
      checkpoint_save(dir, &m, moments, moments, NULL, &state, NULL, 1, ckpt, sizeof ckpt, &err);
  test_check(rc == 0, "checkpoint for swin_export%s%s", rc ? ": " : "", rc ? err.msg : "");
  tmp_path(onnx_path, sizeof onnx_path, "exported.onnx");
  if (access("./swin_export", X_OK) != 0) {
    test_check(0, "./swin_export is not in the test's directory (the build directory)");
  } else if (rc == 0) {
    snprintf(cmd, sizeof cmd, "./swin_export '%s' '%s' batch=2", ckpt, onnx_path);
    int code = run(cmd, out, sizeof out);
    OnnxModel om;
    rc = code == 0 ? onnx_model_load(&om, onnx_path, &err) : -1;
    test_check(rc == 0 && strstr(out, "batch 2"), "swin_export CKPT OUT.onnx batch=2: exit %d: %s",
               code, out);
    if (rc == 0) {
      check_header(&om, &m, 2, "[swin_export]");
      check_parameters(&om, &m, false, "[swin_export]");
      check_logits(&om, &m, 2, false, "[swin_export]");
      onnx_model_free(&om);
    }
    snprintf(cmd, sizeof cmd, "./swin_export '%s' '%s/no/such/dir/m.onnx'", ckpt, dir);
    int code2 = run(cmd, out, sizeof out);
    test_check(code2 == 1 && strstr(out, "no/such/dir/m.onnx") && strstr(out, "HINT"),
               "swin_export to an unwritable path: exit %d: %s", code2, out);
    snprintf(cmd, sizeof cmd, "./swin_export '%s' '%s' dtype=bf16", ckpt, onnx_path);
    code2 = run(cmd, out, sizeof out);
    test_check(code2 == 2 && strstr(out, "dtype=f16"), "swin_export .onnx dtype=bf16: exit %d: %s",
               code2, out);
    snprintf(cmd, sizeof cmd, "./swin_export '%s' '%s' batch=0", ckpt, onnx_path);
    code2 = run(cmd, out, sizeof out);
    test_check(code2 == 2 && strstr(out, "batch=dynamic"), "swin_export batch=0: exit %d: %s",
               code2, out);
  }

  // The library's own errors.
  rc = onnx_export_swin(&m, tmp_path(onnx_path, sizeof onnx_path, "x.onnx"), DTYPE_BF16, 0, &err);
  test_check(rc != 0 && strstr(err.msg, "BF16") && strstr(err.msg, "HINT"),
             "onnx_export_swin refuses dtype BF16: %s", rc ? err.msg : "(accepted)");
  rc = onnx_export_swin(&m, onnx_path, DTYPE_F32, -2, &err);
  test_check(rc != 0 && strstr(err.msg, "batch"), "onnx_export_swin refuses batch -2: %s",
             rc ? err.msg : "(accepted)");
  rc = onnx_export_swin(&m, "/proc/swin_onnx_test/m.onnx", DTYPE_F32, 0, &err);
  test_check(rc != 0 && strstr(err.msg, "/proc/swin_onnx_test/m.onnx") && strstr(err.msg, "HINT"),
             "onnx_export_swin to an unwritable path: %s", rc ? err.msg : "(accepted)");
  OnnxModel big;
  onnx_model_init(&big);
  // Counted, never read: the size check comes before any byte is written.
  onnx_add_initializer(&big, "huge", ONNX_FLOAT, 1, (int64_t[]){(int64_t)1 << 29}, NULL, NULL);
  rc = onnx_model_save(&big, tmp_path(onnx_path, sizeof onnx_path, "huge.onnx"), &err);
  test_check(rc != 0 && strstr(err.msg, "2 GiB") && strstr(err.msg, "dtype=f16") &&
                 access(onnx_path, F_OK) != 0,
             "a model of 2 GiB is refused before writing: %s", rc ? err.msg : "(accepted)");
  onnx_model_free(&big);
  free(moments);
  model_destroy(&m);
  backend_destroy(&be);
}

int main(void) {
  if (!mkdtemp(dir)) return 1;
  test_reference_bytes();
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_case(&cases[i], (int)i);
  test_swin_export_program();
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) printf("note: could not remove %s\n", dir);
  return test_finish();
}
