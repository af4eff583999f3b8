// Softmax cross-entropy forward and backward with the correct count, one block per row.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dpt::cuda {

// Per row of logits [N, K] (K <= 1024): loss[i] = logsumexp(z) - z[y], correct[i] = argmax == y,
// dlogits (optional) = (softmax - onehot) * grad_scale. Sums are left to the caller (one reduction
// per step, no host round trip).
cudaError_t launch_softmax_xent(const float* logits, const int32_t* labels, int64_t n, int64_t k, float grad_scale, float* loss, int32_t* correct, float* dlogits, cudaStream_t stream);

}  // namespace dpt::cuda
