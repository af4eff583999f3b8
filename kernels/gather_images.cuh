// Batch gather and uint8 -> float scaling on the GPU, with the batch's labels.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dpt::cuda {

// out[i, p] = images[idx[i], p] / 255 for i < count, p < pixels: a batch gathered by index on the
// device from the data set uploaded once (uint8), no host round trip. With labels and out_labels
// (both or neither): out_labels[i] = labels[idx[i]].
cudaError_t launch_gather_images(const uint8_t* images, const uint8_t* labels, const int64_t* idx, int64_t count,
                                 int64_t pixels, float* out, int32_t* out_labels, cudaStream_t stream);

}  // namespace dpt::cuda
