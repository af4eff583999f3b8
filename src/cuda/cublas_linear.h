// GPU Linear through cuBLAS, and the bias helpers convolution shares: the same semantics as
// linear_forward / linear_backward / column_sums in src/cpu/ops.h, on device pointers.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/gpu_context.h"

namespace dpt::gpu {

// y[n,out] = x[n,in] * W[out,in]^T + b (b may be null).
void linear_forward(GpuContext& g, const float* x, const float* w, const float* b, float* y,
                    int64_t n, int64_t in, int64_t out);
// dx (nullable) = dy W; dW (+)= dy^T x; db (nullable) (+)= sum_n dy. accumulate: add into dW/db.
void linear_backward(GpuContext& g, const float* x, const float* w, const float* dy, float* dx,
                     float* dw, float* db, int64_t n, int64_t in, int64_t out, bool accumulate);
// The same on bf16 activations (x, y, dy, dx; W, b, dW, db fp32): GEMMs on bf16 tensor cores with
// fp32 accumulation, W taken as a bf16 copy (cuBLAS has no bf16 x fp32 product), so y and dx differ
// from the CPU's fp32 W by W's rounding on top of the summation order; dW from the exact bf16
// operands into fp32. y = bf16(acc + b), one rounding like the CPU's (no bias: bf16(acc)); dx =
// bf16(acc); db (+)= column sums of dy in double.
void linear_forward(GpuContext& g, const __nv_bfloat16* x, const float* w, const float* b,
                    __nv_bfloat16* y, int64_t n, int64_t in, int64_t out);
void linear_backward(GpuContext& g, const __nv_bfloat16* x, const float* w, const __nv_bfloat16* dy,
                     __nv_bfloat16* dx, float* dw, float* db, int64_t n, int64_t in, int64_t out,
                     bool accumulate);

// y[r, c] += b[c] over a row-major [rows, cols] y (the bias of Linear and of NHWC convolution).
void add_row_bias(GpuContext& g, float* y, const float* b, int64_t rows, int64_t cols);
// out[c] (+)= sum over rows of a[r, c], accumulated in double in a fixed order (bit-reproducible).
void column_sums(GpuContext& g, const float* a, int64_t rows, int64_t cols, float* out,
                 bool accumulate);
// The same on bf16 activations (the graph convolution's bf16 entry points): y = bf16(y + b[c]),
// and column sums of the bf16 values into fp32 out.
void add_row_bias(GpuContext& g, __nv_bfloat16* y, const float* b, int64_t rows, int64_t cols);
void column_sums(GpuContext& g, const __nv_bfloat16* a, int64_t rows, int64_t cols, float* out,
                 bool accumulate);

}  // namespace dpt::gpu
