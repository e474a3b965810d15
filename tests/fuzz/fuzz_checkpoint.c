// fuzz_checkpoint.c: a file handed to the programs as weights: checkpoint_load (resume=,
// swin_export, swin_predict), import_weights (init_from=, swin_predict with a config) and
// swin_predict's input batch, for a small fixed model. Whatever loads must be usable: finite
// weights, non-negative moments and data position, and an input the forward pass accepts.
#define _XOPEN_SOURCE 700  // tests/fuzz/fuzz.h: mkdtemp, nftw
#include <math.h>

#include "src/io/checkpoint.h"
#include "src/io/import.h"
#include "src/io/safetensors.h"
#include "src/model/model.h"
#include "tests/fuzz/fuzz.h"

enum { MAX_BATCH = 4 };  // inputs of more images are only checked, not run

typedef struct {
  Config cfg;
  Backend be;  // the CPU
  Model model;
  float *exp_avg, *exp_avg_sq;
} Fixture;

static Fixture *fixture(void) {
  static Fixture f;
  static bool ready;
  if (ready) return &f;
  Error err;
  fuzz_tiny_config(&f.cfg);
  FUZZ_REQUIRE(config_validate(&f.cfg, &err) == 0 &&
                   backend_create(&f.be, "cpu", "fp32", &err) == 0 &&
                   model_create(&f.model, &f.cfg, &f.be, MAX_BATCH, &err) == 0,
               "tiny model: %s", err.msg);
  f.exp_avg = calloc_check((size_t)f.model.num_floats, sizeof(float));
  f.exp_avg_sq = calloc_check((size_t)f.model.num_floats, sizeof(float));
  ready = true;
  return &f;
}

static void check_loaded_weights(const Model *m, const char *what) {
  int64_t bad = first_nonfinite(m->weights, m->num_floats);
  FUZZ_REQUIRE(bad < 0, "%s loaded a non-finite weight (element %lld)", what, (long long)bad);
}

static void check_checkpoint(Fixture *f, const char *path) {
  TrainState s;
  Error err;
  model_init_weights(&f->model, 0);
  if (checkpoint_load(path, &f->model, f->exp_avg, f->exp_avg_sq, NULL, &s, &err) != 0) return;
  check_loaded_weights(&f->model, "checkpoint_load");
  FUZZ_REQUIRE(first_nonfinite(f->exp_avg, f->model.num_floats) < 0 &&
                   first_nonfinite(f->exp_avg_sq, f->model.num_floats) < 0,
               "checkpoint_load loaded non-finite moments");
  for (int64_t i = 0; i < f->model.num_floats; i++)
    FUZZ_REQUIRE(f->exp_avg_sq[i] >= 0, "negative second moment at %lld", (long long)i);
  FUZZ_REQUIRE(
      s.step >= 0 && s.epoch >= 0 && s.batch >= 0 && isfinite(s.loss_scale) && s.loss_scale > 0,
      "checkpoint_load accepted step %lld epoch %lld batch %lld loss scale %g", (long long)s.step,
      (long long)s.epoch, (long long)s.batch, s.loss_scale);
}

static void check_input(Fixture *f, const char *path) {
  SafeTensors st;
  Error err;
  if (safetensors_read(&st, path, &err) != 0) return;
  const SafeTensorEntry *e;
  if (import_input_batch(&st, &f->cfg, &e, &err) == 0) {
    FUZZ_REQUIRE(e->shape[0] >= 1 && e->shape[0] <= INPUT_BATCH_MAX, "batch %lld accepted",
                 (long long)e->shape[0]);
    if (e->shape[0] <= MAX_BATCH) {  // CPU backend memory is host memory
      model_weights_to_backend(&f->model);
      model_forward(&f->model, safetensors_entry_data(&st, e), DTYPE_F32, (Normalize){{0}, {0}},
                    (int)e->shape[0], false, 0, NULL);
    }
  }
  safetensors_free(&st);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Fixture *f = fixture();
  const char *path = fuzz_write("weights.safetensors", data, size);
  check_checkpoint(f, path);
  Error err;
  model_init_weights(&f->model, 0);
  if (import_weights(&f->model, path, NULL, &err) == 0)
    check_loaded_weights(&f->model, "import_weights");
  check_input(f, path);
  return 0;
}
