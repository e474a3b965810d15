// checkpoint.c: save, load and list checkpoints (format in checkpoint.h).
#define _POSIX_C_SOURCE 200809L  // opendir, readdir: POSIX, not C11
#include "src/io/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/config.h"
#include "src/io/safetensors.h"

// A moment's name: "optim.exp_avg_sq." and a parameter's (TENSOR_NAME_MAX with its NUL).
#define CHECKPOINT_NAME_MAX (sizeof "optim.exp_avg_sq." + TENSOR_NAME_MAX)

// suffix: "" for a checkpoint, ".tmp" for the temp file a save writes first.
static bool parse_checkpoint_name(const char *name, const char *suffix, int64_t *step) {
  long long s;
  int n = 0;
  if (sscanf(name, "ckpt-%lld.safetensors%n", &s, &n) != 1 || strcmp(name + n, suffix) != 0)
    return false;
  *step = s;
  return true;
}

typedef struct {
  int64_t step;
  char *path;
} Listed;

static int newest_first(const void *a, const void *b) {
  int64_t x = ((const Listed *)a)->step, y = ((const Listed *)b)->step;
  return (x < y) - (x > y);
}

int checkpoint_list(const char *dir, char ***paths) {
  *paths = NULL;
  DIR *d = opendir(dir);
  if (!d) return 0;
  Listed *list = NULL;
  int count = 0, cap = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    int64_t step;
    if (!parse_checkpoint_name(e->d_name, "", &step)) continue;
    if (count == cap) {
      cap = cap ? 2 * cap : 16;
      list = realloc(list, sizeof(Listed) * (size_t)cap);
      if (!list) abort();
    }
    size_t len = strlen(dir) + strlen(e->d_name) + 2;
    list[count].step = step;
    list[count].path = malloc_check(len);
    snprintf(list[count].path, len, "%s/%s", dir, e->d_name);
    count++;
  }
  closedir(d);
  if (count > 1) qsort(list, (size_t)count, sizeof(Listed), newest_first);  // list may be NULL
  *paths = malloc_check(sizeof(char *) * (size_t)(count ? count : 1));
  for (int i = 0; i < count; i++) (*paths)[i] = list[i].path;
  free(list);
  return count;
}

void checkpoint_list_free(char **paths, int count) {
  for (int i = 0; i < count; i++) free(paths[i]);
  free(paths);
}

int checkpoint_remove_stale_temps(const char *dir, Error *err) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  int removed = 0, rc = 0;
  struct dirent *e;
  while (rc == 0 && (e = readdir(d))) {
    int64_t step;
    if (!parse_checkpoint_name(e->d_name, ".tmp", &step)) continue;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (remove(path) == 0)
      removed++;
    else
      rc = error_set(err,
                     "cannot remove the partial checkpoint '%s' left by an interrupted save: %s\n"
                     "HINT: check the permissions of run_dir",
                     path, strerror(errno));
  }
  closedir(d);
  return rc == 0 ? removed : -1;
}

// A checkpoint of NaN or infinite values would only be resumed from to fail again: refuse it,
// naming the first bad tensor, before anything is written.
static int check_finite_state(const Model *m, const float *exp_avg, const float *exp_avg_sq,
                              const float *ema, const char *path, Error *err) {
  const float *buffers[4] = {m->weights, exp_avg, exp_avg_sq, ema};
  const char *prefixes[4] = {"", "optim.exp_avg.", "optim.exp_avg_sq.", "ema."};
  for (int b = 0; b < (ema ? 4 : 3); b++)
    for (int i = 0; i < m->num_params; i++) {
      const Param *p = &m->params[i];
      const float *x = buffers[b] + p->offset;
      int64_t bad = first_nonfinite(x, tensor_numel(&p->t));
      if (bad >= 0)
        return error_set(err,
                         "refusing to write checkpoint '%s': tensor '%s%s' holds %s (element "
                         "%lld)\nHINT: the run diverged; lower train.lr or raise "
                         "train.warmup_epochs, then resume=auto continues from the last "
                         "checkpoint",
                         path, prefixes[b], p->t.name, nonfinite_name(x[bad]), (long long)bad);
    }
  return 0;
}

int checkpoint_save(const char *dir, const Model *m, const float *exp_avg, const float *exp_avg_sq,
                    const float *ema, const TrainState *state, const char *class_names, int keep,
                    char *path_out, size_t path_size, Error *err) {
  char path[1024], value[64];
  snprintf(path, sizeof path, "%s/ckpt-%08lld.safetensors", dir, (long long)state->step);
  if (check_finite_state(m, exp_avg, exp_avg_sq, ema, path, err) != 0) return -1;
  if (make_directories(dir, "check run_dir", err) != 0) return -1;

  SafeTensorWriter w;
  safetensors_writer_init(&w);
  safetensors_writer_meta(&w, "format", CHECKPOINT_FORMAT);
  snprintf(value, sizeof value, "%d", CHECKPOINT_VERSION);
  safetensors_writer_meta(&w, "format_version", value);
  char *ini = config_to_ini(&m->cfg);
  safetensors_writer_meta(&w, "config", ini);
  snprintf(value, sizeof value, "%lld", (long long)state->step);
  safetensors_writer_meta(&w, "step", value);
  snprintf(value, sizeof value, "%lld", (long long)state->epoch);
  safetensors_writer_meta(&w, "epoch", value);
  snprintf(value, sizeof value, "%lld", (long long)state->batch);
  safetensors_writer_meta(&w, "batch", value);
  snprintf(value, sizeof value, "%" PRIu64, state->seed);
  safetensors_writer_meta(&w, "seed", value);
  snprintf(value, sizeof value, "%.17g", state->loss_scale);
  safetensors_writer_meta(&w, "loss_scale", value);
  snprintf(value, sizeof value, "%d", state->scale_good_steps);
  safetensors_writer_meta(&w, "loss_scale_good_steps", value);
  snprintf(value, sizeof value, "%" PRId64, state->skipped);
  safetensors_writer_meta(&w, "skipped_steps", value);
  snprintf(value, sizeof value, "%d", state->world);
  safetensors_writer_meta(&w, "world_size", value);
  if (class_names) safetensors_writer_meta(&w, "class_names", class_names);

  // The weights, then both moments of every tensor under the same name with a prefix (the
  // writer copies the names).
  for (int i = 0; i < m->num_params; i++) {
    Tensor t = model_param_view(m, i, m->weights);
    safetensors_writer_add_tensor(&w, &t);
  }
  for (int i = 0; i < m->num_params; i++) {
    const Param *p = &m->params[i];
    char name[CHECKPOINT_NAME_MAX];
    snprintf(name, sizeof name, "optim.exp_avg.%s", p->t.name);
    safetensors_writer_add(&w, name, DTYPE_F32, p->t.ndim, p->t.shape, exp_avg + p->offset);
    snprintf(name, sizeof name, "optim.exp_avg_sq.%s", p->t.name);
    safetensors_writer_add(&w, name, DTYPE_F32, p->t.ndim, p->t.shape, exp_avg_sq + p->offset);
  }
  for (int i = 0; ema && i < m->num_params; i++) {
    const Param *p = &m->params[i];
    char name[CHECKPOINT_NAME_MAX];
    snprintf(name, sizeof name, "ema.%s", p->t.name);
    safetensors_writer_add(&w, name, DTYPE_F32, p->t.ndim, p->t.shape, ema + p->offset);
  }
  int rc = safetensors_writer_save(&w, path, err);
  safetensors_writer_free(&w);
  free(ini);
  if (rc != 0) return error_prefix(err, "writing checkpoint: ");
  if (path_out) snprintf(path_out, path_size, "%s", path);

  // Keep the newest `keep`: older ones go only after the new one is safely on disk.
  char **paths;
  int count = checkpoint_list(dir, &paths);
  for (int i = keep; i < count; i++) remove(paths[i]);
  checkpoint_list_free(paths, count);
  return 0;
}

static int meta_int(const SafeTensors *st, const char *key, int64_t *out, Error *err) {
  const char *v = safetensors_meta_get(st, key);
  char *end;
  if (!v) return error_set(err, "checkpoint '%s' has no metadata '%s'", st->path, key);
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (errno || end == v || *end)
    return error_set(err, "checkpoint '%s': bad %s '%s'", st->path, key, v);
  *out = x;
  return 0;
}

// Tensor `name` of st, which must be p's dtype and shape, into dst.
static int copy_tensor(const SafeTensors *st, const char *name, const Param *p, float *dst,
                       Error *err) {
  const SafeTensorEntry *e = safetensors_find(st, name);
  if (!e) return error_set(err, "checkpoint '%s' lacks tensor '%s'", st->path, name);
  Tensor got = safetensors_entry_tensor(st, e);
  if (got.dtype != p->t.dtype || !tensor_same_shape(&got, &p->t)) {
    char have[160], want[160];
    tensor_describe(&got, have, sizeof have);
    tensor_describe(&p->t, want, sizeof want);
    return error_set(err,
                     "checkpoint '%s': tensor '%s' has the wrong dtype or shape: %s, this model "
                     "expects %s\nHINT: resume= takes checkpoints of the same model.* settings",
                     st->path, name, have, want);
  }
  int64_t numel = tensor_numel(&p->t);
  memcpy(dst, got.data, sizeof(float) * (size_t)numel);
  int64_t bad = first_nonfinite(dst, numel);
  if (bad >= 0)
    return error_set(err,
                     "checkpoint '%s': tensor '%s' holds %s (element %lld)\n"
                     "HINT: the run that wrote it had diverged; resume from an older checkpoint",
                     st->path, name, nonfinite_name(dst[bad]), (long long)bad);
  return 0;
}

// The second moments are sums of squares: a negative one would turn AdamW's sqrt into NaN.
static int check_second_moments(const SafeTensors *st, const Model *m, const float *exp_avg_sq,
                                Error *err) {
  for (int i = 0; i < m->num_params; i++) {
    const Param *p = &m->params[i];
    for (int64_t k = 0; k < tensor_numel(&p->t); k++)
      if (exp_avg_sq[p->offset + k] < 0)
        return error_set(err,
                         "checkpoint '%s': tensor 'optim.exp_avg_sq.%s' holds a negative value "
                         "(element %lld); second moments are never negative\n"
                         "HINT: the file was not written by swin.c; resume from another one",
                         st->path, p->t.name, (long long)k);
  }
  return 0;
}

int checkpoint_load(const char *path, Model *m, float *exp_avg, float *exp_avg_sq, float *ema,
                    TrainState *state, Error *err) {
  SafeTensors st;
  if (safetensors_read(&st, path, err) != 0) return -1;
  int rc = -1;
  float *w = NULL, *ea = NULL, *eas = NULL, *avg = NULL;
  const char *format = safetensors_meta_get(&st, "format");
  const char *version = safetensors_meta_get(&st, "format_version");
  const char *ini = safetensors_meta_get(&st, "config");
  if (!format || strcmp(format, CHECKPOINT_FORMAT) != 0 || !version || !ini) {
    error_set(err,
              "'%s' is not a swin.c checkpoint (metadata 'format' is missing or wrong)\n"
              "HINT: to start from exported or timm weights use init_from= instead of resume=",
              path);
    goto done;
  }
  if (atoi(version) != CHECKPOINT_VERSION) {
    error_set(err, "checkpoint '%s' has format version %s; this build reads version %d", path,
              version, CHECKPOINT_VERSION);
    goto done;
  }
  Config saved;
  config_defaults(&saved);
  if (config_load_string(&saved, ini, path, err) != 0) goto done;
  if (config_same_model(&saved, &m->cfg, err) != 0) {
    error_prefix(err, "checkpoint '%s' was written for a different model (checkpoint vs config):\n",
                 path);
    size_t n = strlen(err->msg);
    snprintf(err->msg + n, sizeof err->msg - n,
             "\nHINT: use the model.* keys the checkpoint was trained with, or a new run_dir");
    goto done;
  }
  TrainState s = {0};
  int64_t seed;
  if (meta_int(&st, "step", &s.step, err) || meta_int(&st, "epoch", &s.epoch, err) ||
      meta_int(&st, "batch", &s.batch, err) || meta_int(&st, "seed", &seed, err))
    goto done;
  s.seed = (uint64_t)seed;
  if (s.step < 0 || s.epoch < 0 || s.batch < 0) {
    error_set(err, "checkpoint '%s': step %lld, epoch %lld, batch %lld: none may be negative", path,
              (long long)s.step, (long long)s.epoch, (long long)s.batch);
    goto done;
  }
  const char *scale = safetensors_meta_get(&st, "loss_scale");
  s.loss_scale = 1.0;
  if (scale) {
    char *end;
    s.loss_scale = strtod(scale, &end);
    if (end == scale || *end || !isfinite(s.loss_scale) || s.loss_scale <= 0) {
      error_set(err, "checkpoint '%s': bad loss_scale '%.64s' (a positive finite number)", path,
                scale);
      goto done;
    }
  }
  // Absent in checkpoints written before the GPU trainer: no skips, a fresh scaler.
  int64_t good = 0;
  if (safetensors_meta_get(&st, "loss_scale_good_steps") &&
      meta_int(&st, "loss_scale_good_steps", &good, err))
    goto done;
  s.scale_good_steps = (int32_t)good;
  if (safetensors_meta_get(&st, "skipped_steps") && meta_int(&st, "skipped_steps", &s.skipped, err))
    goto done;
  // Absent before distributed training: 0, "not recorded".
  int64_t world = 0;
  if (safetensors_meta_get(&st, "world_size") && meta_int(&st, "world_size", &world, err))
    goto done;
  s.world = (int32_t)world;

  // Stage into temporaries so a bad tensor leaves the model untouched.
  size_t bytes = sizeof(float) * (size_t)m->num_floats;
  w = calloc_check(1, bytes);  // zeros in the alignment gaps between tensors
  ea = calloc_check(1, bytes);
  eas = calloc_check(1, bytes);
  for (int i = 0; i < m->num_params; i++) {
    const Param *p = &m->params[i];
    char name[CHECKPOINT_NAME_MAX];
    if (copy_tensor(&st, p->t.name, p, w + p->offset, err)) goto done;
    snprintf(name, sizeof name, "optim.exp_avg.%s", p->t.name);
    if (copy_tensor(&st, name, p, ea + p->offset, err)) goto done;
    snprintf(name, sizeof name, "optim.exp_avg_sq.%s", p->t.name);
    if (copy_tensor(&st, name, p, eas + p->offset, err)) goto done;
  }
  if (check_second_moments(&st, m, eas, err) != 0) goto done;
  // The moving average: every tensor or none (a file with the first must have them all), checked
  // like the weights even when the caller does not want it.
  char first_ema[CHECKPOINT_NAME_MAX];
  snprintf(first_ema, sizeof first_ema, "ema.%s", m->params[0].t.name);
  s.has_ema = safetensors_find(&st, first_ema) != NULL;
  if (s.has_ema) {
    avg = calloc_check(1, bytes);
    for (int i = 0; i < m->num_params; i++) {
      const Param *p = &m->params[i];
      char name[CHECKPOINT_NAME_MAX];
      snprintf(name, sizeof name, "ema.%s", p->t.name);
      if (copy_tensor(&st, name, p, avg + p->offset, err)) goto done;
    }
  }
  int want = (s.has_ema ? 4 : 3) * m->num_params;
  if (st.count != want) {
    error_set(err, "checkpoint '%s' holds %d tensors, the model expects %d%s", path, st.count, want,
              s.has_ema ? " (weights, two AdamW moments and the moving average \"ema.*\")" : "");
    goto done;
  }
  memcpy(m->weights, w, bytes);
  memcpy(exp_avg, ea, bytes);
  memcpy(exp_avg_sq, eas, bytes);
  if (avg && ema) memcpy(ema, avg, bytes);
  *state = s;
  rc = 0;
done:
  free(w);
  free(ea);
  free(eas);
  free(avg);
  safetensors_free(&st);
  return rc;
}
