// Loss and correct-count totals: one block of 256 threads, strided partial sums, then a fixed
// tree in shared memory (no atomics, so every run adds in the same order).
#include "launch_util.cuh"
#include "loss_sums.cuh"

namespace dpt::cuda {

static __global__ void loss_sums_kernel(const float* __restrict__ loss, const int32_t* __restrict__ correct,
                                        int64_t n, double* __restrict__ out, bool accumulate) {
  __shared__ double s_loss[kThreads], s_hits[kThreads];
  double l = 0.0, h = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    l += static_cast<double>(loss[i]);
    h += static_cast<double>(correct[i]);
  }
  s_loss[threadIdx.x] = l;
  s_hits[threadIdx.x] = h;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half >>= 1) {
    if (threadIdx.x < half) {
      s_loss[threadIdx.x] += s_loss[threadIdx.x + half];
      s_hits[threadIdx.x] += s_hits[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    out[0] = (accumulate ? out[0] : 0.0) + s_loss[0];
    out[1] = (accumulate ? out[1] : 0.0) + s_hits[0];
  }
}

cudaError_t launch_loss_sums(const float* loss, const int32_t* correct, int64_t n, double* out, bool accumulate,
                             cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  // n == 0 still runs: it writes zeros (or leaves the totals) like an empty CPU batch would.
  loss_sums_kernel<<<1, kThreads, 0, stream>>>(loss, correct, n, out, accumulate);
  return cudaGetLastError();
}

}  // namespace dpt::cuda
