// Loss kernels and their launchers (see loss.cuh): softmax cross-entropy one warp per row, and its
// batch totals in one block with a fixed reduction order.
#include "launch_util.cuh"
#include "loss.cuh"

namespace dpt::cuda {

// ----------------------------------------------------------------------------
// Softmax cross-entropy: one block of 32 threads (a warp) per row; max and sum by warp shuffles.

static __global__ void softmax_xent_kernel(const float* __restrict__ logits,
                                           const int32_t* __restrict__ labels, int64_t n, int64_t k,
                                           float grad_scale, float smoothing,
                                           float* __restrict__ loss, int32_t* __restrict__ correct,
                                           float* __restrict__ dlogits) {
  const int64_t row = blockIdx.x;
  if (row >= n) return;
  const float* z = logits + row * k;
  const int lane = threadIdx.x;
  float mx = -INFINITY;
  int64_t arg = 0;
  for (int64_t j = lane; j < k; j += 32)
    if (z[j] > mx) mx = z[j], arg = j;
  for (int off = 16; off > 0; off >>= 1) {  // max with the lowest index on ties, like the CPU
    const float om = __shfl_down_sync(0xffffffffu, mx, off);
    const int64_t oa = __shfl_down_sync(0xffffffffu, arg, off);
    if (om > mx || (om == mx && oa < arg)) mx = om, arg = oa;
  }
  mx = __shfl_sync(0xffffffffu, mx, 0);
  arg = __shfl_sync(0xffffffffu, arg, 0);
  float se = 0.f;
  for (int64_t j = lane; j < k; j += 32) se += __expf(z[j] - mx);
  for (int off = 16; off > 0; off >>= 1) se += __shfl_down_sync(0xffffffffu, se, off);
  se = __shfl_sync(0xffffffffu, se, 0);
  // Every term is measured from the maximum, as torch's log_softmax: (z_j - mx) - log(se). The
  // log-sum-exp itself (log(se) + mx) would round log(se) to mx's units in float, moving each
  // probability by up to 0.4 % at logits of 1e5 and losing a tie's share altogether beyond 2^24.
  const float ls = logf(se);
  const int32_t y = labels[row];
  // Label smoothing (the CPU's formula): q = (1-e) onehot + e/k, exactly 1 and 0 when e = 0.
  float sz = 0.f;  // the sum of z_j - mx
  if (smoothing > 0.f) {
    for (int64_t j = lane; j < k; j += 32) sz += z[j] - mx;
    for (int off = 16; off > 0; off >>= 1) sz += __shfl_down_sync(0xffffffffu, sz, off);
  }
  if (lane == 0) {
    const float ny = ls - (z[y] - mx);  // -log p_y
    loss[row] = smoothing > 0.f
                    ? (1.f - smoothing) * ny + smoothing * (ls - sz / static_cast<float>(k))
                    : ny;
    correct[row] = arg == y;
  }
  const float off = smoothing / static_cast<float>(k), on = (1.f - smoothing) + off;
  if (dlogits)
    for (int64_t j = lane; j < k; j += 32)
      dlogits[row * k + j] = (__expf((z[j] - mx) - ls) - (j == y ? on : off)) * grad_scale;
}

cudaError_t launch_softmax_xent(const float* logits, const int32_t* labels, int64_t n, int64_t k,
                                float grad_scale, float label_smoothing, float* loss,
                                int32_t* correct, float* dlogits, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  // Any k: the warp strides over the row (k was capped at 1024, a block's threads, for no reason
  // this kernel has; a 2000-class run failed at its first step). One block per row: n < 2^31.
  if (k <= 0 || n > 2147483647LL) return cudaErrorInvalidValue;
  softmax_xent_kernel<<<static_cast<unsigned>(n), 32, 0, stream>>>(
      logits, labels, n, k, grad_scale, label_smoothing, loss, correct, dlogits);
  return cudaGetLastError();
}

// ----------------------------------------------------------------------------
// Loss and correct-count totals: one block of 256 threads, strided partial sums, then a fixed
// tree in shared memory (no atomics, so every run adds in the same order).

static __global__ void loss_sums_kernel(const float* __restrict__ loss,
                                        const int32_t* __restrict__ correct, int64_t n,
                                        double* __restrict__ out, bool accumulate) {
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

cudaError_t launch_loss_sums(const float* loss, const int32_t* correct, int64_t n, double* out,
                             bool accumulate, cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  // n == 0 still runs: it writes zeros (or leaves the totals) like an empty CPU batch would.
  loss_sums_kernel<<<1, kThreads, 0, stream>>>(loss, correct, n, out, accumulate);
  return cudaGetLastError();
}

}  // namespace dpt::cuda
