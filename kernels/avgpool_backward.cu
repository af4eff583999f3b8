// AvgPool2d backward (NHWC): one thread per input element gathers from the windows covering it,
// so no atomics are needed and uncovered positions get 0.
#include "avgpool_backward.cuh"
#include "launch_util.cuh"

namespace dpt::cuda {

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

}  // namespace dpt::cuda
