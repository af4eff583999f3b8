// Flags, recipes, validation and the learning-rate schedules (config.h, optimizer.h), the reference
// SGD (ref_sgd.h), the sampler and evaluation split: every expectation is computed from the
// definitions.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "dpt/config.h"
#include "dpt/error.h"
#include "dpt/optimizer.h"
#include "dpt/sampler.h"
#include "ref_sgd.h"

namespace dpt {
namespace {

TrainConfig parse(std::vector<std::string> args) {
  args.insert(args.begin(), "dptrain");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  TrainConfig cfg;
  std::string help;
  EXPECT_TRUE(parse_config(static_cast<int>(argv.size()), argv.data(), &cfg, &help));
  return cfg;
}

int input_error_of(std::vector<std::string> args, std::string* msg, int world = 1) {
  try {
    TrainConfig c = parse(std::move(args));
    validate_config(c, world);
  } catch (const Error& e) {
    *msg = e.what();
    return e.exit_code();
  }
  return 0;
}

TEST(Config, RecipeD2lMatchesTheSeed) {
  TrainConfig c = parse({"--recipe", "d2l"});
  EXPECT_EQ(c.init, "d2l");
  EXPECT_DOUBLE_EQ(c.lr, 0.2);
  EXPECT_DOUBLE_EQ(c.momentum, 0);
  EXPECT_DOUBLE_EQ(c.weight_decay, 0);
  EXPECT_EQ(c.schedule, "constant");
  EXPECT_EQ(c.batch_size, 256);
  TrainConfig r = parse({"--recipe", "d2l", "--model", "resnet18"});
  EXPECT_DOUBLE_EQ(r.lr, 0.1);
}

TEST(Config, ExplicitFlagsOverrideTheRecipe) {
  TrainConfig c = parse({"--recipe", "d2l", "--lr", "0.5", "--momentum", "0.8", "--epochs", "3"});
  EXPECT_DOUBLE_EQ(c.lr, 0.5);
  EXPECT_DOUBLE_EQ(c.momentum, 0.8);
  EXPECT_EQ(c.epochs, 3);
  EXPECT_EQ(c.init, "d2l");
}

TEST(Config, HelpShowsDefaults) {
  std::vector<std::string> args{"dptrain", "--help"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  TrainConfig c;
  std::string help;
  EXPECT_FALSE(parse_config(2, argv.data(), &c, &help));
  for (const char* flag : {"--model",
                           "--recipe",
                           "--epochs",
                           "--batch-size",
                           "--lr",
                           "--momentum",
                           "--weight-decay",
                           "--seed",
                           "--data",
                           "--device",
                           "--threads",
                           "--max-steps",
                           "--metrics",
                           "--save",
                           "--bucket-mb",
                           "--last-bucket-mb",
                           "--no-overlap",
                           "--accum-steps",
                           "--sync-bn",
                           "--scale-lr",
                           "--verify-every",
                           "--timeout",
                           "--eval-every",
                           "--checkpoint-every",
                           "--resume",
                           "--trace",
                           "--report",
                           "--tf32",
                           "--no-cuda-graphs",
                           "--precision",
                           "--activation-dtype",
                           "--allow-config-change"})
    EXPECT_NE(help.find(flag), std::string::npos) << flag;
  EXPECT_NE(help.find("(default: 256)"), std::string::npos);
  EXPECT_NE(help.find("/usr/share/datasets/fashion-mnist"), std::string::npos);
}

TEST(Config, Tf32IsOffUnlessAsked) {
  TrainConfig d = parse({});
  EXPECT_FALSE(d.tf32);  // fp32 agreement with the CPU by default
  EXPECT_NE(d.to_json().find("\"tf32\":false"), std::string::npos) << d.to_json();
  TrainConfig t = parse({"--tf32", "--device", "cuda"});
  EXPECT_TRUE(t.tf32);
  EXPECT_EQ(t.device, "cuda");
  EXPECT_NE(t.to_json().find("\"tf32\":true"), std::string::npos) << t.to_json();
  std::string msg;
  EXPECT_EQ(input_error_of({"--tf32", "--device", "cpu"}, &msg), 0)
      << msg;  // accepted; ignored on the CPU
}

TEST(Config, CudaGraphsAreOnUnlessTurnedOff) {
  TrainConfig d = parse({});
  EXPECT_TRUE(d.cuda_graphs);
  EXPECT_NE(d.to_json().find("\"cuda_graphs\":true"), std::string::npos) << d.to_json();
  TrainConfig off = parse({"--no-cuda-graphs"});
  EXPECT_FALSE(off.cuda_graphs);
  EXPECT_NE(off.to_json().find("\"cuda_graphs\":false"), std::string::npos) << off.to_json();
}

TEST(Config, PrecisionIsFp32UnlessBf16IsAsked) {
  EXPECT_EQ(parse({}).precision, "fp32");
  TrainConfig b = parse({"--precision", "bf16"});
  EXPECT_EQ(b.precision, "bf16");
  EXPECT_NE(b.to_json().find("\"precision\":\"bf16\""), std::string::npos) << b.to_json();
  std::string msg;
  EXPECT_EQ(input_error_of({"--precision", "fp16"}, &msg), 2);
  EXPECT_NE(msg.find("--precision: 'fp16' is not fp32|bf16"), std::string::npos) << msg;
  EXPECT_EQ(input_error_of({"--precision", "bf16", "--device", "cpu"}, &msg), 0)
      << msg;  // the pre-flight checks the CPU
}

TEST(Config, ActivationDtypeAutoIsBf16OnlyUnderBf16PrecisionOnAFastDevice) {
  EXPECT_EQ(parse({}).activation_dtype, "auto");
  EXPECT_EQ(activation_dtype(parse({})), DType::kF32);
  EXPECT_EQ(activation_dtype(parse({}), true),
            DType::kF32);  // fp32 precision: fp32 activations anywhere
  EXPECT_EQ(activation_dtype(parse({"--precision", "bf16"})),
            DType::kF32);  // the CPU, the legacy cuDNN API
  EXPECT_EQ(activation_dtype(parse({"--precision", "bf16"}), true), DType::kBF16);  // the graph API
  EXPECT_EQ(activation_dtype(parse({"--activation-dtype", "fp32"})), DType::kF32);
  EXPECT_EQ(activation_dtype(parse({"--precision", "bf16", "--activation-dtype", "fp32"}), true),
            DType::kF32);
  TrainConfig b = parse({"--activation-dtype", "bf16"});
  EXPECT_EQ(activation_dtype(b), DType::kBF16);
  EXPECT_EQ(activation_dtype(b, true), DType::kBF16);
  EXPECT_NE(b.to_json().find("\"activation_dtype\":\"bf16\""), std::string::npos) << b.to_json();
  std::string msg;
  EXPECT_EQ(input_error_of({"--activation-dtype", "fp16"}, &msg), 2);
  EXPECT_NE(msg.find("--activation-dtype: 'fp16' is not auto|fp32|bf16"), std::string::npos) << msg;
  // Ranks must agree on it, and a resumed run may not change it silently: it changes the results.
  bool listed = false;
  for (const auto& [flag, value] : agreed_values(b))
    listed |= flag == "--activation-dtype" && value == "\"bf16\"";
  EXPECT_TRUE(listed);
  EXPECT_FALSE(may_change_on_resume("--activation-dtype"));
}

// --device as given is agreed by the ranks (an explicit cuda beside a cpu rank must not quietly
// become cpu), but a resumed run may move to other hardware.
TEST(Config, DeviceIsAgreedAsGivenAndFreeOnResume) {
  bool listed = false;
  for (const auto& [flag, value] : agreed_values(parse({"--device", "cuda"})))
    listed |= flag == "--device" && value == "\"cuda\"";
  EXPECT_TRUE(listed);
  EXPECT_TRUE(may_change_on_resume("--device"));
}

TEST(Config, BadValuesAreInputErrorsNamingTheFlag) {
  struct Case {
    std::vector<std::string> args;
    const char* needle;
  } cases[] = {
      {{"--batch-size", "0"}, "--batch-size"},
      {{"--batch-size", "-5"}, "--batch-size"},
      {{"--lr", "0"}, "--lr"},
      {{"--lr", "-0.1"}, "--lr"},
      {{"--epochs", "0"}, "--epochs"},
      {{"--bucket-mb", "0"}, "--bucket-mb"},
      {{"--bucket-mb", "-1"}, "--bucket-mb"},
      {{"--last-bucket-mb", "-1"}, "--last-bucket-mb"},
      {{"--model", "vgg"}, "--model"},
      {{"--recipe", "fast"}, "--recipe"},
      {{"--device", "tpu"}, "--device"},
      {{"--threads", "0"}, "--threads"},
      {{"--momentum", "1.5"}, "--momentum"},
      {{"--accum-steps", "0"}, "--accum-steps"},
      {{"--schedule", "exp"}, "--schedule"},
      {{"--eval-every", "-1"}, "--eval-every"},
      {{"--epochs", "ten"}, "ten"},
      {{"--no-such-flag"}, "no-such-flag"},
      {{"stray"}, "stray"},
  };
  for (const auto& c : cases) {
    std::string msg;
    EXPECT_EQ(input_error_of(c.args, &msg), 2) << c.args[0];
    EXPECT_NE(msg.find(c.needle), std::string::npos) << msg;
  }
  std::string msg;
  EXPECT_EQ(input_error_of({"--batch-size", "256"}, &msg, 3), 2);
  EXPECT_NE(msg.find("not divisible by the world size 3"), std::string::npos) << msg;
  EXPECT_EQ(input_error_of({"--batch-size", "255"}, &msg, 3), 0);
}

// --normalize values are stored as floats: each is checked as one, at parsing (issue 33, item 5).
// A double-only check let 0/1e39 through (every input 0) and 1e39/1 or 0/1e-40 fail at the first
// step, blaming the gradients.
TEST(Config, NormalizeValuesAreCheckedAsTheFloatsTheyBecome) {
  struct Case {
    const char* value;
    const char* needle;
  } refused[] = {
      {"0/1e39", "standard deviation 1e39 is outside a float's range"},
      {"0/0x1p200", "standard deviation 0x1p200 is outside a float's range"},
      {"1e39/1", "mean 1e39 is outside a float's range"},
      {"-1e39/1", "mean -1e39 is outside a float's range"},
      {"0/1e-40", "standard deviation 1e-40 is below the smallest normal float"},
      {"0/1e-50", "standard deviation 1e-50 is below the smallest normal float"},
      {"0/-1", "standard deviation -1 is not > 0"},
      {"0/nan", "standard deviation 'nan' is not a number"},
      {"3e38/0.5", "makes inputs outside a float's range"},
  };
  for (const auto& c : refused) {
    std::string msg;
    EXPECT_EQ(input_error_of({"--normalize", c.value}, &msg), 2) << c.value;
    EXPECT_NE(msg.find(std::string("--normalize '") + c.value + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.needle), std::string::npos) << msg;
  }
  // The edges that are floats: the largest finite mean over std 1, the smallest normal std.
  for (const char* ok : {"3.4e38/1", "0/1.2e-38", "0.5,0.5,0.5/0.25,0.25,0.25", "1e-40/1"}) {
    std::string msg;
    EXPECT_EQ(input_error_of({"--normalize", ok}, &msg), 0) << ok << ": " << msg;
  }
}

TEST(Schedule, WarmupThenCosineAndStep) {
  TrainConfig c;
  c.lr = 0.4;
  c.epochs = 4;
  c.warmup_epochs = 1;
  c.schedule = "cosine";
  const int64_t spe = 10;
  EXPECT_NEAR(learning_rate(c, 0, spe), 0.4 * 1 / 10.0, 1e-12);  // linear warm-up
  EXPECT_NEAR(learning_rate(c, 4, spe), 0.4 * 5 / 10.0, 1e-12);
  EXPECT_NEAR(learning_rate(c, 10, spe), 0.4, 1e-12);  // peak right after warm-up
  EXPECT_NEAR(learning_rate(c, 25, spe), 0.4 * 0.5 * (1 + std::cos(M_PI * 1.5 / 3)), 1e-12);
  c.schedule = "step";
  c.step_epochs = {2, 3};
  c.step_gamma = 0.1;
  EXPECT_NEAR(learning_rate(c, 15, spe), 0.4, 1e-12);
  EXPECT_NEAR(learning_rate(c, 20, spe), 0.04, 1e-12);
  EXPECT_NEAR(learning_rate(c, 35, spe), 0.004, 1e-12);
  c.schedule = "constant";
  c.warmup_epochs = 0;
  EXPECT_DOUBLE_EQ(learning_rate(c, 37, spe), 0.4);
}

TEST(RefSgd, MatchesPyTorchFormulaOverThreeSteps) {
  // PyTorch: d = g + wd*p; buf = d (first) else m*buf + d; p -= lr*buf.
  const double lr = 0.1, m = 0.9, wd = 0.01;
  std::vector<float> p{1.f, -2.f}, g{0.5f, 0.25f};
  test::RefSgd opt(2, m, wd);
  double rp[2] = {1, -2}, buf[2] = {0, 0};
  for (int s = 0; s < 3; ++s) {
    opt.step(p.data(), g.data(), lr);
    for (int i = 0; i < 2; ++i) {
      const double d = g[i] + wd * rp[i];
      buf[i] = s == 0 ? d : m * buf[i] + d;
      rp[i] -= lr * buf[i];
    }
  }
  EXPECT_NEAR(p[0], rp[0], 1e-6);
  EXPECT_NEAR(p[1], rp[1], 1e-6);
  test::RefSgd plain(1, 0, 0);
  float q = 1.f, gq = 2.f;
  plain.step(&q, &gq, 0.25);
  EXPECT_FLOAT_EQ(q, 0.5f);
}

TEST(Sampler, ShardsPartitionEachGlobalBatchAndEpochsDiffer) {
  const int64_t n = 1000, B = 96;
  for (int world : {1, 2, 3, 4}) {
    std::vector<ShardedSampler> ranks;
    for (int r = 0; r < world; ++r) ranks.emplace_back(n, B, r, world, 7);
    ShardedSampler whole(n, B, 0, 1, 7);
    EXPECT_EQ(ranks[0].steps_per_epoch(), n / B);  // the incomplete last batch is dropped
    std::set<int64_t> seen;
    for (int64_t s = 0; s < whole.steps_per_epoch(); ++s) {
      // Concatenating the ranks' slices gives exactly the single-rank batch.
      std::vector<int64_t> cat;
      for (auto& rs : ranks)
        cat.insert(cat.end(), rs.local_indices(s), rs.local_indices(s) + B / world);
      EXPECT_EQ(cat, std::vector<int64_t>(whole.local_indices(s), whole.local_indices(s) + B));
      seen.insert(cat.begin(), cat.end());
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), (n / B) * B);  // no index twice in an epoch
  }
  ShardedSampler a(n, B, 0, 1, 7);
  std::vector<int64_t> e0(a.local_indices(0), a.local_indices(0) + B);
  a.set_epoch(1);
  EXPECT_NE(e0, std::vector<int64_t>(a.local_indices(0), a.local_indices(0) + B));
  a.set_epoch(0);
  EXPECT_EQ(e0, std::vector<int64_t>(a.local_indices(0), a.local_indices(0) + B));
}

TEST(EvalRange, CoversEveryImageExactlyOnce) {
  for (int world = 1; world <= 7; ++world) {
    int64_t next = 0;
    for (int r = 0; r < world; ++r) {
      auto [b, e] = eval_range(10000, r, world);
      EXPECT_EQ(b, next);
      EXPECT_LE(e - b, 10000 / world + 1);
      next = e;
    }
    EXPECT_EQ(next, 10000);
  }
}

}  // namespace
}  // namespace dpt
