// Which compute devices this process can use. A failed cudaGetDeviceCount (no driver, no GPU)
// means "no GPU", never an error; builds without the GPU backend always report 0 devices.
#pragma once

#include <string>

namespace dpt {

int cuda_device_count();
// Resolves --device (auto|cpu|cuda) for this build and machine: returns "cpu" or "cuda".
// --device cuda with no usable device is an input error: "no CUDA device visible ...".
std::string resolve_device(const std::string& want, int local_rank);

}  // namespace dpt
