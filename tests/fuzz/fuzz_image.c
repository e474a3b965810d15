// fuzz_image.c: the image decode path of an ImageFolder dataset (stb_image's JPEG and PNG
// decoders behind our size limit, then the train and eval transforms), for 1 and 3 channels.
//
// Input: the bytes of the one image file of a one-class dataset.
#define _XOPEN_SOURCE 700  // tests/fuzz/fuzz.h: mkdtemp, nftw
#include "data/dataset.h"
#include "tests/fuzz/fuzz.h"

enum { SIDE = 8 };

static Dataset *open_folder(int chans, bool skip_bad) {
  Config cfg;
  config_defaults(&cfg);
  snprintf(cfg.dataset, sizeof cfg.dataset, "imagefolder");
  snprintf(cfg.path, sizeof cfg.path, "%s/folder", fuzz_scratch());
  cfg.img_h = cfg.img_w = SIDE;
  cfg.in_chans = chans;
  cfg.skip_bad = skip_bad;
  Dataset *ds;
  Error err;
  FUZZ_REQUIRE(dataset_open(&ds, &cfg, "train", &err) == 0, "open: %s", err.msg);
  return ds;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  // The datasets hold only the file list: the file is rewritten for every input.
  static Dataset *gray, *rgb;
  if (!gray) {
    fuzz_mkdir("folder");
    fuzz_mkdir("folder/train");
    fuzz_mkdir("folder/train/a");
    fuzz_write("folder/train/a/x.png", (const uint8_t *)"", 0);
    gray = open_folder(1, false);
    rgb = open_folder(3, false);
  }
  fuzz_write("folder/train/a/x.png", data, size);
  uint8_t pixels[SIDE * SIDE * 3];
  int label;
  Error err;
  Dataset *sets[2] = {gray, rgb};
  for (int d = 0; d < 2; d++) {
    if (dataset_load_sample(sets[d], 0, true, 3, 0, pixels, &label, &err) != 0) continue;
    FUZZ_REQUIRE(label == 0, "label %d", label);
    FUZZ_REQUIRE(dataset_load_sample(sets[d], 0, false, 3, 0, pixels, &label, &err) == 0,
                 "decodes for train but not for eval: %s", err.msg);
  }
  return 0;
}
