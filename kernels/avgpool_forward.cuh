// AvgPool2d forward on NHWC tensors, optionally fused with the ReLU before it (same semantics as
// cpu::avgpool_forward and cpu::relu_avgpool_forward).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dpt::cuda {

// NHWC k x k window, stride s, no padding, floor mode. relu: pool max(x, 0) instead of x (LeNet's
// ReLU + pool in one pass; the ReLU output is never written).
cudaError_t launch_avgpool_forward(const float* x, float* y, int64_t n, int64_t h, int64_t w, int64_t c, int k, int s,
                                   bool relu, cudaStream_t stream);

}  // namespace dpt::cuda
