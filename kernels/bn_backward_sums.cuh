// BatchNorm backward sums on the GPU (same semantics as cpu::bn_backward_sums), plus this
// replica's gamma/beta gradients, which the CPU layer derives from the same sums.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dpt::cuda {

// Doubles of scratch launch_bn_backward_sums needs for this shape.
int64_t bn_backward_sums_scratch_elems(int64_t m, int64_t c);

// Over an [M, C] view, in double and a fixed order:
//   sum_dy[c] = sum_r dy, sum_dy_xhat[c] = sum_r dy * xhat with xhat = (x - mean) * invstd (float);
//   dgamma[c] = float((accumulate ? dgamma : 0) + sum_dy_xhat), dbeta likewise with sum_dy
//   (each nullable). The parameter gradients are the local sums, taken before any all-reduce.
cudaError_t launch_bn_backward_sums(const float* x, const float* dy, const float* mean, const float* invstd,
                                    int64_t m, int64_t c, double* sum_dy, double* sum_dy_xhat, float* dgamma,
                                    float* dbeta, bool accumulate, double* scratch, cudaStream_t stream);

}  // namespace dpt::cuda
