// GPU convolution through cuDNN's graph API (NVIDIA's header-only cudnn-frontend): the CUDA
// backend's ConvOp under DPT_CUDNN_API=graph, with CudnnConv's semantics, plans timed like
// PyTorch's cudnn.benchmark, and bf16 entry points for a bf16-activation path. GPU builds with the
// frontend's headers only (DPT_HAVE_CUDNN_FRONTEND); cudnn_graph_conv.cc says how it works.
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

// One layer's copies of its filter in the type and layout its plans read (bf16, or fp32 OHWI),
// made from the fp32 master weights at most once per WeightSpan (Backend::weights_fixed: a step's
// forward and backward, an evaluation) and kept with the layer (SharedGraphConv). A step then
// converts and moves each filter once, where each call of each direction did it before (forward
// and backward-data read the same copy): on an H100 the per-call bf16 copies and filter moves
// were 0.57 of ResNet-18's 5.9 ms of kernels a step, in ~100 launches. Outside a span every call
// makes them afresh. Each buffer is allocated on the layer's first (eager) call and kept, so a
// captured CUDA graph's pointers stay valid, and the conversion is a node of the graph.
class FilterCopies {
 public:
  // span: the backend's; null: never reused.
  explicit FilterCopies(const WeightSpan* span) : span_(span) {}
  // g's filter w (fp32 OIHW) as a plan reads it: in bf16 or fp32, OHWI (ohwi) or OIHW; made in
  // ctx's stream unless this span's copy holds, or w itself where that is already it (fp32, OIHW
  // or a layout of the same bytes, 256-byte aligned).
  const void* get(GpuContext& ctx, const ConvGeom& g, bool bf16, bool ohwi, const float* w);

 private:
  struct Copy {
    DeviceBuffer buf;
    const float* of = nullptr;
    uint64_t made = 0;  // the span it was made in
  };
  Copy copies_[2][2];  // [bf16][moved to OHWI]
  const WeightSpan* span_;
};

// Plans are cached per (geometry, direction, data type and math), so one object can serve every
// layer of a model (CudaBackend shares one): layers of one shape then share their plans and their
// timing. Scratch comes from the context's shared workspace; no device memory is held between
// calls.
class CudnnGraphConv : public ConvOp {
 public:
  explicit CudnnGraphConv(GpuContext& ctx);
  ~CudnnGraphConv() override;
  CudnnGraphConv(const CudnnGraphConv&) = delete;
  CudnnGraphConv& operator=(const CudnnGraphConv&) = delete;

  // fp32 arrays: NHWC activations, OIHW weights, as CudnnConv. Computed in fp32, on TF32 tensor
  // cores only when GpuContext::tensor_ops() (--tf32, --precision bf16) allows them.
  // y[N,OH,OW,Cout] = conv(x[N,H,W,Cin], w[Cout,Cin,K,K]) + b (b may be null).
  void forward(const ConvGeom& g, const float* x, const float* w, const float* b,
               float* y) override;
  // dx (nullable) = conv_backward_data (overwritten); dw, db (nullable) = gradients, added to when
  // accumulate.
  void backward(const ConvGeom& g, const float* x, const float* w, const float* dy, float* dx,
                float* dw, float* db, bool accumulate) override;

  // bf16 activations and weights, fp32 accumulation on tensor cores, whatever the context's
  // settings. The parameters' side stays fp32 (master bias; dW and dB in the fp32 gradient
  // buffers): y = bf16(bf16(conv) + b); dx = bf16(conv_backward_data); dw (+)= the weight gradient,
  // rounded to bf16 before it is widened and added where cuDNN writes no fp32 dW from bf16 inputs
  // (cuDNN 9.19: everywhere; see cudnn_graph_conv.cc); db (+)= column sums of dy in double. Same
  // nullability as backward().
  void forward_bf16(const ConvGeom& g, const __nv_bfloat16* x, const __nv_bfloat16* w,
                    const float* b, __nv_bfloat16* y);
  void backward_bf16(const ConvGeom& g, const __nv_bfloat16* x, const __nv_bfloat16* w,
                     const __nv_bfloat16* dy, __nv_bfloat16* dx, float* dw, float* db,
                     bool accumulate);
  // ConvOp's 16-bit activations (bf16 x, y, dy, dx; fp32 master w): the two above, on a bf16 copy
  // of w rounded to nearest even once per call into the context's staging (slot 0), which the
  // workspace's growth during the call cannot move. backward makes it only when dx is asked for.
  void forward(const ConvGeom& g, const BFloat16* x, const float* w, const float* b,
               BFloat16* y) override;
  void backward(const ConvGeom& g, const BFloat16* x, const float* w, const BFloat16* dy,
                BFloat16* dx, float* dw, float* db, bool accumulate) override;
  // The four calls above for a layer that keeps FilterCopies: w, its fp32 master weights, reaches
  // each plan through them. The same bits as the calls without (the same rounding and moves).
  void forward(const ConvGeom& g, const float* x, const float* w, const float* b, float* y,
               FilterCopies& copies);
  void backward(const ConvGeom& g, const float* x, const float* w, const float* dy, float* dx,
                float* dw, float* db, bool accumulate, FilterCopies& copies);
  void forward(const ConvGeom& g, const BFloat16* x, const float* w, const float* b, BFloat16* y,
               FilterCopies& copies);
  void backward(const ConvGeom& g, const BFloat16* x, const float* w, const BFloat16* dy,
                BFloat16* dx, float* dw, float* db, bool accumulate, FilterCopies& copies);

  // The plans chosen so far, and seeds not used yet: one line per key, "<key> -> <plan>", sorted by
  // key, where the key names geometry, direction and data type (e.g. "N=256 H=28 W=28 Cin=1
  // Cout=64 K=3 stride=1 pad=1 forward fp32") and the plan the filter layout and cuDNN's engine
  // ("ohwi:eng0_k2=1_k3=0"). A checkpoint stores it so that a resumed run runs the same plans.
  std::string plan_choices() const;
  // Seeds the choice of keys not built yet: such a key builds the named plan without timing; a
  // name this cuDNN does not offer (or no longer supports) is warned about and timed instead.
  // Throws an input error (naming the line) on text that is not lines of "<key> -> <plan>".
  void set_plan_choices(const std::string& text);

  // One key's choice, for bench/gpu_conv_bench.
  using Choice = PlanChoice;
  std::vector<Choice> choices() const;
  // cuDNN graphs built (every candidate graph counts) and plans executed under timing, since
  // construction: a second call on a known shape adds to neither.
  uint64_t graphs_built() const;
  uint64_t plans_timed() const;

 private:
  struct Impl;
  // w (g's filter, fp32) rounded to bf16 in staging slot 0.
  const __nv_bfloat16* bf16_weights(const ConvGeom& g, const float* w);

  std::unique_ptr<Impl> impl_;  // keeps cudnn_frontend.h out of every file that includes this one
};

}  // namespace dpt::gpu
