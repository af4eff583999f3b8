// Activation kernels and their launchers (see activation.cuh): ReLU forward/backward and the
// residual add, element-wise passes of one map kernel, templated on the element type (storage.cuh).
#include "activation.cuh"
#include "launch_util.cuh"
#include "relu.cuh"
#include "storage.cuh"
#include "vec_rows.cuh"

namespace dpt::cuda {

// y[i] = f(a[i], b[i]) (b[i] read only when kTwo), each value widened and the result rounded once
// (storage.cuh). Where every pointer is 16-byte aligned, a thread takes 16 bytes (8 bf16, 4 fp32)
// per access and the last n % V elements follow one a thread; else one element a thread. Why: one
// 2-byte access a thread ran the residual add at about 2.3 TB/s, 544 us a call in ResNet-50's first
// stage on an H100 (ncu, 2026-11-27). Each element's arithmetic is f's either way: the same bits.
template <typename T, bool kTwo, class F>
static __global__ void map_kernel(const T* __restrict__ a, const T* __restrict__ b,
                                  T* __restrict__ y, int64_t n, bool vec, F f) {
  constexpr int V = Vec16<T>::kN;
  const int64_t groups = vec ? n / V : 0;
  DPT_GRID_STRIDE(g, groups) {
    const Vec16<T> va = load16(a + g * V);
    Vec16<T> vb{};
    if constexpr (kTwo) vb = load16(b + g * V);
    Vec16<T> out;
#pragma unroll
    for (int j = 0; j < V; ++j) store(f(widen(va.v[j]), kTwo ? widen(vb.v[j]) : 0.f), out.v[j]);
    store16(out, y + g * V);
  }
  DPT_GRID_STRIDE(i, n - groups * V) {
    const int64_t k = groups * V + i;
    store(f(widen(a[k]), kTwo ? widen(b[k]) : 0.f), y[k]);
  }
}

template <bool kTwo, typename T, class F>
static cudaError_t launch_map(const T* a, const T* b, T* y, int64_t n, F f, cudaStream_t stream) {
  // vec_fits with a count of V checks the pointers' alignment alone: n needs no multiple of V.
  const bool vec = vec_fits<T>(Vec16<T>::kN, {a, b, y});
  return launch_over(vec ? (n + Vec16<T>::kN - 1) / Vec16<T>::kN : n, stream,
                     map_kernel<T, kTwo, F>, a, b, y, n, vec, f);
}

struct ReluForward {
  __device__ float operator()(float x, float) const { return relu_value(x); }
};
struct ReluBackward {  // (y, dy): through the ReLU whose output is y
  __device__ float operator()(float y, float dy) const { return relu_grad(y, dy); }
};
struct Add {  // the residual add, optionally fused with ReLU
  bool relu;
  __device__ float operator()(float a, float b) const {
    const float v = a + b;
    return relu ? relu_value(v) : v;
  }
};

cudaError_t launch_relu_forward(const float* x, float* y, int64_t n, cudaStream_t stream) {
  return launch_map<false>(x, static_cast<const float*>(nullptr), y, n, ReluForward{}, stream);
}

cudaError_t launch_relu_forward(const uint16_t* x, uint16_t* y, int64_t n, cudaStream_t stream) {
  return launch_map<false>(as_bf16(x), static_cast<const __nv_bfloat16*>(nullptr), as_bf16(y), n,
                           ReluForward{}, stream);
}

cudaError_t launch_relu_backward(const float* y, const float* dy, float* dx, int64_t n,
                                 cudaStream_t stream) {
  return launch_map<true>(y, dy, dx, n, ReluBackward{}, stream);
}

cudaError_t launch_relu_backward(const uint16_t* y, const uint16_t* dy, uint16_t* dx, int64_t n,
                                 cudaStream_t stream) {
  return launch_map<true>(as_bf16(y), as_bf16(dy), as_bf16(dx), n, ReluBackward{}, stream);
}

cudaError_t launch_add(const float* a, const float* b, float* y, int64_t n, bool relu,
                       cudaStream_t stream) {
  return launch_map<true>(a, b, y, n, Add{relu}, stream);
}

cudaError_t launch_add(const uint16_t* a, const uint16_t* b, uint16_t* y, int64_t n, bool relu,
                       cudaStream_t stream) {
  return launch_map<true>(as_bf16(a), as_bf16(b), as_bf16(y), n, Add{relu}, stream);
}

}  // namespace dpt::cuda
