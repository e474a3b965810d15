// nvtx.h: named ranges for Nsight Systems (forward, backward, optimizer, each stage), from the
// header-only NVTX 3 of the CUDA toolkit; nothing without the CUDA backend. A range costs a few
// hundred nanoseconds of host time, so they mark phases, not kernels.
#pragma once

#ifdef SWIN_HAVE_CUDA
#include <nvtx3/nvToolsExt.h>
#define NVTX_PUSH(name) nvtxRangePushA(name)
#define NVTX_POP() nvtxRangePop()
#else
#define NVTX_PUSH(name) ((void)(name))
#define NVTX_POP() ((void)0)
#endif
