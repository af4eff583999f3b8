// The models dptrain trains, one table (src/nn/models.cc): for each, its builder, its line in
// --help, its learning rate under each recipe, its classifier head and the image shapes it takes.
// Adding a model is one entry there; the flags, recipes and checks read the table.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dpt/nn.h"

namespace dpt {

// A model's peak learning rate under each recipe (config.cc's recipe table says which field is
// its); every other setting of a recipe is the same for all models.
struct RecipeRates {
  double default_recipe;
  double d2l;
};

// The model choices the flags make (--stem, --zero-init-residual).
struct ModelOptions {
  // auto | imagenet | cifar (the models whose ModelSpec has stems); the builder gets imagenet or
  // cifar (resolve_stem), models without stems get "".
  std::string stem = "auto";
  bool zero_init_residual = false;  // the models whose ModelSpec has residual blocks
};

struct ModelSpec {
  std::string name;         // --model's value, recorded in checkpoints
  std::string description;  // one line for --help
  // The layers for `num_classes` classes, named as PyTorch's state_dict names them; the options
  // with the stem resolved.
  std::unique_ptr<Sequential> (*build)(int num_classes, const ModelOptions& options);
  RecipeRates lr;
  // The classifier head's parameter-name prefix: its parameters are head + ".weight" and ".bias"
  // (fine-tuning re-initialises them for a new class count).
  std::string head;
  // Why the model cannot take {H, W, C} images with positive H, W and C, or "" when it can.
  std::string (*input_problem)(const Shape& input);
  // Whether --stem chooses its stem (torchvision's layout: imagenet or cifar) and whether
  // --zero-init-residual applies (it has residual blocks).
  bool stems = false;
  bool residual = false;
};

// Every model, in the order --help lists them.
const std::vector<ModelSpec>& models();
// "lenet|resnet18": the names, for messages.
std::string model_names();
// The entry named `name`; an input error naming the flag and the list for any other name.
const ModelSpec& model_spec(const std::string& name);

// The stem `name` is built with for images of shape `input` {H, W, C}: "" for a model without
// stems; else options.stem, with auto meaning cifar below 64 pixels (min(H, W) < 64) and imagenet
// from there. An input error for a stem other than auto on a model without stems, or an unknown
// stem.
std::string resolve_stem(const std::string& name, const ModelOptions& options, const Shape& input);
// The input error (exit 2) for options `name` does not take: --stem other than auto on a model
// without stems, an unknown stem, --zero-init-residual on one without residual blocks.
void check_model_options(const std::string& name, const ModelOptions& options);

// The model `name` for inputs of shape `input` {H, W, C} (the chapter's 28x28x1 by default): its
// layers size themselves from the input. Input error for an unknown name, options it does not
// take or a shape it cannot take (model_input_problem). The model's stem() is the resolved stem.
std::unique_ptr<Model> make_model(const std::string& name, int num_classes = 10,
                                  Backend& backend = cpu_backend(),
                                  const Shape& input = {28, 28, 1},
                                  const ModelOptions& options = {});
// make_model(name, ...)->num_parameters() with make_model's checks, without allocating the
// parameters (the host's memory pre-flight counts each rank's model this way).
int64_t count_parameters(const std::string& name, int num_classes, const Shape& input,
                         const ModelOptions& options = {});
// Why `name` cannot take images of shape {H, W, C}, or "" when it can.
std::string model_input_problem(const std::string& name, const Shape& input);

}  // namespace dpt
