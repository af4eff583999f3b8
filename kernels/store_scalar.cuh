// Writes one float into device memory from a kernel argument: how a value that changes every step
// (the learning rate) reaches kernels replayed from a CUDA graph, which read it from a fixed address.
// Host launcher only: no CUDA types beyond cudaStream_t cross this header.
#pragma once

#include <cuda_runtime.h>

namespace dpt::cuda {

// *dst = value, in stream order. Checks the launch; returns the launch status.
cudaError_t launch_store_scalar(float* dst, float value, cudaStream_t stream);

}  // namespace dpt::cuda
