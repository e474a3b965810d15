// batch_augment.h: the host half of the per-batch augmentations: drawing random erasing boxes,
// the mixup / cutmix choice, lambda and box, and building the mixed, label-smoothed soft targets.
// The kernels that apply them to the normalized batch are kernels/augment.h (CPU and CUDA).
//
// Draws are counter-based (src/base/rng.h), so they depend on the data position, never on threads:
//   erasing, sample s of epoch e:  (seed, RNG_STREAM_ERASE, e, s), fill (.., ERASE_FILL, e, s);
//   mixup, batch k of epoch e on rank r: (seed, RNG_STREAM_MIXUP + 256 r, e, k); with gradient
//   accumulation (train.accum_steps N > 1), micro-batch j of batch k: (.., e, k N + j), so each
//   micro-batch draws its own, as timm's loader batches do when it accumulates.
// The semantics are timm's:
//   RandomErasing(probability=reprob, mode='pixel', max_count=1): with probability reprob, up to
//     10 tries of an area U(0.02, 1/3) of the image and a log-uniform aspect in [0.3, 1/0.3];
//     h = round(sqrt(area * aspect)), w = round(sqrt(area / aspect)) (half to even), accepted when
//     h < H and w < W, at a uniform position; no box when all 10 fail.
//   Mixup(mode='batch', correct_lam=True): with probability mix_prob the batch is mixed; with
//     both alphas > 0, cutmix with probability switch_prob, else mixup; lam ~ Beta(alpha, alpha)
//     of the chosen one. Cutmix's box: cut = int(side * sqrt(1 - lam)), a uniform center
//     (cy, cx) in [0, H) x [0, W), the box [c - cut // 2, c + (cut + 1) // 2) clipped to the image,
//     and lam = 1 - box area / image area. lam == 1 leaves the images alone.
//   Soft targets: t[b] = onehot_s(y[b]) * lam + onehot_s(y[B-1-b]) * (1 - lam) with
//     onehot_s = (1 - s + s/K on the label, s/K elsewhere), in fp32 like PyTorch's
//     mixup_target; the loss then takes them with smoothing 0.
//
// The training step, once per batch b (B = b->count, images (B, H, W, C) normalized; with
// accumulation, once per micro-batch of it, B its size):
//   setup:  opts = batch_augment_options(cfg, rank); if batch_augment_active(&opts): EraseBox
//           boxes[batch] (host), plus on the GPU a device EraseBox[batch]; if
//           batch_augment_soft_targets(&opts): soft (batch, K) on the host (+ its device copy).
//   step:   normalize; batch_augment_draw(&opts, b, 0, 1, H, W, boxes, &aug, soft, err);
//           batch_augment_cpu(images, &aug, B, H, W, C)  or
//           batch_augment_cuda(d_images, &aug, d_boxes, B, H, W, C, stream) (+ upload soft);
//           forward; loss with soft targets and smoothing 0 when soft targets are on, else with
//           the labels and train.label_smoothing; backward as usual.
// Evaluation uses none of this.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "data/loader.h"
#include "kernels/augment.h"
#include "src/base/config.h"
#include "src/base/util.h"

typedef struct {
  uint64_t seed;
  float reprob;                     // random erasing probability per sample; 0 = off
  float mixup_alpha, cutmix_alpha;  // Beta(alpha, alpha) of each; 0 = that one is off
  float mix_prob, switch_prob;      // mix a batch at all; choose cutmix over mixup
  float smoothing;                  // label smoothing of the soft targets
  int num_classes;
  int rank;  // mixup draws differ per rank, as timm's per-process generators do
} BatchAugmentOptions;

// The options of training on `rank` from the config (data.reprob, train.mixup, train.cutmix,
// train.mixup_prob, train.mixup_switch_prob, train.label_smoothing, model.num_classes, seed).
BatchAugmentOptions batch_augment_options(const Config *cfg, int rank);
// Whether any per-batch augmentation is on (else the step skips batch_augment_* entirely).
bool batch_augment_active(const BatchAugmentOptions *o);
// Whether the loss takes soft targets (mixup or cutmix on) instead of hard labels.
bool batch_augment_soft_targets(const BatchAugmentOptions *o);

// Draws the augmentation of micro-batch `part` of `parts` of training batch b (images H x W):
// its n = b->count / parts samples [part n, (part + 1) n) (the whole batch with part 0 of 1; the
// pairs of mixup / cutmix are formed within it). erase (n) receives the boxes, out the parameters
// for batch_augment_cpu / batch_augment_cuda (out->erase points at erase, or is NULL when erasing
// is off), and soft_targets (n, num_classes), when mixup or cutmix is on, the targets for the loss
// (may be NULL otherwise). Errors: an odd micro-batch with mixup/cutmix on, a label outside [0,
// num_classes).
int batch_augment_draw(const BatchAugmentOptions *o, const Batch *b, int part, int parts, int H,
                       int W, EraseBox *erase, BatchAugment *out, float *soft_targets, Error *err);

// The pieces, exposed for tests and fixtures.
// timm's erase box for an H x W image from r; h = w = 0 when the sample is not erased.
EraseBox batch_augment_erase_box(float reprob, int H, int W, Rng *r);
// Cutmix box and corrected lam for a drawn lam; center (cy, cx) as drawn.
MixParams batch_augment_cutmix_box(double lam, int H, int W, int cy, int cx);
// Soft targets (B, K) for labels (B) mixed with weight lam, label smoothing s.
void batch_augment_soft_targets_fill(float *targets, const int *labels, int B, int K, double lam,
                                     float smoothing);
// Beta(alpha, alpha) from r (Marsaglia-Tsang gammas), alpha > 0.
double batch_augment_beta(double alpha, Rng *r);
