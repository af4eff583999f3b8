// Batch gather and uint8 -> float scaling on the GPU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dpt::cuda {

// out[i, p] = images[idx[i], p] / 255 for i < count, p < pixels: a batch gathered by index on the
// device from the data set uploaded once (uint8), no host round trip.
cudaError_t launch_gather_images(const uint8_t* images, const int64_t* idx, int64_t count, int64_t pixels, float* out, cudaStream_t stream);

}  // namespace dpt::cuda
