// BatchNorm kernels and their launchers (see batchnorm.cuh): the sums use the fixed-order double
// reduction of channel_reduce.cuh, the statistics one thread per channel, the element-wise passes
// 32 channels x 8 rows per block.
#include "batchnorm.cuh"
#include "channel_reduce.cuh"
#include "launch_util.cuh"
#include "relu.cuh"

namespace dpt::cuda {

// ----------------------------------------------------------------------------
// BatchNorm forward sums: the fixed-order double reduction of channel_reduce.cuh.

namespace {
struct SumsTerm {
  const float* x;
  int64_t c;
  __device__ void operator()(int64_t r, int64_t ch, double* acc) const {
    const double v = x[r * c + ch];
    acc[0] += v;
    acc[1] += v * v;
  }
};
struct SumsOut {
  double *sum, *sumsq, *count;
  double m;
  __device__ void operator()(int64_t ch, const double* total) const {
    sum[ch] = total[0];
    sumsq[ch] = total[1];
    if (count && ch == 0) *count = m;
  }
};
}  // namespace

int64_t bn_sums_scratch_elems(int64_t m, int64_t c) { return reduce_scratch_elems(m, c, 2); }

cudaError_t launch_bn_sums(const float* x, int64_t m, int64_t c, double* sum, double* sumsq, double* count,
                           double* scratch, cudaStream_t stream) {
  return launch_channel_reduce<2>(m, c, SumsTerm{x, c}, SumsOut{sum, sumsq, count, static_cast<double>(m)},
                                  scratch, stream);
}

// ----------------------------------------------------------------------------
// BatchNorm training statistics and running-statistics update: one thread per channel.

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

// ----------------------------------------------------------------------------
// BatchNorm evaluation statistics: one thread per channel.

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

// ----------------------------------------------------------------------------
// BatchNorm apply: 32 channels x 8 rows per block, the channel's scale and shift in registers; one
// instantiation per epilogue (residual add, ReLU), so the plain form keeps its own kernel.

template <bool kResidual, bool kRelu>
static __global__ void bn_apply_kernel(const float* __restrict__ x, float* __restrict__ y,
                                       const float* __restrict__ mean, const float* __restrict__ invstd,
                                       const float* __restrict__ gamma, const float* __restrict__ beta,
                                       const float* __restrict__ residual, int64_t m, int64_t c) {
  const int64_t ch = blockIdx.x * static_cast<int64_t>(kReduceLanes) + threadIdx.x;
  if (ch >= c) return;
  const float scale = gamma[ch] * invstd[ch];
  const float shift = beta[ch] - mean[ch] * scale;
  for (int64_t r = blockIdx.y * static_cast<int64_t>(kReduceRowLanes) + threadIdx.y; r < m;
       r += static_cast<int64_t>(gridDim.y) * kReduceRowLanes) {
    // The value the unfused kernel stored (its expression, so nvcc contracts it the same way),
    // then add_kernel's sum, then the ReLU.
    float v = x[r * c + ch] * scale + shift;
    if (kResidual) v = v + residual[r * c + ch];
    if (kRelu) v = relu_value(v);
    y[r * c + ch] = v;
  }
}

cudaError_t launch_bn_apply(const float* x, float* y, const float* mean, const float* invstd, const float* gamma,
                            const float* beta, int64_t m, int64_t c, const float* residual, bool relu,
                            cudaStream_t stream) {
  if (m <= 0 || c <= 0) return cudaSuccess;
  if (c > kMaxChannels) return cudaErrorInvalidValue;
  const dim3 grid = rows_grid(m, c), block(kReduceLanes, kReduceRowLanes);
  auto* kernel = residual ? (relu ? bn_apply_kernel<true, true> : bn_apply_kernel<true, false>)
                          : (relu ? bn_apply_kernel<false, true> : bn_apply_kernel<false, false>);
  kernel<<<grid, block, 0, stream>>>(x, y, mean, invstd, gamma, beta, residual, m, c);
  return cudaGetLastError();
}

// ----------------------------------------------------------------------------
// BatchNorm backward sums: the fixed-order double reduction of channel_reduce.cuh.

namespace {
// Each (row, channel) is visited once, so the masked gradient can be stored (dz) as it is summed.
struct BackwardTerm {
  const float *x, *dy, *relu_out, *mean, *invstd;
  float* dz;
  int64_t c;
  __device__ void operator()(int64_t r, int64_t ch, double* acc) const {
    const int64_t i = r * c + ch;
    const float g = relu_out ? relu_grad(relu_out[i], dy[i]) : dy[i];
    if (dz) dz[i] = g;
    acc[0] += g;
    acc[1] += static_cast<double>(g) * ((x[i] - mean[ch]) * invstd[ch]);
  }
};
struct BackwardOut {
  double *sum_dy, *sum_dy_xhat;
  float *dgamma, *dbeta;
  bool accumulate;
  __device__ void operator()(int64_t ch, const double* total) const {
    sum_dy[ch] = total[0];
    sum_dy_xhat[ch] = total[1];
    if (dgamma) dgamma[ch] = static_cast<float>((accumulate ? dgamma[ch] : 0.0) + total[1]);
    if (dbeta) dbeta[ch] = static_cast<float>((accumulate ? dbeta[ch] : 0.0) + total[0]);
  }
};
}  // namespace

int64_t bn_backward_sums_scratch_elems(int64_t m, int64_t c) { return reduce_scratch_elems(m, c, 2); }

cudaError_t launch_bn_backward_sums(const float* x, const float* dy, const float* relu_out, const float* mean,
                                    const float* invstd, int64_t m, int64_t c, double* sum_dy, double* sum_dy_xhat,
                                    float* dgamma, float* dbeta, bool accumulate, float* dz, double* scratch,
                                    cudaStream_t stream) {
  return launch_channel_reduce<2>(m, c, BackwardTerm{x, dy, relu_out, mean, invstd, dz, c},
                                  BackwardOut{sum_dy, sum_dy_xhat, dgamma, dbeta, accumulate}, scratch, stream);
}

// ----------------------------------------------------------------------------
// BatchNorm backward apply: 32 channels x 8 rows per block, per-channel coefficients in registers.

static __global__ void bn_backward_apply_kernel(const float* __restrict__ x, const float* __restrict__ dy,
                                                const float* __restrict__ relu_out,
                                                const float* __restrict__ mean, const float* __restrict__ invstd,
                                                const float* __restrict__ gamma,
                                                const double* __restrict__ sum_dy,
                                                const double* __restrict__ sum_dy_xhat,
                                                const double* __restrict__ count_p, int64_t m, int64_t c,
                                                float* __restrict__ dx) {
  const int64_t ch = blockIdx.x * static_cast<int64_t>(kReduceLanes) + threadIdx.x;
  if (ch >= c) return;
  const float a = gamma[ch] * invstd[ch];
  const int64_t r0 = blockIdx.y * static_cast<int64_t>(kReduceRowLanes) + threadIdx.y;
  const int64_t step = static_cast<int64_t>(gridDim.y) * kReduceRowLanes;
  // The gradient BatchNorm takes: dy, or dy through the fused ReLU (the same test in every thread).
  auto grad = [&](int64_t i) { return relu_out ? relu_grad(relu_out[i], dy[i]) : dy[i]; };
  if (sum_dy == nullptr) {
    for (int64_t r = r0; r < m; r += step) dx[r * c + ch] = grad(r * c + ch) * a;
    return;
  }
  const double count = *count_p;
  const float b = static_cast<float>(sum_dy[ch] / count);
  const float d = static_cast<float>(sum_dy_xhat[ch] / count);
  const float mu = mean[ch], is = invstd[ch];
  for (int64_t r = r0; r < m; r += step) {
    const float xhat = (x[r * c + ch] - mu) * is;
    dx[r * c + ch] = a * (grad(r * c + ch) - b - xhat * d);
  }
}

cudaError_t launch_bn_backward_apply(const float* x, const float* dy, const float* relu_out, const float* mean,
                                     const float* invstd, const float* gamma, const double* sum_dy,
                                     const double* sum_dy_xhat, const double* count, int64_t m, int64_t c,
                                     float* dx, cudaStream_t stream) {
  if (m <= 0 || c <= 0) return cudaSuccess;
  if (c > kMaxChannels || (sum_dy && (!sum_dy_xhat || !count))) return cudaErrorInvalidValue;
  bn_backward_apply_kernel<<<rows_grid(m, c), dim3(kReduceLanes, kReduceRowLanes), 0, stream>>>(
      x, dy, relu_out, mean, invstd, gamma, sum_dy, sum_dy_xhat, count, m, c, dx);
  return cudaGetLastError();
}

}  // namespace dpt::cuda
