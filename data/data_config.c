// data_config.c: the checks of the data keys that need the data code (data/loader.h).
#include <string.h>

#include "data/jpeg_gpu.h"
#include "data/loader.h"
#include "data/randaugment.h"

static int validate(const Config *c, Error *err) {
  if (strcmp(c->decoder, "nvjpeg") == 0 && !jpeg_gpu_built())
    return error_set(err,
                     "data.decoder = nvjpeg, but this build has no nvJPEG (CMake did not find "
                     "nvjpeg.h and libnvjpeg next to the CUDA toolkit)\n"
                     "HINT: set data.decoder=auto or stb, or rebuild with the CUDA toolkit's "
                     "nvJPEG (cmake -DSWIN_CUDA=ON, -DNVJPEG_ROOT=DIR for another copy)");
  if (strcmp(c->decoder, "nvjpeg") == 0 && c->in_chans != 1 && c->in_chans != 3)
    return error_set(err,
                     "data.decoder = nvjpeg decodes to gray or RGB, but model.in_chans is %d\n"
                     "HINT: set data.decoder=stb (or auto) or model.in_chans=1 or 3",
                     c->in_chans);
  RandAugmentPolicy randaugment;
  if (randaugment_parse(&randaugment, c->randaugment, err) != 0) return -1;
  if ((randaugment.enabled || c->color_jitter > 0) && c->in_chans != 1 && c->in_chans != 3)
    return error_set(err,
                     "data.randaugment / data.color_jitter work on gray or RGB images, but "
                     "model.in_chans is %d\nHINT: set model.in_chans=3 or turn them off",
                     c->in_chans);
  return 0;
}

int data_config_validate(const Config *cfg, Error *err) {
  if (validate(cfg, err) != 0) return config_error_where(cfg, err);
  return 0;
}
