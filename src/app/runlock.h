// runlock.h: one training run per run directory.
//
// Two trainers writing the same run_dir would interleave checkpoints and metrics and prune each
// other's files. The trainer takes an exclusive advisory lock (flock) on run_dir/.lock at setup
// and holds it until it ends. The kernel drops the lock with the process, however it dies
// (SIGKILL, OOM kill, power loss), so a crashed run never leaves a stale lock behind. The holder
// writes its pid into the file, so that a second trainer can say who holds the directory.
#pragma once
#include "src/base/util.h"

typedef struct {
  int fd;  // open on run_dir/.lock while held; -1 otherwise
  char path[1024];
} RunLock;

// Takes the lock of dir (which must exist), or fails at once, naming the directory and the
// holder's pid when the file records one.
int runlock_acquire(RunLock *lock, const char *dir, Error *err);
// Releases a held lock (a no-op on one that is not held). The file stays: removing it would let
// a third process lock a new file while a second still holds the old one.
void runlock_release(RunLock *lock);
