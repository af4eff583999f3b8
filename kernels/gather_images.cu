// Batch gather by index from the uint8 data set on the device, scaled to [0, 1].
#include "gather_images.cuh"
#include "launch_util.cuh"

namespace dpt::cuda {

static __global__ void gather_images_kernel(const uint8_t* __restrict__ images, const int64_t* __restrict__ idx,
                                            int64_t count, int64_t pixels, float* __restrict__ out) {
  DPT_GRID_STRIDE(i, count * pixels) {
    const int64_t row = i / pixels, p = i % pixels;
    out[i] = static_cast<float>(images[idx[row] * pixels + p]) * (1.f / 255.f);
  }
}

cudaError_t launch_gather_images(const uint8_t* images, const int64_t* idx, int64_t count, int64_t pixels,
                                 float* out, cudaStream_t stream) {
  if (count * pixels <= 0) return cudaSuccess;
  gather_images_kernel<<<blocks_for(count * pixels), kThreads, 0, stream>>>(images, idx, count, pixels, out);
  return cudaGetLastError();
}

}  // namespace dpt::cuda
