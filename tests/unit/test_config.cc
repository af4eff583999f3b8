// Flags (the table of flags.h) and the list splitter of their list values (text.h), recipes, the
// model table (models.h), validation and the learning-rate schedules (optimizer.h), the reference
// SGD (ref_sgd.h), the sampler and evaluation split: every expectation is computed from the
// definitions.

#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <variant>

#include "dpt/config.h"
#include "dpt/dataset.h"
#include "dpt/error.h"
#include "dpt/flags.h"
#include "dpt/models.h"
#include "dpt/optimizer.h"
#include "dpt/sampler.h"
#include "dpt/text.h"
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

// dptrain --help's text.
// --help of a command ("": training).
std::string help_text(const std::string& command = "") {
  std::vector<std::string> args{"dptrain", "--help"};
  if (!command.empty()) args.insert(args.begin() + 1, command);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  TrainConfig c;
  std::string help;
  EXPECT_FALSE(parse_config(static_cast<int>(argv.size()), argv.data(), &c, &help));
  return help;
}

// The command word a flag's samples are given to ("": training, which every flag but the ones
// of evaluate and predict alone belongs to).
std::string command_of(const Flag& f) {
  if (f.commands & kCommandTrain) return "";
  return f.commands & kCommandEvaluate ? "evaluate" : "predict";
}

// Every flag is listed: Flags.HelpListsEveryFlagInItsGroup.
// --optimizer adamw takes torch.optim.AdamW's defaults (lr 1e-3, weight decay 0.01) under every
// recipe, and no SGD momentum; the recipe's schedule and warm-up stay; explicit values win. SGD's
// recipes are unchanged by the new flags' defaults.
TEST(Config, AdamwDefaultsAndRecipes) {
  for (const char* recipe : {"default", "d2l"}) {
    SCOPED_TRACE(recipe);
    const TrainConfig sgd = parse({"--recipe", recipe});
    const TrainConfig a = parse({"--recipe", recipe, "--optimizer", "adamw"});
    EXPECT_EQ(a.optimizer, "adamw");
    EXPECT_DOUBLE_EQ(a.lr, 1e-3);
    EXPECT_DOUBLE_EQ(a.weight_decay, 0.01);
    EXPECT_DOUBLE_EQ(a.momentum, 0);
    EXPECT_EQ(a.schedule, sgd.schedule);
    EXPECT_DOUBLE_EQ(a.warmup_epochs, sgd.warmup_epochs);
    EXPECT_EQ(a.init, sgd.init);
    EXPECT_EQ(a.betas, (std::vector<double>{0.9, 0.999}));
    EXPECT_DOUBLE_EQ(a.eps, 1e-8);
    std::string msg;
    EXPECT_EQ(input_error_of({"--recipe", recipe, "--optimizer", "adamw"}, &msg), 0) << msg;
    EXPECT_EQ(sgd.optimizer, "sgd");
    EXPECT_FALSE(sgd.nesterov || sgd.no_decay_bn_bias);
    EXPECT_DOUBLE_EQ(sgd.label_smoothing, 0);
  }
  const TrainConfig e = parse({"--optimizer", "adamw", "--lr", "0.004", "--weight-decay", "0.05",
                               "--betas", "0.85,0.98", "--eps", "1e-6"});
  EXPECT_DOUBLE_EQ(e.lr, 0.004);
  EXPECT_DOUBLE_EQ(e.weight_decay, 0.05);
  EXPECT_EQ(e.betas, (std::vector<double>{0.85, 0.98}));
  EXPECT_DOUBLE_EQ(e.eps, 1e-6);
  // The betas are agreed and recorded as the doubles they read as (no rounding in the text).
  const TrainConfig b = parse({"--betas", "0.9,0.99999999999"});
  EXPECT_EQ(b.betas[1], 0.99999999999);
  EXPECT_EQ(nlohmann::json::parse(b.to_json()).at("betas"),
            nlohmann::json::array({0.9, 0.99999999999}));
  std::string msg;
  EXPECT_EQ(input_error_of({"--nesterov"}, &msg), 0) << msg;  // the default recipe's momentum 0.9
  EXPECT_EQ(input_error_of({"--label-smoothing", "0.999"}, &msg), 0) << msg;
  // torch.nn.CrossEntropyLoss accepts label_smoothing in [0, 1]: 1 is the uniform target alone
  // (0.99999999999 is 1 as the float the loss takes). Both were refused.
  EXPECT_EQ(input_error_of({"--label-smoothing", "1"}, &msg), 0) << msg;
  EXPECT_EQ(input_error_of({"--label-smoothing", "0.99999999999"}, &msg), 0) << msg;
  // torch.optim.SGD and AdamW accept lr=0 (the steps run, no parameter moves): it was refused.
  EXPECT_EQ(input_error_of({"--lr", "0"}, &msg), 0) << msg;
  EXPECT_EQ(input_error_of({"--lr", "0", "--optimizer", "adamw", "--scale-lr"}, &msg), 0) << msg;
  EXPECT_EQ(parse({"--lr", "0"}).lr, 0.0);
}

TEST(Config, HelpShowsDefaults) {
  const std::string help = help_text();
  EXPECT_NE(help.find("(default: 256)"), std::string::npos);
  EXPECT_NE(help.find("/usr/share/datasets/fashion-mnist"), std::string::npos);
}

// --timeout read ahead of MPI (it bounds MPI_Init): the value parse_config would take, or the
// default, 300, wherever parse_config will refuse it (by name, once MPI is up).
TEST(Config, EarlyTimeoutIsTheFlagsOrTheDefault) {
  const auto early = [](std::vector<std::string> args) {
    args.insert(args.begin(), "dptrain");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    return early_timeout(static_cast<int>(argv.size()), argv.data());
  };
  EXPECT_EQ(early({}), 300.0);
  EXPECT_EQ(early({"--model", "lenet", "--timeout", "5"}), 5.0);
  EXPECT_EQ(early({"evaluate", "--timeout=7.5", "--load", "m.st"}), 7.5);
  EXPECT_EQ(early({"--timeout", "0"}), 0.0);
  EXPECT_EQ(early({"--timeout", "1e7"}), 1e7);
  for (const char* same : {"7.5", "5", "0.5e1"})
    EXPECT_EQ(parse({"--timeout", same}).timeout, early({"--timeout", same})) << "'" << same << "'";
  // 1e-400: below the smallest double, read as 0 (no limit) before it was refused. Blanks around
  // the value, '+' and hex are refused by the flag (read_number) and so by its early reading.
  for (const char* bad : {"abc", "-1", "1e8", "nan", "inf", "5s", "", "0x10", "5,5", "1e-400", " 5",
                          "5 ", "+5", "0x1p2"})
    EXPECT_EQ(early({"--timeout", bad}), 300.0) << "'" << bad << "'";
  EXPECT_EQ(early({"--timeout"}), 300.0) << "no value";
  EXPECT_EQ(early({"--timeouts", "5"}), 300.0) << "another flag";
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
      {{"--lr", "-0.1"}, "--lr must be >= 0, got -0.1"},
      {{"--lr", "nan"}, "--lr"},
      {{"--lr", "inf"}, "--lr"},
      {{"--epochs", "0"}, "--epochs"},
      {{"--bucket-mb", "0"}, "--bucket-mb"},
      {{"--bucket-mb", "-1"}, "--bucket-mb"},
      {{"--last-bucket-mb", "-1"}, "--last-bucket-mb"},
      {{"--model", "vgg"}, "--model"},
      {{"--recipe", "fast"}, "--recipe"},
      {{"--device", "tpu"}, "--device"},
      {{"--threads", "0"}, "--threads"},
      {{"--momentum", "1.5"}, "--momentum"},
      {{"--optimizer", "adam"}, "--optimizer: 'adam' is not sgd|adamw"},
      {{"--recipe", "d2l", "--nesterov"}, "--nesterov needs --momentum > 0"},
      {{"--momentum", "0", "--nesterov"}, "--nesterov needs --momentum > 0"},
      {{"--optimizer", "adamw", "--nesterov"}, "--nesterov is SGD's"},
      {{"--optimizer", "adamw", "--momentum", "0.9"}, "--momentum 0.9 is SGD's"},
      {{"--betas", "0.9"}, "--betas: '0.9' is not B1,B2"},
      {{"--betas", "0.9,0.99,0.9"}, "--betas: '0.9,0.99,0.9' is not B1,B2"},
      {{"--betas", "0.9,x"}, "--betas: '0.9,x' is not B1,B2"},
      {{"--betas", ""}, "--betas: '' is not B1,B2"},  // no items: a count of 0
      {{"--betas", "0.9,"}, "--betas: '0.9,' is not B1,B2"},
      {{"--betas", ",0.9"}, "--betas: ',0.9' is not B1,B2"},
      {{"--betas", "0.9,,0.99"}, "--betas: '0.9,,0.99' is not B1,B2"},
      {{"--betas", "0.9,1"}, "--betas: each must be in [0, 1)"},
      {{"--betas", "-0.1,0.9"}, "--betas: each must be in [0, 1)"},
      {{"--eps", "-1e-8"}, "--eps must be at least"},
      {{"--eps", "0"}, "--eps must be at least"},
      {{"--eps", "1e-39"}, "--eps must be at least"},  // a float denormal: flushed to 0
      {{"--label-smoothing", "-0.1"}, "--label-smoothing must be in [0, 1], got -0.1"},
      // Above 1, though the float the loss takes rounds it to 1: the bound is torch's, on the
      // value given.
      {{"--label-smoothing", "1.00000001"}, "--label-smoothing must be in [0, 1], got 1.00000001"},
      {{"--label-smoothing", "inf"}, "--label-smoothing"},
      {{"--weight-decay", "nan"}, "--weight-decay"},
      {{"--accum-steps", "0"}, "--accum-steps"},
      {{"--schedule", "exp"}, "--schedule"},
      {{"--eval-every", "-1"}, "--eval-every"},
      // Above 1e7 s a wait's steady-clock deadline came near overflow (past ~9.2e9 s it wrapped:
      // every multi-rank run failed its first all-reduce at once); 0 is the way to no limit.
      {{"--timeout", "1e10"}, "--timeout 1e+10 is above the maximum of 10000000 s (115 days)"},
      {{"--timeout", "1e300"}, "use 0 for no limit"},
      {{"--timeout", "10000001"}, "--timeout 10000001 is above"},
      {{"--timeout", "-1"}, "--timeout must be >= 0"},
      // Milestones count completed epochs: 0 or less would only lower the starting rate.
      {{"--schedule", "step", "--step-epochs", "-1,0,100", "--epochs", "3"},
       "--step-epochs: each item must be between 1 and 2147483647, got -1"},
      {{"--schedule", "step", "--step-epochs", "2,0"},
       "--step-epochs: each item must be between 1 and 2147483647, got 0"},
      // Milestones are ignored by any other schedule: given there, they are refused.
      {{"--step-epochs", "2"}, "--step-epochs applies to --schedule step (the schedule is cosine)"},
      {{"--recipe", "d2l", "--step-epochs", "2"}, "(the schedule is constant)"},
      {{"--schedule", "cosine", "--step-epochs", "2"}, "--step-epochs applies to --schedule step"},
      // A warm-up past the last epoch never reaches the rate.
      {{"--warmup-epochs", "1e308", "--epochs", "3"},
       "--warmup-epochs 1e+308 is longer than the run: at most --epochs 3"},
      {{"--warmup-epochs", "3.5", "--epochs", "3"}, "--warmup-epochs 3.5 is longer than the run"},
      {{"--scale-lr", "--warmup-epochs", "11"}, "at most --epochs 10"},
      // --log-level is checked whether or not --quiet leaves it unread.
      {{"--log-level", "trace"}, "--log-level: 'trace' is not one of error|warn|info|debug"},
      {{"--log-level", "trace", "--quiet"}, "--log-level: 'trace' is not one of"},
      {{"--log-level", "DEBUG", "--quiet"}, "--log-level: 'DEBUG' is not one of"},
      {{"--log-level", "", "--quiet"}, "--log-level: '' is not one of"},
      {{"--augment", ""}, "--augment: empty; use none"},
      {{"--augment", "flip,"}, "--augment 'flip,': '' is not crop, crop=P or flip"},
      {{"--epochs", "ten"}, "ten"},
      // An item of a list value: cxxopts named only the item ("Argument 'x' failed to parse").
      {{"--schedule", "step", "--step-epochs", "1,x"},
       "--step-epochs: '1,x' has the item 'x', which is not a valid value"},
      {{"--schedule", "step", "--step-epochs=1,,2"},
       "--step-epochs: '1,,2' has the item '', which is not a valid value"},
      {{"--schedule", "step", "--step-epochs", ",1"},
       "--step-epochs: ',1' has the item '', which is not a valid value"},
      // cxxopts itself dropped a last empty item: "1,2," ran as 1,2 while "1,,2" was refused.
      {{"--schedule", "step", "--step-epochs", "1,2,"},
       "--step-epochs: '1,2,' has the item '', which is not a valid value"},
      {{"--schedule", "step", "--step-epochs=1,2,"},
       "--step-epochs: '1,2,' has the item '', which is not a valid value"},
      // Past the field's type, the flag's own range (not the type's, "from -2147483648"), as
      // inside it.
      {{"--schedule", "step", "--step-epochs", "99999999999"},
       "--step-epochs: each item must be between 1 and 2147483647, got 99999999999"},
      {{"--schedule", "step", "--step-epochs", "2,-99999999999"},
       "--step-epochs: each item must be between 1 and 2147483647, got -99999999999"},
      {{"--epochs", "3000000000"}, "--epochs must be between 1 and 2147483647, got 3000000000"},
      {{"--epochs", "-3000000000"}, "--epochs must be between 1 and 2147483647, got -3000000000"},
      {{"--epochs", "0"}, "--epochs must be between 1 and 2147483647, got 0"},
      {{"--threads", "3000000000"}, "--threads must be between 1 and 1024, got 3000000000"},
      {{"--threads", "1025"}, "--threads must be between 1 and 1024, got 1025"},
      {{"--max-steps", "-1"}, "--max-steps must be between 0 and 9223372036854775807, got -1"},
      {{"--max-steps", "9223372036854775808"},
       "--max-steps must be between 0 and 9223372036854775807, got 9223372036854775808"},
      {{"--keep-checkpoints", "2147483648"},
       "--keep-checkpoints must be between 0 and 2147483647, got 2147483648"},
      {{"--schedule", "step", "--step-epochs", "2,0x3"},
       "--step-epochs: '2,0x3' has the item '0x3', which is not a valid value: it is not a whole "
       "number"},
      {{"--schedule", "step", "--step-epochs", "2, 3"}, "has the item ' 3', which is not a valid"},
      {{"--schedule", "step", "--step-epochs", ""}, "--step-epochs: '' is not a whole number"},
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

// The edges each refusal above leaves open: each accepted.
// Every integer flag with a range in the table: its bounds are taken, one past either refused,
// and a value past its field's type refused in the same words (the flag's range, not the type's
// "from -2147483648"), naming the flag and the value typed.
TEST(Config, EveryIntegerFlagStatesItsOwnRange) {
  int checked = 0;
  for (const Flag& f : flags()) {
    if (!f.min && !f.max) continue;
    const bool list = std::holds_alternative<std::vector<int> TrainConfig::*>(f.field);
    const bool wide = std::holds_alternative<int64_t TrainConfig::*>(f.field);
    ASSERT_TRUE(list || wide || std::holds_alternative<int TrainConfig::*>(f.field)) << f.name;
    const int64_t type_max =
        wide ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int>::max();
    const int64_t lo = f.min.value_or(wide ? std::numeric_limits<int64_t>::min()
                                           : std::numeric_limits<int>::min());
    const int64_t hi = f.max.value_or(type_max);
    // The flag in its command (--top-k is predict's), under the schedule a list of epochs needs.
    const auto args = [&](const std::string& value) {
      std::vector<std::string> a;
      if (!(f.commands & kCommandTrain)) a = {"predict", "--load", "m.st", "--output", "p.csv"};
      if (f.name == "step-epochs") a.insert(a.end(), {"--schedule", "step"});
      a.insert(a.end(), {"--" + f.name, value});
      return a;
    };
    const std::string words = "--" + f.name + (list ? ": each item" : "") + " must be between " +
                              std::to_string(lo) + " and " + std::to_string(hi) + ", got ";
    std::string msg;
    for (const int64_t ok : {lo, hi}) {
      // --epochs at its maximum needs the warm-up it is compared with to stay below it: fine.
      EXPECT_EQ(input_error_of(args(std::to_string(ok)), &msg), 0) << f.name << " " << ok << msg;
    }
    std::vector<std::string> refused = {
        // Past the type: 10^30 has more digits than any int64.
        "1000000000000000000000000000000", "-1000000000000000000000000000000"};
    if (lo > std::numeric_limits<int64_t>::min()) refused.push_back(std::to_string(lo - 1));
    if (hi < type_max) refused.push_back(std::to_string(hi + 1));
    for (const std::string& bad : refused) {
      EXPECT_EQ(input_error_of(args(bad), &msg), 2) << f.name << " " << bad;
      EXPECT_EQ(msg, words + bad) << f.name;
    }
    ++checked;
  }
  // epochs, batch-size, step-epochs, threads, max-steps, eval-batch-size, eval-every,
  // accum-steps, nonfinite-max-skips, verify-every, keep-checkpoints, top-k, metrics-every.
  EXPECT_EQ(checked, 13);
}

TEST(Config, ScheduleLogAndTimeoutEdgesAreAccepted) {
  const std::vector<std::vector<std::string>> accepted = {
      {"--timeout", "0"},         // no limit
      {"--timeout", "10000000"},  // the maximum itself, 115 days
      {"--timeout", "0.5"},
      // A milestone past --epochs is never reached, and harmless (torch's MultiStepLR takes it).
      {"--schedule", "step", "--step-epochs", "1,100", "--epochs", "3"},
      {"--schedule", "step"},  // no milestones: a constant rate, as MultiStepLR with none
      {"--warmup-epochs", "3", "--epochs", "3"},  // warm-up over the whole run
      {"--recipe", "d2l", "--epochs", "1"},       // the recipes' own warm-ups (0) and schedules
      {"--epochs", "1"},                          // the default recipe's 1 warm-up epoch
      {"--log-level", "debug", "--quiet"},
      {"--augment", "none"},
  };
  for (const auto& args : accepted) {
    std::string msg;
    EXPECT_EQ(input_error_of(args, &msg), 0) << args[0] << " " << args[1] << ": " << msg;
  }
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
      // Hex floats were read (strtod's); now a number is decimal (read_number, text.h).
      {"0/0x1p200", "standard deviation '0x1p200' is not a number"},
      {"0x1p-1/0.5", "mean '0x1p-1' is not a number"},
      {" 0.5/1", "mean ' 0.5' is not a number"},
      {"0.5/+1", "standard deviation '+1' is not a number"},
      {"0/inf", "standard deviation 'inf' is not a number"},
      {"1e400/1", "mean 1e400 is outside a float's range"},
      {"1e-400/1", "mean '1e-400' is not a number a double can hold: it is too small"},
      {"1e39/1", "mean 1e39 is outside a float's range"},
      {"-1e39/1", "mean -1e39 is outside a float's range"},
      {"0/1e-40", "standard deviation 1e-40 is below the smallest normal float"},
      {"0/1e-50", "standard deviation 1e-50 is below the smallest normal float"},
      {"0/-1", "standard deviation -1 is not > 0"},
      {"0/nan", "standard deviation 'nan' is not a number"},
      {"3e38/0.5", "makes inputs outside a float's range"},
      // An empty half is no values (split_list's empty-text rule); an empty item is no number.
      {"/", "gives no means"},
      {"/1", "gives no means"},
      {"0.5/", "gives 1 means but 0 standard deviations"},
      {"0.5,/1,1", "mean '' is not a number"},
      {"0.5/1,", "standard deviation '' is not a number"},
      {"0.5/1/1", "is not none, auto or M1,..,Mc/S1,..,Sc"},
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

// The one list splitter (text.h) every list parser uses: empty items kept wherever they stand, so
// each parser refuses them by name; the empty text is no items.
TEST(Text, SplitListKeepsEveryEmptyItemAndTheEmptyTextIsNoItems) {
  using V = std::vector<std::string>;
  EXPECT_EQ(split_list("", ','), V{});
  EXPECT_EQ(split_list("a", ','), V{"a"});
  EXPECT_EQ(split_list("0.9,0.999", ','), (V{"0.9", "0.999"}));
  EXPECT_EQ(split_list("a,", ','), (V{"a", ""}));         // trailing separator
  EXPECT_EQ(split_list(",a", ','), (V{"", "a"}));         // leading separator
  EXPECT_EQ(split_list("a,,b", ','), (V{"a", "", "b"}));  // consecutive separators
  EXPECT_EQ(split_list(",", ','), (V{"", ""}));           // a separator alone: two empty items
  EXPECT_EQ(split_list(",,", ','), (V{"", "", ""}));
  EXPECT_EQ(split_list(" a , b ", ','), (V{" a ", " b "}));  // no trimming: the parser decides
  // Only `sep` splits: the synthetic spec's ':' then 'x', --normalize's '/' then ','.
  EXPECT_EQ(split_list("224x224x3:1024:100", ':'), (V{"224x224x3", "1024", "100"}));
  EXPECT_EQ(split_list("224x224x3", 'x'), (V{"224", "224", "3"}));
  EXPECT_EQ(split_list("0.5,0.5/0.25,0.25", '/'), (V{"0.5,0.5", "0.25,0.25"}));
  EXPECT_EQ(split_list("/", '/'), (V{"", ""}));
  // A cpuset file's text may hold any byte: a NUL stays inside its item (read_cpu_list refuses it).
  EXPECT_EQ(split_list(std::string_view("0\0,1", 4), ','), (V{std::string("0\0", 2), "1"}));
  // Joining the items with the separator gives the text back (the empty text from no items).
  for (const char* text : {"", "a", "a,", ",a", "a,,b", ",", "1,2,3"}) {
    std::string joined;
    const V items = split_list(text, ',');
    for (size_t i = 0; i < items.size(); ++i) joined += (i ? "," : "") + items[i];
    EXPECT_EQ(joined, text);
  }
}

// The one number reader (text.h) every flag, list item, DPT_* variable and metadata value is read
// with: decimal only, the whole text, exactly what strtod gives for the same decimal text.
TEST(Text, ReadNumberTakesDecimalOnly) {
  const auto i = [](const char* t) { return read_number<int>(t); };
  EXPECT_EQ(i("0"), 0);
  EXPECT_EQ(i("16"), 16);
  EXPECT_EQ(i("-5"), -5);
  EXPECT_EQ(i("-0"), 0);
  EXPECT_EQ(i("08"), 8);  // leading zeros: decimal, never octal
  EXPECT_EQ(i("2147483647"), 2147483647);
  EXPECT_EQ(i("-2147483648"), -2147483647 - 1);
  EXPECT_EQ(read_number<int64_t>("9223372036854775807"), INT64_MAX);
  EXPECT_EQ(read_number<uint64_t>("18446744073709551615"), UINT64_MAX);
  for (const char* bad :
       {"",    " ",   "0x10",  "0X10",  "0x", "+3",  " 3",  "3 ", "\t3", "3\n", "1.5",
        "1e3", "3,0", "1_000", "1'000", "-",  "--3", "- 3", "3-", "abc", "٣"}) {
    NumberError why = NumberError::kNone;
    EXPECT_EQ(read_number<int>(bad, &why), std::nullopt) << "'" << bad << "'";
    EXPECT_EQ(why, NumberError::kSyntax) << "'" << bad << "'";
  }
  NumberError why = NumberError::kNone;
  for (const char* big : {"2147483648", "-2147483649", "99999999999999999999999"}) {
    EXPECT_EQ(read_number<int>(big, &why), std::nullopt) << big;
    EXPECT_EQ(why, NumberError::kTooLarge) << big;
  }
  EXPECT_EQ(read_number<uint64_t>("18446744073709551616", &why), std::nullopt);
  EXPECT_EQ(why, NumberError::kTooLarge);
  EXPECT_EQ(read_number<uint64_t>("-1", &why), std::nullopt);  // no sign for an unsigned one
  EXPECT_EQ(why, NumberError::kSyntax);
  EXPECT_EQ(number_error_text<int>(NumberError::kTooLarge),
            "is out of range (a whole number from -2147483648 to 2147483647)");
  EXPECT_EQ(number_error_text<int>(NumberError::kSyntax),
            "is not a whole number (decimal digits, '-' before a negative one)");
  EXPECT_EQ(number_error_text<uint64_t>(NumberError::kSyntax),
            "is not a whole number (decimal digits)");

  const auto d = [](const char* t) { return read_number<double>(t); };
  EXPECT_EQ(d("0.1"), 0.1);
  EXPECT_EQ(d("-2.5e-3"), -2.5e-3);
  EXPECT_EQ(d("1E5"), 1e5);
  EXPECT_EQ(d("1e+5"), 1e5);
  EXPECT_EQ(d(".5"), 0.5);
  EXPECT_EQ(d("5."), 5.0);
  EXPECT_EQ(d("-.5"), -0.5);
  EXPECT_EQ(d("00012"), 12.0);
  EXPECT_EQ(d("0.000e-999"), 0.0);  // a zero written so is 0, not too small
  EXPECT_TRUE(std::signbit(*d("-0")));
  EXPECT_EQ(d("1.7976931348623157e308"), std::numeric_limits<double>::max());
  EXPECT_EQ(d("4.9406564584124654e-324"), std::numeric_limits<double>::denorm_min());
  // Bit for bit what strtod reads from the same decimal text (the readers it replaced).
  for (const char* t : {"0.1", "0.9", "0.999", "0.99999999999", "1e-8", "5e-4", "3.4e38", "1.2e-38",
                        "1e-310", "2.2250738585072011e-308", "123456789012345678901234",
                        "0.30000000000000004", "7.5", "1e7", "6.02214076e23"}) {
    const std::optional<double> v = d(t);
    ASSERT_TRUE(v) << t;
    const double want = std::strtod(t, nullptr);
    EXPECT_EQ(std::memcmp(&*v, &want, sizeof want), 0) << t;
  }
  for (const char* bad :
       {"",         " ",   " 0.1", "0.1 ",   "+0.1", "0x10",  "0x1p-1", "0X1P3", "inf", "-inf",
        "infinity", "nan", "-nan", "nan(1)", "NaN",  "INF",   "0,9",    "1e",    "1e+", "e5",
        ".",        "-",   "-.",   "1.2.3",  "0.1x", "1 000", "5s",     "1d",    "1f"}) {
    NumberError why = NumberError::kNone;
    EXPECT_EQ(read_number<double>(bad, &why), std::nullopt) << "'" << bad << "'";
    EXPECT_EQ(why, NumberError::kSyntax) << "'" << bad << "'";
  }
  for (const char* big :
       {"1e400", "-1e309", "1.7976931348623159e308", "99999e305", "1e99999999999999999999"}) {
    EXPECT_EQ(read_number<double>(big, &why), std::nullopt) << big;
    EXPECT_EQ(why, NumberError::kTooLarge) << big;
  }
  for (const char* small : {"1e-400", "-3E-999", "2e-324", "0.0000001e-320", "123456789e-400",
                            "1e-99999999999999999999"}) {
    EXPECT_EQ(read_number<double>(small, &why), std::nullopt) << small;
    EXPECT_EQ(why, NumberError::kTooSmall) << small;
  }
  EXPECT_EQ(number_error_text<double>(NumberError::kSyntax), "is not a number");
  EXPECT_EQ(number_error_text<double>(NumberError::kTooSmall),
            "is not a number a double can hold: it is too small, and would be 0");
  EXPECT_EQ(number_error_text<double>(NumberError::kTooLarge),
            "is not a number a double can hold: it is too large");
}

// Every flag's numbers are read_number's: hex (cxxopts read integers in hex), hex floats (stod,
// strtod), blanks and '+' (operator>>, sscanf) are refused, by name, with the value quoted; the
// decimal values read as before.
TEST(Config, EveryFlagReadsNumbersAsDecimalOnly) {
  struct Case {
    std::vector<std::string> args;
    const char* needle;
  } refused[] = {
      {{"--epochs", "0x10"}, "--epochs: '0x10' is not a whole number"},
      {{"--epochs", "+3"}, "--epochs: '+3' is not a whole number"},
      {{"--epochs", " 3"}, "--epochs: ' 3' is not a whole number"},
      {{"--epochs", "3 "}, "--epochs: '3 ' is not a whole number"},
      {{"--epochs", "1.5"}, "--epochs: '1.5' is not a whole number"},
      {{"--epochs", "99999999999"}, "--epochs must be between 1 and 2147483647, got 99999999999"},
      {{"--batch-size", "0x100"}, "--batch-size: '0x100' is not a whole number"},
      {{"--seed", "0x10"}, "--seed: '0x10' is not a whole number (decimal digits)"},
      {{"--seed", "-1"}, "--seed: '-1' is not a whole number (decimal digits)"},
      {{"--seed", "18446744073709551616"}, "--seed: '18446744073709551616' is out of range"},
      {{"--threads", "0x2"}, "--threads: '0x2' is not a whole number"},
      {{"--keep-checkpoints", "0x1"}, "--keep-checkpoints: '0x1' is not a whole number"},
      {{"--lr", " 0.1"}, "--lr: ' 0.1' is not a number"},
      {{"--lr", "0.1 "}, "--lr: '0.1 ' is not a number"},
      {{"--lr", "+0.1"}, "--lr: '+0.1' is not a number"},
      {{"--lr", "0x1p-3"}, "--lr: '0x1p-3' is not a number"},
      {{"--lr", "nan"}, "--lr: 'nan' is not a number"},
      {{"--lr", "inf"}, "--lr: 'inf' is not a number"},
      {{"--lr", "1e400"}, "--lr: '1e400' is not a number a double can hold: it is too large"},
      {{"--momentum", "0,9"}, "(the decimal separator is '.', whatever the locale)"},
      {{"--timeout", " 5"}, "--timeout: ' 5' is not a number"},
      {{"--betas", "0x0.8,0.9"}, "--betas: '0x0.8,0.9' is not B1,B2"},
      {{"--betas", "0.8, 0.9"}, "--betas: '0.8, 0.9' is not B1,B2"},
      {{"--betas", "+0.8,0.9"}, "--betas: '+0.8,0.9' is not B1,B2"},
      {{"--checkpoint-every", "0x2steps"}, "--checkpoint-every: '0x2steps' is not N, Nepochs"},
      {{"--checkpoint-every", "0x2"}, "--checkpoint-every: '0x2' is not N, Nepochs"},
      {{"--checkpoint-every", " 2"}, "--checkpoint-every: ' 2' is not N, Nepochs"},
      {{"--checkpoint-every", "+2min"}, "--checkpoint-every: '+2min' is not N, Nepochs"},
      {{"--checkpoint-every", "infmin"}, "--checkpoint-every: 'infmin' is not N, Nepochs"},
      {{"--checkpoint-every", "2hours"}, "--checkpoint-every: unknown unit 'hours' in '2hours'"},
      {{"--checkpoint-every", "2147483647"},
       "--checkpoint-every: '2147483647': the number of epochs must be a whole number from 0 to "
       "1000000000"},
      {{"--checkpoint-every", "1000000001steps"},
       "the number of steps must be a whole number from 0 to 1000000000"},
      {{"--checkpoint-every", "2.5"}, "the number of epochs must be a whole number"},
      {{"--trace-steps", " 2:12"}, "--trace-steps: ' 2:12' is not A:B"},
      {{"--trace-steps", "2: 12"}, "--trace-steps: '2: 12' is not A:B"},
      {{"--trace-steps", "0x2:12"}, "--trace-steps: '0x2:12' is not A:B"},
      {{"--trace-steps", "2:12:14"}, "--trace-steps: '2:12:14' is not A:B"},
      {{"--trace-steps", "+2:12"}, "--trace-steps: '+2:12' is not A:B"},
      {{"--normalize", "0x1p-1/0.5"}, "--normalize '0x1p-1/0.5': mean '0x1p-1' is not a number"},
      {{"--augment", "crop=0x2"}, "--augment 'crop=0x2': crop=0x2 is not a padding"},
      {{"--augment", "crop=+2"}, "--augment 'crop=+2': crop=+2 is not a padding"},
  };
  for (const auto& c : refused) {
    std::string msg;
    EXPECT_EQ(input_error_of(c.args, &msg), 2) << c.args[0] << " '" << c.args[1] << "': " << msg;
    EXPECT_NE(msg.find(c.needle), std::string::npos) << msg;
  }
  // --data synthetic:HxWxC:N:K, read at the pre-flight.
  for (const char* spec : {"synthetic:16x16x1:+64:10", "synthetic:16x16x1: 64:10",
                           "synthetic:0x10x16x1:64:10", "synthetic:16x16x1:64:0xa"}) {
    try {
      (void)synthetic_size(spec);
      ADD_FAILURE() << spec << " was read";
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), 2) << e.what();
      EXPECT_NE(std::string(e.what()).find(std::string("--data ") + spec), std::string::npos)
          << e.what();
    }
  }
  const DataSize synthetic = synthetic_size("synthetic:16x16x1:064:10");
  EXPECT_EQ(synthetic.bytes, (64u + 7u) * (16u * 16u + 2u));  // 7 = ceil(64 / 10) test images
  EXPECT_EQ(synthetic.image_shape, (std::vector<int64_t>{16, 16, 1}));
  EXPECT_EQ(synthetic.test_n, 7);
  EXPECT_EQ(synthetic.classes, 10);
  // The decimal forms read as before, to the same values.
  const TrainConfig a = parse({"--epochs",
                               "016",
                               "--seed",
                               "18446744073709551615",
                               "--lr",
                               "1e-1",
                               "--momentum",
                               ".85",
                               "--betas",
                               "0.85,1e-1",
                               "--checkpoint-every",
                               "2.0steps",
                               "--trace-steps",
                               "3:15",
                               "--timeout",
                               "2.5e1",
                               "--step-epochs",
                               "-1,5",
                               "--normalize",
                               "0.5/.25"});
  EXPECT_EQ(a.epochs, 16);
  EXPECT_EQ(a.seed, UINT64_MAX);
  EXPECT_EQ(a.lr, 0.1);
  EXPECT_EQ(a.momentum, 0.85);
  EXPECT_EQ(a.betas, (std::vector<double>{0.85, 0.1}));
  EXPECT_EQ(a.checkpoint_every_steps, 2);
  EXPECT_EQ(a.trace_begin, 3);
  EXPECT_EQ(a.trace_end, 15);
  EXPECT_EQ(a.timeout, 25.0);
  EXPECT_EQ(a.step_epochs, (std::vector<int>{-1, 5}));  // validate_config refuses -1, by name
  EXPECT_EQ(parse({"--checkpoint-every", "1.5min"}).checkpoint_every_minutes, 1.5);
  EXPECT_EQ(parse({"--checkpoint-every", "3"}).checkpoint_every, 3);
  // A list flag given twice appends, as cxxopts' lists did; a scalar's last value wins.
  EXPECT_EQ(parse({"--step-epochs", "2", "--step-epochs", "5,8"}).step_epochs,
            (std::vector<int>{2, 5, 8}));
  EXPECT_EQ(parse({"--epochs", "2", "--epochs", "3"}).epochs, 3);
  // Every default reads back as itself.
  const TrainConfig d = parse({});
  const TrainConfig fresh;
  EXPECT_EQ(d.epochs, fresh.epochs);
  EXPECT_EQ(d.eps, fresh.eps);
  EXPECT_EQ(d.step_gamma, fresh.step_gamma);
  EXPECT_EQ(d.timeout, fresh.timeout);
  EXPECT_EQ(d.seed, fresh.seed);
  EXPECT_EQ(d.betas, fresh.betas);
  EXPECT_EQ(d.trace_begin, fresh.trace_begin);
  EXPECT_EQ(d.trace_end, fresh.trace_end);
}

// --- The flag table (flags.h) against today's configuration: every key, every agreed name. ---

// TrainConfig's JSON as checkpoints record it: every key with its value and its type (an integer
// 0 is "0", a double 0 "0.0"), sorted. Old checkpoints resume against it, so it must not drift.
TEST(Flags, DefaultJsonKeepsEveryKeyAndType) {
  EXPECT_EQ(
      parse({}).to_json(),
      "{\"accum_steps\":1,\"activation_dtype\":\"auto\",\"allow_config_change\":false,"
      "\"augment\":\"none\",\"batch_size\":256,\"betas\":[0.9,0.999],\"bucket_mb\":25.0,"
      "\"checkpoint_every\":0,\"checkpoint_every_minutes\":0.0,\"checkpoint_every_steps\":0,"
      "\"checkpoint_path\":\"checkpoint.safetensors\",\"clip_grad_norm\":0.0,"
      "\"cuda_graphs\":true,\"cudnn_nondeterministic\":false,\"data\":\"/usr/share/datasets/"
      "fashion-mnist\","
      "\"data_format\":\"auto\",\"device\":\"auto\",\"epochs\":10,\"eps\":1e-08,"
      "\"eval_batch_size\":1000,\"eval_every\":1,\"grad_dtype\":\"fp32\","
      "\"init\":\"kaiming\",\"init_from\":\"\",\"keep_checkpoints\":0,\"label_smoothing\":0.0,"
      "\"last_bucket_mb\":0.0,\"load\":\"\",\"log_level\":\"info\",\"lr\":0.05,\"max_steps\":0,"
      "\"metrics\":\"\",\"metrics_every\":0,\"model\":\"lenet\",\"momentum\":0.9,"
      "\"nesterov\":false,\"no_decay_bn_bias\":false,\"nonfinite\":\"stop\","
      "\"nonfinite_max_skips\":10,\"normalize\":\"none\",\"optimizer\":\"sgd\","
      "\"output\":\"\",\"overlap\":true,\"precision\":\"fp32\",\"progress\":\"auto\","
      "\"quiet\":false,\"recipe\":\"default\",\"report\":\"\",\"resume\":\"\",\"save\":\"\","
      "\"scale_lr\":false,\"schedule\":\"cosine\",\"seed\":42,\"stem\":\"auto\","
      "\"step_epochs\":[],\"step_gamma\":0.1,\"sync_bn\":false,\"tf32\":false,\"threads\":1,"
      "\"timeout\":300.0,\"top_k\":5,\"trace\":\"\",\"trace_steps\":\"2:12\",\"verify_every\":0,"
      "\"warmup_epochs\":1.0,\"weight_decay\":0.0005,\"zero_init_residual\":false}");
}

TEST(Flags, EveryJsonKeyHasExactlyOneEntry) {
  const auto j = nlohmann::json::parse(TrainConfig().to_json());
  std::map<std::string, int> entries;
  std::set<std::string> names;
  for (const Flag& f : flags()) {
    EXPECT_TRUE(names.insert(f.name).second) << "--" << f.name << " twice";
    EXPECT_FALSE(f.json.empty()) << f.name;
    for (const JsonValue& v : f.json) ++entries[v.key];
  }
  for (auto it = j.begin(); it != j.end(); ++it) EXPECT_EQ(entries[it.key()], 1) << it.key();
  EXPECT_EQ(entries.size(), j.size());  // no entry writes a key to_json lacks
}

// The agreed names of today's resume check and rank agreement, spelled out: the table must give
// exactly these, each once.
TEST(Flags, AgreedNamesAndResumeClassesAreToday) {
  const std::set<std::string> fixed = {"--model",
                                       "--recipe",
                                       "--epochs",
                                       "--batch-size",
                                       "--optimizer",
                                       "--lr",
                                       "--momentum",
                                       "--nesterov",
                                       "--weight-decay",
                                       "--no-decay-bn-bias",
                                       "--betas",
                                       "--eps",
                                       "--label-smoothing",
                                       "--schedule",
                                       "--warmup-epochs",
                                       "--step-epochs",
                                       "--step-gamma",
                                       "--init",
                                       "--seed",
                                       "--tf32",
                                       "--precision",
                                       "--activation-dtype",
                                       "--max-steps",
                                       "--grad-dtype",
                                       "--accum-steps",
                                       "--sync-bn",
                                       "--scale-lr",
                                       "--clip-grad-norm",
                                       "--data-format",
                                       "--normalize",
                                       "--augment",
                                       "--stem",
                                       "--zero-init-residual"};
  const std::set<std::string> resumable = {"--eval-batch-size",
                                           "--eval-every",
                                           "--checkpoint-every",
                                           "--checkpoint-every-steps",
                                           "--checkpoint-every-minutes",
                                           "--verify-every",
                                           "--metrics-every",
                                           "--trace-steps",
                                           "--no-cuda-graphs",
                                           "--bucket-mb",
                                           "--last-bucket-mb",
                                           "--nonfinite",
                                           "--nonfinite-max-skips",
                                           "--device",
                                           "--cudnn-nondeterministic",
                                           "--top-k"};
  const std::set<std::string> given = {"--init-from", "--resume", "--save", "--trace"};
  std::map<std::string, std::string> seen;
  for (const auto& [flag, value] : agreed_values(parse({}))) {
    EXPECT_TRUE(seen.emplace(flag, value).second) << flag << " twice";
    EXPECT_EQ(may_change_on_resume(flag), !fixed.count(flag)) << flag;
  }
  EXPECT_EQ(seen.size(), fixed.size() + resumable.size() + given.size());
  for (const auto* names : {&fixed, &resumable, &given})
    for (const std::string& flag : *names) EXPECT_TRUE(seen.count(flag)) << flag;
  for (const std::string& flag : given) EXPECT_EQ(seen[flag], "(not given)") << flag;
  EXPECT_EQ(seen["--no-cuda-graphs"], "true");  // the JSON key cuda_graphs, under its flag
  for (const char* free : {"--threads", "--timeout", "--data", "--log-level", "--no-overlap"})
    EXPECT_FALSE(may_change_on_resume(free) || seen.count(free)) << free;

  // A checkpoint's JSON: the same names but the "given" ones; a key it lacks is "(not
  // recorded)", one it has is its JSON text.
  const auto old = agreed_values(std::string("{\"lr\":0.2,\"cuda_graphs\":false}"));
  EXPECT_EQ(old.size(), fixed.size() + resumable.size());
  for (const auto& [flag, value] : old)
    EXPECT_EQ(value, flag == "--lr"               ? "0.2"
                     : flag == "--no-cuda-graphs" ? "false"
                                                  : "(not recorded)")
        << flag;
  EXPECT_ANY_THROW(agreed_values(std::string("{not json")));
}

// A value other than the default for every flag of the table: the argv that gives it and the
// JSON values it must show. A flag added to the table without a line here fails the test.
struct Sample {
  std::vector<std::string> args;
  std::map<std::string, nlohmann::json> json;
};

std::map<std::string, Sample> samples() {
  using J = nlohmann::json;
  return {
      {"model", {{"--model", "resnet18"}, {{"model", "resnet18"}}}},
      {"stem", {{"--stem", "cifar"}, {{"stem", "cifar"}}}},
      {"zero-init-residual", {{"--zero-init-residual"}, {{"zero_init_residual", true}}}},
      {"recipe", {{"--recipe", "d2l"}, {{"recipe", "d2l"}}}},
      {"epochs", {{"--epochs", "7"}, {{"epochs", 7}}}},
      {"batch-size", {{"--batch-size", "96"}, {{"batch_size", 96}}}},
      {"optimizer", {{"--optimizer", "adamw"}, {{"optimizer", "adamw"}}}},
      {"lr", {{"--lr", "0.3"}, {{"lr", 0.3}}}},
      {"momentum", {{"--momentum", "0.5"}, {{"momentum", 0.5}}}},
      {"nesterov", {{"--nesterov"}, {{"nesterov", true}}}},
      {"weight-decay", {{"--weight-decay", "0.001"}, {{"weight_decay", 0.001}}}},
      {"no-decay-bn-bias", {{"--no-decay-bn-bias"}, {{"no_decay_bn_bias", true}}}},
      {"betas", {{"--betas", "0.8,0.95"}, {{"betas", J::array({0.8, 0.95})}}}},
      {"eps", {{"--eps", "1e-6"}, {{"eps", 1e-6}}}},
      {"label-smoothing", {{"--label-smoothing", "0.1"}, {{"label_smoothing", 0.1}}}},
      {"schedule", {{"--schedule", "step"}, {{"schedule", "step"}}}},
      {"warmup-epochs", {{"--warmup-epochs", "2.5"}, {{"warmup_epochs", 2.5}}}},
      {"step-epochs", {{"--step-epochs", "3,5"}, {{"step_epochs", J::array({3, 5})}}}},
      {"step-gamma", {{"--step-gamma", "0.5"}, {{"step_gamma", 0.5}}}},
      {"init", {{"--init", "d2l"}, {{"init", "d2l"}}}},
      {"seed", {{"--seed", "7"}, {{"seed", 7}}}},
      {"scale-lr", {{"--scale-lr"}, {{"scale_lr", true}}}},
      {"data", {{"--data", "/tmp/x"}, {{"data", "/tmp/x"}}}},
      {"data-format", {{"--data-format", "npy"}, {{"data_format", "npy"}}}},
      {"normalize", {{"--normalize", "auto"}, {{"normalize", "auto"}}}},
      {"augment", {{"--augment", "flip"}, {{"augment", "flip"}}}},
      {"device", {{"--device", "cpu"}, {{"device", "cpu"}}}},
      {"tf32", {{"--tf32"}, {{"tf32", true}}}},
      {"cudnn-nondeterministic",
       {{"--cudnn-nondeterministic"}, {{"cudnn_nondeterministic", true}}}},
      {"precision", {{"--precision", "bf16"}, {{"precision", "bf16"}}}},
      {"activation-dtype", {{"--activation-dtype", "bf16"}, {{"activation_dtype", "bf16"}}}},
      {"no-cuda-graphs", {{"--no-cuda-graphs"}, {{"cuda_graphs", false}}}},
      {"threads", {{"--threads", "3"}, {{"threads", 3}}}},
      {"max-steps", {{"--max-steps", "5"}, {{"max_steps", 5}}}},
      {"eval-batch-size", {{"--eval-batch-size", "100"}, {{"eval_batch_size", 100}}}},
      {"eval-every", {{"--eval-every", "2"}, {{"eval_every", 2}}}},
      {"bucket-mb", {{"--bucket-mb", "12.5"}, {{"bucket_mb", 12.5}}}},
      {"last-bucket-mb", {{"--last-bucket-mb", "1.5"}, {{"last_bucket_mb", 1.5}}}},
      {"no-overlap", {{"--no-overlap"}, {{"overlap", false}}}},
      {"grad-dtype", {{"--grad-dtype", "bf16"}, {{"grad_dtype", "bf16"}}}},
      {"accum-steps", {{"--accum-steps", "2"}, {{"accum_steps", 2}}}},
      {"sync-bn", {{"--sync-bn"}, {{"sync_bn", true}}}},
      {"clip-grad-norm", {{"--clip-grad-norm", "1.5"}, {{"clip_grad_norm", 1.5}}}},
      {"nonfinite", {{"--nonfinite", "skip"}, {{"nonfinite", "skip"}}}},
      {"nonfinite-max-skips", {{"--nonfinite-max-skips", "3"}, {{"nonfinite_max_skips", 3}}}},
      {"verify-every", {{"--verify-every", "10"}, {{"verify_every", 10}}}},
      {"timeout", {{"--timeout", "60.5"}, {{"timeout", 60.5}}}},
      {"metrics", {{"--metrics", "m.jsonl"}, {{"metrics", "m.jsonl"}}}},
      {"save", {{"--save", "s.st"}, {{"save", "s.st"}}}},
      {"checkpoint-every",
       {{"--checkpoint-every", "5steps"},
        {{"checkpoint_every", 0}, {"checkpoint_every_steps", 5}, {"checkpoint_every_minutes", 0}}}},
      {"keep-checkpoints", {{"--keep-checkpoints", "2"}, {{"keep_checkpoints", 2}}}},
      {"checkpoint-path", {{"--checkpoint-path", "c.st"}, {{"checkpoint_path", "c.st"}}}},
      {"resume", {{"--resume", "r.st"}, {{"resume", "r.st"}}}},
      {"init-from", {{"--init-from", "i.st"}, {{"init_from", "i.st"}}}},
      {"load", {{"evaluate", "--load", "l.st"}, {{"load", "l.st"}}}},
      {"output", {{"predict", "--output", "p.csv"}, {{"output", "p.csv"}}}},
      {"top-k", {{"predict", "--top-k", "3"}, {{"top_k", 3}}}},
      {"allow-config-change", {{"--allow-config-change"}, {{"allow_config_change", true}}}},
      {"metrics-every", {{"--metrics-every", "4"}, {{"metrics_every", 4}}}},
      {"report", {{"--report", "r.svg"}, {{"report", "r.svg"}}}},
      {"trace", {{"--trace", "t.json"}, {{"trace", "t.json"}}}},
      {"trace-steps", {{"--trace-steps", "3:9"}, {{"trace_steps", "3:9"}}}},
      {"log-level", {{"--log-level", "debug"}, {{"log_level", "debug"}}}},
      {"quiet", {{"--quiet"}, {{"quiet", true}}}},
      {"progress", {{"--progress", "off"}, {{"progress", "off"}}}},
  };
}

// Each flag given alone: to_json shows its value, under both recipes (an explicit value wins
// over the recipe's); agreed_values changes under the flag's own names, and under no other but
// the recipe's flags (which --model and --recipe move); a free flag changes none.
TEST(Flags, EveryFlagRoundTripsAndMovesOnlyItsAgreedValues) {
  const auto all = samples();
  std::set<std::string> recipe_names;
  for (const Flag& f : flags())
    if (f.from == Default::kRecipe) recipe_names.insert("--" + f.name);
  const auto base = agreed_values(parse({}));
  for (const Flag& f : flags()) {
    SCOPED_TRACE("--" + f.name);
    ASSERT_TRUE(all.count(f.name));
    const Sample& s = all.at(f.name);
    for (const bool d2l : {false, true}) {
      if (d2l && !(f.commands & kCommandTrain)) continue;  // --recipe is training's
      auto args = s.args;
      if (d2l && f.name != "recipe") args.insert(args.end(), {"--recipe", "d2l"});
      const auto j = nlohmann::json::parse(parse(args).to_json());
      for (const auto& [key, value] : s.json) EXPECT_EQ(j.at(key), value) << key;
    }
    std::set<std::string> own;
    for (const JsonValue& v : f.json) own.insert(v.agreed_as);
    if (f.agreement == Agreement::kGiven) own = {"--" + f.name};
    const auto now = agreed_values(parse(s.args));
    ASSERT_EQ(now.size(), base.size());
    bool moved = false;
    for (size_t i = 0; i < now.size(); ++i) {
      ASSERT_EQ(now[i].first, base[i].first);
      if (now[i].second == base[i].second) continue;
      moved |= own.count(now[i].first) > 0;
      EXPECT_TRUE(own.count(now[i].first) || recipe_names.count(now[i].first)) << now[i].first;
    }
    EXPECT_EQ(moved, f.agreement != Agreement::kFree);
  }
  // --checkpoint-every's other units, each in its own field.
  const auto epochs = nlohmann::json::parse(parse({"--checkpoint-every", "3"}).to_json());
  EXPECT_EQ(epochs.at("checkpoint_every"), 3);
  const auto minutes = nlohmann::json::parse(parse({"--checkpoint-every", "1.5min"}).to_json());
  EXPECT_EQ(minutes.at("checkpoint_every_minutes"), 1.5);
  EXPECT_EQ(minutes.at("checkpoint_every"), 0);
}

TEST(Flags, HelpListsEveryFlagInItsGroup) {
  for (const Flag& f : flags()) {
    const std::string help = help_text(command_of(f));
    // Its line (a flag is also named in other flags' help, never at a line's start).
    const size_t group = help.find(" " + f.group + " options:"),
                 at = help.find("\n      --" + f.name + " ");
    ASSERT_NE(at, std::string::npos) << f.name;
    ASSERT_NE(group, std::string::npos) << f.group;
    // Its group's heading is the last one above it.
    EXPECT_EQ(help.rfind(" options:", at), group + f.group.size() + 1) << f.name;
  }
  // Each model with its description, wherever the help's line wrapping put the space.
  const std::string help = help_text();
  std::string flat;
  for (const char ch : help)
    if (!(std::isspace(static_cast<unsigned char>(ch)) && !flat.empty() && flat.back() == ' '))
      flat += std::isspace(static_cast<unsigned char>(ch)) ? ' ' : ch;
  for (const ModelSpec& m : models())
    EXPECT_NE(flat.find(m.name + " ("), std::string::npos) << m.name;
}

// Each command's --help lists exactly the flags the table gives it; a flag of another command is
// refused naming it and the command.
TEST(Flags, EachCommandTakesItsOwnFlags) {
  for (const std::string command : {"", "train", "evaluate", "predict"}) {
    SCOPED_TRACE(command);
    const std::string help = help_text(command);
    const unsigned bit = command.empty() ? kCommandTrain : command_bit(command);
    for (const Flag& f : flags()) {
      const bool listed = help.find("\n      --" + f.name + " ") != std::string::npos;
      EXPECT_EQ(listed, (f.commands & bit) != 0) << f.name;
      if (f.commands & bit) continue;
      std::vector<std::string> args{"--" + f.name};
      if (!command.empty()) args.insert(args.begin(), command);
      std::string msg;
      EXPECT_EQ(input_error_of(args, &msg), 2) << f.name;
      EXPECT_NE(msg.find("--" + f.name + " is not a flag of dptrain"), std::string::npos) << msg;
    }
  }
  std::string msg;
  EXPECT_EQ(input_error_of({"score", "--load", "m.st"}, &msg), 2);
  EXPECT_NE(msg.find("unknown command 'score'"), std::string::npos) << msg;
  EXPECT_EQ(parse({"evaluate", "--load", "m.st"}).command, "evaluate");
  EXPECT_EQ(parse({"train"}).command, "train");
  EXPECT_EQ(parse({}).command, "train");
  EXPECT_EQ(input_error_of({"evaluate"}, &msg), 2);
  EXPECT_NE(msg.find("needs --load"), std::string::npos) << msg;
  EXPECT_EQ(input_error_of({"predict", "--load", "m.st"}, &msg), 2);
  EXPECT_NE(msg.find("needs --output"), std::string::npos) << msg;
  EXPECT_EQ(input_error_of({"predict", "--load", "m.st", "--output", "p", "--top-k", "0"}, &msg),
            2);
  EXPECT_NE(msg.find("--top-k must be between 1 and 2147483647, got 0"), std::string::npos) << msg;
  EXPECT_EQ(
      input_error_of({"predict", "--load", "m.st", "--output", "p", "--top-k", "3000000000"}, &msg),
      2);
  EXPECT_NE(msg.find("--top-k must be between 1 and 2147483647, got 3000000000"), std::string::npos)
      << msg;
  // Evaluation takes no training batch: any world size.
  EXPECT_EQ(input_error_of({"evaluate", "--load", "m.st"}, &msg, 3), 0) << msg;
  EXPECT_EQ(input_error_of({"--init-from", "a.st", "--resume", "b.st"}, &msg), 2);
  EXPECT_NE(msg.find("--init-from and --resume exclude each other"), std::string::npos) << msg;
}

// Every path flag's value is checked for being empty (an unset variable) and for UTF-8 (paths go
// into JSON), each error naming the flag.
TEST(Flags, EmptyOrNonUtf8PathsAreRefusedNamingTheFlag) {
  std::set<std::string> checked;
  for (const Flag& f : flags()) {
    if (!f.path) continue;
    for (const auto& [value, says] :
         {std::pair<std::string, std::string>{"", ": empty path (an unset variable?)"},
          {"p\xff.x", " p\\xff.x: the path is not valid UTF-8"}}) {
      std::string msg;
      std::vector<std::string> args{"--" + f.name, value};
      if (!command_of(f).empty()) args.insert(args.begin(), command_of(f));
      EXPECT_EQ(input_error_of(args, &msg), 2) << f.name;
      EXPECT_NE(msg.find("--" + f.name + says), std::string::npos) << msg;
    }
    checked.insert(f.name);
  }
  EXPECT_EQ(checked, (std::set<std::string>{"data", "metrics", "save", "checkpoint-path", "resume",
                                            "init-from", "load", "output", "report", "trace"}));
}

// --- The model table (models.h). ---

TEST(Models, EveryEntryBuildsWithItsHeadAndShapes) {
  std::set<std::string> names;
  for (const ModelSpec& spec : models()) {
    SCOPED_TRACE(spec.name);
    names.insert(spec.name);
    EXPECT_FALSE(spec.description.empty());
    EXPECT_EQ(model_input_problem(spec.name, {28, 28, 1}), "");
    EXPECT_NE(model_input_problem(spec.name, {0, 28, 1}), "");
    auto m = make_model(spec.name, 7, cpu_backend(), {28, 28, 1});
    EXPECT_EQ(m->name(), spec.name);
    // The head maps to the classes: 7 outputs, the last parameters registered.
    const Param* w = m->store().find(spec.head + ".weight");
    const Param* b = m->store().find(spec.head + ".bias");
    ASSERT_TRUE(w && b);
    EXPECT_EQ(w->shape.front(), 7);
    EXPECT_EQ(b->shape, Shape{7});
    const Param* last = nullptr;
    for (const Param& p : m->store().entries())
      if (!p.is_buffer) last = &p;
    EXPECT_EQ(last, b);
  }
  EXPECT_EQ(names,
            (std::set<std::string>{"lenet", "resnet18", "resnet18-tv", "resnet34", "resnet50"}));
  EXPECT_EQ(model_names(), "lenet|resnet18|resnet18-tv|resnet34|resnet50");
  // LeNet's two unpadded convolutions and poolings need 14x14; ResNet-18 takes any size.
  EXPECT_EQ(model_input_problem("lenet", {14, 14, 1}), "");
  EXPECT_NE(model_input_problem("lenet", {13, 28, 1}), "");
  EXPECT_EQ(model_input_problem("resnet18", {1, 1, 3}), "");
  EXPECT_ANY_THROW(make_model("lenet", 10, cpu_backend(), {8, 8, 1}));
}

TEST(Models, RecipeRatesComeFromTheTable) {
  for (const ModelSpec& spec : models()) {
    EXPECT_DOUBLE_EQ(parse({"--model", spec.name}).lr, spec.lr.default_recipe) << spec.name;
    EXPECT_DOUBLE_EQ(parse({"--model", spec.name, "--recipe", "d2l"}).lr, spec.lr.d2l) << spec.name;
  }
  EXPECT_DOUBLE_EQ(model_spec("lenet").lr.default_recipe, 0.05);
  EXPECT_DOUBLE_EQ(model_spec("lenet").lr.d2l, 0.2);
  EXPECT_DOUBLE_EQ(model_spec("resnet18").lr.default_recipe, 0.1);
  EXPECT_DOUBLE_EQ(model_spec("resnet18").lr.d2l, 0.1);
  EXPECT_EQ(model_spec("lenet").head, "fc2");
  EXPECT_EQ(model_spec("resnet18").head, "fc");
  const std::string help = recipe_help();
  EXPECT_NE(help.find("default (He init"), std::string::npos) << help;
  EXPECT_NE(help.find("lr 0.05 lenet, 0.1 resnet18, 0.1 resnet18-tv, 0.1 resnet34, 0.1 resnet50)"),
            std::string::npos)
      << help;
  EXPECT_NE(help.find("lr 0.2 lenet, 0.1 resnet18, 0.1 resnet18-tv, 0.1 resnet34, 0.1 resnet50)"),
            std::string::npos)
      << help;
}

TEST(Models, AnUnknownModelIsRefusedNamingTheList) {
  const std::string want =
      "--model: unknown model 'vgg' (lenet|resnet18|resnet18-tv|resnet34|resnet50)";
  std::string msg;
  EXPECT_EQ(input_error_of({"--model", "vgg"}, &msg), 2);
  EXPECT_NE(msg.find(want), std::string::npos) << msg;
  try {
    make_model("vgg");
    ADD_FAILURE() << "vgg was built";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
  TrainConfig c;
  c.model = "vgg";
  try {
    validate_config(c, 1);
    ADD_FAILURE() << "vgg was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
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
  // At the end cos(pi): 0, and it stays there past it (not climbing back up the cosine).
  EXPECT_NEAR(learning_rate(c, 40, spe), 0.0, 1e-12);
  EXPECT_NEAR(learning_rate(c, 50, spe), 0.0, 1e-12);
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

// A warm-up of a fractional number of steps (--warmup-epochs 0.3 at 4 steps an epoch: 1.2 steps)
// rises to the peak and no further: its last step took (s + 1) / 1.2 = 1.67 times the peak, and a
// 2.9-epoch warm-up at 3 steps an epoch ended 1.03 times above it. A whole number of steps keeps
// the ramp's values to the bit.
TEST(Schedule, AFractionalWarmupNeverPassesThePeak) {
  for (const char* schedule : {"constant", "cosine", "step"}) {
    for (const double w : {0.3, 0.5, 1.1, 2.9}) {
      for (const int64_t spe : {1, 3, 4, 7}) {
        TrainConfig c;
        c.lr = 0.1;
        c.epochs = 3;
        c.warmup_epochs = w;
        c.schedule = schedule;
        if (c.schedule == "step") c.step_epochs = {2};
        const std::string at = std::string(schedule) + ", --warmup-epochs " + std::to_string(w) +
                               ", " + std::to_string(spe) + " steps an epoch, step ";
        double before = 0;
        for (int64_t s = 0; s < c.epochs * spe; ++s) {
          const double lr = learning_rate(c, s, spe);
          EXPECT_LE(lr, c.lr) << at << s;
          if (static_cast<double>(s) / static_cast<double>(spe) < w) {
            EXPECT_GE(lr, before) << at << s << ": the ramp falls";
            before = lr;
          }
        }
        // The ramp ends on the peak itself.
        EXPECT_EQ(before, c.lr) << at << "(end of the ramp)";
      }
    }
  }
  TrainConfig c;
  c.lr = 0.3;
  c.epochs = 4;
  c.warmup_epochs = 2;
  for (int64_t s = 0; s < 20; ++s)
    EXPECT_EQ(learning_rate(c, s, 10), c.lr * static_cast<double>(s + 1) / 20.0) << "step " << s;
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

TEST(Sampler, ShardsPartitionEachGlobalBatchAndEpochsAndSeedsDiffer) {
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
    EXPECT_GE(*seen.begin(), 0);                                // and every one an image's
    EXPECT_LT(*seen.rbegin(), n);
  }
  ShardedSampler a(n, B, 0, 1, 7);
  std::vector<int64_t> e0(a.local_indices(0), a.local_indices(0) + B);
  a.set_epoch(1);
  EXPECT_NE(e0, std::vector<int64_t>(a.local_indices(0), a.local_indices(0) + B));
  a.set_epoch(0);
  EXPECT_EQ(e0, std::vector<int64_t>(a.local_indices(0), a.local_indices(0) + B));
  // The order follows --seed: another seed, another first batch (of 96 drawn from 1000).
  ShardedSampler other(n, B, 0, 1, 8);
  EXPECT_NE(e0, std::vector<int64_t>(other.local_indices(0), other.local_indices(0) + B));
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
