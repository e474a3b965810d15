// loss.h: softmax cross-entropy with label smoothing, or with soft targets (mixup/cutmix).
//
// With hard labels and smoothing s the target row is (1 - s) one_hot(y) + s / K, which equals
// PyTorch's CrossEntropyLoss(label_smoothing=s). With soft targets (B, K) each row is used as
// given (it should sum to 1). loss = mean over b of -sum_k target[b][k] log softmax(logits)[b][k],
// computed with the max subtracted, in double for the sum.
#pragma once
#include <stdint.h>
#ifdef SWIN_HAVE_CUDA
#include <cuda_runtime.h>  // outside the extern "C" block: it declares C++ templates
#endif

#ifdef __cplusplus
extern "C" {
#endif

// Returns the mean loss. dlogits (B, K) = (softmax - target) / B, overwritten (may be NULL).
// Exactly one of labels (B) and soft_targets (B, K) is non-NULL.
double cross_entropy_forward_backward_cpu(float *dlogits, const float *logits, const int *labels,
                                          const float *soft_targets, float smoothing, int B, int K);
// Counts rows of logits (B, K) whose label is the arg-max (top1) and among the 5 largest (top5);
// ties go to the lower class index, like a first-occurrence argmax.
void topk_correct_cpu(const float *logits, const int *labels, int B, int K, int *top1, int *top5);

#ifdef SWIN_HAVE_CUDA
// CUDA form of the loss. A mean cannot be returned without a synchronization, so instead
// losses (B), a device array, receives each row's loss (the CPU's row term, computed in double and
// rounded to float); the caller synchronizes when it needs the number and takes the mean on the
// host, in double, in row order. The other parameters are the CPU ones as device pointers: dlogits
// (B, K) overwritten with (softmax - target) / B (may be NULL), logits (B, K), exactly one of
// labels (B) and soft_targets (B, K) non-NULL; smoothing, B, K by value. One block per row, the
// same double arithmetic as the CPU, fixed-order reductions (deterministic). An out-of-range label
// gives a NaN loss and a NaN dlogits row, as on the CPU. Launched on `stream`.
void cross_entropy_forward_backward_cuda(float *losses, float *dlogits, const float *logits,
                                         const int *labels, const float *soft_targets,
                                         float smoothing, int B, int K, cudaStream_t stream);
// CUDA form of the top-1 / top-5 count: logits (B, K) and labels (B) on the device; top1 and
// top5 each point to one device int, overwritten with the count as on the CPU (zeroed on the
// stream, then integer atomic adds: exact, so the counts are deterministic). To count several
// batches without a synchronization each, give each batch its own pair of ints and download
// them together.
void topk_correct_cuda(const float *logits, const int *labels, int B, int K, int *top1, int *top5,
                       cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
