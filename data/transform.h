// transform.h: the data pipeline's private interfaces: image transforms on uint8 HWC images, and
// the one Dataset fact the loader needs from dataset.c.
//
// Both the train transform (RandomResizedCrop + horizontal flip) and the eval transform (resize
// + center crop) end in one separable resampler: a triangle (tent) filter centered on each output
// pixel (pixel centers aligned, like align_corners=False) whose radius is one output pixel, i.e.
// plain bilinear when enlarging and an area-aware (antialiased) average over every covered source
// pixel when shrinking, like PIL's BILINEAR and torchvision's antialias=True.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "data/loader.h"
#include "src/rng.h"

typedef struct {
  int out_h, out_w, chans;     // output image (out_h, out_w, chans)
  float scale_min, scale_max;  // RandomResizedCrop: crop area as a fraction of the image
  float ratio_min, ratio_max;  // RandomResizedCrop: crop aspect w/h, drawn log-uniformly
  float hflip;                 // train: probability of a horizontal flip
  float crop_pct;              // eval: resize to out / crop_pct, then center crop out
} TransformParams;

// An integer crop box in source pixels.
typedef struct {
  int top, left, h, w;
} CropBox;

// A fractional source region for the resampler, in source pixels (eval's box comes from an
// intermediate resize and need not fall on pixel edges).
typedef struct {
  double top, left, h, w;
} SourceBox;

// RandomResizedCrop's box in an (h, w) image, torchvision's algorithm: up to 10 draws of an area
// fraction U(scale) and a log-uniform aspect, accepted when the box fits, then a uniform
// position; else a center crop with the aspect clamped to [ratio_min, ratio_max].
CropBox transform_rrc_box(const TransformParams *p, int h, int w, Rng *rng);

// Resamples `box` of src (src_h, src_w, chans) to dst (out_h, out_w, chans). clamp_to_box: filter
// taps read only pixels inside the box (a crop, as torchvision crops before it resizes); otherwise
// they may read the whole image (the box is a window into a larger resized image).
void transform_resample(const uint8_t *src, int src_h, int src_w, int chans, SourceBox box,
                        bool clamp_to_box, uint8_t *dst, int out_h, int out_w);

// Mirrors img (h, w, chans) left-right in place.
void transform_hflip(uint8_t *img, int h, int w, int chans);

// Train: RandomResizedCrop to (out_h, out_w), then a flip with probability hflip; every draw
// from rng. src (h, w, p->chans), dst (p->out_h, p->out_w, p->chans).
void transform_train(const TransformParams *p, const uint8_t *src, int h, int w, Rng *rng,
                     uint8_t *dst);

// Eval: resize keeping the aspect to the smallest size that covers (out_h, out_w) / crop_pct
// (for a square output: shorter side = round(out / crop_pct)), then center crop (out_h, out_w).
// With crop_pct 1 and an image that already has the output size, this is the identity.
// src (h, w, p->chans), dst (p->out_h, p->out_w, p->chans).
void transform_eval(const TransformParams *p, const uint8_t *src, int h, int w, uint8_t *dst);

// Bytes of one transformed sample, img_h * img_w * in_chans (the Dataset struct is private to
// dataset.c; the loader sizes its batch buffers with this).
int64_t dataset_sample_bytes(const Dataset *ds);
