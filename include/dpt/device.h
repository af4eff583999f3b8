// Which compute devices this process can use. A failed cudaGetDeviceCount (no driver, no GPU)
// means "no GPU", never an error; builds without the GPU backend always report 0 devices.
#pragma once

#include <string>

namespace dpt {

int cuda_device_count();
// Resolves --device (auto|cpu|cuda) for this build and this process: returns "cpu" or "cuda"
// (auto: "cuda" when a device is visible). --device cuda with no usable device is an input error:
// "no CUDA device visible ...". run_training makes the ranks agree (auto on a mix gives "cpu").
std::string resolve_device(const std::string& want, int local_rank);

}  // namespace dpt
