// Linear/convolution bias helpers and their launchers (see linear.cuh).
#include "channel_reduce.cuh"
#include "linear.cuh"
#include "storage.cuh"

namespace dpt::cuda {

// ----------------------------------------------------------------------------
// Column sums (bias gradients): the fixed-order double reduction of channel_reduce.cuh.

namespace {
template <typename T>
struct ColumnTerm {
  const T* a;
  int64_t cols;
  __device__ void operator()(int64_t r, int64_t ch, double* acc) const {
    acc[0] += widen(a[r * cols + ch]);
  }
};
struct ColumnOut {
  float* out;
  bool accumulate;
  __device__ void operator()(int64_t ch, const double* total) const {
    out[ch] = static_cast<float>(accumulate ? out[ch] + total[0] : total[0]);
  }
};
}  // namespace

int64_t column_sums_scratch_elems(int64_t rows, int64_t cols) {
  return reduce_scratch_elems(rows, cols, 1);
}

cudaError_t launch_column_sums(const float* a, int64_t rows, int64_t cols, float* out,
                               bool accumulate, double* scratch, cudaStream_t stream) {
  return launch_channel_reduce<1>(rows, cols, ColumnTerm<float>{a, cols},
                                  ColumnOut{out, accumulate}, scratch, stream);
}

cudaError_t launch_column_sums_bf16(const uint16_t* a, int64_t rows, int64_t cols, float* out,
                                    bool accumulate, double* scratch, cudaStream_t stream) {
  return launch_channel_reduce<1>(rows, cols, ColumnTerm<__nv_bfloat16>{as_bf16(a), cols},
                                  ColumnOut{out, accumulate}, scratch, stream);
}

// ----------------------------------------------------------------------------
// Bias addition into bf16 rows: the per-channel pass of channel_reduce.cuh (the bias in a
// register), reading the rows to add to as bf16 (in place) or fp32 (a GEMM's fp32 result).

namespace {
// No __restrict__ on acc and y: the in-place form passes the same rows as both.
template <typename In>
__global__ void add_row_bias_bf16_kernel(const In* acc, const float* __restrict__ b,
                                         __nv_bfloat16* y, int64_t rows, int64_t cols) {
  const int64_t ch = blockIdx.x * static_cast<int64_t>(kReduceLanes) + threadIdx.x;
  if (ch >= cols) return;
  const float bias = b[ch];
  for (int64_t r = blockIdx.y * static_cast<int64_t>(kReduceRowLanes) + threadIdx.y; r < rows;
       r += static_cast<int64_t>(gridDim.y) * kReduceRowLanes)
    store(widen(acc[r * cols + ch]) + bias, y[r * cols + ch]);
}

template <typename In>
cudaError_t add_row_bias_bf16(const In* acc, const float* b, __nv_bfloat16* y, int64_t rows,
                              int64_t cols, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (cols > kMaxChannels) return cudaErrorInvalidValue;
  add_row_bias_bf16_kernel<<<rows_grid(rows, cols), dim3(kReduceLanes, kReduceRowLanes), 0,
                             stream>>>(acc, b, y, rows, cols);
  return cudaGetLastError();
}
}  // namespace

cudaError_t launch_add_row_bias_bf16(uint16_t* y, const float* b, int64_t rows, int64_t cols,
                                     cudaStream_t stream) {
  return add_row_bias_bf16(as_bf16(static_cast<const uint16_t*>(y)), b, as_bf16(y), rows, cols,
                           stream);
}

cudaError_t launch_add_row_bias_bf16(const float* acc, const float* b, uint16_t* y, int64_t rows,
                                     int64_t cols, cudaStream_t stream) {
  return add_row_bias_bf16(acc, b, as_bf16(y), rows, cols, stream);
}

}  // namespace dpt::cuda
