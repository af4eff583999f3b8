// ReLU backward on the GPU (same semantics as cpu::relu_backward).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dpt::cuda {

// dx = dy where y > 0, else 0 (y: the forward output).
cudaError_t launch_relu_backward(const float* y, const float* dy, float* dx, int64_t n, cudaStream_t stream);

}  // namespace dpt::cuda
