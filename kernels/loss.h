// loss.h: softmax cross-entropy with label smoothing, or with soft targets (mixup/cutmix).
//
// With hard labels and smoothing s the target row is (1 - s) one_hot(y) + s / K, which equals
// PyTorch's CrossEntropyLoss(label_smoothing=s). With soft targets (B, K) each row is used as
// given (it should sum to 1). loss = mean over b of -sum_k target[b][k] log softmax(logits)[b][k],
// computed with the max subtracted, in double for the sum.
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include "src/base/tensor.h"
#ifdef SWIN_HAVE_CUDA
#include <cuda_runtime.h>  // outside the extern "C" block: it declares C++ templates
#endif

#ifdef __cplusplus
extern "C" {
#endif

// Returns the mean loss. dlogits (B, K) = (softmax - target) / grad_count, overwritten (may be
// NULL): the gradient of the mean loss over grad_count images, of which these B rows are a part
// (grad_count = B: the batch's own mean; B x N for one of the N micro-batches of a step, whose
// gradients add up to the mean over the whole batch). Exactly one of labels (B) and soft_targets
// (B, K) is non-NULL.
double cross_entropy_forward_backward_cpu(float *dlogits, const float *logits, const int *labels,
                                          const float *soft_targets, float smoothing, int B, int K,
                                          int grad_count);
// Counts rows of logits (B, K) whose label is the arg-max (top1) and among the 5 largest (top5);
// ties go to the lower class index, like a first-occurrence argmax.
void topk_correct_cpu(const float *logits, const int *labels, int B, int K, int *top1, int *top5);

#ifdef SWIN_HAVE_CUDA
// CUDA form of the loss. A mean cannot be returned without a synchronization, so instead
// losses (B), a device array, receives each row's loss (the CPU's row term, computed in double and
// rounded to float), and losses_accumulate_cuda adds them up on the device. The other parameters
// are the CPU ones as device pointers: dlogits (B, K) overwritten with (softmax - target) /
// grad_count times *grad_scale (a device float, the loss scale; NULL = 1) (may be NULL), logits
// (B, K), exactly one of labels (B) and soft_targets (B, K) non-NULL; smoothing, B, K, grad_count
// by value. One block
// per row, the same double arithmetic as the CPU, fixed-order reductions (deterministic). An
// out-of-range label gives a NaN loss and a NaN dlogits row, as on the CPU. Launched on `stream`.
void cross_entropy_forward_backward_cuda(float *losses, float *dlogits, const float *logits,
                                         const int *labels, const float *soft_targets,
                                         float smoothing, const float *grad_scale, int B, int K,
                                         int grad_count, cudaStream_t stream);
// On the device, in row order (double): with mean, *sum += the mean of losses (B) and *count +=
// 1 when that mean is finite, else *bad += 1 (bad may be NULL); without, *sum += their sum and
// *count += B.
void losses_accumulate_cuda(double *sum, int64_t *count, int64_t *bad, const float *losses, int B,
                            bool mean, cudaStream_t stream);
// Adds the top-1 / top-5 hits of logits (B, K) against labels (B) to *top1 and *top5 (int64 on
// the device; integer atomic adds are exact, so the counts are deterministic). Ties go to the
// lower class index, as on the CPU.
void topk_accumulate_cuda(const float *logits, const int *labels, int B, int K, int64_t *top1,
                          int64_t *top5, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
