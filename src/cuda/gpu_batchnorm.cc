// GpuBatchNorm (see gpu_batchnorm.h): the CPU layer's steps, one kernel each from
// kernels/batchnorm, with every statistic kept on the device (no host round trip per step). Each
// step is written once over the activations' element type (fp32, or bf16 as uint16_t bit patterns):
// the launchers are overloaded on it. Only in GPU builds.
#include "cuda/gpu_batchnorm.h"

#include <algorithm>

#include "batchnorm.cuh"
#include "cuda/bf16_ptr.h"
#include "cuda/cuda_check.h"

namespace dpt::gpu {

GpuBatchNorm::GpuBatchNorm(GpuContext& ctx, int64_t channels, double momentum, double eps)
    : ctx_(ctx),
      c_(channels),
      momentum_(momentum),
      eps_(eps),
      mean_(static_cast<size_t>(std::max<int64_t>(channels, 1)) * sizeof(float)),
      invstd_(static_cast<size_t>(std::max<int64_t>(channels, 1)) * sizeof(float)),
      stats_(static_cast<size_t>(2 * std::max<int64_t>(channels, 1) + 1) * sizeof(double)),
      sums_(static_cast<size_t>(2 * std::max<int64_t>(channels, 1)) * sizeof(double)) {
  DPT_CHECK(channels > 0, "BatchNorm needs at least one channel, got " << channels);
}

template <typename T>
void GpuBatchNorm::train(const T* x, T* y, int64_t m, const float* gamma, const float* beta,
                         float* running_mean, float* running_var, float* num_batches_tracked,
                         const ChannelSumFn& sync, const T* residual, bool relu) {
  DPT_CHECK(m > 0, "BatchNorm training forward over " << m << " rows");
  cudaStream_t s = ctx_.stream();
  double* stats = stats_.as<double>();
  auto* scratch = static_cast<double*>(
      ctx_.workspace(static_cast<size_t>(cuda::bn_sums_scratch_elems(m, c_)) * sizeof(double)));
  // [sum(C), sumsq(C), count]: one buffer, so synchronised BN needs one all-reduce (as on the CPU).
  CUDA_CHECK(cuda::launch_bn_sums(x, m, c_, stats, stats + c_, stats + 2 * c_, scratch, s));
  if (sync) sync(stats, 2 * c_ + 1);
  CUDA_CHECK(cuda::launch_bn_stats(stats, stats + c_, stats + 2 * c_, c_, momentum_, eps_,
                                   mean_shift_, running_mean, running_var, num_batches_tracked,
                                   mean_.as<float>(), invstd_.as<float>(), s));
  CUDA_CHECK(cuda::launch_bn_apply(x, y, mean_.as<float>(), invstd_.as<float>(), gamma, beta, m, c_,
                                   residual, relu, s));
  train_mode_ = true;
}

template <typename T>
void GpuBatchNorm::eval(const T* x, T* y, int64_t m, const float* gamma, const float* beta,
                        const float* running_mean, const float* running_var, const T* residual,
                        bool relu) {
  cudaStream_t s = ctx_.stream();
  CUDA_CHECK(cuda::launch_bn_eval_stats(running_mean, running_var, c_, eps_, mean_.as<float>(),
                                        invstd_.as<float>(), s));
  CUDA_CHECK(cuda::launch_bn_apply(x, y, mean_.as<float>(), invstd_.as<float>(), gamma, beta, m, c_,
                                   residual, relu, s));
  train_mode_ = false;
}

template <typename T>
void GpuBatchNorm::grad(const T* x, const T* dy, T* dx, int64_t m, const float* gamma,
                        float* dgamma, float* dbeta, bool accumulate, const ChannelSumFn& sync,
                        const T* relu_out, T* dz_out) {
  cudaStream_t s = ctx_.stream();
  double* sums = sums_.as<double>();
  auto* scratch = static_cast<double*>(ctx_.workspace(
      static_cast<size_t>(cuda::bn_backward_sums_scratch_elems(m, c_)) * sizeof(double)));
  // Parameter gradients are this replica's own sums, written before any all-reduce. With a fused
  // ReLU the sums pass masks dy (and stores the result in dz_out when asked); the apply pass then
  // reads dz_out (dy or 0: exact in bf16 too), or masks again on the fly.
  CUDA_CHECK(cuda::launch_bn_backward_sums(x, dy, relu_out, mean_.as<float>(), invstd_.as<float>(),
                                           m, c_, sums, sums + c_, dgamma, dbeta, accumulate,
                                           dz_out, scratch, s));
  if (!dx) return;
  const T* g = dz_out ? dz_out : dy;
  const T* mask = dz_out ? nullptr : relu_out;
  if (!train_mode_) {
    // Evaluation mode: the statistics are constants, so dx = g * gamma * invstd.
    CUDA_CHECK(cuda::launch_bn_backward_apply(x, g, mask, mean_.as<float>(), invstd_.as<float>(),
                                              gamma, nullptr, nullptr, nullptr, m, c_, dx, s));
    return;
  }
  // The input gradient needs the sums over every row the statistics were taken over.
  if (sync) sync(sums, 2 * c_);
  const double* stats = stats_.as<double>();
  CUDA_CHECK(cuda::launch_bn_backward_apply(x, g, mask, mean_.as<float>(), invstd_.as<float>(),
                                            gamma, sums, sums + c_, stats + 2 * c_, m, c_, dx, s));
}

// The interface's two forms: the same steps on their element type.

void GpuBatchNorm::forward_train(const float* x, float* y, int64_t m, const float* gamma,
                                 const float* beta, float* running_mean, float* running_var,
                                 float* num_batches_tracked, const ChannelSumFn& sync,
                                 const float* residual, bool relu) {
  train(x, y, m, gamma, beta, running_mean, running_var, num_batches_tracked, sync, residual, relu);
}

void GpuBatchNorm::forward_train(const BFloat16* x, BFloat16* y, int64_t m, const float* gamma,
                                 const float* beta, float* running_mean, float* running_var,
                                 float* num_batches_tracked, const ChannelSumFn& sync,
                                 const BFloat16* residual, bool relu) {
  train(bits(x), bits(y), m, gamma, beta, running_mean, running_var, num_batches_tracked, sync,
        bits(residual), relu);
}

void GpuBatchNorm::forward_eval(const float* x, float* y, int64_t m, const float* gamma,
                                const float* beta, const float* running_mean,
                                const float* running_var, const float* residual, bool relu) {
  eval(x, y, m, gamma, beta, running_mean, running_var, residual, relu);
}

void GpuBatchNorm::forward_eval(const BFloat16* x, BFloat16* y, int64_t m, const float* gamma,
                                const float* beta, const float* running_mean,
                                const float* running_var, const BFloat16* residual, bool relu) {
  eval(bits(x), bits(y), m, gamma, beta, running_mean, running_var, bits(residual), relu);
}

void GpuBatchNorm::backward(const float* x, const float* dy, float* dx, int64_t m,
                            const float* gamma, float* dgamma, float* dbeta, bool accumulate,
                            const ChannelSumFn& sync, const float* relu_out, float* dz_out) {
  grad(x, dy, dx, m, gamma, dgamma, dbeta, accumulate, sync, relu_out, dz_out);
}

void GpuBatchNorm::backward(const BFloat16* x, const BFloat16* dy, BFloat16* dx, int64_t m,
                            const float* gamma, float* dgamma, float* dbeta, bool accumulate,
                            const ChannelSumFn& sync, const BFloat16* relu_out, BFloat16* dz_out) {
  grad(bits(x), bits(dy), bits(dx), m, gamma, dgamma, dbeta, accumulate, sync, bits(relu_out),
       bits(dz_out));
}

}  // namespace dpt::gpu
