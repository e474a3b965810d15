// cuda_util.h: what the CUDA side shares: checked CUDA runtime calls (cuBLAS has its own check
// in kernels/cuda/gemm.cu, its one user) and launch-error checks.
//
// A CUDA failure inside the trainer is not a user error to recover from (a bad launch, an
// out-of-memory on a planned allocation, a lost device): the checks print the call, file and
// line and abort. Fallible user-facing steps (is there a usable GPU?) go through
// src/model/backend.h (backend_cuda_usable, backend_cuda_device_usable), which return false
// instead; cuda_device_available below is the tests' check before they skip.
#pragma once
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef SWIN_HAVE_CUDA
#include <cuda_runtime.h>

#define CUDA_CHECK(call)                                                           \
  do {                                                                             \
    cudaError_t err_ = (call);                                                     \
    if (err_ != cudaSuccess) {                                                     \
      fprintf(stderr, "CUDA error %s (%s) at %s:%d: %s\n", cudaGetErrorName(err_), \
              cudaGetErrorString(err_), __FILE__, __LINE__, #call);                \
      cuda_capture_hint(err_);                                                     \
      abort();                                                                     \
    }                                                                              \
  } while (0)

// The errors of a call that a CUDA graph capture cannot hold (cudaErrorStreamCapture*: the
// training step is captured, src/app/step_graph.h) get a line saying how to run without graphs.
static inline void cuda_capture_hint(cudaError_t e) {
  if (e >= cudaErrorStreamCaptureUnsupported && e <= cudaErrorStreamCaptureWrongThread)
    fprintf(stderr,
            "HINT: the call is not allowed while the training step is captured into a CUDA "
            "graph; train.cuda_graphs=off runs without graphs (and please report this)\n");
}

// After a kernel launch: reports a bad launch configuration at the launch site.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

// True when a CUDA device can be used (for tests that skip without one).
static inline bool cuda_device_available(void) {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
#endif
