// fuzz_idx.c: the Fashion-MNIST reader (IDX files, plain or gzip, inflated by stb's zlib) as
// dataset_open meets it, then a train and an eval sample from whatever opens.
//
// Input: a 4-byte little-endian length n, then n bytes of the image file, then the label file.
#define _XOPEN_SOURCE 700  // tests/fuzz/fuzz.h: mkdtemp, nftw
#include "data/dataset.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static bool made;
  if (!made) fuzz_mkdir("idx"), made = true;
  if (size < 4) return 0;
  size_t n = (size_t)data[0] | (size_t)data[1] << 8 | (size_t)data[2] << 16 | (size_t)data[3] << 24;
  if (n > size - 4) n = size - 4;
  fuzz_write("idx/train-images-idx3-ubyte", data + 4, n);
  fuzz_write("idx/train-labels-idx1-ubyte", data + 4 + n, size - 4 - n);

  Config cfg;
  config_defaults(&cfg);
  snprintf(cfg.dataset, sizeof cfg.dataset, "fashion_mnist");
  snprintf(cfg.path, sizeof cfg.path, "%s/idx", fuzz_scratch());
  cfg.img_h = cfg.img_w = 8;
  cfg.in_chans = 3;  // also runs the gray-to-RGB replication
  Dataset *ds;
  Error err;
  if (dataset_open(&ds, &cfg, "train", &err) != 0) return 0;
  int64_t count = dataset_size(ds);
  FUZZ_REQUIRE(count > 0, "an empty split opened");
  uint8_t pixels[8 * 8 * 3];
  int label = -1;
  for (int k = 0; k < 2; k++) {
    int64_t i = k == 0 ? 0 : count - 1;
    FUZZ_REQUIRE(dataset_load_sample(ds, i, k == 0, 7, 1, pixels, &label, &err) == 0,
                 "sample %lld of an opened IDX split fails: %s", (long long)i, err.msg);
    FUZZ_REQUIRE(label >= 0 && label < dataset_num_classes(ds), "label %d", label);
  }
  dataset_close(ds);
  return 0;
}
