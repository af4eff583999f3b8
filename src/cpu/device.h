// The CPU backend's entry in the device registry (src/train/device_registry.cc).
#pragma once

#include <memory>
#include <string>

#include "dpt/device.h"

namespace dpt {

// The host's device: the fp32 oneDNN backend, or with request.bf16 the bf16 one, refused (kInput)
// on a CPU without AVX512-BF16 or AMX-BF16 (cpu::cpu_bf16_missing names what is missing).
std::unique_ptr<ComputeDevice> open_cpu_device(const DeviceRequest& request);

// The CPU backend of this build and machine, for --version: oneDNN's version (the library
// loaded), the loops' instruction set and oneDNN's, and whether --precision bf16 can run here.
std::string cpu_backend_report();

}  // namespace dpt
