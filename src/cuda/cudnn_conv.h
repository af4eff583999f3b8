// GPU convolution through cuDNN: the CUDA backend's ConvOp (include/dpt/backend.h), with the
// semantics of cpu::ConvPrimitives (src/cpu/conv.h): NHWC activations, PyTorch-layout (OIHW)
// weights, device pointers.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>

#include "cuda/gpu_context.h"
#include "dpt/backend.h"

namespace dpt::gpu {

using dpt::ConvGeom;

// One per convolution layer. Descriptors and algorithms are chosen once per geometry (in practice
// once per batch size) and cached; scratch comes from the context's shared workspace. Arrays are
// fp32 in both precisions; with GpuContext::bf16 the convolutions themselves run on bf16 copies
// (per shape, fp32 where cuDNN has no bf16 algorithm).
class CudnnConv : public ConvOp {
 public:
  explicit CudnnConv(GpuContext& ctx);
  ~CudnnConv() override;
  CudnnConv(const CudnnConv&) = delete;
  CudnnConv& operator=(const CudnnConv&) = delete;

  // y[N,OH,OW,Cout] = conv(x[N,H,W,Cin], w[Cout,Cin,K,K]) + b (b may be null).
  void forward(const ConvGeom& g, const float* x, const float* w, const float* b, float* y) override;
  // dx (nullable) = conv_backward_data (overwritten); dw, db (nullable) = gradients, added to when
  // accumulate.
  void backward(const ConvGeom& g, const float* x, const float* w, const float* dy, float* dx, float* dw,
                float* db, bool accumulate) override;
  // Whether convolutions of this geometry run on bf16 operands (GpuContext::bf16, and cuDNN has
  // bf16 algorithms for the shape); chooses the algorithms if not done yet.
  bool runs_bf16(const ConvGeom& g);

 private:
  struct Entry;
  using Key = std::array<int64_t, 8>;  // n, h, w, c_in, c_out, k, stride, pad
  Entry& entry(const ConvGeom& g);
  // Sets the descriptors' data type (bf16 or fp32) and forgets every chosen algorithm.
  void describe(Entry& e, const ConvGeom& g, bool bf16);
  // The algorithms of the forward and of the backward directions asked for, each chosen on first
  // use (an eager step: the first step is never captured); where cuDNN has none for one of them
  // in bf16, the entry falls back to fp32 whole.
  void choose(Entry& e, const ConvGeom& g, bool bwd_data, bool bwd_filter);

  GpuContext& ctx_;
  std::map<Key, std::unique_ptr<Entry>> cache_;
};

}  // namespace dpt::gpu
