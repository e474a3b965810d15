// data_wait.c: the data wait's arithmetic (src/app/data_wait.h).
#include "src/app/data_wait.h"

void data_wait_step(DataWait *w, double idle_s, double blocked_s) {
  double waited = idle_s < blocked_s ? idle_s : blocked_s;
  w->waited_s += waited > 0 ? waited : 0;
  w->total_s += waited > 0 ? waited : 0;
  w->steps++;
}

double data_wait_interval(DataWait *w, double wall_s) {
  double f = wall_s > 0 ? w->waited_s / wall_s : 0;
  w->waited_s = 0;
  w->steps = 0;
  w->intervals++;
  return f < 0 ? 0 : f > 1 ? 1 : f;
}

bool data_wait_should_warn(DataWait *w, double fraction) {
  if (w->warned || w->intervals < 2 || fraction <= DATA_WAIT_WARN) return false;
  w->warned = true;
  return true;
}
