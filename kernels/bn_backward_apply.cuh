// BatchNorm input gradient on the GPU (same semantics as cpu::bn_backward_apply, and as the CPU
// layer's evaluation-mode shortcut).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dpt::cuda {

// Training (sum_dy != nullptr): dx = gamma*invstd * (dy - sum_dy/count - xhat * sum_dy_xhat/count),
//   xhat = (x - mean) * invstd; count is a device double (the rows over all replicas), read on the
//   device so synchronised BatchNorm needs no host round trip.
// Evaluation (sum_dy == nullptr): the statistics are constants, dx = dy * (gamma*invstd).
cudaError_t launch_bn_backward_apply(const float* x, const float* dy, const float* mean, const float* invstd,
                                     const float* gamma, const double* sum_dy, const double* sum_dy_xhat,
                                     const double* count, int64_t m, int64_t c, float* dx, cudaStream_t stream);

}  // namespace dpt::cuda
