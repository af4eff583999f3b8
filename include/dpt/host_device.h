// DPT_HOST_DEVICE: marks the inline functions of a header that both the C++ side and the CUDA
// kernels (nvcc, C++17, no library) compile, so the two backends share one formula.
#pragma once

#if defined(__CUDACC__)
#define DPT_HOST_DEVICE __host__ __device__
#else
#define DPT_HOST_DEVICE
#endif
