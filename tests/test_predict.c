// test_predict.c: swin_predict's image form as a user meets it. A tiny model trained here for a
// few steps on an ImageFolder of JPEG and PNG files (colour images of several sizes and
// aspects, a gray model: the decode converts), then:
//   - --json prints one object per image with K classes, probabilities descending and summing
//     to at most 1, named after the class directories (one name with quotes: JSON escaping);
//   - the probabilities are the trainer's eval path: the mean -log p(label) over the val split
//     equals swin_train eval=1's loss, and the top-1 fraction its top1; a prediction with
//     another crop_pct, interpolation or mean (a wrong transform or normalization) misses it;
//   - an export predicts the same lines (the class names travel with it), the human form
//     prints one line per image, a checkpoint without names prints null names;
//   - a missing file, a file that is not an image, an empty directory and a model without a
//     config each exit non-zero naming the path.
// It runs the programs of the build directory (ctest's working directory).
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "src/base/util.h"
#include "src/io/safetensors.h"
#include "tests/util/test_util.h"

#define STB_IMAGE_WRITE_IMPLEMENTATION
#include "stb_image_write.h"

#define NUM_CLASSES 3
#define TRAIN_PER_CLASS 8
#define VAL_PER_CLASS 5
#define MAX_LINES 64
#define TOP 3

static char tmp[256];  // this run's scratch directory
// strcmp order, as the ImageFolder sorts them: uppercase first; the third needs JSON escapes.
static const char *const CLASSES[NUM_CLASSES] = {"Emu", "cat", "dog \"spot\""};
static const char *const CLASSES_JSON[NUM_CLASSES] = {"Emu", "cat", "dog \\\"spot\\\""};

// Runs the shell command built from fmt with its stdout and stderr into tmp/out.txt; returns
// its exit status, and the output in *out (malloc'ed) when out is not NULL.
static int run(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int run(char **out, const char *fmt, ...) {
  char cmd[8192];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  snprintf(cmd + n, sizeof cmd - (size_t)n, " >'%s/out.txt' 2>&1", tmp);
  int status = system(cmd);
  int rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (out) {
    char path[512];
    snprintf(path, sizeof path, "%s/out.txt", tmp);
    Error err;
    size_t size;
    *out = (char *)read_file(path, &size, &err);
    if (!*out) *out = calloc_check(1, 1);
  }
  return rc;
}

static void make_dir(const char *path) {
  if (mkdir(path, 0755) != 0) {
    perror(path);
    exit(2);
  }
}

// A class-dependent pattern (horizontal stripes, vertical stripes, a checkerboard) in colour,
// with noise, so the classes are learnable and every image differs.
static void write_image(const char *path, TestRng *r, int cls, int h, int w, bool png) {
  uint8_t *px = malloc_check((size_t)h * w * 3);
  int period = 3 + (int)(test_rng_u64(r) % 3);
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++) {
      int on = cls == 0   ? (y / period) % 2
               : cls == 1 ? (x / period) % 2
                          : (x / period + y / period) % 2;
      for (int c = 0; c < 3; c++) {
        int v = (on ? 190 : 50) + 20 * c + (int)(test_rng_u64(r) % 40) - 20;
        px[((size_t)y * w + x) * 3 + c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
      }
    }
  int ok = png ? stbi_write_png(path, w, h, 3, px, w * 3) : stbi_write_jpg(path, w, h, 3, px, 90);
  free(px);
  if (!ok) {
    fprintf(stderr, "cannot write %s\n", path);
    exit(2);
  }
}

// root/{train,val}/<class>/NN.jpg (one PNG per val class), sizes from 18 to 41 pixels a side.
static void write_imagefolder(const char *root, TestRng *r) {
  char path[1024];
  make_dir(root);
  const char *splits[2] = {"train", "val"};
  for (int s = 0; s < 2; s++) {
    snprintf(path, sizeof path, "%s/%s", root, splits[s]);
    make_dir(path);
    for (int c = 0; c < NUM_CLASSES; c++) {
      snprintf(path, sizeof path, "%s/%s/%s", root, splits[s], CLASSES[c]);
      make_dir(path);
      int count = s == 0 ? TRAIN_PER_CLASS : VAL_PER_CLASS;
      for (int i = 0; i < count; i++) {
        bool png = s == 1 && i == 0;
        snprintf(path, sizeof path, "%s/%s/%s/%02d.%s", root, splits[s], CLASSES[c], i,
                 png ? "png" : "jpg");
        int h = 18 + (int)(test_rng_u64(r) % 24), w = 18 + (int)(test_rng_u64(r) % 24);
        write_image(path, r, c, h, w, png);
      }
    }
  }
}

// ---- the JSON lines ----

typedef struct {
  char path[1024];
  int count;  // classes listed
  int cls[16];
  char name[16][64];  // as printed (escaped), "null" when null
  double prob[16];
} Prediction;

// The JSON string at *s (after its opening quote) up to the closing quote, kept escaped.
static bool parse_string(const char **s, char *out, size_t size) {
  size_t n = 0;
  for (const char *p = *s; *p; p++) {
    if (*p == '"') {
      out[n] = '\0';
      *s = p + 1;
      return true;
    }
    if (*p == '\\' && p[1]) {
      if (n + 2 >= size) return false;
      out[n++] = *p++;
    }
    if (n + 1 >= size) return false;
    out[n++] = *p;
  }
  return false;
}

static bool skip(const char **s, const char *lit) {
  size_t n = strlen(lit);
  if (strncmp(*s, lit, n) != 0) return false;
  *s += n;
  return true;
}

// One line of --json output: {"path": "...", "top": [{"class": c, "name": "..."|null, "prob": p},
// ...]}
static bool parse_prediction(const char *line, Prediction *p) {
  const char *s = line;
  *p = (Prediction){0};
  if (!skip(&s, "{\"path\": \"") || !parse_string(&s, p->path, sizeof p->path)) return false;
  if (!skip(&s, ", \"top\": [")) return false;
  while (*s != ']') {
    if (p->count == 16) return false;
    if (p->count && !skip(&s, ", ")) return false;
    int k = p->count, used = 0;
    if (sscanf(s, "{\"class\": %d, \"name\": %n", &p->cls[k], &used) != 1 || !used) return false;
    s += used;
    if (skip(&s, "null"))
      snprintf(p->name[k], sizeof p->name[k], "null");
    else if (!skip(&s, "\"") || !parse_string(&s, p->name[k], sizeof p->name[k]))
      return false;
    if (sscanf(s, ", \"prob\": %lf}%n", &p->prob[k], &used) != 1) return false;
    s += used;
    p->count++;
  }
  return skip(&s, "]}") && *s == '\0';
}

// The lines of out parsed into preds (up to MAX_LINES); returns how many, or -1 when a line
// does not parse (named on stdout).
static int parse_lines(char *out, Prediction *preds) {
  int n = 0;
  for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
    if (n == MAX_LINES || !parse_prediction(line, &preds[n])) {
      printf("     | unparsed: %.200s\n", line);
      return -1;
    }
    n++;
  }
  return n;
}

// The class index of a val image from its directory, -1 for an image outside root/val.
static int val_label(const char *root, const char *path) {
  char prefix[1024];
  for (int c = 0; c < NUM_CLASSES; c++) {
    snprintf(prefix, sizeof prefix, "%s/val/%s/", root, CLASSES_JSON[c]);
    if (strncmp(path, prefix, strlen(prefix)) == 0) return c;
  }
  return -1;
}

// The val images' mean -log p(label) and top-1 fraction; *count val images among preds.
static void val_metrics(const char *root, const Prediction *preds, int n, double *loss,
                        double *top1, int *count) {
  double sum = 0;
  int hits = 0;
  *count = 0;
  for (int i = 0; i < n; i++) {
    int label = val_label(root, preds[i].path);
    if (label < 0) continue;
    double p = 0;
    for (int k = 0; k < preds[i].count; k++)
      if (preds[i].cls[k] == label) p = preds[i].prob[k];
    sum += -log(p);
    hits += preds[i].cls[0] == label;
    (*count)++;
  }
  *loss = *count ? sum / *count : NAN;
  *top1 = *count ? (double)hits / *count : NAN;
}

// ---- the checks ----

static const char *train_args(const char *root) {
  static char args[2048];
  snprintf(args, sizeof args,
           "./swin_train '%s/tests/tiny_fashion.ini' data.dataset=imagefolder data.path='%s' "
           "model.num_classes=%d device=cpu train.batch_size=6 train.lr=3e-3 data.workers=1 "
           "data.crop_pct=0.875 data.interpolation=bicubic data.mean=0.45 data.std=0.25",
           SWIN_SOURCE_DIR, root, NUM_CLASSES);
  return args;
}

// Every line well formed: TOP classes named after their directories, probabilities descending
// and summing to at most 1 (all classes listed: to 1 within the printed digits).
static void check_lines(const Prediction *preds, int n, int want_lines) {
  bool shape = n == want_lines, names = true, descending = true, sums = true;
  double worst_sum = 1;
  for (int i = 0; i < n; i++) {
    const Prediction *p = &preds[i];
    double sum = 0;
    shape = shape && p->count == TOP;
    for (int k = 0; k < p->count; k++) {
      int c = p->cls[k];
      names = names && c >= 0 && c < NUM_CLASSES && strcmp(p->name[k], CLASSES_JSON[c]) == 0;
      descending = descending && (k == 0 || p->prob[k] <= p->prob[k - 1]);
      sum += p->prob[k];
    }
    if (fabs(sum - 1) > fabs(worst_sum - 1)) worst_sum = sum;
    sums = sums && sum <= 1 + 1e-5 && sum >= 1 - 1e-4;
  }
  test_check(shape, "--json: %d lines of %d classes (want %d lines)", n, TOP, want_lines);
  test_check(names, "--json: class names are the directory names, JSON-escaped");
  test_check(descending, "--json: probabilities descend");
  test_check(sums, "--json: probabilities sum to <= 1 (all %d classes: %.6f)", NUM_CLASSES,
             worst_sum);
}

static void test_imagefolder_model(TestRng *r) {
  char root[512], run_dir[512], ckpt[600], one[700], val[600];
  snprintf(root, sizeof root, "%s/folder", tmp);
  snprintf(run_dir, sizeof run_dir, "%s/run", tmp);
  snprintf(ckpt, sizeof ckpt, "%s/ckpt-00000012.safetensors", run_dir);
  snprintf(val, sizeof val, "%s/val", root);
  snprintf(one, sizeof one, "%s/train/cat/03.jpg", root);
  write_imagefolder(root, r);
  char *out;
  int rc = run(&out, "%s train.max_steps=12 ckpt.every=12 run_dir='%s'", train_args(root), run_dir);
  if (!test_check(rc == 0 && access(ckpt, R_OK) == 0, "swin_train writes %s", ckpt)) {
    printf("     | %.2000s\n", out);
    free(out);
    return;
  }
  free(out);

  // The trainer's own evaluation of the checkpoint on the val split; its metrics record has the
  // loss to 6 decimals.
  rc = run(&out, "%s eval=1 resume='%s' run_dir='%s/eval'", train_args(root), ckpt, tmp);
  free(out);
  char metrics[600];
  snprintf(metrics, sizeof metrics, "%s/eval/metrics.jsonl", tmp);
  Error err;
  size_t size;
  char *record = (char *)read_file(metrics, &size, &err);
  double eval_top1 = NAN, eval_loss = NAN;
  const char *top1_at = record ? strstr(record, "\"eval_top1\": ") : NULL;
  const char *loss_at = record ? strstr(record, "\"eval_loss\": ") : NULL;
  bool parsed = top1_at && loss_at && sscanf(top1_at, "\"eval_top1\": %lf", &eval_top1) == 1 &&
                sscanf(loss_at, "\"eval_loss\": %lf", &eval_loss) == 1;
  test_check(rc == 0 && parsed, "eval=1: top1 %.2f%%, loss %.6f", eval_top1, eval_loss);
  free(record);

  // One file and the three val class directories.
  char inputs[4096];
  snprintf(inputs, sizeof inputs, "'%s' '%s/%s' '%s/%s' '%s/%s'", one, val, CLASSES[0], val,
           CLASSES[1], val, CLASSES[2]);
  static Prediction preds[MAX_LINES];
  rc = run(&out, "./swin_predict '%s' %s --json --top %d device=cpu", ckpt, inputs, TOP);
  char *json = out;
  size_t json_len = strlen(json);
  char *copy = memcpy(malloc_check(json_len + 1), json, json_len + 1);
  int n = parse_lines(copy, preds);
  free(copy);
  test_check(rc == 0 && n > 0, "swin_predict --json exits 0 with parsable lines (exit %d)", rc);
  if (rc != 0 || n <= 0) printf("     | %.2000s\n", json);
  check_lines(preds, n, 1 + NUM_CLASSES * VAL_PER_CLASS);
  test_check(n > 0 && strcmp(preds[0].path, one) == 0, "--json: the file first, as given: %s",
             n > 0 ? preds[0].path : "(none)");

  // The eval path: swin_train's loss and top1. Tolerance: the record's 6 decimals, the 6 digits
  // of each printed probability, and float sums over another batch size.
  double loss, top1;
  int count;
  val_metrics(root, preds, n, &loss, &top1, &count);
  test_check(count == NUM_CLASSES * VAL_PER_CLASS && fabs(loss - eval_loss) <= 2e-5,
             "mean -log p(label) over %d val images %.6f = eval=1 loss %.6f (tol 2e-5)", count,
             loss, eval_loss);
  test_check(fabs(100 * top1 - eval_top1) <= 0.01,
             "top-1 of the val images %.2f%% = eval=1 top1 %.2f%%", 100 * top1, eval_top1);
  // The loss check can fail: the same images with another center crop or normalization.
  const char *wrong[3] = {"data.crop_pct=1", "data.interpolation=bilinear", "data.mean=0.3"};
  for (int i = 0; i < 3; i++) {
    char *bad;
    run(&bad, "./swin_predict '%s' %s --json --top %d device=cpu %s", ckpt, inputs, TOP, wrong[i]);
    static Prediction other[MAX_LINES];
    int m = parse_lines(bad, other);
    double bad_loss, bad_top1;
    val_metrics(root, other, m, &bad_loss, &bad_top1, &count);
    test_check(fabs(bad_loss - eval_loss) > 1e-4,
               "with %s the loss %.6f misses eval's %.6f by more than 1e-4", wrong[i], bad_loss,
               eval_loss);
    free(bad);
  }

  // An export predicts the same, names included.
  char export_path[600];
  snprintf(export_path, sizeof export_path, "%s/export.safetensors", tmp);
  rc = run(NULL, "./swin_export '%s' '%s'", ckpt, export_path);
  char *exported;
  int rc2 =
      run(&exported, "./swin_predict '%s' %s --json --top %d device=cpu", export_path, inputs, TOP);
  test_check(rc == 0 && rc2 == 0 && strcmp(exported, json) == 0,
             "an export's predictions are the checkpoint's, class names included");
  free(exported);
  free(json);

  // The export again with one class name more than the model has classes: a warning naming the
  // file, then class indices only.
  char extra_path[600];
  snprintf(extra_path, sizeof extra_path, "%s/extra_names.safetensors", tmp);
  SafeTensors st;
  if (safetensors_read(&st, export_path, &err) != 0) {
    fprintf(stderr, "%s\n", err.msg);
    exit(2);
  }
  SafeTensorWriter w;
  safetensors_writer_init(&w);
  for (int i = 0; i < st.count; i++) {
    const SafeTensorEntry *e = &st.entries[i];
    safetensors_writer_add(&w, e->name, e->dtype, e->ndim, e->shape,
                           safetensors_entry_data(&st, e));
  }
  char names[512];
  for (int i = 0; i < st.meta_count; i++) {
    const char *key = st.meta[i].key, *value = st.meta[i].value;
    if (strcmp(key, "swin.checksum") == 0) continue;  // the writer adds its own
    if (strcmp(key, "swin.class_names") == 0) {
      snprintf(names, sizeof names, "%s\nwolf", value);
      value = names;
    }
    safetensors_writer_meta(&w, key, value);
  }
  if (safetensors_writer_save(&w, extra_path, &err) != 0) {
    fprintf(stderr, "%s\n", err.msg);
    exit(2);
  }
  safetensors_writer_free(&w);
  safetensors_free(&st);
  rc = run(&out, "./swin_predict '%s' '%s' --json device=cpu", extra_path, one);
  test_check(rc == 0 && strstr(out, extra_path) && strstr(out, "names 4 classes") &&
                 strstr(out, "\"name\": null") && !strstr(out, "\"name\": \"cat\""),
             "a class list longer than the classes: a warning naming the file, indices only "
             "(exit %d)",
             rc);
  if (rc != 0) printf("     | %.500s\n", out);
  free(out);

  // The human form: one line per image, "PATH:  1. NAME P  2. ...".
  rc = run(&out, "./swin_predict '%s' '%s' '%s/%s' --top 2 device=cpu", ckpt, one, val, CLASSES[1]);
  int lines = 0;
  bool form = true;
  for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n"), lines++)
    form = form && strstr(line, ":  1. ") && strstr(line, "  2. ") && !strstr(line, "  3. ");
  test_check(rc == 0 && form && lines == 1 + VAL_PER_CLASS && strncmp(out, one, strlen(one)) == 0,
             "human form: %d lines of 'PATH:  1. NAME P  2. NAME P' (want %d)", lines,
             1 + VAL_PER_CLASS);
  free(out);

  // Bad inputs: each names the path.
  char missing[600], text[600], empty[600];
  snprintf(missing, sizeof missing, "%s/nothing.jpg", tmp);
  snprintf(text, sizeof text, "%s/notes.jpg", tmp);
  snprintf(empty, sizeof empty, "%s/empty", tmp);
  test_write_file(text, "not an image\n", 13);
  make_dir(empty);
  struct {
    const char *what, *path, *words;
  } bad[3] = {{"a missing file", missing, "does not exist"},
              {"a text file named .jpg", text, "cannot decode image"},
              {"an empty directory", empty, "has no .jpg/.jpeg/.png images"}};
  for (int i = 0; i < 3; i++) {
    rc = run(&out, "./swin_predict '%s' '%s' '%s' device=cpu", ckpt, one, bad[i].path);
    test_check(
        rc == 1 && strstr(out, bad[i].path) && strstr(out, bad[i].words) && strstr(out, "HINT"),
        "%s: exit %d, names '%s' with a HINT", bad[i].what, rc, bad[i].path);
    if (rc != 1) printf("     | %.500s\n", out);
    free(out);
  }
  rc = run(&out, "./swin_predict '%s' '%s' --top 0", ckpt, one);
  test_check(rc == 2 && strstr(out, "--top"), "--top 0 is a usage error (exit %d)", rc);
  free(out);
}

// A model file without a config, and a checkpoint whose dataset has no class names.
static void test_without_metadata(void) {
  char model[600], image[600], run_dir[600], ckpt[700];
  snprintf(model, sizeof model, "%s/weights.safetensors", tmp);
  snprintf(image, sizeof image, "%s/folder/val/cat/01.jpg", tmp);
  float w[4] = {1, 2, 3, 4};
  SafeTensorWriter wr;
  safetensors_writer_init(&wr);
  safetensors_writer_add(&wr, "head.weight", DTYPE_F32, 2, (int64_t[]){2, 2}, w);
  Error err;
  if (safetensors_writer_save(&wr, model, &err) != 0) {
    fprintf(stderr, "%s\n", err.msg);
    exit(2);
  }
  safetensors_writer_free(&wr);
  char *out;
  int rc = run(&out, "./swin_predict '%s' '%s'", model, image);
  test_check(
      rc == 1 && strstr(out, model) && strstr(out, "carries no config") && strstr(out, "HINT"),
      "a model without a config: exit %d, named, with a HINT", rc);
  free(out);

  snprintf(run_dir, sizeof run_dir, "%s/synthetic", tmp);
  snprintf(ckpt, sizeof ckpt, "%s/ckpt-00000002.safetensors", run_dir);
  run(NULL,
      "./swin_train '%s/tests/tiny_fashion.ini' data.dataset=synthetic train.max_steps=2 "
      "device=cpu run_dir='%s'",
      SWIN_SOURCE_DIR, run_dir);
  rc = run(&out, "./swin_predict '%s' '%s' --json", ckpt, image);
  Prediction p;
  char *nl = strchr(out, '\n');
  if (nl) *nl = '\0';
  bool parsed = parse_prediction(out, &p);
  bool nulls = parsed && p.count == 5;
  for (int k = 0; k < p.count; k++) nulls = nulls && strcmp(p.name[k], "null") == 0;
  test_check(rc == 0 && nulls, "a checkpoint without class names: 5 classes, \"name\": null");
  if (!nulls) printf("     | %.500s\n", out);
  free(out);
}

int main(void) {
  snprintf(tmp, sizeof tmp, "/tmp/swin_test_predict_XXXXXX");
  if (!mkdtemp(tmp)) {
    perror("mkdtemp");
    return 2;
  }
  if (access("./swin_predict", X_OK) != 0 || access("./swin_train", X_OK) != 0) {
    printf("skipped: run from the build directory (ctest does)\n");
    return 77;
  }
  TestRng r = {20250117};
  test_imagefolder_model(&r);
  test_without_metadata();
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
  if (system(cmd) != 0) printf("note: could not remove %s\n", tmp);
  return test_finish();
}
