// Filter layout moves of the graph-API convolution (src/cuda/cudnn_graph_conv.cc): PyTorch's OIHW
// weights into the OHWI (KRSC) layout cuDNN's channels-last engines are built for, and weight
// gradients back, fp32 or bf16 (bf16 as uint16_t bit patterns, as in precision.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dpt::cuda {

// How a [co][ci][kk] filter (kk = K*K) moves: unchanged (a copy, a widening or an addition),
// OIHW [co][ci][kk] -> OHWI [co][kk][ci], or back.
enum class FilterMove { kCopy, kToOhwi, kToOihw };

// dst = move(src), or dst += move(src) when accumulate. Returns the launch status.
cudaError_t launch_filter_move(const float* src, float* dst, int64_t co, int64_t ci, int64_t kk,
                               FilterMove move, bool accumulate, cudaStream_t stream);
// bf16 -> bf16 (weights of the bf16 entry points), exact.
cudaError_t launch_filter_move_bf16(const uint16_t* src, uint16_t* dst, int64_t co, int64_t ci,
                                    int64_t kk, FilterMove move, cudaStream_t stream);
// fp32 -> bf16, rounded to nearest even as launch_to_bf16 rounds (the fp32 master weights into the
// layout and type a bf16 plan reads, in one pass).
cudaError_t launch_filter_move_to_bf16(const float* src, uint16_t* dst, int64_t co, int64_t ci,
                                       int64_t kk, FilterMove move, cudaStream_t stream);
// bf16 -> fp32 (a bf16 weight gradient into the fp32 gradient buffer), exact before the addition.
cudaError_t launch_filter_move_from_bf16(const uint16_t* src, float* dst, int64_t co, int64_t ci,
                                         int64_t kk, FilterMove move, bool accumulate,
                                         cudaStream_t stream);

}  // namespace dpt::cuda
