// Activation layers on the GPU: ReLU forward and backward, and the residual join (element-wise add,
// optionally fused with the block's final ReLU). Each on fp32 or on bf16 activations (uint16_t bit
// patterns, as in precision.cuh): a bf16 value is widened, the fp32 rule applied, the result
// rounded to nearest even (the CPU's bf16 overloads' bits).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dpt::cuda {

// ----------------------------------------------------------------------------
// ReLU forward on the GPU (same semantics as cpu::relu_forward).

// y = max(x, 0). Returns the launch status.
cudaError_t launch_relu_forward(const float* x, float* y, int64_t n, cudaStream_t stream);
cudaError_t launch_relu_forward(const uint16_t* x, uint16_t* y, int64_t n, cudaStream_t stream);

// ----------------------------------------------------------------------------
// ReLU backward on the GPU (same semantics as cpu::relu_backward).

// dx = dy where y > 0, else 0 (y: the forward output).
cudaError_t launch_relu_backward(const float* y, const float* dy, float* dx, int64_t n,
                                 cudaStream_t stream);
cudaError_t launch_relu_backward(const uint16_t* y, const uint16_t* dy, uint16_t* dx, int64_t n,
                                 cudaStream_t stream);

// ----------------------------------------------------------------------------
// Element-wise add (residual connections), optionally fused with ReLU.

// y = a + b, then max(y, 0) when relu (launch_relu_forward's rule: a NaN or -0 sum gives +0, as
// on the CPU).
cudaError_t launch_add(const float* a, const float* b, float* y, int64_t n, bool relu,
                       cudaStream_t stream);
cudaError_t launch_add(const uint16_t* a, const uint16_t* b, uint16_t* y, int64_t n, bool relu,
                       cudaStream_t stream);

}  // namespace dpt::cuda
