// The operations interface every compute backend implements (ggml's backend table is the model):
// device memory and the leaf operations of the layers in nn.h, on pointers the backend allocated.
// Layers, models and the gradient announcements are written once, over this; the CPU backend
// (src/cpu/cpu_backend.cc) runs src/cpu, the CUDA one (src/cuda/cuda_backend.cc) cuDNN, cuBLAS and
// kernels/. Host-only header: no CUDA type appears here.
//
// Semantics are the CPU's (src/cpu/ops.h says each one in full): 4-D activations NHWC, weights
// PyTorch's layout, parameter gradients overwritten or, with `accumulate`, added to. A backend may
// only queue the work (a GPU stream); host reads go through copy_to_host, which waits.
//
// 16-bit activations (--activation-dtype bf16, PyTorch autocast's storage): the operations on
// activations have a BFloat16 overload. Its rule: every BFloat16 input widened to float (exact),
// the float operation, every BFloat16 output rounded to nearest even; parameters, their gradients,
// BatchNorm's statistics and the loss stay float. The CPU does exactly that; a GPU computes it in
// one pass, with the same bits for the element-wise operations and BatchNorm's apply, and within
// its float form's accumulation-order differences for the convolutions, GEMMs and reductions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "dpt/dataset.h"
#include "dpt/half.h"
#include "dpt/image_transform.h"

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

// Work a backend can record once and replay with one launch (CUDA graphs); the CPU has none.
// Recordings hold raw pointers: every allocation on the backend since the capture makes one stale.
class Recorder {
 public:
  enum class Ran { kEager, kCaptured, kReplayed };
  virtual ~Recorder() = default;
  // Queues body's work: replayed when a valid recording exists; else, with `capture` (the
  // caller's decision, the same on every rank where the body holds collectives), captured and
  // launched if agree(captured here) says every rank captured; else eager. prepare(capturing) runs
  // before each attempt at body (not before a replay). A failed capture is dropped (failure()
  // says why) and the work runs eagerly; eager errors propagate.
  virtual Ran run(bool capture, const std::function<void(bool capturing)>& prepare,
                  const std::function<void()>& body,
                  const std::function<bool(bool captured)>& agree) = 0;
  virtual bool exists() const = 0;
  virtual bool valid() const = 0;  // exists, and nothing allocated since its capture
  // The last run was eager, allocated nothing itself, and nothing was allocated since.
  virtual bool warm() const = 0;
  virtual void reset() = 0;
  virtual const std::string& failure() const = 0;
  virtual size_t nodes() const = 0;
};

// One per convolution layer: it may cache plans per geometry (oneDNN primitives, cuDNN algorithms).
class ConvOp {
 public:
  virtual ~ConvOp() = default;
  // y[N,OH,OW,Cout] = conv(x[N,H,W,Cin], w[Cout,Cin,K,K]) + b (b may be null).
  virtual void forward(const ConvGeom& g, const float* x, const float* w, const float* b,
                       float* y) = 0;
  // dx (nullable) = conv_backward_data (overwritten); dw, db (nullable) = gradients, added to when
  // accumulate.
  virtual void backward(const ConvGeom& g, const float* x, const float* w, const float* dy,
                        float* dx, float* dw, float* db, bool accumulate) = 0;
  // 16-bit activations: x, y, dy, dx bfloat16; w, b, dw, db float.
  virtual void forward(const ConvGeom& g, const BFloat16* x, const float* w, const float* b,
                       BFloat16* y) = 0;
  virtual void backward(const ConvGeom& g, const BFloat16* x, const float* w, const BFloat16* dy,
                        BFloat16* dx, float* dw, float* db, bool accumulate) = 0;
};

// One per BatchNorm layer over rows of [m, C] (m = N*H*W): it keeps the last forward's mean,
// invstd and row count for backward. Parameters and running statistics are the caller's.
//
// Fusion (the layers' BatchNorm2d+ReLU and Residual's bn2 + skip + ReLU): both forwards end in an
// epilogue y = relu(bn(x) + residual), `residual` nullable ([m, C] like x, not aliasing y), relu
// applied when set; each step rounds exactly as the separate add() and relu_forward() would (one
// pass instead of three, the same bits). backward's relu_out (nullable) is that forward's y: the
// gradient BatchNorm then takes is dz = (relu_out > 0 ? dy : 0), relu_backward's rule, formed on
// the fly; dz_out (nullable) receives the gradient taken (dz, or dy without relu_out), which a
// residual join's skip path needs as well.
class BatchNormOp {
 public:
  virtual ~BatchNormOp() = default;
  // Batch statistics ([sum, sumsq, count] summed through `sync` when set) normalise; running_mean
  // and running_var (unbiased) move by PyTorch's momentum; num_batches_tracked[0] += 1.
  virtual void forward_train(const float* x, float* y, int64_t m, const float* gamma,
                             const float* beta, float* running_mean, float* running_var,
                             float* num_batches_tracked, const ChannelSumFn& sync,
                             const float* residual, bool relu) = 0;
  // The running statistics normalise; nothing is updated.
  virtual void forward_eval(const float* x, float* y, int64_t m, const float* gamma,
                            const float* beta, const float* running_mean, const float* running_var,
                            const float* residual, bool relu) = 0;
  // Of the last forward (same x and m), with g = dy or the masked dz: dgamma (+)= sum g*xhat,
  // dbeta (+)= sum g over this replica's rows; dx (nullable) after a training forward uses the
  // sums over every replica (through `sync`), after an evaluation forward is g*gamma*invstd.
  virtual void backward(const float* x, const float* dy, float* dx, int64_t m, const float* gamma,
                        float* dgamma, float* dbeta, bool accumulate, const ChannelSumFn& sync,
                        const float* relu_out, float* dz_out) = 0;
  // 16-bit activations: x, y, residual, dy, dx, relu_out and dz_out bfloat16; the rest float.
  virtual void forward_train(const BFloat16* x, BFloat16* y, int64_t m, const float* gamma,
                             const float* beta, float* running_mean, float* running_var,
                             float* num_batches_tracked, const ChannelSumFn& sync,
                             const BFloat16* residual, bool relu) = 0;
  virtual void forward_eval(const BFloat16* x, BFloat16* y, int64_t m, const float* gamma,
                            const float* beta, const float* running_mean, const float* running_var,
                            const BFloat16* residual, bool relu) = 0;
  virtual void backward(const BFloat16* x, const BFloat16* dy, BFloat16* dx, int64_t m,
                        const float* gamma, float* dgamma, float* dbeta, bool accumulate,
                        const ChannelSumFn& sync, const BFloat16* relu_out, BFloat16* dz_out) = 0;
  // A per-channel shift that the training forward's input lacks (null: none; C floats of backend
  // memory, read at every training forward): the running mean moves toward the batch mean plus
  // the shift. A training forward's output ignores a per-channel shift of its input, so the bias
  // of a convolution just before need not be added there (nn.h's fold_conv_biases); only the
  // running mean, which evaluation uses with the bias added, must see it. Nothing else changes:
  // the variance is shift-invariant, and backward reads the same unshifted input.
  void set_mean_shift(const float* shift) { mean_shift_ = shift; }

 protected:
  const float* mean_shift_ = nullptr;
};

class Backend;

// The spans in which the parameters do not change (Backend::weights_fixed: a step's forward and
// backward passes, an evaluation), as a backend counts them: while one is open, an operation may
// reuse the weights it converted or reordered earlier in the same span, so that happens once per
// step (or evaluation), not once per call. Spans are numbered from 1; a conversion made outside
// any span has number 0 and is never reused. Both backends keep one (the CPU's oneDNN reorders and
// bf16 copies, the GPU's filter copies in the layout and type cuDNN's plans read).
struct WeightSpan {
  bool open = false;
  uint64_t id = 0;
  uint64_t current() const { return open ? id : 0; }
  // Whether a conversion of `src` made in span `made` of `made_src` still holds.
  bool holds(uint64_t made, const void* made_src, const void* src) const {
    return open && made == id && made_src == src;
  }
  // Backend::weights_fixed(fixed): a new span opens, or the open one closes.
  void set(bool fixed) {
    if (fixed) ++id;
    open = fixed;
  }
};

// Backend::weights_fixed for one scope (closed also when the scope ends by an exception).
class WeightsFixed {
 public:
  explicit WeightsFixed(Backend& be);
  ~WeightsFixed();
  WeightsFixed(const WeightsFixed&) = delete;
  WeightsFixed& operator=(const WeightsFixed&) = delete;

 private:
  Backend& be_;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda"
  // This rank's device for the start-up banner: "cpu", "cuda:0 (NVIDIA H100 80GB HBM3)".
  virtual std::string describe() const { return name(); }
  // Whether its memory is host memory (then host views need no copies).
  virtual bool host_memory() const = 0;
  // Waits for everything queued. Callers first make sure nothing queued waits for a peer.
  virtual void synchronize() {}
  // After an error that may leave queued work waiting forever (a collective a dead peer never
  // completes): from now on nothing waits for the device and nothing is freed (process ending).
  virtual void abandon() {}
  // A recorder of queued work (CUDA graphs), or null where the backend has none.
  virtual std::unique_ptr<Recorder> make_recorder() { return nullptr; }
  // Choices this backend made by timing (cuDNN graph-API convolution plans), as text: checkpoints
  // store each rank's, and a resumed run seeds them before its first step so it runs the same
  // kernels and computes the same bits. "" where every choice is a fixed rule (the CPU).
  virtual std::string conv_plan_choices() const { return ""; }
  virtual void set_conv_plan_choices(const std::string& /*text*/) {}
  // Opens (on) or closes an external profiler's window: CUDA's cudaProfilerStart/Stop, so that
  // `ncu --profile-from-start off` measures the steps of DPT_PROFILE_STEPS alone (StepEngine).
  virtual void profiler_window(bool /*on*/) {}
  // Opens (true) or closes a span in which the caller promises the parameters do not change (the
  // StepEngine: a step's forward and backward passes, an evaluation; see WeightsFixed). Within
  // one a backend may keep the weights it converted or reordered for its kernels (bf16 copies,
  // oneDNN's blocked layouts) instead of redoing it every call: once per step, not once per
  // micro-batch. Outside spans every call converts afresh.
  virtual void weights_fixed(bool /*fixed*/) {}

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
  // Whether its convolutions add their bias in a pass of its own (cuDNN: a kernel over the whole
  // output), so that a model folds the bias of each convolution followed by BatchNorm into that
  // BatchNorm's running mean in training (nn.h's fold_conv_biases). Not where the bias comes free
  // inside the convolution (oneDNN's primitives): there the fold would only change the bits.
  virtual bool conv_bias_is_a_pass() const { return false; }
  virtual std::unique_ptr<BatchNormOp> make_batchnorm(int64_t channels, double momentum,
                                                      double eps) = 0;
  virtual void relu_forward(const float* x, float* y, int64_t n) = 0;
  // dx = dy where y > 0 (y: the forward output), else 0.
  virtual void relu_backward(const float* y, const float* dy, float* dx, int64_t n) = 0;
  // y = a + b, then max(y, 0) when relu (the residual join). y may not alias a or b.
  virtual void add(const float* a, const float* b, float* y, int64_t n, bool relu) = 0;
  // k x k window, stride s, no padding, floor mode; relu: the ReLU before it fused (x is its
  // input).
  virtual void avgpool_forward(const float* x, float* y, int64_t n, int64_t h, int64_t w, int64_t c,
                               int k, int s, bool relu) = 0;
  // dx overwritten; relu_input: the fused ReLU's input (masks dx), or null.
  virtual void avgpool_backward(const float* dy, const float* relu_input, float* dx, int64_t n,
                                int64_t h, int64_t w, int64_t c, int k, int s) = 0;
  // k x k window, stride s, `pad` on each side (pad < k; padding never wins), floor mode; each
  // window's first maximum in row-major order wins, a NaN over any number (PyTorch's rule).
  virtual void maxpool_forward(const float* x, float* y, int64_t n, int64_t h, int64_t w, int64_t c,
                               int k, int s, int pad) = 0;
  // dx overwritten: each output's gradient added at its window's winner (recomputed from x, the
  // forward input), in row-major output order; 0 where nothing wins.
  virtual void maxpool_backward(const float* x, const float* dy, float* dx, int64_t n, int64_t h,
                                int64_t w, int64_t c, int k, int s, int pad) = 0;
  virtual void global_avgpool_forward(const float* x, float* y, int64_t n, int64_t hw,
                                      int64_t c) = 0;
  virtual void global_avgpool_backward(const float* dy, float* dx, int64_t n, int64_t hw,
                                       int64_t c) = 0;
  // NHWC [N,H,W,C] -> [N, C*H*W] in PyTorch's (c, h, w) flatten order, and back (to_chw false).
  virtual void flatten(const float* x, float* y, int64_t n, int64_t h, int64_t w, int64_t c,
                       bool to_chw) = 0;
  // y[n,out] = x[n,in] W[out,in]^T + b (b may be null).
  virtual void linear_forward(const float* x, const float* w, const float* b, float* y, int64_t n,
                              int64_t in, int64_t out) = 0;
  // dx (nullable) = dy W; dW (+)= dy^T x; db (nullable) (+)= sum_n dy.
  virtual void linear_backward(const float* x, const float* w, const float* dy, float* dx,
                               float* dw, float* db, int64_t n, int64_t in, int64_t out,
                               bool accumulate) = 0;

  // ---- 16-bit activations: the operations above on bfloat16 activations (rule at the top) -----
  // y[i] = bf16(x[i]) to nearest even, and back (exact).
  virtual void convert(const float* x, BFloat16* y, int64_t n) = 0;
  virtual void convert(const BFloat16* x, float* y, int64_t n) = 0;
  virtual void relu_forward(const BFloat16* x, BFloat16* y, int64_t n) = 0;
  virtual void relu_backward(const BFloat16* y, const BFloat16* dy, BFloat16* dx, int64_t n) = 0;
  virtual void add(const BFloat16* a, const BFloat16* b, BFloat16* y, int64_t n, bool relu) = 0;
  virtual void avgpool_forward(const BFloat16* x, BFloat16* y, int64_t n, int64_t h, int64_t w,
                               int64_t c, int k, int s, bool relu) = 0;
  virtual void avgpool_backward(const BFloat16* dy, const BFloat16* relu_input, BFloat16* dx,
                                int64_t n, int64_t h, int64_t w, int64_t c, int k, int s) = 0;
  virtual void maxpool_forward(const BFloat16* x, BFloat16* y, int64_t n, int64_t h, int64_t w,
                               int64_t c, int k, int s, int pad) = 0;
  virtual void maxpool_backward(const BFloat16* x, const BFloat16* dy, BFloat16* dx, int64_t n,
                                int64_t h, int64_t w, int64_t c, int k, int s, int pad) = 0;
  virtual void global_avgpool_forward(const BFloat16* x, BFloat16* y, int64_t n, int64_t hw,
                                      int64_t c) = 0;
  virtual void global_avgpool_backward(const BFloat16* dy, BFloat16* dx, int64_t n, int64_t hw,
                                       int64_t c) = 0;
  virtual void flatten(const BFloat16* x, BFloat16* y, int64_t n, int64_t h, int64_t w, int64_t c,
                       bool to_chw) = 0;
  // x, y, dy, dx bfloat16; w, b, dw, db float.
  virtual void linear_forward(const BFloat16* x, const float* w, const float* b, BFloat16* y,
                              int64_t n, int64_t in, int64_t out) = 0;
  virtual void linear_backward(const BFloat16* x, const float* w, const BFloat16* dy, BFloat16* dx,
                               float* dw, float* db, int64_t n, int64_t in, int64_t out,
                               bool accumulate) = 0;

  // ---- training-step operations --------------------------------------------------------------
  // x[i] = image idx[i] transformed as `spec` says (image_transform.h: crop, flip, / 255,
  // normalisation; plain x / 255 without draws and means) and labels_out[i] = labels[idx[i]] for
  // i < count, from a data set of num_images images of spec.pixels() uint8 each.
  virtual void gather_images(const uint8_t* images, const Label* labels, int64_t num_images,
                             const ImageBatchSpec& spec, const int64_t* idx, int64_t count,
                             float* x, int32_t* labels_out) = 0;
  // Softmax cross-entropy on logits [n, k], with PyTorch's label smoothing e (0: none): sums[0]
  // (+)= the summed loss, each row's (1-e) (lse - z_y) + e (lse - mean_j z_j) (CrossEntropyLoss(
  // label_smoothing=e) before its mean), and sums[1] (+)= the count of argmax hits (doubles; added
  // to when accumulate); dlogits (nullable) = (softmax - q) * grad_scale with q = (1-e) onehot +
  // e/k.
  virtual void softmax_xent(const float* logits, const int32_t* labels, int64_t n, int64_t k,
                            float grad_scale, float label_smoothing, float* dlogits, double* sums,
                            bool accumulate) = 0;
  // *dst = v, in the order of the queued work (a learning rate a recorded step reads).
  virtual void store_scalar(float* dst, float v) = 0;
  // PyTorch's SGD (dampening 0) over n floats: d = c g + wd p; buf = first ? d : momentum buf + d;
  // p -= lr (nesterov ? d + momentum buf : buf) (buf unused and p -= lr d when momentum is 0). lr:
  // one float of backend memory. grad_sumsq (nullable, one double of backend memory, sum_squares
  // of g): when it is not finite nothing is updated (the non-finite guard, decided where the data
  // is: no host round trip); with clip_norm > 0, c = min(1, clip_norm / (norm + 1e-6)) in torch's
  // fp32 arithmetic (PyTorch's clip_grad_norm_, clip_coefficient in dpt/clip.h), else c = 1.
  virtual void sgd_update(float* p, const float* g, float* buf, int64_t n, const float* lr,
                          float momentum, float weight_decay, bool nesterov, bool first,
                          const double* grad_sumsq, float clip_norm) = 0;
  // torch.optim.AdamW (amsgrad off) over n floats, with t = *step + 1 (step: one double of backend
  // memory, the updates applied before this one) and d = c g (c, grad_sumsq and the guard as
  // sgd_update):
  //   p *= 1 - lr wd;  m = b1 m + (1-b1) d;  v = b2 v + (1-b2) d^2;
  //   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
  // the scalars formed in double and rounded to float, as PyTorch's Python scalars are. With
  // count_step, *step = t afterwards (only when the update was applied): a step cut into several
  // calls (ranges of other weight decay) counts once, in its last call.
  virtual void adamw_update(float* p, const float* g, float* exp_avg, float* exp_avg_sq, int64_t n,
                            const float* lr, double* step, bool count_step, double beta1,
                            double beta2, double eps, double weight_decay, const double* grad_sumsq,
                            float clip_norm) = 0;
  // out[0] = sum of x[i]^2 over n floats, in double, in a fixed order (out: backend memory).
  virtual void sum_squares(const float* x, int64_t n, double* out) = 0;
};

// A typed, move-only array of backend memory (zero-filled), or a view of host memory where the
// backend's memory is the host's (data sets are not copied there).
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(Backend& be, int64_t count) : be_(&be), count_(count) {
    data_ = static_cast<T*>(be.allocate(static_cast<size_t>(count > 0 ? count : 1) * sizeof(T)));
    owned_ = true;
  }
  // The host array in backend memory: a view of it on a host backend, else a copy.
  static DeviceArray mirror(Backend& be, const T* host, int64_t count) {
    if (be.host_memory()) {
      DeviceArray a;
      a.be_ = &be;
      a.count_ = count;
      a.data_ = const_cast<T*>(host);
      return a;
    }
    DeviceArray a(be, count);
    a.copy_from_host(host, count);
    return a;
  }
  ~DeviceArray() { release(); }
  DeviceArray(DeviceArray&& o) noexcept { *this = std::move(o); }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    if (this != &o) {
      release();
      be_ = o.be_, data_ = o.data_, count_ = o.count_, owned_ = o.owned_;
      o.data_ = nullptr, o.count_ = 0, o.owned_ = false;
    }
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* data() const { return data_; }
  int64_t size() const { return count_; }
  void copy_from_host(const T* host, int64_t count, int64_t at = 0) {
    if (count > 0) be_->copy_from_host(data_ + at, host, static_cast<size_t>(count) * sizeof(T));
  }
  void copy_to_host(T* host, int64_t count, int64_t at = 0) const {
    if (count > 0) be_->copy_to_host(host, data_ + at, static_cast<size_t>(count) * sizeof(T));
  }

 private:
  void release() noexcept {
    if (owned_ && data_) be_->release(data_);
    data_ = nullptr;
    owned_ = false;
  }
  Backend* be_ = nullptr;
  T* data_ = nullptr;
  int64_t count_ = 0;
  bool owned_ = false;
};

// The process's CPU backend (src/cpu), shared: it holds no state of its own.
Backend& cpu_backend();

inline WeightsFixed::WeightsFixed(Backend& be) : be_(be) { be_.weights_fixed(true); }
inline WeightsFixed::~WeightsFixed() { be_.weights_fixed(false); }

}  // namespace dpt
