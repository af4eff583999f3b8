// The one-thread kernel of kernels/store_scalar.cuh. A kernel rather than cudaMemcpyAsync from the
// host: the value travels in the launch's parameters, so no host buffer has to outlive the call.
#include "store_scalar.cuh"

namespace dpt::cuda {

static __global__ void store_scalar_kernel(float* dst, float value) { *dst = value; }

cudaError_t launch_store_scalar(float* dst, float value, cudaStream_t stream) {
  store_scalar_kernel<<<1, 1, 0, stream>>>(dst, value);
  return cudaGetLastError();
}

}  // namespace dpt::cuda
