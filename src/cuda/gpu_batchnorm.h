// GPU BatchNorm over NHWC activations: the CUDA backend's BatchNormOp (include/dpt/backend.h), with
// the semantics of the CPU's (src/cpu/cpu_backend.cc over src/cpu/ops.h's bn_* kernels) on device
// pointers, including synchronised BatchNorm's hook.
#pragma once

#include <cstdint>

#include "cuda/gpu_context.h"
#include "dpt/backend.h"

namespace dpt::gpu {

// One per BatchNorm layer: it keeps, on the device, the mean and invstd of the last forward and
// the row count they came from, which backward needs (as the CPU layer keeps mean_, invstd_,
// count_). Parameters and running statistics stay the caller's (the flat parameter buffers).
class GpuBatchNorm : public BatchNormOp {
 public:
  // momentum: PyTorch's convention, running = (1 - momentum) running + momentum batch_stat.
  GpuBatchNorm(GpuContext& ctx, int64_t channels, double momentum, double eps);
  GpuBatchNorm(const GpuBatchNorm&) = delete;
  GpuBatchNorm& operator=(const GpuBatchNorm&) = delete;

  // Training: y = (x - mean) invstd gamma + beta with the batch's statistics over the m rows of
  // x [m, C] (m = N*H*W), then the fused epilogue (+ residual, ReLU; backend.h); [sum, sumsq,
  // count] go through `sync` when set; running_mean and running_var (unbiased, count/(count-1))
  // are updated; *num_batches_tracked (nullable) += 1. `sync` gets device doubles and must order
  // its work on the context's stream (an NCCL all-reduce on it, or one made to wait for it).
  void forward_train(const float* x, float* y, int64_t m, const float* gamma, const float* beta,
                     float* running_mean, float* running_var, float* num_batches_tracked,
                     const ChannelSumFn& sync, const float* residual, bool relu) override;
  // Evaluation: the running statistics normalise; nothing is updated.
  void forward_eval(const float* x, float* y, int64_t m, const float* gamma, const float* beta,
                    const float* running_mean, const float* running_var, const float* residual,
                    bool relu) override;
  // Backward of the last forward (same x and m), with g = dy or, with relu_out, dy masked by
  // relu_out > 0 (stored in dz_out when set). dgamma (+)= sum g*xhat and dbeta (+)= sum g from
  // this replica's rows (the reducer adds replicas up); dx (nullable) after a training forward
  // uses [sum g, sum g*xhat] over every replica (through `sync`), after an evaluation forward is
  // g*gamma*invstd.
  void backward(const float* x, const float* dy, float* dx, int64_t m, const float* gamma,
                float* dgamma, float* dbeta, bool accumulate, const ChannelSumFn& sync,
                const float* relu_out, float* dz_out) override;
  // The same three on bf16 activations (x, y, residual, dy, dx, relu_out, dz_out), in one pass each
  // like the fp32 forms: every value widened, the fp32 arithmetic, one rounding per stored value
  // (the CPU's bits); parameters, their gradients and the statistics stay fp32 (doubles inside).
  void forward_train(const BFloat16* x, BFloat16* y, int64_t m, const float* gamma,
                     const float* beta, float* running_mean, float* running_var,
                     float* num_batches_tracked, const ChannelSumFn& sync, const BFloat16* residual,
                     bool relu) override;
  void forward_eval(const BFloat16* x, BFloat16* y, int64_t m, const float* gamma,
                    const float* beta, const float* running_mean, const float* running_var,
                    const BFloat16* residual, bool relu) override;
  void backward(const BFloat16* x, const BFloat16* dy, BFloat16* dx, int64_t m, const float* gamma,
                float* dgamma, float* dbeta, bool accumulate, const ChannelSumFn& sync,
                const BFloat16* relu_out, BFloat16* dz_out) override;

  int64_t channels() const { return c_; }
  const float* saved_mean() const { return mean_.as<float>(); }      // device, C floats
  const float* saved_invstd() const { return invstd_.as<float>(); }  // device, C floats

 private:
  // The steps of both forms, over T = float or uint16_t (bf16 bit patterns, as kernels/ takes
  // them).
  template <typename T>
  void train(const T* x, T* y, int64_t m, const float* gamma, const float* beta,
             float* running_mean, float* running_var, float* num_batches_tracked,
             const ChannelSumFn& sync, const T* residual, bool relu);
  template <typename T>
  void eval(const T* x, T* y, int64_t m, const float* gamma, const float* beta,
            const float* running_mean, const float* running_var, const T* residual, bool relu);
  template <typename T>
  void grad(const T* x, const T* dy, T* dx, int64_t m, const float* gamma, float* dgamma,
            float* dbeta, bool accumulate, const ChannelSumFn& sync, const T* relu_out, T* dz_out);

  GpuContext& ctx_;
  int64_t c_;
  double momentum_, eps_;
  bool train_mode_ = true;  // mode of the last forward: backward must match it
  DeviceBuffer mean_, invstd_;
  DeviceBuffer stats_;  // doubles: [sum(C), sumsq(C), count] of the last training forward
  DeviceBuffer sums_;   // doubles: [sum dy(C), sum dy*xhat(C)] of backward
};

}  // namespace dpt::gpu
