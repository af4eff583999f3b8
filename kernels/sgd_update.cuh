// SGD with momentum and weight decay over the flat parameter/gradient buffers on the GPU
// (PyTorch semantics, the same as the CPU's dpt::Sgd::step). Host launcher only: no CUDA types
// beyond cudaStream_t cross this header.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dpt::cuda {

// p -= lr * buf, buf = first ? g + wd*p : momentum*buf + g + wd*p (buf unused when momentum == 0).
// lr is read from device memory (one float, see store_scalar.cuh), so a step replayed from a CUDA
// graph follows the schedule. Checks the launch; returns the launch status.
cudaError_t launch_sgd_update(float* p, const float* g, float* buf, int64_t n, const float* lr,
                              float momentum, float weight_decay, bool first, cudaStream_t stream);

}  // namespace dpt::cuda
