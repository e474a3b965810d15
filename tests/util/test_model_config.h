// test_model_config.h: the small Swin models the tests train and compare, described in one line
// each instead of field by field.
#pragma once
#include <string.h>

#include "src/base/config.h"

typedef struct {
  int img_h, img_w;  // img_w 0: square
  int chans, patch, embed, window, classes;
  int depths[CONFIG_MAX_STAGES], heads[CONFIG_MAX_STAGES];  // stages until the first depth 0
} TestModel;

// The defaults of config_defaults with t's architecture.
static inline Config test_model_config(TestModel t) {
  Config c;
  config_defaults(&c);
  c.img_h = t.img_h;
  c.img_w = t.img_w ? t.img_w : t.img_h;
  c.in_chans = t.chans;
  c.patch_size = t.patch;
  c.embed_dim = t.embed;
  c.window_size = t.window;
  c.num_classes = t.classes;
  memset(c.depths, 0, sizeof c.depths);  // the config's lists end at the first 0
  memset(c.num_heads, 0, sizeof c.num_heads);
  c.num_stages = 0;
  while (c.num_stages < CONFIG_MAX_STAGES && t.depths[c.num_stages] > 0) {
    c.depths[c.num_stages] = t.depths[c.num_stages];
    c.num_heads[c.num_stages] = t.heads[c.num_stages];
    c.num_stages++;
  }
  return c;
}
