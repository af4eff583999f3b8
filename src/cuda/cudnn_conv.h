// GPU convolution through cuDNN: the CUDA backend's ConvOp (include/dpt/backend.h), with the
// semantics of cpu::ConvPrimitives (src/cpu/conv.h): NHWC activations, PyTorch-layout (OIHW)
// weights, device pointers.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "cuda/gpu_context.h"
#include "dpt/backend.h"

namespace dpt::gpu {

using dpt::ConvGeom;

// One per convolution layer. Descriptors and algorithms are chosen once per geometry (in practice
// once per batch size) and cached; scratch comes from the context's shared workspace. Arrays are
// fp32 in every precision; with --tf32 or --precision bf16 they are convolved on TF32 tensor cores
// (see cudnn_conv.cc for why bf16 convolutions do not take bf16 copies).
class CudnnConv : public ConvOp {
 public:
  explicit CudnnConv(GpuContext& ctx);
  ~CudnnConv() override;
  CudnnConv(const CudnnConv&) = delete;
  CudnnConv& operator=(const CudnnConv&) = delete;

  // y[N,OH,OW,Cout] = conv(x[N,H,W,Cin], w[Cout,Cin,K,K]) + b (b may be null).
  void forward(const ConvGeom& g, const float* x, const float* w, const float* b,
               float* y) override;
  // dx (nullable) = conv_backward_data (overwritten); dw, db (nullable) = gradients, added to when
  // accumulate.
  void backward(const ConvGeom& g, const float* x, const float* w, const float* dy, float* dx,
                float* dw, float* db, bool accumulate) override;
  // 16-bit activations (x, y, dy, dx bf16; w, b, dw, db fp32): the fp32 convolution above on exact
  // fp32 copies of x and dy, its y and dx rounded to bf16 once (the CPU's rule; see cudnn_conv.cc
  // for why not cuDNN's bf16 engines). The copies live in the context's staging (grow-only).
  void forward(const ConvGeom& g, const BFloat16* x, const float* w, const float* b,
               BFloat16* y) override;
  void backward(const ConvGeom& g, const BFloat16* x, const float* w, const BFloat16* dy,
                BFloat16* dx, float* dw, float* db, bool accumulate) override;
  // One algorithm of one direction as cuDNN's timed search (cudnnFind*Ex) measured it on this
  // geometry's descriptors: for bench/gpu_conv_bench, to see how far the heuristic pick is from
  // the fastest; with nchw, the same convolution described channels-first. Not used in training
  // (timings vary between runs; see the file comment).
  struct AlgoTime {
    const char* direction;  // "forward", "backward-data", "backward-filter"
    int algo;
    cudnnMathType_t math;
    bool deterministic;
    size_t workspace;
    float ms;
    bool chosen;  // the algorithm (and math type) forward()/backward() run
  };
  std::vector<AlgoTime> survey(const ConvGeom& g, bool nchw = false);

 private:
  struct Entry;
  using Key = std::array<int64_t, 8>;  // n, h, w, c_in, c_out, k, stride, pad
  Entry& entry(const ConvGeom& g);
  // Sets the descriptors (fp32 NHWC) and the math type the algorithms are ranked under
  // (GpuContext::tensor_ops, fixed before the first convolution).
  void describe(Entry& e, const ConvGeom& g);
  // The algorithms of the forward and of the backward directions asked for, each chosen on first
  // use (an eager step: the first step is never captured).
  void choose(Entry& e, const ConvGeom& g, bool bwd_data, bool bwd_filter);
  // The context's staging slot `slot` as at least `elems` floats (the bf16 forms' fp32 copies).
  float* staged(int slot, int64_t elems);

  GpuContext& ctx_;
  std::map<Key, std::unique_ptr<Entry>> cache_;
};

}  // namespace dpt::gpu
