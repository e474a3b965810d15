// schedule.h: learning rate per iteration: linear warmup from warmup_lr to the peak over
// warmup_steps, then cosine from the peak to min_lr over the remaining steps (the official Swin
// schedule, warmup as a prefix, stepped every iteration):
//   t <  W:  lr = warmup_lr + (peak - warmup_lr) * t / W
//   t >= W:  lr = min_lr + (peak - min_lr) * (1 + cos(pi * (t - W) / (T - W))) / 2
// where t is the 0-based index of the update. Past T the rate stays at min_lr.
#pragma once
#include <stdint.h>

typedef struct {
  double peak, warmup_lr, min_lr;
  int64_t warmup_steps, total_steps;
} LrSchedule;

double lr_at_step(const LrSchedule *s, int64_t step);
