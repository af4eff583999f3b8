// AvgPool2d forward (NHWC): one thread per output element, channel fastest for coalescing.
#include "avgpool_forward.cuh"
#include "launch_util.cuh"

namespace dpt::cuda {

template <bool kRelu>
static __global__ void avgpool_forward_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n,
                                              int64_t h, int64_t w, int64_t c, int k, int s) {
  const int64_t oh = (h - k) / s + 1, ow = (w - k) / s + 1, total = n * oh * ow * c;
  const float inv = 1.f / static_cast<float>(k * k);
  DPT_GRID_STRIDE(i, total) {
    const int64_t ch = i % c, j = (i / c) % ow, r = (i / (c * ow)) % oh, b = i / (c * ow * oh);
    float acc = 0.f;
    for (int di = 0; di < k; ++di)
      for (int dj = 0; dj < k; ++dj) {
        const float v = x[((b * h + r * s + di) * w + j * s + dj) * c + ch];
        acc += kRelu ? (v > 0.f ? v : 0.f) : v;  // the CPU's order: row by row, then * 1/k^2
      }
    y[i] = acc * inv;
  }
}

cudaError_t launch_avgpool_forward(const float* x, float* y, int64_t n, int64_t h, int64_t w, int64_t c, int k,
                                   int s, bool relu, cudaStream_t stream) {
  const int64_t total = n * ((h - k) / s + 1) * ((w - k) / s + 1) * c;
  if (total <= 0) return cudaSuccess;
  if (relu)
    avgpool_forward_kernel<true><<<blocks_for(total), kThreads, 0, stream>>>(x, y, n, h, w, c, k, s);
  else
    avgpool_forward_kernel<false><<<blocks_for(total), kThreads, 0, stream>>>(x, y, n, h, w, c, k, s);
  return cudaGetLastError();
}

}  // namespace dpt::cuda
