// Softmax cross-entropy: one block of 32 threads (a warp) per row; max and sum by warp shuffles.
#include "launch_util.cuh"
#include "softmax_xent.cuh"

namespace dpt::cuda {

static __global__ void softmax_xent_kernel(const float* __restrict__ logits, const int32_t* __restrict__ labels,
                                           int64_t n, int64_t k, float grad_scale, float* __restrict__ loss,
                                           int32_t* __restrict__ correct, float* __restrict__ dlogits) {
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
  const float lse = logf(se) + mx;
  const int32_t y = labels[row];
  if (lane == 0) {
    loss[row] = lse - z[y];
    correct[row] = arg == y;
  }
  if (dlogits)
    for (int64_t j = lane; j < k; j += 32)
      dlogits[row * k + j] = (__expf(z[j] - lse) - (j == y ? 1.f : 0.f)) * grad_scale;
}

cudaError_t launch_softmax_xent(const float* logits, const int32_t* labels, int64_t n, int64_t k, float grad_scale,
                                float* loss, int32_t* correct, float* dlogits, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (k <= 0 || k > 1024 || n > 2147483647LL) return cudaErrorInvalidValue;
  softmax_xent_kernel<<<static_cast<unsigned>(n), 32, 0, stream>>>(logits, labels, n, k, grad_scale, loss, correct,
                                                                   dlogits);
  return cudaGetLastError();
}

}  // namespace dpt::cuda
