// fuzz_config.c: the INI parser through its two doors, a file (config_load_file) and
// command-line overrides (config_apply_override), then validation, the printed table, and the
// round trip every checkpoint relies on: a valid config written as INI reads back unchanged.
//
// Input: the config file's bytes up to the first NUL; every later NUL-separated piece is one
// "key=value" override.
#define _XOPEN_SOURCE 700  // tests/fuzz/fuzz.h: mkdtemp, nftw
#include <stdio.h>

#include "src/base/config.h"
#include "tests/fuzz/fuzz.h"

// A config that validates must survive config_to_ini -> config_load_string exactly: checkpoints
// store their config that way and compare models with config_same_model.
static void check_round_trip(const Config *cfg) {
  Error err;
  char *ini = config_to_ini(cfg);
  Config back;
  config_defaults(&back);
  FUZZ_REQUIRE(config_load_string(&back, ini, "round trip", &err) == 0,
               "config_to_ini output does not parse: %s", err.msg);
  char *again = config_to_ini(&back);
  FUZZ_REQUIRE(strcmp(ini, again) == 0, "the INI changed over a round trip:\n%s\n---\n%s", ini,
               again);
  FUZZ_REQUIRE(config_same_model(cfg, &back, &err) == 0, "round trip changed the model: %s",
               err.msg);
  FUZZ_REQUIRE(config_validate(&back, &err) == 0, "round trip no longer validates: %s", err.msg);
  free(again);
  free(ini);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static FILE *sink;  // config_print's output goes nowhere, but through the real code
  if (!sink) sink = fopen("/dev/null", "w");
  const uint8_t *nul = memchr(data, 0, size);
  size_t file_size = nul ? (size_t)(nul - data) : size;
  const char *path = fuzz_write("config.ini", data, file_size);

  Config cfg;
  Error err;
  config_defaults(&cfg);
  if (config_load_file(&cfg, path, &err) != 0) return 0;
  // Overrides: each piece between NULs, as a C string (a copy, so it ends where the piece does).
  for (size_t pos = file_size + 1; pos < size;) {
    const uint8_t *end = memchr(data + pos, 0, size - pos);
    size_t len = end ? (size_t)(end - data) - pos : size - pos;
    char *arg = malloc(len + 1);
    memcpy(arg, data + pos, len);
    arg[len] = 0;
    config_apply_override(&cfg, arg, &err);  // a bad one is an error that leaves cfg as it was
    free(arg);
    pos += len + 1;
  }
  if (config_validate(&cfg, &err) != 0) return 0;
  config_print(&cfg, sink);
  check_round_trip(&cfg);
  return 0;
}
