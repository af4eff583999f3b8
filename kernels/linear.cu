// Linear/convolution bias helpers and their launchers (see linear.cuh).
#include "channel_reduce.cuh"
#include "linear.cuh"

namespace dpt::cuda {

// ----------------------------------------------------------------------------
// Column sums (bias gradients): the fixed-order double reduction of channel_reduce.cuh.

namespace {
struct ColumnTerm {
  const float* a;
  int64_t cols;
  __device__ void operator()(int64_t r, int64_t ch, double* acc) const { acc[0] += a[r * cols + ch]; }
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
  return launch_channel_reduce<1>(rows, cols, ColumnTerm{a, cols}, ColumnOut{out, accumulate}, scratch, stream);
}

}  // namespace dpt::cuda
