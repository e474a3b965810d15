// test_export.c: weights out and in. Export then import is bit-exact in f32 and within the
// format's precision in bf16/f16; import understands the official layout; a different class
// count replaces the head with a notice; bias tables follow another window size; a missing,
// extra or misshapen tensor is named. Swin V2: the same round trip; a V1 file into a V2 model and
// the reverse are refused; another window loads as it is (nothing depends on it), with a notice
// naming the model.pretrained_window_sizes that keeps the source's coordinates.
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <unistd.h>

#include "src/io/import.h"
#include "src/io/safetensors.h"
#include "src/model/model.h"
#include "tests/util/test_model_config.h"
#include "tests/util/test_util.h"

static char dir[] = "/tmp/swin_test_export_XXXXXX";

static Config small(int classes) {
  return test_model_config((TestModel){.img_h = 16,
                                       .chans = 3,
                                       .patch = 2,
                                       .embed = 8,
                                       .window = 4,
                                       .classes = classes,
                                       .depths = {2, 2},
                                       .heads = {2, 4}});
}

static void make_from(Model *m, const Config *cfg, uint64_t seed) {
  Config c = *cfg;
  Error err;
  if (model_create(m, &c, NULL, 0, &err) != 0) {
    printf("model_create: %s\n", err.msg);
    exit(1);
  }
  model_init_weights(m, seed);
  TestRng r = {seed};  // non-trivial values everywhere (init leaves biases at 0, LN at 1)
  for (int i = 0; i < m->num_params; i++)  // tensor by tensor: the alignment gaps stay zero
    test_fill_uniform(&r, m->weights + m->params[i].offset, tensor_numel(&m->params[i].t), -1, 1);
}

static void make(Model *m, int classes, uint64_t seed) {
  Config c = small(classes);
  make_from(m, &c, seed);
}

static char *path(const char *name) {
  static char p[4][256];
  static int k;
  k = (k + 1) % 4;
  snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
  return p[k];
}

// Rewrites a safetensors file with one tensor renamed, dropped or reshaped, or one added.
static void write_variant(const Model *m, const char *file, const char *rename_from,
                          const char *rename_to, bool add_extra, bool bad_shape) {
  SafeTensorWriter w;
  safetensors_writer_init(&w);
  static float extra[4];
  for (int i = 0; i < m->num_params; i++) {
    const Param *p = &m->params[i];
    const char *name = p->t.name;
    int64_t shape[4] = {p->t.shape[0], p->t.shape[1], p->t.shape[2], p->t.shape[3]};
    if (rename_from && strcmp(name, rename_from) == 0) {
      if (!rename_to) continue;  // dropped
      name = rename_to;
    }
    if (bad_shape && strcmp(name, "layers.1.blocks.0.mlp.fc1.weight") == 0) {
      shape[0] = p->t.shape[1], shape[1] = p->t.shape[0];  // transposed
    }
    safetensors_writer_add(&w, name, DTYPE_F32, p->t.ndim, shape, m->weights + p->offset);
  }
  if (add_extra)
    safetensors_writer_add(&w, "layers.9.extra.weight", DTYPE_F32, 1, (int64_t[]){4}, extra);
  Error err;
  if (safetensors_writer_save(&w, file, &err) != 0) printf("save: %s\n", err.msg);
  safetensors_writer_free(&w);
}

int main(void) {
  if (!mkdtemp(dir)) return 1;
  Model a, b;
  Error err;
  make(&a, 10, 1);
  make(&b, 10, 2);

  // f32: bit-exact.
  test_check(export_weights(&a, path("a_f32.safetensors"), DTYPE_F32, NULL, &err) == 0,
             "export f32");
  test_check(import_weights(&b, path("a_f32.safetensors"), NULL, &err) == 0, "import f32: %s",
             err.msg);
  test_check(memcmp(a.weights, b.weights, sizeof(float) * a.num_floats) == 0,
             "export then import f32 is bit-exact");

  // bf16 / f16: within half an ulp of the format: 2^-8 (7 stored mantissa bits) and 2^-11
  // (10 bits) relative per element, with values below 1e-4 measured against 1e-4.
  struct {
    DType dtype;
    double tol;
  } halfs[] = {{DTYPE_BF16, 1.0 / 256}, {DTYPE_F16, 1.0 / 2048}};
  for (int i = 0; i < 2; i++) {
    char *p = path(halfs[i].dtype == DTYPE_BF16 ? "a_bf16.safetensors" : "a_f16.safetensors");
    test_check(export_weights(&a, p, halfs[i].dtype, NULL, &err) == 0, "export %s",
               dtype_name(halfs[i].dtype));
    test_check(import_weights(&b, p, NULL, &err) == 0, "import %s", dtype_name(halfs[i].dtype));
    double worst = 0;
    for (int64_t j = 0; j < a.num_floats; j++) {
      double e = fabs((double)b.weights[j] - a.weights[j]) / fmax(fabs(a.weights[j]), 1e-4);
      if (e > worst) worst = e;
    }
    test_check(worst <= halfs[i].tol, "%s round trip: worst element rel err %.2e (tol %.2e)",
               dtype_name(halfs[i].dtype), worst, halfs[i].tol);
  }

  // Official layout: downsample at the end of the previous stage, head.{weight,bias}, buffers.
  {
    SafeTensorWriter w;
    safetensors_writer_init(&w);
    char names[64][128];
    int n = 0;
    static int index_buffer[256];
    for (int i = 0; i < a.num_params; i++) {
      const Param *p = &a.params[i];
      int s, k = 0;
      if (sscanf(p->t.name, "layers.%d.downsample.%n", &s, &k) == 1 && k > 0)
        snprintf(names[n], sizeof names[n], "layers.%d.downsample.%s", s - 1, p->t.name + k);
      else if (strncmp(p->t.name, "head.fc.", 8) == 0)
        snprintf(names[n], sizeof names[n], "head.%s", p->t.name + 8);
      else
        continue;
      safetensors_writer_add(&w, names[n++], DTYPE_F32, p->t.ndim, p->t.shape,
                             a.weights + p->offset);
    }
    for (int i = 0; i < a.num_params; i++) {
      const Param *p = &a.params[i];
      if (strstr(p->t.name, "downsample") || strncmp(p->t.name, "head.", 5) == 0) continue;
      safetensors_writer_add(&w, p->t.name, DTYPE_F32, p->t.ndim, p->t.shape,
                             a.weights + p->offset);
    }
    safetensors_writer_add(&w, "layers.0.blocks.0.attn.relative_position_index", DTYPE_I32, 2,
                           (int64_t[]){16, 16}, index_buffer);
    safetensors_writer_save(&w, path("official.safetensors"), &err);
    safetensors_writer_free(&w);
    memset(b.weights, 0, sizeof(float) * b.num_floats);
    int rc = import_weights(&b, path("official.safetensors"), NULL, &err);
    test_check(rc == 0 && memcmp(a.weights, b.weights, sizeof(float) * a.num_floats) == 0,
               "official layout imports to the same weights%s%s", rc ? ": " : "",
               rc ? err.msg : "");
  }

  // Another window size (fine-tuning 16 px / window 4 at 24 px / window 6): every bias table
  // is resized by bias_table_resize from the file's 7x7 grid to 11x11, with a notice each; a
  // table with another head count is an error naming it.
  {
    Config wide = small(10);
    wide.img_h = wide.img_w = 24;
    wide.window_size = 6;
    Model c;
    if (model_create(&c, &wide, NULL, 0, &err) != 0) {
      test_check(0, "window-6 model: %s", err.msg);
    } else {
      FILE *log = tmpfile();
      int rc = import_weights(&c, path("a_f32.safetensors"), log, &err);
      char text[4096] = {0};
      rewind(log);
      text[fread(text, 1, sizeof text - 1, log)] = 0;
      fclose(log);
      int resized = 0, wrong = 0;
      for (int i = 0; rc == 0 && i < c.num_params; i++) {
        const Param *pc = &c.params[i];
        if (!strstr(pc->t.name, "relative_position_bias_table")) continue;
        const Param *pa = model_find_param(&a, pc->t.name);
        int heads = (int)pc->t.shape[1];
        float want[121 * 4];
        bias_table_resize(a.weights + pa->offset, 7, 7, want, 11, 11, heads);
        wrong += pc->t.shape[0] != 121 ||
                 memcmp(want, c.weights + pc->offset, sizeof(float) * 121 * (size_t)heads) != 0;
        resized++;
      }
      test_check(rc == 0 && resized == 4 && wrong == 0 &&
                     strstr(text,
                            "layers.1.blocks.1.attn.relative_position_bias_table resized "
                            "from window 4x4 to 6x6"),
                 "window 4 -> 6: %d bias tables resized (want 4), %d differ from "
                 "bias_table_resize%s%s",
                 resized, wrong, rc ? ": " : "", rc ? err.msg : "");
      model_destroy(&c);
    }
    wide.num_heads[0] = 4;
    if (model_create(&c, &wide, NULL, 0, &err) == 0) {
      int rc = import_weights(&c, path("a_f32.safetensors"), NULL, &err);
      test_check(
          rc != 0 && strstr(err.msg, "layers.0.blocks.0.attn.relative_position_bias_table") &&
              strstr(err.msg, "same head count"),
          "a bias table with 2 heads into a model with 4 is refused, naming it: %s", err.msg);
      model_destroy(&c);
    }
  }

  // init_head_map keeps the mapped rows of a larger head (22k -> 1k); a missing file, a map of
  // the wrong length, an index outside the file's head and a non-number are named.
  {
    Model c;
    make(&c, 4, 3);
    char map[256];  // path()'s buffers rotate
    snprintf(map, sizeof map, "%s", path("map.txt"));
    struct {
      const char *text, *want;  // want NULL: accepted
    } maps[] = {
        {"7\n2\n9\n0\n", NULL},
        {NULL, "cannot open"},
        {"7\n2\n9\n", "has 3 lines, but model.num_classes is 4"},
        {"7\n2\n10\n0\n", "map.txt:3: class 10 is outside init_from's head of 10 classes"},
        {"7\n2x\n9\n0\n", "map.txt:2: '2x' is not a class index"},
    };
    for (size_t k = 0; k < sizeof maps / sizeof maps[0]; k++) {
      remove(map);
      if (maps[k].text) {
        FILE *f = fopen(map, "w");
        fputs(maps[k].text, f);
        fclose(f);
      }
      snprintf(c.cfg.init_head_map, sizeof c.cfg.init_head_map, "%s", map);
      int rc = import_weights(&c, path("a_f32.safetensors"), NULL, &err);
      if (maps[k].want) {
        test_check(rc != 0 && strstr(err.msg, maps[k].want), "init_head_map refused (%s): %s",
                   maps[k].want, rc ? err.msg : "accepted");
        continue;
      }
      const Param *cw = model_find_param(&c, "head.fc.weight"),
                  *aw = model_find_param(&a, "head.fc.weight");
      const Param *cb = model_find_param(&c, "head.fc.bias"),
                  *ab = model_find_param(&a, "head.fc.bias");
      int64_t row = cw->t.shape[1], wrong = 0, want_rows[4] = {7, 2, 9, 0};
      for (int i = 0; rc == 0 && i < 4; i++)
        wrong +=
            memcmp(c.weights + cw->offset + i * row, a.weights + aw->offset + want_rows[i] * row,
                   sizeof(float) * (size_t)row) != 0 ||
            c.weights[cb->offset + i] != a.weights[ab->offset + want_rows[i]];
      test_check(rc == 0 && wrong == 0,
                 "init_head_map 7,2,9,0: head rows kept from the 10-class head (%lld wrong)%s%s",
                 (long long)wrong, rc ? ": " : "", rc ? err.msg : "");
    }
    model_destroy(&c);
  }

  // Another class count: the head is replaced, with a notice.
  {
    Model c;
    make(&c, 4, 3);
    float head0 = c.weights[model_find_param(&c, "head.fc.weight")->offset];
    FILE *log = tmpfile();
    int rc = import_weights(&c, path("a_f32.safetensors"), log, &err);
    char text[1024] = {0};
    rewind(log);
    size_t got = fread(text, 1, sizeof text - 1, log);
    text[got] = 0;
    fclose(log);
    const Param *pw = model_find_param(&c, "layers.0.blocks.0.mlp.fc1.weight");
    const Param *qa = model_find_param(&a, "layers.0.blocks.0.mlp.fc1.weight");
    test_check(rc == 0 && strstr(text, "freshly initialized for 4 classes") &&
                   c.weights[model_find_param(&c, "head.fc.weight")->offset] == head0 &&
                   memcmp(c.weights + pw->offset, a.weights + qa->offset,
                          sizeof(float) * tensor_numel(&pw->t)) == 0,
               "num_classes 10 -> 4: body loaded, head kept fresh, notice printed");
    model_destroy(&c);
  }

  // Missing, extra, misshapen tensors are named.
  struct {
    const char *what, *from, *to;
    bool extra, shape;
    const char *expect;
  } bad[] = {
      {"missing tensor", "layers.0.blocks.1.norm2.bias", NULL, false, false,
       "'layers.0.blocks.1.norm2.bias' is missing"},
      {"extra tensor", NULL, NULL, true, false, "'layers.9.extra.weight' does not exist"},
      {"misshapen tensor", NULL, NULL, false, true,
       "'layers.1.blocks.0.mlp.fc1.weight' has shape (16, 64)"},
  };
  for (int i = 0; i < 3; i++) {
    write_variant(&a, path("bad.safetensors"), bad[i].from, bad[i].to, bad[i].extra, bad[i].shape);
    memcpy(b.weights, a.weights, sizeof(float) * a.num_floats);
    b.weights[0] += 1;
    float before = b.weights[0];
    int rc = import_weights(&b, path("bad.safetensors"), NULL, &err);
    test_check(rc != 0 && strstr(err.msg, bad[i].expect) && b.weights[0] == before,
               "%s refused, model untouched: %.150s", bad[i].what, err.msg);
  }
  test_check(import_weights(&b, path("none.safetensors"), NULL, &err) != 0 &&
                 strstr(err.msg, "none.safetensors"),
             "missing file named: %.100s", err.msg);

  // Swin V2.
  Config v2 = small(10);
  v2.version = 2;
  Model c, d;
  make_from(&c, &v2, 3);
  make_from(&d, &v2, 4);
  test_check(export_weights(&c, path("v2.safetensors"), DTYPE_F32, NULL, &err) == 0 &&
                 import_weights(&d, path("v2.safetensors"), NULL, &err) == 0 &&
                 memcmp(c.weights, d.weights, sizeof(float) * c.num_floats) == 0,
             "V2: export then import f32 is bit-exact (%d tensors)", c.num_params);
  int rc = import_weights(&a, path("v2.safetensors"), NULL, &err);
  test_check(
      rc != 0 && strstr(err.msg, "holds Swin V2 weights") && strstr(err.msg, "model.version = 1"),
      "V2 weights into a V1 model refused: %.160s", err.msg);
  rc = import_weights(&d, path("a_f32.safetensors"), NULL, &err);
  test_check(
      rc != 0 && strstr(err.msg, "holds Swin V1 weights") && strstr(err.msg, "model.version = 2"),
      "V1 weights into a V2 model refused: %.160s", err.msg);
  // Window 4 -> 6 (24 px: 12x12 and 6x6 maps): every tensor keeps its shape.
  Config v2w6 = v2;
  v2w6.img_h = v2w6.img_w = 24;
  v2w6.window_size = 6;
  Model e;
  make_from(&e, &v2w6, 5);
  FILE *log = tmpfile();
  rc = import_weights(&e, path("v2.safetensors"), log, &err);
  char text[2048] = "";
  rewind(log);
  size_t got = fread(text, 1, sizeof text - 1, log);
  text[got] = 0;
  fclose(log);
  test_check(rc == 0 && memcmp(c.weights, e.weights, sizeof(float) * c.num_floats) == 0 &&
                 !strstr(text, "resized") &&
                 strstr(text, "set model.pretrained_window_sizes=4,4 to keep"),
             "V2 at window 6 from window 4: loaded as it is, nothing resized, the notice names "
             "pretrained_window_sizes=4,4 (rc %d): %.200s",
             rc, text);
  e.cfg.pretrained_windows[0] = 4;  // what the notice asks for: no notice then
  log = tmpfile();
  rc = import_weights(&e, path("v2.safetensors"), log, &err);
  got = (rewind(log), fread(text, 1, sizeof text - 1, log));
  text[got] = 0;
  fclose(log);
  test_check(rc == 0 && !strstr(text, "pretrained_window_sizes"),
             "V2 with model.pretrained_window_sizes=4: no notice");
  model_destroy(&c);
  model_destroy(&d);
  model_destroy(&e);

  model_destroy(&a);
  model_destroy(&b);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) printf("note: could not remove %s\n", dir);
  return test_finish();
}
