// The batch totals of softmax_xent's per-row outputs on the GPU: summed loss and correct count,
// kept on the device so a training step needs no host round trip (read back once per epoch).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dpt::cuda {

// out[0] (+)= sum of loss[0..n) and out[1] (+)= sum of correct[0..n), in double and in a fixed
// order (one block: bit-reproducible); added to out when accumulate, else overwritten.
cudaError_t launch_loss_sums(const float* loss, const int32_t* correct, int64_t n, double* out, bool accumulate,
                             cudaStream_t stream);

}  // namespace dpt::cuda
