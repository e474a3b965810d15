// data_wait.h: how much of a run's time the device sat idle waiting for batches (the progress
// line's "data", metrics.jsonl's data_wait, and bench=e2e's).
//
// The trainer queues step k, then asks the loader for batch k + 1 while step k computes. So
// the host's time blocked in loader_next alone overstates the wait (the device was busy for
// part of it), and the device's idle time between two steps alone would count the host's own
// pauses (logging) as the loader's. Per step the trainer gives both: idle_s, the device's idle
// time between the end of the step before and the start of this one (backend time marks,
// src/model/backend.h), and blocked_s, the host's time in loader_next for this step's batch; the
// step waited min(idle_s, blocked_s) for data. On the CPU backend, whose ops run when called,
// idle_s is the host's time between the two steps, so the wait is the time blocked.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// Above this share of an interval the run says, once, that the loader sets its speed.
#define DATA_WAIT_WARN 0.10

typedef struct {
  double total_s;   // since the start
  double waited_s;  // this interval's
  int64_t steps;    // steps counted in this interval
  int intervals;    // intervals closed so far
  bool warned;
} DataWait;

void data_wait_step(DataWait *w, double idle_s, double blocked_s);
// Closes the interval: the share of wall_s (its wall time, > 0) spent waiting, in [0, 1].
double data_wait_interval(DataWait *w, double wall_s);
// Whether to warn after the interval just closed with this share: above DATA_WAIT_WARN, not in
// the first interval (it holds the loader's start, before its ring has filled), once a run.
bool data_wait_should_warn(DataWait *w, double fraction);
