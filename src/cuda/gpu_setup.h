// What the driver needs from the GPU build, behind host-only types: a GPU opened for this rank,
// with the CUDA operations backend the model is built on, its free memory, and the gradient
// transport the Reducer uses over it. Only in GPU builds.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "dpt/backend.h"
#include "dpt/comm.h"
#include "dpt/reducer.h"

namespace dpt {

// The memory still free on the GPU (cudaMemGetInfo), and the number of this host's ranks that
// drive it (local ranks map to GPUs local_rank mod visible devices).
struct GpuMemory {
  double free_bytes = 0;
  int ranks_on_gpu = 1;
  std::string device;  // "cuda:0 (NVIDIA H100 80GB HBM3)"
};

// One GPU as the driver sees it: its operations backend, its memory, and the gradient transport
// over it.
class GpuDevice {
 public:
  virtual ~GpuDevice() = default;
  // The CUDA operations backend (src/cuda/cuda_backend.h); it lives as long as this object.
  virtual Backend& ops() = 0;
  // Free memory now (after this rank's context took its own), with `ranks_here` ranks on this host.
  virtual GpuMemory memory(int ranks_here) = 0;
  // The Reducer's transport for `count` gradients at `grads` (device memory of ops()): NCCL on its
  // own stream when every rank drives a GPU of its own, else pinned host buffers and MPI (NCCL
  // refuses two ranks on one GPU; rank 0 logs it). Null at world size 1 (nothing to send: the
  // Reducer then takes the MPI transport, which sends nothing either). Collective: every rank calls
  // it. wire: the type gradients travel in (--grad-dtype: kF32, kBF16 or kF16; see
  // src/cuda/gpu_reducer.h).
  virtual std::unique_ptr<ReduceTransport> transport(Communicator& comm, float* grads,
                                                     int64_t count, DType wire) = 0;
  // Whether the backend's convolutions run on cuDNN's graph API, which takes bf16 natively.
  virtual bool fast_bf16_activations() = 0;
};

// GPU local_rank mod visible devices, TF32 allowed or not, bf16 precision or fp32. Input error when
// no device is visible.
std::unique_ptr<GpuDevice> open_gpu(int local_rank, bool tf32, bool bf16);

}  // namespace dpt
