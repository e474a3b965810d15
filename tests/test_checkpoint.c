// test_checkpoint.c: what keeps a run's files trustworthy: checkpoints and init_from files with
// NaN or infinite values are never written or loaded (the message names the tensor), nor
// checkpoints with impossible state; temp files of an interrupted save are removed; the run
// directory lock admits one run and dies with its holder; metrics.jsonl drops a record cut by a
// kill and reports failed writes with the path and the cause.
#define _XOPEN_SOURCE 700  // mkdtemp, fork, kill, symlink

#include <errno.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "src/app/metrics.h"
#include "src/app/runlock.h"
#include "src/io/checkpoint.h"
#include "src/io/import.h"
#include "src/io/safetensors.h"
#include "tests/util/test_model_config.h"
#include "tests/util/test_util.h"

static char tmp_dir[64];

// A small two-stage model with random weights and positive second moments.
typedef struct {
  Model m;
  float *exp_avg, *exp_avg_sq;
} Fixture;

static Fixture fixture_make(TestRng *r) {
  Config c = test_model_config((TestModel){.img_h = 8,
                                           .chans = 1,
                                           .patch = 2,
                                           .embed = 8,
                                           .window = 2,
                                           .classes = 5,
                                           .depths = {1, 1},
                                           .heads = {2, 4}});
  c.num_mean = 1;
  memset(c.mean, 0, sizeof c.mean);
  memset(c.std, 0, sizeof c.std);
  c.mean[0] = 0.5f, c.std[0] = 0.25f;
  Fixture f;
  Error err;
  if (config_validate(&c, &err) != 0 || model_create(&f.m, &c, NULL, 0, &err) != 0) {
    printf("FAIL fixture model: %s\n", err.msg);
    exit(1);
  }
  model_init_weights(&f.m, 7);
  f.exp_avg = test_alloc_floats(f.m.num_floats);
  f.exp_avg_sq = test_alloc_floats(f.m.num_floats);
  test_fill_uniform(r, f.exp_avg, f.m.num_floats, -1e-3f, 1e-3f);
  test_fill_uniform(r, f.exp_avg_sq, f.m.num_floats, 1e-8f, 1e-6f);
  return f;
}

static void fixture_free(Fixture *f) {
  free(f->exp_avg);
  free(f->exp_avg_sq);
  model_destroy(&f->m);
}

static int count_files(const char *dir) {
  char **paths;
  int n = checkpoint_list(dir, &paths);
  checkpoint_list_free(paths, n);
  char tmp[512];
  snprintf(tmp, sizeof tmp, "%s/ckpt-00000003.safetensors.tmp", dir);
  return n + (access(tmp, F_OK) == 0);
}

static void test_save_refuses_nonfinite(TestRng *r) {
  Fixture f = fixture_make(r);
  char dir[256], path[512];
  snprintf(dir, sizeof dir, "%s/save", tmp_dir);
  TrainState s = {.step = 3, .epoch = 0, .batch = 3, .seed = 0, .loss_scale = 1};
  const Param *p = &f.m.params[5];
  Error err;
  f.m.weights[p->offset + 2] = NAN;
  int rc = checkpoint_save(dir, &f.m, f.exp_avg, f.exp_avg_sq, NULL, &s, NULL, 3, path, sizeof path,
                           &err);
  test_check(rc == -1 && strstr(err.msg, p->t.name) && strstr(err.msg, "nan") &&
                 strstr(err.msg, "element 2") && count_files(dir) == 0,
             "save refuses a NaN weight, naming '%s', writing nothing: %.90s", p->t.name, err.msg);
  f.m.weights[p->offset + 2] = 0.5f;
  const Param *q = &f.m.params[f.m.num_params - 1];
  f.exp_avg_sq[q->offset] = INFINITY;
  rc = checkpoint_save(dir, &f.m, f.exp_avg, f.exp_avg_sq, NULL, &s, NULL, 3, path, sizeof path,
                       &err);
  char name[160];
  snprintf(name, sizeof name, "optim.exp_avg_sq.%s", q->t.name);
  test_check(rc == -1 && strstr(err.msg, name) && strstr(err.msg, "inf") && count_files(dir) == 0,
             "save refuses an infinite second moment, naming '%s'", name);
  f.exp_avg_sq[q->offset] = 1e-7f;
  rc = checkpoint_save(dir, &f.m, f.exp_avg, f.exp_avg_sq, NULL, &s, NULL, 3, path, sizeof path,
                       &err);
  test_check(rc == 0 && count_files(dir) == 1, "the finite state saves");
  fixture_free(&f);
}

// Rewrites a valid checkpoint with tensor `name`'s element 1 set to value and metadata `key`
// set to `meta` (NULL: unchanged), with a fresh (valid) checksum: only the values are wrong.
static void write_altered(const char *from, const char *to, const char *name, float value,
                          const char *key, const char *meta) {
  SafeTensors st;
  Error err;
  if (safetensors_read(&st, from, &err) != 0) {
    printf("FAIL read %s: %s\n", from, err.msg);
    exit(1);
  }
  unsigned char *copy = malloc_check(st.data_size);
  memcpy(copy, st.data, st.data_size);
  SafeTensorWriter w;
  safetensors_writer_init(&w);
  for (int i = 0; i < st.meta_count; i++)
    if (strcmp(st.meta[i].key, "swin.checksum") != 0)
      safetensors_writer_meta(&w, st.meta[i].key, st.meta[i].value);
  if (key) safetensors_writer_meta(&w, key, meta);
  for (int i = 0; i < st.count; i++) {
    const SafeTensorEntry *e = &st.entries[i];
    unsigned char *data = copy + e->begin;
    if (name && strcmp(e->name, name) == 0) memcpy(data + 4, &value, 4);
    safetensors_writer_add(&w, e->name, e->dtype, e->ndim, e->shape, data);
  }
  if (safetensors_writer_save(&w, to, &err) != 0) printf("FAIL write %s: %s\n", to, err.msg);
  safetensors_writer_free(&w);
  free(copy);
  safetensors_free(&st);
}

static void test_load_refuses(TestRng *r) {
  Fixture f = fixture_make(r);
  char good[512], bad[512], name[160];
  snprintf(good, sizeof good, "%s/save/ckpt-00000003.safetensors", tmp_dir);
  snprintf(bad, sizeof bad, "%s/altered.safetensors", tmp_dir);
  float *before = test_alloc_floats(f.m.num_floats);
  memcpy(before, f.m.weights, sizeof(float) * (size_t)f.m.num_floats);
  TrainState s;
  Error err;
  const Param *p = &f.m.params[3];
  struct {
    const char *what, *tensor;
    float value;
    const char *key, *meta, *needle;
  } cases[] = {
      {"a NaN weight", p->t.name, NAN, NULL, NULL, "nan"},
      {"a -inf weight", p->t.name, -INFINITY, NULL, NULL, "-inf"},
      {"a negative second moment", name, -1e-6f, NULL, NULL, "negative value"},
      {"step -4", NULL, 0, "step", "-4", "none may be negative"},
      {"batch -1", NULL, 0, "batch", "-1", "none may be negative"},
      {"loss_scale nan", NULL, 0, "loss_scale", "nan", "bad loss_scale"},
      {"loss_scale 0", NULL, 0, "loss_scale", "0", "bad loss_scale"},
  };
  snprintf(name, sizeof name, "optim.exp_avg_sq.%s", p->t.name);
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    write_altered(good, bad, cases[k].tensor, cases[k].value, cases[k].key, cases[k].meta);
    int rc = checkpoint_load(bad, &f.m, f.exp_avg, f.exp_avg_sq, NULL, &s, &err);
    bool untouched = memcmp(before, f.m.weights, sizeof(float) * (size_t)f.m.num_floats) == 0;
    test_check(rc == -1 && strstr(err.msg, cases[k].needle) && strstr(err.msg, bad) &&
                   (!cases[k].tensor || strstr(err.msg, cases[k].tensor)) && untouched,
               "load refuses %s (file and tensor named, model untouched): %.80s", cases[k].what,
               strstr(err.msg, "': ") ? strstr(err.msg, "': ") + 3 : err.msg);
  }
  int rc = checkpoint_load(good, &f.m, f.exp_avg, f.exp_avg_sq, NULL, &s, &err);
  test_check(rc == 0 && s.step == 3, "the unaltered checkpoint loads");

  // init_from: an exported file with a NaN (f32) or an infinity (bf16) in one tensor.
  char exported[512];
  snprintf(exported, sizeof exported, "%s/export.safetensors", tmp_dir);
  const DType dtypes[2] = {DTYPE_F32, DTYPE_BF16};
  for (int d = 0; d < 2; d++) {
    if (export_weights(&f.m, exported, dtypes[d], NULL, &err) != 0) {
      test_check(0, "export: %s", err.msg);
      continue;
    }
    SafeTensors st;
    safetensors_read(&st, exported, &err);
    const SafeTensorEntry *e = safetensors_find(&st, p->t.name);
    unsigned char *data = malloc_check(st.data_size);
    memcpy(data, st.data, st.data_size);
    uint16_t inf_bf16 = 0x7F80;
    float nan = NAN;
    if (d == 0)
      memcpy(data + e->begin + 4, &nan, 4);
    else
      memcpy(data + e->begin + 2, &inf_bf16, 2);
    SafeTensorWriter w;
    safetensors_writer_init(&w);
    for (int i = 0; i < st.count; i++)
      safetensors_writer_add(&w, st.entries[i].name, st.entries[i].dtype, st.entries[i].ndim,
                             st.entries[i].shape, data + st.entries[i].begin);
    safetensors_writer_save(&w, bad, &err);
    safetensors_writer_free(&w);
    safetensors_free(&st);
    free(data);
    memcpy(before, f.m.weights, sizeof(float) * (size_t)f.m.num_floats);
    rc = import_weights(&f.m, bad, NULL, &err);
    bool untouched = memcmp(before, f.m.weights, sizeof(float) * (size_t)f.m.num_floats) == 0;
    test_check(
        rc == -1 && strstr(err.msg, p->t.name) && strstr(err.msg, d ? "inf" : "nan") && untouched,
        "init_from refuses a %s %s in '%s', model untouched: %.90s", dtype_name(dtypes[d]),
        d ? "inf" : "NaN", p->t.name, err.msg);
  }
  free(before);
  fixture_free(&f);
}

static void touch(const char *dir, const char *name) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  if (f) fclose(f);
}

static bool exists(const char *dir, const char *name) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  return access(path, F_OK) == 0;
}

static void test_stale_temps(void) {
  char dir[256];
  snprintf(dir, sizeof dir, "%s/stale", tmp_dir);
  mkdir(dir, 0755);
  const char *names[] = {"ckpt-00000010.safetensors.tmp", "ckpt-00000012.safetensors.tmp",
                         "ckpt-00000010.safetensors",     "notes.tmp",
                         "ckpt-x.safetensors.tmp",        "metrics.jsonl"};
  for (int i = 0; i < 6; i++) touch(dir, names[i]);
  Error err;
  int removed = checkpoint_remove_stale_temps(dir, &err);
  bool others = exists(dir, names[2]) && exists(dir, names[3]) && exists(dir, names[4]) &&
                exists(dir, names[5]);
  test_check(removed == 2 && !exists(dir, names[0]) && !exists(dir, names[1]) && others,
             "stale temps: both ckpt-*.safetensors.tmp removed (%d), nothing else", removed);
}

static void test_runlock(void) {
  char dir[256];
  snprintf(dir, sizeof dir, "%s/run", tmp_dir);
  mkdir(dir, 0755);
  RunLock a, b;
  Error err;
  test_check(runlock_acquire(&a, dir, &err) == 0, "lock: the first run takes run_dir");
  char pid[32];
  snprintf(pid, sizeof pid, "pid %ld", (long)getpid());
  int rc = runlock_acquire(&b, dir, &err);
  test_check(rc == -1 && b.fd == -1 && strstr(err.msg, dir) && strstr(err.msg, "in use") &&
                 strstr(err.msg, pid) && strstr(err.msg, "HINT"),
             "lock: a second run is refused, naming the directory and the holder: %.100s", err.msg);
  runlock_release(&a);
  rc = runlock_acquire(&b, dir, &err);
  test_check(rc == 0, "lock: taken again after release");
  runlock_release(&b);

  // A holder killed with SIGKILL leaves no stale lock.
  int ready[2];
  if (pipe(ready) != 0) return;
  pid_t child = fork();
  if (child == 0) {
    RunLock c;
    char byte = runlock_acquire(&c, dir, NULL) == 0 ? 'y' : 'n';
    if (write(ready[1], &byte, 1) != 1) _exit(1);
    pause();
    _exit(0);
  }
  char byte = 0;
  if (read(ready[0], &byte, 1) != 1) byte = 0;
  snprintf(pid, sizeof pid, "pid %ld", (long)child);
  rc = runlock_acquire(&b, dir, &err);
  test_check(byte == 'y' && rc == -1 && strstr(err.msg, pid),
             "lock: held by another process, the message names its %s", pid);
  kill(child, SIGKILL);
  waitpid(child, NULL, 0);
  rc = runlock_acquire(&b, dir, &err);
  test_check(rc == 0, "lock: free at once after its holder was killed with SIGKILL");
  runlock_release(&b);
  close(ready[0]);
  close(ready[1]);
}

static void test_metrics(void) {
  char dir[256], path[512];
  snprintf(dir, sizeof dir, "%s/metrics", tmp_dir);
  mkdir(dir, 0755);
  snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
  FILE *f = fopen(path, "w");
  fputs("{\"step\": 1}\n{\"step\": 2}\n{\"step\": 3, \"lo", f);  // a record cut by a kill
  fclose(f);
  MetricsLog log;
  Error err;
  int rc = metrics_open(&log, dir, NULL, &err);
  rc = rc ? rc : metrics_write(&log, &err, "{\"step\": %d}", 3);
  metrics_close(&log);
  size_t n = 0;
  char *text = (char *)read_file(path, &n, &err);
  test_check(rc == 0 && text && strcmp(text, "{\"step\": 1}\n{\"step\": 2}\n{\"step\": 3}\n") == 0,
             "metrics: the cut record is dropped, the next one starts its own line");
  free(text);

  // Writes that fail (here: /dev/full, ENOSPC) are errors naming the file and the cause.
  remove(path);
  if (symlink("/dev/full", path) != 0) return;
  rc = metrics_open(&log, dir, NULL, &err);
  if (rc == 0) rc = metrics_write(&log, &err, "{\"step\": %d}", 4);
  metrics_close(&log);
  test_check(rc == -1 && strstr(err.msg, path) && strstr(err.msg, strerror(ENOSPC)) &&
                 strstr(err.msg, "HINT"),
             "metrics: a failed write names the file and the cause: %.100s", err.msg);
}

int main(void) {
  snprintf(tmp_dir, sizeof tmp_dir, "/tmp/swin_test_checkpoint_XXXXXX");
  if (!mkdtemp(tmp_dir)) return 1;
  TestRng r = {20251201};
  test_save_refuses_nonfinite(&r);
  test_load_refuses(&r);
  test_stale_temps();
  test_runlock();
  test_metrics();
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dir);
  if (system(cmd) != 0) printf("note: could not remove %s\n", tmp_dir);
  return test_finish();
}
