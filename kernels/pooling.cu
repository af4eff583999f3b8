// Pooling kernels and their launchers (see pooling.cuh): AvgPool2d, MaxPool2d and global average
// pooling on NHWC tensors, element-wise grid-stride passes without atomics, each templated on the
// element type (storage.cuh).
#include "launch_util.cuh"
#include "pooling.cuh"
#include "relu.cuh"
#include "storage.cuh"

namespace dpt::cuda {

// ----------------------------------------------------------------------------
// AvgPool2d forward (NHWC): one thread per output element, channel fastest for coalescing.

template <typename T, bool kRelu>
static __global__ void avgpool_forward_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n,
                                              int64_t h, int64_t w, int64_t c, int k, int s) {
  const int64_t oh = (h - k) / s + 1, ow = (w - k) / s + 1, total = n * oh * ow * c;
  const float inv = 1.f / static_cast<float>(k * k);
  DPT_GRID_STRIDE(i, total) {
    const int64_t ch = i % c, j = (i / c) % ow, r = (i / (c * ow)) % oh, b = i / (c * ow * oh);
    float acc = 0.f;
    for (int di = 0; di < k; ++di)
      for (int dj = 0; dj < k; ++dj) {
        const float v = widen(x[((b * h + r * s + di) * w + j * s + dj) * c + ch]);
        acc += kRelu ? relu_value(v) : v;  // the CPU's order: row by row, then * 1/k^2
      }
    store(acc * inv, y[i]);
  }
}

template <typename T>
static cudaError_t avgpool_forward(const T* x, T* y, int64_t n, int64_t h, int64_t w, int64_t c,
                                   int k, int s, bool relu, cudaStream_t stream) {
  const int64_t total = n * ((h - k) / s + 1) * ((w - k) / s + 1) * c;
  return launch_over(total, stream,
                     relu ? avgpool_forward_kernel<T, true> : avgpool_forward_kernel<T, false>, x,
                     y, n, h, w, c, k, s);
}

cudaError_t launch_avgpool_forward(const float* x, float* y, int64_t n, int64_t h, int64_t w,
                                   int64_t c, int k, int s, bool relu, cudaStream_t stream) {
  return avgpool_forward(x, y, n, h, w, c, k, s, relu, stream);
}

cudaError_t launch_avgpool_forward(const uint16_t* x, uint16_t* y, int64_t n, int64_t h, int64_t w,
                                   int64_t c, int k, int s, bool relu, cudaStream_t stream) {
  return avgpool_forward(as_bf16(x), as_bf16(y), n, h, w, c, k, s, relu, stream);
}

// ----------------------------------------------------------------------------
// AvgPool2d backward (NHWC): one thread per input element gathers from the windows covering it,
// so no atomics are needed and uncovered positions get 0.

template <typename T>
static __global__ void avgpool_backward_kernel(const T* __restrict__ dy,
                                               const T* __restrict__ relu_x, T* __restrict__ dx,
                                               int64_t n, int64_t h, int64_t w, int64_t c, int k,
                                               int s) {
  const int64_t oh = (h - k) / s + 1, ow = (w - k) / s + 1, total = n * h * w * c;
  const float inv = 1.f / static_cast<float>(k * k);
  DPT_GRID_STRIDE(i, total) {
    if (relu_x && !(widen(relu_x[i]) > 0.f)) {
      store(0.f, dx[i]);
      continue;
    }
    const int64_t ch = i % c, x = (i / c) % w, y = (i / (c * w)) % h, b = i / (c * w * h);
    float acc = 0.f;
    // Output rows r with r*s <= y < r*s + k, and likewise for columns.
    const int64_t r0 = y >= k ? (y - k) / s + 1 : 0, r1 = y / s < oh - 1 ? y / s : oh - 1;
    const int64_t c0 = x >= k ? (x - k) / s + 1 : 0, c1 = x / s < ow - 1 ? x / s : ow - 1;
    for (int64_t r = r0; r <= r1; ++r)
      for (int64_t q = c0; q <= c1; ++q) acc += widen(dy[((b * oh + r) * ow + q) * c + ch]);
    store(acc * inv, dx[i]);
  }
}

cudaError_t launch_avgpool_backward(const float* dy, const float* relu_x, float* dx, int64_t n,
                                    int64_t h, int64_t w, int64_t c, int k, int s,
                                    cudaStream_t stream) {
  return launch_over(n * h * w * c, stream, avgpool_backward_kernel<float>, dy, relu_x, dx, n, h, w,
                     c, k, s);
}

cudaError_t launch_avgpool_backward(const uint16_t* dy, const uint16_t* relu_x, uint16_t* dx,
                                    int64_t n, int64_t h, int64_t w, int64_t c, int k, int s,
                                    cudaStream_t stream) {
  return launch_over(n * h * w * c, stream, avgpool_backward_kernel<__nv_bfloat16>, as_bf16(dy),
                     as_bf16(relu_x), as_bf16(dx), n, h, w, c, k, s);
}

// ----------------------------------------------------------------------------
// MaxPool2d (NHWC). The winner of output (b, r, q, ch)'s window, as an input element index, by the
// CPU's rule (cpu::max_window): the first maximum in row-major order, a NaN over any number.

template <typename T>
static __device__ int64_t max_winner(const T* __restrict__ x, int64_t b, int64_t h, int64_t w,
                                     int64_t c, int k, int s, int pad, int64_t r, int64_t q,
                                     int64_t ch, float* best) {
  const int64_t h0 = r * s - pad, w0 = q * s - pad;
  const int64_t hs = h0 > 0 ? h0 : 0, he = h0 + k < h ? h0 + k : h;
  const int64_t ws = w0 > 0 ? w0 : 0, we = w0 + k < w ? w0 + k : w;
  float m = -INFINITY;
  int64_t at = ((b * h + hs) * w + ws) * c + ch;
  for (int64_t y = hs; y < he; ++y)
    for (int64_t xx = ws; xx < we; ++xx) {
      const int64_t idx = ((b * h + y) * w + xx) * c + ch;
      const float v = widen(x[idx]);
      if (v > m || v != v) {
        m = v;
        at = idx;
      }
    }
  *best = m;
  return at;
}

// Forward: one thread per output element, channel fastest for coalescing.
template <typename T>
static __global__ void maxpool_forward_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n,
                                              int64_t h, int64_t w, int64_t c, int k, int s,
                                              int pad) {
  const int64_t oh = (h + 2 * pad - k) / s + 1, ow = (w + 2 * pad - k) / s + 1;
  DPT_GRID_STRIDE(i, n * oh * ow * c) {
    const int64_t ch = i % c, q = (i / c) % ow, r = (i / (c * ow)) % oh, b = i / (c * ow * oh);
    float m;
    max_winner(x, b, h, w, c, k, s, pad, r, q, ch, &m);
    store(m, y[i]);
  }
}

template <typename T>
static cudaError_t maxpool_forward(const T* x, T* y, int64_t n, int64_t h, int64_t w, int64_t c,
                                   int k, int s, int pad, cudaStream_t stream) {
  const int64_t total = n * ((h + 2 * pad - k) / s + 1) * ((w + 2 * pad - k) / s + 1) * c;
  return launch_over(total, stream, maxpool_forward_kernel<T>, x, y, n, h, w, c, k, s, pad);
}

cudaError_t launch_maxpool_forward(const float* x, float* y, int64_t n, int64_t h, int64_t w,
                                   int64_t c, int k, int s, int pad, cudaStream_t stream) {
  return maxpool_forward(x, y, n, h, w, c, k, s, pad, stream);
}

cudaError_t launch_maxpool_forward(const uint16_t* x, uint16_t* y, int64_t n, int64_t h, int64_t w,
                                   int64_t c, int k, int s, int pad, cudaStream_t stream) {
  return maxpool_forward(as_bf16(x), as_bf16(y), n, h, w, c, k, s, pad, stream);
}

// Backward: one thread per input element gathers the gradients of the windows covering it that it
// wins (their winners recomputed), in row-major output order as the CPU's scatter adds them, so
// the sums are the CPU's bit for bit and no atomics are needed.
template <typename T>
static __global__ void maxpool_backward_kernel(const T* __restrict__ x, const T* __restrict__ dy,
                                               T* __restrict__ dx, int64_t n, int64_t h, int64_t w,
                                               int64_t c, int k, int s, int pad) {
  const int64_t oh = (h + 2 * pad - k) / s + 1, ow = (w + 2 * pad - k) / s + 1;
  DPT_GRID_STRIDE(i, n * h * w * c) {
    const int64_t ch = i % c, px = (i / c) % w, py = (i / (c * w)) % h, b = i / (c * w * h);
    // Output rows r with r*s - pad <= py < r*s - pad + k, and likewise for columns.
    const int64_t yp = py + pad, xp = px + pad;
    const int64_t r0 = yp >= k ? (yp - k) / s + 1 : 0, r1 = yp / s < oh - 1 ? yp / s : oh - 1;
    const int64_t c0 = xp >= k ? (xp - k) / s + 1 : 0, c1 = xp / s < ow - 1 ? xp / s : ow - 1;
    float acc = 0.f;
    for (int64_t r = r0; r <= r1; ++r)
      for (int64_t q = c0; q <= c1; ++q) {
        float m;
        if (max_winner(x, b, h, w, c, k, s, pad, r, q, ch, &m) == i)
          acc += widen(dy[((b * oh + r) * ow + q) * c + ch]);
      }
    store(acc, dx[i]);
  }
}

cudaError_t launch_maxpool_backward(const float* x, const float* dy, float* dx, int64_t n,
                                    int64_t h, int64_t w, int64_t c, int k, int s, int pad,
                                    cudaStream_t stream) {
  return launch_over(n * h * w * c, stream, maxpool_backward_kernel<float>, x, dy, dx, n, h, w, c,
                     k, s, pad);
}

cudaError_t launch_maxpool_backward(const uint16_t* x, const uint16_t* dy, uint16_t* dx, int64_t n,
                                    int64_t h, int64_t w, int64_t c, int k, int s, int pad,
                                    cudaStream_t stream) {
  return launch_over(n * h * w * c, stream, maxpool_backward_kernel<__nv_bfloat16>, as_bf16(x),
                     as_bf16(dy), as_bf16(dx), n, h, w, c, k, s, pad);
}

// ----------------------------------------------------------------------------
// Global average pooling forward (NHWC): one thread per (image, channel), reads coalesced in c.

template <typename T>
static __global__ void gap_forward_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n,
                                          int64_t hw, int64_t c) {
  const float inv = 1.f / static_cast<float>(hw);
  DPT_GRID_STRIDE(i, n * c) {
    const int64_t b = i / c, ch = i % c;
    float acc = 0.f;
    for (int64_t p = 0; p < hw; ++p) acc += widen(x[(b * hw + p) * c + ch]);
    store(acc * inv, y[i]);
  }
}

cudaError_t launch_global_avgpool_forward(const float* x, float* y, int64_t n, int64_t hw,
                                          int64_t c, cudaStream_t stream) {
  return launch_over(n * c, stream, gap_forward_kernel<float>, x, y, n, hw, c);
}

cudaError_t launch_global_avgpool_forward(const uint16_t* x, uint16_t* y, int64_t n, int64_t hw,
                                          int64_t c, cudaStream_t stream) {
  return launch_over(n * c, stream, gap_forward_kernel<__nv_bfloat16>, as_bf16(x), as_bf16(y), n,
                     hw, c);
}

// ----------------------------------------------------------------------------
// Global average pooling backward (NHWC): every position of an image gets dy / HW.

template <typename T>
static __global__ void gap_backward_kernel(const T* __restrict__ dy, T* __restrict__ dx, int64_t n,
                                           int64_t hw, int64_t c) {
  const float inv = 1.f / static_cast<float>(hw);
  DPT_GRID_STRIDE(i, n * hw * c) store(widen(dy[(i / (hw * c)) * c + i % c]) * inv, dx[i]);
}

cudaError_t launch_global_avgpool_backward(const float* dy, float* dx, int64_t n, int64_t hw,
                                           int64_t c, cudaStream_t stream) {
  return launch_over(n * hw * c, stream, gap_backward_kernel<float>, dy, dx, n, hw, c);
}

cudaError_t launch_global_avgpool_backward(const uint16_t* dy, uint16_t* dx, int64_t n, int64_t hw,
                                           int64_t c, cudaStream_t stream) {
  return launch_over(n * hw * c, stream, gap_backward_kernel<__nv_bfloat16>, as_bf16(dy),
                     as_bf16(dx), n, hw, c);
}

}  // namespace dpt::cuda
