// What run_training needs from the GPU build, behind host-only types: the CUDA operations backend
// the model is built on, and the gradient transport the Reducer uses on it. Only in GPU builds.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "dpt/backend.h"
#include "dpt/comm.h"
#include "dpt/ddp.h"
#include "dpt/train.h"

namespace dpt {

class Communicator;

// The CUDA operations backend (src/cuda/cuda_backend.h) on GPU local_rank mod visible devices, with
// --tf32 and --precision applied. An input error when no device is visible.
std::unique_ptr<Backend> make_cuda_backend(const TrainConfig& cfg, int local_rank);

// The memory still free on the GPU `ops` drives (cudaMemGetInfo), and the number of this host's
// ranks that drive it (local ranks map to GPUs local_rank mod visible devices).
struct GpuMemory {
  double free_bytes = 0;
  int ranks_on_gpu = 1;
  std::string device;  // "cuda:0 (NVIDIA H100 80GB HBM3)"
};
GpuMemory gpu_memory(Backend& ops, int local_rank, int ranks_here);

// The transport of the Reducer for a model on `ops` (make_cuda_backend's) with `count` gradients at
// `grads` (device memory): NCCL on its own stream when every rank drives a GPU of its own, else
// pinned host buffers and MPI (NCCL refuses two ranks on one GPU; rank 0 logs it). Null at world
// size 1 (nothing to send: the Reducer then takes the MPI transport, which sends nothing either).
// Collective: every rank calls it. wire: the type gradients travel in (--grad-dtype: kF32, kBF16 or
// kF16), passed to the transport made (see src/cuda/gpu_reducer.h).
std::unique_ptr<ReduceTransport> make_gpu_transport(Communicator& comm, Backend& ops, float* grads, int64_t count,
                                                    DType wire);

}  // namespace dpt
