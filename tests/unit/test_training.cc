// Short end-to-end training runs on one rank: the loss falls for LeNet and ResNet-18 (synthetic
// data, always) and LeNet learns real Fashion-MNIST (when the Debian data set is installed);
// --save writes a safetensors file that reads back equal.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>

#include "dpt/checkpoint.h"
#include "dpt/comm.h"
#include "dpt/config.h"
#include "dpt/error.h"
#include "dpt/model_file.h"
#include "dpt/models.h"
#include "dpt/nn.h"
#include "dpt/run.h"
#include "dpt/safetensors.h"
#include "dpt/sampler.h"
#include "engine_rig.h"
#include "test_util.h"

namespace dpt {
namespace {

std::unique_ptr<Communicator> world() { return test::world_comm(); }

TEST(Training, LenetLossFallsOnSyntheticData) {
  const std::string dir = test::make_temp_dir("train");
  test::write_synthetic_dataset(dir, 2048, 500, 1);
  TrainConfig c = test::small_config("lenet", dir, 2, 64);
  c.save = dir + "/lenet.safetensors";
  auto comm = world();
  auto hist = run_training(c, *comm);
  ASSERT_EQ(hist.size(), 2u);
  EXPECT_EQ(hist[0].test_count, 500);
  EXPECT_EQ(hist[0].steps, 2048 / 64);
  EXPECT_EQ(hist[0].train_count, 2048 / 64 * 64);
  EXPECT_LT(hist[1].train_loss, 0.5 * std::log(10.0));  // chance level is ln 10
  EXPECT_GT(hist[1].test_acc, 0.9);                     // the bands are easy to tell apart

  // The saved model reads back equal into a fresh model.
  auto m = make_model("lenet");
  auto meta = load_model(c.save, *m);
  EXPECT_EQ(meta.at("model"), "lenet");
  EXPECT_EQ(meta.at("world_size"), "1");
  StFile f = read_safetensors(c.save);
  EXPECT_EQ(f.tensors.size(), 8u);
  for (const auto& t : f.tensors) {
    const Param* p = m->store().find(t.name);
    ASSERT_NE(p, nullptr) << t.name;
    auto v = as_f32(t);
    for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], p->value.data()[i]) << t.name;
  }
  std::filesystem::remove_all(dir);
}

// --init-from's loading (model_file.h): every tensor of the file but a head of another class count,
// which keeps its initial values and is named; any other difference refused naming the tensor.
TEST(ModelFile, InitFromKeepsOnlyAHeadOfAnotherClassCount) {
  const std::string dir = test::make_temp_dir("initfrom");
  auto src = make_model("lenet", 10);
  src->init_parameters("kaiming", 1);
  save_model(dir + "/m.st", *src, {}, nullptr, "--save");
  auto dst = make_model("lenet", 5);
  dst->init_parameters("kaiming", 2);
  const std::vector<float> head(dst->store().find("fc2.weight")->value.data(),
                                dst->store().find("fc2.weight")->value.data() + 5 * 128);
  const auto kept = init_from_file(dir + "/m.st", *dst, "fc2");
  EXPECT_EQ(kept,
            (std::vector<std::string>{"fc2.weight [10, 128] -> [5, 128]", "fc2.bias [10] -> [5]"}));
  for (const Param& p : dst->store().entries()) {
    const float* v = p.value.data();
    if (p.name == "fc2.weight") {
      EXPECT_TRUE(std::equal(head.begin(), head.end(), v));  // as initialised
    } else if (p.name != "fc2.bias") {
      const float* w = src->store().find(p.name)->value.data();
      EXPECT_TRUE(std::equal(v, v + p.numel(), w)) << p.name;
    }
  }
  // Without a head (load_model, evaluate's loader), the class count is a mismatch like any other.
  try {
    load_model(dir + "/m.st", *dst);
    ADD_FAILURE() << "a 10-class file loaded into a 5-class model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'fc2.weight' has shape [10, 128], lenet needs "
                                         "[5, 128]"),
              std::string::npos)
        << e.what();
  }
  // Outside the head, or a head whose input width differs: refused naming the tensor.
  auto other = make_model("lenet", 10, cpu_backend(), {20, 20, 1});
  try {
    init_from_file(dir + "/m.st", *other, "fc2");
    ADD_FAILURE() << "a model for 28x28 images loaded for 20x20";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("was trained on images of 28,28,1"), std::string::npos)
        << e.what();
  }
  std::vector<StTensor> tensors;
  for (const Param& p : src->store().entries())
    tensors.push_back(p.name == "fc2.weight" ? st_f32(p.name, {10, 64}, p.value.data())
                                             : st_f32(p.name, p.shape, p.value.data()));
  write_safetensors(dir + "/narrow.st", tensors);  // no metadata: any safetensors file
  try {
    init_from_file(dir + "/narrow.st", *dst, "fc2");
    ADD_FAILURE() << "a head of another input width re-initialised";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'fc2.weight' has shape [10, 64], lenet needs "
                                         "[5, 128]"),
              std::string::npos)
        << e.what();
  }
  // A tensor the model lacks (a checkpoint's optimizer state aside) is refused too.
  tensors[6] = st_f32("fc2.weight", {10, 128}, src->store().find("fc2.weight")->value.data());
  tensors.push_back(st_f32("extra", {1}, src->store().params()));
  write_safetensors(dir + "/extra.st", tensors);
  try {
    init_from_file(dir + "/extra.st", *dst, "fc2");
    ADD_FAILURE() << "a file with a tensor lenet lacks loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unexpected tensor 'extra'"), std::string::npos)
        << e.what();
  }
  std::filesystem::remove_all(dir);
}

// A head of which one tensor has the new class count and the other the old one is re-initialised
// whole: init_from_file loaded the matching tensor beside the other's fresh values (a weight from
// the file, a bias from nowhere), and named only the other.
TEST(ModelFile, InitFromReinitialisesTheWholeHeadWhenAnyOfItIs) {
  const std::string dir = test::make_temp_dir("halfhead");
  auto src = make_model("lenet", 10);
  src->init_parameters("kaiming", 1);
  auto five = make_model("lenet", 5);
  five->init_parameters("kaiming", 3);
  for (const bool weight_matches : {true, false}) {
    SCOPED_TRACE(weight_matches ? "fc2.weight [5, 128], fc2.bias [10]"
                                : "fc2.weight [10, 128], fc2.bias [5]");
    std::vector<StTensor> tensors;
    for (const Param& p : src->store().entries()) {
      const bool swap = p.name == (weight_matches ? "fc2.weight" : "fc2.bias");
      const Param& from = swap ? *five->store().find(p.name) : p;  // the new class count
      tensors.push_back(st_f32(p.name, from.shape, from.value.data()));
    }
    write_safetensors(dir + "/half.st", tensors);
    auto dst = make_model("lenet", 5);
    dst->init_parameters("kaiming", 2);
    std::map<std::string, std::vector<float>> initial;
    for (const char* name : {"fc2.weight", "fc2.bias"}) {
      const Param* p = dst->store().find(name);
      initial[name].assign(p->value.data(), p->value.data() + p->numel());
    }
    const auto kept = init_from_file(dir + "/half.st", *dst, "fc2");
    const std::string note =
        " (the new class count already, re-initialised with the rest of "
        "the head)";
    EXPECT_EQ(kept, weight_matches ? (std::vector<std::string>{"fc2.weight [5, 128]" + note,
                                                               "fc2.bias [10] -> [5]"})
                                   : (std::vector<std::string>{"fc2.weight [10, 128] -> [5, 128]",
                                                               "fc2.bias [5]" + note}));
    for (const Param& p : dst->store().entries()) {
      const float* v = p.value.data();
      if (p.name.rfind("fc2.", 0) == 0) {
        EXPECT_TRUE(std::equal(v, v + p.numel(), initial[p.name].begin()))
            << p.name << " was loaded from the file";
      } else {
        const float* w = src->store().find(p.name)->value.data();
        EXPECT_TRUE(std::equal(v, v + p.numel(), w)) << p.name;
      }
    }
  }
  std::filesystem::remove_all(dir);
}

// num_batches_tracked (BatchNorm's count of training batches) is an I64 in files and is saved
// exactly: it was held as a float, so a count above 2^24 came back rounded (16777217 saved as
// 16777216), INT64_MAX overflowed llround at the save, and a negative count was loaded.
TEST(ModelFile, BatchNormCountersAreLoadedAndSavedExactly) {
  const std::string dir = test::make_temp_dir("counters");
  auto src = make_model("resnet18", 10);
  src->init_parameters("kaiming", 1);
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  // bn1's count, and every other counter's 5.
  const auto write = [&](const std::string& file, int64_t bn1) {
    std::vector<StTensor> tensors;
    std::vector<int64_t> counts;
    counts.reserve(src->store().entries().size());
    for (const Param& p : src->store().entries()) {
      if (p.is_counter) {
        counts.push_back(p.name == "bn1.num_batches_tracked" ? bn1 : 5);
        tensors.push_back(st_i64(p.name, p.shape, &counts.back()));
      } else {
        tensors.push_back(st_f32(p.name, p.shape, p.value.data()));
      }
    }
    write_safetensors(dir + "/" + file, tensors);
  };
  const auto saved = [&](Model& m, const std::string& name) {
    save_model(dir + "/out.st", m, {}, nullptr, "--save");
    return as_i64(*read_safetensors(dir + "/out.st").find(name))[0];
  };
  for (const int64_t count : {int64_t{0}, int64_t{16777217}, int64_t{1} << 53, kMax - 3, kMax}) {
    SCOPED_TRACE(count);
    write("in.st", count);
    auto dst = make_model("resnet18", 10);
    load_model(dir + "/in.st", *dst);
    EXPECT_EQ(saved(*dst, "bn1.num_batches_tracked"), count);
    EXPECT_EQ(saved(*dst, "layer1.0.bn1.num_batches_tracked"), 5);
    // Training steps count on from the loaded count (the float counts the steps since), and a
    // count at the top saturates instead of wrapping.
    dst->store().find("bn1.num_batches_tracked")->value.data()[0] += 3.f;
    EXPECT_EQ(saved(*dst, "bn1.num_batches_tracked"), count > kMax - 3 ? kMax : count + 3);
    auto fine_tuned = make_model("resnet18", 10);
    init_from_file(dir + "/in.st", *fine_tuned, "fc");
    EXPECT_EQ(saved(*fine_tuned, "bn1.num_batches_tracked"), count);
  }
  // A negative count is refused naming the file and the tensor, by every loader.
  write("negative.st", -1);
  auto dst = make_model("resnet18", 10);
  for (const bool init : {false, true}) {
    try {
      if (init)
        init_from_file(dir + "/negative.st", *dst, "fc");
      else
        load_model(dir + "/negative.st", *dst);
      ADD_FAILURE() << "a count of -1 was loaded";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInput);
      EXPECT_NE(std::string(e.what()).find(dir + "/negative.st: tensor 'bn1.num_batches_tracked' "
                                                 "holds -1: a count of batches is never negative"),
                std::string::npos)
          << e.what();
    }
  }
  std::filesystem::remove_all(dir);
}

// The float of num_batches_tracked counts in the kernels, exact up to 2^24: a run that counted past
// it stopped at 16777216 (16777216 + 1 rounds back in float), and saved that ever after. The
// engine now moves the count into the int64 before the float could pass 2^24: at from_host, and
// every 2^24 forwards after. bn1's float starts 2 short of it (counted by an earlier engine, on top
// of a loaded 2^40): four steps later bn1 has counted exactly 2^24 + 2 since the load (2^24 without
// the fold), and every other counter, from 0, exactly 4.
TEST(ModelFile, BatchNormCounterCountsExactlyPast2To24) {
  const std::string dir = test::make_temp_dir("counter24");
  test::write_synthetic_dataset(dir, 32, 8, 6);
  TrainConfig c = test::small_config("resnet18", dir, 1, 8);
  c.threads = 2;
  test::EngineRig rig(c);
  Param& bn1 = *rig.model->store().find("bn1.num_batches_tracked");
  const int64_t loaded = int64_t{1} << 40, start = (int64_t{1} << 24) - 2;
  // Host state handed to the engine (as a resume or a broadcast does): bn1 has counted already.
  bn1.counter_base = loaded;
  bn1.value.data()[0] = static_cast<float>(start);
  rig.engine->from_host();
  ShardedSampler sampler(rig.train.n, c.batch_size, 0, 1, c.seed);
  rig.engine->begin_epoch(sampler, sampler.steps_per_epoch());
  for (int64_t s = 0; s < 4; ++s) rig.engine->step(s, s, 0.01, nullptr);
  rig.engine->to_host();
  int counters = 0;
  for (const Param& p : rig.model->store().entries())
    if (p.is_counter) {
      ++counters;
      EXPECT_EQ(counter_value(p), &p == &bn1 ? loaded + start + 4 : 4) << p.name;
    }
  EXPECT_EQ(counters, 17);
  std::filesystem::remove_all(dir);
}

// A model file for `src` with one element of one tensor replaced, and no metadata.
std::string file_with(const std::string& path, Model& src, const std::string& tensor, size_t at,
                      float value) {
  std::vector<StTensor> tensors;
  for (const Param& p : src.store().entries()) {
    std::vector<float> v(p.value.data(), p.value.data() + p.numel());
    if (p.name == tensor) v.at(at) = value;
    tensors.push_back(st_f32(p.name, p.shape, v.data()));
  }
  write_safetensors(path, tensors);
  return path;
}

void expect_input_error(const std::function<void()>& load, const std::string& want) {
  try {
    load();
    ADD_FAILURE() << "loaded; expected an error containing '" << want << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput) << e.what();
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos)
        << "expected '" << want << "' in: " << e.what();
  }
}

// NaN or Inf in a file is refused at load, naming the file, the tensor and the first such element,
// before anything is copied into the model: evaluate and predict (load_model), --init-from
// (init_from_file) and --resume (load_model with the optimizer's state, whose buffers too).
TEST(ModelFile, NonFiniteValuesAreRefusedAtLoad) {
  const std::string dir = test::make_temp_dir("nonfinite");
  auto src = make_model("lenet", 10);
  src->init_parameters("kaiming", 1);
  auto dst = make_model("lenet", 10);
  dst->init_parameters("kaiming", 2);
  const std::vector<float> before(dst->store().params(),
                                  dst->store().params() + dst->store().num_params());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();

  const std::string bias = file_with(dir + "/bias.st", *src, "fc2.bias", 0, nan);
  expect_input_error([&] { load_model(bias, *dst); },
                     bias + ": tensor 'fc2.bias' holds nan at element 0 (of 10)");
  // conv1.weight is [20, 1, 3, 3]: 180 elements; the first bad one is named, not the later.
  const std::string conv = file_with(dir + "/conv.st", *src, "conv1.weight", 7, inf);
  expect_input_error([&] { init_from_file(conv, *dst, "fc2"); },
                     conv + ": tensor 'conv1.weight' holds inf at element 7 (of 180)");
  EXPECT_TRUE(std::equal(before.begin(), before.end(), dst->store().params()))
      << "a refused file changed the model";

  // A checkpoint: finite parameters, -inf in the momentum buffer.
  std::vector<float> momentum(static_cast<size_t>(src->store().num_params()), 0.5f);
  momentum[3] = -inf;
  OptimizerState saved{"sgd", {{"optimizer.momentum_buffer", &momentum}}, {}};
  save_model(dir + "/ck.st", *src, {}, &saved);
  std::vector<float> loaded(momentum.size(), 0.0f);
  OptimizerState state{"sgd", {{"optimizer.momentum_buffer", &loaded}}, {}};
  expect_input_error([&] { load_model(dir + "/ck.st", *dst, &state); },
                     dir +
                         "/ck.st: tensor 'optimizer.momentum_buffer' holds -inf at element 3 (of " +
                         std::to_string(momentum.size()) + ")");
  // The control: the same file with a finite buffer loads.
  momentum[3] = 0.25f;
  save_model(dir + "/ck.st", *src, {}, &saved);
  load_model(dir + "/ck.st", *dst, &state);
  EXPECT_EQ(loaded, momentum);
  std::filesystem::remove_all(dir);
}

// A shape of 10,001 dimensions in a file is quoted cut, not as a 30 KB line.
TEST(ModelFile, LongShapeIsCutInMessages) {
  const std::string dir = test::make_temp_dir("longshape");
  auto m = make_model("lenet", 10);
  std::vector<StTensor> tensors;
  for (const Param& p : m->store().entries()) {
    Shape shape = p.shape;
    if (p.name == "conv1.bias") shape.insert(shape.begin(), 10000, 1);  // same 20 elements
    tensors.push_back(st_f32(p.name, shape, p.value.data()));
  }
  write_safetensors(dir + "/long.st", tensors);
  try {
    load_model(dir + "/long.st", *m);
    ADD_FAILURE() << "a 10001-dimensional conv1.bias loaded";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kInput) << msg;
    EXPECT_NE(msg.find("tensor 'conv1.bias' has shape [1, 1, 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("lenet needs [20]"), std::string::npos) << msg;
    EXPECT_LT(msg.size(), 600u) << msg;
  }
  std::filesystem::remove_all(dir);
}

// A header that claims a 1 TiB tensor (a sparse file of that size, so the size checks pass) is
// refused for the names the model lacks before any data is read or allocated.
TEST(ModelFile, AHeadersNamesAreCheckedBeforeItsDataIsRead) {
  const std::string dir = test::make_temp_dir("hugeclaim");
  const uint64_t huge = uint64_t{1} << 40;
  const std::string header = R"({"huge":{"dtype":"U8","shape":[)" + std::to_string(huge) +
                             R"(],"data_offsets":[0,)" + std::to_string(huge) + "]}}";
  const std::string path = dir + "/huge.st";
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    const uint64_t n = header.size();
    std::fwrite(&n, 8, 1, f);
    std::fwrite(header.data(), 1, header.size(), f);
    std::fclose(f);
  }
  std::filesystem::resize_file(path, 8 + header.size() + huge);  // sparse: takes no disk
  auto m = make_model("lenet", 10);
  expect_input_error([&] { load_model(path, *m); },
                     path + ": tensor 'conv1.weight' of lenet is missing");
  expect_input_error([&] { init_from_file(path, *m, "fc2"); },
                     path + ": tensor 'conv1.weight' of lenet is missing");
  std::filesystem::remove_all(dir);
}

// 16-bit activations train LeNet as well as float ones: the same thresholds as above, and the
// first epoch's mean loss (the second's is ~1e-5 on these easy bands) within 10 % of the float
// run's (same seed, data and steps).
TEST(Training, LenetWithBf16ActivationsLearnsAsFloatDoes) {
  const std::string dir = test::make_temp_dir("train16");
  test::write_synthetic_dataset(dir, 2048, 500, 1);
  TrainConfig c = test::small_config("lenet", dir, 2, 64);
  auto comm = world();
  const auto f32 = run_training(c, *comm);
  c.activation_dtype = "bf16";
  const auto b16 = run_training(c, *comm);
  ASSERT_EQ(b16.size(), 2u);
  EXPECT_LT(b16[1].train_loss, 0.5 * std::log(10.0));
  EXPECT_GT(b16[1].test_acc, 0.9);
  EXPECT_NEAR(b16[0].train_loss, f32[0].train_loss, 0.1 * f32[0].train_loss);
  EXPECT_NE(b16[0].train_loss, f32[0].train_loss) << "no rounding happened: the runs are identical";
}

TEST(Training, Resnet18LossFallsOnSyntheticData) {
  const std::string dir = test::make_temp_dir("resnet");
  test::write_synthetic_dataset(dir, 160, 40, 2);
  TrainConfig c = test::small_config("resnet18", dir, 2, 16);
  c.warmup_epochs = 0;
  c.schedule = "constant";
  c.lr = 0.05;
  c.threads = 2;
  c.eval_batch_size = 40;
  c.save = dir + "/r18.safetensors";
  auto comm = world();
  auto hist = run_training(c, *comm);
  ASSERT_EQ(hist.size(), 2u);
  EXPECT_LT(hist[1].train_loss, hist[0].train_loss);
  EXPECT_LT(hist[1].train_loss, std::log(10.0));
  EXPECT_EQ(hist[1].test_count, 40);
  StFile f = read_safetensors(c.save);
  const StTensor* nbt = f.find("bn1.num_batches_tracked");
  ASSERT_NE(nbt, nullptr);
  EXPECT_EQ(nbt->dtype, "I64");
  EXPECT_EQ(as_i64(*nbt)[0], 2 * (160 / 16));  // one per training step
  std::filesystem::remove_all(dir);
}

// --lr 0, which torch.optim.SGD and AdamW accept (to recalibrate BatchNorm statistics without
// moving a weight): validate_config refused it. Each optimizer, through the default recipe's
// warm-up, cosine schedule, momentum and weight decay and --scale-lr, leaves every parameter
// bit for bit as a fresh model initialised with the same seed has it, while the BatchNorm running
// statistics and counters move with the steps.
TEST(Training, ZeroLearningRateTrainsNoWeightButBatchNormStatistics) {
  const std::string dir = test::make_temp_dir("lr0");
  test::write_synthetic_dataset(dir, 64, 16, 5);
  for (const char* optimizer : {"sgd", "adamw"}) {
    SCOPED_TRACE(optimizer);
    TrainConfig c = test::small_config("resnet18", dir, 1, 16);
    c.optimizer = optimizer;
    apply_recipe(&c);
    c.lr = 0;
    c.scale_lr = true;
    c.threads = 2;
    c.eval_every = 0;
    c.save = dir + "/lr0.safetensors";
    auto comm = world();
    const auto hist = run_training(c, *comm);
    ASSERT_EQ(hist.size(), 1u);
    EXPECT_EQ(hist[0].steps, 4);
    EXPECT_EQ(hist[0].lr, 0.0);
    auto fresh = make_model("resnet18", 10);
    fresh->init_parameters(c.init, c.seed);
    const StFile f = read_safetensors(c.save);
    int params = 0, stats_moved = 0, counters = 0;
    for (const Param& p : fresh->store().entries()) {
      const StTensor* t = f.find(p.name);
      ASSERT_NE(t, nullptr) << p.name;
      if (p.is_counter) {
        EXPECT_EQ(as_i64(*t)[0], 4) << p.name;  // one per training step
        ++counters;
        continue;
      }
      const std::vector<float> v = as_f32(*t);
      ASSERT_EQ(static_cast<int64_t>(v.size()), p.numel()) << p.name;
      const bool same = std::memcmp(v.data(), p.value.data(), v.size() * sizeof(float)) == 0;
      if (p.is_buffer) {
        stats_moved += !same;
      } else {
        ++params;
        EXPECT_TRUE(same) << p.name << " moved at --lr 0";
      }
    }
    EXPECT_GT(params, 50);
    EXPECT_EQ(counters, 17);  // the stem's BatchNorm and two in each of the 8 residual blocks
    EXPECT_EQ(stats_moved, 2 * counters) << "every BatchNorm's running mean and variance move";
  }
  std::filesystem::remove_all(dir);
}

TEST(Training, LenetLearnsFashionMnist) {
  const char* data = std::getenv("DPT_TEST_DATA");
  if (!data || !std::filesystem::exists(std::string(data) + "/train-labels-idx1-ubyte.gz"))
    GTEST_SKIP() << "Fashion-MNIST not installed (DPT_TEST_DATA unset or missing)";
  TrainConfig c = test::small_config("lenet", data, 1, 256);
  c.max_steps = 120;
  auto comm = world();
  auto hist = run_training(c, *comm);
  EXPECT_EQ(hist[0].test_count, 10000);
  EXPECT_GT(hist[0].test_acc, 0.70);  // ~0.75-0.80 after 120 steps of 256
}

TEST(Training, EvalEveryEvaluatesOnlyThoseEpochsAndTheLast) {
  const std::string dir = test::make_temp_dir("evalevery");
  test::write_synthetic_dataset(dir, 256, 100, 3);
  TrainConfig c = test::small_config("lenet", dir, 5, 64);
  c.eval_every = 2;
  auto comm = world();
  auto hist = run_training(c, *comm);
  ASSERT_EQ(hist.size(), 5u);
  const int64_t want[5] = {0, 100, 0, 100, 100};  // epochs 2 and 4, and the last (5)
  for (int e = 0; e < 5; ++e) {
    EXPECT_EQ(hist[e].test_count, want[e]) << "epoch " << e + 1;
    EXPECT_EQ(std::isnan(hist[e].test_acc), want[e] == 0) << "epoch " << e + 1;
  }
  c.eval_every = 0;
  auto none = run_training(c, *comm);
  for (const auto& m : none) EXPECT_EQ(m.test_count, 0);
  std::filesystem::remove_all(dir);
}

// --scale-lr scales by the images of one optimizer step: 64 images a step as 32 x --accum-steps 2
// or as one batch of 64 take lr x 64/256 (LeNet has no BatchNorm, so the two runs train alike to
// rounding). It took --batch-size alone (32/256), so accumulation halved the rate of the run it
// stands for.
TEST(Training, ScaleLrCountsTheImagesOfAnOptimizerStep) {
  const std::string dir = test::make_temp_dir("scalelr");
  test::write_synthetic_dataset(dir, 256, 100, 4);
  TrainConfig c = test::small_config("lenet", dir, 2, 64);
  c.scale_lr = true;
  c.schedule = "constant";
  c.warmup_epochs = 0;  // --scale-lr makes it one epoch: epoch 2 runs at the peak
  c.eval_every = 0;
  auto comm = world();
  const auto one = run_training(c, *comm);
  c.batch_size = 32;
  c.accum_steps = 2;
  const auto accumulated = run_training(c, *comm);
  ASSERT_EQ(one.size(), 2u);
  ASSERT_EQ(accumulated.size(), 2u);
  EXPECT_EQ(one[1].lr, c.lr * 64 / 256);
  EXPECT_EQ(accumulated[1].lr, one[1].lr);
  for (int e = 0; e < 2; ++e) {
    EXPECT_EQ(accumulated[e].steps, one[e].steps) << "epoch " << e + 1;
    EXPECT_NEAR(accumulated[e].train_loss, one[e].train_loss, 1e-5 * one[e].train_loss)
        << "epoch " << e + 1;
  }
  std::filesystem::remove_all(dir);
}

TEST(Training, MissingDataDirectoryIsAnInputError) {
  TrainConfig c;
  c.data = "/nonexistent/dptrain-data";
  c.quiet = true;
  auto comm = world();
  try {
    run_training(c, *comm);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dptrain-data"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace dpt
