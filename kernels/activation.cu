// Activation kernels and their launchers (see activation.cuh): ReLU forward/backward and the
// residual add, element-wise grid-stride passes.
#include "activation.cuh"
#include "launch_util.cuh"
#include "relu.cuh"

namespace dpt::cuda {

// ----------------------------------------------------------------------------
// ReLU forward.

static __global__ void relu_forward_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  DPT_GRID_STRIDE(i, n) y[i] = relu_value(x[i]);
}

cudaError_t launch_relu_forward(const float* x, float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  relu_forward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, y, n);
  return cudaGetLastError();
}

// ----------------------------------------------------------------------------
// ReLU backward.

static __global__ void relu_backward_kernel(const float* __restrict__ y, const float* __restrict__ dy,
                                            float* __restrict__ dx, int64_t n) {
  DPT_GRID_STRIDE(i, n) dx[i] = relu_grad(y[i], dy[i]);
}

cudaError_t launch_relu_backward(const float* y, const float* dy, float* dx, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  relu_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(y, dy, dx, n);
  return cudaGetLastError();
}

// ----------------------------------------------------------------------------
// Residual add, optionally fused with ReLU.

static __global__ void add_kernel(const float* __restrict__ a, const float* __restrict__ b,
                                  float* __restrict__ y, int64_t n, bool relu) {
  DPT_GRID_STRIDE(i, n) {
    const float v = a[i] + b[i];
    y[i] = relu ? relu_value(v) : v;
  }
}

cudaError_t launch_add(const float* a, const float* b, float* y, int64_t n, bool relu, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(a, b, y, n, relu);
  return cudaGetLastError();
}

}  // namespace dpt::cuda
