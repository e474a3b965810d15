// test_child.h: death tests. A call that must abort runs in a forked child with its stderr in a
// pipe; the parent checks that it aborted and what it printed. The child must not touch a
// device or a thread pool the parent started (a forked child cannot use them): a refusal that
// aborts before its first CUDA or OpenMP call is what these tests are for. Include after
// _POSIX_C_SOURCE is defined.
#pragma once
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/util/test_util.h"

typedef void (*TestChildFn)(void *arg);

// Runs fn(arg) in a child, its stderr into msg (NUL-terminated, at most size - 1 bytes). Returns
// how it ended: 0 a clean exit, the signal's number when one ended it (SIGABRT for an abort),
// 1000 + the exit code otherwise, -1 when no pipe could be made.
static inline int test_run_child(TestChildFn fn, void *arg, char *msg, size_t size) {
  int fd[2];
  msg[0] = 0;
  if (pipe(fd) != 0) return -1;
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    close(fd[0]);
    dup2(fd[1], 2);
    alarm(60);  // a hang fails the case instead of the suite
    fn(arg);
    _exit(0);
  }
  close(fd[1]);
  size_t got = 0;
  ssize_t k;
  while (got + 1 < size && (k = read(fd[0], msg + got, size - 1 - got)) > 0) got += (size_t)k;
  msg[got] = 0;
  close(fd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFSIGNALED(status)) return WTERMSIG(status);
  return WEXITSTATUS(status) == 0 ? 0 : 1000 + WEXITSTATUS(status);
}

// fn(arg) aborts, and its message holds each of the strings in want (NULL-terminated). The check
// quotes the message's first line (a refusal's second line is its HINT).
static inline void test_expect_abort(const char *what, TestChildFn fn, void *arg,
                                     const char *const *want) {
  char msg[4096];
  int how = test_run_child(fn, arg, msg, sizeof msg);
  const char *missing = NULL;
  for (int i = 0; want[i] && !missing; i++)
    if (!strstr(msg, want[i])) missing = want[i];
  char *nl = strchr(msg, '\n');
  if (nl) *nl = 0;
  test_check(how == SIGABRT && !missing, "%s: %s, %s: %s", what,
             how == SIGABRT ? "aborts" : "does NOT abort",
             missing ? "the message lacks" : "the message has every expected part",
             missing ? missing : msg);
}
