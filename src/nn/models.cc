// The model table (include/dpt/models.h) and its builders: the d2l chapter's LeNet (§12.5) and
// modified ResNet-18 (§12.6), for the chapter's 28x28 single-channel images or any shape they can
// take (the layers size themselves from their input). Names follow PyTorch's state_dict scheme.
#include "dpt/models.h"

#include "dpt/error.h"

namespace dpt {

namespace {

std::unique_ptr<Sequential> lenet(int num_classes) {
  auto net = std::make_unique<Sequential>();
  // conv -> ReLU -> avgpool, with ReLU and pooling fused into one pass (src/cpu/ops.h).
  net->add("conv1", make_conv2d(20, 3))
      .add("", make_relu_avgpool2d(2, 2))
      .add("conv2", make_conv2d(50, 5))
      .add("", make_relu_avgpool2d(2, 2))
      .add("", make_flatten())
      .add("fc1", make_linear(128))
      .add("", make_relu())
      .add("fc2", make_linear(num_classes));
  return net;
}

std::unique_ptr<Sequential> resnet18(int num_classes) {
  auto net = std::make_unique<Sequential>();
  // BatchNorm and the ReLU after it run as one fused layer (here and in each block: nn.h).
  net->add("conv1", make_conv2d(64, 3, 1, 1)).add("bn1", make_batchnorm2d_relu());
  const int64_t channels[4] = {64, 128, 256, 512};
  for (int stage = 0; stage < 4; ++stage) {
    auto blocks = std::make_unique<Sequential>();
    const bool first = stage == 0;  // the first stage keeps the resolution and has no 1x1 conv
    blocks->add("0", make_residual(channels[stage], !first, first ? 1 : 2));
    blocks->add("1", make_residual(channels[stage], false, 1));
    net->add("layer" + std::to_string(stage + 1), std::move(blocks));
  }
  net->add("", make_global_avgpool()).add("fc", make_linear(num_classes));
  return net;
}

// LeNet: conv 3x3, pool 2, conv 5x5, pool 2, each without padding, must leave at least 1x1:
// ((H - 2) / 2 - 4) / 2 >= 1, i.e. H >= 14.
std::string lenet_input_problem(const Shape& input) {
  if (input[0] < 14 || input[1] < 14)
    return "lenet needs images of at least 14x14 (its two convolutions and poolings leave nothing "
           "of smaller ones)";
  return "";
}

// ResNet-18 pads every 3x3 convolution and pools globally: any size.
std::string any_input(const Shape&) { return ""; }

}  // namespace

const std::vector<ModelSpec>& models() {
  static const std::vector<ModelSpec> table = {
      {"lenet",
       "LeNet of d2l 12.5: two convolutions, two linear layers; images of 14x14 or more",
       lenet,
       {.default_recipe = 0.05, .d2l = 0.2},
       "fc2",
       lenet_input_problem},
      {"resnet18",
       "the modified ResNet-18 of d2l 12.6: 3x3 stem, no max-pooling; any image size",
       resnet18,
       {.default_recipe = 0.1, .d2l = 0.1},
       "fc",
       any_input},
  };
  return table;
}

std::string model_names() {
  std::string names;
  for (const ModelSpec& m : models()) names += (names.empty() ? "" : "|") + m.name;
  return names;
}

const ModelSpec& model_spec(const std::string& name) {
  for (const ModelSpec& m : models())
    if (m.name == name) return m;
  throw Error(ErrorKind::kInput,
              DPT_MSG("--model: unknown model '" << name << "' (" << model_names() << ")"));
}

std::string model_input_problem(const std::string& name, const Shape& input) {
  if (input.size() != 3 || input[0] < 1 || input[1] < 1 || input[2] < 1)
    return "images must have a positive height, width and channel count";
  return model_spec(name).input_problem(input);
}

std::unique_ptr<Model> make_model(const std::string& name, int num_classes, Backend& backend,
                                  const Shape& input) {
  const ModelSpec& spec = model_spec(name);
  const std::string problem = model_input_problem(name, input);
  DPT_INPUT_CHECK(problem.empty(), "--model " << name << " cannot take images of shape "
                                              << shape_str(input) << " (H, W, C): " << problem);
  return std::make_unique<Model>(name, spec.build(num_classes), input, num_classes, backend);
}

}  // namespace dpt
