// Pooling kernels and their launchers (see pooling.cuh): AvgPool2d, MaxPool2d and global average
// pooling on NHWC tensors, element-wise grid-stride passes without atomics, each templated on the
// element type (storage.cuh).
#include <initializer_list>
#include <type_traits>

#include "launch_util.cuh"
#include "pooling.cuh"
#include "relu.cuh"
#include "storage.cuh"
#include "vec_rows.cuh"

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
// MaxPool2d (NHWC). A thread takes V adjacent channels of one pixel: one element (V = 1), or 16
// bytes (8 bf16 or 4 fp32) where the channel count is a multiple of that and the tensors are
// 16-byte aligned (vec_fits: every torchvision ResNet, whose stem pools 64 channels). Index
// arithmetic is in I: 32 bits where every index and the grid stride fit, else 64. Why: with one
// element per thread and 64-bit division the backward recomputed up to 4 windows of 9 taps per
// element and took 13.4 ms at ResNet-50's stem (256 x 112 x 112 x 64 bf16) on an H100, one fifth of
// the step, and the forward 1.17 ms (ncu, 2026-11-27); the bandwidth bound is about 0.3 ms for
// both. Each lane's arithmetic is the one-element form's (the same window walk, winner rule and
// sum order), so the bits do not depend on V or I.

template <typename I>
struct PoolGeom {
  I n, h, w, c, oh, ow;
  int k, s, pad;
};

// Grid-stride loop over [0, n) in I (launch_over sizes the grid; with_lanes checks that n plus
// the stride fits in I).
#define DPT_GRID_STRIDE_IN(I, i, n)                                                               \
  for (I i =                                                                                      \
           static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x); \
       i < (n); i += static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x))

// The winners of output pixel (b, r, q)'s window for channels ch .. ch + V - 1 by the CPU's rule
// (cpu::max_window): the first maximum in row-major order, a NaN over any number. m: the maxima;
// at: the winners as pixels of the image (y * w + x).
template <typename T, int V, typename I>
__device__ __forceinline__ void max_winners(const T* __restrict__ x, const PoolGeom<I>& p, I b, I r,
                                            I q, I ch, float (&m)[V], I (&at)[V]) {
  const I h0 = r * p.s - p.pad, w0 = q * p.s - p.pad;
  const I hs = h0 > 0 ? h0 : 0, he = h0 + p.k < p.h ? h0 + p.k : p.h;
  const I ws = w0 > 0 ? w0 : 0, we = w0 + p.k < p.w ? w0 + p.k : p.w;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    m[j] = -INFINITY;
    at[j] = hs * p.w + ws;
  }
  for (I y = hs; y < he; ++y)
    for (I xx = ws; xx < we; ++xx) {
      const Lanes<T, V> v = load_lanes<T, V>(x + ((b * p.h + y) * p.w + xx) * p.c + ch);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float f = widen(v.v[j]);
        if (f > m[j] || f != f) {
          m[j] = f;
          at[j] = y * p.w + xx;
        }
      }
    }
}

// Forward: a thread per output pixel and V channels, channels fastest for coalescing.
template <typename T, int V, typename I>
static __global__ void maxpool_forward_kernel(const T* __restrict__ x, T* __restrict__ y,
                                              PoolGeom<I> p) {
  const I groups = p.c / V;
  DPT_GRID_STRIDE_IN(I, i, p.n * p.oh * p.ow * groups) {
    const I g = i % groups, o = i / groups;  // o: the output pixel (b, r, q)
    const I q = o % p.ow, r = (o / p.ow) % p.oh, b = o / (p.ow * p.oh);
    float m[V];
    I at[V];
    max_winners<T, V>(x, p, b, r, q, g * V, m, at);
    Lanes<T, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) store(m[j], out.v[j]);
    store_lanes<T, V>(out, y + o * p.c + g * V);
  }
}

// Backward: a thread per input pixel and V channels gathers the gradients of the windows covering
// it that it wins (their winners recomputed), in row-major output order as the CPU's scatter adds
// them, so the sums are the CPU's bit for bit and no atomics are needed.
template <typename T, int V, typename I>
static __global__ void maxpool_backward_kernel(const T* __restrict__ x, const T* __restrict__ dy,
                                               T* __restrict__ dx, PoolGeom<I> p) {
  const I groups = p.c / V;
  DPT_GRID_STRIDE_IN(I, i, p.n * p.h * p.w * groups) {
    const I g = i % groups, e = i / groups;  // e: the input pixel (b, py, px)
    const I px = e % p.w, py = (e / p.w) % p.h, b = e / (p.w * p.h), me = py * p.w + px;
    // Output rows r with r*s - pad <= py < r*s - pad + k, and likewise for columns.
    const I yp = py + p.pad, xp = px + p.pad;
    const I r0 = yp >= p.k ? (yp - p.k) / p.s + 1 : 0,
            r1 = yp / p.s < p.oh - 1 ? yp / p.s : p.oh - 1;
    const I c0 = xp >= p.k ? (xp - p.k) / p.s + 1 : 0,
            c1 = xp / p.s < p.ow - 1 ? xp / p.s : p.ow - 1;
    float acc[V];
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] = 0.f;
    for (I r = r0; r <= r1; ++r)
      for (I q = c0; q <= c1; ++q) {
        float m[V];
        I at[V];
        max_winners<T, V>(x, p, b, r, q, g * V, m, at);
        bool won = false;
#pragma unroll
        for (int j = 0; j < V; ++j) won |= at[j] == me;
        if (!won) continue;
        const Lanes<T, V> d = load_lanes<T, V>(dy + ((b * p.oh + r) * p.ow + q) * p.c + g * V);
#pragma unroll
        for (int j = 0; j < V; ++j)
          if (at[j] == me) acc[j] += widen(d.v[j]);
      }
    Lanes<T, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) store(acc[j], out.v[j]);
    store_lanes<T, V>(out, dx + e * p.c + g * V);
  }
}

// pooling.cuh: a test's switch to the 64-bit index forms, which only tensors of 2^31 elements
// would reach otherwise.
static bool g_maxpool_wide_for_tests = false;
void set_maxpool_wide_indices_for_tests(bool wide) { g_maxpool_wide_for_tests = wide; }

// launch(lanes, index): the kernel instantiated on V (std::integral_constant) and I (a value of
// that type) for an [n, h, w, c] input and its [n, oh, ow, c] output, read and written through
// ptrs: 16 bytes a thread where vec_fits, 32-bit indices where both element counts and the
// largest grid's stride stay below 2^31.
template <typename T, typename Launch>
static cudaError_t with_lanes(int64_t n, int64_t h, int64_t w, int64_t c, int64_t oh, int64_t ow,
                              std::initializer_list<const void*> ptrs, Launch launch) {
  constexpr int kV = Vec16<T>::kN;
  const int64_t most = n * c * (h * w > oh * ow ? h * w : oh * ow);
  const bool narrow =
      !g_maxpool_wide_for_tests && most + int64_t{65535} * kThreads < (int64_t{1} << 31);
  if (vec_fits<T>(c, ptrs))
    return narrow ? launch(std::integral_constant<int, kV>{}, int32_t{})
                  : launch(std::integral_constant<int, kV>{}, int64_t{});
  return narrow ? launch(std::integral_constant<int, 1>{}, int32_t{})
                : launch(std::integral_constant<int, 1>{}, int64_t{});
}

template <typename I>
static PoolGeom<I> pool_geom(int64_t n, int64_t h, int64_t w, int64_t c, int k, int s, int pad) {
  return {static_cast<I>(n),
          static_cast<I>(h),
          static_cast<I>(w),
          static_cast<I>(c),
          static_cast<I>((h + 2 * pad - k) / s + 1),
          static_cast<I>((w + 2 * pad - k) / s + 1),
          k,
          s,
          pad};
}

template <typename T>
static cudaError_t maxpool_forward(const T* x, T* y, int64_t n, int64_t h, int64_t w, int64_t c,
                                   int k, int s, int pad, cudaStream_t stream) {
  const int64_t oh = (h + 2 * pad - k) / s + 1, ow = (w + 2 * pad - k) / s + 1;
  return with_lanes<T>(n, h, w, c, oh, ow, {x, y}, [&](auto lanes, auto index) {
    constexpr int V = decltype(lanes)::value;
    using I = decltype(index);
    return launch_over(n * oh * ow * (c / V), stream, maxpool_forward_kernel<T, V, I>, x, y,
                       pool_geom<I>(n, h, w, c, k, s, pad));
  });
}

template <typename T>
static cudaError_t maxpool_backward(const T* x, const T* dy, T* dx, int64_t n, int64_t h, int64_t w,
                                    int64_t c, int k, int s, int pad, cudaStream_t stream) {
  const int64_t oh = (h + 2 * pad - k) / s + 1, ow = (w + 2 * pad - k) / s + 1;
  return with_lanes<T>(n, h, w, c, oh, ow, {x, dy, dx}, [&](auto lanes, auto index) {
    constexpr int V = decltype(lanes)::value;
    using I = decltype(index);
    return launch_over(n * h * w * (c / V), stream, maxpool_backward_kernel<T, V, I>, x, dy, dx,
                       pool_geom<I>(n, h, w, c, k, s, pad));
  });
}

cudaError_t launch_maxpool_forward(const float* x, float* y, int64_t n, int64_t h, int64_t w,
                                   int64_t c, int k, int s, int pad, cudaStream_t stream) {
  return maxpool_forward(x, y, n, h, w, c, k, s, pad, stream);
}

cudaError_t launch_maxpool_forward(const uint16_t* x, uint16_t* y, int64_t n, int64_t h, int64_t w,
                                   int64_t c, int k, int s, int pad, cudaStream_t stream) {
  return maxpool_forward(as_bf16(x), as_bf16(y), n, h, w, c, k, s, pad, stream);
}

cudaError_t launch_maxpool_backward(const float* x, const float* dy, float* dx, int64_t n,
                                    int64_t h, int64_t w, int64_t c, int k, int s, int pad,
                                    cudaStream_t stream) {
  return maxpool_backward(x, dy, dx, n, h, w, c, k, s, pad, stream);
}

cudaError_t launch_maxpool_backward(const uint16_t* x, const uint16_t* dy, uint16_t* dx, int64_t n,
                                    int64_t h, int64_t w, int64_t c, int k, int s, int pad,
                                    cudaStream_t stream) {
  return maxpool_backward(as_bf16(x), as_bf16(dy), as_bf16(dx), n, h, w, c, k, s, pad, stream);
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
