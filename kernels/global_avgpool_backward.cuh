// Global average pooling backward (NHWC).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dpt::cuda {

// dx[n, p, c] = dy[n, c] / HW.
cudaError_t launch_global_avgpool_backward(const float* dy, float* dx, int64_t n, int64_t hw, int64_t c, cudaStream_t stream);

}  // namespace dpt::cuda
