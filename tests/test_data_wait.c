// test_data_wait.c: the loader's automatic sizing (data.workers / data.prefetch = 0) and the
// data wait's accounting (src/app/data_wait.h), on the CPU.
#include "data/loader.h"
#include "src/app/data_wait.h"
#include "tests/util/test_util.h"

static void check_sizing(int workers_key, int prefetch_key, int cores, int online, int local,
                         int want_workers, int want_prefetch) {
  LoaderSizing s = loader_sizing(workers_key, prefetch_key, cores, online, local);
  test_check(s.workers == want_workers && s.prefetch == want_prefetch,
             "loader_sizing(workers %d, prefetch %d, %d of %d cores, %d local ranks) = %d "
             "workers, ring %d (want %d, %d)",
             workers_key, prefetch_key, cores, online, local, s.workers, s.prefetch, want_workers,
             want_prefetch);
}

int main(void) {
  // One process on a 16-core machine: 15 workers and a ring that never caps them.
  check_sizing(0, 0, 16, 16, 1, 15, 17);
  // Eight ranks share the node: two cores each, one worker each.
  check_sizing(0, 0, 16, 16, 8, 1, 3);
  // A launcher bound the rank to 4 cores of 64 shared by 2 ranks: the binding wins.
  check_sizing(0, 0, 4, 64, 2, 3, 5);
  // More ranks than cores, or one core: still one worker.
  check_sizing(0, 0, 2, 2, 4, 1, 3);
  check_sizing(0, 0, 1, 1, 1, 1, 3);
  // Keys set by the user are taken as given; the ring follows the workers when only they are.
  check_sizing(6, 0, 16, 16, 1, 6, 8);
  check_sizing(0, 2, 16, 16, 1, 15, 2);
  check_sizing(3, 9, 16, 16, 1, 3, 9);
  LoaderSizing s = loader_sizing(0, 0, 16, 16, 1);
  char buf[256];
  loader_sizing_describe(&s, buf, sizeof buf);
  test_check(strstr(buf, "15 workers") && strstr(buf, "auto: 16 cores") && strstr(buf, "17"),
             "the start-up line says what was chosen and why: %s", buf);
  s = loader_sizing(4, 6, 16, 16, 1);
  loader_sizing_describe(&s, buf, sizeof buf);
  test_check(strstr(buf, "data.workers") && strstr(buf, "data.prefetch"),
             "keys that were set are named: %s", buf);
  int online = 0, cores = loader_process_cores(&online);
  test_check(cores >= 1 && online >= 1 && cores <= online, "loader_process_cores: %d of %d online",
             cores, online);

  // A step waits min(device idle, host blocked): idle with the batch ready is the host's own
  // pause, blocked while the device computed costs nothing.
  DataWait w = {0};
  data_wait_step(&w, 0.030, 0.050);  // data-bound: 30 ms idle of 50 ms blocked
  data_wait_step(&w, 0.004, 0.000);  // the batch was ready: a logging pause, not the loader
  data_wait_step(&w, 0.000, 0.020);  // the loader was late, but the device was still busy
  data_wait_step(&w, -1e-6, 0.010);  // marks a hair apart in the wrong order count as 0
  test_check(fabs(w.waited_s - 0.030) < 1e-12 && w.steps == 4,
             "four steps wait %.6f s (want 0.030000)", w.waited_s);
  double f = data_wait_interval(&w, 0.100);
  test_check(fabs(f - 0.3) < 1e-12 && w.waited_s == 0 && w.steps == 0 && w.intervals == 1,
             "the interval's share %.4f (want 0.3000), and a new interval begins", f);
  test_check(!data_wait_should_warn(&w, f),
             "no warning after the first interval (it holds the loader's start)");
  data_wait_step(&w, 0.2, 0.2);
  f = data_wait_interval(&w, 0.1);
  test_check(f == 1.0, "a share is at most 1 (%.3f)", f);
  test_check(data_wait_should_warn(&w, 0.11), "a warning above %.0f%%", 100 * DATA_WAIT_WARN);
  test_check(!data_wait_should_warn(&w, 0.5), "and only once a run");
  DataWait quiet = {.intervals = 3};
  test_check(!data_wait_should_warn(&quiet, DATA_WAIT_WARN), "none at exactly the threshold");
  test_check(fabs(w.total_s - 0.23) < 1e-12, "the run's total %.6f s (want 0.230000)", w.total_s);
  return test_finish();
}
