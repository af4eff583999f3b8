// CPU convolution: NHWC activations, PyTorch-layout (OIHW) weights. Stride-1 3x3 convolutions with
// enough channels run the Winograd algorithm (winograd.h); the rest run oneDNN, whose primitive
// descriptors, primitives and reordered weight buffers are created once per batch size and reused.
#pragma once

#include <cstdint>
#include <map>
#include <memory>

namespace dpt::cpu {

class WinogradConv;

struct ConvGeom {
  int64_t n = 0, h = 0, w = 0, c_in = 0, c_out = 0, k = 0, stride = 1, pad = 0;
  int64_t oh() const { return (h + 2 * pad - k) / stride + 1; }
  int64_t ow() const { return (w + 2 * pad - k) / stride + 1; }
};

class ConvPrimitives {
 public:
  ConvPrimitives();
  ~ConvPrimitives();
  // y[N,OH,OW,Cout] = conv(x[N,H,W,Cin], w[Cout,Cin,K,K]) + b (b may be null).
  void forward(const ConvGeom& g, const float* x, const float* w, const float* b, float* y);
  // dx (nullable) = conv_backward_data; dw, db (nullable) = gradients, added to when accumulate.
  void backward(const ConvGeom& g, const float* x, const float* w, const float* dy, float* dx,
                float* dw, float* db, bool accumulate);

 private:
  struct Entry;
  Entry& entry(const ConvGeom& g, bool has_bias);
  void backward_dnnl(Entry& e, const ConvGeom& g, const float* x, const float* w, const float* dy,
                     float* dx, float* dw, float* db, bool accumulate);
  void backward_gemm(Entry& e, const ConvGeom& g, const float* x, const float* w, const float* dy,
                     float* dx, float* dw, float* db, bool accumulate);
  std::map<int64_t, std::unique_ptr<Entry>> cache_;  // keyed by batch size
  std::unique_ptr<WinogradConv> wino_;            // stride-1 3x3 shapes (winograd.h)
};

}  // namespace dpt::cpu
