// Precision casts on the GPU: fp32 <-> bf16 for --precision bf16, and fp32 <-> bf16 / fp16 for
// gradients sent compressed (--grad-dtype, src/cuda/gpu_reducer.cc). 16-bit values travel as their
// bit patterns (uint16_t), so no CUDA half types cross this header.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dpt::cuda {

// ----------------------------------------------------------------------------
// fp32 -> 16-bit on the GPU: the operands of --precision bf16 GEMMs, made in the workspace from
// fp32 activations and master weights (and the master weights' bf16 copies next to bf16
// activations); gradient buckets before their all-reduce; Backend::convert to bf16.

// y[i] = bf16(x[i]), rounded to nearest even; overflow gives infinity; NaN gives the canonical NaN
// 0x7fff (dpt::bf16_from_float keeps the sign and payload: equal values, other NaN bits). Returns
// the launch status.
cudaError_t launch_to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream);
// y[i] = fp16(x[i]) (IEEE binary16), rounded to nearest even, subnormals kept, |x| >= 65520 gives
// infinity; NaN gives a NaN. Returns the launch status.
cudaError_t launch_to_f16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream);

// ----------------------------------------------------------------------------
// 16-bit -> fp32 on the GPU: all-reduced gradient buckets back into the gradient buffer, bf16
// activations widened (Backend::convert, the legacy convolution's fp32 copies); exact: every bf16
// and fp16 value is an fp32 value.

// y[i] = float(x[i]), or y[i] += float(x[i]) when accumulate (gradient accumulation in fp32).
// Returns the launch status.
cudaError_t launch_from_bf16(const uint16_t* x, float* y, int64_t n, bool accumulate,
                             cudaStream_t stream);
cudaError_t launch_from_f16(const uint16_t* x, float* y, int64_t n, bool accumulate,
                            cudaStream_t stream);

}  // namespace dpt::cuda
