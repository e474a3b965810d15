// bucket.h: gradient buckets, the pieces in which gradients are all-reduced while backward runs.
//
// A model's parameters lie end to end in one flat buffer in forward order, so backward
// fills the gradient buffer from its end towards its start. A bucket is a contiguous range of it;
// buckets are numbered in the order backward completes them: bucket 0 ends at the end of the
// buffer and each next bucket ends where the previous one starts. Once backward has written every
// gradient at or above a bucket's offset, that bucket can be reduced while backward goes on below.
#pragma once
#include <stdint.h>

#include "src/base/tensor.h"
#include "src/base/util.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int64_t offset, count;          // floats [offset, offset + count) of the gradient buffer
  int first_tensor, last_tensor;  // the tensors it covers (forward indices, inclusive)
} GradBucket;

// Plans buckets over num_tensors tensors of numel[i] floats laid end to end from offset 0, in
// forward order. Walking from the last tensor to the first, a bucket takes whole tensors while
// its total stays within max_floats (>= 1); a tensor larger than max_floats alone is split into
// ceil(numel / max_floats) near-equal pieces, each a bucket. So every bucket holds at most
// max_floats, buckets cover the buffer exactly once, and a bucket boundary falls inside a tensor
// only when that tensor is larger than max_floats. Writes the buckets to `buckets` (may be NULL
// to count them first) and returns their number.
int bucket_plan(const int64_t *numel, int num_tensors, int64_t max_floats, GradBucket *buckets);

// Floats in a bucket of bucket_mb MiB of fp32 gradients (dist.bucket_mb), at least 1.
int64_t bucket_floats(double bucket_mb);

// bucket_plan over a table of num_tensors tensors that are views, in forward order, into one
// flat fp32 buffer of num_floats starting at base (a model's gradients), each tensor extended
// over the gap after it to the next one's start, so the buckets cover all num_floats;
// *buckets is malloc'ed (free it). Fails, naming the tensor, if the table is out of order or
// outside the buffer.
int bucket_plan_tensors(const Tensor *tensors, int num_tensors, const float *base,
                        int64_t num_floats, double bucket_mb, GradBucket **buckets, int *count,
                        Error *err);

#ifdef __cplusplus
}
#endif
