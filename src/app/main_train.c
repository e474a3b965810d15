// swin_train: train a Swin Transformer from an INI config, as one process or as a data-parallel
// job under a launcher (mpirun -np N swin_train ..., srun swin_train ...).
//   swin_train [--dry-run] config.ini [key=value ...]
#include <stdio.h>
#include <string.h>

#include "data/loader.h"
#include "dist/comm.h"
#include "src/app/bench.h"
#include "src/app/train.h"
#include "src/base/config.h"
#include "src/base/config_keys.h"
#include "src/model/model.h"

static void usage(FILE *out) {
  fprintf(out,
          "usage: swin_train [--dry-run] CONFIG.ini [key=value ...]\n"
          "       swin_train CONFIG.ini bench=1 [key=value ...]   (benchmark the training step)\n"
          "       swin_train CONFIG.ini bench=e2e [key=value ...] (benchmark training end to end)\n"
          "       swin_train --keys       (every config key with its default and meaning)\n"
          "       mpirun -np N swin_train CONFIG.ini ...   (N data-parallel processes)\n"
          "  --dry-run   print the resolved config, the per-stage model table and the parameter\n"
          "              count, then exit\n"
          "  key=value   override a config key by its full name, e.g. train.lr=1e-3 resume=auto\n");
}

// Ends the whole job with "error: <message>" on stderr: in a job every line is prefixed with
// "rank R: " and MPI_Abort takes every process down; alone, the process exits 1.
static void fail(const Comm *comm, const Error *err) __attribute__((noreturn));
static void fail(const Comm *comm, const Error *err) {
  char text[sizeof(Error) + 16];
  snprintf(text, sizeof text, "error: %s", err->msg);
  comm_abort(comm, text);
}

// A normal end: every rank finalizes MPI (when a launcher started the job), then exits with code.
static int finish(Comm *comm, int code) {
  Error err;
  if (comm_finalize(comm, &err) != 0) fail(comm, &err);
  return code;
}

int main(int argc, char **argv) {
  Comm comm;
  Error err;
  if (comm_init(&comm, &err) != 0) fail(&comm, &err);
  // One voice: ranks other than 0 print nothing on stdout (the config, the model table and the
  // progress would otherwise come N times). Errors and warnings keep stderr on every rank.
  if (comm.rank != 0 && !freopen("/dev/null", "w", stdout)) {
    error_set(&err, "rank %d: cannot discard stdout (/dev/null)", comm.rank);
    fail(&comm, &err);
  }

  bool dry_run = false;
  const char *config_path = NULL;
  int first_override = argc;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      return finish(&comm, 0);
    } else if (strcmp(argv[i], "--keys") == 0) {
      config_print_reference(stdout);
      return finish(&comm, 0);
    } else if (strcmp(argv[i], "--dry-run") == 0) {
      dry_run = true;
    } else if (argv[i][0] == '-') {
      if (comm.rank == 0) {
        fprintf(stderr, "error: unknown option '%s'\n", argv[i]);
        usage(stderr);
      }
      return finish(&comm, 2);
    } else {
      config_path = argv[i];
      first_override = i + 1;
      break;
    }
  }
  if (!config_path) {
    if (comm.rank == 0) usage(stderr);
    return finish(&comm, 2);
  }

  Config cfg;
  config_defaults(&cfg);
  if (config_load_file(&cfg, config_path, &err) != 0) fail(&comm, &err);
  for (int i = first_override; i < argc; i++)
    if (config_apply_override(&cfg, argv[i], &err) != 0) fail(&comm, &err);
  if (config_validate(&cfg, &err) != 0 || data_config_validate(&cfg, &err) != 0) fail(&comm, &err);
  config_print(&cfg, stdout);

  if (dry_run) {
    Model m;
    if (model_create(&m, &cfg, NULL, 0, &err) != 0) fail(&comm, &err);
    model_print_summary(&m, stdout);
    model_destroy(&m);
    return finish(&comm, 0);
  }
  if (config_bench_step(&cfg)) {  // alone: one device; under a launcher: the data-parallel step
    if (bench_run(&cfg, &comm, &err) != 0) fail(&comm, &err);
    return finish(&comm, 0);
  }
  train_install_signal_handlers();
  if (train_run(&cfg, &comm, &err) != 0) fail(&comm, &err);
  return finish(&comm, 0);
}
