// Which compute devices this process can use, and the registry that opens one for training
// (src/train/device_registry.cc; each backend's device in src/cpu/device.cc and
// src/cuda/device.cc). A failed cudaGetDeviceCount (no driver, no GPU) means "no GPU", never an
// error; builds without the GPU backend always report 0 devices.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "dpt/backend.h"
#include "dpt/reducer.h"

namespace dpt {

class Communicator;

int cuda_device_count();
// Resolves --device (auto|cpu|cuda) for this build and this process: returns "cpu" or "cuda"
// (auto: "cuda" when a device is visible). --device cuda with no usable device is an input error:
// "no CUDA device visible ...". run_training makes the ranks agree (auto on a mix gives "cpu").
std::string resolve_device(const std::string& want, int local_rank);

// ---- The device registry: the driver's one door to a compute device ----

// What a device can still give a run, for the pre-flight's memory estimate: `free_bytes` (< 0:
// unknown, no check), shared by `sharing` ranks, of which this rank checks for all when `checks`
// (the CPU: a host's first rank; a GPU: every rank, after its context exists); `extra` is what a
// run keeps there besides the per-image part; with `model_fixed` each rank's model (parameters,
// gradients, optimizer state, weight copies: model_fixed_bytes) comes out of free_bytes too, where
// `extra` does not already cover it; `where` names it in messages.
struct DeviceMemory {
  double free_bytes = -1, extra = 0;
  bool model_fixed = false;
  int sharing = 1;
  bool checks = false;
  std::string where;
};

// One compute device as the driver sees it (ggml's backend registry, reduced to what training
// needs): the operations the model runs on, the gradient transport, and its memory.
class ComputeDevice {
 public:
  virtual ~ComputeDevice() = default;
  virtual const char* kind() const = 0;  // "cpu" or "cuda"
  virtual Backend& ops() = 0;
  virtual DeviceMemory memory(int rank) = 0;
  // How gradients travel for a model on ops() with `count` gradients at `grads`. Null: the
  // Reducer's MPI thread over host gradients. Collective: every rank calls it.
  virtual std::unique_ptr<ReduceTransport> transport(Communicator& comm, float* grads,
                                                     int64_t count, DType wire) = 0;
  // Whether bf16 activations are this device's fast path under --precision bf16 (what
  // --activation-dtype auto follows): its convolutions take bf16 operands natively.
  virtual bool fast_bf16_activations() { return false; }
};

// What a rank asks for: "cpu" or "cuda" (resolved and agreed: see resolve_device), its position
// on its host, and the GPU's numerics.
struct DeviceRequest {
  std::string kind = "cpu";
  int local_rank = 0, ranks_here = 1;
  bool tf32 = false, bf16 = false;
  bool nondeterministic = false;  // --cudnn-nondeterministic
};
// Input errors (exit 2 under the pre-flight's agree_on_input): --precision bf16 on a CPU without
// AVX512-BF16 or AMX-BF16 (the CPU device refuses it itself: cpu::cpu_bf16_missing); "cuda" in a
// build without the GPU backend, or where no GPU is visible.
std::unique_ptr<ComputeDevice> open_device(const DeviceRequest& request);

// The backends of this build, one line each, for --version: the CPU's (oneDNN, the instruction
// sets, bf16) and the GPU's (the CUDA libraries loaded and the devices visible, or "not built").
std::string backends_report();

// The memory this host can still give: MemAvailable, or less under a cgroup (v2 or v1) limit; -1
// when /proc/meminfo cannot be read. DPT_MEMORY_AVAILABLE (bytes, or with a suffix K, M, G, T)
// replaces it: a host that must keep memory for other work, and the tests of the checks that use
// it (a bad value: kInput, naming the variable). `source` says where the figure came from.
struct HostMemory {
  double bytes = -1;
  std::string source;
};
HostMemory host_memory();
double host_available_bytes();  // host_memory().bytes

}  // namespace dpt
