// The CPU's batch gather (CpuBackend::gather_images): uint8 images taken by index from the data set
// into the model's float input, through image_transform.h's per-pixel mapping (crop window, flip,
// / 255, normalisation) that the CUDA kernel (kernels/data.cu) applies too. Host memory.
#pragma once

#include <cstdint>

#include "dpt/image_transform.h"

namespace dpt::cpu {

// The seed's ToTensor, gathered by index so shuffled batches need no copy of the set:
// out[i*P + p] = images[indices[i]*P + p] / 255.f for i in [0, count), from num_images images of
// P = `pixels` bytes each (HWC). `out` holds count*P floats; every index must be in
// [0, num_images).
void images_to_float(const uint8_t* images, int64_t num_images, int64_t pixels,
                     const int64_t* indices, int64_t count, float* out);

// x[i] = the transformed image idx[i] (spec: crop, flip, / 255, normalisation) for i < count, from
// num_images images of spec.pixels() bytes. Without draws and normalisation it is the plain
// ToTensor (images_to_float), bit for bit.
void gather_transformed(const uint8_t* images, int64_t num_images, const ImageBatchSpec& spec,
                        const int64_t* idx, int64_t count, float* x);

}  // namespace dpt::cpu
