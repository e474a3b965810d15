// test_config.c: the config system as a specification: defaults, a full INI file, overrides,
// every parse and validation error (file, line, key, hint), INI round trips with random values,
// config_same_model, the printed table and the key reference.
#define _POSIX_C_SOURCE 200809L  // mkdtemp, open_memstream

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/jpeg_gpu.h"
#include "data/loader.h"
#include "src/base/config.h"
#include "src/base/config_keys.h"
#include "tests/util/test_util.h"

static char tmp_dir[256];
static char written[64][512];  // the files write_config made, removed at the end
static int num_written;

// Writes text to tmp_dir/name and returns the path (valid until the end of the test).
static const char *write_config(const char *name, const char *text) {
  if (num_written == 64) {
    printf("FAIL more config files than the test expects\n");
    exit(1);
  }
  char *path = written[num_written++];
  snprintf(path, sizeof written[0], "%s/%s", tmp_dir, name);
  FILE *f = fopen(path, "wb");
  if (!f) {
    printf("FAIL cannot write %s\n", path);
    exit(1);
  }
  fputs(text, f);
  fclose(f);
  return path;
}

// Checks that a call failed (-1) with a message holding every needle; prints the message if not.
static void check_error(const char *what, int rc, const Error *err, const char *const *needles) {
  const char *missing = NULL;
  for (int i = 0; needles[i]; i++)
    if (!strstr(err->msg, needles[i])) {
      missing = needles[i];
      break;
    }
  if (!test_check(rc == -1 && !missing, "%-36s fails (rc %d) with the expected message", what, rc))
    printf("     missing: '%s'\n     message: %s\n", missing ? missing : "(none)", err->msg);
}
#define CHECK_ERROR(what, rc, err, ...) \
  check_error((what), (rc), (err), (const char *const[]){__VA_ARGS__, NULL})

static void check_ok(const char *what, int rc, const Error *err) {
  if (!test_check(rc == 0, "%-36s succeeds", what)) printf("     message: %s\n", err->msg);
}

// A Config full of garbage, so that a field config_defaults forgets to set shows.
static void poison_config(Config *cfg) {
  memset(cfg, 0xA5, sizeof *cfg);
}

static bool floats_equal(const float *a, const float *b, int n) {
  for (int i = 0; i < n; i++)
    if (!(a[i] == b[i])) return false;
  return true;
}

// Field-by-field comparison, independent of config.c's table; returns the first differing field.
// One line per group of fields reads better than one line per field.
// clang-format off
static const char *config_diff(const Config *a, const Config *b) {
#define SAME_STR(f) if (strcmp(a->f, b->f) != 0) return #f
#define SAME(f) if (!(a->f == b->f)) return #f
#define SAME_FLOATS(f, n) if (!floats_equal(a->f, b->f, (n))) return #f
  SAME_STR(run_dir); SAME_STR(resume); SAME_STR(init_from); SAME(seed); SAME_STR(device);
  SAME(threads); SAME_STR(precision);
  SAME(img_h); SAME(img_w); SAME(in_chans); SAME(patch_size); SAME(embed_dim); SAME(num_stages);
  for (int i = 0; i < CONFIG_MAX_STAGES; i++) {
    SAME(depths[i]);
    SAME(num_heads[i]);
  }
  SAME(window_size); SAME(mlp_ratio); SAME(qkv_bias); SAME(drop_path_rate); SAME(num_classes);
  SAME(batch_size); SAME(accum_steps); SAME(epochs); SAME(max_steps); SAME(lr); SAME(lr_scale_batch); SAME(min_lr);
  SAME(warmup_lr); SAME(warmup_epochs); SAME(weight_decay); SAME(beta1); SAME(beta2); SAME(eps);
  SAME(clip_grad); SAME(label_smoothing); SAME(log_every); SAME(eval_every);
  SAME(eval_batch_size); SAME(recompute); SAME_STR(cuda_graphs);
  SAME_STR(dataset); SAME_STR(path); SAME(workers); SAME(prefetch); SAME(num_mean);
  SAME_FLOATS(mean, 4); SAME_FLOATS(std, 4);
  SAME(scale_min); SAME(scale_max); SAME(ratio_min); SAME(ratio_max); SAME(hflip); SAME(crop_pct);
  SAME(train_limit); SAME(val_limit); SAME(skip_bad); SAME_STR(decoder); SAME(ckpt_every);
  SAME(ckpt_keep);
  SAME(bucket_mb); SAME_STR(reduce_dtype); SAME(timeout_s);
  return NULL;
#undef SAME_STR
#undef SAME
#undef SAME_FLOATS
}
// clang-format on

// ---------------------------------------------------------------------------------------------

static void test_defaults(void) {
  Config c;
  poison_config(&c);
  config_defaults(&c);
  const float imagenet_mean[4] = {0.485f, 0.456f, 0.406f, 0},
              imagenet_std[4] = {0.229f, 0.224f, 0.225f, 0};
  const int depths[4] = {2, 2, 6, 2}, heads[4] = {3, 6, 12, 24};
  bool ok = strcmp(c.run_dir, "runs/default") == 0 && c.resume[0] == 0 && c.init_from[0] == 0 &&
            c.seed == 0 && strcmp(c.device, "auto") == 0 && c.threads == 0 &&
            strcmp(c.precision, "fp32") == 0;
  test_check(ok, "defaults: top-level keys");
  ok = c.img_h == 224 && c.img_w == 224 && c.in_chans == 3 && c.patch_size == 4 &&
       c.embed_dim == 96 && c.num_stages == 4 && memcmp(c.depths, depths, sizeof depths) == 0 &&
       memcmp(c.num_heads, heads, sizeof heads) == 0 && c.depths[4] == 0 && c.num_heads[4] == 0 &&
       c.window_size == 7 && c.mlp_ratio == 4.0f && c.qkv_bias && c.drop_path_rate == 0.2f &&
       c.num_classes == 1000;
  test_check(ok, "defaults: [model] (swin_tiny)");
  ok = c.batch_size == 128 && c.accum_steps == 1 && c.epochs == 300 && c.max_steps == 0 &&
       c.lr == 5e-4f && c.lr_scale_batch == 512 && c.min_lr == 5e-6f && c.warmup_lr == 5e-7f &&
       c.warmup_epochs == 20.0f && c.weight_decay == 0.05f && c.beta1 == 0.9f &&
       c.beta2 == 0.999f && c.eps == 1e-8f && c.clip_grad == 5.0f && c.label_smoothing == 0.1f &&
       c.log_every == 50 && c.eval_every == 0 && c.eval_batch_size == 0 && c.recompute == 0 &&
       strcmp(c.cuda_graphs, "auto") == 0;
  test_check(ok, "defaults: [train] (official recipe)");
  ok = strcmp(c.dataset, "imagefolder") == 0 && c.path[0] == 0 && c.workers == 0 &&
       c.prefetch == 0 && c.num_mean == 3 && floats_equal(c.mean, imagenet_mean, 4) &&
       floats_equal(c.std, imagenet_std, 4) && c.scale_min == 0.08f && c.scale_max == 1.0f &&
       c.ratio_min == 0.75f && c.ratio_max == 1.3333333f && c.hflip == 0.5f &&
       c.crop_pct == 0.875f && c.train_limit == 0 && c.val_limit == 0 && !c.skip_bad &&
       strcmp(c.decoder, "auto") == 0;
  test_check(ok, "defaults: [data]");
  test_check(c.ckpt_every == 0 && c.ckpt_keep == 3, "defaults: [ckpt]");
  test_check(c.bucket_mb == 25.0f && strcmp(c.reduce_dtype, "fp32") == 0 && c.timeout_s == 300.0f,
             "defaults: [dist]");
  Error err;
  check_ok("defaults validate (maps 56,28,14,7)", config_validate(&c, &err), &err);
}

static void test_swin_tiny_file(void) {
  const char *path = write_config("swin_tiny.ini",
                                  "# Swin-T, official ImageNet-1k recipe\n"
                                  "run_dir = runs/swin_tiny\n"
                                  "[model]\n"
                                  "img_size = 224\npatch_size = 4\nwindow_size = 7\n"
                                  "embed_dim = 96\ndepths = 2,2,6,2\nnum_heads = 3,6,12,24\n"
                                  "drop_path_rate = 0.2\n"
                                  "[train]\n"
                                  "batch_size = 1024\nepochs = 300\nlr = 5e-4\n"
                                  "lr_scale_batch = 512\nwarmup_epochs = 20\n"
                                  "[data]\ndataset = imagefolder\npath = /data/imagenet\n");
  Config c;
  Error err;
  config_defaults(&c);
  check_ok("swin_tiny.ini loads", config_load_file(&c, path, &err), &err);
  check_ok("swin_tiny.ini validates", config_validate(&c, &err), &err);
  test_check(c.batch_size == 1024 && strcmp(c.path, "/data/imagenet") == 0 && c.num_stages == 4,
             "swin_tiny.ini values");

  // The last stage's map (2) is smaller than the window (4): the window shrinks to the map.
  config_defaults(&c);
  int rc = config_apply_override(&c, "model.img_size=32", &err) ||
           config_apply_override(&c, "model.patch_size=2", &err) ||
           config_apply_override(&c, "model.window_size=4", &err);
  check_ok("maps 16,8,4,2 with window 4 validate", rc ? rc : config_validate(&c, &err), &err);
}

static const char *full_file =
    "# a full config: every section and every kind of comment\n"
    "; a semicolon comment\r\n"
    "run_dir = /tmp/runs/full   # a trailing comment\n"
    "resume=auto\n"
    "init_from = \"weights #1; best.safetensors\"  # quoted: '#' and ';' are text\n"
    "seed = 18446744073709551615\n"
    "device = cpu\n"
    "threads = 2\r\n"
    "precision = fp32\n"
    "\n"
    "[model]\n"
    "img_size = 32,48\n"
    "in_chans = 1\n"
    "patch_size = 2\n"
    "   embed_dim   =   48   \n"
    "depths = 2, 6\n"
    "num_heads = 3,6\n"
    "window_size = 4\n"
    "mlp_ratio = 2.5\n"
    "qkv_bias = no\n"
    "drop_path_rate = 0.1\n"
    "num_classes = 10\n"
    "[ train ]  ; spaces inside the brackets\n"
    "batch_size = 64\naccum_steps = 2\nepochs = 12\nmax_steps = 5000000000\nlr = 1e-3\n"
    "lr_scale_batch = 0\n"
    "min_lr = 1e-6\nwarmup_lr = 1e-7\nwarmup_epochs = 0.5\nweight_decay = 0.01\n"
    "beta1 = 0.8\nbeta2 = 0.99\neps = 1e-6\nclip_grad = 0\nlabel_smoothing = 0\n"
    "log_every = 10\neval_every = 100\neval_batch_size = 256\ncuda_graphs = off\n"
    "[data]\n"
    "dataset = fashion_mnist\npath = data/fashion mnist\nworkers = 2\nprefetch = 3\n"
    "mean = 0.2860\nstd = 0.3530\nscale = 0.5, 1\nratio = 0.8,1.25\nhflip = 0\n"
    "crop_pct = 1\ntrain_limit = 1000\nval_limit = 200\n"
    "[ckpt]\nevery = 500\nkeep = 5";  // no final newline

static void test_full_file(void) {
  const char *path = write_config("full.ini", full_file);
  Config c;
  Error err;
  poison_config(&c);
  config_defaults(&c);
  check_ok("full.ini loads", config_load_file(&c, path, &err), &err);
  bool ok = strcmp(c.run_dir, "/tmp/runs/full") == 0 && strcmp(c.resume, "auto") == 0 &&
            strcmp(c.init_from, "weights #1; best.safetensors") == 0 && c.seed == UINT64_MAX &&
            c.threads == 2;
  test_check(ok, "full.ini: top level (comments, quotes, CRLF)");
  ok = c.img_h == 32 && c.img_w == 48 && c.in_chans == 1 && c.patch_size == 2 &&
       c.embed_dim == 48 && c.num_stages == 2 && c.depths[0] == 2 && c.depths[1] == 6 &&
       c.depths[2] == 0 && c.num_heads[0] == 3 && c.num_heads[1] == 6 && c.num_heads[2] == 0 &&
       c.window_size == 4 && c.mlp_ratio == 2.5f && !c.qkv_bias && c.drop_path_rate == 0.1f &&
       c.num_classes == 10;
  test_check(ok, "full.ini: [model] (img_size H,W, lists, bool)");
  ok = c.batch_size == 64 && c.accum_steps == 2 && c.epochs == 12 && c.max_steps == 5000000000LL &&
       c.lr == 1e-3f && c.lr_scale_batch == 0 && c.min_lr == 1e-6f && c.warmup_lr == 1e-7f &&
       c.warmup_epochs == 0.5f && c.weight_decay == 0.01f && c.beta1 == 0.8f && c.beta2 == 0.99f &&
       c.eps == 1e-6f && c.clip_grad == 0 && c.label_smoothing == 0 && c.log_every == 10 &&
       c.eval_every == 100 && c.eval_batch_size == 256 && strcmp(c.cuda_graphs, "off") == 0;
  test_check(ok, "full.ini: [train] (section header with spaces)");
  const float mean[4] = {0.286f, 0.286f, 0.286f, 0.286f}, std[4] = {0.353f, 0.353f, 0.353f, 0.353f};
  ok = strcmp(c.dataset, "fashion_mnist") == 0 && strcmp(c.path, "data/fashion mnist") == 0 &&
       c.workers == 2 && c.prefetch == 3 && c.num_mean == 1 && floats_equal(c.mean, mean, 4) &&
       floats_equal(c.std, std, 4) && c.scale_min == 0.5f && c.scale_max == 1.0f &&
       c.ratio_min == 0.8f && c.ratio_max == 1.25f && c.hflip == 0 && c.crop_pct == 1.0f &&
       c.train_limit == 1000 && c.val_limit == 200;
  test_check(ok, "full.ini: [data] (one mean/std value fills every channel)");
  test_check(c.ckpt_every == 500 && c.ckpt_keep == 5, "full.ini: [ckpt] (last line, no newline)");
  check_ok("full.ini validates", config_validate(&c, &err), &err);

  // Overrides win over the file and leave every other key alone.
  Config o = c;
  int rc = config_apply_override(&o, "train.lr=2e-3", &err) ||
           config_apply_override(&o, "resume=", &err) ||
           config_apply_override(&o, " data.workers = 8 ", &err) ||
           config_apply_override(&o, "model.depths=1,1", &err);
  check_ok("overrides apply", rc, &err);
  test_check(o.lr == 2e-3f && o.resume[0] == 0 && o.workers == 8 && o.depths[0] == 1 &&
                 o.depths[1] == 1 && o.num_stages == 2,
             "overrides win over the file");
  o.lr = c.lr;
  memcpy(o.resume, c.resume, sizeof o.resume);
  o.workers = c.workers;
  memcpy(o.depths, c.depths, sizeof o.depths);
  const char *diff = config_diff(&o, &c);
  test_check(!diff, "overrides change nothing else (first difference: %s)", diff ? diff : "none");
}

typedef struct {
  const char *name;
  const char *text;
  const char *needles[5];
} BadFile;

static void test_file_errors(void) {
  const BadFile cases[] = {
      {"unknown_key.ini",
       "[model]\nembd_dim = 64\n",
       {"unknown_key.ini:2: unknown key 'model.embd_dim'",
        "HINT: did you mean 'model.embed_dim'?"}},
      {"lr_in_model.ini",
       "seed = 1\n[model]\nlr = 1e-3\n",
       {"lr_in_model.ini:3: unknown key 'model.lr'", "did you mean 'train.lr'?"}},
      {"far_key.ini",
       "[model]\nzzzzqqqq = 1\n",
       {"far_key.ini:2: unknown key 'model.zzzzqqqq'",
        "HINT: the keys of [model] are:", "embed_dim", "window_size"}},
      {"top_key.ini", "embed_dim = 64\n", {"top_key.ini:1:", "did you mean 'model.embed_dim'?"}},
      {"unknown_section.ini",
       "[modle]\nembed_dim = 96\n",
       {"unknown_section.ini:2: unknown key 'modle.embed_dim'",
        "did you mean 'model.embed_dim'? (there is no section [modle])"}},
      {"far_section.ini",
       "[foo]\nzzzzqqqq = 1\n",
       {"unknown key 'foo.zzzzqqqq'", "there is no section [foo]", "[model] [train]"}},
      {"bad_int.ini",
       "[model]\nembed_dim = 12x\n",
       {"bad_int.ini:2: bad value '12x' for key 'model.embed_dim'",
        "HINT: expected an integer at least 1"}},
      {"int_overflow.ini",
       "[train]\nepochs = 99999999999\n",
       {"int_overflow.ini:2: bad value '99999999999' for key 'train.epochs'", "32-bit"}},
      {"int_fraction.ini", "[data]\nworkers = 1.5\n", {"bad value '1.5' for key 'data.workers'"}},
      {"negative_seed.ini", "seed = -1\n", {"bad value '-1' for key 'seed'", "from 0 to"}},
      {"bad_float.ini",
       "[train]\nlr = abc\n",
       {"bad_float.ini:2: bad value 'abc' for key 'train.lr'",
        "HINT: expected a number greater than 0"}},
      {"zero_lr.ini", "[train]\nlr = 0\n", {"bad value '0' for key 'train.lr'", "greater than 0"}},
      {"beta2_one.ini",
       "[train]\nbeta2 = 1.0\n",
       {"key 'train.beta2'", "expected a number at least 0 and less than 1"}},
      {"in_chans.ini", "[model]\nin_chans = 5\n", {"model.in_chans", "from 1 to 4"}},
      {"bad_enum.ini",
       "[data]\ndataset = cifar10\n",
       {"bad_enum.ini:2: bad value 'cifar10' for key 'data.dataset'",
        "HINT: expected one of: fashion_mnist, imagefolder"}},
      {"bad_bool.ini",
       "[model]\nqkv_bias = maybe\n",
       {"bad value 'maybe' for key 'model.qkv_bias'", "expected one of: true, false, 1, 0"}},
      {"missing_eq.ini",
       "seed = 1\n[train]\nbatch_size 64\n",
       {"missing_eq.ini:3: expected 'key = value'", "batch_size 64", "HINT:"}},
      {"duplicate.ini",
       "[train]\nlr = 1e-3\n# again\nlr = 2e-3\n",
       {"duplicate.ini:4: key 'train.lr' is set twice", "lines 2 and 4"}},
      {"duplicate_canonical.ini",
       "train.lr = 1e-3\n[train]\nlr = 2e-3\n",
       {"duplicate_canonical.ini:3:", "lines 1 and 3"}},
      {"bad_list.ini",
       "[model]\ndepths = 2,,6,2\n",
       {"bad value '2,,6,2' for key 'model.depths'",
        "expected a comma-separated list of 1 to 8 integers, each at least 1"}},
      {"zero_in_list.ini",
       "[model]\nnum_heads = 3,0,12,24\n",
       {"key 'model.num_heads'", "each at least 1"}},
      {"long_list.ini",
       "[model]\ndepths = 1,1,1,1,1,1,1,1,1\n",
       {"key 'model.depths': 9 values, at most 8 fit"}},
      {"long_mean.ini",
       "[data]\nmean = 0.1,0.2,0.3,0.4,0.5\n",
       {"key 'data.mean': 5 values, at most 4 fit"}},
      {"zero_std.ini", "[data]\nstd = 0.2,0\n", {"key 'data.std'", "each greater than 0"}},
      {"precision.ini",
       "precision = fp8\n",
       {"precision.ini:1: bad value 'fp8' for key 'precision'",
        "expected one of: fp32, bf16, fp16"}},
      {"device.ini",
       "device = tpu\n",
       {"bad value 'tpu' for key 'device'", "expected one of: auto, cpu, cuda"}},
      {"scale_order.ini",
       "[data]\nscale = 0.9,0.5\n",
       {"key 'data.scale': min 0.9 is greater than max 0.5"}},
      {"scale_zero.ini", "[data]\nscale = 0,1\n", {"greater than 0 and at most 1"}},
      {"img_zero.ini", "[model]\nimg_size = 32,0\n", {"bad value '32,0' for key 'model.img_size'"}},
      {"img_three.ini", "[model]\nimg_size = 32,48,64\n", {"key 'model.img_size'", "H,W"}},
      {"open_quote.ini", "run_dir = \"runs/x\n", {"open_quote.ini:1:", "no closing '\"'"}},
      {"open_section.ini", "[model\nembed_dim = 96\n", {"open_section.ini:1:", "no closing ']'"}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *path = write_config(cases[i].name, cases[i].text);
    Config c;
    Error err = {{0}};
    config_defaults(&c);
    c.seed = 12345;  // a non-default value that a failed load must keep
    Config before = c;
    int rc = config_load_file(&c, path, &err);
    const char *needles[6] = {0};
    memcpy(needles, cases[i].needles, sizeof cases[i].needles);
    check_error(cases[i].name, rc, &err, needles);
    const char *diff = config_diff(&c, &before);
    if (diff) test_check(false, "%s: a failed load changed %s", cases[i].name, diff);
  }
  Config c;
  Error err;
  config_defaults(&c);
  char missing[600];
  snprintf(missing, sizeof missing, "%s/no_such.ini", tmp_dir);
  CHECK_ERROR("missing file", config_load_file(&c, missing, &err), &err, "no_such.ini", "HINT:");
}

static void test_override_errors(void) {
  Config c;
  Error err;
  config_defaults(&c);
  Config before = c;
  CHECK_ERROR("override without '='", config_apply_override(&c, "train.lr", &err), &err,
              "command line: expected key=value, got 'train.lr'", "HINT:", "key=value");
  CHECK_ERROR("override bad float", config_apply_override(&c, "train.lr=abc", &err), &err,
              "command line: bad value 'abc' for key 'train.lr'",
              "HINT: expected a number greater than 0");
  CHECK_ERROR("override unknown key", config_apply_override(&c, "model.embd_dim=3", &err), &err,
              "command line: unknown key 'model.embd_dim'", "did you mean 'model.embed_dim'?");
  CHECK_ERROR("override bare lr", config_apply_override(&c, "lr=1e-3", &err), &err,
              "command line: unknown key 'lr'", "did you mean 'train.lr'?");
  CHECK_ERROR("override device=tpu", config_apply_override(&c, "device=tpu", &err), &err,
              "command line: bad value 'tpu' for key 'device'", "auto, cpu, cuda");
  CHECK_ERROR("override train.cuda_graphs=yes",
              config_apply_override(&c, "train.cuda_graphs=yes", &err), &err,
              "command line: bad value 'yes' for key 'train.cuda_graphs'", "auto, on, off");
  CHECK_ERROR("override without a key", config_apply_override(&c, "=5", &err), &err,
              "command line:", "no key");
  // Found by fuzz_config: written back in quotes, this value would read back as '('.
  CHECK_ERROR("override with a quote before a comment character",
              config_apply_override(&c, "run_dir=(\"  # S", &err), &err,
              "command line: bad value '(\"  # S' for key 'run_dir'",
              "a '\"' followed by '#' or ';' cannot be written back");
  const char *diff = config_diff(&c, &before);
  test_check(!diff, "failed overrides change nothing (first difference: %s)", diff ? diff : "none");
}

// Applies overrides to the defaults and validates; returns validate's result (or -1 with a
// FAIL line if an override itself fails).
static int validate_with(Error *err, const char *const *overrides) {
  Config c;
  config_defaults(&c);
  for (int i = 0; overrides[i]; i++)
    if (config_apply_override(&c, overrides[i], err) != 0) {
      test_check(false, "override '%s' should parse: %s", overrides[i], err->msg);
      return 0;
    }
  if (config_validate(&c, err) != 0) return -1;
  return data_config_validate(&c, err);
}
#define VALIDATE_WITH(err, ...) validate_with((err), (const char *const[]){__VA_ARGS__, NULL})

static void test_validate_errors(void) {
  Error err;
  CHECK_ERROR("heads do not divide the width", VALIDATE_WITH(&err, "model.num_heads=3,6,5,24"),
              &err,
              "stage 2 has width 384 = embed_dim 96 * 2^2, which num_heads[2]=5 does not divide",
              "HINT:", "model.num_heads=3,6,12,24");
  CHECK_ERROR("depths/num_heads lengths", VALIDATE_WITH(&err, "model.num_heads=3,6,12"), &err,
              "model.depths has 4 values (2,2,6,2) but model.num_heads has 3 (3,6,12)", "HINT:");
  CHECK_ERROR("image not tiling into patches", VALIDATE_WITH(&err, "model.img_size=225"), &err,
              "model.img_size 225x225 does not tile into patches",
              "225 is not a multiple of model.patch_size 4", "e.g. 224 or 228");
  CHECK_ERROR("image width not tiling", VALIDATE_WITH(&err, "model.img_size=224,230"), &err,
              "the width 230");
  CHECK_ERROR("V2 with recompute", VALIDATE_WITH(&err, "model.version=2", "train.recompute=all"),
              &err, "train.recompute = all", "model.version = 2",
              "HINT: set train.recompute = none");
  CHECK_ERROR("pretrained windows per stage",
              VALIDATE_WITH(&err, "model.pretrained_window_sizes=8,8"), &err,
              "model.pretrained_window_sizes has 2 values but the model has 4 stages",
              "HINT: give 1 value (every stage) or 4");
  CHECK_ERROR("V2 window side of 1",
              VALIDATE_WITH(&err, "model.version=2", "model.img_size=32", "model.window_size=8"),
              &err, "model.version = 2: stage 3 has 1x1 windows", "0 for a side of 1", "HINT:");
  check_ok("V2 window side of 1 with pretrained windows 2 validates",
           VALIDATE_WITH(&err, "model.version=2", "model.img_size=32", "model.window_size=8",
                         "model.pretrained_window_sizes=2"),
           &err);
  CHECK_ERROR("stage map not tiling into windows",
              VALIDATE_WITH(&err, "model.img_size=112", "model.window_size=4"), &err,
              "stage 1 map 14x14 does not tile into 4x4 windows",
              "HINT: choose img_size, patch_size and window_size so that every stage's map is a "
              "multiple of the window",
              "model.img_size=128 (maps 32,16,8,4)");
  CHECK_ERROR("odd map before merging", VALIDATE_WITH(&err, "model.img_size=56"), &err,
              "stage 1 map 7x7 has an odd side, so patch merging cannot halve it for stage 2",
              "HINT:");
  CHECK_ERROR("mean count vs in_chans", VALIDATE_WITH(&err, "model.in_chans=1"), &err,
              "data.mean has 3 values but model.in_chans is 1", "HINT: give 1 value");
  CHECK_ERROR("std count vs in_chans", VALIDATE_WITH(&err, "data.std=0.2,0.3"), &err,
              "data.std has 2 values but model.in_chans is 3");
  CHECK_ERROR("fractional MLP width", VALIDATE_WITH(&err, "model.mlp_ratio=2.7"), &err,
              "model.mlp_ratio 2.7", "not a whole number");
  CHECK_ERROR("min_lr above the peak lr", VALIDATE_WITH(&err, "train.min_lr=1e-3"), &err,
              "train.min_lr 0.001 is above the peak train.lr 0.0005", "HINT:");
  // The training recipe's augmentation keys.
  CHECK_ERROR("RandAugment spec with an unknown section",
              VALIDATE_WITH(&err, "data.randaugment=rand-m9-foo1"), &err,
              "data.randaugment 'rand-m9-foo1': unknown section 'foo1'",
              "HINT:", "rand-m9-mstd0.5-inc1");
  CHECK_ERROR("RandAugment spec of another policy",
              VALIDATE_WITH(&err, "data.randaugment=augmix-m5"), &err,
              "does not start with 'rand'");
  CHECK_ERROR("RandAugment on 2 channels",
              VALIDATE_WITH(&err, "data.randaugment=rand-m9", "model.in_chans=2", "data.mean=0.5",
                            "data.std=0.5"),
              &err, "model.in_chans is 2");
  CHECK_ERROR("mixup with an odd batch",
              VALIDATE_WITH(&err, "train.mixup=0.8", "train.batch_size=5"), &err,
              "train.batch_size must be even (it is 5)", "HINT: set train.batch_size=6");
  // Gradient accumulation: the batch splits into train.accum_steps equal micro-batches.
  CHECK_ERROR("a batch that does not split into the micro-batches",
              VALIDATE_WITH(&err, "train.batch_size=100", "train.accum_steps=8"), &err,
              "train.batch_size = 100 does not divide into train.accum_steps = 8 micro-batches",
              "HINT: set train.batch_size to a multiple of 8 (96 or 104), or train.accum_steps "
              "to a divisor of 100");
  CHECK_ERROR("more micro-batches than images",
              VALIDATE_WITH(&err, "train.batch_size=4", "train.accum_steps=8"), &err,
              "does not divide into train.accum_steps = 8", "multiple of 8 (8)");
  CHECK_ERROR("mixup with odd micro-batches",
              VALIDATE_WITH(&err, "train.cutmix=1.0", "train.batch_size=12", "train.accum_steps=4"),
              &err, "reverse of its micro-batch",
              "train.batch_size / train.accum_steps must be even (12 / 4 = 3)",
              "HINT: set train.batch_size=24 or train.accum_steps=2");
  check_ok("a batch of 1024 in 8 micro-batches, with mixup",
           VALIDATE_WITH(&err, "train.batch_size=1024", "train.accum_steps=8", "train.mixup=0.8"),
           &err);
  check_ok("the official recipe's augmentations",
           VALIDATE_WITH(&err, "data.randaugment=rand-m9-mstd0.5-inc1", "data.reprob=0.25",
                         "train.mixup=0.8", "train.cutmix=1.0", "data.interpolation=bicubic"),
           &err);
  check_ok("one mean/std value for 1 channel",
           VALIDATE_WITH(&err, "model.in_chans=1", "data.mean=0.5", "data.std=0.25"), &err);
  check_ok("batch 4 with lr scaling (all rates scale alike)",
           VALIDATE_WITH(&err, "train.batch_size=4"), &err);
  CHECK_ERROR("CUDA graphs insisted on with device=cpu",
              VALIDATE_WITH(&err, "device=cpu", "train.cuda_graphs=on"), &err,
              "train.cuda_graphs=on needs the CUDA backend, but device=cpu",
              "HINT: set train.cuda_graphs=auto");
  check_ok("CUDA graphs auto with device=cpu (off there)",
           VALIDATE_WITH(&err, "device=cpu", "train.cuda_graphs=auto"), &err);
  check_ok("CUDA graphs on with device=auto (decided by the trainer once the device is known)",
           VALIDATE_WITH(&err, "train.cuda_graphs=on"), &err);
  CHECK_ERROR("bf16 all-reduce on the CPU",
              VALIDATE_WITH(&err, "device=cpu", "dist.reduce_dtype=bf16"), &err,
              "dist.reduce_dtype = bf16 needs the GPU all-reduce (NCCL), but device = cpu",
              "HINT: set dist.reduce_dtype=fp32");
  check_ok("data.decoder=stb", VALIDATE_WITH(&err, "data.decoder=stb"), &err);
  if (jpeg_gpu_built()) {
    check_ok("data.decoder=nvjpeg (the build has nvJPEG)",
             VALIDATE_WITH(&err, "data.decoder=nvjpeg"), &err);
  } else {
    CHECK_ERROR("data.decoder=nvjpeg without nvJPEG in the build",
                VALIDATE_WITH(&err, "data.decoder=nvjpeg"), &err,
                "data.decoder = nvjpeg, but this build has no nvJPEG",
                "HINT: set data.decoder=auto or stb");
  }
  CHECK_ERROR("data.decoder=nvjpeg with 2 channels",
              VALIDATE_WITH(&err, "data.decoder=nvjpeg", "model.in_chans=2", "data.mean=0.5",
                            "data.std=0.5"),
              &err, jpeg_gpu_built() ? "decodes to gray or RGB" : "this build has no nvJPEG",
              "HINT: set data.decoder");
  Config d;
  config_defaults(&d);
  CHECK_ERROR("data.decoder is auto, stb or nvjpeg",
              config_apply_override(&d, "data.decoder=libjpeg", &err), &err,
              "bad value 'libjpeg' for key 'data.decoder'", "auto, stb, nvjpeg");
  CHECK_ERROR("reduce_dtype fp16 is not a choice",
              config_apply_override(&d, "dist.reduce_dtype=fp16", &err), &err,
              "bad value 'fp16' for key 'dist.reduce_dtype'", "fp32, bf16");
  CHECK_ERROR("bucket_mb must be positive", config_apply_override(&d, "dist.bucket_mb=0", &err),
              &err, "bad value '0' for key 'dist.bucket_mb'", "greater than 0");
  check_ok("quarter-MiB buckets", VALIDATE_WITH(&err, "dist.bucket_mb=0.25"), &err);

  // Configs filled in code are range-checked by the same rules as files.
  Config c;
  config_defaults(&c);
  c.num_stages = 9;
  CHECK_ERROR("more stages than CONFIG_MAX_STAGES", config_validate(&c, &err), &err,
              "model.depths has 9 stages", "CONFIG_MAX_STAGES = 8");
  config_defaults(&c);
  c.batch_size = 0;
  CHECK_ERROR("batch_size 0 set in code", config_validate(&c, &err), &err,
              "train.batch_size = 0 is not a valid value", "HINT: expected an integer at least 1");
  c.batch_size = 128;
  c.accum_steps = 0;
  CHECK_ERROR("accum_steps 0 set in code", config_validate(&c, &err), &err,
              "train.accum_steps = 0 is not a valid value", "HINT: expected an integer at least 1");
  c.accum_steps = 1;
  config_defaults(&c);
  c.eval_batch_size = -1;
  CHECK_ERROR("eval_batch_size -1 set in code", config_validate(&c, &err), &err,
              "train.eval_batch_size = -1");
  config_defaults(&c);
  snprintf(c.device, sizeof c.device, "tpu");
  CHECK_ERROR("device tpu set in code", config_validate(&c, &err), &err,
              "device = tpu is not a valid value");
  config_defaults(&c);
  snprintf(c.device, sizeof c.device, "cpu");
  snprintf(c.precision, sizeof c.precision, "bf16");
  CHECK_ERROR("bf16 on the cpu", config_validate(&c, &err), &err,
              "precision=bf16 needs the CUDA backend", "HINT: set precision=fp32");
}

// Errors about several keys name where the values came from: the file, the command line, both.
static void test_where(void) {
  const char *path =
      write_config("where.ini", "[model]\nnum_heads = 3,6,12\n[data]\nskip_bad = yes\n");
  Config c;
  config_defaults(&c);
  Error err;
  check_ok("load where.ini", config_load_file(&c, path, &err), &err);
  test_check(c.skip_bad, "data.skip_bad = yes reads as true");
  CHECK_ERROR("several keys: names the file", config_validate(&c, &err), &err, path,
              "model.depths has 4 values");
  test_check(strncmp(err.msg, path, strlen(path)) == 0 && !strstr(err.msg, "command line"),
             "... at the start of the message, without the command line");
  check_ok("override", config_apply_override(&c, "model.img_size=225", &err), &err);
  CHECK_ERROR("several keys: file and command line", config_validate(&c, &err), &err, path,
              "and the command line: ");
  config_defaults(&c);
  check_ok("override only", config_apply_override(&c, "model.num_heads=1", &err), &err);
  CHECK_ERROR("several keys: the command line", config_validate(&c, &err), &err,
              "the command line: model.depths has 4 values");
  config_defaults(&c);
  c.num_heads[3] = 0;
  CHECK_ERROR("several keys set in code", config_validate(&c, &err), &err, "model.depths");
  test_check(strncmp(err.msg, "model.depths", 12) == 0, "... names no source: %.60s", err.msg);
}

// Random values for every float key (within its range), odd strings, a non-square image:
// config_to_ini then config_load_string must give back the identical Config.
static void test_round_trip(void) {
  TestRng rng = {.state = 0x5EED0C0Full};
  Config c;
  Error err;
  config_defaults(&c);
  snprintf(c.run_dir, sizeof c.run_dir, " runs/#1; \"quoted\" ");  // quotes, comments, spaces
  snprintf(c.init_from, sizeof c.init_from, "\"");
  snprintf(c.path, sizeof c.path, "/données/imagenet");
  snprintf(c.dataset, sizeof c.dataset, "fashion_mnist");
  c.seed = test_rng_u64(&rng);
  c.img_h = 32;
  c.img_w = 48;
  c.in_chans = 4;
  c.num_stages = 3;
  c.depths[3] = c.num_heads[3] = 0;
  c.qkv_bias = false;
  c.max_steps = (int64_t)(test_rng_u64(&rng) >> 2);
  c.recompute = 3;
  float *positive[] = {&c.mlp_ratio,    &c.lr,  &c.min_lr,    &c.warmup_lr, &c.warmup_epochs,
                       &c.weight_decay, &c.eps, &c.clip_grad, &c.ratio_min};
  for (size_t i = 0; i < sizeof positive / sizeof positive[0]; i++)
    *positive[i] = test_rng_uniform(&rng, 1e-6f, 3.0f);
  float *unit[] = {&c.drop_path_rate, &c.beta1,    &c.beta2,    &c.label_smoothing,
                   &c.hflip,          &c.crop_pct, &c.scale_min};
  for (size_t i = 0; i < sizeof unit / sizeof unit[0]; i++)
    *unit[i] = test_rng_uniform(&rng, 0.01f, 0.99f);
  c.scale_max = c.scale_min + 0.001f;
  c.ratio_max = c.ratio_min * 1.5f;
  c.num_mean = 4;
  test_fill_uniform(&rng, c.mean, 4, -1.0f, 1.0f);
  test_fill_uniform(&rng, c.std, 4, 0.01f, 1.0f);

  char *ini = config_to_ini(&c);
  Config back;
  config_defaults(&back);
  check_ok("to_ini output loads", config_load_string(&back, ini, "to_ini", &err), &err);
  const char *diff = config_diff(&back, &c);
  test_check(!diff, "to_ini -> load_string gives back every field (first difference: %s)",
             diff ? diff : "none");
  char *again = config_to_ini(&back);
  test_check(strcmp(ini, again) == 0, "to_ini of the reloaded config is the same text");
  test_check(strstr(ini, "[model]\n") && strstr(ini, "embed_dim = 96\n") &&
                 strstr(ini, "img_size = 32,48\n"),
             "to_ini writes [section] headers and bare key names");
  free(again);
  free(ini);
}

// train.recompute: a word (none = 0, all = -1) or a block count; written back as the word that
// stands for the value; anything else is an error that lists both forms.
static void test_recompute_key(void) {
  Config c;
  Error err;
  config_defaults(&c);
  struct {
    const char *text;
    int want;
    const char *back;
  } cases[] = {{"all", -1, "all"}, {"none", 0, "none"}, {"0", 0, "none"}, {"2", 2, "2"}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char arg[64];
    snprintf(arg, sizeof arg, "train.recompute=%s", cases[i].text);
    int rc = config_apply_override(&c, arg, &err);
    char *ini = config_to_ini(&c), line[64];
    snprintf(line, sizeof line, "\nrecompute = %s\n", cases[i].back);
    test_check(rc == 0 && c.recompute == cases[i].want && strstr(ini, line),
               "%s: recompute %d (want %d), written back as '%s'", arg, c.recompute, cases[i].want,
               cases[i].back);
    free(ini);
  }
  const char *expect = "HINT: expected one of: none, all, or an integer at least 0";
  CHECK_ERROR("train.recompute=some", config_apply_override(&c, "train.recompute=some", &err), &err,
              "command line: bad value 'some' for key 'train.recompute'", expect);
  CHECK_ERROR("train.recompute=-1", config_apply_override(&c, "train.recompute=-1", &err), &err,
              "bad value '-1' for key 'train.recompute'", expect);
  CHECK_ERROR("train.recompute=1.5", config_apply_override(&c, "train.recompute=1.5", &err), &err,
              "bad value '1.5' for key 'train.recompute'", expect);
  config_defaults(&c);
  c.recompute = -2;
  CHECK_ERROR("recompute -2 set in code", config_validate(&c, &err), &err,
              "train.recompute = -2 is not a valid value", expect);
}

static void test_same_model(void) {
  Config a, b;
  Error err;
  config_defaults(&a);
  config_defaults(&b);
  b.lr = 1e-3f;             // not a model key
  b.drop_path_rate = 0.3f;  // a model key that decides no shape
  check_ok("same_model: equal model keys", config_same_model(&a, &b, &err), &err);
  b.embed_dim = 64;
  b.depths[2] = 18;
  CHECK_ERROR("same_model: two differences", config_same_model(&a, &b, &err), &err,
              "model.embed_dim: 96 vs 64", "model.depths: 2,2,6,2 vs 2,2,18,2");
  test_check(!strstr(err.msg, "train.lr") && !strstr(err.msg, "drop_path_rate"),
             "same_model: lists only the differing shape keys");
}

// Reads everything a printing function writes.
static char *capture(void (*print)(const Config *, FILE *), const Config *cfg) {
  char *text = NULL;
  size_t size = 0;
  FILE *f = open_memstream(&text, &size);
  print(cfg, f);
  fclose(f);
  return text;
}
static void print_reference_adapter(const Config *cfg, FILE *out) {
  (void)cfg;
  config_print_reference(out);
}

static void test_print(void) {
  Config c;
  config_defaults(&c);
  c.seed = 42;
  char *table = capture(config_print, &c);
  test_check(strstr(table, "* seed") && strstr(table, "42   (default 0)") &&
                 strstr(table, "  run_dir") && !strstr(table, "* run_dir") &&
                 strstr(table, "[model]\n") && strstr(table, "model.embed_dim"),
             "config_print marks changed keys and groups by section");
  char *ref = capture(print_reference_adapter, &c);
  test_check(strncmp(ref, "| key | default | meaning |\n|---|---|---|\n", 40) == 0,
             "config_print_reference starts with a Markdown table header");
  // Every key config_to_ini writes has a row in the reference.
  char *ini = config_to_ini(&c);
  char section[64] = "";
  int rows = 0, missing = 0;
  for (char *line = strtok(ini, "\n"); line; line = strtok(NULL, "\n")) {
    if (line[0] == '#') continue;
    if (line[0] == '[') {
      snprintf(section, sizeof section, "%.*s", (int)(strcspn(line + 1, "]")), line + 1);
      continue;
    }
    char row[160];
    int key_len = (int)strcspn(line, " =");
    if (section[0])
      snprintf(row, sizeof row, "| `%s.%.*s` |", section, key_len, line);
    else
      snprintf(row, sizeof row, "| `%.*s` |", key_len, line);
    rows++;
    if (!strstr(ref, row)) {
      missing++;
      printf("     no reference row %s\n", row);
    }
  }
  // At least the 49 keys of the first config (7 top-level, 11 model, 17 train, 12 data, 2 ckpt);
  // every key the INI output holds must have its row.
  test_check(rows >= 49 && missing == 0, "reference documents all %d keys (%d missing)", rows,
             missing);
  test_check(strstr(ref, "fashion_mnist, imagefolder") && strstr(ref, "`5e-4`"),
             "reference shows choices and defaults");
  free(ini);
  free(ref);
  free(table);
}

int main(void) {
  snprintf(tmp_dir, sizeof tmp_dir, "/tmp/test_config_XXXXXX");
  if (!mkdtemp(tmp_dir)) {
    printf("FAIL mkdtemp\n");
    return 1;
  }
  test_defaults();
  test_swin_tiny_file();
  test_full_file();
  test_file_errors();
  test_override_errors();
  test_validate_errors();
  test_round_trip();
  test_recompute_key();
  test_where();
  test_same_model();
  test_print();
  for (int i = 0; i < num_written; i++) unlink(written[i]);
  rmdir(tmp_dir);
  return test_finish();
}
