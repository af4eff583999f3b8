// Model state <-> safetensors: parameters and buffers under their PyTorch state_dict names
// (num_batches_tracked as I64), so a --save file loads into the equivalent PyTorch module; the
// metadata records the model, its input shape (H,W,C) and class count. A
// training checkpoint adds the optimizer state (tensors named "optimizer.*": SGD's
// "optimizer.momentum_buffer", AdamW's "optimizer.exp_avg", "optimizer.exp_avg_sq" and
// "optimizer.step", each flat buffer in the gradient buffer's layout), the optimizer's name
// (metadata "optimizer") and the position (epoch, step) in its metadata.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dpt/nn.h"

namespace dpt {

// An optimizer's state as a training checkpoint holds it (Optimizer::state): float buffers (F32
// tensors of their size) and counters (I64 tensors of shape [1]) under their tensor names.
struct OptimizerState {
  std::string name;  // "sgd" | "adamw": metadata "optimizer" (a file without it holds SGD's)
  std::vector<std::pair<std::string, std::vector<float>*>> buffers;
  std::vector<std::pair<std::string, int64_t*>> counters;
};

// "28,28,1": a shape as the metadata records it (input_shape: H,W,C of the images the model takes).
std::string shape_text(const Shape& s);

// Writes atomically and safely (files.h's AtomicFile). Call on one rank only. With `optimizer`,
// the file is a training checkpoint. `what` names the file in errors ("checkpoint", "--save").
void save_model(const std::string& path, const Model& model,
                const std::map<std::string, std::string>& metadata,
                const OptimizerState* optimizer = nullptr, const std::string& what = "checkpoint");
// Loads every parameter and buffer; refuses (input error naming the file and tensor) a file with
// missing or extra tensors, other shapes or dtypes, or another model. With `optimizer` (buffers
// sized to the model, or empty where the optimizer keeps none), its state must be there too, of
// the same optimizer: a checkpoint of another one is refused (the optimizer cannot change on
// resume). Without it, a checkpoint's "optimizer.*" tensors are passed over. Returns the metadata.
std::map<std::string, std::string> load_model(const std::string& path, Model& model,
                                              OptimizerState* optimizer = nullptr);

// --init-from: the parameters and buffers of `model` from `path` (a --save, a checkpoint, whose
// optimizer state is ignored, or any safetensors file with the model's names, shapes and dtypes),
// refusing what load_model refuses, except that when a tensor under `head` (the model table's
// classifier prefix) has another class count (first dimension), the whole head keeps its initial
// values: the result names each such tensor with both shapes ("fc2.weight [10, 128] -> [5, 128]"),
// and each head tensor of the file that has the new count already with its shape and that note.
// (The file's weight beside a fresh bias, or the reverse, would be no classifier of either.)
std::vector<std::string> init_from_file(const std::string& path, Model& model,
                                        const std::string& head);

}  // namespace dpt
