// fp32 -> bf16 on the GPU: the operands of --precision bf16 convolutions and GEMMs, made in the
// workspace from fp32 activations and master weights. bf16 travels as its 16-bit pattern
// (uint16_t), so no CUDA half types cross this header.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dpt::cuda {

// y[i] = bf16(x[i]), rounded to nearest even (NaN stays NaN). Returns the launch status.
cudaError_t launch_to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream);

}  // namespace dpt::cuda
