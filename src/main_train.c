// swin_train: train a Swin Transformer from an INI config.
//   swin_train [--dry-run] config.ini [key=value ...]
#include <stdio.h>
#include <string.h>

#include "src/bench.h"
#include "src/config.h"
#include "src/config_keys.h"
#include "src/model.h"
#include "src/train.h"

static void usage(FILE *out) {
  fprintf(out,
          "usage: swin_train [--dry-run] CONFIG.ini [key=value ...]\n"
          "       swin_train CONFIG.ini bench=1 [key=value ...]   (benchmark the training step)\n"
          "       swin_train --keys       (every config key with its default and meaning)\n"
          "  --dry-run   print the resolved config, the per-stage model table and the parameter\n"
          "              count, then exit\n"
          "  key=value   override a config key by its full name, e.g. train.lr=1e-3 resume=auto\n");
}

int main(int argc, char **argv) {
  bool dry_run = false;
  const char *config_path = NULL;
  int first_override = argc;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      return 0;
    } else if (strcmp(argv[i], "--keys") == 0) {
      config_print_reference(stdout);
      return 0;
    } else if (strcmp(argv[i], "--dry-run") == 0) {
      dry_run = true;
    } else if (argv[i][0] == '-') {
      fprintf(stderr, "error: unknown option '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    } else {
      config_path = argv[i];
      first_override = i + 1;
      break;
    }
  }
  if (!config_path) {
    usage(stderr);
    return 2;
  }

  Config cfg;
  Error err;
  config_defaults(&cfg);
  if (config_load_file(&cfg, config_path, &err) != 0) goto fail;
  for (int i = first_override; i < argc; i++)
    if (config_apply_override(&cfg, argv[i], &err) != 0) goto fail;
  if (config_validate(&cfg, &err) != 0) goto fail;
  config_print(&cfg, stdout);

  if (dry_run) {
    Model m;
    if (model_create(&m, &cfg, NULL, 0, &err) != 0) goto fail;
    model_print_summary(&m, stdout);
    model_destroy(&m);
    return 0;
  }
  if (cfg.bench) {
    if (bench_run(&cfg, &err) != 0) goto fail;
    return 0;
  }
  train_install_signal_handlers();
  if (train_run(&cfg, &err) != 0) goto fail;
  return 0;
fail:
  fprintf(stderr, "error: %s\n", err.msg);
  return 1;
}
