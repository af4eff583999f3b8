// Linear/convolution bias helpers and their launchers (see linear.cuh).
#include <cuda_bf16.h>

#include "channel_reduce.cuh"
#include "linear.cuh"

namespace dpt::cuda {

// ----------------------------------------------------------------------------
// Column sums (bias gradients): the fixed-order double reduction of channel_reduce.cuh.

namespace {
__device__ __forceinline__ double widen(float x) { return x; }
__device__ __forceinline__ double widen(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
struct ColumnTerm {
  const T* a;
  int64_t cols;
  __device__ void operator()(int64_t r, int64_t ch, double* acc) const { acc[0] += widen(a[r * cols + ch]); }
};
struct ColumnOut {
  float* out;
  bool accumulate;
  __device__ void operator()(int64_t ch, const double* total) const {
    out[ch] = static_cast<float>(accumulate ? out[ch] + total[0] : total[0]);
  }
};
}  // namespace

int64_t column_sums_scratch_elems(int64_t rows, int64_t cols) { return reduce_scratch_elems(rows, cols, 1); }

cudaError_t launch_column_sums(const float* a, int64_t rows, int64_t cols, float* out, bool accumulate,
                               double* scratch, cudaStream_t stream) {
  return launch_channel_reduce<1>(rows, cols, ColumnTerm<float>{a, cols}, ColumnOut{out, accumulate}, scratch,
                                  stream);
}

cudaError_t launch_column_sums_bf16(const uint16_t* a, int64_t rows, int64_t cols, float* out, bool accumulate,
                                    double* scratch, cudaStream_t stream) {
  const auto* h = reinterpret_cast<const __nv_bfloat16*>(a);
  return launch_channel_reduce<1>(rows, cols, ColumnTerm<__nv_bfloat16>{h, cols}, ColumnOut{out, accumulate},
                                  scratch, stream);
}

// ----------------------------------------------------------------------------
// Bias addition on bf16 rows: the per-channel pass of channel_reduce.cuh (the bias in a register).

namespace {
__global__ void add_row_bias_bf16_kernel(__nv_bfloat16* __restrict__ y, const float* __restrict__ b, int64_t rows,
                                         int64_t cols) {
  const int64_t ch = blockIdx.x * static_cast<int64_t>(kReduceLanes) + threadIdx.x;
  if (ch >= cols) return;
  const float bias = b[ch];
  for (int64_t r = blockIdx.y * static_cast<int64_t>(kReduceRowLanes) + threadIdx.y; r < rows;
       r += static_cast<int64_t>(gridDim.y) * kReduceRowLanes) {
    __nv_bfloat16& v = y[r * cols + ch];
    v = __float2bfloat16_rn(__bfloat162float(v) + bias);
  }
}
}  // namespace

cudaError_t launch_add_row_bias_bf16(uint16_t* y, const float* b, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (cols > kMaxChannels) return cudaErrorInvalidValue;
  add_row_bias_bf16_kernel<<<rows_grid(rows, cols), dim3(kReduceLanes, kReduceRowLanes), 0, stream>>>(
      reinterpret_cast<__nv_bfloat16*>(y), b, rows, cols);
  return cudaGetLastError();
}

}  // namespace dpt::cuda
