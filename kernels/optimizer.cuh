// The optimizer step on the GPU: SGD and AdamW over the flat parameter/gradient buffers, and the
// store of the step's learning rate into device memory. Host launchers only: no CUDA types beyond
// cudaStream_t.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dpt::cuda {

// ----------------------------------------------------------------------------
// SGD with momentum and weight decay over the flat parameter/gradient buffers on the GPU
// (PyTorch semantics, the same as the CPU's cpu::sgd_update: Backend::sgd_update on each).

// p -= lr * (nesterov ? d + momentum*buf : buf), buf = first ? d : momentum*buf + d with d = c*g +
// wd*p (buf unused and p -= lr*d when momentum == 0). lr is read from device memory (one float, see
// launch_store_scalar), so a step replayed from a CUDA graph follows the schedule. grad_sumsq
// (nullable, device): the gradients' sum of squares; when it is not finite nothing is updated (the
// non-finite guard), and with clip_norm > 0 the gradients are scaled by c = min(1, clip_norm /
// (norm + 1e-6)) (PyTorch's clip_grad_norm_, dpt/clip.h), else c = 1. Checks the launch; returns
// the launch status.
cudaError_t launch_sgd_update(float* p, const float* g, float* buf, int64_t n, const float* lr,
                              float momentum, float weight_decay, bool nesterov, bool first,
                              const double* grad_sumsq, float clip_norm, cudaStream_t stream);

// torch.optim.AdamW (amsgrad off; Backend::adamw_update on each backend) with t = *step + 1 (step:
// one double of device memory, the updates applied before) and d = c*g (c and the guard as
// launch_sgd_update): p *= 1 - lr*wd; m = b1*m + (1-b1)*d; v = b2*v + (1-b2)*d*d;
// p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps), the scalars formed in double and rounded
// to float. With count_step, *step = t afterwards when the step was applied. lr and the count are
// read from device memory, so a replayed CUDA graph follows the schedule and the bias corrections.
cudaError_t launch_adamw_update(float* p, const float* g, float* exp_avg, float* exp_avg_sq,
                                int64_t n, const float* lr, double* step, bool count_step,
                                double beta1, double beta2, double eps, double weight_decay,
                                const double* grad_sumsq, float clip_norm, cudaStream_t stream);

// out[0] = sum of x[i]^2 over n floats, in double, in a fixed order (blocks' partial sums in the
// workspace `partials`, at least sum_squares_partials() doubles, then one block adds them up).
int sum_squares_partials();
cudaError_t launch_sum_squares(const float* x, int64_t n, double* partials, double* out,
                               cudaStream_t stream);

// ----------------------------------------------------------------------------
// Writes one float into device memory from a kernel argument: how a value that changes every step
// (the learning rate) reaches kernels replayed from a CUDA graph, which read it from a fixed
// address.

// *dst = value, in stream order. Checks the launch; returns the launch status.
cudaError_t launch_store_scalar(float* dst, float value, cudaStream_t stream);

}  // namespace dpt::cuda
