// BatchNorm backward apply: 32 channels x 8 rows per block, per-channel coefficients in registers.
#include "bn_backward_apply.cuh"
#include "channel_reduce.cuh"

namespace dpt::cuda {

static __global__ void bn_backward_apply_kernel(const float* __restrict__ x, const float* __restrict__ dy,
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
  if (sum_dy == nullptr) {
    for (int64_t r = r0; r < m; r += step) dx[r * c + ch] = dy[r * c + ch] * a;
    return;
  }
  const double count = *count_p;
  const float b = static_cast<float>(sum_dy[ch] / count);
  const float d = static_cast<float>(sum_dy_xhat[ch] / count);
  const float mu = mean[ch], is = invstd[ch];
  for (int64_t r = r0; r < m; r += step) {
    const float xhat = (x[r * c + ch] - mu) * is;
    dx[r * c + ch] = a * (dy[r * c + ch] - b - xhat * d);
  }
}

cudaError_t launch_bn_backward_apply(const float* x, const float* dy, const float* mean, const float* invstd,
                                     const float* gamma, const double* sum_dy, const double* sum_dy_xhat,
                                     const double* count, int64_t m, int64_t c, float* dx, cudaStream_t stream) {
  if (m <= 0 || c <= 0) return cudaSuccess;
  if (c > kMaxChannels || (sum_dy && (!sum_dy_xhat || !count))) return cudaErrorInvalidValue;
  bn_backward_apply_kernel<<<rows_grid(m, c), dim3(kReduceLanes, kReduceRowLanes), 0, stream>>>(
      x, dy, mean, invstd, gamma, sum_dy, sum_dy_xhat, count, m, c, dx);
  return cudaGetLastError();
}

}  // namespace dpt::cuda
