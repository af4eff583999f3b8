// AvgPool2d backward on NHWC tensors (same semantics as cpu::avgpool_backward).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dpt::cuda {

// dx is overwritten; positions no window covers get 0.
cudaError_t launch_avgpool_backward(const float* dy, float* dx, int64_t n, int64_t h, int64_t w, int64_t c, int k, int s, cudaStream_t stream);

}  // namespace dpt::cuda
