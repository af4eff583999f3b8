// CudaBackend (see cuda_backend.h): device memory on the context's stream, and each layer operation
// as one call into cuDNN (CudnnConv), cuBLAS (cublas_linear.h), GpuBatchNorm or a kernels/ launch.
// Nothing here waits for the device except release and the host copies. Only in GPU builds.
#include "cuda/cuda_backend.h"

#include <cuda_profiler_api.h>

#include <cstdlib>
#include <string>
#include <utility>

#include "activation.cuh"
#include "cuda/bf16_ptr.h"
#include "cuda/conv_common.h"
#include "cuda/cublas_linear.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_graph.h"
#include "cuda/cudnn_conv.h"
#ifdef DPT_HAVE_CUDNN_FRONTEND
#include "cuda/cudnn_graph_conv.h"
#endif
#include "cuda/gpu_batchnorm.h"
#include "data.cuh"
#include "loss.cuh"
#include "optimizer.cuh"
#include "pooling.cuh"
#include "precision.cuh"

namespace dpt::gpu {

CudaBackend::CudaBackend(int device) : ctx_(std::make_unique<GpuContext>(device)) {}

CudaBackend::~CudaBackend() {
  // An abandoned stream may never drain, and destroying the context waits for it: leak it instead
  // (the process is about to end), and the graph convolution's cuDNN plans with it.
  if (abandoned_) {
    (void)ctx_.release();
    if (graph_conv_) (void)new std::shared_ptr<CudnnGraphConv>(graph_conv_);
  }
}

// ---- memory
// --------------------------------------------------------------------------------------

void* CudaBackend::allocate(size_t bytes) {
  bytes = bytes > 0 ? bytes : 1;  // never null, as on the CPU: null means "no storage" to callers
  void* p = nullptr;
  // The message names the size: an out-of-memory report is useless without it.
  DPT_LIB_CHECK("CUDA", cudaMalloc(&p, bytes), ::dpt::detail::cuda_failed, [bytes](cudaError_t e) {
    return ::dpt::detail::cuda_message(e) + " (allocating " + std::to_string(bytes) + " bytes)";
  });
  // Counted like every DeviceBuffer: a CUDA graph captured before this allocation may hold
  // pointers to storage this one replaces, so StreamGraph must see the count move.
  DeviceBuffer::note_allocation();
  try {
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, ctx_->stream()));
  } catch (...) {
    cudaFree(p);
    throw;
  }
  return p;
}

void CudaBackend::release(void* p) noexcept {
  // Abandoned: the stream may never drain, so waiting for it would hang the teardown; leak.
  if (abandoned_ || p == nullptr) return;
  // Mid-capture (a capture unwinding after an error): synchronising is not allowed there, and a
  // graph captured earlier may still point at p, which no allocation count would reveal; leak.
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(ctx_->stream(), &capturing) != cudaSuccess ||
      capturing != cudaStreamCaptureStatusNone)
    return;
  // Queued kernels may still read or write p; errors are ignored (nothing may throw here).
  cudaStreamSynchronize(ctx_->stream());
  cudaFree(p);
}

void CudaBackend::zero(void* p, size_t bytes) {
  if (bytes > 0) CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, ctx_->stream()));
}

void CudaBackend::copy_to_host(void* host, const void* src, size_t bytes) {
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, ctx_->stream()));
  ctx_->synchronize();  // pageable host memory: the copy is complete only after this
}

void CudaBackend::copy_from_host(void* dst, const void* host, size_t bytes) {
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, ctx_->stream()));
  ctx_->synchronize();  // the caller may reuse `host` as soon as this returns
}

void CudaBackend::copy(void* dst, const void* src, size_t bytes) {
  if (bytes > 0)
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx_->stream()));
}

// ---- layer operations
// ----------------------------------------------------------------------------

namespace {

// DPT_CUDNN_API: "graph" or "legacy"; unset or empty, the graph API where the build has it (the
// default since its first GPU run, H200 2026-11-26: every suite passed on it, ResNet-18 in bf16
// took 1.49 s/epoch against the legacy API's 2.18, TF32 convolutions the same time on both), else
// the legacy one. Read at each make_conv, so it applies from the model's construction on.
bool graph_api_requested() {
  const char* v = std::getenv("DPT_CUDNN_API");
  const std::string api = v ? v : "";
#ifdef DPT_HAVE_CUDNN_FRONTEND
  if (api.empty()) return true;
#endif
  if (api.empty() || api == "legacy") return false;
  DPT_INPUT_CHECK(api == "graph",
                  "DPT_CUDNN_API=" << api << " is not a cuDNN API: use legacy or graph");
#ifndef DPT_HAVE_CUDNN_FRONTEND
  DPT_INPUT_CHECK(
      false,
      "DPT_CUDNN_API=graph: this build has no cuDNN graph API (cudnn-frontend's headers were "
      "not installed when it was configured: run launch/cudnn_frontend.sh, then rebuild)");
#endif
  return true;
}

#ifdef DPT_HAVE_CUDNN_FRONTEND
// A layer's handle on the backend's one CudnnGraphConv. Where cuDNN's graph API has no plan for
// one of the layer's directions (NoGraphPlan: bf16 channel counts that are not multiples of 8 may
// have none), that direction runs on the legacy API from then on, through a CudnnConv of the
// layer's own. The switch happens on a shape's first, eager step, before anything of the call was
// written that the legacy run does not overwrite (dw and db are only touched after every plan is
// found), so the call is simply run again there.
class SharedGraphConv : public ConvOp {
 public:
  SharedGraphConv(std::shared_ptr<CudnnGraphConv> conv, GpuContext& ctx, const WeightSpan* span)
      : conv_(std::move(conv)), ctx_(ctx), copies_(span) {}
  void forward(const ConvGeom& g, const float* x, const float* w, const float* b,
               float* y) override {
    either(
        kForward, 0, [&] { conv_->forward(g, x, w, b, y, copies_); },
        [&](ConvOp& op) { op.forward(g, x, w, b, y); });
  }
  void backward(const ConvGeom& g, const float* x, const float* w, const float* dy, float* dx,
                float* dw, float* db, bool accumulate) override {
    either(
        kBackward, 0, [&] { conv_->backward(g, x, w, dy, dx, dw, db, accumulate, copies_); },
        [&](ConvOp& op) { op.backward(g, x, w, dy, dx, dw, db, accumulate); });
  }
  void forward(const ConvGeom& g, const BFloat16* x, const float* w, const float* b,
               BFloat16* y) override {
    either(
        kForward, 1, [&] { conv_->forward(g, x, w, b, y, copies_); },
        [&](ConvOp& op) { op.forward(g, x, w, b, y); });
  }
  void backward(const ConvGeom& g, const BFloat16* x, const float* w, const BFloat16* dy,
                BFloat16* dx, float* dw, float* db, bool accumulate) override {
    either(
        kBackward, 1, [&] { conv_->backward(g, x, w, dy, dx, dw, db, accumulate, copies_); },
        [&](ConvOp& op) { op.backward(g, x, w, dy, dx, dw, db, accumulate); });
  }

 private:
  enum { kForward = 0, kBackward = 1 };
  // graph() on the shared graph op, or legacy(op) on the layer's legacy one where this direction
  // and activation type (0 fp32, 1 bf16) has no graph-API plan.
  template <class Graph, class Legacy>
  void either(int dir, int type, const Graph& graph, const Legacy& legacy) {
    if (!legacy_[dir][type]) {
      try {
        graph();
        return;
      } catch (const NoGraphPlan&) {  // CudnnGraphConv logged it, once per key
        legacy_[dir][type] = true;
      }
    }
    if (!legacy_op_) legacy_op_ = std::make_unique<CudnnConv>(ctx_);
    legacy(*legacy_op_);
  }

  std::shared_ptr<CudnnGraphConv> conv_;
  GpuContext& ctx_;
  FilterCopies copies_;  // this layer's filter as its plans read it, once per WeightSpan
  std::unique_ptr<CudnnConv> legacy_op_;
  bool legacy_[2][2] = {{false, false}, {false, false}};
};
#endif

}  // namespace

std::unique_ptr<ConvOp> CudaBackend::make_conv() {
  if (graph_api_requested()) {  // only ever true in a build with the frontend
#ifdef DPT_HAVE_CUDNN_FRONTEND
    if (!graph_conv_) {
      graph_conv_ = std::make_shared<CudnnGraphConv>(*ctx_);
      graph_conv_->set_plan_choices(conv_plan_seed_);
    }
    return std::make_unique<SharedGraphConv>(graph_conv_, *ctx_, &span_);
#endif
  }
  return std::make_unique<CudnnConv>(*ctx_);
}

bool CudaBackend::graph_api() const { return graph_api_requested(); }

void CudaBackend::profiler_window(bool on) {
  ctx_->synchronize();  // the window holds the steps' work, not what was queued before
  CUDA_CHECK(on ? cudaProfilerStart() : cudaProfilerStop());
}

std::string CudaBackend::conv_plan_choices() const {
#ifdef DPT_HAVE_CUDNN_FRONTEND
  if (graph_conv_) return graph_conv_->plan_choices();
#endif
  return conv_plan_seed_;
}

void CudaBackend::set_conv_plan_choices(const std::string& text) {
#ifdef DPT_HAVE_CUDNN_FRONTEND
  if (graph_conv_) graph_conv_->set_plan_choices(text);
#endif
  conv_plan_seed_ = text;
}

std::unique_ptr<BatchNormOp> CudaBackend::make_batchnorm(int64_t channels, double momentum,
                                                         double eps) {
  return std::make_unique<GpuBatchNorm>(*ctx_, channels, momentum, eps);
}

void CudaBackend::relu_forward(const float* x, float* y, int64_t n) {
  CUDA_CHECK(cuda::launch_relu_forward(x, y, n, ctx_->stream()));
}

void CudaBackend::relu_backward(const float* y, const float* dy, float* dx, int64_t n) {
  CUDA_CHECK(cuda::launch_relu_backward(y, dy, dx, n, ctx_->stream()));
}

void CudaBackend::add(const float* a, const float* b, float* y, int64_t n, bool relu) {
  CUDA_CHECK(cuda::launch_add(a, b, y, n, relu, ctx_->stream()));
}

void CudaBackend::avgpool_forward(const float* x, float* y, int64_t n, int64_t h, int64_t w,
                                  int64_t c, int k, int s, bool relu) {
  CUDA_CHECK(cuda::launch_avgpool_forward(x, y, n, h, w, c, k, s, relu, ctx_->stream()));
}

void CudaBackend::avgpool_backward(const float* dy, const float* relu_input, float* dx, int64_t n,
                                   int64_t h, int64_t w, int64_t c, int k, int s) {
  CUDA_CHECK(cuda::launch_avgpool_backward(dy, relu_input, dx, n, h, w, c, k, s, ctx_->stream()));
}

void CudaBackend::maxpool_forward(const float* x, float* y, int64_t n, int64_t h, int64_t w,
                                  int64_t c, int k, int s, int pad) {
  CUDA_CHECK(cuda::launch_maxpool_forward(x, y, n, h, w, c, k, s, pad, ctx_->stream()));
}

void CudaBackend::maxpool_backward(const float* x, const float* dy, float* dx, int64_t n, int64_t h,
                                   int64_t w, int64_t c, int k, int s, int pad) {
  CUDA_CHECK(cuda::launch_maxpool_backward(x, dy, dx, n, h, w, c, k, s, pad, ctx_->stream()));
}

void CudaBackend::global_avgpool_forward(const float* x, float* y, int64_t n, int64_t hw,
                                         int64_t c) {
  CUDA_CHECK(cuda::launch_global_avgpool_forward(x, y, n, hw, c, ctx_->stream()));
}

void CudaBackend::global_avgpool_backward(const float* dy, float* dx, int64_t n, int64_t hw,
                                          int64_t c) {
  CUDA_CHECK(cuda::launch_global_avgpool_backward(dy, dx, n, hw, c, ctx_->stream()));
}

void CudaBackend::flatten(const float* x, float* y, int64_t n, int64_t h, int64_t w, int64_t c,
                          bool to_chw) {
  // The kernel's to_chw has the interface's meaning: true for Flatten's forward, false for its
  // backward.
  CUDA_CHECK(cuda::launch_permute_nhwc_chw(x, y, n, h, w, c, to_chw, ctx_->stream()));
}

// gpu:: qualified: the members of the same names would hide cublas_linear.h's functions.
void CudaBackend::linear_forward(const float* x, const float* w, const float* b, float* y,
                                 int64_t n, int64_t in, int64_t out) {
  gpu::linear_forward(*ctx_, x, w, b, y, n, in, out);
}

void CudaBackend::linear_backward(const float* x, const float* w, const float* dy, float* dx,
                                  float* dw, float* db, int64_t n, int64_t in, int64_t out,
                                  bool accumulate) {
  gpu::linear_backward(*ctx_, x, w, dy, dx, dw, db, n, in, out, accumulate);
}

// ---- 16-bit activations: kernels/ on bf16 bit patterns, Linear on bf16 tensor cores
// ---------------

void CudaBackend::convert(const float* x, BFloat16* y, int64_t n) {
  CUDA_CHECK(cuda::launch_to_bf16(x, bits(y), n, ctx_->stream()));
}

void CudaBackend::convert(const BFloat16* x, float* y, int64_t n) {
  CUDA_CHECK(cuda::launch_from_bf16(bits(x), y, n, false, ctx_->stream()));
}

void CudaBackend::relu_forward(const BFloat16* x, BFloat16* y, int64_t n) {
  CUDA_CHECK(cuda::launch_relu_forward(bits(x), bits(y), n, ctx_->stream()));
}

void CudaBackend::relu_backward(const BFloat16* y, const BFloat16* dy, BFloat16* dx, int64_t n) {
  CUDA_CHECK(cuda::launch_relu_backward(bits(y), bits(dy), bits(dx), n, ctx_->stream()));
}

void CudaBackend::add(const BFloat16* a, const BFloat16* b, BFloat16* y, int64_t n, bool relu) {
  CUDA_CHECK(cuda::launch_add(bits(a), bits(b), bits(y), n, relu, ctx_->stream()));
}

void CudaBackend::avgpool_forward(const BFloat16* x, BFloat16* y, int64_t n, int64_t h, int64_t w,
                                  int64_t c, int k, int s, bool relu) {
  CUDA_CHECK(
      cuda::launch_avgpool_forward(bits(x), bits(y), n, h, w, c, k, s, relu, ctx_->stream()));
}

void CudaBackend::avgpool_backward(const BFloat16* dy, const BFloat16* relu_input, BFloat16* dx,
                                   int64_t n, int64_t h, int64_t w, int64_t c, int k, int s) {
  CUDA_CHECK(cuda::launch_avgpool_backward(bits(dy), bits(relu_input), bits(dx), n, h, w, c, k, s,
                                           ctx_->stream()));
}

void CudaBackend::maxpool_forward(const BFloat16* x, BFloat16* y, int64_t n, int64_t h, int64_t w,
                                  int64_t c, int k, int s, int pad) {
  CUDA_CHECK(cuda::launch_maxpool_forward(bits(x), bits(y), n, h, w, c, k, s, pad, ctx_->stream()));
}

void CudaBackend::maxpool_backward(const BFloat16* x, const BFloat16* dy, BFloat16* dx, int64_t n,
                                   int64_t h, int64_t w, int64_t c, int k, int s, int pad) {
  CUDA_CHECK(cuda::launch_maxpool_backward(bits(x), bits(dy), bits(dx), n, h, w, c, k, s, pad,
                                           ctx_->stream()));
}

void CudaBackend::global_avgpool_forward(const BFloat16* x, BFloat16* y, int64_t n, int64_t hw,
                                         int64_t c) {
  CUDA_CHECK(cuda::launch_global_avgpool_forward(bits(x), bits(y), n, hw, c, ctx_->stream()));
}

void CudaBackend::global_avgpool_backward(const BFloat16* dy, BFloat16* dx, int64_t n, int64_t hw,
                                          int64_t c) {
  CUDA_CHECK(cuda::launch_global_avgpool_backward(bits(dy), bits(dx), n, hw, c, ctx_->stream()));
}

void CudaBackend::flatten(const BFloat16* x, BFloat16* y, int64_t n, int64_t h, int64_t w,
                          int64_t c, bool to_chw) {
  CUDA_CHECK(cuda::launch_permute_nhwc_chw(bits(x), bits(y), n, h, w, c, to_chw, ctx_->stream()));
}

void CudaBackend::linear_forward(const BFloat16* x, const float* w, const float* b, BFloat16* y,
                                 int64_t n, int64_t in, int64_t out) {
  gpu::linear_forward(*ctx_, nv(x), w, b, nv(y), n, in, out);
}

void CudaBackend::linear_backward(const BFloat16* x, const float* w, const BFloat16* dy,
                                  BFloat16* dx, float* dw, float* db, int64_t n, int64_t in,
                                  int64_t out, bool accumulate) {
  gpu::linear_backward(*ctx_, nv(x), w, nv(dy), nv(dx), dw, db, n, in, out, accumulate);
}

// ---- training-step operations
// --------------------------------------------------------------------

void CudaBackend::gather_images(const uint8_t* images, const Label* labels, int64_t,
                                const ImageBatchSpec& spec, const int64_t* idx, int64_t count,
                                float* x, int32_t* labels_out) {
  CUDA_CHECK(
      cuda::launch_gather_images(images, labels, idx, count, spec, x, labels_out, ctx_->stream()));
}

void CudaBackend::softmax_xent(const float* logits, const int32_t* labels, int64_t n, int64_t k,
                               float grad_scale, float label_smoothing, float* dlogits,
                               double* sums, bool accumulate) {
  // Per-row losses and hits in the shared workspace, summed in a fixed order (bit-reproducible).
  WorkspaceLayout lay;
  const size_t loss_at = lay.add(static_cast<size_t>(n) * sizeof(float));
  const size_t hits_at = lay.add(static_cast<size_t>(n) * sizeof(int32_t));
  auto* ws = static_cast<char*>(ctx_->workspace(lay.total()));
  auto* loss = reinterpret_cast<float*>(ws + loss_at);
  auto* hits = reinterpret_cast<int32_t*>(ws + hits_at);
  CUDA_CHECK(cuda::launch_softmax_xent(logits, labels, n, k, grad_scale, label_smoothing, loss,
                                       hits, dlogits, ctx_->stream()));
  CUDA_CHECK(cuda::launch_loss_sums(loss, hits, n, sums, accumulate, ctx_->stream()));
}

void CudaBackend::store_scalar(float* dst, float v) {
  CUDA_CHECK(cuda::launch_store_scalar(dst, v, ctx_->stream()));
}

void CudaBackend::sgd_update(float* p, const float* g, float* buf, int64_t n, const float* lr,
                             float momentum, float weight_decay, bool nesterov, bool first,
                             const double* grad_sumsq, float clip_norm) {
  CUDA_CHECK(cuda::launch_sgd_update(p, g, buf, n, lr, momentum, weight_decay, nesterov, first,
                                     grad_sumsq, clip_norm, ctx_->stream()));
}

void CudaBackend::adamw_update(float* p, const float* g, float* exp_avg, float* exp_avg_sq,
                               int64_t n, const float* lr, double* step, bool count_step,
                               double beta1, double beta2, double eps, double weight_decay,
                               const double* grad_sumsq, float clip_norm) {
  CUDA_CHECK(cuda::launch_adamw_update(p, g, exp_avg, exp_avg_sq, n, lr, step, count_step, beta1,
                                       beta2, eps, weight_decay, grad_sumsq, clip_norm,
                                       ctx_->stream()));
}

void CudaBackend::sum_squares(const float* x, int64_t n, double* out) {
  auto* partials =
      static_cast<double*>(ctx_->workspace(sizeof(double) * cuda::sum_squares_partials()));
  CUDA_CHECK(cuda::launch_sum_squares(x, n, partials, out, ctx_->stream()));
}

// ---- recorded work: CUDA graphs of the context's stream ---------------------------------------

namespace {

class GraphRecorder : public Recorder {
 public:
  explicit GraphRecorder(cudaStream_t stream) : stream_(stream) {}
  Ran run(bool capture, const std::function<void(bool)>& prepare, const std::function<void()>& body,
          const std::function<bool(bool)>& agree) override {
    switch (graph_.run(stream_, capture, prepare, body, agree)) {
      case StreamGraph::Ran::kCaptured:
        return Ran::kCaptured;
      case StreamGraph::Ran::kReplayed:
        return Ran::kReplayed;
      case StreamGraph::Ran::kEager:
        break;
    }
    return Ran::kEager;
  }
  bool exists() const override { return graph_.exists(); }
  bool valid() const override { return graph_.valid(); }
  bool warm() const override { return graph_.warm(); }
  void reset() override { graph_.reset(); }
  const std::string& failure() const override { return graph_.failure(); }
  size_t nodes() const override { return graph_.nodes(); }

 private:
  cudaStream_t stream_;
  StreamGraph graph_;
};

}  // namespace

std::unique_ptr<Recorder> CudaBackend::make_recorder() {
  return std::make_unique<GraphRecorder>(ctx_->stream());
}

std::string CudaBackend::describe() const {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, ctx_->device()) != cudaSuccess) {
    cudaGetLastError();
    return "cuda:" + std::to_string(ctx_->device());
  }
  return "cuda:" + std::to_string(ctx_->device()) + " (" + prop.name + ")";
}

void CudaBackend::synchronize() {
  if (!abandoned_) ctx_->synchronize();
}

}  // namespace dpt::gpu
