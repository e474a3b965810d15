// schedule.c: the learning rate of each iteration, linear warmup then cosine decay
// (optim/schedule.h), computed in double from the step index alone so that a resumed run gets
// exactly the rates of an uninterrupted one.
#include "optim/schedule.h"

#include <math.h>

// M_PI is POSIX, not C11.
static const double pi = 3.14159265358979323846;

double lr_at_step(const LrSchedule *s, int64_t step) {
  if (step < 0) step = 0;
  if (step >= s->total_steps) return s->min_lr;
  if (step < s->warmup_steps)
    return s->warmup_lr + (s->peak - s->warmup_lr) * (double)step / (double)s->warmup_steps;
  double progress = (double)(step - s->warmup_steps) / (double)(s->total_steps - s->warmup_steps);
  return s->min_lr + (s->peak - s->min_lr) * (1.0 + cos(pi * progress)) / 2.0;
}
