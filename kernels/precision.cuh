// Precision casts on the GPU for --precision bf16: fp32 <-> bf16. bf16 travels as its 16-bit
// pattern (uint16_t), so no CUDA half types cross this header.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dpt::cuda {

// ----------------------------------------------------------------------------
// fp32 -> bf16 on the GPU: the operands of --precision bf16 convolutions and GEMMs, made in the
// workspace from fp32 activations and master weights.

// y[i] = bf16(x[i]), rounded to nearest even (NaN stays NaN). Returns the launch status.
cudaError_t launch_to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream);

// ----------------------------------------------------------------------------
// bf16 -> fp32 on the GPU: results of --precision bf16 convolutions back into fp32 activations and
// gradients (exact: every bf16 value is an fp32 value).

// y[i] = float(x[i]), or y[i] += float(x[i]) when accumulate (gradient accumulation in fp32).
// Returns the launch status.
cudaError_t launch_from_bf16(const uint16_t* x, float* y, int64_t n, bool accumulate, cudaStream_t stream);

}  // namespace dpt::cuda
