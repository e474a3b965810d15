// swin_export: write a checkpoint's weights as a flat timm state dict in safetensors, or the
// model as an ONNX inference graph when OUT ends in .onnx.
//   swin_export CKPT.safetensors OUT.safetensors [dtype=f32|bf16|f16] [weights=model|ema]
//   swin_export CKPT.safetensors OUT.onnx [dtype=f32|f16] [batch=dynamic|N] [weights=model|ema]
// weights=ema exports the checkpoint's moving average of the weights (train.ema_decay) instead
// of the weights themselves. A safetensors export carries the checkpoint's config and class
// names (metadata swin.config, swin.class_names) for swin_predict; an ONNX model carries neither.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/config.h"
#include "src/base/util.h"
#include "src/io/checkpoint.h"
#include "src/io/import.h"
#include "src/io/onnx.h"
#include "src/io/safetensors.h"
#include "src/model/model.h"

// The checkpoint carries its resolved config: build that model, then load into it: its weights,
// or with ema its moving average of them (an error when it has none). *class_names gets a copy of
// its class names (NULL when it has none).
static int load_model_from_checkpoint(Model *m, const char *path, bool ema, char **class_names,
                                      Error *err) {
  SafeTensors st;
  *class_names = NULL;
  if (safetensors_read(&st, path, err) != 0) return -1;
  const char *ini = safetensors_meta_get(&st, "config");
  const char *names = safetensors_meta_get(&st, "class_names");
  Config cfg;
  config_defaults(&cfg);
  int rc = -1;
  if (!ini) {
    error_set(err, "'%s' has no 'config' metadata: not a swin.c checkpoint", path);
  } else if (config_load_string(&cfg, ini, path, err) == 0 && config_validate(&cfg, err) == 0 &&
             model_create(m, &cfg, NULL, 0, err) == 0) {
    rc = 0;
    if (names) {
      size_t len = strlen(names) + 1;
      *class_names = memcpy(malloc_check(len), names, len);
    }
  }
  safetensors_free(&st);
  if (rc != 0) return -1;
  size_t bytes = sizeof(float) * (size_t)m->num_floats;
  float *exp_avg = malloc_check(bytes), *exp_avg_sq = malloc_check(bytes);
  float *average = ema ? calloc_check(1, bytes) : NULL;
  TrainState state;
  rc = checkpoint_load(path, m, exp_avg, exp_avg_sq, average, &state, err);
  if (rc == 0 && ema && !state.has_ema)
    rc = error_set(err,
                   "weights=ema: checkpoint '%s' holds no moving average of the weights (its "
                   "run had train.ema_decay = 0)\nHINT: export without weights=ema, or train with "
                   "train.ema_decay > 0 (timm: 0.9998)",
                   path);
  else if (rc == 0 && ema)
    memcpy(m->weights, average, bytes);
  free(exp_avg);
  free(exp_avg_sq);
  free(average);
  if (rc != 0) {
    model_destroy(m);
    free(*class_names);
    *class_names = NULL;
  }
  return rc;
}

static const char *usage =
    "usage: swin_export CKPT.safetensors OUT.safetensors [dtype=f32|bf16|f16] [weights=model|ema]\n"
    "       swin_export CKPT.safetensors OUT.onnx [dtype=f32|f16] [batch=dynamic|N] "
    "[weights=model|ema]\n"
    "OUT ending in .onnx writes an ONNX model (opset 17): input 'images' (N, C, H, W) float32,\n"
    "normalized; output 'logits' (N, classes) float32. Any other OUT writes the weights as a\n"
    "timm state dict in safetensors. weights=ema exports the checkpoint's moving average of the\n"
    "weights (train.ema_decay) instead of the weights.\n";

typedef struct {
  bool onnx;
  DType dtype;
  int64_t batch;  // ONNX: 0 = dynamic
  bool ema;       // weights=ema: the moving average
} ExportArgs;

// Parses the key=value arguments after OUT; prints the problem and returns -1 on a bad one.
static int parse_args(ExportArgs *a, int argc, char **argv) {
  a->onnx = ends_with(argv[2], ".onnx");
  a->dtype = DTYPE_F32;
  a->batch = 0;
  a->ema = false;
  const char *dtypes =
      a->onnx ? "dtype=f32 or dtype=f16 (ONNX)" : "dtype=f32, dtype=bf16 or dtype=f16";
  for (int i = 3; i < argc; i++) {
    const char *arg = argv[i];
    if (strcmp(arg, "dtype=f32") == 0) {
      a->dtype = DTYPE_F32;
    } else if (strcmp(arg, "dtype=f16") == 0) {
      a->dtype = DTYPE_F16;
    } else if (strcmp(arg, "dtype=bf16") == 0 && !a->onnx) {
      a->dtype = DTYPE_BF16;
    } else if (strncmp(arg, "dtype=", 6) == 0) {
      fprintf(stderr, "error: bad argument '%s'\nHINT: %s\n", arg, dtypes);
      return -1;
    } else if (strncmp(arg, "batch=", 6) == 0 && a->onnx) {
      const char *v = arg + 6;
      char *end = NULL;
      long long n = strtoll(v, &end, 10);
      if (strcmp(v, "dynamic") == 0) {
        a->batch = 0;
      } else if (end != v && *end == 0 && n >= 1 && n <= 1 << 30) {
        a->batch = n;
      } else {
        fprintf(stderr,
                "error: bad argument '%s'\nHINT: batch=dynamic (any batch at run time) or "
                "batch=N with N >= 1\n",
                arg);
        return -1;
      }
    } else if (strcmp(arg, "weights=model") == 0 || strcmp(arg, "weights=ema") == 0) {
      a->ema = strcmp(arg, "weights=ema") == 0;
    } else if (strncmp(arg, "weights=", 8) == 0) {
      fprintf(stderr,
              "error: bad argument '%s'\nHINT: weights=model (the default) or weights=ema (the "
              "moving average of a run with train.ema_decay)\n",
              arg);
      return -1;
    } else if (strncmp(arg, "batch=", 6) == 0) {
      fprintf(stderr,
              "error: '%s' applies only to ONNX output\nHINT: name the output OUT.onnx, or drop "
              "%s\n",
              arg, arg);
      return -1;
    } else {
      fprintf(stderr, "error: bad argument '%s'\nHINT: %s%s, weights=model or weights=ema\n", arg,
              dtypes, a->onnx ? ", batch=dynamic or batch=N" : "");
      return -1;
    }
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 3 || argc > 6) {
    fprintf(stderr, "%s", usage);
    return 2;
  }
  ExportArgs a;
  if (parse_args(&a, argc, argv) != 0) return 2;
  Model m;
  Error err;
  char *class_names;
  if (load_model_from_checkpoint(&m, argv[1], a.ema, &class_names, &err) != 0) {
    fprintf(stderr, "error: %s\n", err.msg);
    return 1;
  }
  int rc = a.onnx ? onnx_export_swin(&m, argv[2], a.dtype, a.batch, &err)
                  : export_weights(&m, argv[2], a.dtype, class_names, &err);
  free(class_names);
  if (rc != 0) {
    fprintf(stderr, "error: %s\n", err.msg);
    model_destroy(&m);
    return 1;
  }
  if (a.onnx) {
    char batch[32] = "dynamic";
    if (a.batch > 0) snprintf(batch, sizeof batch, "%lld", (long long)a.batch);
    printf("exported an ONNX model (opset %d, %s, batch %s, %lld parameters%s) to %s\n", ONNX_OPSET,
           a.dtype == DTYPE_F16 ? "f16" : "f32", batch, (long long)m.num_values,
           a.ema ? ", the moving average" : "", argv[2]);
  } else {
    printf("exported %d tensors (%lld parameters, %s%s) to %s\n", m.num_params,
           (long long)m.num_values, dtype_name(a.dtype), a.ema ? ", the moving average" : "",
           argv[2]);
  }
  model_destroy(&m);
  return 0;
}
