// transform.h: the data pipeline's private interfaces: image transforms on uint8 HWC images
// (also swin_predict's, which runs the eval transform on files of no dataset), and the Dataset
// facts the loader needs beyond data/dataset.h.
//
// The train transform is timm's: RandomResizedCrop (crop, then Pillow's resize with
// data.interpolation) + horizontal flip, then RandAugment or, without it, ColorJitter. The eval
// transform is torchvision's Resize(floor(img / crop_pct)) + CenterCrop(img). Resizing is
// Pillow's (data/image_ops.h): bilinear or bicubic, antialiased when shrinking, the same bytes.
//
// The geometric part of either is a TransformPlan, drawn before any pixel is read: which box of
// the source is resized to what size, which window of that is kept, with which filter, and
// whether it is mirrored. transform_apply runs a plan on the CPU; the loader's nvJPEG path runs
// the same plans on the GPU (transform_plans_pack, kernels/resize.h), and the colour part as
// the steps dataset_plan_colour draws (kernels/image_aug.h): only the draws stay on the CPU.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data/dataset.h"
#include "data/image_ops.h"
#include "data/randaugment.h"
#include "kernels/image_aug.h"
#include "kernels/resize.h"
#include "src/base/config.h"
#include "src/base/rng.h"

typedef struct {
  int out_h, out_w, chans;        // output image (out_h, out_w, chans)
  float scale_min, scale_max;     // RandomResizedCrop: crop area as a fraction of the image
  float ratio_min, ratio_max;     // RandomResizedCrop: crop aspect w/h, drawn log-uniformly
  float hflip;                    // train: probability of a horizontal flip
  float crop_pct;                 // eval: resize to out / crop_pct, then center crop out
  ResampleChoice resample;        // resize and RandAugment interpolation (0: bilinear)
  RandAugmentPolicy randaugment;  // train: applied after the flip when enabled
  float color_jitter;             // train, without RandAugment: ColorJitter(j, j, j); 0 = off
  uint8_t fill[4];                // RandAugment's outside colour: the mean pixel, per channel
} TransformParams;

// The transform settings of cfg (model.img_size and in_chans, the data.* augmentation keys),
// checked: what dataset_open gives every dataset, and what swin_predict runs transform_eval with.
// -1 with err (naming the config file's key where it can) when a setting is out of range.
int transform_params_from_config(TransformParams *p, const Config *cfg, Error *err);

// An integer crop box in source pixels.
typedef struct {
  int top, left, h, w;
} CropBox;

// RandomResizedCrop's box in an (h, w) image, torchvision's algorithm: up to 10 draws of an area
// fraction U(scale) and a log-uniform aspect, accepted when the box fits, then a uniform
// position; else a center crop with the aspect clamped to [ratio_min, ratio_max].
CropBox transform_rrc_box(const TransformParams *p, int h, int w, Rng *rng);

// Mirrors img (h, w, chans) left-right in place.
void transform_hflip(uint8_t *img, int h, int w, int chans);

// The geometric part of one sample's transform, for a source image (src_h, src_w): Pillow's
// resize of the source box to (resize_h, resize_w), of which the window (out_h, out_w) at (top,
// left) is the output, then mirrored left-right when hflip. A resize to the box's own size is a
// copy (Pillow returns one).
typedef struct {
  int src_h, src_w;
  CropBox box;
  int resize_h, resize_w;
  int top, left, out_h, out_w;
  Interp interp;
  bool hflip;
} TransformPlan;

// Train: RandomResizedCrop's box (transform_rrc_box), the interpolation (resample_pick), then
// the flip draw (always made, so the draw sequence does not depend on hflip): transform_train's
// draws in its order (the resize between them draws nothing). Output (p->out_h, p->out_w).
TransformPlan transform_plan_train(const TransformParams *p, int h, int w, Rng *rng);
// Eval: the resize + center crop of transform_eval (no draws).
TransformPlan transform_plan_eval(const TransformParams *p, int h, int w);
// 0 when plan can run on an (h, w) image: made for that size, its box inside the image, its
// window inside the resize; else -1 with what does not fit written to why (n bytes).
int transform_plan_check(const TransformPlan *plan, int h, int w, char *why, size_t n);
// Runs plan on the CPU: src (plan->src_h, plan->src_w, chans), dst (plan->out_h, plan->out_w,
// chans).
void transform_apply(const TransformPlan *plan, const uint8_t *src, int chans, uint8_t *dst);

// The GPU form of plans[0..n) (kernels/resize.h): transform_plans_packed_bytes sizes the packed
// buffer (n ResizeDesc, then their tap tables); transform_plans_pack fills it, with image k's
// source (plans[k].src_h, plans[k].src_w, chans) at byte src[k] of the batch's source buffer,
// image k's output at byte dst[k] of its output buffer (dst NULL: the outputs packed in order
// from byte 0; ResizeDesc.dst says where), and the launch sizes in *batch (dst_bytes: the end of
// the furthest output).
int64_t transform_plans_packed_bytes(const TransformPlan *plans, int n);
void transform_plans_pack(const TransformPlan *plans, int n, int chans, const int64_t *src,
                          const int64_t *dst, void *packed, ResizeBatch *batch);

// Train, geometric part: RandomResizedCrop to (out_h, out_w), then a flip with probability
// hflip; every draw from rng (transform_plan_train, then transform_apply). src (h, w,
// p->chans), dst (p->out_h, p->out_w, p->chans).
void transform_train(const TransformParams *p, const uint8_t *src, int h, int w, Rng *rng,
                     uint8_t *dst);

// Train, colour part, drawn: RandAugment's steps (randaugment_draw), or ColorJitter's when
// RandAugment is off (color_jitter_draw), for a (p->out_h, p->out_w) image; 0 steps when neither
// is on. Returns the step count, at most max_steps (IMAGE_AUG_MAX_STEPS is always enough).
int transform_color_draw(const TransformParams *p, Rng *rng, ImageAugStep *steps, int max_steps);
// Train, colour part: transform_color_draw's steps run on the CPU (image_apply_steps), in place
// on img (p->out_h, p->out_w, chans); chans may differ from p->chans (a gray source expanded
// first).
void transform_train_color(const TransformParams *p, uint8_t *img, int chans, Rng *rng);
// Whether transform_train_color does anything.
bool transform_has_color(const TransformParams *p);

// Eval: timm's eval transform: resize keeping the aspect so that the image covers
// floor((out_h, out_w) / crop_pct) (square: torchvision Resize(int), shorter side = that size;
// otherwise timm's ResizeKeepRatio), then center crop (out_h, out_w); bicubic for
// data.interpolation = random.
// With crop_pct 1 and an image that already has the output size, this is the identity.
// src (h, w, p->chans), dst (p->out_h, p->out_w, p->chans).
void transform_eval(const TransformParams *p, const uint8_t *src, int h, int w, uint8_t *dst);

// Bytes of one transformed sample, img_h * img_w * in_chans (the Dataset struct is private to
// the dataset files, data/dataset_internal.h; the loader sizes its batch buffers with this).
int64_t dataset_sample_bytes(const Dataset *ds);

// The loader's nvJPEG path splits dataset_load_decoded_sample (data/dataset.h) around the GPU.
// dataset_plan_sample: sample i's plan for its own file decoded to (h, w), drawn from
// rng_make(seed, RNG_STREAM_AUGMENT, epoch, i) as dataset_load_sample draws it; *rng is left
// where the colour draws begin. dataset_plan_colour: the colour part (train) as *nsteps steps
// for kernels/image_aug.h (at most max_steps), drawn with *rng as transform_train_color draws
// them, and sample i's label. The plan run by transform_apply, then the steps, are
// dataset_load_decoded_sample, byte for byte; dataset_colour_fill: the steps' outside colour.
int dataset_plan_sample(const Dataset *ds, int64_t i, bool train, uint64_t seed, int64_t epoch,
                        int h, int w, TransformPlan *plan, Rng *rng, Error *err);
int dataset_plan_colour(const Dataset *ds, int64_t i, bool train, Rng *rng, ImageAugStep *steps,
                        int max_steps, int *nsteps, int *label, Error *err);
ImageAugFill dataset_colour_fill(const Dataset *ds);
