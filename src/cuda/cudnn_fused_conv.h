// The runtime-fusion convolution of NVIDIA's ResNet training (MLPerf's
// "scale-bias-relu-conv-genstats") through cuDNN's graph API, standalone: not wired into the layers
// until a GPU shows it is faster.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda/conv_common.h"
#include "cuda/gpu_context.h"
#include "dpt/backend.h"

namespace dpt::gpu {

using dpt::ConvGeom;

// One cuDNN pass computing, over NHWC activations (x[N,H,W,Cin], y[N,OH,OW,Cout]) and an OIHW
// filter w[Cout,Cin,K,K]:
//   with a prologue (scale and bias non-null): y = conv(relu(x * scale[ci] + bias[ci]), w), the
//     previous BatchNorm's normalisation and ReLU applied as the convolution reads x (padding stays
//     zero: it pads the ReLU's output, as in the unfused layers);
//   without (both null): y = conv(x, w), for a block's first convolution;
// and, as its epilogue, the next BatchNorm's statistics: sum[co] = sum of y[., co], sqsum[co] =
// sum of y[., co]^2 over N, OH and OW, in fp32, overwritten. scale and bias are fp32 per input
// channel; accumulation is fp32. Plans are built, timed and cached per (geometry, prologue or
// not, data type) as CudnnGraphConv's (cudnn_fused_conv.cc says which graphs compete). A pattern
// no engine of this cuDNN and GPU supports throws a dpt::Error naming the key and each graph's
// reason; nothing crashes. Scratch comes from the context's shared workspace.
class FusedConvGenstats {
 public:
  explicit FusedConvGenstats(GpuContext& ctx);
  ~FusedConvGenstats();
  FusedConvGenstats(const FusedConvGenstats&) = delete;
  FusedConvGenstats& operator=(const FusedConvGenstats&) = delete;

  // bf16 x, w and y (the bf16-activation path's arrays).
  void forward_bf16(const ConvGeom& g, const __nv_bfloat16* x, const float* scale,
                    const float* bias, const __nv_bfloat16* w, __nv_bfloat16* y, float* sum,
                    float* sqsum);
  // fp32 x, w and y, strict fp32 or TF32 as GpuContext::tensor_ops() says (as CudnnGraphConv).
  void forward(const ConvGeom& g, const float* x, const float* scale, const float* bias,
               const float* w, float* y, float* sum, float* sqsum);

  // One key's choice ("N=.. forward-fused bf16" -> "genstats+ohwi:<engine tag>"), for the bench
  // and the tests.
  using Choice = PlanChoice;
  std::vector<Choice> choices() const;
  uint64_t graphs_built() const;
  uint64_t plans_timed() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;  // keeps cudnn_frontend.h out of every file that includes this one
};

// Where ResNet-18 (src/nn/models.cc) on 28x28 images would run the fused op, after the stem, one
// entry per distinct (geometry, pattern): a convolution reading a BatchNorm-ReLU's output takes the
// prologue (every block's conv2, and layer1.0.conv1 after the stem's bn1); one reading a block's
// output (a residual sum, which the prologue cannot add) or the downsample's 1x1 is plain. For the
// test's and the bench's tables.
struct FusionSite {
  const char* name;
  ConvGeom g;  // n, h, w, c_in, c_out, k, stride, pad
  bool prologue;
};
inline std::vector<FusionSite> resnet18_fusion_sites(int64_t n) {
  return {
      {"layer1 conv2 3x3 s1", {n, 28, 28, 64, 64, 3, 1, 1}, true},
      {"layer1.1 conv1 3x3 s1", {n, 28, 28, 64, 64, 3, 1, 1}, false},
      {"layer2.0 conv1 3x3 s2", {n, 28, 28, 64, 128, 3, 2, 1}, false},
      {"layer2.0 downsample 1x1 s2", {n, 28, 28, 64, 128, 1, 2, 0}, false},
      {"layer2 conv2 3x3 s1", {n, 14, 14, 128, 128, 3, 1, 1}, true},
      {"layer2.1 conv1 3x3 s1", {n, 14, 14, 128, 128, 3, 1, 1}, false},
      {"layer3.0 conv1 3x3 s2", {n, 14, 14, 128, 256, 3, 2, 1}, false},
      {"layer3.0 downsample 1x1 s2", {n, 14, 14, 128, 256, 1, 2, 0}, false},
      {"layer3 conv2 3x3 s1", {n, 7, 7, 256, 256, 3, 1, 1}, true},
      {"layer3.1 conv1 3x3 s1", {n, 7, 7, 256, 256, 3, 1, 1}, false},
      {"layer4.0 conv1 3x3 s2", {n, 7, 7, 256, 512, 3, 2, 1}, false},
      {"layer4.0 downsample 1x1 s2", {n, 7, 7, 256, 512, 1, 2, 0}, false},
      {"layer4 conv2 3x3 s1", {n, 4, 4, 512, 512, 3, 1, 1}, true},
      {"layer4.1 conv1 3x3 s1", {n, 4, 4, 512, 512, 3, 1, 1}, false},
  };
}

}  // namespace dpt::gpu
