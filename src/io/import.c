// import.c: timm / official state dicts <-> the model's flat fp32 weights.
#include "src/io/import.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/config.h"
#include "src/io/safetensors.h"

// Official checkpoints put patch merging at the end of stage i (layers.i.downsample) where timm
// puts it at the start of stage i+1, and name the head head.{weight,bias}.
static void official_to_timm(const char *name, char *out, size_t size) {
  int stage, n = 0;
  if (sscanf(name, "layers.%d.downsample.%n", &stage, &n) == 1 && n > 0) {
    snprintf(out, size, "layers.%d.downsample.%s", stage + 1, name + n);
  } else if (strncmp(name, "head.", 5) == 0) {
    snprintf(out, size, "head.fc.%s", name + 5);
  } else {
    snprintf(out, size, "%s", name);
  }
}

static bool is_buffer(const char *name) {
  return strstr(name, "relative_position_index") || strstr(name, "attn_mask");
}

static void shape_text(char *buf, size_t size, int ndim, const int64_t *shape) {
  int n = snprintf(buf, size, "(");
  for (int i = 0; i < ndim; i++)
    n += snprintf(buf + n, size - (size_t)n, "%s%lld", i ? ", " : "", (long long)shape[i]);
  snprintf(buf + n, size - (size_t)n, ")");
}

static void convert_to_f32(float *dst, const void *src, DType dtype, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    if (dtype == DTYPE_F32)
      memcpy(&dst[i], (const char *)src + 4 * i, 4);
    else {
      uint16_t h;
      memcpy(&h, (const char *)src + 2 * i, 2);
      dst[i] = dtype == DTYPE_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
  }
}

// Keys' cubic convolution with A = -0.75 (PyTorch's bicubic): weights of the taps at
// floor(x) - 1 .. floor(x) + 2 for the fraction t = x - floor(x).
static void cubic_weights(double t, double w[4]) {
  const double A = -0.75;
  double x = t + 1, y = 1 - t, z = 2 - t;
  w[0] = ((A * x - 5 * A) * x + 8 * A) * x - 4 * A;
  w[1] = ((A + 2) * t - (A + 3)) * t * t + 1;
  w[2] = ((A + 2) * y - (A + 3)) * y * y + 1;
  w[3] = ((A * z - 5 * A) * z + 8 * A) * z - 4 * A;
}

static int clamp_index(int i, int n) {
  return i < 0 ? 0 : i >= n ? n - 1 : i;
}

void bias_table_resize(const float *src, int sh, int sw, float *dst, int dh, int dw, int heads) {
  double scale_y = (double)sh / dh, scale_x = (double)sw / dw;
  for (int y = 0; y < dh; y++) {
    double fy = (y + 0.5) * scale_y - 0.5, wy[4];
    int y0 = (int)floor(fy);
    cubic_weights(fy - y0, wy);
    for (int x = 0; x < dw; x++) {
      double fx = (x + 0.5) * scale_x - 0.5, wx[4];
      int x0 = (int)floor(fx);
      cubic_weights(fx - x0, wx);
      for (int h = 0; h < heads; h++) {
        double v = 0;
        for (int i = 0; i < 4; i++) {
          const float *row = src + (int64_t)clamp_index(y0 - 1 + i, sh) * sw * heads;
          double r = 0;
          for (int j = 0; j < 4; j++)
            r += wx[j] * row[(int64_t)clamp_index(x0 - 1 + j, sw) * heads + h];
          v += wy[i] * r;
        }
        dst[((int64_t)y * dw + x) * heads + h] = (float)v;
      }
    }
  }
}

// A relative-position bias table of another window size (fine-tuning at another window or
// image size): the file's (S * S, heads) table, S = 2 W1 - 1 for its square window W1, resized
// to this stage's grid (2 wh - 1) x (2 ww - 1) into dst. Fails naming the tensor when the head
// counts differ or the file's row count is not an odd square.
static int resize_bias_table(const Model *m, const Param *p, const Tensor *got, float *dst,
                             const char *path, FILE *log, Error *err) {
  int stage = -1;
  sscanf(p->t.name, "layers.%d.", &stage);
  int64_t rows = got->ndim == 2 ? got->shape[0] : 0;
  int side = (int)llround(sqrt((double)rows));
  if (stage < 0 || stage >= m->num_stages || got->ndim != 2 || got->shape[1] != p->t.shape[1] ||
      (int64_t)side * side != rows || side % 2 == 0)
    return error_set(err,
                     "init_from '%s': tensor '%s' has shape (%lld, %lld); this model's is (%lld, "
                     "%lld): a bias table can be resized to another window only with the same "
                     "head count and a square window in the file\n"
                     "HINT: check model.num_heads",
                     path, p->t.name, (long long)(got->ndim > 0 ? got->shape[0] : 0),
                     (long long)(got->ndim > 1 ? got->shape[1] : 0), (long long)p->t.shape[0],
                     (long long)p->t.shape[1]);
  const StageGeom *g = &m->stages[stage];
  int heads = (int)p->t.shape[1];
  float *src = malloc_check(sizeof(float) * (size_t)rows * (size_t)heads);
  convert_to_f32(src, got->data, got->dtype, rows * heads);
  bias_table_resize(src, side, side, dst, 2 * g->wh - 1, 2 * g->ww - 1, heads);
  free(src);
  if (log)
    fprintf(log,
            "init_from: notice: %s resized from window %dx%d to %dx%d (bicubic, as the official "
            "load_pretrained)\n",
            p->t.name, (side + 1) / 2, (side + 1) / 2, g->wh, g->ww);
  return 0;
}

int import_weights(Model *m, const char *path, FILE *log, Error *err) {
  SafeTensors st;
  if (safetensors_read(&st, path, err) != 0) return error_prefix(err, "init_from: ");
  bool official = !safetensors_find(&st, "head.fc.weight") && safetensors_find(&st, "head.weight");
  bool *seen = calloc_check((size_t)m->num_params, sizeof(bool));
  float *staged = malloc_check(sizeof(float) * (size_t)m->num_floats);
  memcpy(staged, m->weights, sizeof(float) * (size_t)m->num_floats);
  bool new_head = false;
  int rc = -1;
  for (int i = 0; i < st.count; i++) {
    const SafeTensorEntry *e = &st.entries[i];
    if (is_buffer(e->name)) continue;
    char name[256];
    if (official)
      official_to_timm(e->name, name, sizeof name);
    else
      snprintf(name, sizeof name, "%s", e->name);
    const Param *p = model_find_param(m, name);
    if (!p) {
      error_set(err,
                "init_from '%s': tensor '%s' does not exist in this model\n"
                "HINT: the file is for another architecture; compare its model.* settings",
                path, e->name);
      goto done;
    }
    if (e->dtype != DTYPE_F32 && e->dtype != DTYPE_BF16 && e->dtype != DTYPE_F16) {
      error_set(err, "init_from '%s': tensor '%s' has dtype %s; expected F32, BF16 or F16", path,
                e->name, dtype_name(e->dtype));
      goto done;
    }
    Tensor got = safetensors_entry_tensor(&st, e);
    if (!tensor_same_shape(&got, &p->t)) {
      if (strstr(p->t.name, ".relative_position_bias_table")) {
        if (resize_bias_table(m, p, &got, staged + p->offset, path, log, err) != 0) goto done;
      } else {
        char got[96], want[96];
        shape_text(got, sizeof got, e->ndim, e->shape);
        shape_text(want, sizeof want, p->t.ndim, p->t.shape);
        // Fine-tuning to another class count: only dim 0 of head.fc.* differs; keep the fresh head.
        bool head = strncmp(p->t.name, "head.fc.", 8) == 0 && e->ndim == p->t.ndim;
        for (int d = 1; head && d < p->t.ndim; d++) head = e->shape[d] == p->t.shape[d];
        if (head) {
          new_head = true;
          seen[p - m->params] = true;
          continue;
        }
        error_set(err,
                  "init_from '%s': tensor '%s' has shape %s, this model expects %s\n"
                  "HINT: check model.* (embed_dim, depths, num_heads, window_size, img_size)",
                  path, e->name, got, want);
        goto done;
      }
    } else {
      convert_to_f32(staged + p->offset, got.data, got.dtype, tensor_numel(&got));
    }
    int64_t bad = first_nonfinite(staged + p->offset, tensor_numel(&p->t));
    if (bad >= 0) {
      error_set(err,
                "init_from '%s': tensor '%s' holds %s (element %lld)\n"
                "HINT: the weights were saved from a diverged run; use another file",
                path, e->name, nonfinite_name(staged[p->offset + bad]), (long long)bad);
      goto done;
    }
    seen[p - m->params] = true;
  }
  for (int i = 0; i < m->num_params; i++)
    if (!seen[i]) {
      error_set(err, "init_from '%s': tensor '%s' is missing from the file", path,
                m->params[i].t.name);
      goto done;
    }
  memcpy(m->weights, staged, sizeof(float) * (size_t)m->num_floats);
  if (log) {
    fprintf(log, "init_from: loaded %s (%s layout)\n", path, official ? "official" : "timm");
    if (new_head)
      fprintf(log,
              "init_from: notice: the file's head has another class count; head.fc is "
              "freshly initialized for %d classes\n",
              m->cfg.num_classes);
  }
  rc = 0;
done:
  free(seen);
  free(staged);
  safetensors_free(&st);
  return rc;
}

int export_weights(const Model *m, const char *path, DType dtype, Error *err) {
  if (dtype != DTYPE_F32 && dtype != DTYPE_BF16 && dtype != DTYPE_F16)
    return error_set(err, "export: dtype must be f32, bf16 or f16");
  size_t esize = dtype_size(dtype);
  unsigned char *data = malloc_check(esize * (size_t)m->num_floats);
  for (int64_t i = 0; i < m->num_floats; i++) {
    float x = m->weights[i];
    if (dtype == DTYPE_F32)
      memcpy(data + 4 * i, &x, 4);
    else {
      uint16_t h = dtype == DTYPE_BF16 ? f32_to_bf16(x) : f32_to_f16(x);
      memcpy(data + 2 * i, &h, 2);
    }
  }
  SafeTensorWriter w;
  safetensors_writer_init(&w);
  safetensors_writer_meta(&w, "format", "pt");
  char *ini = config_to_ini(&m->cfg);
  safetensors_writer_meta(&w, "swin.config", ini);
  for (int i = 0; i < m->num_params; i++) {
    Tensor t = m->params[i].t;  // the table's description, over the converted copy
    t.dtype = dtype;
    t.data = data + esize * (size_t)m->params[i].offset;
    safetensors_writer_add_tensor(&w, &t);
  }
  int rc = safetensors_writer_save(&w, path, err);
  safetensors_writer_free(&w);
  free(ini);
  free(data);
  return rc;
}

int import_input_batch(const SafeTensors *st, const Config *cfg, const SafeTensorEntry **input,
                       Error *err) {
  const SafeTensorEntry *e = safetensors_find(st, "input");
  *input = NULL;
  if (!e || e->dtype != DTYPE_F32 || e->ndim != 4 || e->shape[1] != cfg->img_h ||
      e->shape[2] != cfg->img_w || e->shape[3] != cfg->in_chans)
    return error_set(err, "'%s' needs tensor 'input' F32 (B, %d, %d, %d)", st->path, cfg->img_h,
                     cfg->img_w, cfg->in_chans);
  // The batch becomes an int and sizes the activations: refuse what no forward pass can take.
  if (e->shape[0] < 1 || e->shape[0] > INPUT_BATCH_MAX)
    return error_set(err, "'%s': tensor 'input' has a batch of %lld images; 1 to %d are accepted",
                     st->path, (long long)e->shape[0], INPUT_BATCH_MAX);
  *input = e;
  return 0;
}
