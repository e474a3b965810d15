// jpeg_gpu.c: batched JPEG decoding with nvJPEG (data/jpeg_gpu.h), with the nvJPEG C API, the
// CUDA runtime API and the batched resize of kernels/resize.h. Built everywhere: without nvJPEG
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

int jpeg_gpu_parse(JpegGpu *dec, const uint8_t *const *files, const size_t *sizes, int count,
                   JpegGpuImage *out, Error *err) {
  (void)dec;
  (void)files;
  (void)sizes;
  (void)err;
  for (int j = 0; j < count; j++) out[j] = (JpegGpuImage){0};
  return 0;
}

int jpeg_gpu_decode_parsed(JpegGpu *dec, const TransformPlan *plans, JpegGpuImage *out,
                           Error *err) {
  (void)dec;
  (void)plans;
  (void)out;
  (void)err;
  return 0;
}

int jpeg_gpu_decode(JpegGpu *dec, const uint8_t *const *files, const size_t *sizes, int count,
                    JpegGpuImage *out, Error *err) {
  return jpeg_gpu_parse(dec, files, sizes, count, out, err);
}

int jpeg_gpu_decode_into(JpegGpu *dec, const TransformPlan *plans, const ImageAugStep *steps,
                         int nsteps, ImageAugFill fill, uint8_t *batch, int64_t sample_bytes,
                         JpegGpuImage *out, Error *err) {
  (void)dec, (void)plans, (void)steps, (void)nsteps, (void)fill, (void)batch, (void)sample_bytes;
  (void)out;
  return error_set(err, "data.decoder = nvjpeg, but this build has no nvJPEG\n%s", HINT_BUILD);
}

int jpeg_gpu_upload(JpegGpu *dec, uint8_t *device_dst, const uint8_t *host_src, size_t bytes,
                    Error *err) {
  (void)dec, (void)device_dst, (void)host_src, (void)bytes;
  return error_set(err, "data.decoder = nvjpeg, but this build has no nvJPEG\n%s", HINT_BUILD);
}

int jpeg_gpu_download(JpegGpu *dec, uint8_t *host_dst, const uint8_t *device_src, size_t bytes,
                      Error *err) {
  (void)dec, (void)host_dst, (void)device_src, (void)bytes;
  return error_set(err, "data.decoder = nvjpeg, but this build has no nvJPEG\n%s", HINT_BUILD);
}

int jpeg_gpu_finish(JpegGpu *dec, JpegGpuTimes *times, Error *err) {
  (void)dec, (void)err;
  if (times) *times = (JpegGpuTimes){0};
  return 0;
}

uint8_t *jpeg_gpu_device_alloc(size_t bytes) {
  (void)bytes;
  return NULL;
}

void jpeg_gpu_device_free(uint8_t *ptr) {
  (void)ptr;
}

void jpeg_gpu_destroy(JpegGpu *dec) {
  (void)dec;
}

#else

#include <cuda_runtime_api.h>
#include <nvjpeg.h>

#include "kernels/resize.h"

// A grow-only buffer on the device or in page-locked host memory.
typedef struct {
  uint8_t *ptr;
  size_t capacity;  // bytes
} Buffer;

struct JpegGpu {
  int device;  // the CUDA device of the creating thread; every call sets it on its own thread
  int chans, max_batch;
  bool hardware;  // NVJPEG_BACKEND_HARDWARE (the JPEG engines), else NVJPEG_BACKEND_DEFAULT
  nvjpegHandle_t handle;
  nvjpegJpegState_t state;
  nvjpegJpegStream_t header;  // the parsed header of the file being checked
  cudaStream_t stream;
  int initialized_count;  // images nvjpegDecodeBatchedInitialize was last given; 0 = to do
  Buffer device_pixels;   // the batch's decoded images, (h, w, chans) each, packed
  Buffer host_pixels;     // page-locked: what comes back (decoded images, or the plans' outputs)
  Buffer host_packed;     // page-locked: the plans as kernels/resize.h reads them
  Buffer device_packed;   // their copy on the device
  Buffer device_tmp;      // the resize's intermediate rows
  Buffer device_out;      // the plans' outputs, (out_h, out_w, chans) each, packed
  Buffer host_steps;      // page-locked: the colour steps of jpeg_gpu_decode_into's batch
  Buffer device_steps;    // their copy on the device
  Buffer device_scratch;  // the colour kernels' second image buffer (kernels/image_aug.h)
  cudaEvent_t marks[5];   // jpeg_gpu_decode_into's stages: before, decoded, resized, coloured,
                          // and (jpeg_gpu_finish) copied
  bool timed;             // marks[0..3] were recorded for the batch in flight
  int64_t *dst;           // (max_batch) bytes into the batch of each taken file's output
  // The last jpeg_gpu_parse: count files, n of them taken, bytes once decoded; then per taken
  // file, in batch order, (max_batch) each:
  int count, n;
  size_t bytes;
  const unsigned char **data;
  size_t *lengths;
  nvjpegImage_t *dest;
  int *which;           // index in the caller's batch
  size_t *offset;       // bytes into device_pixels
  TransformPlan *plan;  // the taken files' plans
  int64_t *plan_src;    // offset, as transform_plans_pack takes it
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
  // The highest priority: the decoder's few short kernels run as soon as an SM frees, between
  // the training step's blocks, instead of queueing behind a whole step (the trainer waits for
  // the batch; the step loses a few microseconds).
  int least = 0, greatest = 0;
  CUDA_TRY(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  CUDA_TRY(cudaStreamCreateWithPriority(&d->stream, cudaStreamNonBlocking, greatest));
  for (int i = 0; i < 5; i++) CUDA_TRY(cudaEventCreate(&d->marks[i]));
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
  d->plan = calloc_check((size_t)max_batch, sizeof *d->plan);
  d->plan_src = calloc_check((size_t)max_batch, sizeof *d->plan_src);
  d->dst = calloc_check((size_t)max_batch, sizeof *d->dst);
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

// Grow-only buffers, with a quarter of headroom so a batch of slightly larger images does not
// reallocate again; the stream is idle here (every decode ends synchronized).
static int grow_device(Buffer *b, size_t bytes, Error *err) {
  if (bytes <= b->capacity) return 0;
  size_t capacity = bytes + bytes / 4;
  CUDA_TRY(cudaFree(b->ptr));
  *b = (Buffer){0};
  CUDA_TRY(cudaMalloc((void **)&b->ptr, capacity));
  b->capacity = capacity;
  return 0;
}

static int grow_host(Buffer *b, size_t bytes, Error *err) {
  if (bytes <= b->capacity) return 0;
  size_t capacity = bytes + bytes / 4;
  CUDA_TRY(cudaFreeHost(b->ptr));
  *b = (Buffer){0};
  CUDA_TRY(cudaHostAlloc((void **)&b->ptr, capacity, cudaHostAllocDefault));
  b->capacity = capacity;
  return 0;
}

// Statuses that say the files, not the GPU, were the trouble: the batch goes to stb instead.
static bool is_file_status(nvjpegStatus_t st) {
  return st == NVJPEG_STATUS_BAD_JPEG || st == NVJPEG_STATUS_JPEG_NOT_SUPPORTED ||
         st == NVJPEG_STATUS_INCOMPLETE_BITSTREAM || st == NVJPEG_STATUS_EXECUTION_FAILED;
}

int jpeg_gpu_parse(JpegGpu *d, const uint8_t *const *files, const size_t *sizes, int count,
                   JpegGpuImage *out, Error *err) {
  d->count = d->n = 0;
  d->bytes = 0;
  if (count > d->max_batch)
    return error_set(err, "nvJPEG decoder: a batch of %d files, but it was made for %d", count,
                     d->max_batch);
  CUDA_TRY(cudaSetDevice(d->device));
  size_t bytes = 0;
  for (int j = 0; j < count; j++) {
    out[j] = (JpegGpuImage){0};
    int h = 0, w = 0;
    if (!files[j] || !takes(d, files[j], sizes[j], &h, &w)) continue;
    out[j].h = h;
    out[j].w = w;
    d->which[d->n] = j;
    d->offset[d->n] = bytes;
    d->data[d->n] = files[j];
    d->lengths[d->n] = sizes[j];
    bytes += (size_t)h * (size_t)w * (size_t)d->chans;
    d->n++;
  }
  d->count = count;
  d->bytes = bytes;
  return 0;
}

// A plan the resize can run on file j's decoded image (transform_plan_check). The loader's
// plans always are; the check keeps a wrong one from reading or writing outside the device
// buffers.
static int check_plan(const TransformPlan *t, int j, const JpegGpuImage *im, Error *err) {
  char why[256];
  if (transform_plan_check(t, im->h, im->w, why, sizeof why) == 0) return 0;
  return error_set(err,
                   "nvJPEG decoder: the plan of file %d does not fit its image: %s\n"
                   "HINT: this is a bug in the caller's plan; data.decoder=stb avoids this path",
                   j, why);
}

// The taken files' plans, packed for kernels/resize.h into host_packed, and the device buffers
// of the resize grown to fit (before anything is queued: growing waits for the device).
static int pack_plans(JpegGpu *d, const TransformPlan *plans, const int64_t *dst,
                      const JpegGpuImage *out, ResizeBatch *batch, Error *err) {
  for (int k = 0; k < d->n; k++) {
    int j = d->which[k];
    if (check_plan(&plans[j], j, &out[j], err) != 0) return -1;
    d->plan[k] = plans[j];
    d->plan_src[k] = (int64_t)d->offset[k];
  }
  int64_t bytes = transform_plans_packed_bytes(d->plan, d->n);
  if (grow_host(&d->host_packed, (size_t)bytes, err) != 0 ||
      grow_device(&d->device_packed, (size_t)bytes, err) != 0)
    return -1;
  transform_plans_pack(d->plan, d->n, d->chans, d->plan_src, dst, d->host_packed.ptr, batch);
  if (grow_device(&d->device_tmp, (size_t)batch->tmp_bytes, err) != 0) return -1;
  if (!dst && grow_device(&d->device_out, (size_t)batch->dst_bytes, err) != 0) return -1;
  return 0;
}

// Queues the decode of the taken files and, with plans, their resize into dst (device memory;
// at dst_offsets[k] for taken file k, or packed in d->device_out when dst is NULL). *decoded is
// false when nvJPEG refused the batch's files: then nothing is queued, out[] is zeroed and the
// state reset, and the caller leaves the batch to stb.
static int queue_decode(JpegGpu *d, const TransformPlan *plans, uint8_t *dst,
                        const int64_t *dst_offsets, JpegGpuImage *out, ResizeBatch *batch,
                        bool *decoded, Error *err) {
  int n = d->n;
  *decoded = false;
  CUDA_TRY(cudaSetDevice(d->device));
  *batch = (ResizeBatch){0};
  if (grow_device(&d->device_pixels, d->bytes, err) != 0) return -1;
  if (plans && pack_plans(d, plans, dst ? dst_offsets : NULL, out, batch, err) != 0) return -1;
  for (int k = 0; k < n; k++) {
    int j = d->which[k];
    d->dest[k] = (nvjpegImage_t){0};
    d->dest[k].channel[0] = d->device_pixels.ptr + d->offset[k];
    d->dest[k].pitch[0] = (size_t)out[j].w * (size_t)d->chans;  // interleaved (RGBI) or Y
  }
  // The plans go up before the decode, in one copy; the stream orders it before the resize.
  if (plans)
    CUDA_TRY(cudaMemcpyAsync(d->device_packed.ptr, d->host_packed.ptr, (size_t)batch->packed_bytes,
                             cudaMemcpyHostToDevice, d->stream));
  nvjpegOutputFormat_t format = d->chans == 3 ? NVJPEG_OUTPUT_RGBI : NVJPEG_OUTPUT_Y;
  if (d->initialized_count != n) {
    NVJPEG_TRY(nvjpegDecodeBatchedInitialize(d->handle, d->state, n, 1, format));
    d->initialized_count = n;
  }
  CUDA_TRY(cudaEventRecord(d->marks[0], d->stream));
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
    for (int j = 0; j < d->count; j++) out[j] = (JpegGpuImage){0};
    return 0;
  }
  CUDA_TRY(cudaEventRecord(d->marks[1], d->stream));
  if (plans)
    CUDA_TRY(resize_batch_cuda(d->device_pixels.ptr, d->device_packed.ptr, batch, d->device_tmp.ptr,
                               dst ? dst : d->device_out.ptr, d->stream));
  CUDA_TRY(cudaEventRecord(d->marks[2], d->stream));
  *decoded = true;
  return 0;
}

int jpeg_gpu_decode_parsed(JpegGpu *d, const TransformPlan *plans, JpegGpuImage *out, Error *err) {
  int n = d->n;
  if (n == 0) return 0;
  ResizeBatch batch;
  bool decoded;
  if (queue_decode(d, plans, NULL, NULL, out, &batch, &decoded, err) != 0) return -1;
  if (!decoded) return 0;
  size_t back = plans ? (size_t)batch.dst_bytes : d->bytes;  // what comes back to the host
  if (grow_host(&d->host_pixels, back, err) != 0) return -1;
  const uint8_t *from = plans ? d->device_out.ptr : d->device_pixels.ptr;
  CUDA_TRY(cudaMemcpyAsync(d->host_pixels.ptr, from, back, cudaMemcpyDeviceToHost, d->stream));
  CUDA_TRY(cudaStreamSynchronize(d->stream));
  const ResizeDesc *desc = (const ResizeDesc *)d->host_packed.ptr;
  for (int k = 0; k < n; k++)
    out[d->which[k]].pixels = d->host_pixels.ptr + (plans ? (size_t)desc[k].dst : d->offset[k]);
  return 0;
}

int jpeg_gpu_decode_into(JpegGpu *d, const TransformPlan *plans, const ImageAugStep *steps,
                         int nsteps, ImageAugFill fill, uint8_t *batch, int64_t sample_bytes,
                         JpegGpuImage *out, Error *err) {
  d->timed = false;
  if (d->n == 0) return 0;
  for (int k = 0; k < d->n; k++) d->dst[k] = (int64_t)d->which[k] * sample_bytes;
  // The colour steps of the whole batch: positions nvJPEG did not take have IMAGE_AUG_NONE.
  // Their buffers grow before anything is queued (growing waits for the device).
  size_t step_bytes = sizeof(ImageAugStep) * (size_t)d->count * (size_t)nsteps;
  if (nsteps > 0 &&
      (grow_host(&d->host_steps, step_bytes, err) != 0 ||
       grow_device(&d->device_steps, step_bytes, err) != 0 ||
       grow_device(&d->device_scratch, (size_t)d->count * (size_t)sample_bytes, err) != 0))
    return -1;
  for (int k = 0; k < d->n; k++) {
    const TransformPlan *t = &plans[d->which[k]];
    if ((int64_t)t->out_h * t->out_w * d->chans != sample_bytes)
      return error_set(err,
                       "nvJPEG decoder: the plan of file %d gives %dx%dx%d bytes, not the "
                       "batch's %lld per image\nHINT: this is a bug in the caller's plans",
                       d->which[k], t->out_h, t->out_w, d->chans, (long long)sample_bytes);
  }
  ResizeBatch rb;
  bool decoded;
  if (queue_decode(d, plans, batch, d->dst, out, &rb, &decoded, err) != 0) return -1;
  if (!decoded) return 0;
  if (nsteps > 0) {
    memcpy(d->host_steps.ptr, steps, step_bytes);
    CUDA_TRY(cudaMemcpyAsync(d->device_steps.ptr, d->host_steps.ptr, step_bytes,
                             cudaMemcpyHostToDevice, d->stream));
    const TransformPlan *t = &plans[d->which[0]];
    CUDA_TRY(image_aug_batch_cuda(batch, d->device_scratch.ptr,
                                  (const ImageAugStep *)d->device_steps.ptr, d->count, nsteps,
                                  t->out_h, t->out_w, d->chans, fill, d->stream));
  }
  CUDA_TRY(cudaEventRecord(d->marks[3], d->stream));
  d->timed = true;
  for (int k = 0; k < d->n; k++)
    out[d->which[k]].pixels = batch + (size_t)d->which[k] * (size_t)sample_bytes;
  return 0;
}

int jpeg_gpu_upload(JpegGpu *d, uint8_t *device_dst, const uint8_t *host_src, size_t bytes,
                    Error *err) {
  CUDA_TRY(cudaSetDevice(d->device));
  CUDA_TRY(cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, d->stream));
  return 0;
}

int jpeg_gpu_download(JpegGpu *d, uint8_t *host_dst, const uint8_t *device_src, size_t bytes,
                      Error *err) {
  CUDA_TRY(cudaSetDevice(d->device));
  CUDA_TRY(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, d->stream));
  return 0;
}

static double seconds_between(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  return cudaEventElapsedTime(&ms, a, b) == cudaSuccess ? ms * 1e-3 : 0;
}

int jpeg_gpu_finish(JpegGpu *d, JpegGpuTimes *times, Error *err) {
  CUDA_TRY(cudaSetDevice(d->device));
  CUDA_TRY(cudaEventRecord(d->marks[4], d->stream));
  CUDA_TRY(cudaStreamSynchronize(d->stream));
  if (times) {
    *times = (JpegGpuTimes){0};
    if (d->timed)
      *times = (JpegGpuTimes){.decode = seconds_between(d->marks[0], d->marks[1]),
                              .geometric = seconds_between(d->marks[1], d->marks[2]),
                              .colour = seconds_between(d->marks[2], d->marks[3]),
                              .upload = seconds_between(d->marks[3], d->marks[4])};
  }
  d->timed = false;
  return 0;
}

uint8_t *jpeg_gpu_device_alloc(size_t bytes) {
  void *p = NULL;
  return cudaMalloc(&p, bytes) == cudaSuccess ? p : NULL;
}

void jpeg_gpu_device_free(uint8_t *ptr) {
  if (ptr) cudaFree(ptr);
}

int jpeg_gpu_decode(JpegGpu *d, const uint8_t *const *files, const size_t *sizes, int count,
                    JpegGpuImage *out, Error *err) {
  if (jpeg_gpu_parse(d, files, sizes, count, out, err) != 0) return -1;
  return jpeg_gpu_decode_parsed(d, NULL, out, err);
}

void jpeg_gpu_destroy(JpegGpu *d) {
  if (!d) return;
  // Teardown: failures are ignored, nothing could be done about them here.
  if (d->stream) cudaStreamSynchronize(d->stream);
  cudaFree(d->device_pixels.ptr);
  cudaFree(d->device_packed.ptr);
  cudaFree(d->device_tmp.ptr);
  cudaFree(d->device_out.ptr);
  cudaFreeHost(d->host_pixels.ptr);
  cudaFreeHost(d->host_packed.ptr);
  cudaFreeHost(d->host_steps.ptr);
  cudaFree(d->device_steps.ptr);
  cudaFree(d->device_scratch.ptr);
  for (int i = 0; i < 5; i++)
    if (d->marks[i]) cudaEventDestroy(d->marks[i]);
  if (d->header) nvjpegJpegStreamDestroy(d->header);
  if (d->state) nvjpegJpegStateDestroy(d->state);
  if (d->handle) nvjpegDestroy(d->handle);
  if (d->stream) cudaStreamDestroy(d->stream);
  free(d->data);
  free(d->lengths);
  free(d->dest);
  free(d->which);
  free(d->offset);
  free(d->plan);
  free(d->plan_src);
  free(d->dst);
  free(d);
}

#endif
