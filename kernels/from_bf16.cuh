// bf16 -> fp32 on the GPU: results of --precision bf16 convolutions back into fp32 activations and
// gradients (exact: every bf16 value is an fp32 value). bf16 travels as its 16-bit pattern.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dpt::cuda {

// y[i] = float(x[i]), or y[i] += float(x[i]) when accumulate (gradient accumulation in fp32).
// Returns the launch status.
cudaError_t launch_from_bf16(const uint16_t* x, float* y, int64_t n, bool accumulate, cudaStream_t stream);

}  // namespace dpt::cuda
