// Linear and convolution helpers on the GPU that cuBLAS/cuDNN do not cover: the bias gradients
// (column sums of a row-major matrix), and for bf16 activations (uint16_t bit patterns, as in
// precision.cuh) the bias addition too.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dpt::cuda {

// ----------------------------------------------------------------------------
// Column sums of a row-major [rows, cols] matrix on the GPU (same semantics as cpu::column_sums):
// the bias gradients of Linear and of convolution.

// Doubles of scratch launch_column_sums needs for this shape.
int64_t column_sums_scratch_elems(int64_t rows, int64_t cols);

// out[c] = float((accumulate ? out[c] : 0) + sum_r a[r, c]), the sum in double and in a fixed
// order (bit-reproducible). Returns the launch status.
cudaError_t launch_column_sums(const float* a, int64_t rows, int64_t cols, float* out,
                               bool accumulate, double* scratch, cudaStream_t stream);
// The same over bf16 values (the graph convolution's bf16 dy), each widened exactly.
cudaError_t launch_column_sums_bf16(const uint16_t* a, int64_t rows, int64_t cols, float* out,
                                    bool accumulate, double* scratch, cudaStream_t stream);

// y[r, c] = bf16(float(y[r, c]) + b[c]) over a row-major bf16 [rows, cols] y, rounded to nearest
// even (the bias of a bf16 convolution output). Returns the launch status.
cudaError_t launch_add_row_bias_bf16(uint16_t* y, const float* b, int64_t rows, int64_t cols,
                                     cudaStream_t stream);
// y[r, c] = bf16(acc[r, c] + b[c]) from an fp32 [rows, cols] acc (a GEMM's fp32 result): the bias
// of a bf16 Linear output with one rounding, as the CPU's fp32 addition then rounding gives.
cudaError_t launch_add_row_bias_bf16(const float* acc, const float* b, uint16_t* y, int64_t rows,
                                     int64_t cols, cudaStream_t stream);

}  // namespace dpt::cuda
