// jpeg_gpu.c: batched JPEG decoding with nvJPEG (data/jpeg_gpu.h), with the nvJPEG C API and
// the CUDA runtime API only (no kernels of its own). Built everywhere: without nvJPEG
// (SWIN_HAVE_NVJPEG unset) jpeg_gpu_built is false and jpeg_gpu_create fails, naming the fix.
#include "data/jpeg_gpu.h"

#include <stdlib.h>
#include <string.h>

#include "data/image.h"

#ifndef SWIN_HAVE_NVJPEG

static const char *HINT_BUILD =
    "HINT: set data.decoder=stb (or auto), or rebuild where the CUDA toolkit ships nvJPEG "
    "(nvjpeg.h, libnvjpeg; cmake -DSWIN_CUDA=ON, or -DNVJPEG_ROOT=DIR for another copy)";

bool jpeg_gpu_built(void) {
  return false;
}

int jpeg_gpu_create(JpegGpu **dec, int max_batch, int chans, Error *err) {
  (void)max_batch;
  (void)chans;
  *dec = NULL;
  return error_set(err, "data.decoder = nvjpeg, but this build has no nvJPEG\n%s", HINT_BUILD);
}

const char *jpeg_gpu_backend(const JpegGpu *dec) {
  (void)dec;
  return "none";
}

int jpeg_gpu_decode(JpegGpu *dec, const uint8_t *const *files, const size_t *sizes, int count,
                    JpegGpuImage *out, Error *err) {
  (void)dec;
  (void)files;
  (void)sizes;
  (void)err;
  for (int j = 0; j < count; j++) out[j] = (JpegGpuImage){0};
  return 0;
}

void jpeg_gpu_destroy(JpegGpu *dec) {
  (void)dec;
}

#else

#include <cuda_runtime_api.h>
#include <nvjpeg.h>

struct JpegGpu {
  int device;  // the CUDA device of the creating thread; every call sets it on its own thread
  int chans, max_batch;
  bool hardware;  // NVJPEG_BACKEND_HARDWARE (the JPEG engines), else NVJPEG_BACKEND_DEFAULT
  nvjpegHandle_t handle;
  nvjpegJpegState_t state;
  nvjpegJpegStream_t header;  // the parsed header of the file being checked
  cudaStream_t stream;
  int initialized_count;   // images nvjpegDecodeBatchedInitialize was last given; 0 = to do
  uint8_t *device_pixels;  // (capacity bytes) the batch's images, (h, w, chans) each, packed
  uint8_t *host_pixels;    // (capacity bytes) page-locked copy of device_pixels
  size_t capacity;
  // Per batch, (max_batch) each: the files nvJPEG takes, in batch order.
  const unsigned char **data;
  size_t *lengths;
  nvjpegImage_t *dest;
  int *which;      // index in the caller's batch
  size_t *offset;  // bytes into the pixel buffers
};

static const char *status_name(nvjpegStatus_t s) {
  switch (s) {
    case NVJPEG_STATUS_SUCCESS:
      return "success";
    case NVJPEG_STATUS_NOT_INITIALIZED:
      return "not initialized";
    case NVJPEG_STATUS_INVALID_PARAMETER:
      return "invalid parameter";
    case NVJPEG_STATUS_BAD_JPEG:
      return "bad JPEG";
    case NVJPEG_STATUS_JPEG_NOT_SUPPORTED:
      return "JPEG not supported";
    case NVJPEG_STATUS_ALLOCATOR_FAILURE:
      return "allocator failure (out of memory?)";
    case NVJPEG_STATUS_EXECUTION_FAILED:
      return "execution failed";
    case NVJPEG_STATUS_ARCH_MISMATCH:
      return "architecture mismatch";
    case NVJPEG_STATUS_INTERNAL_ERROR:
      return "internal error";
    case NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED:
      return "implementation not supported";
    case NVJPEG_STATUS_INCOMPLETE_BITSTREAM:
      return "incomplete bitstream";
  }
  return "unknown status";
}

// Checked calls: the message names the call and this file's line; the caller adds the batch.
#define NVJPEG_TRY(call)                                                             \
  do {                                                                               \
    nvjpegStatus_t st_ = (call);                                                     \
    if (st_ != NVJPEG_STATUS_SUCCESS)                                                \
      return error_set(err, "nvJPEG: %s failed: %s (status %d) at %s:%d\n%s", #call, \
                       status_name(st_), (int)st_, __FILE__, __LINE__, HINT_GPU);    \
  } while (0)
#define CUDA_TRY(call)                                                                     \
  do {                                                                                     \
    cudaError_t ce_ = (call);                                                              \
    if (ce_ != cudaSuccess)                                                                \
      return error_set(err, "nvJPEG decoder: %s failed: %s (%s) at %s:%d\n%s", #call,      \
                       cudaGetErrorName(ce_), cudaGetErrorString(ce_), __FILE__, __LINE__, \
                       HINT_GPU);                                                          \
  } while (0)

static const char *HINT_GPU =
    "HINT: check the GPU (nvidia-smi) and its free memory (fewer data.workers hold fewer "
    "decoders), or set data.decoder=stb to decode on the CPU";

bool jpeg_gpu_built(void) {
  return true;
}

// The hardware backend where the GPU has JPEG engines (A100, H100/H200), else the default one;
// each first with chroma upsampling by interpolation, as stb upsamples (then without the flag,
// should a backend refuse it).
static int create_handle(JpegGpu *d, Error *err) {
  const struct {
    nvjpegBackend_t backend;
    unsigned flags;
  } tries[] = {{NVJPEG_BACKEND_HARDWARE, NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION},
               {NVJPEG_BACKEND_HARDWARE, NVJPEG_FLAGS_DEFAULT},
               {NVJPEG_BACKEND_DEFAULT, NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION},
               {NVJPEG_BACKEND_DEFAULT, NVJPEG_FLAGS_DEFAULT}};
  nvjpegStatus_t st = NVJPEG_STATUS_NOT_INITIALIZED;
  for (size_t i = 0; i < sizeof tries / sizeof tries[0]; i++) {
    // NULL allocators: nvJPEG's defaults (cudaMalloc / cudaHostAlloc), see data/jpeg_gpu.h.
    st = nvjpegCreateEx(tries[i].backend, NULL, NULL, tries[i].flags, &d->handle);
    if (st == NVJPEG_STATUS_SUCCESS) {
      d->hardware = tries[i].backend == NVJPEG_BACKEND_HARDWARE;
      return 0;
    }
    d->handle = NULL;
  }
  return error_set(err,
                   "nvJPEG: nvjpegCreateEx failed for the hardware and the default backend: %s "
                   "(status %d)\n%s",
                   status_name(st), (int)st, HINT_GPU);
}

static int setup(JpegGpu *d, Error *err) {
  int devices = 0;
  cudaError_t ce = cudaGetDeviceCount(&devices);
  if (ce != cudaSuccess || devices == 0)
    return error_set(err,
                     "data.decoder = nvjpeg needs a CUDA GPU, but none is usable (%s)\n"
                     "HINT: check nvidia-smi, or set data.decoder=stb (or auto)",
                     ce != cudaSuccess ? cudaGetErrorString(ce) : "no device");
  CUDA_TRY(cudaGetDevice(&d->device));
  if (create_handle(d, err) != 0) return -1;
  NVJPEG_TRY(nvjpegJpegStateCreate(d->handle, &d->state));
  NVJPEG_TRY(nvjpegJpegStreamCreate(d->handle, &d->header));
  CUDA_TRY(cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking));
  return 0;
}

int jpeg_gpu_create(JpegGpu **out, int max_batch, int chans, Error *err) {
  *out = NULL;
  if (chans != 1 && chans != 3)
    return error_set(err,
                     "data.decoder = nvjpeg decodes to gray or RGB, but model.in_chans is %d\n"
                     "HINT: set data.decoder=stb (or auto) for %d channels",
                     chans, chans);
  if (max_batch < 1) return error_set(err, "nvJPEG decoder: batch size %d < 1", max_batch);
  JpegGpu *d = calloc_check(1, sizeof *d);
  d->chans = chans;
  d->max_batch = max_batch;
  d->data = calloc_check((size_t)max_batch, sizeof *d->data);
  d->lengths = calloc_check((size_t)max_batch, sizeof *d->lengths);
  d->dest = calloc_check((size_t)max_batch, sizeof *d->dest);
  d->which = calloc_check((size_t)max_batch, sizeof *d->which);
  d->offset = calloc_check((size_t)max_batch, sizeof *d->offset);
  if (setup(d, err) != 0) {
    jpeg_gpu_destroy(d);
    return -1;
  }
  *out = d;
  return 0;
}

const char *jpeg_gpu_backend(const JpegGpu *d) {
  return d->hardware ? "hardware" : "gpu";
}

// Whether nvJPEG takes the file (see data/jpeg_gpu.h): stb's own checks first, so a damaged
// file meets stb and its messages; then the header as nvJPEG parses it. *h, *w: its size.
static bool takes(JpegGpu *d, const uint8_t *file, size_t size, int *h, int *w) {
  bool jpeg = false;
  char why[256];
  if (image_check(file, size, h, w, &jpeg, why, sizeof why) != 0 || !jpeg) return false;
  if (nvjpegJpegStreamParseHeader(d->handle, file, size, d->header) != NVJPEG_STATUS_SUCCESS)
    return false;
  nvjpegJpegEncoding_t encoding;
  unsigned components = 0, width = 0, height = 0, precision = 0;
  if (nvjpegJpegStreamGetJpegEncoding(d->header, &encoding) != NVJPEG_STATUS_SUCCESS ||
      nvjpegJpegStreamGetComponentsNum(d->header, &components) != NVJPEG_STATUS_SUCCESS ||
      nvjpegJpegStreamGetFrameDimensions(d->header, &width, &height) != NVJPEG_STATUS_SUCCESS ||
      nvjpegJpegStreamGetSamplePrecision(d->header, &precision) != NVJPEG_STATUS_SUCCESS)
    return false;
  // Progressive and lossless JPEGs, CMYK / YCCK (4 components) and 12-bit samples go to stb.
  if (encoding != NVJPEG_ENCODING_BASELINE_DCT &&
      encoding != NVJPEG_ENCODING_EXTENDED_SEQUENTIAL_DCT_HUFFMAN)
    return false;
  if ((components != 1 && components != 3) || precision != 8) return false;
  if (width != (unsigned)*w || height != (unsigned)*h) return false;  // the decoders disagree
  if (d->hardware) {
    int unsupported = 1;  // 0 = supported, as nvJPEG reports it
    if (nvjpegDecodeBatchedSupported(d->handle, d->header, &unsupported) != NVJPEG_STATUS_SUCCESS ||
        unsupported != 0)
      return false;
  }
  return true;
}

// Grow-only output buffers, with a quarter of headroom so a batch of slightly larger images
// does not reallocate again; the stream is idle here (every decode ends synchronized).
static int reserve(JpegGpu *d, size_t bytes, Error *err) {
  if (bytes <= d->capacity) return 0;
  size_t capacity = bytes + bytes / 4;
  CUDA_TRY(cudaFree(d->device_pixels));
  CUDA_TRY(cudaFreeHost(d->host_pixels));
  d->device_pixels = d->host_pixels = NULL;
  d->capacity = 0;
  CUDA_TRY(cudaMalloc((void **)&d->device_pixels, capacity));
  CUDA_TRY(cudaHostAlloc((void **)&d->host_pixels, capacity, cudaHostAllocDefault));
  d->capacity = capacity;
  return 0;
}

// Statuses that say the files, not the GPU, were the trouble: the batch goes to stb instead.
static bool is_file_status(nvjpegStatus_t st) {
  return st == NVJPEG_STATUS_BAD_JPEG || st == NVJPEG_STATUS_JPEG_NOT_SUPPORTED ||
         st == NVJPEG_STATUS_INCOMPLETE_BITSTREAM || st == NVJPEG_STATUS_EXECUTION_FAILED;
}

int jpeg_gpu_decode(JpegGpu *d, const uint8_t *const *files, const size_t *sizes, int count,
                    JpegGpuImage *out, Error *err) {
  if (count > d->max_batch)
    return error_set(err, "nvJPEG decoder: a batch of %d files, but it was made for %d", count,
                     d->max_batch);
  CUDA_TRY(cudaSetDevice(d->device));
  int n = 0;
  size_t bytes = 0;
  for (int j = 0; j < count; j++) {
    out[j] = (JpegGpuImage){0};
    int h = 0, w = 0;
    if (!files[j] || !takes(d, files[j], sizes[j], &h, &w)) continue;
    out[j].h = h;
    out[j].w = w;
    d->which[n] = j;
    d->offset[n] = bytes;
    d->data[n] = files[j];
    d->lengths[n] = sizes[j];
    bytes += (size_t)h * (size_t)w * (size_t)d->chans;
    n++;
  }
  if (n == 0) return 0;
  if (reserve(d, bytes, err) != 0) return -1;
  for (int k = 0; k < n; k++) {
    int j = d->which[k];
    d->dest[k] = (nvjpegImage_t){0};
    d->dest[k].channel[0] = d->device_pixels + d->offset[k];
    d->dest[k].pitch[0] = (size_t)out[j].w * (size_t)d->chans;  // interleaved (RGBI) or Y
  }
  nvjpegOutputFormat_t format = d->chans == 3 ? NVJPEG_OUTPUT_RGBI : NVJPEG_OUTPUT_Y;
  if (d->initialized_count != n) {
    NVJPEG_TRY(nvjpegDecodeBatchedInitialize(d->handle, d->state, n, 1, format));
    d->initialized_count = n;
  }
  nvjpegStatus_t st =
      nvjpegDecodeBatched(d->handle, d->state, d->data, d->lengths, d->dest, d->stream);
  if (st != NVJPEG_STATUS_SUCCESS) {
    if (!is_file_status(st))
      return error_set(err, "nvJPEG: nvjpegDecodeBatched of %d files failed: %s (status %d)\n%s", n,
                       status_name(st), (int)st, HINT_GPU);
    // A file passed the header checks but not the decode: the whole batch goes to stb, whose
    // checks and messages name the bad file, and the state is reset for the next batch.
    CUDA_TRY(cudaStreamSynchronize(d->stream));
    d->initialized_count = 0;
    for (int j = 0; j < count; j++) out[j] = (JpegGpuImage){0};
    return 0;
  }
  CUDA_TRY(
      cudaMemcpyAsync(d->host_pixels, d->device_pixels, bytes, cudaMemcpyDeviceToHost, d->stream));
  CUDA_TRY(cudaStreamSynchronize(d->stream));
  for (int k = 0; k < n; k++) out[d->which[k]].pixels = d->host_pixels + d->offset[k];
  return 0;
}

void jpeg_gpu_destroy(JpegGpu *d) {
  if (!d) return;
  // Teardown: failures are ignored, nothing could be done about them here.
  if (d->stream) cudaStreamSynchronize(d->stream);
  cudaFree(d->device_pixels);
  cudaFreeHost(d->host_pixels);
  if (d->header) nvjpegJpegStreamDestroy(d->header);
  if (d->state) nvjpegJpegStateDestroy(d->state);
  if (d->handle) nvjpegDestroy(d->handle);
  if (d->stream) cudaStreamDestroy(d->stream);
  free(d->data);
  free(d->lengths);
  free(d->dest);
  free(d->which);
  free(d->offset);
  free(d);
}

#endif
