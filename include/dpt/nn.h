// Layers, the parameter store with its flat buffers, and models, written once over the operations
// interface of backend.h: the same layer tree runs on every backend (the one its ParamStore names).
// Invariant: all parameters of a model live in ONE flat buffer and all gradients in another, laid
// out in reverse registration order (= the order backward produces them), so a gradient bucket is a
// contiguous slice and backward announces a growing prefix [0, k) of the gradient buffer.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dpt/backend.h"
#include "dpt/tensor.h"

namespace dpt {

// kTrain: batch statistics, everything backward needs kept (until that backward, which hands it
// back to the model's pool: one backward per forward, as in PyTorch). kEval: running statistics,
// and still kept (a backward may follow: the gradient of the evaluation-mode function). kInfer:
// kEval's arithmetic with nothing kept (PyTorch's eval() under no_grad): the composites borrow
// their intermediates from the model's pool and hand each back once the next layer has read it,
// and a backward after it is refused. Evaluation and predict run kInfer.
enum class Mode { kTrain, kEval, kInfer };
enum class Init { kWeight, kBias, kOnes, kZeros };

// One named tensor: a trainable parameter (in the flat parameter/gradient buffers) or a buffer
// (BatchNorm running statistics, in the flat buffer array).
struct Param {
  std::string name;
  Shape shape;
  Init init = Init::kZeros;
  int64_t fan_in = 0, fan_out = 0;
  bool is_buffer = false;
  bool is_counter = false;  // num_batches_tracked: saved as int64 counter_base + the float value
  // A counter's count when it was loaded (a file's int64, exact) or last folded, the float value
  // counting only the steps since (the kernels add 1 per training forward; exact up to 2^24 of
  // them, which ParamStore::fold_counters keeps it within): the file's count itself held as a float
  // lost precision above 2^24 and overflowed llround at INT64_MAX when saved (model_file.cc), and
  // the float counting a whole run stopped at 2^24 (16777216 + 1 is 16777216 in float).
  int64_t counter_base = 0;
  int64_t offset = 0;  // element offset in the flat parameter (or buffer) array
  Tensor value;        // host view, valid after ParamStore::finalize()
  Tensor grad;         // host view (parameters only)
  // The same in the backend's memory, where the layers compute (the host views' own memory on
  // the CPU; device memory, synchronised by ParamStore::to_host/from_host, on a GPU).
  float* device_value = nullptr;
  float* device_grad = nullptr;
  int64_t numel() const { return shape_numel(shape); }
};

class ParamStore {
 public:
  explicit ParamStore(Backend& backend = cpu_backend()) : backend_(&backend) {}
  Backend& backend() const { return *backend_; }
  Param* add_param(const std::string& name, const Shape& shape, Init init, int64_t fan_in,
                   int64_t fan_out);
  Param* add_buffer(const std::string& name, const Shape& shape, Init init, bool counter = false);
  // Allocates the flat buffers (host, and the backend's when its memory is not the host's) and
  // points every Param's views into them.
  void finalize();
  bool finalized() const { return finalized_; }

  std::deque<Param>& entries() { return entries_; }  // registration (= PyTorch state_dict) order
  const std::deque<Param>& entries() const { return entries_; }
  Param* find(const std::string& name);
  // Host flat arrays: the source of checkpoints, initialisation and broadcasts.
  float* params() { return params_.data(); }
  float* grads() { return grads_.data(); }
  float* buffers() { return buffers_.data(); }
  // The backend's flat arrays, where the layers, the reducer and the optimizer work.
  float* device_params() { return dparams_ ? dparams_->data() : params_.data(); }
  float* device_grads() { return dgrads_ ? dgrads_->data() : grads_.data(); }
  float* device_buffers() { return dbuffers_ ? dbuffers_->data() : buffers_.data(); }
  int64_t num_params() const { return num_params_; }
  int64_t num_buffers() const { return num_buffers_; }
  // The buffers but the counters (the running statistics): [0, num_statistics) of the buffer
  // array, the counters after them.
  int64_t num_statistics() const { return num_statistics_; }
  // Parameters and buffers between the host arrays and the backend's (no-ops on the CPU); the
  // gradients stay where they are computed (grads_to_host for tests and checks).
  void to_host();
  void from_host();
  void buffers_to_host();
  void buffers_from_host();
  void grads_to_host();
  void zero_grads();
  // Moves each counter's count from its float in backend memory (exact up to 2^24) into its int64
  // counter_base and sets the float to 0, so the count stays exact for any int64 value. Called by
  // StepEngine before the floats could pass 2^24; the floats' bits matter to nothing else (the
  // BatchNorm momentum is fixed, and num_batches_tracked is only saved).
  void fold_counters();

 private:
  Backend* backend_;
  std::deque<Param> entries_;  // deque: Param* handed to layers stay valid
  Tensor params_, grads_, buffers_;
  std::unique_ptr<Tensor> dparams_, dgrads_,
      dbuffers_;  // only where the backend's memory is not the host's
  int64_t num_params_ = 0, num_buffers_ = 0, num_statistics_ = 0;
  bool finalized_ = false;
};

// A counter's (num_batches_tracked's) count as saved: its counter_base plus the steps its float
// value (the host view) has counted since, saturating at INT64_MAX (never wrapping).
int64_t counter_value(const Param& p);

// Told after each leaf layer's backward which range [begin, end) of the flat gradient buffer is
// final for this step. The reducer hangs its bucketed all-reduce on this.
using GradReadyFn = std::function<void(int64_t begin, int64_t end)>;

class Tracer;

struct BackwardCtx {
  GradReadyFn on_ready;      // may be empty
  bool accumulate = false;   // add into gradients (accumulation micro-steps) instead of overwrite
  Tracer* tracer = nullptr;  // when active: one span per layer's backward
  void ready(const std::vector<Param*>& params) const;
};

class Layer;

class Layer {
 public:
  virtual ~Layer() = default;
  virtual std::string kind() const = 0;
  // Registers this layer's parameters under `prefix` and returns the per-sample output shape
  // for a per-sample input shape (NHWC {H, W, C} or {F}).
  virtual Shape build(const Shape& in, ParamStore& store, const std::string& prefix) = 0;
  // x: {N, in...}; resizes y to {N, out...}.
  virtual void forward(const Tensor& x, Tensor& y, Mode mode) = 0;
  // Given the forward input x, output y and dL/dy, writes dL/dx (dx may be null: not needed)
  // and this layer's parameter gradients, then announces them through ctx.
  virtual void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx,
                        BackwardCtx& ctx) = 0;
  // Visits every layer (composites first, then children) for configuration passes.
  virtual void visit(const std::function<void(Layer&)>& fn) { fn(*this); }
  // Floating-point operations of one sample's forward pass in this layer alone, counted as
  // benchmarks count them: 2 per multiply-add of a convolution or Linear, 0 for the other layers
  // (whose passes are memory-bound). Known after build().
  virtual int64_t flops() const { return 0; }
};

std::unique_ptr<Layer> make_conv2d(int64_t out_channels, int64_t kernel, int64_t stride = 1,
                                   int64_t pad = 0, bool bias = true);
// PyTorch's BatchNorm2d defaults.
inline constexpr double kBatchNormMomentum = 0.1, kBatchNormEps = 1e-5;
std::unique_ptr<Layer> make_batchnorm2d(double momentum = kBatchNormMomentum,
                                        double eps = kBatchNormEps);
// BatchNorm2d then ReLU fused into one layer (kind "BatchNorm2d+ReLU"): the same values, gradients
// and parameter names as the two layers, one memory pass each way, the BatchNorm output never
// stored.
std::unique_ptr<Layer> make_batchnorm2d_relu(double momentum = kBatchNormMomentum,
                                             double eps = kBatchNormEps);
std::unique_ptr<Layer> make_relu();
std::unique_ptr<Layer> make_avgpool2d(int kernel, int stride);
// ReLU then AvgPool2d fused into one layer (same values and gradients, fewer memory passes).
std::unique_ptr<Layer> make_relu_avgpool2d(int kernel, int stride);
// PyTorch's MaxPool2d (floor mode): k x k windows at stride s over the input padded by `pad` on
// each side (pad <= k/2, as PyTorch requires; the padding never wins). backend.h says which
// position wins a window and gets its gradient.
std::unique_ptr<Layer> make_maxpool2d(int kernel, int stride, int pad);
std::unique_ptr<Layer> make_global_avgpool();
std::unique_ptr<Layer> make_flatten();
std::unique_ptr<Layer> make_linear(int64_t out_features, bool bias = true);
// d2l's Residual: conv3x3(stride)-BN-ReLU-conv3x3-BN, plus x or a 1x1 conv(stride) of x, then ReLU;
// run as conv1, BatchNorm2d+ReLU, conv2 and one fused bn2 + add + ReLU (same results).
// zero_init_residual: bn2's weight starts at 0 (torchvision's option, below).
std::unique_ptr<Layer> make_residual(int64_t channels, bool use_1x1conv, int64_t stride,
                                     bool zero_init_residual = false);
// torchvision's residual blocks (torchvision.models.resnet), under its state_dict names and without
// convolution biases. `downsample`: the shortcut is a 1x1 convolution at `stride` then BatchNorm
// (downsample.0, downsample.1), as torchvision adds where the stride or the width changes; else
// the block's input. zero_init_residual: the block's last BatchNorm weight starts at 0
// (torchvision's option of that name), so the block starts as its shortcut.
// BasicBlock (expansion 1): conv1 3x3(stride)-bn1-ReLU-conv2 3x3-bn2, + shortcut, ReLU.
std::unique_ptr<Layer> make_basic_block(int64_t planes, int64_t stride, bool downsample,
                                        bool zero_init_residual);
// Bottleneck (expansion 4, "ResNet v1.5": the stride on the 3x3): conv1 1x1-bn1-ReLU, conv2
// 3x3(stride)-bn2-ReLU, conv3 1x1 to 4*planes-bn3, + shortcut, ReLU.
std::unique_ptr<Layer> make_bottleneck(int64_t planes, int64_t stride, bool downsample,
                                       bool zero_init_residual);
// Turns synchronised BatchNorm on (fn set) or off (empty fn) for a BatchNorm layer (fused or not);
// no-op otherwise.
void set_batchnorm_sync(Layer& layer, const ChannelSumFn& fn);
// Where a composite layer (Sequential, a residual block) borrows the tensors that live only inside
// one of its calls (null: a pool of its own); no-op for other layers. Model sets its own on all.
void set_pool(Layer& layer, TensorPool* pool);
// Where the backend adds a convolution's bias in a pass of its own (Backend::conv_bias_is_a_pass:
// cuDNN), Model calls this once its parameters are allocated: every convolution with a bias that
// feeds a BatchNorm (d2l's ResNet-18: the stem and each block's two, 17 in all) leaves its bias out
// of training forwards, and the BatchNorm moves its running mean by the bias instead. Training
// BatchNorm subtracts the batch mean, so its output, the loss and every gradient are the same up
// to rounding, the bias's own gradient exactly 0 (the sum of dy, which BatchNorm's backward makes
// sum to 0 per channel; unfolded, the same sum of rounding noise); evaluation adds the bias as
// before and finds it in the running mean. The bias add's pass and its gradient's reduction go
// (0.40 and 0.27 of 5.9 ms a step of ResNet-18 bf16 on an H100). Returns how many it folded.
int fold_conv_biases(Layer& net);

// Mixed into the composite layers. The tensors between their children are borrowed from a pool:
// the activations a forward keeps for backward (handed back by backward, each once its last
// reader is done), kInfer's intermediates (handed back once the next child has read them) and
// backward's activation gradients. The pool is the model's, set once through set_pool, which
// keeps the buffers from step to step, so that a gradient reuses what an activation no longer
// needed gave back; else one of the layer's own. It also records whether a backward may run: the
// last forward kept its activations, and no backward has handed them back since.
class Borrower {
 public:
  void set_pool(TensorPool* pool) { pool_ = pool; }

 protected:
  TensorPool& pool() { return pool_ ? *pool_ : own_; }
  // A forward's start: whether it keeps its activations (not under kInfer). Until end_forward,
  // nothing counts as kept, so a forward that throws leaves backward refused.
  bool begin_forward(Mode mode) {
    kept_ = false;
    return mode != Mode::kInfer;
  }
  void end_forward(bool keep) { kept_ = keep; }
  // A backward's start: throws unless the last forward kept its activations (`kind` names the
  // layer). From here on none count as kept, so a backward that throws part-way, having handed
  // some back, leaves a second attempt refused.
  void begin_backward(const char* kind);

 private:
  TensorPool* pool_ = nullptr;
  TensorPool own_;
  bool kept_ = false;
};

class Sequential : public Layer, public Borrower {
 public:
  // name: the child's path component ("conv1", "0"); empty for layers without parameters.
  Sequential& add(const std::string& name, std::unique_ptr<Layer> layer);
  std::string kind() const override { return "Sequential"; }
  Shape build(const Shape& in, ParamStore& store, const std::string& prefix) override;
  void forward(const Tensor& x, Tensor& y, Mode mode) override;
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx,
                BackwardCtx& ctx) override;
  void visit(const std::function<void(Layer&)>& fn) override;
  size_t size() const { return children_.size(); }
  Layer& child(size_t i) { return *children_.at(i).second; }

 private:
  std::vector<std::pair<std::string, std::unique_ptr<Layer>>> children_;
  std::vector<std::string> span_names_;  // "backward <path or kind>" per child, for traces
  std::vector<Shape> out_shapes_;        // per-sample output shape of child i
  // Output of child i (the last child writes into y), borrowed, from forward to backward; empty
  // under kInfer and after a backward.
  std::vector<Loan> acts_;
};

// A network plus its parameter store, input shape and class count, on one backend.
class Model {
 public:
  Model(std::string name, std::unique_ptr<Sequential> net, Shape input_shape, int num_classes,
        Backend& backend = cpu_backend());
  // The layers hold pointers into the model (its pool, its parameters): never copied or moved.
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;
  const std::string& name() const { return name_; }
  ParamStore& store() { return store_; }
  const ParamStore& store() const { return store_; }
  const Shape& input_shape() const { return input_shape_; }
  int num_classes() const { return num_classes_; }
  // The stem it was built with (models.h's resolve_stem: imagenet or cifar), "" for a model
  // without a choice; --save and checkpoints record it.
  const std::string& stem() const { return stem_; }
  void set_stem(std::string stem) { stem_ = std::move(stem); }
  int64_t num_parameters() const { return store_.num_params(); }
  // "kaiming" (He-normal weights, zero biases) or "d2l" (N(0, 0.01) weights, zero biases);
  // BatchNorm weight 1, bias 0, running mean 0, running var 1 in both. Host and backend alike.
  void init_parameters(const std::string& scheme, uint64_t seed);
  // The element type of the activations and of their gradients between the layers: kF32, or kBF16
  // (16-bit activations, PyTorch autocast's storage): the float input is then rounded to bfloat16
  // once, the bfloat16 logits widened to float for the loss and its float gradient rounded back;
  // parameters, their gradients and the BatchNorm statistics stay float either way.
  void set_activation_dtype(DType dt);
  DType activation_dtype() const { return act_dtype_; }
  // x: {N, H, W, C} float in the backend's memory. Returns float logits {N, classes} (owned by the
  // model, valid until next forward); a device backend has only queued the work.
  const Tensor& forward(const Tensor& x, Mode mode);
  // Backward from dL/dlogits; the input gradient is not computed. Once per forward (it hands the
  // kept activations back to the pool).
  void backward(const Tensor& dlogits, BackwardCtx& ctx);
  Sequential& net() { return *net_; }
  // Names, shapes and kinds of all parameters and buffers, one line each (for replica checks).
  std::string signature() const;
  // Forward FLOPs per image, summed over the layers (Layer::flops). A training step's are taken as
  // three times as many (backward computes two products per forward one), the usual estimate
  // behind a benchmark's "achieved TFLOP/s".
  int64_t forward_flops() const;

 private:
  std::string name_;
  // What every composite layer borrows (set_pool): backward's activation gradients and kInfer's
  // intermediates never overlap in time, so one pool serves both. Declared before net_, so that
  // it outlives the layers' loans.
  TensorPool pool_;
  std::unique_ptr<Sequential> net_;
  Shape input_shape_;
  int num_classes_;
  std::string stem_;
  ParamStore store_;
  DType act_dtype_ = DType::kF32;
  const Tensor* input_ = nullptr;  // the net's input of the last forward (x, or input16_)
  Tensor logits_;
  Tensor input16_, logits16_, dlogits16_;  // 16-bit activations: the net's own ends
};

// The models built from these layers, and make_model: include/dpt/models.h.

}  // namespace dpt
