// The CUDA implementation of the operations interface (include/dpt/backend.h): device memory from
// cudaMalloc (counted by DeviceBuffer::allocations, so CUDA graphs notice new allocations), and the
// layer operations through cuDNN (CudnnConv), cuBLAS (cublas_linear.h), GpuBatchNorm and kernels/,
// all queued on the context's one stream. Only compiled in GPU builds.
#pragma once

#include <memory>
#include <string>

#include "cuda/gpu_context.h"
#include "dpt/backend.h"

namespace dpt::gpu {

class CudnnGraphConv;

class CudaBackend : public Backend {
 public:
  // Makes `device` current and creates its context (stream, cuDNN, cuBLAS).
  explicit CudaBackend(int device);
  ~CudaBackend() override;
  std::string name() const override { return "cuda"; }
  std::string describe() const override;  // "cuda:0 (NVIDIA H100 80GB HBM3)"
  bool host_memory() const override { return false; }
  GpuContext& context() { return *ctx_; }
  void synchronize() override;
  std::unique_ptr<Recorder> make_recorder() override;

  // After an error that may leave the stream waiting forever (a collective a dead peer never
  // completes): from now on release() frees nothing and the context is never destroyed, so no
  // teardown waits for the device. The process is about to end.
  void abandon() override { abandoned_ = true; }
  bool abandoned() const { return abandoned_; }

  void* allocate(size_t bytes) override;
  void release(void* p) noexcept override;
  void zero(void* p, size_t bytes) override;
  void copy_to_host(void* host, const void* src, size_t bytes) override;
  void copy_from_host(void* dst, const void* host, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override;

  // cuDNN's graph API in a build with cudnn-frontend (every layer's op shares one CudnnGraphConv:
  // plans per shape, timed once; a direction it has no plan for runs on the legacy API), or with
  // DPT_CUDNN_API=legacy (or without the frontend) its legacy API (CudnnConv, one per layer). Any
  // other value of the variable is refused, naming it.
  std::unique_ptr<ConvOp> make_conv() override;
  bool conv_bias_is_a_pass() const override { return true; }
  // Whether make_conv gives graph-API convolutions (DPT_CUDNN_API and the build, as above).
  bool graph_api() const;
  void profiler_window(bool on) override;
  // Counts the spans the graph API's layers keep their filter copies for (FilterCopies).
  void weights_fixed(bool fixed) override { span_.set(fixed); }
  // The graph API's plan choices (CudnnGraphConv::plan_choices): what a checkpoint stores so that a
  // resumed run runs the same plans. Before the first graph convolution exists (and on the legacy
  // API) the text last given to set_conv_plan_choices, which seeds that convolution when it is
  // made.
  std::string conv_plan_choices() const override;
  void set_conv_plan_choices(const std::string& text) override;
  std::unique_ptr<BatchNormOp> make_batchnorm(int64_t channels, double momentum,
                                              double eps) override;
  void relu_forward(const float* x, float* y, int64_t n) override;
  void relu_backward(const float* y, const float* dy, float* dx, int64_t n) override;
  void add(const float* a, const float* b, float* y, int64_t n, bool relu) override;
  void avgpool_forward(const float* x, float* y, int64_t n, int64_t h, int64_t w, int64_t c, int k,
                       int s, bool relu) override;
  void avgpool_backward(const float* dy, const float* relu_input, float* dx, int64_t n, int64_t h,
                        int64_t w, int64_t c, int k, int s) override;
  void maxpool_forward(const float* x, float* y, int64_t n, int64_t h, int64_t w, int64_t c, int k,
                       int s, int pad) override;
  void maxpool_backward(const float* x, const float* dy, float* dx, int64_t n, int64_t h, int64_t w,
                        int64_t c, int k, int s, int pad) override;
  void global_avgpool_forward(const float* x, float* y, int64_t n, int64_t hw, int64_t c) override;
  void global_avgpool_backward(const float* dy, float* dx, int64_t n, int64_t hw,
                               int64_t c) override;
  void flatten(const float* x, float* y, int64_t n, int64_t h, int64_t w, int64_t c,
               bool to_chw) override;
  void linear_forward(const float* x, const float* w, const float* b, float* y, int64_t n,
                      int64_t in, int64_t out) override;
  void linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                       float* db, int64_t n, int64_t in, int64_t out, bool accumulate) override;
  // 16-bit activations (backend.h's rule): the same kernels instantiated on bf16, one pass each;
  // Linear on bf16 tensor cores (cublas_linear.h), BatchNorm and convolution in their ops.
  void convert(const float* x, BFloat16* y, int64_t n) override;
  void convert(const BFloat16* x, float* y, int64_t n) override;
  void relu_forward(const BFloat16* x, BFloat16* y, int64_t n) override;
  void relu_backward(const BFloat16* y, const BFloat16* dy, BFloat16* dx, int64_t n) override;
  void add(const BFloat16* a, const BFloat16* b, BFloat16* y, int64_t n, bool relu) override;
  void avgpool_forward(const BFloat16* x, BFloat16* y, int64_t n, int64_t h, int64_t w, int64_t c,
                       int k, int s, bool relu) override;
  void avgpool_backward(const BFloat16* dy, const BFloat16* relu_input, BFloat16* dx, int64_t n,
                        int64_t h, int64_t w, int64_t c, int k, int s) override;
  void maxpool_forward(const BFloat16* x, BFloat16* y, int64_t n, int64_t h, int64_t w, int64_t c,
                       int k, int s, int pad) override;
  void maxpool_backward(const BFloat16* x, const BFloat16* dy, BFloat16* dx, int64_t n, int64_t h,
                        int64_t w, int64_t c, int k, int s, int pad) override;
  void global_avgpool_forward(const BFloat16* x, BFloat16* y, int64_t n, int64_t hw,
                              int64_t c) override;
  void global_avgpool_backward(const BFloat16* dy, BFloat16* dx, int64_t n, int64_t hw,
                               int64_t c) override;
  void flatten(const BFloat16* x, BFloat16* y, int64_t n, int64_t h, int64_t w, int64_t c,
               bool to_chw) override;
  void linear_forward(const BFloat16* x, const float* w, const float* b, BFloat16* y, int64_t n,
                      int64_t in, int64_t out) override;
  void linear_backward(const BFloat16* x, const float* w, const BFloat16* dy, BFloat16* dx,
                       float* dw, float* db, int64_t n, int64_t in, int64_t out,
                       bool accumulate) override;
  void gather_images(const uint8_t* images, const Label* labels, int64_t num_images,
                     const ImageBatchSpec& spec, const int64_t* idx, int64_t count, float* x,
                     int32_t* labels_out) override;
  void softmax_xent(const float* logits, const int32_t* labels, int64_t n, int64_t k,
                    float grad_scale, float label_smoothing, float* dlogits, double* sums,
                    bool accumulate) override;
  void store_scalar(float* dst, float v) override;
  void sgd_update(float* p, const float* g, float* buf, int64_t n, const float* lr, float momentum,
                  float weight_decay, bool nesterov, bool first, const double* grad_sumsq,
                  float clip_norm) override;
  void adamw_update(float* p, const float* g, float* exp_avg, float* exp_avg_sq, int64_t n,
                    const float* lr, double* step, bool count_step, double beta1, double beta2,
                    double eps, double weight_decay, const double* grad_sumsq,
                    float clip_norm) override;
  void sum_squares(const float* x, int64_t n, double* out) override;

 private:
  std::unique_ptr<GpuContext> ctx_;
  std::shared_ptr<CudnnGraphConv> graph_conv_;  // after ctx_: destroyed before it
  std::string conv_plan_seed_;
  WeightSpan span_;  // Backend::weights_fixed's, read by the layers' FilterCopies
  bool abandoned_ = false;
};

}  // namespace dpt::gpu
