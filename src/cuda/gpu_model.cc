// GpuModel (see gpu_model.h): one device node per host layer, each doing what the CPU layer in
// src/nn/layers.cc does, with the same shapes, parameter views and gradient announcements, through
// cuDNN (convolution), cuBLAS (Linear), GpuBatchNorm and kernels/. Only compiled in GPU builds.
#include "cuda/gpu_model.h"

#include <utility>
#include <vector>

#include "add.cuh"
#include "avgpool_backward.cuh"
#include "avgpool_forward.cuh"
#include "cuda/cublas_linear.h"
#include "cuda/cuda_check.h"
#include "cuda/cudnn_conv.h"
#include "global_avgpool_backward.cuh"
#include "global_avgpool_forward.cuh"
#include "permute_nhwc_chw.cuh"
#include "relu_backward.cuh"
#include "relu_forward.cuh"

namespace dpt::gpu {

void DeviceTensor::resize(GpuContext& ctx, const Shape& shape) {
  const int64_t n = shape_numel(shape);
  if (n > capacity_) {
    if (storage_.bytes() > 0) ctx.synchronize();  // queued kernels may still read the old storage
    storage_ = DeviceBuffer();
    storage_ = DeviceBuffer(static_cast<size_t>(n) * sizeof(float));
    capacity_ = n;
  }
  data_ = storage_.as<float>();
  shape_ = shape;
}

namespace {

std::string join(const std::string& prefix, const std::string& name) {
  if (prefix.empty()) return name;
  if (name.empty()) return prefix;
  return prefix + "." + name;
}

}  // namespace

// A layer's device counterpart: the CPU Layer's forward/backward contract on DeviceTensors. All
// work is queued on the context's stream; nothing here waits for the device.
class GpuNode {
 public:
  GpuNode(DeviceParams& dev, GpuContext& ctx, std::string path, std::string kind, Shape in)
      : dev_(dev), ctx_(ctx), path_(std::move(path)), kind_(std::move(kind)), in_(std::move(in)) {}
  virtual ~GpuNode() = default;
  virtual void forward(const DeviceTensor& x, DeviceTensor& y, Mode mode) = 0;
  virtual void backward(const DeviceTensor& x, const DeviceTensor& y, const DeviceTensor& dy, DeviceTensor* dx,
                        BackwardCtx& ctx) = 0;

 protected:
  // x must be {N, in...} for the shape the host layer was built with (composites skip the check).
  void check_input(const DeviceTensor& x) const {
    if (in_.empty()) return;
    bool ok = x.rank() == static_cast<int>(in_.size()) + 1 && x.dim(0) > 0;
    for (size_t i = 0; ok && i < in_.size(); ++i) ok = x.shape()[i + 1] == in_[i];
    DPT_CHECK(ok, "GPU " << kind_ << " '" << path_ << "': input " << shape_str(x.shape())
                         << " does not match built shape [N, " << shape_str(in_) << "]");
  }
  DeviceTensor* prepare_dx(DeviceTensor* dx, const DeviceTensor& x) {
    if (dx) dx->resize(ctx_, x.shape());
    return dx;
  }
  float* value(const Param* p) { return (p->is_buffer ? dev_.buffers : dev_.params) + p->offset; }
  float* grad(const Param* p) { return dev_.grads + p->offset; }
  cudaStream_t stream() const { return ctx_.stream(); }

  DeviceParams& dev_;
  GpuContext& ctx_;
  std::string path_, kind_;
  Shape in_;
};

namespace {

// Refuses a spec that lacks what the device node needs, naming the layer.
void require(bool ok, const std::string& path, const std::string& kind, const LayerSpec& s, const char* what) {
  DPT_CHECK(ok, "--device cuda: layer '" << path << "' (" << kind << ", input " << shape_str(s.in) << ", output "
                                         << shape_str(s.out) << ") " << what);
}

class ConvNode : public GpuNode {
 public:
  ConvNode(DeviceParams& dev, GpuContext& ctx, const std::string& path, const LayerSpec& s)
      : GpuNode(dev, ctx, path, "Conv2d", s.in), conv_(ctx) {
    require(s.in.size() == 3 && s.out.size() == 3 && (s.params.size() == 1 || s.params.size() == 2), path,
            kind_, s, "is not an NHWC convolution with weight[, bias]");
    geom_ = cpu::ConvGeom{0, s.in[0], s.in[1], s.in[2], s.out[2], s.kernel, s.stride, s.pad};
    require(geom_.oh() == s.out[0] && geom_.ow() == s.out[1], path, kind_, s, "has an inconsistent geometry");
    w_ = s.params[0];
    b_ = s.params.size() == 2 ? s.params[1] : nullptr;
  }
  void forward(const DeviceTensor& x, DeviceTensor& y, Mode) override {
    check_input(x);
    geom_.n = x.dim(0);
    y.resize(ctx_, {geom_.n, geom_.oh(), geom_.ow(), geom_.c_out});
    conv_.forward(geom_, x.data(), value(w_), b_ ? value(b_) : nullptr, y.data());
  }
  void backward(const DeviceTensor& x, const DeviceTensor&, const DeviceTensor& dy, DeviceTensor* dx,
                BackwardCtx& ctx) override {
    check_input(x);
    geom_.n = x.dim(0);
    conv_.backward(geom_, x.data(), value(w_), dy.data(), prepare_dx(dx, x) ? dx->data() : nullptr, grad(w_),
                   b_ ? grad(b_) : nullptr, ctx.accumulate);
    ctx.ready(b_ ? std::vector<Param*>{w_, b_} : std::vector<Param*>{w_});
  }

 private:
  CudnnConv conv_;
  cpu::ConvGeom geom_;
  Param* w_ = nullptr;
  Param* b_ = nullptr;
};

class BatchNormNode : public GpuNode {
 public:
  BatchNormNode(DeviceParams& dev, GpuContext& ctx, const std::string& path, const LayerSpec& s)
      : GpuNode(dev, ctx, path, "BatchNorm2d", s.in), bn_(ctx, s.in.empty() ? 0 : s.in.back(), s.momentum, s.eps) {
    require(s.in.size() == 3 && s.params.size() == 5, path, kind_, s,
            "is not an NHWC BatchNorm with weight, bias, running_mean, running_var, num_batches_tracked");
    gamma_ = s.params[0], beta_ = s.params[1], mean_ = s.params[2], var_ = s.params[3], count_ = s.params[4];
  }
  void forward(const DeviceTensor& x, DeviceTensor& y, Mode mode) override {
    check_input(x);
    const int64_t m = x.numel() / in_[2];
    y.resize(ctx_, x.shape());
    if (mode == Mode::kTrain)
      bn_.forward_train(x.data(), y.data(), m, value(gamma_), value(beta_), value(mean_), value(var_), value(count_),
                        dev_.bn_sync);
    else
      bn_.forward_eval(x.data(), y.data(), m, value(gamma_), value(beta_), value(mean_), value(var_));
  }
  void backward(const DeviceTensor& x, const DeviceTensor&, const DeviceTensor& dy, DeviceTensor* dx,
                BackwardCtx& ctx) override {
    check_input(x);
    const int64_t m = x.numel() / in_[2];
    bn_.backward(x.data(), dy.data(), prepare_dx(dx, x) ? dx->data() : nullptr, m, value(gamma_), grad(gamma_),
                 grad(beta_), ctx.accumulate, dev_.bn_sync);
    ctx.ready({gamma_, beta_});
  }

 private:
  GpuBatchNorm bn_;
  Param *gamma_, *beta_, *mean_, *var_, *count_;
};

class ReluNode : public GpuNode {
 public:
  ReluNode(DeviceParams& dev, GpuContext& ctx, const std::string& path, const LayerSpec& s)
      : GpuNode(dev, ctx, path, "ReLU", s.in) {}
  void forward(const DeviceTensor& x, DeviceTensor& y, Mode) override {
    check_input(x);
    y.resize(ctx_, x.shape());
    CUDA_CHECK(cuda::launch_relu_forward(x.data(), y.data(), x.numel(), stream()));
  }
  void backward(const DeviceTensor& x, const DeviceTensor& y, const DeviceTensor& dy, DeviceTensor* dx,
                BackwardCtx&) override {
    if (prepare_dx(dx, x)) CUDA_CHECK(cuda::launch_relu_backward(y.data(), dy.data(), dx->data(), x.numel(), stream()));
  }
};

// AvgPool2d, fused with the ReLU before it when the host layer is (LeNet's make_relu_avgpool2d).
class AvgPoolNode : public GpuNode {
 public:
  AvgPoolNode(DeviceParams& dev, GpuContext& ctx, const std::string& path, const std::string& kind,
              const LayerSpec& s)
      : GpuNode(dev, ctx, path, kind, s.in), k_(static_cast<int>(s.kernel)), s_(static_cast<int>(s.stride)),
        relu_(s.relu) {
    require(s.in.size() == 3 && s.kernel >= 1 && s.stride >= 1 && s.in[0] >= s.kernel && s.in[1] >= s.kernel, path,
            kind_, s, "is not a valid NHWC pooling window");
  }
  void forward(const DeviceTensor& x, DeviceTensor& y, Mode) override {
    check_input(x);
    y.resize(ctx_, {x.dim(0), (in_[0] - k_) / s_ + 1, (in_[1] - k_) / s_ + 1, in_[2]});
    CUDA_CHECK(cuda::launch_avgpool_forward(x.data(), y.data(), x.dim(0), in_[0], in_[1], in_[2], k_, s_, relu_,
                                            stream()));
  }
  void backward(const DeviceTensor& x, const DeviceTensor&, const DeviceTensor& dy, DeviceTensor* dx,
                BackwardCtx&) override {
    if (!prepare_dx(dx, x)) return;
    CUDA_CHECK(cuda::launch_avgpool_backward(dy.data(), relu_ ? x.data() : nullptr, dx->data(), x.dim(0), in_[0],
                                             in_[1], in_[2], k_, s_, stream()));
  }

 private:
  int k_, s_;
  bool relu_;
};

class GlobalAvgPoolNode : public GpuNode {
 public:
  GlobalAvgPoolNode(DeviceParams& dev, GpuContext& ctx, const std::string& path, const LayerSpec& s)
      : GpuNode(dev, ctx, path, "GlobalAvgPool", s.in) {
    require(s.in.size() == 3, path, kind_, s, "needs an NHWC input");
  }
  void forward(const DeviceTensor& x, DeviceTensor& y, Mode) override {
    check_input(x);
    y.resize(ctx_, {x.dim(0), in_[2]});
    CUDA_CHECK(cuda::launch_global_avgpool_forward(x.data(), y.data(), x.dim(0), in_[0] * in_[1], in_[2], stream()));
  }
  void backward(const DeviceTensor& x, const DeviceTensor&, const DeviceTensor& dy, DeviceTensor* dx,
                BackwardCtx&) override {
    if (prepare_dx(dx, x))
      CUDA_CHECK(cuda::launch_global_avgpool_backward(dy.data(), dx->data(), x.dim(0), in_[0] * in_[1], in_[2],
                                                      stream()));
  }
};

// NHWC -> PyTorch's (c, h, w) flatten order, as the CPU Flatten (so fc weights keep their layout).
class FlattenNode : public GpuNode {
 public:
  FlattenNode(DeviceParams& dev, GpuContext& ctx, const std::string& path, const LayerSpec& s)
      : GpuNode(dev, ctx, path, "Flatten", s.in) {
    require(s.in.size() == 3, path, kind_, s, "needs an NHWC input");
  }
  void forward(const DeviceTensor& x, DeviceTensor& y, Mode) override {
    check_input(x);
    y.resize(ctx_, {x.dim(0), in_[0] * in_[1] * in_[2]});
    CUDA_CHECK(cuda::launch_permute_nhwc_chw(x.data(), y.data(), x.dim(0), in_[0], in_[1], in_[2], true, stream()));
  }
  void backward(const DeviceTensor& x, const DeviceTensor&, const DeviceTensor& dy, DeviceTensor* dx,
                BackwardCtx&) override {
    if (prepare_dx(dx, x))
      CUDA_CHECK(
          cuda::launch_permute_nhwc_chw(dy.data(), dx->data(), x.dim(0), in_[0], in_[1], in_[2], false, stream()));
  }
};

class LinearNode : public GpuNode {
 public:
  LinearNode(DeviceParams& dev, GpuContext& ctx, const std::string& path, const LayerSpec& s)
      : GpuNode(dev, ctx, path, "Linear", s.in) {
    require(s.in.size() == 1 && s.out.size() == 1 && (s.params.size() == 1 || s.params.size() == 2), path, kind_, s,
            "is not a flat Linear with weight[, bias]");
    out_ = s.out[0];
    w_ = s.params[0];
    b_ = s.params.size() == 2 ? s.params[1] : nullptr;
  }
  void forward(const DeviceTensor& x, DeviceTensor& y, Mode) override {
    check_input(x);
    y.resize(ctx_, {x.dim(0), out_});
    linear_forward(ctx_, x.data(), value(w_), b_ ? value(b_) : nullptr, y.data(), x.dim(0), in_[0], out_);
  }
  void backward(const DeviceTensor& x, const DeviceTensor&, const DeviceTensor& dy, DeviceTensor* dx,
                BackwardCtx& ctx) override {
    check_input(x);
    linear_backward(ctx_, x.data(), value(w_), dy.data(), prepare_dx(dx, x) ? dx->data() : nullptr, grad(w_),
                    b_ ? grad(b_) : nullptr, x.dim(0), in_[0], out_, ctx.accumulate);
    ctx.ready(b_ ? std::vector<Param*>{w_, b_} : std::vector<Param*>{w_});
  }

 private:
  int64_t out_ = 0;
  Param* w_ = nullptr;
  Param* b_ = nullptr;
};

std::unique_ptr<GpuNode> build_node(DeviceParams& dev, GpuContext& ctx, Layer& layer, const std::string& path);

// Children in order; child i's output is child i+1's input, the last writes into y (as Sequential).
class SequentialNode : public GpuNode {
 public:
  SequentialNode(DeviceParams& dev, GpuContext& ctx, const std::string& path, const LayerSpec& s)
      : GpuNode(dev, ctx, path, "Sequential", {}) {
    require(!s.children.empty(), path, kind_, s, "has no children");
    for (const auto& [name, child] : s.children)
      children_.push_back(build_node(dev, ctx, *child, join(path, name.empty() ? child->kind() : name)));
    acts_.resize(children_.size() - 1);
    grads_.resize(children_.size() - 1);
  }
  void forward(const DeviceTensor& x, DeviceTensor& y, Mode mode) override {
    const size_t n = children_.size();
    for (size_t i = 0; i < n; ++i)
      children_[i]->forward(i == 0 ? x : acts_[i - 1], i + 1 == n ? y : acts_[i], mode);
  }
  void backward(const DeviceTensor& x, const DeviceTensor& y, const DeviceTensor& dy, DeviceTensor* dx,
                BackwardCtx& ctx) override {
    const size_t n = children_.size();
    for (size_t i = n; i-- > 0;)
      children_[i]->backward(i == 0 ? x : acts_[i - 1], i + 1 == n ? y : acts_[i], i + 1 == n ? dy : grads_[i],
                             i == 0 ? dx : &grads_[i - 1], ctx);
  }

 private:
  std::vector<std::unique_ptr<GpuNode>> children_;
  std::vector<DeviceTensor> acts_, grads_;
};

// d2l's Residual: relu(main(x) + (shortcut ? shortcut(x) : x)), the add and ReLU in one kernel.
class ResidualNode : public GpuNode {
 public:
  ResidualNode(DeviceParams& dev, GpuContext& ctx, const std::string& path, const LayerSpec& s)
      : GpuNode(dev, ctx, path, "Residual", s.in) {
    require(s.children.size() == 1 || s.children.size() == 2, path, kind_, s,
            "needs a main branch and at most one shortcut");
    main_ = build_node(dev, ctx, *s.children[0].second, path);
    if (s.children.size() == 2) shortcut_ = build_node(dev, ctx, *s.children[1].second, join(path, s.children[1].first));
  }
  void forward(const DeviceTensor& x, DeviceTensor& y, Mode mode) override {
    check_input(x);
    main_->forward(x, main_out_, mode);
    const DeviceTensor* skip = &x;
    if (shortcut_) {
      shortcut_->forward(x, short_out_, mode);
      skip = &short_out_;
    }
    DPT_CHECK(skip->shape() == main_out_.shape(), "GPU Residual '" << path_ << "': shortcut " << shape_str(skip->shape())
                                                                  << " != main " << shape_str(main_out_.shape()));
    y.resize(ctx_, main_out_.shape());
    CUDA_CHECK(cuda::launch_add(main_out_.data(), skip->data(), y.data(), y.numel(), /*relu=*/true, stream()));
  }
  void backward(const DeviceTensor& x, const DeviceTensor& y, const DeviceTensor& dy, DeviceTensor* dx,
                BackwardCtx& ctx) override {
    dz_.resize(ctx_, y.shape());
    CUDA_CHECK(cuda::launch_relu_backward(y.data(), dy.data(), dz_.data(), y.numel(), stream()));
    // Shortcut first, as on the CPU: its gradients come first in the flat buffer.
    if (shortcut_) shortcut_->backward(x, short_out_, dz_, dx ? &dskip_ : nullptr, ctx);
    // The main branch's input gradient goes to its own buffer and the sum into dx: the add kernel's
    // operands are restrict-qualified, so it never runs in place.
    main_->backward(x, main_out_, dz_, dx ? &dmain_ : nullptr, ctx);
    if (prepare_dx(dx, x))
      CUDA_CHECK(cuda::launch_add(dmain_.data(), shortcut_ ? dskip_.data() : dz_.data(), dx->data(), dx->numel(),
                                  /*relu=*/false, stream()));
  }

 private:
  std::unique_ptr<GpuNode> main_, shortcut_;
  DeviceTensor main_out_, short_out_, dz_, dskip_, dmain_;
};

std::unique_ptr<GpuNode> build_node(DeviceParams& dev, GpuContext& ctx, Layer& layer, const std::string& path) {
  const std::string kind = layer.kind();
  const LayerSpec s = layer.spec();
  if (kind == "Sequential") return std::make_unique<SequentialNode>(dev, ctx, path, s);
  if (kind == "Residual") return std::make_unique<ResidualNode>(dev, ctx, path, s);
  if (kind == "Conv2d") return std::make_unique<ConvNode>(dev, ctx, path, s);
  if (kind == "BatchNorm2d") return std::make_unique<BatchNormNode>(dev, ctx, path, s);
  if (kind == "ReLU") return std::make_unique<ReluNode>(dev, ctx, path, s);
  if (kind == "AvgPool2d" || kind == "ReLU+AvgPool2d") return std::make_unique<AvgPoolNode>(dev, ctx, path, kind, s);
  if (kind == "GlobalAvgPool") return std::make_unique<GlobalAvgPoolNode>(dev, ctx, path, s);
  if (kind == "Flatten") return std::make_unique<FlattenNode>(dev, ctx, path, s);
  if (kind == "Linear") return std::make_unique<LinearNode>(dev, ctx, path, s);
  throw Error(ErrorKind::kInternal, DPT_MSG("--device cuda: layer '" << path << "' of kind " << kind << " (input "
                                                                     << shape_str(s.in)
                                                                     << ") has no GPU implementation; use --device cpu"));
}

}  // namespace

GpuModel::GpuModel(Model& model, GpuContext& ctx)
    : model_(model),
      ctx_(ctx),
      params_(static_cast<size_t>(std::max<int64_t>(model.store().num_params(), 1)) * sizeof(float)),
      grads_(static_cast<size_t>(std::max<int64_t>(model.store().num_params(), 1)) * sizeof(float)),
      buffers_(static_cast<size_t>(std::max<int64_t>(model.store().num_buffers(), 1)) * sizeof(float)) {
  DPT_CHECK(model.store().finalized(), "GpuModel of " << model.name() << " before its parameters are laid out");
  dev_.params = params_.as<float>();
  dev_.grads = grads_.as<float>();
  dev_.buffers = buffers_.as<float>();
  root_ = build_node(dev_, ctx_, model.net(), "");
  // Gradients start at zero (as the host's), so a copy before the first backward reads zeros.
  CUDA_CHECK(cudaMemsetAsync(dev_.grads, 0, grads_.bytes(), ctx_.stream()));
  upload();
}

GpuModel::~GpuModel() = default;

void GpuModel::copy(void* dst, const void* src, int64_t floats, cudaMemcpyKind kind) {
  if (floats <= 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(floats) * sizeof(float), kind, ctx_.stream()));
}

void GpuModel::upload() {
  ParamStore& s = model_.store();
  copy(dev_.params, s.params(), s.num_params(), cudaMemcpyHostToDevice);
  copy(dev_.buffers, s.buffers(), s.num_buffers(), cudaMemcpyHostToDevice);
  ctx_.synchronize();  // pageable host memory: the copies are complete only after this
}

void GpuModel::download() {
  ParamStore& s = model_.store();
  copy(s.params(), dev_.params, s.num_params(), cudaMemcpyDeviceToHost);
  copy(s.buffers(), dev_.buffers, s.num_buffers(), cudaMemcpyDeviceToHost);
  ctx_.synchronize();
}

void GpuModel::upload_buffers() {
  copy(dev_.buffers, model_.store().buffers(), num_buffers(), cudaMemcpyHostToDevice);
  ctx_.synchronize();
}

void GpuModel::download_buffers() { copy_buffers_to(model_.store().buffers()); }

void GpuModel::copy_params_to(float* host) {
  copy(host, dev_.params, num_params(), cudaMemcpyDeviceToHost);
  ctx_.synchronize();
}

void GpuModel::copy_grads_to(float* host) {
  copy(host, dev_.grads, num_params(), cudaMemcpyDeviceToHost);
  ctx_.synchronize();
}

void GpuModel::copy_buffers_to(float* host) {
  copy(host, dev_.buffers, num_buffers(), cudaMemcpyDeviceToHost);
  ctx_.synchronize();
}

const DeviceTensor& GpuModel::forward(const DeviceTensor& x, Mode mode) {
  const Shape& in = model_.input_shape();
  DPT_CHECK(x.rank() == 4 && x.dim(0) > 0 && Shape(x.shape().begin() + 1, x.shape().end()) == in,
            model_.name() << " on the GPU: input " << shape_str(x.shape()) << " is not [N, " << shape_str(in) << "]");
  input_ = &x;
  root_->forward(x, logits_, mode);
  return logits_;
}

void GpuModel::backward(const DeviceTensor& dlogits, BackwardCtx& ctx) {
  DPT_CHECK(input_ != nullptr, "GPU backward before forward");
  DPT_CHECK(dlogits.shape() == logits_.shape(), "GPU dlogits " << shape_str(dlogits.shape()) << " != logits "
                                                               << shape_str(logits_.shape()));
  root_->backward(*input_, logits_, dlogits, nullptr, ctx);
}

}  // namespace dpt::gpu
