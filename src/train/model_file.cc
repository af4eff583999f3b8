// Model state <-> safetensors (include/dpt/model_file.h): the tensors of --save files and of
// training checkpoints, checked tensor by tensor when loaded.
#include "dpt/model_file.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "dpt/error.h"
#include "dpt/safetensors.h"

namespace dpt {

namespace {
constexpr const char* kMomentum = "optimizer.momentum_buffer";
}

std::string shape_text(const Shape& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ',';  // not (i ? "," : "") + ...: GCC 12 warns (-Wrestrict) on that operator+
    out += std::to_string(s[i]);
  }
  return out;
}

void save_model(const std::string& path, const Model& model,
                const std::map<std::string, std::string>& metadata,
                const std::vector<float>* momentum, const std::string& what) {
  std::vector<StTensor> tensors;
  for (const auto& p : model.store().entries()) {
    if (p.is_counter) {
      const int64_t v = static_cast<int64_t>(std::llround(p.value.data()[0]));
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
  if (momentum) {
    tensors.push_back(
        st_f32(kMomentum, {static_cast<int64_t>(momentum->size())}, momentum->data()));
    meta["format"] = "dptrain-checkpoint-v1";
  } else {
    meta["format"] = "dptrain-model-v1";
  }
  write_safetensors(path, tensors, meta, what);
}

namespace {

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
// no tensor the model lacks but the optimizer state). A tensor under `head` + "." whose first
// dimension (the class count) alone differs is left as it is (re-initialised) and named in the
// result; with an empty `head` every difference is refused.
std::vector<std::string> load_tensors(const StFile& f, const std::string& path, Model& model,
                                      const std::string& head) {
  std::set<std::string> expected{kMomentum};
  std::vector<std::pair<Param*, const StTensor*>> load;
  std::vector<std::string> kept;
  for (auto& p : model.store().entries()) {
    expected.insert(p.name);
    const StTensor* t = f.find(p.name);
    DPT_INPUT_CHECK(t != nullptr,
                    path << ": tensor '" << p.name << "' of " << model.name() << " is missing");
    const bool in_head = !head.empty() && p.name.rfind(head + ".", 0) == 0;
    if (in_head && t->shape != p.shape && t->shape.size() == p.shape.size() && !p.shape.empty() &&
        std::equal(t->shape.begin() + 1, t->shape.end(), p.shape.begin() + 1)) {
      kept.push_back(p.name + " " + shape_str(t->shape) + " -> " + shape_str(p.shape));
      continue;
    }
    DPT_INPUT_CHECK(t->shape == p.shape, path << ": tensor '" << p.name << "' has shape "
                                              << shape_str(t->shape) << ", " << model.name()
                                              << " needs " << shape_str(p.shape));
    const char* dtype = p.is_counter ? "I64" : "F32";
    DPT_INPUT_CHECK(t->dtype == dtype, path << ": tensor '" << p.name << "' is "
                                            << printable(t->dtype) << ", expected " << dtype);
    load.emplace_back(&p, t);
  }
  for (const auto& t : f.tensors)
    DPT_INPUT_CHECK(expected.count(t.name), path << ": unexpected tensor '" << printable(t.name)
                                                 << "' for " << model.name());
  for (auto [p, t] : load) {
    if (p->is_counter) {
      p->value.data()[0] = static_cast<float>(as_i64(*t, path)[0]);
    } else {
      auto v = as_f32(*t, path);
      std::copy(v.begin(), v.end(), p->value.data());
    }
  }
  return kept;
}

}  // namespace

std::map<std::string, std::string> load_model(const std::string& path, Model& model,
                                              std::vector<float>* momentum) {
  StFile f = read_safetensors(path);
  check_recorded(f, path, model);
  load_tensors(f, path, model, "");
  if (momentum && !momentum->empty()) {
    const StTensor* t = f.find(kMomentum);
    DPT_INPUT_CHECK(t != nullptr, path << ": no optimizer state ('" << kMomentum
                                       << "'): a --save file, not a training checkpoint");
    DPT_INPUT_CHECK(t->dtype == "F32" && t->shape == Shape{static_cast<int64_t>(momentum->size())},
                    path << ": '" << kMomentum << "' is " << printable(t->dtype) << " "
                         << shape_str(t->shape) << ", expected F32 [" << momentum->size() << "]");
    *momentum = as_f32(*t, path);
  }
  return f.metadata;
}

std::vector<std::string> init_from_file(const std::string& path, Model& model,
                                        const std::string& head) {
  StFile f = read_safetensors(path);
  check_recorded(f, path, model);
  return load_tensors(f, path, model, head);
}

}  // namespace dpt
