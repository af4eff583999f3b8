// The CPU backend's entry in the device registry (src/train/device_registry.cc).
#pragma once

#include <memory>

#include "dpt/device.h"

namespace dpt {

// The host's device: the fp32 oneDNN backend, or with request.bf16 the bf16 one, refused (kInput)
// on a CPU without AVX512-BF16 or AMX-BF16 (cpu::cpu_bf16_missing names what is missing).
std::unique_ptr<ComputeDevice> open_cpu_device(const DeviceRequest& request);

}  // namespace dpt
