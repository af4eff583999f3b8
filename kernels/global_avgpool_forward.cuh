// Global average pooling forward (NHWC).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dpt::cuda {

// [N, HW, C] -> [N, C], mean over HW.
cudaError_t launch_global_avgpool_forward(const float* x, float* y, int64_t n, int64_t hw, int64_t c, cudaStream_t stream);

}  // namespace dpt::cuda
