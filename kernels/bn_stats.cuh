// BatchNorm training statistics on the GPU: the per-channel loop of the CPU BatchNorm2d layer's
// training forward (src/nn/layers.cc) as a kernel, so no statistic makes a host round trip.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dpt::cuda {

// From sum, sumsq and *count (device doubles, possibly all-reduced across replicas):
//   mean = sum/count, var = max(0, sumsq/count - mean^2) (biased), invstd = 1/sqrt(var + eps);
//   running_mean = (1-momentum) running_mean + momentum mean,
//   running_var  = (1-momentum) running_var + momentum var*count/(count-1) (unbiased; var if count <= 1),
//   *num_batches_tracked += 1 (nullable).
// All arithmetic in double, rounded to float once, as on the CPU. Returns the launch status.
cudaError_t launch_bn_stats(const double* sum, const double* sumsq, const double* count, int64_t c,
                            double momentum, double eps, float* running_mean, float* running_var,
                            float* num_batches_tracked, float* mean, float* invstd, cudaStream_t stream);

}  // namespace dpt::cuda
