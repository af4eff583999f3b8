// CPU convolution: NHWC activations, PyTorch-layout (OIHW) weights. Stride-1 3x3 convolutions with
// enough channels run the Winograd algorithm (winograd.h); the rest run oneDNN, whose primitive
// descriptors, primitives and reordered weight buffers are created once per batch size and reused
// (the weights themselves are reordered once per WeightSpan: once per step).
// With bf16 (--precision bf16) every convolution runs oneDNN on bf16 copies of x, w and dy with
// fp32 outputs and gradients (oneDNN accumulates in fp32); with bf16 activations too, on the
// activations themselves, writing y and dx in bf16.
#pragma once

#include <cstdint>
#include <map>
#include <memory>

#include "dpt/backend.h"

namespace dpt::cpu {

class WinogradConv;
using dpt::ConvGeom;

// The CPU backend's ConvOp (backend.h).
class ConvPrimitives : public ConvOp {
 public:
  // span: the backend's (weights reused within one of its open spans); null: never reused.
  explicit ConvPrimitives(bool bf16 = false, const WeightSpan* span = nullptr);
  ~ConvPrimitives() override;
  // y[N,OH,OW,Cout] = conv(x[N,H,W,Cin], w[Cout,Cin,K,K]) + b (b may be null).
  void forward(const ConvGeom& g, const float* x, const float* w, const float* b,
               float* y) override;
  // dx (nullable) = conv_backward_data; dw, db (nullable) = gradients, added to when accumulate.
  void backward(const ConvGeom& g, const float* x, const float* w, const float* dy, float* dx,
                float* dw, float* db, bool accumulate) override;
  // 16-bit activations: in bf16 directly (--precision bf16), else the float forms on widened
  // copies (widen.h).
  void forward(const ConvGeom& g, const BFloat16* x, const float* w, const float* b,
               BFloat16* y) override;
  void backward(const ConvGeom& g, const BFloat16* x, const float* w, const BFloat16* dy,
                BFloat16* dx, float* dw, float* db, bool accumulate) override;

 private:
  struct Entry;
  // The primitives of batch size g.n, with bf16 activations in and out (act16) or not.
  Entry& entry(const ConvGeom& g, bool has_bias, bool act16);
  template <typename T>
  void forward_dnnl(Entry& e, const T* x, const float* w, const float* b, T* y);
  template <typename T>
  void backward_dnnl(Entry& e, const ConvGeom& g, const T* x, const float* w, const T* dy, T* dx,
                     float* dw, float* db, bool accumulate);
  void backward_gemm(const ConvGeom& g, const float* x, const float* w, const float* dy, float* dx,
                     float* dw, float* db, bool accumulate);
  std::map<int64_t, std::unique_ptr<Entry>> cache_;  // keyed by batch size * 2 + act16
  std::unique_ptr<WinogradConv> wino_;               // stride-1 3x3 shapes (winograd.h)
  bool bf16_;                                        // bf16 operands, always oneDNN
  const WeightSpan* span_;
};

}  // namespace dpt::cpu
