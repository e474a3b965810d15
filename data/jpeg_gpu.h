// jpeg_gpu.h: decoding a batch of JPEG files on the GPU with nvJPEG (data.decoder = nvjpeg).
//
// stb_image decodes 430-560 ImageNet-sized JPEGs per second per core, ~62% of a loader
// worker's time per image (data/PERF.md), so the CPU cannot feed the GPU trainer; the GPU's
// JPEG engines can. Each loader worker owns one JpegGpu: an nvJPEG handle on the hardware
// backend (the JPEG engines) where the GPU has it, else the default GPU backend, its own CUDA
// stream, and device + page-locked host buffers that grow to the largest batch met. One call
// decodes the files of a batch in one nvjpegDecodeBatched, copies the pixels back and waits;
// the loader then runs the same per-sample transform as on stb's output.
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
// allocators) per handle; the output buffers here are grow-only, so after the first batches a
// worker allocates nothing (growing frees and allocates, which waits for the device: should
// the trainer ever capture CUDA graphs, it must capture in cudaStreamCaptureModeThreadLocal).
// Without nvJPEG in the build (SWIN_HAVE_NVJPEG unset) every
// function below exists: jpeg_gpu_built is false and jpeg_gpu_create fails saying so.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "src/util.h"

typedef struct JpegGpu JpegGpu;

// One file's result: pixels (h, w, chans) uint8 in the decoder's host buffer, valid until its
// next decode; NULL when the file was left to the CPU decoder.
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
// Decodes files[0..count) (sizes bytes each; a NULL file is skipped) into out[0..count). Files
// nvJPEG does not take get out[j].pixels = NULL. Returns -1 with err only when the GPU itself
// fails (a CUDA error, out of memory), naming the call and this source line.
int jpeg_gpu_decode(JpegGpu *dec, const uint8_t *const *files, const size_t *sizes, int count,
                    JpegGpuImage *out, Error *err);
void jpeg_gpu_destroy(JpegGpu *dec);
