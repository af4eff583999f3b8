// Element-wise add (residual connections), optionally fused with ReLU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dpt::cuda {

// y = a + b, then max(y, 0) when relu (the residual add fused with the block's final ReLU).
cudaError_t launch_add(const float* a, const float* b, float* y, int64_t n, bool relu, cudaStream_t stream);

}  // namespace dpt::cuda
