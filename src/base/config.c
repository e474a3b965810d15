// config.c: the key table, the one place a config key is defined (name, type, default, meaning,
// range, where it lives in Config), and everything derived from it: defaults, the INI parser,
// command-line overrides, validation, the printed table, INI output and the key reference.
#include "src/base/config.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/config_keys.h"

// ---------------------------------------------------------------------------------------------
// The key table

typedef enum {
  KEY_STRING,      // char[capacity]: any text on one line
  KEY_ENUM,        // char[capacity]: one of `choices`
  KEY_WORD_INT,    // int: a word of `choices` (standing for values[its index]) or an integer
  KEY_BOOL,        // bool
  KEY_INT,         // int
  KEY_INT64,       // int64_t
  KEY_UINT64,      // uint64_t
  KEY_FLOAT,       // float
  KEY_DOUBLE,      // double: a value whose arithmetic is a double's (the EMA decay, as timm's)
  KEY_INT_PAIR,    // "N" or "H,W": ints at offset and offset2 ("N" sets both)
  KEY_FLOAT_PAIR,  // "min,max" with min <= max: floats at offset and offset2
  KEY_INT_LIST,    // "a,b,c": int[capacity]; length in the int at offset2, or zero-terminated
  KEY_FLOAT_LIST,  // "a,b,c": float[capacity]; likewise
} KeyType;

typedef enum { NO_BOUND, INCLUSIVE, EXCLUSIVE } BoundKind;
typedef struct {
  BoundKind lo_kind;
  double lo;
  BoundKind hi_kind;
  double hi;
} Range;

#define AT_LEAST(a) \
  { INCLUSIVE, (a), NO_BOUND, 0 }
#define ABOVE(a) \
  { EXCLUSIVE, (a), NO_BOUND, 0 }
#define FROM_TO(a, b) \
  { INCLUSIVE, (a), INCLUSIVE, (b) }  // [a, b]
#define FROM_BELOW(a, b) \
  { INCLUSIVE, (a), EXCLUSIVE, (b) }  // [a, b)
#define ABOVE_TO(a, b) \
  { EXCLUSIVE, (a), INCLUSIVE, (b) }  // (a, b]

#define NO_FIELD SIZE_MAX

typedef struct {
  const char *name;  // canonical: "key" at top level, "section.key" in a section
  KeyType type;
  const char *def;      // default, written as in an INI file
  const char *doc;      // one line for the key reference
  size_t offset;        // where the value lives in Config
  size_t offset2;       // pairs: the second field; lists: the int holding the length, or NO_FIELD
  int capacity;         // strings: bytes including the NUL; lists: elements
  Range range;          // numbers: the accepted range (of each element of a pair or list)
  bool broadcast;       // lists: a single value fills every element (per-channel values)
  const char *choices;  // enums, words or ints: the accepted words, '|'-separated
  const int *values;    // words or ints: the int each word of choices stands for
  bool shape;           // decides the model's shapes (compared by config_same_model)
} ConfigKey;

#define SCALAR(f) .offset = offsetof(Config, f), .offset2 = NO_FIELD
#define TEXT(f) \
  .offset = offsetof(Config, f), .offset2 = NO_FIELD, .capacity = (int)sizeof(((Config *)0)->f)
#define PAIR(a, b) .offset = offsetof(Config, a), .offset2 = offsetof(Config, b)
#define ELEMENTS(f) (int)(sizeof(((Config *)0)->f) / sizeof(((Config *)0)->f[0]))
#define LIST(f, count) \
  .offset = offsetof(Config, f), .offset2 = offsetof(Config, count), .capacity = ELEMENTS(f)
#define LIST_ZERO_TERMINATED(f) \
  .offset = offsetof(Config, f), .offset2 = NO_FIELD, .capacity = ELEMENTS(f)

static const ConfigKey config_keys[] = {
    // top level
    {"run_dir", KEY_STRING, "runs/default", "directory for checkpoints and metrics.jsonl",
     TEXT(run_dir)},
    {"resume", KEY_STRING, "",
     "\"\" starts fresh; \"auto\" resumes from the newest valid checkpoint in run_dir; "
     "otherwise the path of a checkpoint to resume from",
     TEXT(resume)},
    {"init_from", KEY_STRING, "",
     "safetensors weights (timm or official layout) to start from; \"\" = random init",
     TEXT(init_from)},
    {"init_head_map", KEY_STRING, "",
     "with init_from and another class count: a text file of source-class indices, one line per "
     "target class (as the official data/map22kto1k.txt), whose head rows are kept; \"\" = a "
     "fresh head",
     TEXT(init_head_map)},
    {"seed", KEY_UINT64, "0", "seed of every random draw (init, augmentation, drop path, shuffle)",
     SCALAR(seed)},
    {"device", KEY_ENUM, "auto",
     "where to train, evaluate and predict: auto (cuda when a GPU is usable, else cpu), cpu or "
     "cuda",
     TEXT(device), .choices = "auto|cpu|cuda"},
    {"threads", KEY_INT, "0", "OpenMP threads for the CPU kernels; 0 = all cores", SCALAR(threads),
     .range = AT_LEAST(0)},
    {"precision", KEY_ENUM, "fp32",
     "compute type of activations and GEMM weights: fp32, bf16 or fp16 (cuda only; fp32 master "
     "weights and AdamW state either way; fp16 adds dynamic loss scaling)",
     TEXT(precision), .choices = "fp32|bf16|fp16"},
    {"gemm_tune", KEY_ENUM, "off",
     "cuda: each matrix product of a new shape runs the fastest of up to 16 cuBLASLt algorithms, "
     "timed on its own operands at its first use (on), or the heuristic's first answer (off); "
     "either way the choice then stays for the run",
     TEXT(gemm_tune), .choices = "off|on"},
    {"eval", KEY_BOOL, "false",
     "evaluate instead of training: the weights of init_from (or resume) on the val split, on "
     "the chosen device; prints top-1, top-5, loss and img/s, writes one metrics record to "
     "run_dir and exits (no step, no checkpoint)",
     SCALAR(eval_only)},
    {"bench", KEY_ENUM, "off",
     "benchmark instead of training (nothing is written): step (or 1, true) times the training "
     "step on a synthetic batch resident on the device (throughput, MFU, memory, the GPU time "
     "per op family: an upper bound); e2e trains on the configured dataset with its loader and "
     "recipe, bench.warmup steps then bench.steps timed ones, and prints end-to-end img/s, the "
     "same step on a resident batch, the data wait and the loader's time per image by stage",
     TEXT(bench), .choices = "off|step|e2e|1|0|true|false"},

    // [model]
    {"model.version", KEY_INT, "1",
     "1: Swin (pre-norm blocks, scaled dot-product attention, a learned bias table); 2: Swin V2 "
     "(res-post-norm blocks, scaled cosine attention, the continuous position-bias MLP)",
     SCALAR(version), .range = FROM_TO(1, 2), .shape = true},
    {"model.img_size", KEY_INT_PAIR, "224", "input image size: N (square) or H,W",
     PAIR(img_h, img_w), .range = AT_LEAST(1), .shape = true},
    {"model.in_chans", KEY_INT, "3", "input channels (1 = grayscale, 3 = RGB)", SCALAR(in_chans),
     .range = FROM_TO(1, 4), .shape = true},
    {"model.patch_size", KEY_INT, "4", "side of the square patches the stem embeds, in pixels",
     SCALAR(patch_size), .range = AT_LEAST(1), .shape = true},
    {"model.embed_dim", KEY_INT, "96", "channels of stage 0; stage i has embed_dim * 2^i",
     SCALAR(embed_dim), .range = AT_LEAST(1), .shape = true},
    {"model.depths", KEY_INT_LIST, "2,2,6,2",
     "Swin blocks per stage; the length of the list is the number of stages",
     LIST(depths, num_stages), .range = AT_LEAST(1), .shape = true},
    {"model.num_heads", KEY_INT_LIST, "3,6,12,24",
     "attention heads per stage; each must divide its stage's width",
     LIST_ZERO_TERMINATED(num_heads), .range = AT_LEAST(1), .shape = true},
    {"model.window_size", KEY_INT, "7",
     "attention window side in tokens (a map side no larger than it becomes the window)",
     SCALAR(window_size), .range = AT_LEAST(1), .shape = true},
    {"model.mlp_ratio", KEY_FLOAT, "4.0", "MLP hidden width / block width", SCALAR(mlp_ratio),
     .range = ABOVE(0), .shape = true},
    {"model.qkv_bias", KEY_BOOL, "true", "learned bias on the q, k, v projections",
     SCALAR(qkv_bias), .shape = true},
    // Not a shape: a run may resume or fine-tune with another rate.
    {"model.drop_path_rate", KEY_FLOAT, "0.2",
     "stochastic depth rate of the last block (linear from 0 over the blocks)",
     SCALAR(drop_path_rate), .range = FROM_BELOW(0, 1)},
    {"model.num_classes", KEY_INT, "1000", "classes of the classification head",
     SCALAR(num_classes), .range = AT_LEAST(1), .shape = true},
    // Not a shape: the position-bias MLP takes any coordinates, so a V2 model fine-tunes from
    // one window to another with it.
    {"model.pretrained_window_sizes", KEY_INT_LIST, "0",
     "V2: window side each stage was pretrained with, which normalizes the position-bias "
     "coordinates; 0 = the stage's own window; 1 value (every stage) or one per stage",
     LIST(pretrained_windows, num_pretrained_windows), .range = AT_LEAST(0), .broadcast = true},

    // [train]
    {"train.batch_size", KEY_INT, "128",
     "images per optimizer step over all ranks (with train.accum_steps > 1, summed over its "
     "micro-batches)",
     SCALAR(batch_size), .range = AT_LEAST(1)},
    {"train.accum_steps", KEY_INT, "1",
     "gradient accumulation: micro-batches per optimizer step; each rank runs N forward and "
     "backward passes of train.batch_size / (processes x N) images, adding their gradients "
     "(the activations sized for one micro-batch), then one update equal to that of one batch of "
     "train.batch_size (with mixup/cutmix, pairs are formed within each micro-batch); steps, "
     "schedule and checkpoints count optimizer steps",
     SCALAR(accum_steps), .range = AT_LEAST(1)},
    {"train.epochs", KEY_INT, "300", "passes over the training set", SCALAR(epochs),
     .range = AT_LEAST(1)},
    {"train.max_steps", KEY_INT64, "0", "> 0: stop after this many (optimizer) steps",
     SCALAR(max_steps), .range = AT_LEAST(0)},
    {"train.lr", KEY_FLOAT, "5e-4", "peak learning rate (before lr_scale_batch scaling)",
     SCALAR(lr), .range = ABOVE(0)},
    {"train.lr_scale_batch", KEY_INT, "512",
     "> 0: lr, min_lr and warmup_lr are scaled by batch_size / lr_scale_batch (official "
     "recipe: 5e-4 per 512 images); 0 = use them as given",
     SCALAR(lr_scale_batch), .range = AT_LEAST(0)},
    {"train.min_lr", KEY_FLOAT, "5e-6", "floor of the cosine schedule", SCALAR(min_lr),
     .range = AT_LEAST(0)},
    {"train.warmup_lr", KEY_FLOAT, "5e-7", "learning rate at the first warmup step",
     SCALAR(warmup_lr), .range = AT_LEAST(0)},
    {"train.warmup_epochs", KEY_FLOAT, "20",
     "length of the linear warmup in epochs (fractions allowed)", SCALAR(warmup_epochs),
     .range = AT_LEAST(0)},
    {"train.weight_decay", KEY_FLOAT, "0.05", "AdamW decoupled weight decay", SCALAR(weight_decay),
     .range = AT_LEAST(0)},
    {"train.layer_decay", KEY_FLOAT, "1.0",
     "layer-wise learning-rate decay: a parameter's lr is scaled by layer_decay^(L + 1 - id), L "
     "the number of blocks, with the official Swin code's layer ids (patch embedding 0, the "
     "blocks 1..L in order, a patch merging with the block before it, the final norm and head "
     "L + 1); 1 = off (official SimMIM fine-tuning of Swin-B: 0.8)",
     SCALAR(layer_decay), .range = ABOVE_TO(0, 1)},
    {"train.beta1", KEY_FLOAT, "0.9", "AdamW decay of the first moment", SCALAR(beta1),
     .range = FROM_BELOW(0, 1)},
    {"train.beta2", KEY_FLOAT, "0.999", "AdamW decay of the second moment", SCALAR(beta2),
     .range = FROM_BELOW(0, 1)},
    {"train.eps", KEY_FLOAT, "1e-8", "AdamW epsilon", SCALAR(eps), .range = ABOVE(0)},
    {"train.clip_grad", KEY_FLOAT, "5.0", "largest global gradient norm; 0 = no clipping",
     SCALAR(clip_grad), .range = AT_LEAST(0)},
    {"train.ema_decay", KEY_DOUBLE, "0",
     "exponential moving average of the weights, as timm's ModelEmaV3: after each applied "
     "update ema += (1 - decay) (weights - ema), the first copying the weights; kept in fp32, "
     "saved in checkpoints, evaluated beside the model (eval_*_ema) and exported with "
     "swin_export ... weights=ema; 0 = off (timm's train.py: 0.9998)",
     SCALAR(ema_decay), .range = FROM_BELOW(0, 1)},
    {"train.ema_warmup", KEY_BOOL, "false",
     "with train.ema_decay: timm's decay warmup, min(ema_decay, 1 - t^(-2/3)) after t updates "
     "(it reaches 0.9 after 32 updates, 0.999 after 31,623); false = ema_decay from the second "
     "update on",
     SCALAR(ema_warmup)},
    {"train.label_smoothing", KEY_FLOAT, "0.1", "label smoothing of the cross-entropy target",
     SCALAR(label_smoothing), .range = FROM_BELOW(0, 1)},
    {"train.loss_scale", KEY_FLOAT, "65536",
     "fp16: initial dynamic loss scale (halved and the step skipped on inf/nan gradients, "
     "doubled after train.loss_scale_window clean steps)",
     SCALAR(loss_scale), .range = ABOVE(0)},
    {"train.loss_scale_window", KEY_INT, "2000", "fp16: clean steps before the loss scale doubles",
     SCALAR(loss_scale_window), .range = AT_LEAST(1)},
    {"train.nonfinite", KEY_ENUM, "stop",
     "on a non-finite loss or gradient: stop (exit with an error; the last checkpoint stays) or "
     "skip (drop the step, count it, stop after train.nonfinite_max in a row); the step is "
     "never applied",
     TEXT(nonfinite), .choices = "stop|skip"},
    {"train.nonfinite_max", KEY_INT, "20",
     "steps in a row that may be skipped (non-finite, or fp16 overflow) before the run stops",
     SCALAR(nonfinite_max), .range = AT_LEAST(1)},
    {"train.mixup", KEY_FLOAT, "0",
     "mixup alpha: a batch is blended with its reverse, weight lam ~ Beta(alpha, alpha), "
     "targets mixed alike (official: 0.8); 0 = off",
     SCALAR(mixup), .range = AT_LEAST(0)},
    {"train.cutmix", KEY_FLOAT, "0",
     "cutmix alpha: a box of each image is replaced by the reverse batch's, area from "
     "Beta(alpha, alpha) (official: 1.0); 0 = off",
     SCALAR(cutmix), .range = AT_LEAST(0)},
    {"train.mixup_prob", KEY_FLOAT, "1.0",
     "probability that a batch is mixed at all when mixup or cutmix is on", SCALAR(mixup_prob),
     .range = FROM_TO(0, 1)},
    {"train.mixup_switch_prob", KEY_FLOAT, "0.5",
     "with both mixup and cutmix on: probability that a mixed batch uses cutmix",
     SCALAR(mixup_switch_prob), .range = FROM_TO(0, 1)},
    {"train.log_every", KEY_INT, "50", "steps between progress lines and metrics.jsonl records",
     SCALAR(log_every), .range = AT_LEAST(1)},
    {"train.eval_every", KEY_INT, "0", "steps between evaluations; 0 = at the end of every epoch",
     SCALAR(eval_every), .range = AT_LEAST(0)},
    {"train.eval_batch_size", KEY_INT, "0",
     "images per evaluation batch over all ranks; 0 = batch_size / accum_steps (one "
     "micro-batch per rank)",
     SCALAR(eval_batch_size), .range = AT_LEAST(0)},
    {"train.recompute", KEY_WORD_INT, "none",
     "activation checkpointing: blocks that keep only their input in the forward and run their "
     "forward again right before their backward, into one scratch set they share: none, all "
     "(every block) or N (the first N blocks of every stage, at most its depth); costs roughly "
     "one more forward of those blocks, saves most of their activations (Swin-T batch 128 "
     "bf16, all: 5.19 -> 2.74 GiB), and gives the same bits",
     SCALAR(recompute), .range = AT_LEAST(0), .choices = "none|all",
     .values = (const int[]){0, -1}},
    {"train.cuda_graphs", KEY_ENUM, "auto",
     "the training step captured once into a CUDA graph and replayed (the same kernels, the same "
     "bits, without a host launch per kernel; under a launcher with its NCCL all-reduces): auto "
     "(on where supported: device cuda, except while nvJPEG decodes the training images on the "
     "same GPU, measured faster without), on (an error where unsupported) or off",
     TEXT(cuda_graphs), .choices = "auto|on|off"},

    // [data]
    {"data.dataset", KEY_ENUM, "imagefolder",
     "fashion_mnist (IDX files), imagefolder (one directory per class), shards (WebDataset-style "
     "tar files of NNNNNN.jpg + NNNNNN.cls) or synthetic (random pixels and labels, for "
     "benchmarks and tests: data.train_limit images, 12800 if 0)",
     TEXT(dataset), .choices = "fashion_mnist|imagefolder|shards|synthetic"},
    {"data.path", KEY_STRING, "",
     "fashion_mnist: the directory with the IDX(.gz) files; imagefolder: the root holding "
     "train/ and val/; shards: the root holding train/*.tar and val/*.tar",
     TEXT(path)},
    {"data.workers", KEY_INT, "0",
     "loader threads decoding and augmenting images; 0 = auto: the cores this process may run "
     "on, shared with the other processes of its node, less one for the trainer's own thread "
     "(at least 1)",
     SCALAR(workers), .range = AT_LEAST(0)},
    {"data.prefetch", KEY_INT, "0",
     "batch buffers of the loader's ring (batches it may run ahead); 0 = auto: data.workers + "
     "2, so every worker can fill a batch while the trainer holds one and one waits",
     SCALAR(prefetch), .range = AT_LEAST(0)},
    {"data.mean", KEY_FLOAT_LIST, "0.485,0.456,0.406",
     "per-channel mean of pixels scaled to [0,1]: 1 value (every channel) or in_chans values",
     LIST(mean, num_mean), .broadcast = true},
    {"data.std", KEY_FLOAT_LIST, "0.229,0.224,0.225",
     "per-channel standard deviation: 1 value (every channel) or in_chans values",
     LIST_ZERO_TERMINATED(std), .range = ABOVE(0), .broadcast = true},
    {"data.scale", KEY_FLOAT_PAIR, "0.08,1.0",
     "RandomResizedCrop area range min,max, as fractions of the image", PAIR(scale_min, scale_max),
     .range = ABOVE_TO(0, 1)},
    {"data.ratio", KEY_FLOAT_PAIR, "0.75,1.3333333", "RandomResizedCrop aspect ratio range min,max",
     PAIR(ratio_min, ratio_max), .range = ABOVE(0)},
    {"data.hflip", KEY_FLOAT, "0.5", "probability of a horizontal flip in training", SCALAR(hflip),
     .range = FROM_TO(0, 1)},
    {"data.crop_pct", KEY_FLOAT, "0.875",
     "evaluation: resize to img_size / crop_pct, then center-crop img_size", SCALAR(crop_pct),
     .range = ABOVE_TO(0, 1)},
    {"data.interpolation", KEY_ENUM, "bilinear",
     "resampling of RandomResizedCrop, the eval resize and RandAugment's geometric ops, with "
     "Pillow's kernels (antialiased when shrinking); random = bilinear or bicubic per image "
     "(eval: bicubic)",
     TEXT(interpolation), .choices = "bilinear|bicubic|random"},
    {"data.randaugment", KEY_STRING, "",
     "timm RandAugment spec applied to training images, e.g. rand-m9-mstd0.5-inc1 (official); "
     "empty = off",
     TEXT(randaugment)},
    {"data.color_jitter", KEY_FLOAT, "0",
     "brightness, contrast and saturation jitter strength of training images, used only when "
     "data.randaugment is off (timm: 0.4); 0 = off",
     SCALAR(color_jitter), .range = AT_LEAST(0)},
    {"data.reprob", KEY_FLOAT, "0",
     "random erasing probability per training image: one box filled with per-pixel normal "
     "noise after normalization (official: 0.25); 0 = off",
     SCALAR(reprob), .range = FROM_TO(0, 1)},
    {"data.shuffle_buffer", KEY_INT, "8192",
     "shards: samples held by the shuffle buffer each rank streams its tar files through",
     SCALAR(shuffle_buffer), .range = AT_LEAST(1)},
    {"data.train_limit", KEY_INT, "0",
     "> 0: use only N training images (Fashion-MNIST: the first N; imagefolder: round-robin "
     "over the classes)",
     SCALAR(train_limit), .range = AT_LEAST(0)},
    {"data.val_limit", KEY_INT, "0", "> 0: use only N validation images, chosen like train_limit",
     SCALAR(val_limit), .range = AT_LEAST(0)},
    {"data.skip_bad", KEY_BOOL, "false",
     "imagefolder: true replaces an image that does not decode by the next one in the split that "
     "does (each bad file is named in the log and counted); false stops with its path",
     SCALAR(skip_bad)},
    {"data.decoder", KEY_ENUM, "auto",
     "JPEG decoder of imagefolder and shards images: nvjpeg (the GPU's, a batch per loader "
     "worker; PNGs and progressive or CMYK JPEGs still go to stb), stb (stb_image on the CPU) "
     "or auto (nvjpeg when the build has it and device is cuda, else stb); pixels differ by a "
     "few levels between the two",
     TEXT(decoder), .choices = "auto|stb|nvjpeg"},

    // [ckpt]
    {"ckpt.every", KEY_INT, "0", "steps between checkpoints; 0 = at the end of every epoch",
     SCALAR(ckpt_every), .range = AT_LEAST(0)},
    {"ckpt.keep", KEY_INT, "3", "newest checkpoints kept in run_dir", SCALAR(ckpt_keep),
     .range = AT_LEAST(1)},

    // [dist]
    {"dist.bucket_mb", KEY_FLOAT, "25",
     "size of the gradient buckets all-reduced while backward runs, in MiB of fp32 gradients",
     SCALAR(bucket_mb), .range = ABOVE(0)},
    {"dist.reduce_dtype", KEY_ENUM, "fp32",
     "how gradients travel in the all-reduce: fp32, or bf16 for half the bytes (GPU only: "
     "the CPU backend reduces in fp32)",
     TEXT(reduce_dtype), .choices = "fp32|bf16"},
    {"dist.timeout_s", KEY_FLOAT, "300",
     "longest wait, in seconds, of a GPU rank for the others in NCCL (setup, a gradient "
     "all-reduce) before it ends the job as stuck",
     SCALAR(timeout_s), .range = ABOVE(0)},

    // [bench]
    {"bench.steps", KEY_INT, "50", "timed steps of the benchmark (in rounds of 10)",
     SCALAR(bench_steps), .range = AT_LEAST(1)},
    {"bench.warmup", KEY_INT, "10", "untimed steps before the benchmark measures",
     SCALAR(bench_warmup), .range = AT_LEAST(0)},
};

#define NUM_KEYS ((int)(sizeof config_keys / sizeof config_keys[0]))
_Static_assert(ELEMENTS(mean) <= CONFIG_MAX_STAGES && ELEMENTS(std) <= CONFIG_MAX_STAGES,
               "key_parse splits lists into at most CONFIG_MAX_STAGES elements");

// Longest formatted value: a string key plus room for quotes; lists of numbers are far shorter.
#define VALUE_MAX (CONFIG_STR_MAX + 64)
#define NOTE_MAX 256

// ---------------------------------------------------------------------------------------------
// Small text helpers

static char *trim(char *s) {
  while (isspace((unsigned char)*s)) s++;
  size_t n = strlen(s);
  while (n > 0 && isspace((unsigned char)s[n - 1])) s[--n] = 0;
  return s;
}

// Length of the section part of a canonical name ("model" in "model.embed_dim", 0 at top level).
static size_t section_len(const char *name) {
  const char *dot = strchr(name, '.');
  return dot ? (size_t)(dot - name) : 0;
}

static const char *bare_name(const char *name) {
  const char *dot = strchr(name, '.');
  return dot ? dot + 1 : name;
}

static bool same_section(const char *a, const char *b) {
  size_t n = section_len(a);
  return n == section_len(b) && strncmp(a, b, n) == 0;
}

// The position of `value` among the '|'-separated words of `list`, or -1.
static int word_index(const char *list, const char *value) {
  size_t n = strlen(value);
  int i = 0;
  for (const char *w = list; w; i++) {
    const char *bar = strchr(w, '|');
    size_t len = bar ? (size_t)(bar - w) : strlen(w);
    if (len == n && strncmp(w, value, n) == 0) return i;
    w = bar ? bar + 1 : NULL;
  }
  return -1;
}

static bool word_in(const char *list, const char *value) {
  return word_index(list, value) >= 0;
}

// snprintf that appends to buf (of size n) and never overflows.
static void append(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void append(char *buf, size_t n, const char *fmt, ...) {
  size_t used = strlen(buf);
  if (used + 1 >= n) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf + used, n - used, fmt, ap);
  va_end(ap);
}

// The shortest decimal that reads back as exactly v (at most 9 digits, which always suffice),
// without an exponent when the number is written as easily without one (20, not 2e+01).
static void format_float(float v, char *buf, size_t n) {
  for (int digits = 1; digits <= 9; digits++) {
    snprintf(buf, n, "%.*g", digits, (double)v);
    if (strtof(buf, NULL) != v) continue;
    const char *e = strchr(buf, 'e');
    int exponent = e ? atoi(e + 1) : 0;
    // %g switches to an exponent once it exceeds the digits; more digits keep it plain.
    if (e && exponent >= digits && exponent < 16) snprintf(buf, n, "%.*g", exponent + 1, (double)v);
    return;
  }
}

// The shortest decimal that reads back as exactly v (at most 17 digits).
static void format_double(double v, char *buf, size_t n) {
  for (int digits = 1; digits <= 17; digits++) {
    snprintf(buf, n, "%.*g", digits, v);
    if (strtod(buf, NULL) == v) return;
  }
}

static const ConfigKey *find_key(const char *name) {
  for (int i = 0; i < NUM_KEYS; i++)
    if (strcmp(config_keys[i].name, name) == 0) return &config_keys[i];
  return NULL;
}

static bool section_exists(const char *section, size_t len) {
  for (int i = 0; i < NUM_KEYS; i++)
    if (section_len(config_keys[i].name) == len && strncmp(config_keys[i].name, section, len) == 0)
      return true;
  return false;
}

// ---------------------------------------------------------------------------------------------
// Values: parsing one key's text, formatting it back, and what a key expects

static bool in_range(Range r, double v) {
  if (r.lo_kind == INCLUSIVE && !(v >= r.lo)) return false;
  if (r.lo_kind == EXCLUSIVE && !(v > r.lo)) return false;
  if (r.hi_kind == INCLUSIVE && !(v <= r.hi)) return false;
  if (r.hi_kind == EXCLUSIVE && !(v < r.hi)) return false;
  return true;
}

// "at least 1", "greater than 0 and at most 1", "from 1 to 4", or "" for any value.
static void range_words(Range r, char *buf, size_t n) {
  buf[0] = 0;
  if (r.lo_kind == INCLUSIVE && r.hi_kind == INCLUSIVE) {
    snprintf(buf, n, "from %g to %g", r.lo, r.hi);
    return;
  }
  if (r.lo_kind == INCLUSIVE) append(buf, n, "at least %g", r.lo);
  if (r.lo_kind == EXCLUSIVE) append(buf, n, "greater than %g", r.lo);
  if (r.lo_kind != NO_BOUND && r.hi_kind != NO_BOUND) append(buf, n, " and ");
  if (r.hi_kind == INCLUSIVE) append(buf, n, "at most %g", r.hi);
  if (r.hi_kind == EXCLUSIVE) append(buf, n, "less than %g", r.hi);
}

// What a key accepts, completing "expected ...".
static void key_expect(const ConfigKey *k, char *buf, size_t n) {
  char range[128];
  range_words(k->range, range, sizeof range);
  const char *sep = range[0] ? " " : "";
  switch (k->type) {
    case KEY_STRING:
      snprintf(buf, n, "text on one line, at most %d characters", k->capacity - 1);
      break;
    case KEY_ENUM:
    case KEY_WORD_INT:
      snprintf(buf, n, "one of: ");
      for (const char *c = k->choices; *c; c++) append(buf, n, *c == '|' ? ", " : "%c", *c);
      if (k->type == KEY_WORD_INT) append(buf, n, ", or an integer%s%s", sep, range);
      break;
    case KEY_BOOL:
      snprintf(buf, n, "one of: true, false, 1, 0, yes, no");
      break;
    case KEY_INT:
    case KEY_INT64:
      snprintf(buf, n, "an integer%s%s", sep, range);
      break;
    case KEY_UINT64:
      snprintf(buf, n, "an integer from 0 to %" PRIu64, UINT64_MAX);
      break;
    case KEY_FLOAT:
    case KEY_DOUBLE:
      snprintf(buf, n, "a number%s%s", sep, range);
      break;
    case KEY_INT_PAIR:
      snprintf(buf, n, "an integer N or two integers H,W, each %s", range);
      break;
    case KEY_FLOAT_PAIR:
      snprintf(buf, n, "two numbers min,max with min <= max, each %s", range);
      break;
    case KEY_INT_LIST:
      snprintf(buf, n, "a comma-separated list of 1 to %d integers%s%s", k->capacity,
               range[0] ? ", each " : "", range);
      break;
    case KEY_FLOAT_LIST:
      snprintf(buf, n, "a comma-separated list of 1 to %d numbers%s%s", k->capacity,
               range[0] ? ", each " : "", range);
      break;
  }
}

// Splits s at commas into trimmed elements; stores at most max of them (each < 64 characters)
// and returns how many there are, or -1 when one is too long.
static int split_commas(const char *s, char elems[][64], int max) {
  int count = 0;
  for (const char *p = s;; count++) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    if (count < max) {
      if (len >= 64) return -1;
      memcpy(elems[count], p, len);
      elems[count][len] = 0;
      char *t = trim(elems[count]);
      memmove(elems[count], t, strlen(t) + 1);
    }
    if (!comma) return count + 1;
    p = comma + 1;
  }
}

// Integers are decimal and must parse completely: "12x", "1.5", "" and overflow are refused.
static bool parse_int(const ConfigKey *k, const char *s, int64_t lo, int64_t hi, int64_t *out,
                      char *note) {
  if (!*s || isspace((unsigned char)*s)) return false;
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (*end) return false;
  if (errno == ERANGE || v < lo || v > hi) {
    snprintf(note, NOTE_MAX, "out of the range of a %d-bit integer", hi > INT_MAX ? 64 : 32);
    return false;
  }
  if (!in_range(k->range, (double)v)) return false;
  *out = v;
  return true;
}

// Numbers must parse completely, be finite as floats, and are range-checked as stored (so
// beta2 = 0.9999999999 is refused: it would be stored as exactly 1).
static bool parse_float(const ConfigKey *k, const char *s, float *out) {
  if (!*s || isspace((unsigned char)*s)) return false;
  char *end;
  double d = strtod(s, &end);
  if (*end) return false;
  float v = (float)d;
  if (!isfinite(v) || !in_range(k->range, (double)v)) return false;
  *out = v;
  return true;
}

// The same for a double: finite, range-checked as stored.
static bool parse_double(const ConfigKey *k, const char *s, double *out) {
  if (!*s || isspace((unsigned char)*s)) return false;
  char *end;
  double d = strtod(s, &end);
  if (*end || !isfinite(d) || !in_range(k->range, d)) return false;
  *out = d;
  return true;
}

static bool parse_bool(const char *s, bool *out) {
  static const char *const truths[] = {"true", "1", "yes"}, *const lies[] = {"false", "0", "no"};
  char lower[8] = {0};
  for (size_t i = 0; s[i]; i++) {
    if (i + 1 >= sizeof lower) return false;
    lower[i] = (char)tolower((unsigned char)s[i]);
  }
  for (int i = 0; i < 3; i++) {
    if (strcmp(lower, truths[i]) == 0) return *out = true, true;
    if (strcmp(lower, lies[i]) == 0) return *out = false, true;
  }
  return false;
}

// Whether text holds a '"' followed (after optional blanks) by '#' or ';'. Written in quotes,
// such a value would read back cut at that quote: file_value takes the first quote followed by
// a comment as the closing one.
static bool quote_before_comment(const char *text) {
  for (const char *q = strchr(text, '"'); q; q = strchr(q + 1, '"')) {
    const char *rest = q + 1;
    while (isspace((unsigned char)*rest)) rest++;
    if (*rest == '#' || *rest == ';') return true;
  }
  return false;
}

// Parses text as key k's value into cfg. On failure cfg is untouched, -1 is returned and note
// may hold a detail beyond what the key expects (a reason, a count).
static int key_parse(const ConfigKey *k, const char *text, Config *cfg, char *note) {
  char *dst = (char *)cfg + k->offset;
  note[0] = 0;
  switch (k->type) {
    case KEY_STRING: {
      size_t len = strlen(text);
      if (len >= (size_t)k->capacity) {
        snprintf(note, NOTE_MAX, "%zu characters is too long", len);
        return -1;
      }
      if (strpbrk(text, "\r\n")) {
        snprintf(note, NOTE_MAX, "it contains a line break");
        return -1;
      }
      if (quote_before_comment(text)) {
        snprintf(note, NOTE_MAX,
                 "a '\"' followed by '#' or ';' cannot be written back into a config file "
                 "(checkpoints store theirs that way)");
        return -1;
      }
      memset(dst, 0, (size_t)k->capacity);
      memcpy(dst, text, len);
      return 0;
    }
    case KEY_ENUM:
      if (!word_in(k->choices, text)) return -1;
      memset(dst, 0, (size_t)k->capacity);
      memcpy(dst, text, strlen(text));
      return 0;
    case KEY_WORD_INT: {
      int w = word_index(k->choices, text);
      int64_t v;
      if (w >= 0)
        v = k->values[w];
      else if (!parse_int(k, text, INT_MIN, INT_MAX, &v, note))
        return -1;
      *(int *)dst = (int)v;
      return 0;
    }
    case KEY_BOOL: {
      bool v;
      if (!parse_bool(text, &v)) return -1;
      *(bool *)dst = v;
      return 0;
    }
    case KEY_INT:
    case KEY_INT64: {
      int64_t v;
      bool wide = k->type == KEY_INT64;
      if (!parse_int(k, text, wide ? INT64_MIN : INT_MIN, wide ? INT64_MAX : INT_MAX, &v, note))
        return -1;
      if (wide)
        *(int64_t *)dst = v;
      else
        *(int *)dst = (int)v;
      return 0;
    }
    case KEY_UINT64: {
      // strtoull would wrap "-1" around to 2^64 - 1.
      if (!isdigit((unsigned char)text[0])) return -1;
      char *end;
      errno = 0;
      unsigned long long v = strtoull(text, &end, 10);
      if (*end) return -1;
      if (errno == ERANGE) {
        snprintf(note, NOTE_MAX, "out of the range of a 64-bit integer");
        return -1;
      }
      *(uint64_t *)dst = v;
      return 0;
    }
    case KEY_FLOAT: {
      float v;
      if (!parse_float(k, text, &v)) return -1;
      *(float *)dst = v;
      return 0;
    }
    case KEY_DOUBLE: {
      double v;
      if (!parse_double(k, text, &v)) return -1;
      *(double *)dst = v;
      return 0;
    }
    case KEY_INT_PAIR: {
      char elems[2][64];
      int64_t v[2];
      int count = split_commas(text, elems, 2);
      if (count < 1 || count > 2) return -1;
      for (int i = 0; i < count; i++)
        if (!parse_int(k, elems[i], INT_MIN, INT_MAX, &v[i], note)) return -1;
      *(int *)dst = (int)v[0];
      *(int *)((char *)cfg + k->offset2) = (int)v[count - 1];
      return 0;
    }
    case KEY_FLOAT_PAIR: {
      char elems[2][64];
      float v[2];
      if (split_commas(text, elems, 2) != 2) return -1;
      for (int i = 0; i < 2; i++)
        if (!parse_float(k, elems[i], &v[i])) return -1;
      if (v[0] > v[1]) {
        snprintf(note, NOTE_MAX, "min %g is greater than max %g", (double)v[0], (double)v[1]);
        return -1;
      }
      *(float *)dst = v[0];
      *(float *)((char *)cfg + k->offset2) = v[1];
      return 0;
    }
    case KEY_INT_LIST:
    case KEY_FLOAT_LIST: {
      char elems[CONFIG_MAX_STAGES][64];
      int count = split_commas(text, elems, k->capacity);
      if (count < 1) return -1;
      if (count > k->capacity) {
        snprintf(note, NOTE_MAX, "%d values, at most %d fit", count, k->capacity);
        return -1;
      }
      int64_t ints[CONFIG_MAX_STAGES] = {0};
      float floats[CONFIG_MAX_STAGES] = {0};
      for (int i = 0; i < count; i++) {
        bool ok = k->type == KEY_INT_LIST ? parse_int(k, elems[i], INT_MIN, INT_MAX, &ints[i], note)
                                          : parse_float(k, elems[i], &floats[i]);
        if (!ok) return -1;
      }
      // Unused elements stay 0, which ends a zero-terminated list (its elements are > 0);
      // a broadcast list given one value holds it in every element.
      int filled = k->broadcast && count == 1 ? k->capacity : count;
      for (int i = 0; i < k->capacity; i++) {
        int from = i < filled ? (count == 1 ? 0 : i) : -1;
        if (k->type == KEY_INT_LIST)
          ((int *)dst)[i] = from >= 0 ? (int)ints[from] : 0;
        else
          ((float *)dst)[i] = from >= 0 ? floats[from] : 0.0f;
      }
      if (k->offset2 != NO_FIELD) *(int *)((char *)cfg + k->offset2) = count;
      return 0;
    }
  }
  return -1;
}

// How many values a list key holds: its length field, or the elements before the first 0
// (a broadcast list whose elements are all equal was given one value).
static int list_count(const ConfigKey *k, const Config *cfg) {
  const char *src = (const char *)cfg + k->offset;
  if (k->offset2 != NO_FIELD) {
    int count = *(const int *)((const char *)cfg + k->offset2);
    return count < 0 ? 0 : count > k->capacity ? k->capacity : count;
  }
  int count = 0;
  bool all_equal = true;
  for (int i = 0; i < k->capacity; i++) {
    double v = k->type == KEY_INT_LIST ? ((const int *)src)[i] : ((const float *)src)[i];
    double first = k->type == KEY_INT_LIST ? ((const int *)src)[0] : ((const float *)src)[0];
    if (v != first) all_equal = false;
    if (v != 0 && count == i) count++;
  }
  return k->broadcast && all_equal && count > 0 ? 1 : count;
}

// The value of key k in cfg as INI text (strings unquoted).
static void key_format(const ConfigKey *k, const Config *cfg, char *buf, size_t n) {
  const char *src = (const char *)cfg + k->offset;
  const char *src2 = (const char *)cfg + (k->offset2 == NO_FIELD ? 0 : k->offset2);
  buf[0] = 0;
  switch (k->type) {
    case KEY_STRING:
    case KEY_ENUM:  // the precision bounds the read should the field lack its NUL
      snprintf(buf, n, "%.*s", k->capacity, src);
      break;
    case KEY_BOOL:
      snprintf(buf, n, "%s", *(const bool *)src ? "true" : "false");
      break;
    case KEY_WORD_INT: {  // the word that stands for the value, else the number
      int v = *(const int *)src, i = 0;
      snprintf(buf, n, "%d", v);
      for (const char *w = k->choices; w; i++) {
        const char *bar = strchr(w, '|');
        int len = bar ? (int)(bar - w) : (int)strlen(w);
        if (k->values[i] == v) snprintf(buf, n, "%.*s", len, w);
        w = bar ? bar + 1 : NULL;
      }
      break;
    }
    case KEY_INT:
      snprintf(buf, n, "%d", *(const int *)src);
      break;
    case KEY_INT64:
      snprintf(buf, n, "%" PRId64, *(const int64_t *)src);
      break;
    case KEY_UINT64:
      snprintf(buf, n, "%" PRIu64, *(const uint64_t *)src);
      break;
    case KEY_FLOAT:
      format_float(*(const float *)src, buf, n);
      break;
    case KEY_DOUBLE:
      format_double(*(const double *)src, buf, n);
      break;
    case KEY_INT_PAIR: {
      int a = *(const int *)src, b = *(const int *)src2;
      if (a == b)
        snprintf(buf, n, "%d", a);
      else
        snprintf(buf, n, "%d,%d", a, b);
      break;
    }
    case KEY_FLOAT_PAIR: {
      char a[32], b[32];
      format_float(*(const float *)src, a, sizeof a);
      format_float(*(const float *)src2, b, sizeof b);
      snprintf(buf, n, "%s,%s", a, b);
      break;
    }
    case KEY_INT_LIST:
    case KEY_FLOAT_LIST: {
      int count = list_count(k, cfg);
      for (int i = 0; i < count; i++) {
        char v[32];
        if (k->type == KEY_INT_LIST)
          snprintf(v, sizeof v, "%d", ((const int *)src)[i]);
        else
          format_float(((const float *)src)[i], v, sizeof v);
        append(buf, n, "%s%s", i ? "," : "", v);
      }
      break;
    }
  }
}

// Sets key k from text; `where` is "file:line" or "command line" for the message.
static int key_set(const ConfigKey *k, const char *text, Config *cfg, const char *where,
                   Error *err) {
  char note[NOTE_MAX];
  if (key_parse(k, text, cfg, note) == 0) return 0;
  char expect[256];
  key_expect(k, expect, sizeof expect);
  return error_set(err, "%s: bad value '%.200s' for key '%s'%s%s\nHINT: expected %s", where, text,
                   k->name, note[0] ? ": " : "", note, expect);
}

// ---------------------------------------------------------------------------------------------
// Unknown keys: the closest valid name, or the list of valid ones

// The key closest to `typed` (a canonical name as the user wrote it), comparing whole names and
// bare names (so "lr" under [model] finds train.lr), or NULL when none is within about a third
// of the typed length. Ties go to the typed section.
static const ConfigKey *closest_key(const char *typed) {
  char lower[128];
  size_t n = strlen(typed);
  if (n >= sizeof lower) return NULL;
  for (size_t i = 0; i <= n; i++) lower[i] = (char)tolower((unsigned char)typed[i]);
  const char *bare = bare_name(lower);
  int limit = (int)strlen(bare) / 3;
  if (limit < 1) limit = 1;
  const ConfigKey *best = NULL;
  int best_d = INT_MAX;
  bool best_same = false;
  for (int i = 0; i < NUM_KEYS; i++) {
    const ConfigKey *k = &config_keys[i];
    int d = edit_distance(bare, bare_name(k->name));
    int d_full = edit_distance(lower, k->name);
    int d_bare_full = edit_distance(bare, k->name);  // "train.model.embed_dim"
    if (d_full < d) d = d_full;
    if (d_bare_full < d) d = d_bare_full;
    bool same = same_section(lower, k->name);
    if (d < best_d || (d == best_d && same && !best_same)) {
      best = k;
      best_d = d;
      best_same = same;
    }
  }
  return best_d <= limit ? best : NULL;
}

static int unknown_key_error(const char *where, const char *typed, Error *err) {
  size_t sec_len = section_len(typed);
  bool section_ok = sec_len == 0 || section_exists(typed, sec_len);
  char hint[1536] = "";
  const ConfigKey *close = closest_key(typed);
  if (close) {
    snprintf(hint, sizeof hint, "did you mean '%s'?", close->name);
    if (!section_ok)
      append(hint, sizeof hint, " (there is no section [%.*s])", (int)sec_len, typed);
  } else if (!section_ok) {
    snprintf(hint, sizeof hint, "there is no section [%.*s]; the sections are:", (int)sec_len,
             typed);
    for (int i = 0; i < NUM_KEYS; i++) {
      const char *name = config_keys[i].name;
      size_t len = section_len(name);
      if (len && (i == 0 || !same_section(name, config_keys[i - 1].name)))
        append(hint, sizeof hint, " [%.*s]", (int)len, name);
    }
    append(hint, sizeof hint, " (top-level keys come before any section)");
  } else {
    if (sec_len)
      snprintf(hint, sizeof hint, "the keys of [%.*s] are:", (int)sec_len, typed);
    else
      snprintf(hint, sizeof hint, "the top-level keys are:");
    int listed = 0;
    for (int i = 0; i < NUM_KEYS; i++) {
      const char *name = config_keys[i].name;
      if (section_len(name) != sec_len || strncmp(name, typed, sec_len) != 0) continue;
      append(hint, sizeof hint, "%s %s", listed++ ? "," : "", bare_name(name));
    }
    if (!sec_len) append(hint, sizeof hint, "; keys in sections are written section.key");
  }
  if (!close) append(hint, sizeof hint, "; `swin_train --keys` lists every key");
  return error_set(err, "%s: unknown key '%.200s'\nHINT: %s", where, typed, hint);
}

// ---------------------------------------------------------------------------------------------
// Loading

void config_defaults(Config *cfg) {
  // Zero first: unused list elements and string tails are then deterministic, so two configs
  // with the same keys serialize the same.
  memset(cfg, 0, sizeof *cfg);
  char note[NOTE_MAX];
  // Every default parses (tests/test_config.c checks each resulting field).
  for (int i = 0; i < NUM_KEYS; i++) key_parse(&config_keys[i], config_keys[i].def, cfg, note);
}

// The value part of a file line: a "quoted" value verbatim (for text holding '#', ';' or edge
// spaces), otherwise the text before a trailing comment (a '#' or ';' that starts the value or
// follows whitespace), trimmed. NULL when a quote is not closed.
static char *file_value(char *s) {
  s = trim(s);
  if (*s == '"') {
    // The closing quote is the one followed by nothing but an optional comment.
    for (char *q = strchr(s + 1, '"'); q; q = strchr(q + 1, '"')) {
      const char *rest = q + 1;
      while (isspace((unsigned char)*rest)) rest++;
      if (!*rest || *rest == '#' || *rest == ';') {
        *q = 0;
        return s + 1;
      }
    }
    return NULL;
  }
  for (char *p = s; *p; p++)
    if ((*p == '#' || *p == ';') && (p == s || isspace((unsigned char)p[-1]))) {
      *p = 0;
      break;
    }
  return trim(s);
}

typedef struct {
  const char *origin;
  int line;
  char section[64];
  int set_on_line[NUM_KEYS];  // where each key was set in this text (0 = not yet)
} IniParser;

static int parse_section_header(IniParser *p, char *s, const char *where, Error *err) {
  char *close = strchr(s, ']');
  if (!close)
    return error_set(err, "%s: section header '%.100s' has no closing ']'\nHINT: write [model]",
                     where, s);
  char *rest = trim(close + 1);
  if (*rest && *rest != '#' && *rest != ';')
    return error_set(err,
                     "%s: unexpected text '%.100s' after the section header\n"
                     "HINT: a section header stands alone on its line, e.g. [train]",
                     where, rest);
  *close = 0;
  char *name = trim(s + 1);
  if (!*name || strlen(name) >= sizeof p->section || strchr(name, '.'))
    return error_set(err,
                     "%s: bad section name '[%.100s]'\nHINT: the sections are [model], "
                     "[train], [data], [ckpt] and [dist]",
                     where, name);
  snprintf(p->section, sizeof p->section, "%s", name);
  return 0;
}

static int parse_line(IniParser *p, char *line, Config *cfg, Error *err) {
  char where[CONFIG_STR_MAX + 32];
  snprintf(where, sizeof where, "%.*s:%d", CONFIG_STR_MAX, p->origin, p->line);
  char *s = trim(line);
  if (!*s || *s == '#' || *s == ';') return 0;
  if (*s == '[') return parse_section_header(p, s, where, err);
  char *eq = strchr(s, '=');
  if (!eq)
    return error_set(err,
                     "%s: expected 'key = value', a [section] header or a comment, got "
                     "'%.100s'\nHINT: write key = value, e.g. lr = 5e-4 under [train]",
                     where, s);
  *eq = 0;
  char *key = trim(s);
  char *value = file_value(eq + 1);
  if (!*key)
    return error_set(err, "%s: '=' without a key before it\nHINT: write key = value", where);
  if (!value)
    return error_set(err,
                     "%s: the quoted value of '%.100s' has no closing '\"'\n"
                     "HINT: end the value with '\"' (comments may follow it)",
                     where, key);
  // Under [section] a key is section.key; at top level it is written whole, so canonical names
  // (model.embed_dim = 96) work there too.
  char name[256];
  if (p->section[0])
    snprintf(name, sizeof name, "%s.%.180s", p->section, key);
  else
    snprintf(name, sizeof name, "%.250s", key);
  const ConfigKey *k = find_key(name);
  if (!k) return unknown_key_error(where, name, err);
  int index = (int)(k - config_keys);
  if (p->set_on_line[index])
    return error_set(err,
                     "%s: key '%s' is set twice in %s, on lines %d and %d\n"
                     "HINT: keep one of the two lines",
                     where, k->name, p->origin, p->set_on_line[index], p->line);
  if (key_set(k, value, cfg, where, err) != 0) return -1;
  p->set_on_line[index] = p->line;
  return 0;
}

int config_load_string(Config *cfg, const char *text, const char *origin, Error *err) {
  IniParser p = {.origin = origin ? origin : "config"};
  // Work on a copy so that a failure leaves cfg as it was.
  Config work = *cfg;
  size_t len = strlen(text);
  char *copy = malloc_check(len + 1);
  memcpy(copy, text, len + 1);
  char *line = copy;
  if (strncmp(line, "\xEF\xBB\xBF", 3) == 0) line += 3;  // a UTF-8 byte order mark
  int rc = 0;
  while (line && rc == 0) {
    char *newline = strchr(line, '\n');
    if (newline) *newline = 0;
    p.line++;
    rc = parse_line(&p, line, &work, err);
    line = newline ? newline + 1 : NULL;
  }
  free(copy);
  if (rc == 0) {
    snprintf(work.source, sizeof work.source, "%s", p.origin);
    *cfg = work;
  }
  return rc;
}

int config_load_file(Config *cfg, const char *path, Error *err) {
  size_t size;
  Error read_err;
  unsigned char *text = read_file(path, &size, &read_err);
  if (!text)
    return error_set(err,
                     "cannot read the config file: %s\nHINT: check the path given to "
                     "swin_train (configs/ holds examples)",
                     read_err.msg);
  if (memchr(text, 0, size)) {
    free(text);
    return error_set(err, "config file '%s' holds NUL bytes; it is not an INI text file", path);
  }
  int rc = config_load_string(cfg, (const char *)text, path, err);
  free(text);
  return rc;
}

int config_apply_override(Config *cfg, const char *arg, Error *err) {
  const char *eq = strchr(arg, '=');
  if (!eq)
    return error_set(err,
                     "command line: expected key=value, got '%.200s'\n"
                     "HINT: write overrides as key=value with the full key name, e.g. "
                     "train.lr=1e-3 or resume=auto",
                     arg);
  char key[256], value[CONFIG_STR_MAX + 64];
  size_t key_len = (size_t)(eq - arg);
  if (key_len >= sizeof key || strlen(eq + 1) >= sizeof value)
    return error_set(err, "command line: override '%.100s...' is too long", arg);
  memcpy(key, arg, key_len);
  key[key_len] = 0;
  snprintf(value, sizeof value, "%s", eq + 1);
  char *name = trim(key);
  if (!*name)
    return error_set(err,
                     "command line: '%.200s' has no key before '='\n"
                     "HINT: write key=value, e.g. train.lr=1e-3",
                     arg);
  const ConfigKey *k = find_key(name);
  if (!k) return unknown_key_error("command line", name, err);
  if (key_set(k, trim(value), cfg, "command line", err) != 0) return -1;
  cfg->overridden = true;
  return 0;
}

void config_where(const Config *cfg, char *buf, size_t size) {
  if (cfg->source[0] && cfg->overridden)
    snprintf(buf, size, "%s and the command line", cfg->source);
  else if (cfg->overridden)
    snprintf(buf, size, "the command line");
  else
    snprintf(buf, size, "%s", cfg->source);
}

// ---------------------------------------------------------------------------------------------
// Validation

// Whether a token map side `grid` (image side / patch) survives `stages` stages: even before each
// patch merging, and a multiple of its window side min(side, window) at every stage.
static bool side_tiles(int64_t grid, int window, int stages) {
  for (int i = 0; i < stages; i++) {
    if (i > 0 && (grid >> (i - 1)) % 2 != 0) return false;
    int64_t side = grid >> i, win = side < window ? side : window;
    if (win < 1 || side % win != 0) return false;
  }
  return true;
}

// "56,28,14,7" or "56x28,28x14,..." : the token maps of every stage.
static void describe_maps(int64_t gh, int64_t gw, int stages, char *buf, size_t n) {
  buf[0] = 0;
  for (int i = 0; i < stages; i++) {
    if (gh == gw)
      append(buf, n, "%s%lld", i ? "," : "", (long long)(gh >> i));
    else
      append(buf, n, "%s%lldx%lld", i ? "," : "", (long long)(gh >> i), (long long)(gw >> i));
  }
}

// The smallest grid side >= grid that tiles, or -1 when the search would be unreasonable.
static int64_t grid_that_tiles(int64_t grid, int window, int stages) {
  int64_t unit = (int64_t)window << (stages - 1);  // always tiles: window * 2^(stages-1)
  if (unit > (1 << 16)) return -1;
  for (int64_t g = grid;; g++)
    if (side_tiles(g, window, stages)) return g;
}

// A concrete fix for a geometry error: the nearest image size that tiles, and a smaller window
// that tiles the current maps when there is one.
static void geometry_hint(const Config *c, char *buf, size_t n) {
  int S = c->num_stages, p = c->patch_size;
  int64_t gh = c->img_h / p, gw = c->img_w / p;
  snprintf(buf, n,
           "choose img_size, patch_size and window_size so that every stage's map is a "
           "multiple of the window");
  int64_t th = grid_that_tiles(gh, c->window_size, S), tw = grid_that_tiles(gw, c->window_size, S);
  if (th < 0 || tw < 0) return;
  char maps[256];
  describe_maps(th, tw, S, maps, sizeof maps);
  if (th == tw)
    append(buf, n, ", e.g. model.img_size=%lld (maps %s)", (long long)(th * p), maps);
  else
    append(buf, n, ", e.g. model.img_size=%lld,%lld (maps %s)", (long long)(th * p),
           (long long)(tw * p), maps);
  for (int w = c->window_size - 1; w >= 2; w--)
    if (side_tiles(gh, w, S) && side_tiles(gw, w, S)) {
      describe_maps(gh, gw, S, maps, sizeof maps);
      append(buf, n, " or model.window_size=%d (maps %s)", w, maps);
      break;
    }
}

static int validate_stages(const Config *c, Error *err) {
  if (c->num_stages < 1 || c->num_stages > CONFIG_MAX_STAGES)
    return error_set(err,
                     "model.depths has %d stages; between 1 and CONFIG_MAX_STAGES = %d are "
                     "supported\nHINT: give one block count per stage, e.g. 2,2,6,2",
                     c->num_stages, CONFIG_MAX_STAGES);
  int heads = list_count(find_key("model.num_heads"), c);
  if (heads != c->num_stages) {
    char depths[VALUE_MAX], num_heads[VALUE_MAX];
    key_format(find_key("model.depths"), c, depths, sizeof depths);
    key_format(find_key("model.num_heads"), c, num_heads, sizeof num_heads);
    return error_set(err,
                     "model.depths has %d values (%s) but model.num_heads has %d (%s)\n"
                     "HINT: give one head count per stage, e.g. depths=2,2,6,2 with "
                     "num_heads=3,6,12,24",
                     c->num_stages, depths, heads, num_heads);
  }
  return 0;
}

// Each key's own type and range, for configs filled in code rather than parsed: its value is
// formatted and parsed back with the same rules as a file.
static int validate_each_key(const Config *c, Error *err) {
  for (int i = 0; i < NUM_KEYS; i++) {
    const ConfigKey *k = &config_keys[i];
    char text[VALUE_MAX], note[NOTE_MAX], expect[256];
    Config scratch = *c;
    key_format(k, c, text, sizeof text);
    if (key_parse(k, text, &scratch, note) == 0) continue;
    key_expect(k, expect, sizeof expect);
    return error_set(err, "%s = %s is not a valid value%s%s\nHINT: expected %s", k->name, text,
                     note[0] ? ": " : "", note, expect);
  }
  return 0;
}

static int validate_widths(const Config *c, Error *err) {
  for (int i = 0; i < c->num_stages; i++) {
    int64_t width = (int64_t)c->embed_dim << i;
    float hidden = (float)width * c->mlp_ratio;  // as the model computes it
    if (width > INT_MAX / 2 || hidden > (float)(INT_MAX / 2))
      return error_set(err,
                       "stage %d has width %lld = model.embed_dim %d * 2^%d (MLP width %.0f), "
                       "too large\nHINT: lower model.embed_dim or model.mlp_ratio",
                       i, (long long)width, c->embed_dim, i, (double)hidden);
    if (width % c->num_heads[i] != 0) {
      // Keep stage 0's head count (or the largest divisor below it) and double it per stage.
      int h0 = c->num_heads[0] < c->embed_dim ? c->num_heads[0] : c->embed_dim;
      while (c->embed_dim % h0 != 0) h0--;
      char example[128] = "";
      for (int s = 0; s < c->num_stages; s++)
        append(example, sizeof example, "%s%lld", s ? "," : "", (long long)h0 << s);
      return error_set(err,
                       "stage %d has width %lld = embed_dim %d * 2^%d, which num_heads[%d]=%d "
                       "does not divide\nHINT: each model.num_heads value must divide its "
                       "stage's width, e.g. model.num_heads=%s (%d channels per head)",
                       i, (long long)width, c->embed_dim, i, i, c->num_heads[i], example,
                       c->embed_dim / h0);
    }
    if (hidden != floorf(hidden))
      return error_set(err,
                       "model.mlp_ratio %g gives stage %d (width %lld) an MLP width of %g, "
                       "not a whole number\nHINT: choose mlp_ratio so that embed_dim * "
                       "mlp_ratio is a whole number, e.g. 4",
                       (double)c->mlp_ratio, i, (long long)width, (double)hidden);
  }
  return 0;
}

static int validate_geometry(const Config *c, Error *err) {
  int p = c->patch_size;
  if (c->img_h % p != 0 || c->img_w % p != 0) {
    bool bad_h = c->img_h % p != 0;
    int side = bad_h ? c->img_h : c->img_w;
    char choices[64];
    format_multiples_near(choices, sizeof choices, side, p);
    return error_set(err,
                     "model.img_size %dx%d does not tile into patches: the %s %d is not a "
                     "multiple of model.patch_size %d\nHINT: use an image %s that is a "
                     "multiple of %d, e.g. %s",
                     c->img_h, c->img_w, bad_h ? "height" : "width", side, p,
                     bad_h ? "height" : "width", p, choices);
  }
  int gh = c->img_h / p, gw = c->img_w / p;
  char hint[512];
  if (c->num_pretrained_windows != 1 && c->num_pretrained_windows != c->num_stages)
    return error_set(err,
                     "model.pretrained_window_sizes has %d values but the model has %d stages "
                     "(model.depths)\nHINT: give 1 value (every stage) or %d",
                     c->num_pretrained_windows, c->num_stages, c->num_stages);
  for (int i = 0; i < c->num_stages; i++) {
    int h = gh >> i, w = gw >> i;
    if (i > 0 && ((gh >> (i - 1)) % 2 != 0 || (gw >> (i - 1)) % 2 != 0)) {
      geometry_hint(c, hint, sizeof hint);
      return error_set(err,
                       "stage %d map %dx%d has an odd side, so patch merging cannot halve it "
                       "for stage %d (model.img_size %dx%d / patch_size %d, %d stages)\n"
                       "HINT: %s",
                       i - 1, gh >> (i - 1), gw >> (i - 1), i, c->img_h, c->img_w, p, c->num_stages,
                       hint);
    }
    int wh = h < c->window_size ? h : c->window_size, ww = w < c->window_size ? w : c->window_size;
    if (h % wh != 0 || w % ww != 0) {
      geometry_hint(c, hint, sizeof hint);
      return error_set(err,
                       "stage %d map %dx%d does not tile into %dx%d windows "
                       "(model.window_size %d)\nHINT: %s",
                       i, h, w, wh, ww, c->window_size, hint);
    }
    // V2's position-bias coordinates are divided by (pretrained side - 1), else (side - 1).
    int pw = c->pretrained_windows[c->num_pretrained_windows == 1 ? 0 : i];
    if (c->version == 2 && ((pw > 0 ? pw : wh) == 1 || (pw > 0 ? pw : ww) == 1))
      return error_set(err,
                       "model.version = 2: stage %d has %dx%d windows%s, and the continuous "
                       "position bias normalizes its coordinates by (window side - 1), which is "
                       "0 for a side of 1 (timm divides by zero there)\n"
                       "HINT: use an image or patch size that leaves stage %d at least 2x2 "
                       "tokens, fewer stages, or set model.pretrained_window_sizes for it (>= 2)",
                       i, wh, ww, pw == 1 ? " (model.pretrained_window_sizes 1)" : "", i);
  }
  return 0;
}

static int validate_data_and_train(const Config *c, Error *err) {
  int std_count = list_count(find_key("data.std"), c);
  char counts[64] = "1 value";
  if (c->in_chans > 1)
    snprintf(counts, sizeof counts, "1 value (used for every channel) or %d", c->in_chans);
  if (c->num_mean != 1 && c->num_mean != c->in_chans)
    return error_set(err, "data.mean has %d values but model.in_chans is %d\nHINT: give %s",
                     c->num_mean, c->in_chans, counts);
  if (std_count != 1 && std_count != c->in_chans)
    return error_set(err, "data.std has %d values but model.in_chans is %d\nHINT: give %s",
                     std_count, c->in_chans, counts);
  if (strcmp(c->device, "cpu") == 0 && strcmp(c->precision, "fp32") != 0)
    return error_set(err,
                     "precision=%s needs the CUDA backend, but device=cpu (the CPU computes in "
                     "fp32 only)\n"
                     "HINT: set precision=fp32, or device=cuda (or auto on a GPU "
                     "machine)",
                     c->precision);
  if (strcmp(c->device, "cpu") == 0 && strcmp(c->cuda_graphs, "on") == 0)
    return error_set(err,
                     "train.cuda_graphs=on needs the CUDA backend, but device=cpu\n"
                     "HINT: set train.cuda_graphs=auto (on wherever it is supported) or off, or "
                     "device=cuda");
  if (c->version == 2 && c->recompute != 0)
    return error_set(err,
                     "train.recompute = %s: activation checkpointing is built for V1's blocks "
                     "only, and model.version = 2\n"
                     "HINT: set train.recompute = none for a V2 model (or lower "
                     "train.batch_size, with train.accum_steps to keep the batch)",
                     c->recompute < 0 ? "all" : "a block count");
  if (c->batch_size % c->accum_steps != 0) {
    char choices[64];
    format_multiples_near(choices, sizeof choices, c->batch_size, c->accum_steps);
    return error_set(err,
                     "train.batch_size = %d does not divide into train.accum_steps = %d "
                     "micro-batches\nHINT: set train.batch_size to a multiple of %d (%s), or "
                     "train.accum_steps to a divisor of %d",
                     c->batch_size, c->accum_steps, c->accum_steps, choices, c->batch_size);
  }
  if ((c->mixup > 0 || c->cutmix > 0) && c->batch_size % 2 != 0)
    return error_set(err,
                     "train.mixup / train.cutmix pair each sample with the batch's reverse, so "
                     "train.batch_size must be even (it is %d)\nHINT: set train.batch_size=%d",
                     c->batch_size, c->batch_size + 1);
  if ((c->mixup > 0 || c->cutmix > 0) && (c->batch_size / c->accum_steps) % 2 != 0)
    return error_set(err,
                     "train.mixup / train.cutmix pair each sample with the reverse of its "
                     "micro-batch, so train.batch_size / train.accum_steps must be even (%d / %d "
                     "= %d)\nHINT: set train.batch_size=%d or train.accum_steps=%d",
                     c->batch_size, c->accum_steps, c->batch_size / c->accum_steps,
                     2 * c->batch_size, c->accum_steps / 2);
  if (c->init_head_map[0] && !c->init_from[0])
    return error_set(err,
                     "init_head_map = %s maps the classes of init_from's head, but init_from is "
                     "not set\nHINT: set init_from=WEIGHTS.safetensors or remove init_head_map",
                     c->init_head_map);
  if (c->eval_only && !c->init_from[0] && !c->resume[0])
    return error_set(err,
                     "eval = true evaluates given weights, but neither init_from nor resume is "
                     "set\nHINT: add init_from=WEIGHTS.safetensors (timm or official layout) or "
                     "resume=CHECKPOINT (or resume=auto for run_dir's newest)");
  if (c->eval_only && strcmp(c->bench, "off") != 0 && strcmp(c->bench, "0") != 0 &&
      strcmp(c->bench, "false") != 0)
    return error_set(err,
                     "eval = true and bench = %s both ask for another run than training\n"
                     "HINT: set one of them",
                     c->bench);
  if (c->ema_warmup && c->ema_decay == 0)
    return error_set(
        err,
        "train.ema_warmup = true warms up the decay of the weights' moving average, "
        "but train.ema_decay = 0 keeps none\n"
        "HINT: set train.ema_decay (timm's default 0.9998), or train.ema_warmup=false");
  // The cosine schedule runs from the peak down to min_lr (both scaled alike); below it, it
  // would rise.
  if (c->min_lr > c->lr)
    return error_set(err,
                     "train.min_lr %g is above the peak train.lr %g\n"
                     "HINT: lower train.min_lr or raise train.lr",
                     (double)c->min_lr, (double)c->lr);
  return 0;
}

// MPI's all-reduce on the CPU has no bf16; carrying gradients in bf16 is NCCL's, on the GPU.
static int validate_dist(const Config *c, Error *err) {
  if (strcmp(c->reduce_dtype, "bf16") == 0 && strcmp(c->device, "cpu") == 0)
    return error_set(err,
                     "dist.reduce_dtype = bf16 needs the GPU all-reduce (NCCL), but device = "
                     "cpu\nHINT: set dist.reduce_dtype=fp32 (the CPU backend reduces in fp32)");
  return 0;
}

int config_error_where(const Config *cfg, Error *err) {
  char where[CONFIG_STR_MAX + 32];
  config_where(cfg, where, sizeof where);
  return where[0] ? error_prefix(err, "%s: ", where) : -1;
}

// Checks that compare several keys, which may be set in different places, start their messages
// with where the values came from.
int config_validate(const Config *cfg, Error *err) {
  if (validate_stages(cfg, err) != 0) return config_error_where(cfg, err);
  if (validate_each_key(cfg, err) != 0) return -1;
  if (validate_widths(cfg, err) != 0 || validate_geometry(cfg, err) != 0 ||
      validate_data_and_train(cfg, err) != 0 || validate_dist(cfg, err) != 0)
    return config_error_where(cfg, err);
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Output

void config_print(const Config *cfg, FILE *out) {
  Config def;
  config_defaults(&def);
  fprintf(out, "config (* = changed from the default)\n");
  for (int i = 0; i < NUM_KEYS; i++) {
    const ConfigKey *k = &config_keys[i];
    size_t sec = section_len(k->name);
    if (sec && (i == 0 || !same_section(k->name, config_keys[i - 1].name)))
      fprintf(out, "[%.*s]\n", (int)sec, k->name);
    char value[VALUE_MAX], def_value[VALUE_MAX];
    key_format(k, cfg, value, sizeof value);
    key_format(k, &def, def_value, sizeof def_value);
    bool changed = strcmp(value, def_value) != 0;
    fprintf(out, "%c %-23s %s", changed ? '*' : ' ', k->name, value[0] ? value : "\"\"");
    if (changed) fprintf(out, "   (default %s)", def_value[0] ? def_value : "\"\"");
    fputc('\n', out);
  }
}

// Text that file_value would cut short or trim is written in quotes; so is "" (for the reader).
static bool needs_quotes(const char *s) {
  size_t n = strlen(s);
  return n == 0 || strpbrk(s, "#;\"") || isspace((unsigned char)s[0]) ||
         isspace((unsigned char)s[n - 1]);
}

char *config_to_ini(const Config *cfg) {
  size_t cap = (size_t)NUM_KEYS * (VALUE_MAX + 64) + 256, used = 0;
  char *ini = malloc_check(cap);
  ini[0] = 0;
  used += (size_t)snprintf(ini, cap, "# swin.c resolved config\n");
  for (int i = 0; i < NUM_KEYS; i++) {
    const ConfigKey *k = &config_keys[i];
    size_t sec = section_len(k->name);
    if (sec && (i == 0 || !same_section(k->name, config_keys[i - 1].name)))
      used += (size_t)snprintf(ini + used, cap - used, "\n[%.*s]\n", (int)sec, k->name);
    char value[VALUE_MAX];
    key_format(k, cfg, value, sizeof value);
    const char *quote = k->type == KEY_STRING && needs_quotes(value) ? "\"" : "";
    used += (size_t)snprintf(ini + used, cap - used, "%s = %s%s%s\n", bare_name(k->name), quote,
                             value, quote);
  }
  return ini;
}

int config_same_model(const Config *a, const Config *b, Error *err) {
  char msg[sizeof err->msg] = "";
  for (int i = 0; i < NUM_KEYS; i++) {
    const ConfigKey *k = &config_keys[i];
    if (!k->shape) continue;
    char va[VALUE_MAX], vb[VALUE_MAX];
    key_format(k, a, va, sizeof va);
    key_format(k, b, vb, sizeof vb);
    if (strcmp(va, vb) != 0)
      append(msg, sizeof msg, "%s%s: %s vs %s", msg[0] ? "\n" : "", k->name, va, vb);
  }
  if (!msg[0]) return 0;
  return error_set(err, "%s", msg);
}

// Markdown cell text: '|' would end the cell.
static void markdown_cell(FILE *out, const char *s) {
  for (; *s; s++) {
    if (*s == '|') fputc('\\', out);
    fputc(*s, out);
  }
}

void config_print_reference(FILE *out) {
  fprintf(out, "| key | default | meaning |\n|---|---|---|\n");
  for (int i = 0; i < NUM_KEYS; i++) {
    const ConfigKey *k = &config_keys[i];
    char expect[256];
    key_expect(k, expect, sizeof expect);
    fprintf(out, "| `%s` | `", k->name);
    markdown_cell(out, k->def[0] ? k->def : "\"\"");
    fprintf(out, "` | ");
    markdown_cell(out, k->doc);
    fprintf(out, ". Expects ");
    markdown_cell(out, expect);
    fprintf(out, ". |\n");
  }
}
