// AvgPool2d backward on NHWC tensors, optionally fused with the ReLU before the pool (same
// semantics as cpu::avgpool_backward and cpu::relu_avgpool_backward).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dpt::cuda {

// dx is overwritten; positions no window covers get 0. relu_x (nullable): the fused layer's input;
// where it is not > 0 the gradient is 0 (the ReLU's mask, taken from its input, not its output).
cudaError_t launch_avgpool_backward(const float* dy, const float* relu_x, float* dx, int64_t n, int64_t h, int64_t w,
                                    int64_t c, int k, int s, cudaStream_t stream);

}  // namespace dpt::cuda
