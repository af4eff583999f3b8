// ReLU forward on the GPU (same semantics as cpu::relu_forward).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dpt::cuda {

// y = max(x, 0). Returns the launch status.
cudaError_t launch_relu_forward(const float* x, float* y, int64_t n, cudaStream_t stream);

}  // namespace dpt::cuda
