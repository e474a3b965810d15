// transform.h: the data pipeline's private interfaces: image transforms on uint8 HWC images, and
// the one Dataset fact the loader needs from dataset.c.
//
// The train transform is timm's: RandomResizedCrop (crop, then Pillow's resize with
// data.interpolation) + horizontal flip, then RandAugment or, without it, ColorJitter. The eval
// transform is torchvision's Resize(floor(img / crop_pct)) + CenterCrop(img). Resizing is
// Pillow's (data/image_ops.h): bilinear or bicubic, antialiased when shrinking, the same bytes.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "data/image_ops.h"
#include "data/loader.h"
#include "data/randaugment.h"
#include "src/rng.h"

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

// Train, geometric part: RandomResizedCrop to (out_h, out_w), then a flip with probability
// hflip; every draw from rng. src (h, w, p->chans), dst (p->out_h, p->out_w, p->chans).
void transform_train(const TransformParams *p, const uint8_t *src, int h, int w, Rng *rng,
                     uint8_t *dst);

// Train, colour part: RandAugment, or ColorJitter when RandAugment is off, in place on img
// (p->out_h, p->out_w, chans); chans may differ from p->chans (a gray source expanded first).
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
// dataset.c; the loader sizes its batch buffers with this).
int64_t dataset_sample_bytes(const Dataset *ds);
