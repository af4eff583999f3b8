// The operations interface every compute backend implements (ggml's backend table is the model):
// device memory and the leaf operations of the layers in nn.h, on pointers the backend allocated.
// Layers, models and the gradient announcements are written once, over this; the CPU backend
// (src/cpu/cpu_backend.cc) runs src/cpu, the CUDA one (src/cuda/cuda_backend.cc) cuDNN, cuBLAS and
// kernels/. Host-only header: no CUDA type appears here.
//
// Semantics are the CPU's (src/cpu/ops.h says each one in full): 4-D activations NHWC, weights
// PyTorch's layout, parameter gradients overwritten or, with `accumulate`, added to. A backend may
// only queue the work (a GPU stream); host reads go through copy_to_host, which waits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace dpt {

// Geometry of a square-kernel convolution over NHWC input [n, h, w, c_in].
struct ConvGeom {
  int64_t n = 0, h = 0, w = 0, c_in = 0, c_out = 0, k = 0, stride = 1, pad = 0;
  int64_t oh() const { return (h + 2 * pad - k) / stride + 1; }
  int64_t ow() const { return (w + 2 * pad - k) / stride + 1; }
};

// Sums `count` doubles of backend memory in place across the replicas (synchronised BatchNorm);
// empty: per-replica statistics.
using ChannelSumFn = std::function<void(double* data, int64_t count)>;

// One per convolution layer: it may cache plans per geometry (oneDNN primitives, cuDNN algorithms).
class ConvOp {
 public:
  virtual ~ConvOp() = default;
  // y[N,OH,OW,Cout] = conv(x[N,H,W,Cin], w[Cout,Cin,K,K]) + b (b may be null).
  virtual void forward(const ConvGeom& g, const float* x, const float* w, const float* b, float* y) = 0;
  // dx (nullable) = conv_backward_data (overwritten); dw, db (nullable) = gradients, added to when
  // accumulate.
  virtual void backward(const ConvGeom& g, const float* x, const float* w, const float* dy, float* dx, float* dw,
                        float* db, bool accumulate) = 0;
};

// One per BatchNorm layer over rows of [m, C] (m = N*H*W): it keeps the last forward's mean,
// invstd and row count for backward. Parameters and running statistics are the caller's.
class BatchNormOp {
 public:
  virtual ~BatchNormOp() = default;
  // Batch statistics ([sum, sumsq, count] summed through `sync` when set) normalise; running_mean
  // and running_var (unbiased) move by PyTorch's momentum; num_batches_tracked[0] += 1.
  virtual void forward_train(const float* x, float* y, int64_t m, const float* gamma, const float* beta,
                             float* running_mean, float* running_var, float* num_batches_tracked,
                             const ChannelSumFn& sync) = 0;
  // The running statistics normalise; nothing is updated.
  virtual void forward_eval(const float* x, float* y, int64_t m, const float* gamma, const float* beta,
                            const float* running_mean, const float* running_var) = 0;
  // Of the last forward (same x and m): dgamma (+)= sum dy*xhat, dbeta (+)= sum dy over this
  // replica's rows; dx (nullable) after a training forward uses the sums over every replica
  // (through `sync`), after an evaluation forward is dy*gamma*invstd.
  virtual void backward(const float* x, const float* dy, float* dx, int64_t m, const float* gamma, float* dgamma,
                        float* dbeta, bool accumulate, const ChannelSumFn& sync) = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda"
  // Whether its memory is host memory (then host views need no copies).
  virtual bool host_memory() const = 0;

  // ---- memory --------------------------------------------------------------------------------
  // Zero-filled storage of `bytes` (at least 64-byte aligned); release waits for queued work that
  // may still use it. Both throw dpt::Error on failure, naming the size.
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* p) noexcept = 0;
  virtual void zero(void* p, size_t bytes) = 0;
  // Between host and backend memory; both return when the copy is complete.
  virtual void copy_to_host(void* host, const void* src, size_t bytes) = 0;
  virtual void copy_from_host(void* dst, const void* host, size_t bytes) = 0;
  // Within backend memory, in the order of the queued work.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;

  // ---- layer operations ------------------------------------------------------------------------
  virtual std::unique_ptr<ConvOp> make_conv() = 0;
  virtual std::unique_ptr<BatchNormOp> make_batchnorm(int64_t channels, double momentum, double eps) = 0;
  virtual void relu_forward(const float* x, float* y, int64_t n) = 0;
  // dx = dy where y > 0 (y: the forward output), else 0.
  virtual void relu_backward(const float* y, const float* dy, float* dx, int64_t n) = 0;
  // y = a + b, then max(y, 0) when relu (the residual join). y may not alias a or b.
  virtual void add(const float* a, const float* b, float* y, int64_t n, bool relu) = 0;
  // k x k window, stride s, no padding, floor mode; relu: the ReLU before it fused (x is its input).
  virtual void avgpool_forward(const float* x, float* y, int64_t n, int64_t h, int64_t w, int64_t c, int k, int s,
                               bool relu) = 0;
  // dx overwritten; relu_input: the fused ReLU's input (masks dx), or null.
  virtual void avgpool_backward(const float* dy, const float* relu_input, float* dx, int64_t n, int64_t h, int64_t w,
                                int64_t c, int k, int s) = 0;
  virtual void global_avgpool_forward(const float* x, float* y, int64_t n, int64_t hw, int64_t c) = 0;
  virtual void global_avgpool_backward(const float* dy, float* dx, int64_t n, int64_t hw, int64_t c) = 0;
  // NHWC [N,H,W,C] -> [N, C*H*W] in PyTorch's (c, h, w) flatten order, and back (to_chw false).
  virtual void flatten(const float* x, float* y, int64_t n, int64_t h, int64_t w, int64_t c, bool to_chw) = 0;
  // y[n,out] = x[n,in] W[out,in]^T + b (b may be null).
  virtual void linear_forward(const float* x, const float* w, const float* b, float* y, int64_t n, int64_t in,
                              int64_t out) = 0;
  // dx (nullable) = dy W; dW (+)= dy^T x; db (nullable) (+)= sum_n dy.
  virtual void linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                               int64_t n, int64_t in, int64_t out, bool accumulate) = 0;
};

// The process's CPU backend (src/cpu), shared: it holds no state of its own.
Backend& cpu_backend();

}  // namespace dpt
