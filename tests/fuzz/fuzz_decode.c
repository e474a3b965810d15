// fuzz_decode.c: image_decode (data/image.c: stb_image's JPEG and PNG decoders behind our
// checks) on arbitrary bytes, for every channel count, twice: the two results must be equal,
// since the loader promises the same pixels whatever thread decodes a file and whenever.
// scripts/fuzz.sh also runs this harness under MemorySanitizer, which sees a read of memory the
// decoder never wrote even when it happens to hold the same bytes twice.
#define _XOPEN_SOURCE 700  // tests/fuzz/fuzz.h: mkdtemp, nftw

#include "data/image.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  for (int chans = 1; chans <= 4; chans++) {
    int h = 0, w = 0, h2 = 0, w2 = 0;
    char why[256], why2[256];
    uint8_t *a = image_decode(data, size, chans, &h, &w, why, sizeof why);
    uint8_t *b = image_decode(data, size, chans, &h2, &w2, why2, sizeof why2);
    FUZZ_REQUIRE(!a == !b, "decoded once but not twice (%s)", a ? why2 : why);
    if (a) {
      FUZZ_REQUIRE(h == h2 && w == w2 && (int64_t)h * w <= IMAGE_MAX_PIXELS && h > 0 && w > 0,
                   "sizes %dx%d and %dx%d", w, h, w2, h2);
      FUZZ_REQUIRE(memcmp(a, b, (size_t)h * w * chans) == 0,
                   "two decodes of the same file differ (%d channels)", chans);
    } else {
      FUZZ_REQUIRE(strcmp(why, why2) == 0, "two failures differ: '%s' and '%s'", why, why2);
    }
    image_free(a);
    image_free(b);
  }
  return 0;
}
