// swin_export: write a checkpoint's weights as a flat timm state dict in safetensors.
//   swin_export CKPT.safetensors OUT.safetensors [dtype=f32|bf16|f16]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/checkpoint.h"
#include "src/config.h"
#include "src/import.h"
#include "src/model.h"
#include "src/safetensors.h"

static int load_model_from_checkpoint(Model *m, const char *path, Error *err) {
  // The checkpoint carries its resolved config: build that model, then load into it.
  SafeTensors st;
  if (safetensors_read(&st, path, err) != 0) return -1;
  const char *ini = safetensors_meta_get(&st, "config");
  Config cfg;
  config_defaults(&cfg);
  int rc = -1;
  if (!ini) {
    error_set(err, "'%s' has no 'config' metadata: not a swin.c checkpoint", path);
  } else if (config_load_string(&cfg, ini, path, err) == 0 && config_validate(&cfg, err) == 0 &&
             model_create(m, &cfg, NULL, 0, err) == 0) {
    rc = 0;
  }
  safetensors_free(&st);
  if (rc != 0) return -1;
  size_t bytes = sizeof(float) * (size_t)m->num_floats;
  float *exp_avg = malloc_check(bytes), *exp_avg_sq = malloc_check(bytes);
  TrainState state;
  rc = checkpoint_load(path, m, exp_avg, exp_avg_sq, &state, err);
  free(exp_avg);
  free(exp_avg_sq);
  return rc;
}

int main(int argc, char **argv) {
  if (argc < 3 || argc > 4) {
    fprintf(stderr, "usage: swin_export CKPT.safetensors OUT.safetensors [dtype=f32|bf16|f16]\n");
    return 2;
  }
  DType dtype = DTYPE_F32;
  if (argc == 4) {
    const char *d = argv[3];
    if (strcmp(d, "dtype=f32") == 0)
      dtype = DTYPE_F32;
    else if (strcmp(d, "dtype=bf16") == 0)
      dtype = DTYPE_BF16;
    else if (strcmp(d, "dtype=f16") == 0)
      dtype = DTYPE_F16;
    else {
      fprintf(stderr, "error: bad argument '%s'\nHINT: dtype=f32, dtype=bf16 or dtype=f16\n", d);
      return 2;
    }
  }
  Model m;
  Error err;
  if (load_model_from_checkpoint(&m, argv[1], &err) != 0 ||
      export_weights(&m, argv[2], dtype, &err) != 0) {
    fprintf(stderr, "error: %s\n", err.msg);
    return 1;
  }
  printf("exported %d tensors (%lld parameters, %s) to %s\n", m.num_params, (long long)m.num_values,
         dtype_name(dtype), argv[2]);
  model_destroy(&m);
  return 0;
}
