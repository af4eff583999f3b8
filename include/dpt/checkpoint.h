// Model state <-> safetensors: parameters and buffers under their PyTorch state_dict names
// (num_batches_tracked as I64), so the file loads into the equivalent PyTorch module.
#pragma once

#include <map>
#include <string>

#include "dpt/nn.h"

namespace dpt {

// Writes atomically (temporary file, fsync, rename). Call on one rank only.
void save_model(const std::string& path, const Model& model,
                const std::map<std::string, std::string>& metadata);
// Loads every parameter and buffer; refuses (input error naming the file and tensor) a file with
// missing or extra tensors, other shapes or dtypes, or another model. Returns the metadata.
std::map<std::string, std::string> load_model(const std::string& path, Model& model);

}  // namespace dpt
