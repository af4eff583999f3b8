// The loss on the GPU: softmax cross-entropy per row (loss, correct, dlogits) and the batch totals
// kept on the device, so a training step needs no host round trip.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dpt::cuda {

// ----------------------------------------------------------------------------
// Softmax cross-entropy forward and backward with the correct count, one block per row.

// Per row of logits [N, K] (any K; N < 2^31), with label smoothing e (0: none): loss[i] = (1-e)
// (lse - z[y]) + e (lse - mean_j z[j]) (lse = logsumexp(z); lse - z[y] when e = 0), every term
// taken from the row's maximum, correct[i] = argmax == y (the first maximum), dlogits (optional)
// = (softmax - q) * grad_scale, q = (1-e) onehot + e/K. Sums are left to the caller (one reduction
// per step, no host round trip).
cudaError_t launch_softmax_xent(const float* logits, const int32_t* labels, int64_t n, int64_t k,
                                float grad_scale, float label_smoothing, float* loss,
                                int32_t* correct, float* dlogits, cudaStream_t stream);

// ----------------------------------------------------------------------------
// The batch totals of softmax_xent's per-row outputs on the GPU: summed loss and correct count,
// kept on the device so a training step needs no host round trip (read back once per epoch).

// out[0] (+)= sum of loss[0..n) and out[1] (+)= sum of correct[0..n), in double and in a fixed
// order (one block: bit-reproducible); added to out when accumulate, else overwritten.
cudaError_t launch_loss_sums(const float* loss, const int32_t* correct, int64_t n, double* out,
                             bool accumulate, cudaStream_t stream);

}  // namespace dpt::cuda
