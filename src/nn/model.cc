// ParamStore (flat buffers in backward order, on the host and, for a device backend, mirrored in
// its memory), gradient-ready announcements, and Model.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <sstream>

#include "dpt/error.h"
#include "dpt/nn.h"
#include "dpt/rng.h"

namespace dpt {

Param* ParamStore::add_param(const std::string& name, const Shape& shape, Init init, int64_t fan_in,
                             int64_t fan_out) {
  DPT_CHECK(!finalized_, "parameter " << name << " registered after finalize()");
  DPT_CHECK(find(name) == nullptr, "duplicate parameter name " << name);
  Param& p = entries_.emplace_back();
  p.name = name;
  p.shape = shape;
  p.init = init;
  p.fan_in = fan_in;
  p.fan_out = fan_out;
  return &p;
}

Param* ParamStore::add_buffer(const std::string& name, const Shape& shape, Init init,
                              bool counter) {
  Param* p = add_param(name, shape, init, 0, 0);
  p->is_buffer = true;
  p->is_counter = counter;
  return p;
}

Param* ParamStore::find(const std::string& name) {
  for (auto& p : entries_)
    if (p.name == name) return &p;
  return nullptr;
}

void ParamStore::finalize() {
  DPT_CHECK(!finalized_, "finalize() called twice");
  num_params_ = num_buffers_ = 0;
  // Backward produces gradients last-registered first: lay parameters out in that order.
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it)
    if (!it->is_buffer) {
      it->offset = num_params_;
      num_params_ += it->numel();
    }
  // Buffers in registration order, the counters (num_batches_tracked) after all the others: the
  // running statistics are the one range [0, num_statistics) that sync_buffers averages across
  // ranks, and the counters, equal on every rank, stay out of it (a float average need not give
  // them back: 3 x 8388609 rounds to 25165828 in float, and a third of that is 8388610).
  for (const bool counters : {false, true})
    for (auto& p : entries_)
      if (p.is_buffer && p.is_counter == counters) {
        p.offset = num_buffers_;
        num_buffers_ += p.numel();
      }
  num_statistics_ = num_buffers_;
  for (const auto& p : entries_)
    if (p.is_counter) num_statistics_ -= p.numel();
  params_.resize({num_params_});
  grads_.resize({num_params_});
  buffers_.resize({std::max<int64_t>(num_buffers_, 1)});
  if (!backend_->host_memory()) {
    dparams_ = std::make_unique<Tensor>(Shape{std::max<int64_t>(num_params_, 1)}, backend_);
    dgrads_ = std::make_unique<Tensor>(Shape{std::max<int64_t>(num_params_, 1)}, backend_);
    dbuffers_ = std::make_unique<Tensor>(Shape{std::max<int64_t>(num_buffers_, 1)}, backend_);
  }
  for (auto& p : entries_) {
    if (p.is_buffer) {
      p.value = Tensor::view(buffers_.data() + p.offset, p.shape);
      p.device_value = device_buffers() + p.offset;
    } else {
      p.value = Tensor::view(params_.data() + p.offset, p.shape);
      p.grad = Tensor::view(grads_.data() + p.offset, p.shape);
      p.device_value = device_params() + p.offset;
      p.device_grad = device_grads() + p.offset;
    }
  }
  finalized_ = true;
}

namespace {
size_t bytes_of(int64_t floats) { return static_cast<size_t>(floats) * sizeof(float); }
}  // namespace

void ParamStore::to_host() {
  if (!dparams_) return;
  backend_->copy_to_host(params_.data(), dparams_->data(), bytes_of(num_params_));
  buffers_to_host();
}

void ParamStore::from_host() {
  if (!dparams_) return;
  backend_->copy_from_host(dparams_->data(), params_.data(), bytes_of(num_params_));
  buffers_from_host();
}

void ParamStore::buffers_to_host() {
  if (dbuffers_) backend_->copy_to_host(buffers_.data(), dbuffers_->data(), bytes_of(num_buffers_));
}

void ParamStore::buffers_from_host() {
  if (dbuffers_)
    backend_->copy_from_host(dbuffers_->data(), buffers_.data(), bytes_of(num_buffers_));
}

void ParamStore::grads_to_host() {
  if (dgrads_) backend_->copy_to_host(grads_.data(), dgrads_->data(), bytes_of(num_params_));
}

int64_t counter_value(const Param& p) {
  // The float counts the steps since the load or the last fold: a whole number from 0 to 2^24
  // (fold_counters). Clamped all the same, and the sum saturates: a save never overflows or wraps.
  const float steps = p.value.data()[0];
  const int64_t since = std::isfinite(steps) && steps > 0 ? static_cast<int64_t>(steps) : 0;
  return p.counter_base > std::numeric_limits<int64_t>::max() - since
             ? std::numeric_limits<int64_t>::max()
             : p.counter_base + since;
}

void ParamStore::fold_counters() {
  for (Param& p : entries_) {
    if (!p.is_counter) continue;
    if (dbuffers_) backend_->copy_to_host(p.value.data(), p.device_value, sizeof(float));
    p.counter_base = counter_value(p);
    p.value.data()[0] = 0.f;
    if (dbuffers_) backend_->copy_from_host(p.device_value, p.value.data(), sizeof(float));
  }
}

void ParamStore::zero_grads() {
  grads_.zero();
  if (dgrads_) dgrads_->zero();
}

void BackwardCtx::ready(const std::vector<Param*>& params) const {
  if (!on_ready || params.empty()) return;
  int64_t begin = params[0]->offset, end = begin;
  for (const Param* p : params) {
    begin = std::min(begin, p->offset);
    end = std::max(end, p->offset + p->numel());
  }
  on_ready(begin, end);
}

Model::Model(std::string name, std::unique_ptr<Sequential> net, Shape input_shape, int num_classes,
             Backend& backend)
    : name_(std::move(name)),
      net_(std::move(net)),
      input_shape_(std::move(input_shape)),
      num_classes_(num_classes),
      store_(backend) {
  Shape out = net_->build(input_shape_, store_, "");
  DPT_CHECK(out == Shape{num_classes_},
            name_ << " produces " << shape_str(out) << ", expected [" << num_classes_ << "]");
  store_.finalize();
  net_->visit([&](Layer& l) { set_pool(l, &pool_); });
  if (backend.conv_bias_is_a_pass()) fold_conv_biases(*net_);  // after finalize: device pointers
}

void Model::init_parameters(const std::string& scheme, uint64_t seed) {
  DPT_INPUT_CHECK(scheme == "kaiming" || scheme == "d2l",
                  "unknown initialisation '" << scheme << "' (kaiming|d2l)");
  Rng rng(seed);
  for (auto& p : store_.entries()) {
    float* v = p.value.data();
    const int64_t n = p.numel();
    switch (p.init) {
      case Init::kWeight: {
        const double stddev =
            scheme == "d2l" ? 0.01
                            : std::sqrt(2.0 / static_cast<double>(std::max<int64_t>(p.fan_in, 1)));
        for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(stddev * rng.normal());
        break;
      }
      case Init::kOnes:
        std::fill(v, v + n, 1.f);
        break;
      case Init::kBias:
      case Init::kZeros:
        std::fill(v, v + n, 0.f);
        break;
    }
  }
  store_.from_host();
}

void Model::set_activation_dtype(DType dt) {
  DPT_CHECK(dt == DType::kF32 || dt == DType::kBF16,
            name_ << ": activations are float32 or bfloat16");
  act_dtype_ = dt;
  input_ = nullptr;
}

const Tensor& Model::forward(const Tensor& x, Mode mode) {
  DPT_CHECK(x.rank() == 4 && Shape(x.shape().begin() + 1, x.shape().end()) == input_shape_,
            name_ << ": input " << shape_str(x.shape()) << " is not [N, " << shape_str(input_shape_)
                  << "]");
  DPT_CHECK(x.backend() == &store_.backend() ||
                (x.backend() == nullptr && store_.backend().host_memory()),
            name_ << ": input tensor is not in " << store_.backend().name() << " memory");
  if (act_dtype_ == DType::kF32) {
    input_ = &x;
    net_->forward(x, logits_, mode);
    return logits_;
  }
  // 16-bit activations: the net runs between a bfloat16 copy of the input and bfloat16 logits,
  // widened for the loss (autocast's casts at the same two places).
  Backend& be = store_.backend();
  input16_.resize(x.shape(), &be, DType::kBF16);
  be.convert(x.data(), input16_.ptr<BFloat16>(), x.numel());
  input_ = &input16_;
  net_->forward(input16_, logits16_, mode);
  logits_.resize(logits16_.shape(), &be, DType::kF32);
  be.convert(logits16_.ptr<BFloat16>(), logits_.data(), logits_.numel());
  return logits_;
}

void Model::backward(const Tensor& dlogits, BackwardCtx& ctx) {
  DPT_CHECK(input_ != nullptr, "backward before forward");
  DPT_CHECK(dlogits.shape() == logits_.shape(), "dlogits " << shape_str(dlogits.shape())
                                                           << " != logits "
                                                           << shape_str(logits_.shape()));
  if (act_dtype_ == DType::kF32) {
    net_->backward(*input_, logits_, dlogits, nullptr, ctx);
    return;
  }
  Backend& be = store_.backend();
  dlogits16_.resize(dlogits.shape(), &be, DType::kBF16);
  be.convert(dlogits.data(), dlogits16_.ptr<BFloat16>(), dlogits.numel());
  net_->backward(*input_, logits16_, dlogits16_, nullptr, ctx);
}

std::string Model::signature() const {
  std::ostringstream os;
  os << name_ << "\n";
  for (const auto& p : store_.entries())
    os << p.name << " " << shape_str(p.shape) << (p.is_buffer ? " buffer" : " param") << " f32\n";
  return os.str();
}

int64_t Model::forward_flops() const {
  int64_t total = 0;
  net_->visit([&](Layer& l) { total += l.flops(); });  // visit changes nothing here
  return total;
}

}  // namespace dpt
