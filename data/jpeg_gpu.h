// jpeg_gpu.h: decoding a batch of JPEG files on the GPU with nvJPEG (data.decoder = nvjpeg).
//
// stb_image decodes 430-560 ImageNet-sized JPEGs per second per core, ~62% of a loader
// worker's time per image (data/PERF.md), so the CPU cannot feed the GPU trainer; the GPU's
// JPEG engines can. Each loader worker owns one JpegGpu: an nvJPEG handle on the hardware
// backend (the JPEG engines) where the GPU has it, else the default GPU backend, its own CUDA
// stream, and device + page-locked host buffers that grow to the largest batch met.
//
// A batch takes two calls. jpeg_gpu_parse reads the headers: which files nvJPEG takes, and
// their sizes. The caller then draws each taken file's TransformPlan (data/transform.h: the
// RandomResizedCrop box, interpolation and flip, or eval's resize + center crop) from that
// size, and the colour steps (RandAugment or ColorJitter, kernels/image_aug.h). The loader's
// call, jpeg_gpu_decode_into, decodes the batch in one nvjpegDecodeBatched, runs the plans
// on the device right after it (kernels/resize.h: Pillow's resize with image_resize's integer
// weights, so the bytes are transform_apply's on the same decoded pixels) into a device batch,
// then the colour steps over the whole batch; only the draws stay on the CPU, and nothing
// waits until jpeg_gpu_finish. jpeg_gpu_decode_parsed instead copies the plans' outputs (or,
// without plans, the whole decoded images: the reference the tests run the CPU transform on)
// back to the host and waits.
//
// Beside a training step replayed as a CUDA graph on the same GPU, nvjpegDecodeBatched's host
// call took 4-5x longer (data/PERF.md, version 6), so the trainer runs its step without graphs
// while this decoder feeds it (train.cuda_graphs = auto). The cause (data/PERF.md, measured
// 2026-12-08): the hardware decoder frees device memory inside the call, ~3.5 times a batch,
// and each cuMemFree waits for the device to be idle, beside a graph for the rest of it.
//
// Only what both decoders read the same way goes to nvJPEG: files that pass image_check
// (data/image.h), are baseline or extended-sequential Huffman JPEGs of 8-bit samples with 1 or
// 3 components, and (hardware backend) that nvjpegDecodeBatchedSupported takes. Everything else
// (PNGs, progressive or CMYK JPEGs, damaged files) is left to stb by the caller, so its
// messages and data.skip_bad stay as they are; so is a whole batch nvJPEG fails to decode.
// nvJPEG's IDCT and colour conversion round differently from stb's, so pixels differ by a few
// levels (tests/test_gpu_jpeg.c bounds it): results depend on the decoder, never on threads.
//
// GPU memory: nvJPEG allocates its own scratch (cudaMalloc, cudaHostAlloc: its default
// allocators) per handle; the buffers here (decoded images, the packed plans, the resize's
// intermediate rows and outputs, and their host copies) are grow-only, so after the first
// batches a worker allocates nothing (growing frees and allocates, which waits for the device:
// should the trainer ever capture CUDA graphs, it must capture in
// cudaStreamCaptureModeThreadLocal). Without nvJPEG in the build (SWIN_HAVE_NVJPEG unset) every
// function below exists: jpeg_gpu_built is false and jpeg_gpu_create fails saying so.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data/transform.h"
#include "kernels/image_aug.h"
#include "src/base/util.h"

typedef struct JpegGpu JpegGpu;

// One file's result. h, w: its size, when nvJPEG takes it (jpeg_gpu_parse), else 0. pixels:
// after the decode, uint8 in the decoder's host buffer, valid until its next batch: (h, w,
// chans) decoded, or (out_h, out_w, chans) of the file's plan; NULL when the file was left to
// the CPU decoder.
typedef struct {
  const uint8_t *pixels;
  int h, w;
} JpegGpuImage;

// Whether this build has nvJPEG (CMake found it next to the CUDA toolkit, or NVJPEG_ROOT).
bool jpeg_gpu_built(void);

// A decoder for batches of up to max_batch files, to chans (1 = gray, NVJPEG_OUTPUT_Y; 3 = RGB,
// NVJPEG_OUTPUT_RGBI) channels, on the calling thread's current CUDA device (later calls from
// any thread use that device). Errors say what failed and hint at the fix.
int jpeg_gpu_create(JpegGpu **dec, int max_batch, int chans, Error *err);
// "hardware" (the JPEG engines) or "gpu" (nvJPEG's default backend, CUDA cores).
const char *jpeg_gpu_backend(const JpegGpu *dec);
// Parses the headers of files[0..count) (sizes bytes each; a NULL file is skipped): out[j].h,
// .w get the size of each file nvJPEG takes, 0 for the others; every pixels is NULL. The files
// must stay as they are until jpeg_gpu_decode_parsed returns.
int jpeg_gpu_parse(JpegGpu *dec, const uint8_t *const *files, const size_t *sizes, int count,
                   JpegGpuImage *out, Error *err);
// Decodes the files the last jpeg_gpu_parse took, into the same out. plans: NULL for the whole
// decoded images; else plans[j] (read for the taken files only, each made for (out[j].h,
// out[j].w)) is run on file j's decoded pixels on the GPU. A batch nvJPEG fails to decode (a
// file that passed the header checks but not the decode) leaves every pixels NULL: those files
// go to stb like the rest (out[j] zeroed, as for a file not taken). Returns -1 with err only when
// the GPU itself fails (a CUDA error, out of memory), naming the call and this source line, or when
// a plan does not fit its image.
int jpeg_gpu_decode_parsed(JpegGpu *dec, const TransformPlan *plans, JpegGpuImage *out, Error *err);
// The loader's path, which keeps the pixels on the device: decodes the files the last
// jpeg_gpu_parse took, runs plans[j] (as above) into image j of `batch` (device memory from
// jpeg_gpu_device_alloc: count images of sample_bytes each, (out_h, out_w, chans)), then the
// colour steps on the whole batch: steps (count * nsteps, host memory; step s of image j at
// [j * nsteps + s], kernels/image_aug.h), nsteps 0 for none. Each taken file's out[j].pixels
// points at its image in `batch` (device memory); the rest are NULL, as above, and their
// images are the caller's to upload (jpeg_gpu_upload), with IMAGE_AUG_NONE steps. Queued on
// the decoder's stream: jpeg_gpu_finish waits for it. A batch nvJPEG fails to decode leaves
// every pixels NULL, as above.
int jpeg_gpu_decode_into(JpegGpu *dec, const TransformPlan *plans, const ImageAugStep *steps,
                         int nsteps, ImageAugFill fill, uint8_t *batch, int64_t sample_bytes,
                         JpegGpuImage *out, Error *err);
// Queued on the decoder's stream: host (page-locked) to device, and device to host.
int jpeg_gpu_upload(JpegGpu *dec, uint8_t *device_dst, const uint8_t *host_src, size_t bytes,
                    Error *err);
int jpeg_gpu_download(JpegGpu *dec, uint8_t *host_dst, const uint8_t *device_src, size_t bytes,
                      Error *err);
// The device time of the last jpeg_gpu_decode_into's stages, in seconds (the copies queued
// after it count as upload), for the loader's profile (data/loader.h).
typedef struct {
  double decode, geometric, colour, upload;
} JpegGpuTimes;
// Waits for what the decoder's stream holds; *times (may be NULL) gets its stages.
int jpeg_gpu_finish(JpegGpu *dec, JpegGpuTimes *times, Error *err);
// Device memory on the calling thread's current device for jpeg_gpu_decode_into's batches;
// NULL when there is none to be had (or no nvJPEG in the build).
uint8_t *jpeg_gpu_device_alloc(size_t bytes);
void jpeg_gpu_device_free(uint8_t *ptr);

// jpeg_gpu_parse, then jpeg_gpu_decode_parsed without plans: whole decoded images.
int jpeg_gpu_decode(JpegGpu *dec, const uint8_t *const *files, const size_t *sizes, int count,
                    JpegGpuImage *out, Error *err);
void jpeg_gpu_destroy(JpegGpu *dec);
