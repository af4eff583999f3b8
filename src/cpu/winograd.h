// Winograd minimal-filtering convolution (Lavin & Gray 2015) for stride-1 square kernels on NHWC
// activations: forward, backward-data and backward-weights as alpha^2 independent sgemms between
// transformed tiles. It cuts the multiplications of a 3x3 convolution by 2.25x (F(2,3), what
// ResNet-18 runs forward and backward-data, for accuracy: winograd_choice) to 4x (F(4,3));
// oneDNN 2.6 has Winograd only for AVX-512. The loops run
// at the instruction-set level isa.h chose (winograd_loops.inc).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "cpu/conv.h"

namespace dpt::cpu {

namespace wino {
struct Tables;
}

// Tile sizes for one convolution shape: m = output tile of the forward and backward-data passes
// (F(m, k)), mw = gradient tile of the backward-weights pass (F(k, mw)); 0 = use the direct path.
// A fixed rule of the shape (never of timing), so every rank and every resumed run computes the
// same bits. DPT_WINOGRAD=off turns it off (for comparisons).
struct WinogradChoice {
  int m = 0;
  int mw = 0;
};
WinogradChoice winograd_choice(const ConvGeom& g);

// Scratch buffers grow to the largest shape seen and are reused: no allocation in the step. They
// are one set per thread, shared by every layer (winograd.cc says why).
class WinogradConv {
 public:
  // y[N,OH,OW,Cout] = conv(x[N,H,W,Cin], w[Cout,Cin,K,K]) + b (b nullable); g.stride must be 1.
  void forward(const ConvGeom& g, int m, const float* x, const float* w, const float* b, float* y);
  // dx[N,H,W,Cin] = the input gradient for dy[N,OH,OW,Cout]: a forward pass over dy with the
  // kernel rotated by 180 degrees, channels swapped and padding k-1-pad.
  void backward_data(const ConvGeom& g, int m, const float* w, const float* dy, float* dx);
  // dw[Cout,Cin,K,K] = (or += when accumulate) the weight gradient: per tile of dy, F(k, mw)
  // correlates the input patch with the dy tile; the tile sum is one sgemm per transformed point.
  void backward_weights(const ConvGeom& g, int mw, const float* x, const float* dy, float* dw,
                        bool accumulate);

 private:
  std::pair<const wino::Tables*, float*> filters(const ConvGeom& g, int m, const float* w,
                                                 bool rotate);
  float* transform_filters(const wino::Tables& t, int64_t ins, int64_t outs, const float* wr);
};

}  // namespace dpt::cpu
