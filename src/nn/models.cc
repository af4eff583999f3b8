// The d2l chapter's two models, built from layers: LeNet (§12.5) and the modified ResNet-18
// (§12.6), for the chapter's 28x28 single-channel images or any shape they can take (the layers
// size themselves from their input). Names follow PyTorch's state_dict scheme.
#include "dpt/error.h"
#include "dpt/nn.h"

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

}  // namespace

std::string model_input_problem(const std::string& name, const Shape& input) {
  if (input.size() != 3 || input[0] < 1 || input[1] < 1 || input[2] < 1)
    return "images must have a positive height, width and channel count";
  // LeNet: conv 3x3, pool 2, conv 5x5, pool 2, each without padding, must leave at least 1x1:
  // ((H - 2) / 2 - 4) / 2 >= 1, i.e. H >= 14. ResNet-18 pads every 3x3 and takes any size.
  if (name == "lenet" && (input[0] < 14 || input[1] < 14))
    return "lenet needs images of at least 14x14 (its two convolutions and poolings leave nothing "
           "of smaller ones)";
  return "";
}

std::unique_ptr<Model> make_model(const std::string& name, int num_classes, Backend& backend,
                                  const Shape& input) {
  DPT_INPUT_CHECK(name == "lenet" || name == "resnet18",
                  "--model: unknown model '" << name << "' (lenet|resnet18)");
  const std::string problem = model_input_problem(name, input);
  DPT_INPUT_CHECK(problem.empty(), "--model " << name << " cannot take images of shape "
                                              << shape_str(input) << " (H, W, C): " << problem);
  auto net = name == "lenet" ? lenet(num_classes) : resnet18(num_classes);
  return std::make_unique<Model>(name, std::move(net), input, num_classes, backend);
}

}  // namespace dpt
