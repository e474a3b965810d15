// config.h: the resolved configuration of a run, and the INI parser that fills it.
//
// A config file is INI: `key = value` lines, `[section]` headers, `#` or `;` comments. A key's
// canonical name is "section.key" (model.embed_dim, train.lr, data.workers, ckpt.keep); keys
// before any section header are top-level (seed, run_dir, resume, init_from, ...). Command-line
// overrides use the canonical name: `train.lr=1e-3 resume=auto`. Every key is typed, has a
// documented default and is validated; see config.c's key table, the one place keys are defined.
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "src/base/util.h"

#define CONFIG_MAX_STAGES 8
#define CONFIG_STR_MAX 512

typedef struct {
  // top level
  char run_dir[CONFIG_STR_MAX];        // where checkpoints and metrics.jsonl go
  char resume[CONFIG_STR_MAX];         // "" (none), "auto", or a checkpoint path
  char init_from[CONFIG_STR_MAX];      // "" or a safetensors file of timm/official weights
  char init_head_map[CONFIG_STR_MAX];  // "" or init_from's class index of each class, a line each
  uint64_t seed;
  char device[16];    // "auto", "cpu" or "cuda"
  int threads;        // OpenMP threads for CPU kernels, 0 = all cores
  char precision[8];  // "fp32", "bf16" or "fp16"
  char gemm_tune[8];  // "off" or "on": the GPU's matrix products timed per shape at first use

  // [model]
  int version;       // 1: Swin (V1); 2: Swin V2 (res-post-norm, cosine attention, CPB MLP)
  int img_h, img_w;  // model.img_size = "32" or "32,48" (H,W)
  int in_chans;
  int patch_size;
  int embed_dim;
  int num_stages;
  int depths[CONFIG_MAX_STAGES];
  int num_heads[CONFIG_MAX_STAGES];
  int window_size;
  float mlp_ratio;
  bool qkv_bias;
  float drop_path_rate;
  int num_classes;
  // V2: the window sides the model was pretrained with, per stage (0 = this stage's window),
  // which the continuous position bias's coordinates are normalized by.
  int pretrained_windows[CONFIG_MAX_STAGES];
  int num_pretrained_windows;

  // [train]
  int batch_size;   // images per optimizer step, over all ranks
  int accum_steps;  // micro-batches per optimizer step (gradient accumulation); 1 = none
  int epochs;
  int64_t max_steps;    // > 0 overrides epochs
  float lr;             // peak learning rate (before lr_scale_batch scaling)
  int lr_scale_batch;   // > 0: lr, min_lr, warmup_lr *= batch_size / lr_scale_batch (official: 512)
  float min_lr;         // cosine floor
  float warmup_lr;      // learning rate at step 0 of warmup
  float warmup_epochs;  // linear warmup length, in epochs (fractions allowed)
  float weight_decay;
  float layer_decay;  // layer-wise lr decay: lr * layer_decay^(blocks + 1 - layer id); 1 = off
  float beta1, beta2, eps;
  float clip_grad;   // global-norm clip; 0 = off
  double ema_decay;  // moving average of the weights (timm ModelEmaV3); 0 = off
  bool ema_warmup;   // timm's warmup of the EMA decay
  float label_smoothing;
  float loss_scale;         // fp16: initial dynamic loss scale
  int loss_scale_window;    // fp16: clean steps before the scale doubles
  char nonfinite[8];        // "stop" or "skip"
  int nonfinite_max;        // skipped steps in a row before the run stops
  float mixup;              // mixup Beta alpha; 0 = off
  float cutmix;             // cutmix Beta alpha; 0 = off
  float mixup_prob;         // probability that a batch is mixed at all
  float mixup_switch_prob;  // with both on: probability of cutmix instead of mixup
  int log_every;            // steps between progress lines / metrics records
  int eval_every;           // steps between evaluations; 0 = at the end of every epoch
  int eval_batch_size;      // 0 = batch_size / accum_steps
  int recompute;  // blocks of each stage rebuilt in the backward: 0 none, -1 all, N the first N
  char cuda_graphs[8];  // "auto", "on" or "off": the training step as a replayed CUDA graph

  // [data]
  char dataset[32];  // "fashion_mnist", "imagefolder", "shards" or "synthetic"
  char path[CONFIG_STR_MAX];
  int workers;
  int prefetch;  // batches the loader may run ahead
  int num_mean;  // channels given in mean/std (1 or in_chans)
  float mean[4], std[4];
  float scale_min, scale_max;  // RandomResizedCrop area range
  float ratio_min, ratio_max;  // RandomResizedCrop aspect range
  float hflip;                 // probability
  float crop_pct;              // eval: resize to img / crop_pct, then center crop img
  char randaugment[64];        // "" (off) or a timm RandAugment spec, e.g. rand-m9-mstd0.5-inc1
  float color_jitter;          // brightness/contrast/saturation jitter when RandAugment is off
  char interpolation[16];      // "bilinear", "bicubic" or "random" (resizes and RandAugment)
  float reprob;                // random erasing probability per training sample
  int shuffle_buffer;          // shards: samples held by the shuffle buffer
  int train_limit;             // > 0: use only the first N training samples (tests, quick runs)
  int val_limit;
  bool skip_bad;     // imagefolder: replace an image that does not decode instead of stopping
  char decoder[16];  // "auto", "stb" or "nvjpeg": who decodes JPEG files (data/jpeg_gpu.h)

  // [ckpt]
  int ckpt_every;  // steps between checkpoints; 0 = at the end of every epoch
  int ckpt_keep;   // newest checkpoints kept in run_dir

  // [dist]
  float bucket_mb;       // gradient all-reduce bucket, MiB of fp32 gradients
  char reduce_dtype[8];  // "fp32" or "bf16": how gradients travel between GPUs
  float timeout_s;       // GPU: longest wait for the other ranks in NCCL before the job ends

  bool eval_only;  // eval: evaluate init_from / resume's weights on the val split and exit

  // [bench]
  char bench[8];     // "off", "step" (src/app/bench.c) or "e2e" (src/app/train.c); 1/true = step
  int bench_steps;   // timed steps
  int bench_warmup;  // untimed steps first

  // Where the values came from (not keys): named by errors that involve several keys, whose
  // values may come from the file, the command line or both.
  char source[CONFIG_STR_MAX];  // the file (or text origin) last loaded; "" when built in code
  bool overridden;              // command-line overrides were applied
} Config;

// Sets every key to its documented default.
void config_defaults(Config *cfg);
// Parses an INI file into cfg (which holds defaults or earlier values). Errors name the file,
// line and key, suggest the closest valid key for an unknown one, and say what was expected.
int config_load_file(Config *cfg, const char *path, Error *err);
// Applies one "key=value" override (canonical key name); errors say "command line".
int config_apply_override(Config *cfg, const char *arg, Error *err);
// Cross-key checks: heads divide widths, the image tiles into patches and windows at every
// stage, ranges; each message explains the inconsistency and how to fix it.
int config_validate(const Config *cfg, Error *err);
// The benchmark the bench key asks for: bench=step (1, true) and bench=e2e.
static inline bool config_bench_step(const Config *c) {
  return strcmp(c->bench, "step") == 0 || strcmp(c->bench, "1") == 0 ||
         strcmp(c->bench, "true") == 0;
}
static inline bool config_bench_e2e(const Config *c) {
  return strcmp(c->bench, "e2e") == 0;
}
// The resolved config as a table (key, value, default marker) on out.
void config_print(const Config *cfg, FILE *out);
// The resolved config as INI text (every key, canonical names), for checkpoint metadata;
// returns a malloc'ed string. config_load_string parses such text back.
char *config_to_ini(const Config *cfg);
int config_load_string(Config *cfg, const char *text, const char *origin, Error *err);
// Where cfg's values came from, for messages about several keys: "configs/x.ini",
// "configs/x.ini and the command line", "the command line", or "" for a config built in code.
void config_where(const Config *cfg, char *buf, size_t size);
// Prefixes err's message with config_where and ": " (when known); returns -1. For errors about
// several keys at once, raised outside config.c (dataset against model, batch against split).
int config_error_where(const Config *cfg, Error *err);
// Compares the keys that decide the model's shapes (model.*); on a difference fills err with
// every differing key and both values and returns -1.
int config_same_model(const Config *a, const Config *b, Error *err);
