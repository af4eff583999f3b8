// BatchNorm training statistics and running-statistics update: one thread per channel.
#include "bn_stats.cuh"
#include "launch_util.cuh"

namespace dpt::cuda {

static __global__ void bn_stats_kernel(const double* __restrict__ sum, const double* __restrict__ sumsq,
                                       const double* __restrict__ count_p, int64_t c, double momentum, double eps,
                                       float* __restrict__ running_mean, float* __restrict__ running_var,
                                       float* __restrict__ num_batches, float* __restrict__ mean_out,
                                       float* __restrict__ invstd_out) {
  const double count = *count_p;
  DPT_GRID_STRIDE(ch, c) {
    const double mean = sum[ch] / count;
    const double var = fmax(0.0, sumsq[ch] / count - mean * mean);
    mean_out[ch] = static_cast<float>(mean);
    invstd_out[ch] = static_cast<float>(1.0 / sqrt(var + eps));
    const double unbiased = count > 1 ? var * count / (count - 1) : var;
    running_mean[ch] = static_cast<float>((1 - momentum) * running_mean[ch] + momentum * mean);
    running_var[ch] = static_cast<float>((1 - momentum) * running_var[ch] + momentum * unbiased);
  }
  if (num_batches && blockIdx.x == 0 && threadIdx.x == 0) *num_batches += 1.f;
}

cudaError_t launch_bn_stats(const double* sum, const double* sumsq, const double* count, int64_t c,
                            double momentum, double eps, float* running_mean, float* running_var,
                            float* num_batches_tracked, float* mean, float* invstd, cudaStream_t stream) {
  if (c <= 0) return cudaSuccess;
  bn_stats_kernel<<<blocks_for(c), kThreads, 0, stream>>>(sum, sumsq, count, c, momentum, eps, running_mean,
                                                          running_var, num_batches_tracked, mean, invstd);
  return cudaGetLastError();
}

}  // namespace dpt::cuda
