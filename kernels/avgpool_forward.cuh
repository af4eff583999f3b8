// AvgPool2d forward on NHWC tensors (same semantics as cpu::avgpool_forward).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dpt::cuda {

// NHWC k x k window, stride s, no padding, floor mode.
cudaError_t launch_avgpool_forward(const float* x, float* y, int64_t n, int64_t h, int64_t w, int64_t c, int k, int s, cudaStream_t stream);

}  // namespace dpt::cuda
