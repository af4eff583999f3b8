// BatchNorm backward sums: the fixed-order double reduction of channel_reduce.cuh.
#include "bn_backward_sums.cuh"
#include "channel_reduce.cuh"

namespace dpt::cuda {

namespace {
struct BackwardTerm {
  const float *x, *dy, *mean, *invstd;
  int64_t c;
  __device__ void operator()(int64_t r, int64_t ch, double* acc) const {
    const float g = dy[r * c + ch];
    acc[0] += g;
    acc[1] += static_cast<double>(g) * ((x[r * c + ch] - mean[ch]) * invstd[ch]);
  }
};
struct BackwardOut {
  double *sum_dy, *sum_dy_xhat;
  float *dgamma, *dbeta;
  bool accumulate;
  __device__ void operator()(int64_t ch, const double* total) const {
    sum_dy[ch] = total[0];
    sum_dy_xhat[ch] = total[1];
    if (dgamma) dgamma[ch] = static_cast<float>((accumulate ? dgamma[ch] : 0.0) + total[1]);
    if (dbeta) dbeta[ch] = static_cast<float>((accumulate ? dbeta[ch] : 0.0) + total[0]);
  }
};
}  // namespace

int64_t bn_backward_sums_scratch_elems(int64_t m, int64_t c) { return reduce_scratch_elems(m, c, 2); }

cudaError_t launch_bn_backward_sums(const float* x, const float* dy, const float* mean, const float* invstd,
                                    int64_t m, int64_t c, double* sum_dy, double* sum_dy_xhat, float* dgamma,
                                    float* dbeta, bool accumulate, double* scratch, cudaStream_t stream) {
  return launch_channel_reduce<2>(m, c, BackwardTerm{x, dy, mean, invstd, c},
                                  BackwardOut{sum_dy, sum_dy_xhat, dgamma, dbeta, accumulate}, scratch, stream);
}

}  // namespace dpt::cuda
