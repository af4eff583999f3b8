// Pooling kernels and their launchers (see pooling.cuh): AvgPool2d and global average pooling on
// NHWC tensors, element-wise grid-stride passes without atomics.
#include "launch_util.cuh"
#include "relu.cuh"
#include "pooling.cuh"

namespace dpt::cuda {

// ----------------------------------------------------------------------------
// AvgPool2d forward (NHWC): one thread per output element, channel fastest for coalescing.

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
        acc += kRelu ? relu_value(v) : v;  // the CPU's order: row by row, then * 1/k^2
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

// ----------------------------------------------------------------------------
// AvgPool2d backward (NHWC): one thread per input element gathers from the windows covering it,
// so no atomics are needed and uncovered positions get 0.

static __global__ void avgpool_backward_kernel(const float* __restrict__ dy, const float* __restrict__ relu_x,
                                               float* __restrict__ dx, int64_t n, int64_t h, int64_t w, int64_t c,
                                               int k, int s) {
  const int64_t oh = (h - k) / s + 1, ow = (w - k) / s + 1, total = n * h * w * c;
  const float inv = 1.f / static_cast<float>(k * k);
  DPT_GRID_STRIDE(i, total) {
    if (relu_x && !(relu_x[i] > 0.f)) {
      dx[i] = 0.f;
      continue;
    }
    const int64_t ch = i % c, x = (i / c) % w, y = (i / (c * w)) % h, b = i / (c * w * h);
    float acc = 0.f;
    // Output rows r with r*s <= y < r*s + k, and likewise for columns.
    const int64_t r0 = y >= k ? (y - k) / s + 1 : 0, r1 = y / s < oh - 1 ? y / s : oh - 1;
    const int64_t c0 = x >= k ? (x - k) / s + 1 : 0, c1 = x / s < ow - 1 ? x / s : ow - 1;
    for (int64_t r = r0; r <= r1; ++r)
      for (int64_t q = c0; q <= c1; ++q) acc += dy[((b * oh + r) * ow + q) * c + ch];
    dx[i] = acc * inv;
  }
}

cudaError_t launch_avgpool_backward(const float* dy, const float* relu_x, float* dx, int64_t n, int64_t h, int64_t w,
                                    int64_t c, int k, int s, cudaStream_t stream) {
  const int64_t total = n * h * w * c;
  if (total <= 0) return cudaSuccess;
  avgpool_backward_kernel<<<blocks_for(total), kThreads, 0, stream>>>(dy, relu_x, dx, n, h, w, c, k, s);
  return cudaGetLastError();
}

// ----------------------------------------------------------------------------
// Global average pooling forward (NHWC): one thread per (image, channel), reads coalesced in c.

static __global__ void gap_forward_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n,
                                          int64_t hw, int64_t c) {
  const float inv = 1.f / static_cast<float>(hw);
  DPT_GRID_STRIDE(i, n * c) {
    const int64_t b = i / c, ch = i % c;
    float acc = 0.f;
    for (int64_t p = 0; p < hw; ++p) acc += x[(b * hw + p) * c + ch];
    y[i] = acc * inv;
  }
}

cudaError_t launch_global_avgpool_forward(const float* x, float* y, int64_t n, int64_t hw, int64_t c,
                                          cudaStream_t stream) {
  if (n * c <= 0) return cudaSuccess;
  gap_forward_kernel<<<blocks_for(n * c), kThreads, 0, stream>>>(x, y, n, hw, c);
  return cudaGetLastError();
}

// ----------------------------------------------------------------------------
// Global average pooling backward (NHWC): every position of an image gets dy / HW.

static __global__ void gap_backward_kernel(const float* __restrict__ dy, float* __restrict__ dx, int64_t n,
                                           int64_t hw, int64_t c) {
  const float inv = 1.f / static_cast<float>(hw);
  DPT_GRID_STRIDE(i, n * hw * c) dx[i] = dy[(i / (hw * c)) * c + i % c] * inv;
}

cudaError_t launch_global_avgpool_backward(const float* dy, float* dx, int64_t n, int64_t hw, int64_t c,
                                           cudaStream_t stream) {
  if (n * hw * c <= 0) return cudaSuccess;
  gap_backward_kernel<<<blocks_for(n * hw * c), kThreads, 0, stream>>>(dy, dx, n, hw, c);
  return cudaGetLastError();
}

}  // namespace dpt::cuda
