// Data and layout on the GPU: the batch gather from the uint8 data set on the device, and
// Flatten's NHWC <-> (c, h, w) permutation.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "dpt/dataset.h"
#include "dpt/image_transform.h"

namespace dpt::cuda {

// ----------------------------------------------------------------------------
// Batch gather and uint8 -> float scaling on the GPU, with the batch's labels.

// out[i] = image idx[i] transformed as `spec` says (dpt/image_transform.h: crop, flip, / 255,
// normalisation; plain x / 255 without draws and means) for i < count: a batch gathered by index on
// the device from the data set uploaded once (uint8), no host round trip. With labels and
// out_labels (both or neither): out_labels[i] = labels[idx[i]].
cudaError_t launch_gather_images(const uint8_t* images, const Label* labels, const int64_t* idx,
                                 int64_t count, const ImageBatchSpec& spec, float* out,
                                 int32_t* out_labels, cudaStream_t stream);

// ----------------------------------------------------------------------------
// Flatten's layout change on the GPU: NHWC [N,H,W,C] <-> [N, C*H*W] in PyTorch's (c, h, w) order
// (same semantics as cpu::nhwc_to_chw and cpu::chw_to_nhwc).

// to_chw: out[n, c, p] = in[n, p, c] (Flatten forward); else the inverse (Flatten backward).
cudaError_t launch_permute_nhwc_chw(const float* in, float* out, int64_t n, int64_t h, int64_t w,
                                    int64_t c, bool to_chw, cudaStream_t stream);
// The same on bf16 activations (uint16_t bit patterns, as in precision.cuh): the values move
// unchanged (widening and rounding back is exact).
cudaError_t launch_permute_nhwc_chw(const uint16_t* in, uint16_t* out, int64_t n, int64_t h,
                                    int64_t w, int64_t c, bool to_chw, cudaStream_t stream);

}  // namespace dpt::cuda
