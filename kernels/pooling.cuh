// Pooling layers on the GPU (NHWC): AvgPool2d forward/backward, optionally fused with the ReLU
// before the pool, MaxPool2d forward/backward, and global average pooling forward/backward. Each on
// fp32 or on bf16 activations (uint16_t bit patterns, as in precision.cuh): every bf16 value
// widened, the fp32 computation, each result rounded to nearest even (the CPU's bf16 overloads'
// bits).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dpt::cuda {

// ----------------------------------------------------------------------------
// AvgPool2d forward on NHWC tensors, optionally fused with the ReLU before it (same semantics as
// cpu::avgpool_forward and cpu::relu_avgpool_forward).

// NHWC k x k window, stride s, no padding, floor mode. relu: pool max(x, 0) instead of x (LeNet's
// ReLU + pool in one pass; the ReLU output is never written).
cudaError_t launch_avgpool_forward(const float* x, float* y, int64_t n, int64_t h, int64_t w,
                                   int64_t c, int k, int s, bool relu, cudaStream_t stream);
cudaError_t launch_avgpool_forward(const uint16_t* x, uint16_t* y, int64_t n, int64_t h, int64_t w,
                                   int64_t c, int k, int s, bool relu, cudaStream_t stream);

// ----------------------------------------------------------------------------
// AvgPool2d backward on NHWC tensors, optionally fused with the ReLU before the pool (same
// semantics as cpu::avgpool_backward and cpu::relu_avgpool_backward).

// dx is overwritten; positions no window covers get 0. relu_x (nullable): the fused layer's input;
// where it is not > 0 the gradient is 0 (the ReLU's mask, taken from its input, not its output).
cudaError_t launch_avgpool_backward(const float* dy, const float* relu_x, float* dx, int64_t n,
                                    int64_t h, int64_t w, int64_t c, int k, int s,
                                    cudaStream_t stream);
cudaError_t launch_avgpool_backward(const uint16_t* dy, const uint16_t* relu_x, uint16_t* dx,
                                    int64_t n, int64_t h, int64_t w, int64_t c, int k, int s,
                                    cudaStream_t stream);

// ----------------------------------------------------------------------------
// MaxPool2d forward and backward on NHWC tensors (same semantics as cpu::maxpool_forward and
// cpu::maxpool_backward: padding never wins, the first maximum in row-major order or a NaN wins).

cudaError_t launch_maxpool_forward(const float* x, float* y, int64_t n, int64_t h, int64_t w,
                                   int64_t c, int k, int s, int pad, cudaStream_t stream);
cudaError_t launch_maxpool_forward(const uint16_t* x, uint16_t* y, int64_t n, int64_t h, int64_t w,
                                   int64_t c, int k, int s, int pad, cudaStream_t stream);
// dx is overwritten: each output's gradient at its window's winner, recomputed from x.
cudaError_t launch_maxpool_backward(const float* x, const float* dy, float* dx, int64_t n,
                                    int64_t h, int64_t w, int64_t c, int k, int s, int pad,
                                    cudaStream_t stream);
cudaError_t launch_maxpool_backward(const uint16_t* x, const uint16_t* dy, uint16_t* dx, int64_t n,
                                    int64_t h, int64_t w, int64_t c, int k, int s, int pad,
                                    cudaStream_t stream);
// Tests only: the max-pooling launchers use 64-bit indices even where 32 bits would do (wide), so
// the two index forms can be compared on small tensors. Not synchronised: set it between launches.
void set_maxpool_wide_indices_for_tests(bool wide);

// ----------------------------------------------------------------------------
// Global average pooling forward (NHWC).

// [N, HW, C] -> [N, C], mean over HW.
cudaError_t launch_global_avgpool_forward(const float* x, float* y, int64_t n, int64_t hw,
                                          int64_t c, cudaStream_t stream);
cudaError_t launch_global_avgpool_forward(const uint16_t* x, uint16_t* y, int64_t n, int64_t hw,
                                          int64_t c, cudaStream_t stream);

// ----------------------------------------------------------------------------
// Global average pooling backward (NHWC).

// dx[n, p, c] = dy[n, c] / HW.
cudaError_t launch_global_avgpool_backward(const float* dy, float* dx, int64_t n, int64_t hw,
                                           int64_t c, cudaStream_t stream);
cudaError_t launch_global_avgpool_backward(const uint16_t* dy, uint16_t* dx, int64_t n, int64_t hw,
                                           int64_t c, cudaStream_t stream);

}  // namespace dpt::cuda
