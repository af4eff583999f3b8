// BatchNorm forward sums: the fixed-order double reduction of channel_reduce.cuh.
#include "bn_sums.cuh"
#include "channel_reduce.cuh"

namespace dpt::cuda {

namespace {
struct SumsTerm {
  const float* x;
  int64_t c;
  __device__ void operator()(int64_t r, int64_t ch, double* acc) const {
    const double v = x[r * c + ch];
    acc[0] += v;
    acc[1] += v * v;
  }
};
struct SumsOut {
  double *sum, *sumsq, *count;
  double m;
  __device__ void operator()(int64_t ch, const double* total) const {
    sum[ch] = total[0];
    sumsq[ch] = total[1];
    if (count && ch == 0) *count = m;
  }
};
}  // namespace

int64_t bn_sums_scratch_elems(int64_t m, int64_t c) { return reduce_scratch_elems(m, c, 2); }

cudaError_t launch_bn_sums(const float* x, int64_t m, int64_t c, double* sum, double* sumsq, double* count,
                           double* scratch, cudaStream_t stream) {
  return launch_channel_reduce<2>(m, c, SumsTerm{x, c}, SumsOut{sum, sumsq, count, static_cast<double>(m)},
                                  scratch, stream);
}

}  // namespace dpt::cuda
