// BatchNorm normalisation on the GPU (same semantics as cpu::bn_apply).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dpt::cuda {

// y[r, c] = x[r, c] * scale[c] + shift[c] with scale = gamma*invstd, shift = beta - mean*scale,
// over an [M, C] view. Returns the launch status.
cudaError_t launch_bn_apply(const float* x, float* y, const float* mean, const float* invstd, const float* gamma,
                            const float* beta, int64_t m, int64_t c, cudaStream_t stream);

}  // namespace dpt::cuda
