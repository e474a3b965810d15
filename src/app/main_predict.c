// swin_predict: a model's predictions, in two forms; the second argument picks one.
//   swin_predict MODEL IMAGE|DIR [IMAGE|DIR ...] [CONFIG.ini] [--json] [--top K] [key=value ...]
//   swin_predict MODEL.safetensors INPUT.safetensors OUT.safetensors [CONFIG.ini] [key=value ...]
// An INPUT ending in .safetensors is the tensor form; anything else is the image form.
//
// MODEL is a swin.c checkpoint or export (both carry their config), or, with CONFIG given, any
// timm- or official-layout safetensors (read as init_from reads it). key=value overrides the
// config (device=cpu, say); without CONFIG, the model's own config in fp32 on device=auto (the
// GPU where there is one).
//
// Image form: each IMAGE is a JPEG or PNG file; each DIR contributes its *.jpg, *.jpeg and *.png
// files (any case), sorted by name, not recursive (an ImageFolder class directory's listing).
// Every image gets the validation transform of training: decoded to model.in_chans channels,
// resized to img_size / data.crop_pct keeping the aspect, center-cropped to img_size with
// data.interpolation, then normalized with data.mean / data.std; batches of up to 32 per
// forward. Printed per image, in input order: the top K classes (default 5, at most
// model.num_classes) with their softmax probabilities, as
//   PATH:  1. NAME 0.912  2. NAME 0.051 ...
// or, with --json, one object per line:
//   {"path": "...", "top": [{"class": 3, "name": "Dress", "prob": 0.912}, ...]}
// Names come from the model's metadata "class_names" (checkpoints) or "swin.class_names"
// (exports): the training set's class names joined with '\n' in label order. A model without
// them prints class indices ("class 3"; "name": null); a list longer than model.num_classes is
// ignored with a warning; a shorter one (fewer class directories than model.num_classes, which
// training allows) names the classes it has. An argument ending in .ini is CONFIG; one with '='
// that is no existing file is key=value. Errors exit 1 naming the path: a missing file or an
// empty directory before any prediction; a file that does not decode where it is met (the lines
// printed before it stand).
//
// Tensor form, for checks against other runtimes: INPUT holds "input", F32 (B, H, W, Cin)
// channels-last, already normalized; OUT receives "logits", F32 (B, classes).
#define _POSIX_C_SOURCE 200809L  // stat
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/dataset.h"
#include "data/image.h"
#include "data/transform.h"
#include "src/base/config.h"
#include "src/base/util.h"
#include "src/io/checkpoint.h"
#include "src/io/import.h"
#include "src/io/safetensors.h"
#include "src/model/backend.h"
#include "src/model/model.h"

#define PREDICT_BATCH 32  // images per forward in the image form
#define DEFAULT_TOP 5

static const char *usage =
    "usage: swin_predict MODEL IMAGE|DIR [IMAGE|DIR ...] [CONFIG.ini] [--json] [--top K] "
    "[key=value ...]\n"
    "       swin_predict MODEL.safetensors INPUT.safetensors OUT.safetensors [CONFIG.ini] "
    "[key=value ...]\n"
    "The second argument picks the form: ending in .safetensors, the tensor form (INPUT holds\n"
    "'input' F32 (B, H, W, C), normalized; OUT gets 'logits'); otherwise the image form: JPEG or\n"
    "PNG files, or directories of them (*.jpg, *.jpeg, *.png, not recursive), through the\n"
    "validation transform; prints the top K classes (default 5) of each, --json one JSON object\n"
    "per line.\n";

static bool path_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

static bool is_dir(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

// ---------------------------------------------------------------------------------------------
// The model: its config, class names and weights.

typedef struct {
  const char *path;  // MODEL
  const char *ini;   // CONFIG.ini, or NULL: the model's own config
  char **overrides;  // key=value
  int num_overrides;
} ModelArgs;

typedef struct {
  Config cfg;
  bool checkpoint;    // a swin.c checkpoint (else weights import_weights reads)
  char *class_names;  // '\n'-joined (malloc'ed), or NULL
  Backend be;
  Model m;
} Predictor;

static int load_config(Config *cfg, const ModelArgs *a, const SafeTensors *model, Error *err) {
  config_defaults(cfg);
  if (a->ini) {
    if (config_load_file(cfg, a->ini, err) != 0) return -1;
  } else {
    const char *ini = safetensors_meta_get(model, "config");
    if (!ini) ini = safetensors_meta_get(model, "swin.config");
    if (!ini)
      return error_set(err,
                       "'%s' carries no config (metadata 'config' or 'swin.config')\n"
                       "HINT: pass the model's CONFIG.ini (after OUT in the tensor form)",
                       model->path);
    if (config_load_string(cfg, ini, model->path, err) != 0) return -1;
    // Where the model was trained does not matter here: the best device, in fp32.
    snprintf(cfg->device, sizeof cfg->device, "auto");
    snprintf(cfg->precision, sizeof cfg->precision, "fp32");
  }
  for (int i = 0; i < a->num_overrides; i++)
    if (config_apply_override(cfg, a->overrides[i], err) != 0) return -1;
  return config_validate(cfg, err);
}

// Reads MODEL's config, kind and class names into p; builds nothing yet.
static int predictor_read(Predictor *p, const ModelArgs *a, Error *err) {
  SafeTensors model;
  *p = (Predictor){0};
  if (safetensors_read(&model, a->path, err) != 0) return -1;
  int rc = load_config(&p->cfg, a, &model, err);
  const char *format = safetensors_meta_get(&model, "format");
  p->checkpoint = format && strcmp(format, CHECKPOINT_FORMAT) == 0;
  const char *names = safetensors_meta_get(&model, "class_names");
  if (!names) names = safetensors_meta_get(&model, "swin.class_names");
  if (names) {
    size_t len = strlen(names) + 1;
    p->class_names = memcpy(malloc_check(len), names, len);
  }
  safetensors_free(&model);
  return rc;
}

// The backend and the model for batches of up to B, with MODEL's weights.
static int predictor_build(Predictor *p, const char *path, int B, Error *err) {
  if (backend_create(&p->be, p->cfg.device, p->cfg.precision, err) != 0) return -1;
  if (model_create(&p->m, &p->cfg, &p->be, B, err) != 0) return -1;
  int rc;
  if (p->checkpoint) {
    size_t bytes = sizeof(float) * (size_t)p->m.num_floats;
    float *ea = malloc_check(bytes), *eas = malloc_check(bytes);
    TrainState state;
    rc = checkpoint_load(path, &p->m, ea, eas, NULL, &state, err);
    free(ea);
    free(eas);
  } else {
    rc = import_weights(&p->m, path, NULL, err);
  }
  if (rc == 0) model_weights_to_backend(&p->m);
  return rc;
}

static void predictor_free(Predictor *p) {
  if (p->m.params) model_destroy(&p->m);
  if (p->be.ops) backend_destroy(&p->be);
  free(p->class_names);
}

// ---------------------------------------------------------------------------------------------
// Tensor form.

static int predict_tensors(int argc, char **argv, Error *err) {
  bool has_ini = argc > 4 && !strchr(argv[4], '=');
  ModelArgs a = {.path = argv[1],
                 .ini = has_ini ? argv[4] : NULL,
                 .overrides = argv + (has_ini ? 5 : 4),
                 .num_overrides = argc - (has_ini ? 5 : 4)};
  Predictor p;
  int rc = predictor_read(&p, &a, err);
  SafeTensors input = {0};
  const SafeTensorEntry *e = NULL;
  if (rc == 0) rc = safetensors_read(&input, argv[2], err);
  bool input_read = rc == 0;
  if (rc == 0) rc = import_input_batch(&input, &p.cfg, &e, err);
  int B = e ? (int)e->shape[0] : 0;
  if (rc == 0) rc = predictor_build(&p, argv[1], B, err);
  if (rc == 0) {
    Backend *be = &p.be;
    size_t in_bytes = e->end - e->begin;
    void *images = be->ops->alloc(be, in_bytes);
    be->ops->upload(be, images, safetensors_entry_data(&input, e), in_bytes);
    model_forward(&p.m, images, DTYPE_F32, (Normalize){{0}, {0}}, B, false, 0, NULL);
    int C = p.cfg.num_classes;
    float *logits = malloc_check(sizeof(float) * (size_t)B * (size_t)C);
    be->ops->download(be, logits, p.m.acts.logits, sizeof(float) * (size_t)B * C);
    be->ops->release(be, images);
    SafeTensorWriter w;
    safetensors_writer_init(&w);
    safetensors_writer_add(&w, "logits", DTYPE_F32, 2, (int64_t[]){B, C}, logits);
    rc = safetensors_writer_save(&w, argv[3], err);
    safetensors_writer_free(&w);
    free(logits);
    if (rc == 0) printf("wrote logits (%d, %d) to %s\n", B, C, argv[3]);
  }
  predictor_free(&p);
  if (input_read) safetensors_free(&input);
  return rc;
}

// ---------------------------------------------------------------------------------------------
// Image form.

typedef struct {
  ModelArgs model;
  char **inputs;  // IMAGE and DIR arguments, in order
  int num_inputs;
  bool json;
  int top;  // classes shown per image (before clamping to num_classes)
} ImageArgs;

// Sorts argv[2..] into a; prints the problem and returns -1 on a bad option.
static int parse_image_args(ImageArgs *a, int argc, char **argv) {
  *a = (ImageArgs){.model = {.path = argv[1]}, .top = DEFAULT_TOP};
  a->inputs = malloc_check(sizeof(char *) * (size_t)argc);
  a->model.overrides = malloc_check(sizeof(char *) * (size_t)argc);
  for (int i = 2; i < argc; i++) {
    const char *arg = argv[i];
    if (strcmp(arg, "--json") == 0) {
      a->json = true;
    } else if (strcmp(arg, "--top") == 0) {
      char *end = NULL;
      long k = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : 0;
      if (i + 1 >= argc || end == argv[i + 1] || *end || k < 1 || k > 1 << 20) {
        fprintf(stderr, "error: --top needs a class count K >= 1\nHINT: --top 3\n");
        return -1;
      }
      a->top = (int)k;
      i++;
    } else if (strncmp(arg, "--", 2) == 0) {
      fprintf(stderr, "error: unknown option '%s'\n%s", arg, usage);
      return -1;
    } else if (ends_with(arg, ".ini") && !is_dir(arg)) {
      a->model.ini = arg;
    } else if (strchr(arg, '=') && !path_exists(arg)) {
      a->model.overrides[a->model.num_overrides++] = argv[i];
    } else {
      a->inputs[a->num_inputs++] = argv[i];
    }
  }
  if (a->num_inputs == 0) {
    fprintf(stderr, "error: no image or directory given\n%s", usage);
    return -1;
  }
  return 0;
}

// Every image the inputs name, in order: a file as given, a directory's images sorted.
static int list_images(const ImageArgs *a, char ***paths, int *count, Error *err) {
  int cap = 64, n = 0;
  char **list = malloc_check(sizeof(char *) * (size_t)cap);
  int rc = 0;
  for (int i = 0; i < a->num_inputs && rc == 0; i++) {
    const char *in = a->inputs[i];
    char **found = NULL;
    int found_count = 0;
    if (is_dir(in)) {
      rc = dataset_list_images(in, &found, &found_count, err);
      if (rc == 0 && found_count == 0)
        rc = error_set(err,
                       "directory '%s' has no .jpg/.jpeg/.png images\n"
                       "HINT: swin_predict reads the images directly in a directory, not in its "
                       "subdirectories; name those, or the image files",
                       in);
    } else if (path_exists(in)) {
      size_t len = strlen(in) + 1;
      found = malloc_check(sizeof(char *));
      found[0] = memcpy(malloc_check(len), in, len);
      found_count = 1;
    } else {
      rc = error_set(err,
                     "image '%s' does not exist\nHINT: give JPEG or PNG files, or directories "
                     "of them, after MODEL",
                     in);
    }
    if (rc != 0) break;
    if (n + found_count > cap) {
      while (n + found_count > cap) cap *= 2;
      char **grown = malloc_check(sizeof(char *) * (size_t)cap);
      memcpy(grown, list, sizeof(char *) * (size_t)n);
      free(list);
      list = grown;
    }
    memcpy(list + n, found, sizeof(char *) * (size_t)found_count);
    n += found_count;
    free(found);  // the paths moved to list
  }
  if (rc != 0) {
    dataset_paths_free(list, n);
    return -1;
  }
  *paths = list;
  *count = n;
  return 0;
}

// Reads and decodes path to cfg->in_chans channels, then the eval transform into pixels
// (img_h, img_w, in_chans).
static int load_image(const char *path, const TransformParams *tp, uint8_t *pixels, Error *err) {
  size_t size;
  uint8_t *file = read_file(path, &size, err);
  if (!file) return error_prefix(err, "image: ");
  char why[256];
  int h, w;
  uint8_t *img = image_decode(file, size, tp->chans, &h, &w, why, sizeof why);
  free(file);
  if (!img)
    return error_set(err, "cannot decode image '%s': %s\nHINT: give JPEG or PNG files", path, why);
  transform_eval(tp, img, h, w, pixels);
  image_free(img);
  return 0;
}

// names[c] for c < num_classes from the '\n'-joined list (NULL beyond it, or every entry NULL
// when there is no list or it has more names than classes, which is then named on stderr).
// The strings point into joined, which is cut at the separators.
static const char **split_class_names(char *joined, int num_classes, const char *model) {
  const char **names = calloc_check((size_t)num_classes, sizeof(char *));
  if (!joined) return names;
  int count = 1;
  for (const char *s = joined; *s; s++) count += *s == '\n';
  if (count > num_classes) {
    fprintf(stderr,
            "warning: '%s' names %d classes but model.num_classes is %d; printing class "
            "indices only\n",
            model, count, num_classes);
    return names;
  }
  char *s = joined;
  for (int c = 0; c < count; c++) {
    names[c] = s;
    char *nl = strchr(s, '\n');
    if (nl) {
      *nl = '\0';
      s = nl + 1;
    }
  }
  return names;
}

static void json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\')
      fprintf(f, "\\%c", ch);
    else if (ch == '\n')
      fputs("\\n", f);
    else if (ch == '\t')
      fputs("\\t", f);
    else if (ch < 0x20)
      fprintf(f, "\\u%04x", ch);
    else
      fputc(ch, f);
  }
  fputc('"', f);
}

// The K most probable classes of one image's logits (C): softmax in double, then the largest K
// in descending order (ties: the lower class first).
static void top_classes(const float *logits, int C, int K, double *prob, int *order) {
  double max = logits[0], sum = 0;
  for (int c = 1; c < C; c++) max = fmax(max, logits[c]);
  for (int c = 0; c < C; c++) sum += prob[c] = exp((double)logits[c] - max);
  for (int c = 0; c < C; c++) prob[c] /= sum;
  for (int k = 0; k < K; k++) {
    int best = -1;
    for (int c = 0; c < C; c++) {
      bool taken = false;
      for (int j = 0; j < k && !taken; j++) taken = order[j] == c;
      if (!taken && (best < 0 || prob[c] > prob[best])) best = c;
    }
    order[k] = best;
  }
}

static void print_prediction(const char *path, const double *prob, const int *order, int K,
                             const char **names, bool json) {
  if (json) {
    fputs("{\"path\": ", stdout);
    json_string(stdout, path);
    fputs(", \"top\": [", stdout);
    for (int k = 0; k < K; k++) {
      int c = order[k];
      printf("%s{\"class\": %d, \"name\": ", k ? ", " : "", c);
      if (names[c])
        json_string(stdout, names[c]);
      else
        fputs("null", stdout);
      printf(", \"prob\": %.6g}", prob[c]);
    }
    fputs("]}\n", stdout);
    return;
  }
  printf("%s:", path);
  for (int k = 0; k < K; k++) {
    int c = order[k];
    if (names[c])
      printf("  %d. %s %.3f", k + 1, names[c], prob[c]);
    else
      printf("  %d. class %d %.3f", k + 1, c, prob[c]);
  }
  printf("\n");
}

// Runs the images through the model in batches of p->m's size, printing as it goes.
static int predict_batches(Predictor *p, char **paths, int n, int B, int K, const char **names,
                           bool json, Error *err) {
  const Config *cfg = &p->cfg;
  Backend *be = &p->be;
  TransformParams tp;
  if (transform_params_from_config(&tp, cfg, err) != 0) return -1;
  size_t image_bytes = (size_t)cfg->img_h * cfg->img_w * cfg->in_chans;
  int C = cfg->num_classes;
  uint8_t *pixels = malloc_check(image_bytes * (size_t)B);  // (B, H, W, Cin)
  float *logits = malloc_check(sizeof(float) * (size_t)B * C);
  double *prob = malloc_check(sizeof(double) * (size_t)C);
  int *order = malloc_check(sizeof(int) * (size_t)K);
  void *input = be->ops->alloc(be, image_bytes * (size_t)B);
  Normalize norm = model_input_normalize(cfg);
  int rc = 0;
  for (int first = 0; first < n && rc == 0; first += B) {
    int count = n - first < B ? n - first : B;
    for (int k = 0; k < count && rc == 0; k++)
      rc = load_image(paths[first + k], &tp, pixels + image_bytes * k, err);
    if (rc != 0) break;
    be->ops->upload(be, input, pixels, image_bytes * (size_t)count);
    model_forward(&p->m, input, DTYPE_U8, norm, count, false, cfg->seed, NULL);
    be->ops->download(be, logits, p->m.acts.logits, sizeof(float) * (size_t)count * C);
    for (int k = 0; k < count; k++) {
      top_classes(logits + (size_t)k * C, C, K, prob, order);
      print_prediction(paths[first + k], prob, order, K, names, json);
    }
    fflush(stdout);
  }
  be->ops->release(be, input);
  free(pixels);
  free(logits);
  free(prob);
  free(order);
  return rc;
}

static int predict_images(int argc, char **argv, Error *err) {
  ImageArgs a;
  if (parse_image_args(&a, argc, argv) != 0) {
    free(a.inputs);
    free(a.model.overrides);
    return 2;
  }
  Predictor p;
  char **paths = NULL;
  int n = 0;
  const char **names = NULL;
  int rc = predictor_read(&p, &a.model, err);
  if (rc == 0) rc = list_images(&a, &paths, &n, err);
  int B = n < PREDICT_BATCH ? n : PREDICT_BATCH;
  if (rc == 0) rc = predictor_build(&p, a.model.path, B, err);
  if (rc == 0) {
    int K = a.top < p.cfg.num_classes ? a.top : p.cfg.num_classes;
    names = split_class_names(p.class_names, p.cfg.num_classes, a.model.path);
    rc = predict_batches(&p, paths, n, B, K, names, a.json, err);
  }
  free(names);
  dataset_paths_free(paths, n);
  predictor_free(&p);
  free(a.inputs);
  free(a.model.overrides);
  return rc == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
  bool tensor_form = argc >= 3 && ends_with(argv[2], ".safetensors");
  if (argc < 3 || (tensor_form && argc < 4)) {
    fprintf(stderr, "%s", usage);
    return 2;
  }
  Error err;
  if (tensor_form) {
    if (predict_tensors(argc, argv, &err) == 0) return 0;
    fprintf(stderr, "error: %s\n", err.msg);
    return 1;
  }
  int rc = predict_images(argc, argv, &err);
  if (rc == 1) fprintf(stderr, "error: %s\n", err.msg);
  return rc;
}
