// backend.c: choosing and creating a backend (src/model/backend.h) from the device and precision
// keys.
#include "src/model/backend.h"

#include <stdio.h>
#include <string.h>

#include "src/model/backend_check.h"

bool backend_cuda_usable(void) {
#ifdef SWIN_HAVE_CUDA
  return backend_cuda_device_usable(NULL, 0, NULL);
#else
  return false;
#endif
}

static int precision_dtype(const char *precision, DType *dt, Error *err) {
  if (strcmp(precision, "fp32") == 0)
    *dt = DTYPE_F32;
  else if (strcmp(precision, "bf16") == 0)
    *dt = DTYPE_BF16;
  else if (strcmp(precision, "fp16") == 0)
    *dt = DTYPE_F16;
  else
    return error_set(err, "unknown precision '%s'\nHINT: use fp32, bf16 or fp16", precision);
  return 0;
}

// The chosen backend with its own table (backend_create puts the checking layer in front).
static int backend_init(Backend *be, const char *device, const char *precision, Error *err) {
  DType act = DTYPE_F32;
  if (precision_dtype(precision, &act, err) != 0) return -1;
  bool want_cuda = strcmp(device, "cuda") == 0;
  if (strcmp(device, "auto") == 0)
    want_cuda = backend_cuda_usable();
  else if (!want_cuda && strcmp(device, "cpu") != 0)
    return error_set(err, "unknown device '%s'\nHINT: use auto, cpu or cuda", device);
  if (!want_cuda) {
    if (backend_cpu_init(be, act, err) != 0)
      return strcmp(device, "auto") == 0
                 ? error_prefix(err, "device=auto found no usable CUDA GPU, and ")
                 : -1;
    return 0;
  }
#ifdef SWIN_HAVE_CUDA
  if (!backend_cuda_usable())
    return error_set(err,
                     "device=cuda, but no CUDA GPU is usable (no device, or the driver is "
                     "missing)\nHINT: check nvidia-smi, or set device=cpu (or auto)");
  return backend_cuda_init(be, act, err);
#else
  return error_set(err,
                   "device=cuda, but this build has no CUDA backend\n"
                   "HINT: rebuild with nvcc on PATH (cmake -DSWIN_CUDA=ON), or set device=cpu");
#endif
}

int backend_create(Backend *be, const char *device, const char *precision, Error *err) {
  memset(be, 0, sizeof *be);
  if (backend_init(be, device, precision, err) != 0) return -1;
  backend_check_install(be);
  return 0;
}

void backend_destroy(Backend *be) {
  if (!be->ops) return;
  backend_check_remove(be);
#ifdef SWIN_HAVE_CUDA
  if (be->device == DEVICE_CUDA) backend_cuda_destroy(be);
#endif
  if (be->device == DEVICE_CPU) backend_cpu_destroy(be);
  memset(be, 0, sizeof *be);
}

void backend_describe(const Backend *be, char *buf, size_t size) {
  const char *prec = be->act == DTYPE_F32 ? "fp32" : be->act == DTYPE_BF16 ? "bf16" : "fp16";
#ifdef SWIN_HAVE_CUDA
  if (be->device == DEVICE_CUDA) {
    char name[128];
    double gib = 0;
    backend_cuda_device_usable(name, sizeof name, &gib);
    snprintf(buf, size, "cuda (%s, %.1f GiB), %s", name, gib, prec);
    return;
  }
#endif
  snprintf(buf, size, "cpu, %s", prec);
}

const char *op_family_name(OpFamily f) {
  static const char *names[OP_FAMILIES] = {
      "GEMMs", "attention", "LayerNorm", "elementwise", "loss", "optimizer", "memory"};
  return f >= 0 && f < OP_FAMILIES ? names[f] : "?";
}
