// Activation kernels and their launchers (see activation.cuh): ReLU forward/backward and the
// residual add, element-wise grid-stride passes, each templated on the element type (storage.cuh).
#include "activation.cuh"
#include "launch_util.cuh"
#include "relu.cuh"
#include "storage.cuh"

namespace dpt::cuda {

// ----------------------------------------------------------------------------
// ReLU forward.

template <typename T>
static __global__ void relu_forward_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  DPT_GRID_STRIDE(i, n) store(relu_value(widen(x[i])), y[i]);
}

cudaError_t launch_relu_forward(const float* x, float* y, int64_t n, cudaStream_t stream) {
  return launch_over(n, stream, relu_forward_kernel<float>, x, y, n);
}

cudaError_t launch_relu_forward(const uint16_t* x, uint16_t* y, int64_t n, cudaStream_t stream) {
  return launch_over(n, stream, relu_forward_kernel<__nv_bfloat16>, as_bf16(x), as_bf16(y), n);
}

// ----------------------------------------------------------------------------
// ReLU backward.

template <typename T>
static __global__ void relu_backward_kernel(const T* __restrict__ y, const T* __restrict__ dy,
                                            T* __restrict__ dx, int64_t n) {
  DPT_GRID_STRIDE(i, n) store(relu_grad(widen(y[i]), widen(dy[i])), dx[i]);
}

cudaError_t launch_relu_backward(const float* y, const float* dy, float* dx, int64_t n,
                                 cudaStream_t stream) {
  return launch_over(n, stream, relu_backward_kernel<float>, y, dy, dx, n);
}

cudaError_t launch_relu_backward(const uint16_t* y, const uint16_t* dy, uint16_t* dx, int64_t n,
                                 cudaStream_t stream) {
  return launch_over(n, stream, relu_backward_kernel<__nv_bfloat16>, as_bf16(y), as_bf16(dy),
                     as_bf16(dx), n);
}

// ----------------------------------------------------------------------------
// Residual add, optionally fused with ReLU.

template <typename T>
static __global__ void add_kernel(const T* __restrict__ a, const T* __restrict__ b,
                                  T* __restrict__ y, int64_t n, bool relu) {
  DPT_GRID_STRIDE(i, n) {
    const float v = widen(a[i]) + widen(b[i]);
    store(relu ? relu_value(v) : v, y[i]);
  }
}

cudaError_t launch_add(const float* a, const float* b, float* y, int64_t n, bool relu,
                       cudaStream_t stream) {
  return launch_over(n, stream, add_kernel<float>, a, b, y, n, relu);
}

cudaError_t launch_add(const uint16_t* a, const uint16_t* b, uint16_t* y, int64_t n, bool relu,
                       cudaStream_t stream) {
  return launch_over(n, stream, add_kernel<__nv_bfloat16>, as_bf16(a), as_bf16(b), as_bf16(y), n,
                     relu);
}

}  // namespace dpt::cuda
