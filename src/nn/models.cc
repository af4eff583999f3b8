// The model table (include/dpt/models.h) and its builders: the d2l chapter's LeNet (§12.5) and
// modified ResNet-18 (§12.6), and torchvision's ResNet-18/34/50 (torchvision.models.resnet), for
// the chapter's 28x28 single-channel images or any shape they can take (the layers size themselves
// from their input). Names follow PyTorch's state_dict scheme (torchvision's own for its models).
#include "dpt/models.h"

#include <algorithm>

#include "dpt/error.h"

namespace dpt {

namespace {

std::unique_ptr<Sequential> lenet(int num_classes, const ModelOptions&) {
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

std::unique_ptr<Sequential> resnet18(int num_classes, const ModelOptions& options) {
  auto net = std::make_unique<Sequential>();
  // BatchNorm and the ReLU after it run as one fused layer (here and in each block: nn.h).
  net->add("conv1", make_conv2d(64, 3, 1, 1)).add("bn1", make_batchnorm2d_relu());
  const int64_t channels[4] = {64, 128, 256, 512};
  for (int stage = 0; stage < 4; ++stage) {
    auto blocks = std::make_unique<Sequential>();
    const bool first = stage == 0;  // the first stage keeps the resolution and has no 1x1 conv
    blocks->add("0",
                make_residual(channels[stage], !first, first ? 1 : 2, options.zero_init_residual));
    blocks->add("1", make_residual(channels[stage], false, 1, options.zero_init_residual));
    net->add("layer" + std::to_string(stage + 1), std::move(blocks));
  }
  net->add("", make_global_avgpool()).add("fc", make_linear(num_classes));
  return net;
}

// torchvision's ResNet (torchvision.models.resnet.ResNet): the stem, four stages of `blocks[i]`
// blocks of 64, 128, 256, 512 planes (the first block of stages 2-4 at stride 2), global average
// pooling and fc. The stem is torchvision's (imagenet: conv1 7x7 stride 2 pad 3, bn1, ReLU, 3x3
// stride-2 max-pool) or the CIFAR one under the same names (conv1 3x3 stride 1 pad 1, bn1, ReLU).
std::unique_ptr<Sequential> torchvision_resnet(int num_classes, const ModelOptions& options,
                                               bool bottleneck, const int (&blocks)[4]) {
  auto net = std::make_unique<Sequential>();
  if (options.stem == "imagenet")
    net->add("conv1", make_conv2d(64, 7, 2, 3, /*bias=*/false))
        .add("bn1", make_batchnorm2d_relu())
        .add("", make_maxpool2d(3, 2, 1));
  else
    net->add("conv1", make_conv2d(64, 3, 1, 1, /*bias=*/false)).add("bn1", make_batchnorm2d_relu());
  const int64_t expansion = bottleneck ? 4 : 1;
  int64_t inplanes = 64;
  for (int stage = 0; stage < 4; ++stage) {
    const int64_t planes = int64_t{64} << stage;
    auto layer = std::make_unique<Sequential>();
    for (int b = 0; b < blocks[stage]; ++b) {
      const int64_t stride = b == 0 && stage > 0 ? 2 : 1;
      // torchvision's rule: a projection where the stride or the width changes.
      const bool downsample = b == 0 && (stride != 1 || inplanes != planes * expansion);
      layer->add(std::to_string(b),
                 bottleneck
                     ? make_bottleneck(planes, stride, downsample, options.zero_init_residual)
                     : make_basic_block(planes, stride, downsample, options.zero_init_residual));
      inplanes = planes * expansion;
    }
    net->add("layer" + std::to_string(stage + 1), std::move(layer));
  }
  net->add("", make_global_avgpool()).add("fc", make_linear(num_classes));
  return net;
}

std::unique_ptr<Sequential> resnet18_tv(int num_classes, const ModelOptions& options) {
  return torchvision_resnet(num_classes, options, false, {2, 2, 2, 2});
}
std::unique_ptr<Sequential> resnet34(int num_classes, const ModelOptions& options) {
  return torchvision_resnet(num_classes, options, false, {3, 4, 6, 3});
}
std::unique_ptr<Sequential> resnet50(int num_classes, const ModelOptions& options) {
  return torchvision_resnet(num_classes, options, true, {3, 4, 6, 3});
}

// LeNet: conv 3x3, pool 2, conv 5x5, pool 2, each without padding, must leave at least 1x1:
// ((H - 2) / 2 - 4) / 2 >= 1, i.e. H >= 14.
std::string lenet_input_problem(const Shape& input) {
  if (input[0] < 14 || input[1] < 14)
    return "lenet needs images of at least 14x14 (its two convolutions and poolings leave nothing "
           "of smaller ones)";
  return "";
}

// ResNet-18 pads every 3x3 convolution and pools globally: any size. So do torchvision's ResNets
// with either stem: every strided convolution and the max-pool are padded, so each halves a side
// rounding up (ceil(H/2)) and leaves at least 1x1 of any image; below 32 pixels (imagenet stem) or
// 8 (cifar) the last stages see 1x1.
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
       any_input,
       /*stems=*/false,
       /*residual=*/true},
      {"resnet18-tv",
       "torchvision's ResNet-18: BasicBlock 2-2-2-2, torchvision's names, --stem; any image size",
       resnet18_tv,
       {.default_recipe = 0.1, .d2l = 0.1},
       "fc",
       any_input,
       /*stems=*/true,
       /*residual=*/true},
      {"resnet34",
       "torchvision's ResNet-34: BasicBlock 3-4-6-3, torchvision's names, --stem; any image size",
       resnet34,
       {.default_recipe = 0.1, .d2l = 0.1},
       "fc",
       any_input,
       /*stems=*/true,
       /*residual=*/true},
      {"resnet50",
       "torchvision's ResNet-50: Bottleneck 3-4-6-3 (v1.5), torchvision's names, --stem; any "
       "image size",
       resnet50,
       {.default_recipe = 0.1, .d2l = 0.1},
       "fc",
       any_input,
       /*stems=*/true,
       /*residual=*/true},
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

void check_model_options(const std::string& name, const ModelOptions& options) {
  const ModelSpec& spec = model_spec(name);
  DPT_INPUT_CHECK(options.stem == "auto" || options.stem == "imagenet" || options.stem == "cifar",
                  "--stem: '" << options.stem << "' is not auto|imagenet|cifar");
  std::string stems;
  for (const ModelSpec& m : models())
    if (m.stems) stems += (stems.empty() ? "" : "|") + m.name;
  DPT_INPUT_CHECK(spec.stems || options.stem == "auto",
                  "--stem " << options.stem << ": --model " << name
                            << " has a fixed stem; --stem chooses one for " << stems);
  DPT_INPUT_CHECK(spec.residual || !options.zero_init_residual,
                  "--zero-init-residual: --model " << name << " has no residual blocks");
}

std::string resolve_stem(const std::string& name, const ModelOptions& options, const Shape& input) {
  check_model_options(name, options);
  if (!model_spec(name).stems) return "";
  if (options.stem != "auto") return options.stem;
  return input.size() >= 2 && std::min(input[0], input[1]) < 64 ? "cifar" : "imagenet";
}

namespace {
// make_model's checks and its network, unbuilt; `stem` gets the resolved stem.
std::unique_ptr<Sequential> checked_net(const std::string& name, int num_classes,
                                        const Shape& input, const ModelOptions& options,
                                        std::string& stem) {
  const ModelSpec& spec = model_spec(name);
  ModelOptions resolved = options;
  resolved.stem = resolve_stem(name, options, input);
  const std::string problem = model_input_problem(name, input);
  DPT_INPUT_CHECK(problem.empty(), "--model " << name << " cannot take images of shape "
                                              << shape_str(input) << " (H, W, C): " << problem);
  stem = resolved.stem;
  return spec.build(num_classes, resolved);
}
}  // namespace

std::unique_ptr<Model> make_model(const std::string& name, int num_classes, Backend& backend,
                                  const Shape& input, const ModelOptions& options) {
  std::string stem;
  auto net = checked_net(name, num_classes, input, options, stem);
  auto model = std::make_unique<Model>(name, std::move(net), input, num_classes, backend);
  model->set_stem(stem);
  return model;
}

int64_t count_parameters(const std::string& name, int num_classes, const Shape& input,
                         const ModelOptions& options) {
  std::string stem;
  auto net = checked_net(name, num_classes, input, options, stem);
  // Registered but never finalized: the store allocates nothing, and the layers' build() only
  // records shapes.
  ParamStore store;
  net->build(input, store, "");
  int64_t n = 0;
  for (const Param& p : store.entries())
    if (!p.is_buffer) n += p.numel();
  return n;
}

}  // namespace dpt
