// BatchNorm forward statistics on the GPU (same semantics as cpu::bn_sums): per-channel sum and
// sum of squares of an [M, C] view, in double.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dpt::cuda {

// Doubles of scratch launch_bn_sums needs for this shape.
int64_t bn_sums_scratch_elems(int64_t m, int64_t c);

// sum[c] = sum_r x[r, c], sumsq[c] = sum_r x[r, c]^2 (overwritten), in double and in a fixed order.
// count (nullable, one device double) = m, so the three can be all-reduced together for
// synchronised BatchNorm exactly like the CPU layer's [sum, sumsq, count] buffer.
cudaError_t launch_bn_sums(const float* x, int64_t m, int64_t c, double* sum, double* sumsq, double* count,
                           double* scratch, cudaStream_t stream);

}  // namespace dpt::cuda
