// swin_predict: logits of a model for a batch of images, for checks against other runtimes.
//   swin_predict MODEL.safetensors INPUT.safetensors OUT.safetensors [CONFIG.ini] [key=value ...]
// MODEL is a swin.c checkpoint or export (both carry their config), or, with CONFIG given, any
// timm- or official-layout safetensors (read as init_from reads it). key=value overrides the
// config (device=cpu, say); without CONFIG, the model's own config in fp32 on device=auto. INPUT
// holds "input", F32 (B, H, W, Cin) channels-last, already normalized; OUT receives "logits", F32
// (B, classes).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/config.h"
#include "src/io/checkpoint.h"
#include "src/io/import.h"
#include "src/io/safetensors.h"
#include "src/model/backend.h"
#include "src/model/model.h"

static int config_from_args(Config *cfg, int argc, char **argv, const SafeTensors *model,
                            Error *err) {
  config_defaults(cfg);
  int first_override = 4;
  if (argc > 4 && !strchr(argv[4], '=')) {
    if (config_load_file(cfg, argv[4], err) != 0) return -1;
    first_override = 5;
  } else {
    const char *ini = safetensors_meta_get(model, "config");
    if (!ini) ini = safetensors_meta_get(model, "swin.config");
    if (!ini)
      return error_set(err, "'%s' carries no config\nHINT: pass the model's CONFIG.ini after OUT",
                       model->path);
    if (config_load_string(cfg, ini, model->path, err) != 0) return -1;
    // Where the model was trained does not matter here: the best device, in fp32.
    snprintf(cfg->device, sizeof cfg->device, "auto");
    snprintf(cfg->precision, sizeof cfg->precision, "fp32");
  }
  for (int i = first_override; i < argc; i++)
    if (config_apply_override(cfg, argv[i], err) != 0) return -1;
  return config_validate(cfg, err);
}

static int predict(int argc, char **argv, Error *err) {
  SafeTensors model, input;
  if (safetensors_read(&model, argv[1], err) != 0) return -1;
  Config cfg;
  int rc = config_from_args(&cfg, argc, argv, &model, err);
  const char *format = safetensors_meta_get(&model, "format");
  bool checkpoint = format && strcmp(format, CHECKPOINT_FORMAT) == 0;
  safetensors_free(&model);
  if (rc != 0) return -1;
  if (safetensors_read(&input, argv[2], err) != 0) return -1;
  const SafeTensorEntry *e;
  if (import_input_batch(&input, &cfg, &e, err) != 0) {
    safetensors_free(&input);
    return -1;
  }
  int B = (int)e->shape[0];
  Backend be;
  Model m = {0};
  rc = backend_create(&be, cfg.device, cfg.precision, err);
  if (rc == 0) rc = model_create(&m, &cfg, &be, B, err);
  if (rc == 0) {
    if (checkpoint) {
      size_t bytes = sizeof(float) * (size_t)m.num_floats;
      float *ea = malloc_check(bytes), *eas = malloc_check(bytes);
      TrainState state;
      rc = checkpoint_load(argv[1], &m, ea, eas, &state, err);
      free(ea);
      free(eas);
    } else {
      rc = import_weights(&m, argv[1], NULL, err);
    }
  }
  if (rc == 0) {
    model_weights_to_backend(&m);
    size_t in_bytes = e->end - e->begin;
    void *images = be.ops->alloc(&be, in_bytes);
    be.ops->upload(&be, images, safetensors_entry_data(&input, e), in_bytes);
    model_forward(&m, images, DTYPE_F32, (Normalize){{0}, {0}}, B, false, 0, NULL, 0);
    float *logits = malloc_check(sizeof(float) * (size_t)B * (size_t)cfg.num_classes);
    be.ops->download(&be, logits, m.acts.logits, sizeof(float) * (size_t)B * cfg.num_classes);
    be.ops->release(&be, images);
    SafeTensorWriter w;
    safetensors_writer_init(&w);
    safetensors_writer_add(&w, "logits", DTYPE_F32, 2, (int64_t[]){B, cfg.num_classes}, logits);
    rc = safetensors_writer_save(&w, argv[3], err);
    safetensors_writer_free(&w);
    free(logits);
    if (rc == 0) printf("wrote logits (%d, %d) to %s\n", B, cfg.num_classes, argv[3]);
  }
  if (m.params) model_destroy(&m);
  backend_destroy(&be);
  safetensors_free(&input);
  return rc;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr,
            "usage: swin_predict MODEL.safetensors INPUT.safetensors OUT.safetensors "
            "[CONFIG.ini] [key=value ...]\n");
    return 2;
  }
  Error err;
  if (predict(argc, argv, &err) != 0) {
    fprintf(stderr, "error: %s\n", err.msg);
    return 1;
  }
  return 0;
}
