// import.c: timm / official state dicts <-> the model's flat fp32 weights.
#include "src/io/import.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/config.h"
#include "src/io/checkpoint.h"
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
  return strstr(name, "relative_position_index") || strstr(name, "attn_mask") ||
         strstr(name, "relative_coords_table");
}

// The Swin version a state dict's block tensors belong to: 2 with V2's position-bias MLP or logit
// scale, 1 with V1's bias table, 0 when it has neither.
static int file_version(const SafeTensors *st) {
  for (int i = 0; i < st->count; i++) {
    const char *n = st->entries[i].name;
    if (strstr(n, ".attn.cpb_mlp.") || strstr(n, ".attn.logit_scale")) return 2;
    if (strstr(n, ".attn.relative_position_bias_table")) return 1;
  }
  return 0;
}

// A V2 source written by swin.c (a checkpoint's "config", an export's "swin.config") whose
// position-bias coordinates were normalized by other windows than this model's: a notice with
// the model.pretrained_window_sizes that keeps the source's coordinates (what timm's *to* models
// and the official fine-tuning configs set). The key stays the user's: nothing is changed.
static void notice_pretrained_windows(const Model *m, const SafeTensors *st, FILE *log) {
  const char *ini = safetensors_meta_get(st, "config");
  if (!ini) ini = safetensors_meta_get(st, "swin.config");
  Config src;
  Error ignored;
  config_defaults(&src);
  if (!log || !ini || config_load_string(&src, ini, "init_from", &ignored) != 0 ||
      src.version != 2 || src.num_stages != m->num_stages)
    return;
  char theirs[128] = "", ours[128] = "";
  bool differ = false;
  for (int s = 0; s < m->num_stages; s++) {
    int H = (src.img_h / src.patch_size) >> s, W = (src.img_w / src.patch_size) >> s;
    int sh = H < src.window_size ? H : src.window_size,
        sw = W < src.window_size ? W : src.window_size;
    int pw = src.pretrained_windows[src.num_pretrained_windows == 1 ? 0 : s];
    int was = pw > 0 ? pw : sh;
    int now = m->cfg.pretrained_windows[m->cfg.num_pretrained_windows == 1 ? 0 : s];
    const StageGeom *g = &m->stages[s];
    if (pw == 0 && sh != sw) return;  // rectangular windows: no single side to name
    differ |= (now > 0 ? now : g->wh) != was || (now > 0 ? now : g->ww) != was;
    size_t n = strlen(theirs), k = strlen(ours);
    snprintf(theirs + n, sizeof theirs - n, "%s%d", s ? "," : "", was);
    snprintf(ours + k, sizeof ours - k, "%s%d", s ? "," : "", now > 0 ? now : g->wh);
  }
  if (differ)
    fprintf(
        log,
        "init_from: notice: the source's position-bias coordinates were normalized by "
        "windows %s, this model's by %s; set model.pretrained_window_sizes=%s to keep the "
        "source's (as timm's swinv2_*_window12to16_* models and the official fine-tuning configs "
        "do)\n",
        theirs, ours, theirs);
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

// init_head_map: `classes` lines, line i the index in init_from's head of this model's class i.
static int read_head_map(const char *path, int classes, int64_t source_classes, int64_t **out,
                         Error *err) {
  FILE *f = fopen(path, "r");
  if (!f)
    return error_set(err, "init_head_map: cannot open '%s': %s\nHINT: check the path", path,
                     strerror(errno));
  int64_t *map = malloc_check(sizeof(int64_t) * (size_t)classes);
  char line[128];
  int n = 0, rc = 0;
  while (rc == 0 && fgets(line, sizeof line, f)) {
    char *end;
    errno = 0;
    long long v = strtoll(line, &end, 10);
    while (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n') end++;
    if (end == line || *end || errno)
      rc = error_set(err, "init_head_map %s:%d: '%.40s' is not a class index", path, n + 1,
                     strtok(line, "\r\n"));
    else if (v < 0 || v >= source_classes)
      rc = error_set(err,
                     "init_head_map %s:%d: class %lld is outside init_from's head of %lld classes",
                     path, n + 1, v, (long long)source_classes);
    else if (n < classes)
      map[n] = v;
    n++;
  }
  fclose(f);
  if (rc == 0 && n != classes)
    rc = error_set(err,
                   "init_head_map '%s' has %d lines, but model.num_classes is %d\n"
                   "HINT: one line per class of this model, each a class index of init_from's head",
                   path, n, classes);
  if (rc != 0) {
    free(map);
    return -1;
  }
  *out = map;
  return 0;
}

// head.fc.* with init_head_map: row i of this model's tensor is row map[i] of the file's.
static int map_head(const Param *p, const Tensor *got, const int64_t *map, float *dst,
                    const char *path, Error *err) {
  bool ok = got->ndim == p->t.ndim;
  for (int d = 1; ok && d < p->t.ndim; d++) ok = got->shape[d] == p->t.shape[d];
  if (!ok)
    return error_set(err,
                     "init_from '%s': tensor '%s' has another shape than this model's beyond "
                     "its class dimension\nHINT: check model.* (embed_dim, depths)",
                     path, p->t.name);
  int64_t row = tensor_numel(&p->t) / p->t.shape[0];
  float *src = malloc_check(sizeof(float) * (size_t)tensor_numel(got));
  convert_to_f32(src, got->data, got->dtype, tensor_numel(got));
  for (int64_t i = 0; i < p->t.shape[0]; i++)
    memcpy(dst + i * row, src + map[i] * row, sizeof(float) * (size_t)row);
  free(src);
  return 0;
}

int import_weights(Model *m, const char *path, FILE *log, Error *err) {
  SafeTensors st;
  if (safetensors_read(&st, path, err) != 0) return error_prefix(err, "init_from: ");
  bool official = !safetensors_find(&st, "head.fc.weight") && safetensors_find(&st, "head.weight");
  // A swin.c checkpoint gives its weights; its optimizer moments and its moving average of the
  // weights stay behind (a fresh run; export weights=ema to start from the average).
  const char *format = safetensors_meta_get(&st, "format");
  bool checkpoint = format && strcmp(format, CHECKPOINT_FORMAT) == 0;
  int version = file_version(&st);
  if (version && version != m->cfg.version) {
    error_set(err,
              "init_from '%s' holds Swin V%d weights (%s), but this model is model.version = %d\n"
              "HINT: V1 and V2 blocks differ in every layer (V2: res-post-norm, cosine attention, "
              "the position-bias MLP): start from V%d weights, or set model.version = %d",
              path, version,
              version == 2 ? "attn.cpb_mlp, attn.logit_scale" : "attn.relative_position_bias_table",
              m->cfg.version, m->cfg.version, version);
    safetensors_free(&st);
    return -1;
  }
  bool *seen = calloc_check((size_t)m->num_params, sizeof(bool));
  float *staged = malloc_check(sizeof(float) * (size_t)m->num_floats);
  memcpy(staged, m->weights, sizeof(float) * (size_t)m->num_floats);
  bool new_head = false;
  int64_t *head_map = NULL, head_classes = 0;  // init_head_map's rows, the file's class count
  int rc = -1;
  for (int i = 0; i < st.count; i++) {
    const SafeTensorEntry *e = &st.entries[i];
    if (is_buffer(e->name) ||
        (checkpoint && (strncmp(e->name, "optim.", 6) == 0 || strncmp(e->name, "ema.", 4) == 0)))
      continue;
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
    const char *map_path = m->cfg.init_head_map;
    if (map_path[0] && strncmp(p->t.name, "head.fc.", 8) == 0) {
      if ((!head_map && read_head_map(map_path, m->cfg.num_classes, got.ndim ? got.shape[0] : 0,
                                      &head_map, err) != 0) ||
          map_head(p, &got, head_map, staged + p->offset, path, err) != 0)
        goto done;
      head_classes = got.shape[0];
    } else if (!tensor_same_shape(&got, &p->t)) {
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
  notice_pretrained_windows(m, &st, log);
  if (log) {
    fprintf(log, "init_from: loaded %s (%s)\n", path,
            checkpoint ? "a swin.c checkpoint's weights, without its optimizer state"
            : official ? "official layout"
                       : "timm layout");
    if (new_head)
      fprintf(log,
              "init_from: notice: the file's head has another class count; head.fc is "
              "freshly initialized for %d classes (trunc-normal std 0.02 and bias 0, as timm)\n",
              m->cfg.num_classes);
    if (head_map)
      fprintf(log,
              "init_from: head.fc: the rows of %d classes kept from the file's %lld by "
              "init_head_map %s\n",
              m->cfg.num_classes, (long long)head_classes, m->cfg.init_head_map);
  }
  rc = 0;
done:
  free(head_map);
  free(seen);
  free(staged);
  safetensors_free(&st);
  return rc;
}

int export_weights(const Model *m, const char *path, DType dtype, const char *class_names,
                   Error *err) {
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
  if (class_names) safetensors_writer_meta(&w, "swin.class_names", class_names);
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
