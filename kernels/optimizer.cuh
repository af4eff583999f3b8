// The optimizer step on the GPU: SGD over the flat parameter/gradient buffers, and the store of the
// step's learning rate into device memory. Host launchers only: no CUDA types beyond cudaStream_t.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dpt::cuda {

// ----------------------------------------------------------------------------
// SGD with momentum and weight decay over the flat parameter/gradient buffers on the GPU
// (PyTorch semantics, the same as the CPU's dpt::Sgd::step).

// p -= lr * buf, buf = first ? g + wd*p : momentum*buf + g + wd*p (buf unused when momentum == 0).
// lr is read from device memory (one float, see launch_store_scalar), so a step replayed from a CUDA
// graph follows the schedule. Checks the launch; returns the launch status.
cudaError_t launch_sgd_update(float* p, const float* g, float* buf, int64_t n, const float* lr,
                              float momentum, float weight_decay, bool first, cudaStream_t stream);

// ----------------------------------------------------------------------------
// Writes one float into device memory from a kernel argument: how a value that changes every step
// (the learning rate) reaches kernels replayed from a CUDA graph, which read it from a fixed address.

// *dst = value, in stream order. Checks the launch; returns the launch status.
cudaError_t launch_store_scalar(float* dst, float value, cudaStream_t stream);

}  // namespace dpt::cuda
