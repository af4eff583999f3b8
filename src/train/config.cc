// Recipes and validation of TrainConfig (the flags themselves: flags.cc). A recipe sets the
// defaults of the optimisation flags; a flag given explicitly always wins.
#include "dpt/config.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dpt/augment.h"
#include "dpt/dataset.h"
#include "dpt/error.h"
#include "dpt/files.h"
#include "dpt/flags.h"
#include "dpt/log.h"
#include "dpt/models.h"
#include "dpt/poll.h"
#include "dpt/reducer.h"
#include "dpt/text.h"

namespace dpt {

void parse_checkpoint_every(const std::string& v, TrainConfig* c) {
  // A number (read_number's, text.h), then an optional unit, the letters it ends with: epochs
  // (the default), steps or minutes. (std::stod read the number before: "0x2steps" was 2 steps.)
  size_t split = v.size();
  while (split > 0 && ((v[split - 1] >= 'a' && v[split - 1] <= 'z') ||
                       (v[split - 1] >= 'A' && v[split - 1] <= 'Z')))
    --split;
  const std::string unit = v.substr(split);
  const std::optional<double> read = read_number<double>(std::string_view(v).substr(0, split));
  DPT_INPUT_CHECK(read && *read >= 0, "--checkpoint-every: '"
                                          << printable(v)
                                          << "' is not N, Nepochs, Nsteps or Nmin with N >= 0");
  const double n = *read;
  c->checkpoint_every = 0, c->checkpoint_every_steps = 0, c->checkpoint_every_minutes = 0;
  if (unit.empty() || unit == "epoch" || unit == "epochs" || unit == "steps" || unit == "step") {
    // The bound is said: '2147483647' was refused as "a whole number of epochs", which it is.
    DPT_INPUT_CHECK(n == std::floor(n) && n <= 1e9,
                    "--checkpoint-every: '" << printable(v) << "': the number of "
                                            << (unit.rfind("step", 0) == 0 ? "steps" : "epochs")
                                            << " must be a whole number from 0 to 1000000000");
    if (unit.rfind("step", 0) == 0)
      c->checkpoint_every_steps = static_cast<int64_t>(n);
    else
      c->checkpoint_every = static_cast<int>(n);
  } else if (unit == "min" || unit == "minutes") {
    c->checkpoint_every_minutes = n;
  } else {
    throw Error(ErrorKind::kInput, DPT_MSG("--checkpoint-every: unknown unit '"
                                           << unit << "' in '" << v << "' (epochs, steps or min)"));
  }
}

namespace {

// A recipe's settings; the learning rate is the model's (models.h), all else the same for every
// model.
struct Recipe {
  const char* name;
  const char* summary;  // --help's words for the settings below
  double RecipeRates::*lr;
  const char* init;
  double momentum, weight_decay;
  const char* schedule;
  double warmup_epochs;
};

const Recipe kRecipes[] = {
    // He init + SGD momentum 0.9, weight decay 5e-4, one warm-up epoch, cosine decay to 0.
    {"default", "He init, momentum 0.9, wd 5e-4, warm-up 1 epoch, cosine",
     &RecipeRates::default_recipe, "kaiming", 0.9, 5e-4, "cosine", 1},
    // The seed chapter exactly: N(0, 0.01) weights, zero biases, plain SGD, constant rate.
    {"d2l", "the seed: N(0,0.01) init, plain SGD, constant rate", &RecipeRates::d2l, "d2l", 0, 0,
     "constant", 0},
};

}  // namespace

std::string recipe_help() {
  std::ostringstream os;
  for (const Recipe& r : kRecipes) {
    os << (&r == kRecipes ? "" : " | ") << r.name << " (" << r.summary << "; lr";
    for (const ModelSpec& m : models())
      os << (&m == &models().front() ? " " : ", ") << m.lr.*r.lr << " " << m.name;
    os << ")";
  }
  return os.str();
}

void apply_recipe(TrainConfig* c) {
  const ModelSpec& model = model_spec(c->model);
  std::string names;
  for (const Recipe& r : kRecipes) {
    names += names.empty() ? r.name : std::string("|") + r.name;
    if (c->recipe != r.name) continue;
    c->init = r.init;
    c->lr = model.lr.*r.lr;
    c->momentum = r.momentum;
    c->weight_decay = r.weight_decay;
    if (c->optimizer == "adamw") {
      // The recipes' rates are SGD's: AdamW takes torch.optim.AdamW's defaults, and has no
      // momentum of SGD's kind (its moments are --betas).
      c->lr = kAdamWDefaultLr;
      c->weight_decay = kAdamWDefaultWeightDecay;
      c->momentum = 0;
    }
    c->schedule = r.schedule;
    c->warmup_epochs = r.warmup_epochs;
    return;
  }
  throw Error(ErrorKind::kInput, "--recipe: unknown recipe '" + c->recipe + "' (" + names + ")");
}

void validate_config(const TrainConfig& c, int world) {
  if (c.command != "train") {
    // evaluate and predict: a saved model on the data's test split (src/train/infer.cc).
    DPT_INPUT_CHECK(!c.load.empty(), "dptrain " << c.command << " needs --load FILE (a --save)");
    DPT_INPUT_CHECK(c.command != "predict" || !c.output.empty(),
                    "dptrain predict needs --output FILE (the CSV it writes)");
    DPT_INPUT_CHECK(c.output.empty() || c.metrics.empty() || !same_file(c.output, c.metrics),
                    "--output " << c.output << " is the --metrics file: choose another file");
  }
  DPT_INPUT_CHECK(c.init_from.empty() || c.resume.empty(),
                  "--init-from and --resume exclude each other: --resume continues a training "
                  "(its optimizer and position), --init-from starts a new one from saved weights");
  // A --save file (parameters only) written over a training checkpoint would end every later
  // resume.
  DPT_INPUT_CHECK(
      c.save.empty() || !c.checkpoints() || !same_file(c.save, c.checkpoint_path),
      "--save " << c.save
                << " names the training checkpoint (--checkpoint-path): choose another file");
  DPT_INPUT_CHECK(
      c.save.empty() || c.resume.empty() || !same_file(c.save, c.resume),
      "--save " << c.save << " names the checkpoint being resumed (--resume): choose another file");
  (void)model_spec(c.model);  // names the flag and the models when it is none of them
  check_model_options(c.model, {c.stem, c.zero_init_residual});
  // Every integer flag's range, from its entry in the flag table (--epochs, --batch-size, --top-k,
  // ...), worded as the parser words a value past the field's type.
  check_flag_ranges(c);
  // 0 is accepted, as torch.optim.SGD and AdamW accept lr=0: the steps run (BatchNorm's running
  // statistics move, the momentum and moments fill) and no parameter changes (p - 0 x d = p). No
  // step divides by the rate: the warm-up, the schedules and --scale-lr only multiply it.
  DPT_INPUT_CHECK(std::isfinite(c.lr) && c.lr >= 0, "--lr must be >= 0, got " << c.lr);
  DPT_INPUT_CHECK(c.momentum >= 0 && c.momentum < 1,
                  "--momentum must be in [0, 1), got " << c.momentum);
  DPT_INPUT_CHECK(std::isfinite(c.weight_decay) && c.weight_decay >= 0,
                  "--weight-decay must be >= 0, got " << c.weight_decay);
  DPT_INPUT_CHECK(c.optimizer == "sgd" || c.optimizer == "adamw",
                  "--optimizer: '" << c.optimizer << "' is not sgd|adamw");
  if (c.optimizer == "adamw") {
    DPT_INPUT_CHECK(c.momentum == 0, "--momentum " << c.momentum
                                                   << " is SGD's: --optimizer adamw has none "
                                                      "(its moment averages are --betas)");
    DPT_INPUT_CHECK(!c.nesterov, "--nesterov is SGD's: --optimizer adamw has no Nesterov momentum");
  }
  // torch.optim.SGD refuses nesterov=True without a momentum or with dampening (dptrain's SGD has
  // no dampening: always 0).
  DPT_INPUT_CHECK(!c.nesterov || c.momentum > 0,
                  "--nesterov needs --momentum > 0 (and no dampening, as torch.optim.SGD), got "
                  "--momentum "
                      << c.momentum);
  DPT_INPUT_CHECK(c.betas.size() == 2, "--betas needs two values B1,B2");
  for (double b : c.betas)
    DPT_INPUT_CHECK(std::isfinite(b) && b >= 0 && b < 1,
                    "--betas: each must be in [0, 1), got " << c.betas[0] << "," << c.betas[1]);
  // The update divides by sqrt(v) + eps in float: an element whose gradient has been 0 so far has
  // v = m = 0, so eps 0 (or below float's smallest normal, which the kernels flush to 0) makes
  // that update 0/0 and the parameter NaN. torch.optim.AdamW accepts 0 and gives the same NaN.
  DPT_INPUT_CHECK(std::isfinite(c.eps) && c.eps >= std::numeric_limits<float>::min(),
                  "--eps must be at least " << std::numeric_limits<float>::min()
                                            << " (float's smallest normal: with less, a parameter "
                                               "whose gradient is still 0 becomes 0/0 = NaN), got "
                                            << c.eps);
  // [0, 1] as torch.nn.CrossEntropyLoss checks it (1: the uniform target alone). The bound is on
  // the double: 1.00000001 is refused though the float the loss takes rounds it to 1.
  DPT_INPUT_CHECK(
      std::isfinite(c.label_smoothing) && c.label_smoothing >= 0 && c.label_smoothing <= 1,
      "--label-smoothing must be in [0, 1], got " << nlohmann::json(c.label_smoothing).dump());
  DPT_INPUT_CHECK(c.schedule == "constant" || c.schedule == "step" || c.schedule == "cosine",
                  "--schedule: '" << c.schedule << "' is not constant|step|cosine");
  DPT_INPUT_CHECK(c.warmup_epochs >= 0, "--warmup-epochs must be >= 0, got " << c.warmup_epochs);
  // A warm-up longer than the run never reaches the rate: 1e308 trained at a rate of ~0 throughout.
  DPT_INPUT_CHECK(c.warmup_epochs <= c.epochs, "--warmup-epochs " << c.warmup_epochs
                                                                  << " is longer than the run: "
                                                                     "at most --epochs "
                                                                  << c.epochs);
  // No recipe sets milestones (apply_recipe), so any are the user's: under another schedule they
  // would be ignored silently. A milestone at epoch 0 or before would only lower the starting
  // rate; one past --epochs is accepted, as torch's MultiStepLR does (never reached: harmless,
  // and a resumed run may extend --epochs with --allow-config-change).
  DPT_INPUT_CHECK(
      c.step_epochs.empty() || c.schedule == "step",
      "--step-epochs applies to --schedule step (the schedule is " << c.schedule << ")");
  DPT_INPUT_CHECK(c.step_gamma > 0, "--step-gamma must be > 0, got " << c.step_gamma);
  DPT_INPUT_CHECK(c.init == "kaiming" || c.init == "d2l",
                  "--init: '" << c.init << "' is not kaiming|d2l");
  DPT_INPUT_CHECK(c.device == "auto" || c.device == "cpu" || c.device == "cuda",
                  "--device: '" << c.device << "' is not auto|cpu|cuda");
  DPT_INPUT_CHECK(c.precision == "fp32" || c.precision == "bf16",
                  "--precision: '" << c.precision << "' is not fp32|bf16");
  DPT_INPUT_CHECK(
      c.activation_dtype == "auto" || c.activation_dtype == "fp32" || c.activation_dtype == "bf16",
      "--activation-dtype: '" << c.activation_dtype << "' is not auto|fp32|bf16");
  {
    const auto formats = data_formats();
    std::string all;
    for (const auto& f : formats) all += (all.empty() ? "" : "|") + f;
    DPT_INPUT_CHECK(std::find(formats.begin(), formats.end(), c.data_format) != formats.end(),
                    "--data-format: '" << c.data_format << "' is not " << all);
  }
  (void)resolve_normalize(c.normalize,
                          nullptr);  // the syntax; the channel count once the data is read
  (void)parse_augment(c.augment, 0, 0);
  DPT_INPUT_CHECK(std::isfinite(c.bucket_mb) && c.bucket_mb > 0,
                  "--bucket-mb must be > 0, got " << c.bucket_mb);
  (void)grad_wire_dtype(c.grad_dtype);  // names the flag and the value when it is none of the three
  DPT_INPUT_CHECK(std::isfinite(c.last_bucket_mb) && c.last_bucket_mb >= 0,
                  "--last-bucket-mb must be >= 0, got " << c.last_bucket_mb);
  DPT_INPUT_CHECK(std::isfinite(c.clip_grad_norm) && c.clip_grad_norm >= 0,
                  "--clip-grad-norm must be >= 0 (0 = off), got " << c.clip_grad_norm);
  DPT_INPUT_CHECK(c.nonfinite == "stop" || c.nonfinite == "skip",
                  "--nonfinite must be stop or skip, got '" << c.nonfinite << "'");
  DPT_INPUT_CHECK(c.timeout >= 0, "--timeout must be >= 0, got " << c.timeout);
  // Longer waits are no use, and the clock's deadlines overflow past ~9e9 s (poll.h).
  DPT_INPUT_CHECK(c.timeout <= kMaxTimeoutSeconds,
                  "--timeout " << std::setprecision(10) << c.timeout << " is above the maximum of "
                               << kMaxTimeoutSeconds << " s (115 days): use 0 for no limit");
  DPT_INPUT_CHECK(c.checkpoint_every >= 0,
                  "--checkpoint-every must be >= 0, got " << c.checkpoint_every);
  DPT_INPUT_CHECK(!c.checkpoint_path.empty(), "--checkpoint-path must not be empty");
  // Here, not only where the level is set: under --quiet it is never read, and a typo passed.
  (void)parse_log_level(c.log_level);
  DPT_INPUT_CHECK(c.progress == "auto" || c.progress == "on" || c.progress == "off",
                  "--progress: '" << c.progress << "' is not auto|on|off");
  DPT_INPUT_CHECK(c.trace_begin >= 0 && c.trace_end > c.trace_begin,
                  "--trace-steps: need 0 <= A < B, got " << c.trace_begin << ":" << c.trace_end);
  // Only training steps split a batch: evaluation splits the test set at any world size.
  DPT_INPUT_CHECK(c.command != "train" || c.batch_size % world == 0,
                  "--batch-size " << c.batch_size << " is not divisible by the world size " << world
                                  << " (each rank takes batch/world images a step)");
}

DType activation_dtype(const TrainConfig& cfg, bool device_bf16_fast) {
  if (cfg.activation_dtype == "auto")
    return cfg.precision == "bf16" && device_bf16_fast ? DType::kBF16 : DType::kF32;
  return cfg.activation_dtype == "bf16" ? DType::kBF16 : DType::kF32;
}

std::string TrainConfig::to_text() const {
  auto j = nlohmann::json::parse(to_json());
  std::ostringstream os;
  for (auto it = j.begin(); it != j.end(); ++it)
    os << "  " << it.key() << ": " << it.value().dump() << "\n";
  return os.str();
}

}  // namespace dpt
