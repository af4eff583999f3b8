// Model state in safetensors (see include/dpt/checkpoint.h).
#include "dpt/checkpoint.h"

#include <cmath>
#include <set>

#include "dpt/error.h"
#include "dpt/safetensors.h"

namespace dpt {

void save_model(const std::string& path, const Model& model,
                const std::map<std::string, std::string>& metadata) {
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
  write_safetensors(path, tensors, meta);
}

std::map<std::string, std::string> load_model(const std::string& path, Model& model) {
  StFile f = read_safetensors(path);
  auto it = f.metadata.find("model");
  DPT_INPUT_CHECK(it == f.metadata.end() || it->second == model.name(),
                  path << ": holds a '" << it->second << "' model, not '" << model.name() << "'");
  std::set<std::string> expected;
  for (auto& p : model.store().entries()) {
    expected.insert(p.name);
    const StTensor* t = f.find(p.name);
    DPT_INPUT_CHECK(t != nullptr, path << ": tensor '" << p.name << "' of " << model.name()
                                       << " is missing");
    DPT_INPUT_CHECK(t->shape == p.shape, path << ": tensor '" << p.name << "' has shape "
                                              << shape_str(t->shape) << ", " << model.name()
                                              << " needs " << shape_str(p.shape));
    if (p.is_counter) {
      DPT_INPUT_CHECK(t->dtype == "I64", path << ": tensor '" << p.name << "' is " << t->dtype
                                              << ", expected I64");
      p.value.data()[0] = static_cast<float>(as_i64(*t, path)[0]);
    } else {
      DPT_INPUT_CHECK(t->dtype == "F32", path << ": tensor '" << p.name << "' is " << t->dtype
                                              << ", expected F32");
      auto v = as_f32(*t, path);
      std::copy(v.begin(), v.end(), p.value.data());
    }
  }
  for (const auto& t : f.tensors)
    DPT_INPUT_CHECK(expected.count(t.name), path << ": unexpected tensor '" << t.name << "' for "
                                                 << model.name());
  return f.metadata;
}

}  // namespace dpt
