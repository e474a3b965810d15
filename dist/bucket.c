// bucket.c: the gradient bucket planner (see bucket.h).
#include "dist/bucket.h"

#include <math.h>
#include <stdlib.h>

static void emit(GradBucket *buckets, int *n, int64_t offset, int64_t count, int first, int last) {
  if (buckets) buckets[*n] = (GradBucket){offset, count, first, last};
  (*n)++;
}

int bucket_plan(const int64_t *numel, int num_tensors, int64_t max_floats, GradBucket *buckets) {
  if (max_floats < 1) max_floats = 1;
  int64_t end = 0;
  for (int t = 0; t < num_tensors; t++) end += numel[t];
  int n = 0;
  for (int t = num_tensors - 1; t >= 0;) {
    if (numel[t] > max_floats) {
      // Near-equal pieces rather than full ones and a remainder: no tiny bucket at the end.
      int64_t pieces = (numel[t] + max_floats - 1) / max_floats;
      int64_t base = numel[t] / pieces, extra = numel[t] % pieces;
      for (int64_t k = 0; k < pieces; k++) {
        int64_t size = base + (k < extra);
        emit(buckets, &n, end - size, size, t, t);
        end -= size;
      }
      t--;
      continue;
    }
    int last = t;
    int64_t count = 0;
    while (t >= 0 && count + numel[t] <= max_floats) count += numel[t--];
    emit(buckets, &n, end - count, count, t + 1, last);
    end -= count;
  }
  return n;
}

int64_t bucket_floats(double bucket_mb) {
  int64_t floats = (int64_t)llround(bucket_mb * 1048576.0 / (double)sizeof(float));
  return floats < 1 ? 1 : floats;
}

int bucket_plan_tensors(const Tensor *tensors, int num_tensors, const float *base,
                        int64_t num_floats, double bucket_mb, GradBucket **buckets, int *count,
                        Error *err) {
  // Each tensor's extent runs to the next tensor's start: alignment gaps go with the tensor
  // before them, so the buckets cover the whole buffer.
  int64_t *numel = malloc_check(sizeof(int64_t) * (size_t)(num_tensors > 0 ? num_tensors : 1));
  for (int i = 0; i < num_tensors; i++) {
    int64_t start = (const float *)tensors[i].data - base;
    int64_t end = i + 1 < num_tensors ? (const float *)tensors[i + 1].data - base : num_floats;
    if (tensors[i].dtype != DTYPE_F32 || start > end || (i == 0 && start != 0) ||
        start + tensor_numel(&tensors[i]) > end || end > num_floats) {
      free(numel);
      return error_set(err,
                       "gradient tensor '%s' at float %lld is out of order in the table or "
                       "outside the %lld-float buffer",
                       tensors[i].name, (long long)start, (long long)num_floats);
    }
    numel[i] = end - start;
  }
  int64_t max_floats = bucket_floats(bucket_mb);
  *count = bucket_plan(numel, num_tensors, max_floats, NULL);
  *buckets = malloc_check(sizeof(GradBucket) * (size_t)(*count > 0 ? *count : 1));
  bucket_plan(numel, num_tensors, max_floats, *buckets);
  free(numel);
  return 0;
}
