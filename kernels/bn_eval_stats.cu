// BatchNorm evaluation statistics: one thread per channel.
#include "bn_eval_stats.cuh"
#include "launch_util.cuh"

namespace dpt::cuda {

static __global__ void bn_eval_stats_kernel(const float* __restrict__ running_mean,
                                            const float* __restrict__ running_var, int64_t c, double eps,
                                            float* __restrict__ mean, float* __restrict__ invstd) {
  DPT_GRID_STRIDE(ch, c) {
    mean[ch] = running_mean[ch];
    invstd[ch] = static_cast<float>(1.0 / sqrt(static_cast<double>(running_var[ch]) + eps));
  }
}

cudaError_t launch_bn_eval_stats(const float* running_mean, const float* running_var, int64_t c, double eps,
                                 float* mean, float* invstd, cudaStream_t stream) {
  if (c <= 0) return cudaSuccess;
  bn_eval_stats_kernel<<<blocks_for(c), kThreads, 0, stream>>>(running_mean, running_var, c, eps, mean, invstd);
  return cudaGetLastError();
}

}  // namespace dpt::cuda
