// test_jobs.h: what the tests of distributed training (CPU and GPU) share: starting a program
// alone or as N ranks under `mpirun --allow-run-as-root --oversubscribe -np N` with its output
// in a log file, waiting for it with a time limit, reading the log, writing a Config as an INI
// file. Include after _POSIX_C_SOURCE is defined.
#pragma once
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "src/base/config.h"
#include "src/base/util.h"

// Every job must end well within this: a hang fails instead of blocking the suite.
#define JOB_LIMIT_S 120.0

// CI runs as root, which Open MPI's mpirun refuses unless told; --oversubscribe lets more ranks
// than cores share a small machine.
static const char *const job_mpirun_args[] = {"mpirun", "--allow-run-as-root", "--oversubscribe",
                                              "-np"};

// prog with the arguments in ap (NULL-terminated): alone (np 0) or as np ranks under mpirun,
// stdout and stderr to log. Returns the pid.
static inline pid_t job_start_v(int np, const char *prog, const char *log, va_list ap) {
  const char *argv[64];
  int n = 0;
  char np_text[16];
  if (np > 0) {
    for (size_t i = 0; i < sizeof job_mpirun_args / sizeof job_mpirun_args[0]; i++)
      argv[n++] = job_mpirun_args[i];
    snprintf(np_text, sizeof np_text, "%d", np);
    argv[n++] = np_text;
  }
  argv[n++] = prog;
  for (const char *a; n < 63 && (a = va_arg(ap, const char *));) argv[n++] = a;
  argv[n] = NULL;
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) _exit(126);
    dup2(fd, 1);
    dup2(fd, 2);
    close(fd);
    execvp(argv[0], (char *const *)argv);
    _exit(127);
  }
  return pid;
}

static inline pid_t job_start(int np, const char *prog, const char *log, ...) {
  va_list ap;
  va_start(ap, log);
  pid_t pid = job_start_v(np, prog, log, ap);
  va_end(ap);
  return pid;
}

// Waits for a job started at `started` (time_now_s): its exit code (128 + signal if killed), or
// -1 when it ran past limit_s (it is then terminated). *took (if not NULL): seconds it ran.
static inline int job_finish(pid_t pid, double started, double limit_s, double *took) {
  for (;;) {
    int status;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      if (took) *took = time_now_s() - started;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    if (time_now_s() - started > limit_s) {
      kill(pid, SIGTERM);  // mpirun takes its ranks down with it
      nanosleep(&(struct timespec){3, 0}, NULL);
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      if (took) *took = time_now_s() - started;
      return -1;
    }
    nanosleep(&(struct timespec){0, 20000000}, NULL);
  }
}

// Runs a job to its end (arguments as job_start's, NULL-terminated); returns its exit code.
static inline int job_run(int np, const char *prog, const char *log, double *took, ...) {
  va_list ap;
  va_start(ap, took);
  double t0 = time_now_s();
  pid_t pid = job_start_v(np, prog, log, ap);
  va_end(ap);
  return job_finish(pid, t0, JOB_LIMIT_S, took);
}

// The text of a job's log ("" if unreadable); free it.
static inline char *job_log(const char *log) {
  size_t n;
  char *text = (char *)read_file(log, &n, NULL);
  if (!text) return calloc(1, 1);
  char *z = realloc(text, n + 1);
  z[n] = 0;
  return z;
}

static inline int job_count(const char *text, const char *what) {
  int n = 0;
  for (const char *p = text; (p = strstr(p, what)); p += strlen(what)) n++;
  return n;
}

// Prints the end of a log under a failed check.
static inline void job_show_log(const char *log) {
  char *text = job_log(log);
  size_t n = strlen(text);
  printf("     --- %s (last 1500 bytes) ---\n%s\n     ---\n", log,
         n > 1500 ? text + n - 1500 : text);
  free(text);
}

// The number after "key": in a JSON line (the bench's), NAN when line is NULL or lacks the key.
static inline double job_json_number(const char *line, const char *key) {
  char quoted[96];
  snprintf(quoted, sizeof quoted, "\"%s\": ", key);
  const char *at = line ? strstr(line, quoted) : NULL;
  const char *end = at ? strchr(line, '\n') : NULL;
  if (!at || (end && at > end)) return NAN;
  return strtod(at + strlen(quoted), NULL);
}

// True when mpirun is on PATH.
static inline bool job_have_mpirun(void) {
  return system("command -v mpirun >/dev/null") == 0;
}

// Writes c to path as INI (every key); returns path.
static inline const char *job_write_ini(const Config *c, const char *path) {
  char *ini = config_to_ini(c);
  FILE *f = fopen(path, "w");
  if (f) {
    fputs(ini, f);
    fclose(f);
  }
  free(ini);
  return path;
}
