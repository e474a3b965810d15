// hostdev.h: marks small inline functions that both the C code and CUDA kernels call (the
// counter-based RNG, index maps, the optimizer's per-step decisions), so one definition serves
// the CPU reference and the device.
#pragma once

#ifdef __CUDACC__
#define SWIN_HOSTDEV __host__ __device__
#else
#define SWIN_HOSTDEV
#endif
