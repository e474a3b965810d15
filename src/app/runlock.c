// runlock.c: the run directory's advisory lock (src/app/runlock.h).
//
// flock rather than fcntl locks: an fcntl lock belongs to the process and is dropped when *any*
// descriptor of the file is closed, while a flock lock belongs to this open file description
// alone. O_CLOEXEC keeps the descriptor (and so the lock) out of programs the trainer starts.
#define _DEFAULT_SOURCE  // flock
#include "src/app/runlock.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

// The pid the holder wrote, or 0 when the file holds none (a holder between lock and write).
static long read_holder_pid(int fd) {
  char text[32] = {0};
  ssize_t n = pread(fd, text, sizeof text - 1, 0);
  if (n <= 0) return 0;
  char *end;
  long pid = strtol(text, &end, 10);
  return end != text && pid > 0 ? pid : 0;
}

static int write_own_pid(int fd) {
  char text[32];
  int n = snprintf(text, sizeof text, "%ld\n", (long)getpid());
  if (ftruncate(fd, 0) != 0) return -1;
  return pwrite(fd, text, (size_t)n, 0) == n ? 0 : -1;
}

int runlock_acquire(RunLock *lock, const char *dir, Error *err) {
  lock->fd = -1;
  snprintf(lock->path, sizeof lock->path, "%s/.lock", dir);
  int fd = open(lock->path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    return error_set(err,
                     "cannot open the run lock '%s': %s\n"
                     "HINT: run_dir must be a writable directory",
                     lock->path, strerror(errno));
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int e = errno;
    long pid = e == EWOULDBLOCK ? read_holder_pid(fd) : 0;
    close(fd);
    if (e != EWOULDBLOCK) return error_set(err, "cannot lock '%s': %s", lock->path, strerror(e));
    char holder[64] = "another process";
    if (pid > 0) snprintf(holder, sizeof holder, "another process (pid %ld)", pid);
    return error_set(err,
                     "run_dir '%s' is in use by %s: one training run per directory\n"
                     "HINT: wait for that run to end or stop it, or set another run_dir",
                     dir, holder);
  }
  // The pid is only a courtesy for the message above; failing to write it is no reason to stop.
  if (write_own_pid(fd) != 0)
    fprintf(stderr, "warning: could not record this process's pid in '%s': %s\n", lock->path,
            strerror(errno));
  lock->fd = fd;
  return 0;
}

void runlock_release(RunLock *lock) {
  if (lock->fd < 0) return;
  close(lock->fd);  // closing the only descriptor of the open file drops the flock lock
  lock->fd = -1;
}
