// Flatten's layout change on the GPU: NHWC [N,H,W,C] <-> [N, C*H*W] in PyTorch's (c, h, w) order
// (same semantics as cpu::nhwc_to_chw and cpu::chw_to_nhwc).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dpt::cuda {

// to_chw: out[n, c, p] = in[n, p, c] (Flatten forward); else the inverse (Flatten backward).
cudaError_t launch_permute_nhwc_chw(const float* in, float* out, int64_t n, int64_t h, int64_t w, int64_t c,
                                    bool to_chw, cudaStream_t stream);

}  // namespace dpt::cuda
