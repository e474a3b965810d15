// loss.h: softmax cross-entropy with label smoothing, or with soft targets (mixup/cutmix).
//
// With hard labels and smoothing s the target row is (1 - s) one_hot(y) + s / K, which equals
// PyTorch's CrossEntropyLoss(label_smoothing=s). With soft targets (B, K) each row is used as
// given (it should sum to 1). loss = mean over b of -sum_k target[b][k] log softmax(logits)[b][k],
// computed with the max subtracted, in double for the sum.
#pragma once
#include <stdint.h>

// Returns the mean loss. dlogits (B, K) = (softmax - target) / B, overwritten (may be NULL).
// Exactly one of labels (B) and soft_targets (B, K) is non-NULL.
double cross_entropy_forward_backward_cpu(float *dlogits, const float *logits, const int *labels,
                                          const float *soft_targets, float smoothing, int B, int K);
// Counts rows of logits (B, K) whose label is the arg-max (top1) and among the 5 largest (top5);
// ties go to the lower class index, like a first-occurrence argmax.
void topk_correct_cpu(const float *logits, const int *labels, int B, int K, int *top1, int *top5);
