// Model state <-> safetensors (include/dpt/model_file.h): the tensors of --save files and of
// training checkpoints, checked tensor by tensor when loaded.
#include "dpt/model_file.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "dpt/error.h"
#include "dpt/safetensors.h"

namespace dpt {

namespace {
// Every optimizer's tensors are named so: a model loaded without its optimizer passes them over.
constexpr const char* kOptimizerPrefix = "optimizer.";
}  // namespace

std::string shape_text(const Shape& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ',';  // not (i ? "," : "") + ...: GCC 12 warns (-Wrestrict) on that operator+
    out += std::to_string(s[i]);
  }
  return out;
}

void save_model(const std::string& path, const Model& model,
                const std::map<std::string, std::string>& metadata, const OptimizerState* optimizer,
                const std::string& what) {
  std::vector<StTensor> tensors;
  for (const auto& p : model.store().entries()) {
    if (p.is_counter) {
      const int64_t v = counter_value(p);
      tensors.push_back(st_i64(p.name, p.shape, &v));
    } else {
      tensors.push_back(st_f32(p.name, p.shape, p.value.data()));
    }
  }
  auto meta = metadata;
  meta["model"] = model.name();
  meta["input_shape"] = shape_text(model.input_shape());
  meta["num_classes"] = std::to_string(model.num_classes());
  if (!model.stem().empty()) meta["stem"] = model.stem();
  if (optimizer) {
    for (const auto& [name, values] : optimizer->buffers)
      tensors.push_back(st_f32(name, {static_cast<int64_t>(values->size())}, values->data()));
    for (const auto& [name, count] : optimizer->counters)
      tensors.push_back(st_i64(name, {1}, count));
    meta["optimizer"] = optimizer->name;
    meta["format"] = "dptrain-checkpoint-v1";
  } else {
    meta["format"] = "dptrain-model-v1";
  }
  write_safetensors(path, tensors, meta, what);
}

namespace {

// A float tensor of a file must be finite to be loaded. dptrain never writes a NaN or Inf
// (CheckpointManager::refuse_nonfinite), so one here is damage or another writer's, and loaded it
// would show only later: a null loss and every image predicted as class 0, or a whole run trained
// from it and then refused at its --save. Checked before anything is copied into the model.
// A BatchNorm's running variance is never negative either (a mean of squares, in PyTorch as
// here): a negative one made 1/sqrt(var + eps) NaN, which the fused ReLU turned into 0, and the
// file scored without a word (every image the same class).
void refuse_nonfinite(const StTensor& t, const std::string& path) {
  if (t.dtype != "F32") return;
  const size_t n = t.bytes.size() / sizeof(float);
  const bool variance = t.name.ends_with(".running_var");
  for (size_t i = 0; i < n; ++i) {
    float x = 0;
    std::memcpy(&x, t.bytes.data() + i * sizeof(float), sizeof(float));
    DPT_INPUT_CHECK(std::isfinite(x), path << ": tensor '" << printable(t.name) << "' holds " << x
                                           << " at element " << i << " (of " << n
                                           << "): a model file must hold finite values only");
    DPT_INPUT_CHECK(!variance || x >= 0, path << ": tensor '" << printable(t.name) << "' holds "
                                              << x << " at element " << i << " (of " << n
                                              << "): a running variance is never negative");
  }
}

// The recorded model and input shape against `model` (absent keys: a foreign file, not refused).
void check_recorded(const StFile& f, const std::string& path, const Model& model) {
  auto it = f.metadata.find("model");
  DPT_INPUT_CHECK(
      it == f.metadata.end() || it->second == model.name(),
      path << ": holds a '" << printable(it->second) << "' model, not '" << model.name() << "'");
  // ResNet-18's tensors are the same for every image size: only the recorded shape tells them
  // apart.
  const auto shape = f.metadata.find("input_shape");
  DPT_INPUT_CHECK(shape == f.metadata.end() || shape->second == shape_text(model.input_shape()),
                  path << ": was trained on images of " << printable(shape->second)
                       << " (H,W,C), this run's data has " << shape_text(model.input_shape()));
  // The two stems share their names (conv1 only changes shape): say which is which.
  const auto stem = f.metadata.find("stem");
  DPT_INPUT_CHECK(stem == f.metadata.end() || stem->second == model.stem(),
                  path << ": holds a model with the " << printable(stem->second)
                       << " stem, this run builds the "
                       << (model.stem().empty() ? "fixed" : model.stem()) << " one (--stem)");
}

// Every parameter and buffer of `model` from `f`, after checking them all (names, shapes, dtypes,
// no tensor the model lacks but an optimizer's state, which load_optimizer checks). When a tensor
// under `head` + "." differs in its first dimension (the class count) alone, the whole head is
// left as it is (re-initialised), each of its tensors named in the result: a head of which one
// tensor had the new class count (fc2.weight [5, 128] beside fc2.bias [10]) was half loaded, the
// file's weight beside a fresh bias, without a word. With an empty `head` every difference is
// refused. Without `copy`, the checks of names, shapes and dtypes alone (a header, before its data
// is read).
std::vector<std::string> load_tensors(const StFile& f, const std::string& path, Model& model,
                                      const std::string& head, bool copy = true) {
  const auto in_head = [&](const Param& p) {
    return !head.empty() && p.name.rfind(head + ".", 0) == 0;
  };
  // Whether `t` is `p` of another class count: the same shape but for its first dimension.
  const auto other_count = [](const StTensor& t, const Param& p) {
    return t.shape != p.shape && t.shape.size() == p.shape.size() && !p.shape.empty() &&
           std::equal(t.shape.begin() + 1, t.shape.end(), p.shape.begin() + 1);
  };
  bool new_head = false;
  for (const auto& p : model.store().entries())
    if (const StTensor* t = f.find(p.name); t && in_head(p) && other_count(*t, p)) new_head = true;
  std::set<std::string> expected;
  std::vector<std::pair<Param*, const StTensor*>> load;
  std::vector<std::string> kept;
  for (auto& p : model.store().entries()) {
    expected.insert(p.name);
    const StTensor* t = f.find(p.name);
    DPT_INPUT_CHECK(t != nullptr,
                    path << ": tensor '" << p.name << "' of " << model.name() << " is missing");
    if (in_head(p) && other_count(*t, p)) {
      kept.push_back(p.name + " " + shape_str(t->shape) + " -> " + shape_str(p.shape));
      continue;
    }
    DPT_INPUT_CHECK(t->shape == p.shape, path << ": tensor '" << p.name << "' has shape "
                                              << printable(shape_str(t->shape)) << ", "
                                              << model.name() << " needs " << shape_str(p.shape));
    const char* dtype = p.is_counter ? "I64" : "F32";
    DPT_INPUT_CHECK(t->dtype == dtype, path << ": tensor '" << p.name << "' is "
                                            << printable(t->dtype) << ", expected " << dtype);
    if (in_head(p) && new_head) {
      kept.push_back(p.name + " " + shape_str(p.shape) +
                     " (the new class count already, re-initialised with the rest of the head)");
      continue;
    }
    load.emplace_back(&p, t);
  }
  for (const auto& t : f.tensors)
    DPT_INPUT_CHECK(
        expected.count(t.name) || t.name.starts_with(kOptimizerPrefix),
        path << ": unexpected tensor '" << printable(t.name) << "' for " << model.name());
  if (!copy) return kept;
  for (auto [p, t] : load) refuse_nonfinite(*t, path);  // all before any value is copied
  // A count is never negative (PyTorch's num_batches_tracked counts training batches; an I64 is
  // integral by its type): checked, as the values above, before anything is copied.
  for (auto [p, t] : load)
    if (p->is_counter) {
      const int64_t n = as_i64(*t, path)[0];
      DPT_INPUT_CHECK(n >= 0, path << ": tensor '" << printable(t->name) << "' holds " << n
                                   << ": a count of batches is never negative");
    }
  for (auto [p, t] : load) {
    if (p->is_counter) {
      // Exact, as an int64: the float counts the steps from here (counter_value).
      p->counter_base = as_i64(*t, path)[0];
      p->value.data()[0] = 0.f;
    } else {
      auto v = as_f32(*t, path);
      std::copy(v.begin(), v.end(), p->value.data());
    }
  }
  return kept;
}

// The state of `optimizer` from `f` (a training checkpoint's), after checking that it is the same
// optimizer's and every tensor's dtype and shape.
// Without `copy`, the checks alone (a header).
void load_optimizer(const StFile& f, const std::string& path, OptimizerState& optimizer,
                    bool copy = true) {
  // Its state belongs to the optimizer that wrote it (a file from before the name was recorded
  // is SGD's): another optimizer would start from state it cannot read. (A file without any is
  // a --save file, refused below by the tensor it lacks.)
  const bool has_state = std::any_of(f.tensors.begin(), f.tensors.end(), [](const StTensor& t) {
    return t.name.starts_with(kOptimizerPrefix);
  });
  const auto was = f.metadata.find("optimizer");
  const std::string then = was == f.metadata.end() ? "sgd" : was->second;
  DPT_INPUT_CHECK(!has_state || then == optimizer.name,
                  path << ": holds the state of --optimizer " << printable(then)
                       << ", this run's is " << optimizer.name
                       << ": the optimizer cannot change on resume");
  for (const auto& [name, values] : optimizer.buffers) {
    if (values->empty()) continue;  // SGD without momentum keeps none
    const StTensor* t = f.find(name);
    DPT_INPUT_CHECK(t != nullptr, path << ": no optimizer state ('" << name
                                       << "'): a --save file, not a training checkpoint");
    DPT_INPUT_CHECK(t->dtype == "F32" && t->shape == Shape{static_cast<int64_t>(values->size())},
                    path << ": '" << name << "' is " << printable(t->dtype) << " "
                         << printable(shape_str(t->shape)) << ", expected F32 [" << values->size()
                         << "]");
    if (!copy) continue;
    refuse_nonfinite(*t, path);
    *values = as_f32(*t, path);
  }
  for (const auto& [name, count] : optimizer.counters) {
    const StTensor* t = f.find(name);
    DPT_INPUT_CHECK(t != nullptr, path << ": no optimizer state ('" << name
                                       << "'): a --save file, not a training checkpoint");
    DPT_INPUT_CHECK(t->dtype == "I64" && t->shape == Shape{1},
                    path << ": '" << name << "' is " << printable(t->dtype) << " "
                         << printable(shape_str(t->shape)) << ", expected I64 [1]");
    if (!copy) continue;
    const int64_t v = as_i64(*t, path)[0];
    DPT_INPUT_CHECK(v >= 0, path << ": '" << name << "' is " << v << ", a count (>= 0)");
    *count = v;
  }
}

}  // namespace

std::map<std::string, std::string> load_model(const std::string& path, Model& model,
                                              OptimizerState* optimizer) {
  // Names, shapes and dtypes from the header before any data is read.
  StFile f = read_safetensors(path, [&](const StFile& header) {
    check_recorded(header, path, model);
    load_tensors(header, path, model, "", false);
    if (optimizer) load_optimizer(header, path, *optimizer, false);
  });
  load_tensors(f, path, model, "");
  if (optimizer) load_optimizer(f, path, *optimizer);
  return f.metadata;
}

std::vector<std::string> init_from_file(const std::string& path, Model& model,
                                        const std::string& head) {
  StFile f = read_safetensors(path, [&](const StFile& header) {
    check_recorded(header, path, model);
    load_tensors(header, path, model, head, false);
  });
  return load_tensors(f, path, model, head);
}

}  // namespace dpt
