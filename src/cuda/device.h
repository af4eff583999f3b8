// The CUDA backend's entries in the device registry (src/train/device_registry.cc). Only in GPU
// builds.
#pragma once

#include <memory>
#include <string>

#include "dpt/device.h"

namespace dpt {

// cudaGetDeviceCount, with a failure (no driver, no GPU) read as 0 devices.
int cuda_runtime_device_count();

// GPU request.local_rank mod visible devices, TF32 and bf16 as requested; its context is created
// here. Input error when no device is visible.
std::unique_ptr<ComputeDevice> open_cuda_device(const DeviceRequest& request);

// The GPU backend of this build, for --version: the CUDA libraries loaded (version and file),
// whether cuDNN's graph API was built in, and the devices visible.
std::string cuda_backend_report();

}  // namespace dpt
