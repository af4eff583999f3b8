// BatchNorm evaluation statistics on the GPU: the CPU BatchNorm2d layer's evaluation-mode loop
// (src/nn/layers.cc), mean and invstd from the running statistics.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dpt::cuda {

// mean = running_mean, invstd = float(1/sqrt(double(running_var) + eps)). Returns the launch status.
cudaError_t launch_bn_eval_stats(const float* running_mean, const float* running_var, int64_t c, double eps,
                                 float* mean, float* invstd, cudaStream_t stream);

}  // namespace dpt::cuda
