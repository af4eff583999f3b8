// The ReLU's two rules on the device, the CPU's (src/cpu/ops_loops.inc): one definition for the
// ReLU kernels, the residual add and BatchNorm's fused epilogue and masked backward, so the fused
// and the separate forms give the same bits (NaN and -0 included). Device code only (.cu files).
#pragma once

namespace dpt::cuda {

// Forward: max(v, 0) as x > 0 ? x : 0 (a NaN or -0 gives +0).
__device__ __forceinline__ float relu_value(float v) { return v > 0.f ? v : 0.f; }

// Backward through a ReLU whose output is y: dy where y > 0, else 0.
__device__ __forceinline__ float relu_grad(float y, float dy) { return y > 0.f ? dy : 0.f; }

}  // namespace dpt::cuda
