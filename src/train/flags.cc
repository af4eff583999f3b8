// The flag table (include/dpt/flags.h) and what reads it: the cxxopts parser of parse_config, the
// assignment into TrainConfig, TrainConfig::to_json, agreed_values and may_change_on_resume.
#include "dpt/flags.h"

#include <algorithm>
#include <cmath>
#include <cxxopts.hpp>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <type_traits>
#include <utility>

#include "dpt/dataset.h"
#include "dpt/error.h"
#include "dpt/models.h"
#include "dpt/poll.h"
#include "dpt/safetensors.h"
#include "dpt/text.h"
#include "dpt/version.h"

namespace dpt {

namespace {

// --trace-steps A:B: the window of global steps [A, B) the trace covers (its range:
// validate_config).
void parse_trace_steps(const std::string& window, TrainConfig* c) {
  const std::vector<std::string> ends = split_list(window, ':');
  std::optional<int64_t> a, b;
  if (ends.size() == 2) a = read_number<int64_t>(ends[0]), b = read_number<int64_t>(ends[1]);
  DPT_INPUT_CHECK(a && b, "--trace-steps: '" << printable(window)
                                             << "' is not A:B (two whole numbers in decimal)");
  c->trace_begin = *a;
  c->trace_end = *b;
}

std::string format_trace_steps(const TrainConfig& c) {
  return std::to_string(c.trace_begin) + ":" + std::to_string(c.trace_end);
}

// --betas B1,B2: AdamW's two coefficients (their range: validate_config).
void parse_betas(const std::string& v, TrainConfig* c) {
  std::vector<double> betas;
  for (const std::string& part : split_list(v, ',')) {
    const std::optional<double> b = read_number<double>(part);
    DPT_INPUT_CHECK(b, "--betas: '" << printable(v) << "' is not B1,B2 (two numbers)");
    betas.push_back(*b);
  }
  DPT_INPUT_CHECK(betas.size() == 2, "--betas: '" << v << "' is not B1,B2 (two numbers)");
  c->betas = betas;
}

// Each value as the shortest text that reads back as it (JSON's number form).
std::string format_betas(const TrainConfig& c) {
  std::string out;
  for (double b : c.betas) {
    if (!out.empty()) out += ',';  // not ("," + ...): GCC 12 warns (-Wrestrict) on that operator+
    out += nlohmann::json(b).dump();
  }
  return out;
}

std::string format_checkpoint_every(const TrainConfig& c) {
  std::ostringstream os;
  if (c.checkpoint_every_steps > 0)
    os << c.checkpoint_every_steps << "steps";
  else if (c.checkpoint_every_minutes > 0)
    os << c.checkpoint_every_minutes << "min";
  else
    os << c.checkpoint_every;
  return os.str();
}

// --model's help: each model of the table with its line.
std::string model_help() {
  std::string help;
  for (const ModelSpec& m : models())
    help += (help.empty() ? "" : " | ") + m.name + " (" + m.description + ")";
  return help;
}

// --data-format's choices from the format table (dataset.h), so a new format needs no edit here.
std::string data_format_help() {
  std::string help;
  for (const std::string& f : data_formats())
    help += help.empty() ? f + " (detected from the file names)" : " | " + f;
  return help;
}

std::vector<Flag> flag_table() {
  using A = Agreement;
  using C = TrainConfig;
  using K = FlagKind;
  const std::string model = "Model and recipe", data = "Data and device",
                    parallel = "Data parallelism", output = "Output";
  return {
      // Model and recipe: everything here shapes the trajectory.
      {.name = "model",
       .group = model,
       .help = model_help(),
       .field = &C::model,
       .agreement = A::kFixed},
      {.name = "stem",
       .group = model,
       .help =
           "auto | imagenet | cifar: the stem of resnet18-tv, resnet34 and resnet50 "
           "(imagenet: torchvision's 7x7 stride-2 convolution and 3x3 stride-2 max-pool; cifar: "
           "a 3x3 stride-1 convolution, no max-pool; auto: cifar below 64 pixels)",
       .field = &C::stem,
       .agreement = A::kFixed},
      {.name = "zero-init-residual",
       .group = model,
       .help = "Each residual block's last BatchNorm weight starts at 0 (torchvision's option)",
       .field = &C::zero_init_residual,
       .agreement = A::kFixed,
       .kind = K::kSwitch},
      {.name = "recipe",
       .group = model,
       .help = recipe_help(),
       .field = &C::recipe,
       .agreement = A::kFixed},
      {.name = "epochs",
       .group = model,
       .help = "Training epochs",
       .field = &C::epochs,
       .agreement = A::kFixed,
       .min = 1},
      {.name = "batch-size",
       .group = model,
       .help = "Global batch size (split evenly over ranks)",
       .field = &C::batch_size,
       .agreement = A::kFixed,
       .min = 1},
      // Before --lr: it gives --lr's default, so a difference in it is named first.
      {.name = "optimizer",
       .group = model,
       .help = "sgd | adamw (torch.optim.AdamW: decoupled weight decay, bias-corrected moments; "
               "--lr then defaults to 1e-3 and --weight-decay to 0.01)",
       .field = &C::optimizer,
       .agreement = A::kFixed},
      {.name = "lr",
       .group = model,
       .help = "Peak learning rate, >= 0 (0: the steps move no parameter, only BatchNorm's "
               "statistics; default: from the recipe)",
       .field = &C::lr,
       .agreement = A::kFixed,
       .from = Default::kRecipe},
      {.name = "momentum",
       .group = model,
       .help = "SGD momentum (default: from the recipe)",
       .field = &C::momentum,
       .agreement = A::kFixed,
       .from = Default::kRecipe},
      {.name = "nesterov",
       .group = model,
       .help = "SGD with Nesterov momentum, as torch.optim.SGD(nesterov=True) (needs --momentum "
               "> 0)",
       .field = &C::nesterov,
       .agreement = A::kFixed,
       .kind = K::kSwitch},
      {.name = "weight-decay",
       .group = model,
       .help = "Weight decay: SGD's L2 term added to the gradient, AdamW's decoupled p -= lr*wd*p "
               "(default: from the recipe; 0.01 for adamw)",
       .field = &C::weight_decay,
       .agreement = A::kFixed,
       .from = Default::kRecipe},
      {.name = "no-decay-bn-bias",
       .group = model,
       .help = "No weight decay on BatchNorm weights and biases and on every bias (each 1-D "
               "parameter)",
       .field = &C::no_decay_bn_bias,
       .agreement = A::kFixed,
       .kind = K::kSwitch},
      {.name = "betas",
       .group = model,
       .help = "AdamW's B1,B2: the decay rates of the moment averages, each in [0, 1)",
       .agreement = A::kFixed,
       .kind = K::kCustom,
       .parse = parse_betas,
       .format = format_betas,
       .json = {{.key = "betas", .field = &C::betas}}},
      {.name = "eps",
       .group = model,
       .help = "AdamW's epsilon, added to the denominator (at least 1.2e-38, float's smallest "
               "normal)",
       .field = &C::eps,
       .agreement = A::kFixed},
      {.name = "label-smoothing",
       .group = model,
       .help = "E in [0, 1]: the training loss is torch.nn.CrossEntropyLoss(label_smoothing=E), "
               "(1-E) CE + E x the mean over classes of -log p (the test loss stays plain CE)",
       .field = &C::label_smoothing,
       .agreement = A::kFixed},
      {.name = "schedule",
       .group = model,
       .help = "constant | step | cosine (default: from the recipe)",
       .field = &C::schedule,
       .agreement = A::kFixed,
       .from = Default::kRecipe},
      {.name = "warmup-epochs",
       .group = model,
       .help = "Linear warm-up epochs, at most --epochs (default: from the recipe)",
       .field = &C::warmup_epochs,
       .agreement = A::kFixed,
       .from = Default::kRecipe},
      {.name = "step-epochs",
       .group = model,
       .help = "Epochs (each >= 1) at which --schedule step multiplies the rate by --step-gamma, "
               "e.g. 5,8 (refused under other schedules)",
       .field = &C::step_epochs,
       .agreement = A::kFixed,
       .from = Default::kNone,
       .min = 1},
      {.name = "step-gamma",
       .group = model,
       .help = "Factor of schedule=step",
       .field = &C::step_gamma,
       .agreement = A::kFixed},
      {.name = "init",
       .group = model,
       .help = "kaiming | d2l (default: from the recipe)",
       .field = &C::init,
       .agreement = A::kFixed,
       .from = Default::kRecipe},
      {.name = "seed",
       .group = model,
       .help = "Seed of initialisation and data order",
       .field = &C::seed,
       .agreement = A::kFixed},
      {.name = "scale-lr",
       .group = model,
       .help =
           "Linear scaling rule: lr *= batch x accum-steps / 256, with at least 1 warm-up epoch",
       .field = &C::scale_lr,
       .agreement = A::kFixed,
       .kind = K::kSwitch},

      // Data and device. The data files themselves are compared by digest (preflight.h), so
      // --data, a path, may differ.
      {.name = "data",
       .group = data,
       .help = "Directory of the data set: IDX files (train-/t10k-images-idx3-ubyte[.gz] or "
               "-idx4-, ...-labels-idx1-ubyte[.gz]), CIFAR-10/100 binary batches or NumPy .npy "
               "arrays (USAGE: \"Bring your own data\"), or synthetic:HxWxC:N:K, random images "
               "drawn from --seed (USAGE: \"Synthetic data\"); evaluate and predict read its "
               "test split",
       .field = &C::data,
       .path = true,
       .commands = kCommandAny},
      {.name = "data-format",
       .group = data,
       .help = data_format_help(),
       .field = &C::data_format,
       .agreement = A::kFixed,
       .commands = kCommandAny},
      {.name = "normalize",
       .group = data,
       .help = "none | auto (per-channel mean and std of the training set) | M1,..,Mc/S1,..,Sc: "
               "inputs become (x/255 - mean) / std per channel; recorded in checkpoints and --save",
       .field = &C::normalize,
       .agreement = A::kFixed},
      {.name = "augment",
       .group = data,
       .help = "none | a comma list of crop (random crop with zero padding of max(1, size/8) "
               "pixels: 4 for 32x32), crop=P (padding P), flip (horizontal, p = 1/2); every draw "
               "a function of (seed, epoch, image), so results do not depend on the rank count",
       .field = &C::augment,
       .agreement = A::kFixed},
      // As given: an explicit cuda beside a cpu rank must not quietly become cpu; a resumed run
      // may move to other hardware.
      {.name = "device",
       .group = data,
       .help = "auto (cuda when every rank sees a CUDA device, else cpu) | cpu | cuda: one GPU per "
               "rank, by local rank",
       .field = &C::device,
       .agreement = A::kResumable,
       .commands = kCommandAny},
      {.name = "tf32",
       .group = data,
       .help = "Let cuBLAS/cuDNN use TF32 tensor cores for fp32 products on the GPU: faster, with "
               "10-bit mantissa products (off: results agree with the CPU to fp32 rounding)",
       .field = &C::tf32,
       .agreement = A::kFixed,
       .kind = K::kSwitch,
       .commands = kCommandAny},
      // PyTorch's torch.backends.cudnn.deterministic = False, as an opt-in: dptrain's runs are
      // bit-reproducible by default, and cuDNN's fastest weight-gradient engines often add with
      // atomics in whatever order the blocks finish. Ranks agree (the all-reduce keeps their
      // replicas equal either way); a resume may change it, since it changes no model state.
      {.name = "cudnn-nondeterministic",
       .group = data,
       .help = "Let cuDNN's non-deterministic engines (atomic additions, mostly weight gradients) "
               "compete in the GPU's plan search, as PyTorch does unless "
               "cudnn.deterministic: maybe faster, no longer bit-reproducible run to run",
       .field = &C::cudnn_nondeterministic,
       .agreement = A::kResumable,
       .kind = K::kSwitch},
      {.name = "precision",
       .group = data,
       .help = "fp32 | bf16: Linear GEMMs and convolutions on bf16 operands (the CPU needs "
               "AVX512-BF16 or AMX-BF16; on the GPU's legacy cuDNN API, or with fp32 "
               "activations there, convolutions take TF32 operands), fp32 accumulation; master "
               "weights, the gradient buffers, the optimizer and the all-reduce stay fp32",
       .field = &C::precision,
       .agreement = A::kFixed,
       .commands = kCommandAny},
      {.name = "activation-dtype",
       .group = data,
       .help = "auto | fp32 | bf16: the type activations and their gradients are stored in "
               "between layers (bf16: rounded to bfloat16 after every layer, as PyTorch autocast "
               "stores them; parameters, gradients, BatchNorm statistics and the loss stay fp32); "
               "auto is bf16 under --precision bf16 where the convolutions take bf16 natively (the "
               "CPU; the GPU on cuDNN's graph API), else fp32; a resume keeps the checkpoint's",
       .field = &C::activation_dtype,
       .agreement = A::kFixed,
       .commands = kCommandAny},
      // Same results either way, but the ranks' graphs must capture the same collectives.
      {.name = "no-cuda-graphs",
       .group = data,
       .help = "On the GPU, launch every kernel of every step instead of replaying warm steps and "
               "evaluations as CUDA graphs (same results; for profiling)",
       .field = &C::cuda_graphs,
       .agreement = A::kResumable,
       .kind = K::kNegated,
       .json = {{.key = "cuda_graphs"}}},
      {.name = "threads",
       .group = data,
       .help = "Compute threads per rank",
       .field = &C::threads,
       .commands = kCommandAny,
       .min = 1,
       .max = 1024},
      {.name = "max-steps",
       .group = data,
       .help = "At most N training steps per epoch (0 = all)",
       .field = &C::max_steps,
       .agreement = A::kFixed,
       .min = 0},
      {.name = "eval-batch-size",
       .group = data,
       .help = "Batch size of evaluation",
       .field = &C::eval_batch_size,
       .agreement = A::kResumable,
       .commands = kCommandAny,
       .min = 1},
      {.name = "eval-every",
       .group = data,
       .help = "Evaluate every N epochs and after the last one (0 = never: speed runs)",
       .field = &C::eval_every,
       .agreement = A::kResumable,
       .min = 0},

      // Data parallelism: the buckets decide the collectives every rank issues.
      {.name = "bucket-mb",
       .group = parallel,
       .help = "Gradient bucket cap in MiB (the first bucket is capped at 1 MiB)",
       .field = &C::bucket_mb,
       .agreement = A::kResumable},
      {.name = "last-bucket-mb",
       .group = parallel,
       .help = "Cap in MiB of a separate last bucket for the first layers' gradients, which "
               "backward produces last (0 = none; at most a quarter of all gradients)",
       .field = &C::last_bucket_mb,
       .agreement = A::kResumable},
      {.name = "no-overlap",
       .group = parallel,
       .help = "All-reduce after backward instead of during it",
       .field = &C::overlap,
       .kind = K::kNegated,
       .json = {{.key = "overlap"}}},
      {.name = "grad-dtype",
       .group = parallel,
       .help = "fp32 | bf16 | fp16: the type gradient buckets travel in (half the bytes in 16 "
               "bits; summed in float, rounded per partial sum; master weights and the optimizer "
               "stay fp32)",
       .field = &C::grad_dtype,
       .agreement = A::kFixed},
      {.name = "accum-steps",
       .group = parallel,
       .help = "Gradient accumulation micro-steps per optimizer step",
       .field = &C::accum_steps,
       .agreement = A::kFixed,
       .min = 1},
      {.name = "sync-bn",
       .group = parallel,
       .help = "Share BatchNorm batch statistics across ranks",
       .field = &C::sync_bn,
       .agreement = A::kFixed,
       .kind = K::kSwitch},
      {.name = "clip-grad-norm",
       .group = parallel,
       .help = "Multiply the all-reduced gradients by min(1, this / (their global L2 norm + "
               "1e-6)), as torch.nn.utils.clip_grad_norm_ (0 = off)",
       .field = &C::clip_grad_norm,
       .agreement = A::kFixed},
      {.name = "nonfinite",
       .group = parallel,
       .help = "A step whose gradients are not finite (NaN/Inf) is never applied; then: stop (name "
               "the step and the tensor, exit 2) | skip (go on; stop after --nonfinite-max-skips "
               "such steps)",
       .field = &C::nonfinite,
       .agreement = A::kResumable},
      {.name = "nonfinite-max-skips",
       .group = parallel,
       .help = "With --nonfinite skip: stop at the step that would skip more than N in all",
       .field = &C::nonfinite_max_skips,
       .agreement = A::kResumable,
       .min = 0},
      {.name = "verify-every",
       .group = parallel,
       .help = "Compare parameter checksums across ranks every N steps (0 = never)",
       .field = &C::verify_every,
       .agreement = A::kResumable,
       .min = 0},
      {.name = "timeout",
       .group = parallel,
       .help = "Seconds a collective may take before every rank stops (0 = never; at most 1e7)",
       .field = &C::timeout,
       .commands = kCommandAny},

      // Output: paths are rank 0's business; whether some are given decides collectives.
      {.name = "metrics",
       .group = output,
       .help = "Write one JSON line per epoch to FILE (evaluate: one line of its results)",
       .field = &C::metrics,
       .from = Default::kNone,
       .path = true,
       .commands = kCommandTrain | kCommandEvaluate},
      {.name = "save",
       .group = output,
       .help = "Write parameters and buffers to FILE (safetensors) at the end",
       .field = &C::save,
       .agreement = A::kGiven,
       .from = Default::kNone,
       .path = true},
      // One flag, three fields: every unit has its own, agreed under its own name.
      {.name = "checkpoint-every",
       .group = output,
       .help = "Write a training checkpoint every N epochs (N or Nepochs), N steps (Nsteps) or N "
               "minutes (Nmin, decided by rank 0's clock); 0 = never",
       .agreement = A::kResumable,
       .kind = K::kCustom,
       .parse = parse_checkpoint_every,
       .format = format_checkpoint_every,
       .json = {{.key = "checkpoint_every", .field = &C::checkpoint_every},
                {.key = "checkpoint_every_steps",
                 .field = &C::checkpoint_every_steps,
                 .agreed_as = "--checkpoint-every-steps"},
                {.key = "checkpoint_every_minutes",
                 .field = &C::checkpoint_every_minutes,
                 .agreed_as = "--checkpoint-every-minutes"}}},
      {.name = "keep-checkpoints",
       .group = output,
       .help = "Name checkpoints by their step beside --checkpoint-path (stem.stepN.ext) and keep "
               "the newest K (0 = one file at --checkpoint-path, replaced each time)",
       .field = &C::keep_checkpoints,
       .min = 0},
      {.name = "checkpoint-path",
       .group = output,
       .help = "Where training checkpoints go (replaced atomically each time)",
       .field = &C::checkpoint_path,
       .path = true},
      {.name = "resume",
       .group = output,
       .help = "Continue training from a checkpoint FILE (parameters, buffers, optimizer, "
               "position)",
       .field = &C::resume,
       .agreement = A::kGiven,
       .from = Default::kNone,
       .path = true},
      {.name = "init-from",
       .group = output,
       .help = "Start training from a saved model's parameters and BatchNorm buffers (a --save, a "
               "checkpoint or any safetensors file with the model's names and shapes), with a "
               "fresh optimizer and position; a classifier head of another class count is "
               "re-initialised (fine-tuning)",
       .field = &C::init_from,
       .agreement = A::kGiven,
       .from = Default::kNone,
       .path = true},
      {.name = "load",
       .group = output,
       .help = "The saved model to run (a --save file or a training checkpoint): its model, "
               "classes, input shape and normalisation are the file's",
       .field = &C::load,
       .from = Default::kNone,
       .path = true,
       .commands = kCommandScore},
      {.name = "output",
       .group = output,
       .help = "CSV of every test image, in the data set's order: index, label and the top-k "
               "classes with their probabilities",
       .field = &C::output,
       .from = Default::kNone,
       .path = true,
       .commands = kCommandPredict},
      {.name = "top-k",
       .group = output,
       .help = "Classes per image in --output (capped at the class count)",
       .field = &C::top_k,
       .agreement = A::kResumable,
       .commands = kCommandPredict,
       .min = 1},
      {.name = "allow-config-change",
       .group = output,
       .help = "Let --resume continue with training settings other than the checkpoint's "
               "(refused otherwise); the position in the epoch is recomputed for a new batch or "
               "accumulation",
       .field = &C::allow_config_change,
       .kind = K::kSwitch},
      {.name = "metrics-every",
       .group = output,
       .help = "Also write a per-step record to --metrics every N steps (0 = never)",
       .field = &C::metrics_every,
       .agreement = A::kResumable,
       .min = 0},
      {.name = "report",
       .group = output,
       .help = "Learning-curve SVG, rewritten after every epoch (open it in a browser)",
       .field = &C::report,
       .from = Default::kNone,
       .path = true},
      {.name = "trace",
       .group = output,
       .help = "Chrome-trace/Perfetto timeline JSON of --trace-steps, all ranks",
       .field = &C::trace,
       .agreement = A::kGiven,
       .from = Default::kNone,
       .path = true},
      {.name = "trace-steps",
       .group = output,
       .help = "Window A:B of global steps the trace covers",
       .agreement = A::kResumable,
       .kind = K::kCustom,
       .parse = parse_trace_steps,
       .format = format_trace_steps},
      {.name = "log-level",
       .group = output,
       .help = "error | warn | info | debug",
       .field = &C::log_level,
       .commands = kCommandAny},
      {.name = "quiet",
       .group = output,
       .help = "Print only errors and the final line",
       .field = &C::quiet,
       .kind = K::kSwitch,
       .commands = kCommandAny},
      {.name = "progress",
       .group = output,
       .help = "Progress bar on rank 0: auto (when stderr, or launch/mpirun.sh's, is a terminal) | "
               "on | off",
       .field = &C::progress},
  };
}

template <typename M>
constexpr bool is_field = std::is_member_object_pointer_v<M>;

}  // namespace

const std::vector<Flag>& flags() {
  static const std::vector<Flag> table = [] {
    std::vector<Flag> t = flag_table();
    for (Flag& f : t) {
      // The table is code: a malformed entry is a bug, caught by the first run of any test.
      const bool is_bool = std::holds_alternative<bool TrainConfig::*>(f.field);
      DPT_CHECK(f.kind == FlagKind::kCustom ? f.parse && f.format
                                            : (f.kind == FlagKind::kValue) != is_bool,
                "flag table: --" << f.name << " has no field of its kind");
      if (f.json.empty()) {
        std::string key = f.name;
        for (char& ch : key)
          if (ch == '-') ch = '_';
        f.json.push_back({.key = key});
      }
      for (JsonValue& v : f.json) {
        if (std::holds_alternative<std::monostate>(v.field))
          v.field = f.kind == FlagKind::kCustom ? ConfigField(f.format) : f.field;
        if (v.agreed_as.empty()) v.agreed_as = "--" + f.name;
      }
    }
    return t;
  }();
  return table;
}

namespace {

// Every number a flag takes is read by read_number (text.h), never by cxxopts, which is handed the
// text as given: cxxopts read integers in hex too (--epochs 0x10 was 16, --top-k 0x3 was 3) and
// doubles with operator>>, which skipped leading blanks, took a '+' and stopped at the first
// character that was not part of the number, keeping what it had read (--momentum 0,9, a comma
// decimal separator as a German-locale user types it, trained with momentum 0; the check added for
// that still let " 0.1" through), while integers with a blank or a '+' were refused.
template <typename T>
constexpr bool is_number = std::is_arithmetic_v<T> && !std::is_same_v<T, bool>;
template <typename T>
struct ListItem {
  using type = void;
};
template <typename T>
struct ListItem<std::vector<T>> {
  using type = T;
};
template <typename T>
constexpr bool is_number_list = is_number<typename ListItem<T>::type>;

// An integer flag's range, Flag::min and max with the field's type's limits for what the entry
// leaves unset; nullopt for a flag without one.
template <typename T>
std::optional<std::pair<int64_t, int64_t>> range_of(const Flag& f) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    if (!f.min && !f.max) return std::nullopt;
    constexpr auto type_max = std::numeric_limits<T>::max();
    const int64_t most = type_max > std::numeric_limits<int64_t>::max()
                             ? std::numeric_limits<int64_t>::max()
                             : static_cast<int64_t>(type_max);
    return std::pair<int64_t, int64_t>{f.min.value_or(std::numeric_limits<T>::min()),
                                       f.max.value_or(most)};
  } else {
    return std::nullopt;
  }
}

// The refusal of an integer flag's value outside its range, the value as typed: one wording for a
// value its field's type holds (validate_config) and one it does not (the parser).
Error out_of_range(const Flag& f, std::pair<int64_t, int64_t> range, const std::string& value,
                   bool list_item) {
  return Error(ErrorKind::kInput, "--" + f.name + (list_item ? ": each item" : "") +
                                      " must be between " + std::to_string(range.first) + " and " +
                                      std::to_string(range.second) + ", got " + printable(value));
}

// A whole number past T's range (`why`) typed for a flag with a range (`f`, none when null) is
// refused with that range.
template <typename T>
void refuse_past_range(const Flag* f, NumberError why, const std::string& text, bool list_item) {
  if (f && why == NumberError::kTooLarge)
    if (const auto range = range_of<T>(*f)) throw out_of_range(*f, *range, text, list_item);
}

// `text` as a number of T, or an input error naming the flag and the value and saying why: for a
// whole number past T's range, the flag's own range when it has one (`f`).
template <typename T>
T number(const std::string& flag, const std::string& text, const Flag* f = nullptr,
         bool list_item = false) {
  NumberError why = NumberError::kNone;
  if (const std::optional<T> v = read_number<T>(text, &why)) return *v;
  refuse_past_range<T>(f, why, text, list_item);
  throw Error(ErrorKind::kInput, flag + ": '" + printable(text) + "' " + number_error_text<T>(why) +
                                     (std::is_floating_point_v<T> && why == NumberError::kSyntax &&
                                              text.find(',') != std::string::npos
                                          ? " (the decimal separator is '.', whatever the locale)"
                                          : ""));
}

// The refusal of one item of a list value (--step-epochs 1,x), naming the flag and the value;
// `why` (read_number's words for it) when there is more to say than that.
Error bad_list_item(const std::string& flag, const std::string& given, const std::string& item,
                    const std::string& why = "") {
  return Error(ErrorKind::kInput, flag + ": '" + printable(given) + "' has the item '" +
                                      printable(item) + "', which is not a valid value" +
                                      (why.empty() ? " (see dptrain --help)" : ": it " + why));
}

// Values are converted here, so a value that does not parse is reported with its flag. Numbers:
// every occurrence of the flag is read (a scalar's last one wins, as cxxopts' did; a list's items
// are appended in order, as cxxopts appended them), the default's text when none is given.
template <typename T>
T flag(const cxxopts::ParseResult& r, const std::string& name, const Flag* f = nullptr) {
  if constexpr (is_number<T> || is_number_list<T>) {
    T out{};
    bool given = false;
    for (const cxxopts::KeyValue& arg : r.arguments()) {
      if (arg.key() != name) continue;
      given = true;
      if constexpr (is_number<T>) {
        out = number<T>("--" + name, arg.value(), f);
      } else {
        using Item = typename ListItem<T>::type;
        // An empty item is refused wherever it stands ("1,,2", ",1", and "1,2,", whose last item
        // cxxopts dropped), and the empty value is one empty item here.
        const std::vector<std::string> items = split_list(arg.value(), ',');
        if (items.size() <= 1) {
          out.push_back(number<Item>("--" + name, arg.value(), f, true));
          continue;
        }
        for (const std::string& item : items) {
          NumberError why = NumberError::kNone;
          const std::optional<Item> v = read_number<Item>(item, &why);
          if (!v) refuse_past_range<Item>(f, why, item, true);
          if (!v)
            throw bad_list_item("--" + name, arg.value(), item,
                                item.empty() ? "" : number_error_text<Item>(why));
          out.push_back(*v);
        }
      }
    }
    if constexpr (is_number<T>)
      if (!given) out = number<T>("--" + name, r[name].as<std::string>(), f);  // the default's text
    return out;
  } else {
    try {
      return r[name].as<T>();
    } catch (const std::exception& e) {
      throw Error(ErrorKind::kInput, "--" + name + ": " + e.what());
    }
  }
}

template <typename T>
std::string text(const T& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// cxxopts' option for an entry: its type (a number's is its text: flag() reads it), and its
// default when --help shows one.
std::shared_ptr<const cxxopts::Value> option_value(const Flag& f) {
  static const TrainConfig d;  // the built-in defaults shown in --help
  if (f.kind == FlagKind::kCustom) return cxxopts::value<std::string>()->default_value(f.format(d));
  if (f.kind != FlagKind::kValue) return cxxopts::value<bool>();
  return std::visit(
      [&](auto m) -> std::shared_ptr<const cxxopts::Value> {
        if constexpr (is_field<decltype(m)>) {
          using T = std::remove_cvref_t<decltype(d.*m)>;
          if constexpr (is_number_list<T>) {
            DPT_CHECK(f.from != Default::kConfig,
                      "flag table: --" << f.name << " shows no default");
            return cxxopts::value<std::string>();
          } else {
            using Given = std::conditional_t<is_number<T>, std::string, T>;
            if (f.from != Default::kConfig) return cxxopts::value<Given>();
            return cxxopts::value<Given>()->default_value(text(d.*m));
          }
        }
        DPT_CHECK(false, "flag table: --" << f.name << " sets no field");
        return nullptr;
      },
      f.field);
}

// Sets the entry's field(s) from the parsed command line.
void assign(const Flag& f, const cxxopts::ParseResult& r, TrainConfig* cfg) {
  const bool given = r.count(f.name) > 0;
  switch (f.kind) {
    case FlagKind::kSwitch:
      cfg->*std::get<bool TrainConfig::*>(f.field) = given;
      return;
    case FlagKind::kNegated:
      cfg->*std::get<bool TrainConfig::*>(f.field) = !given;
      return;
    case FlagKind::kCustom:
      f.parse(flag<std::string>(r, f.name), cfg);
      return;
    case FlagKind::kValue:
      if (f.from != Default::kConfig && !given) return;  // the recipe's, or the initial value
      std::visit(
          [&](auto m) {
            if constexpr (is_field<decltype(m)>)
              cfg->*m = flag<std::remove_cvref_t<decltype(cfg->*m)>>(r, f.name, &f);
          },
          f.field);
      return;
  }
}

nlohmann::json json_of(const TrainConfig& cfg, const ConfigField& field) {
  return std::visit(
      [&](auto m) -> nlohmann::json {
        using M = decltype(m);
        if constexpr (is_field<M>)
          return cfg.*m;
        else if constexpr (std::is_same_v<M, std::monostate>)
          return nullptr;  // flags() gives every key a field
        else
          return m(cfg);
      },
      field);
}

bool agreed(const Flag& f) {
  return f.agreement == Agreement::kFixed || f.agreement == Agreement::kResumable;
}

// Whether `list` is a comma list (cxxopts' vector values, --step-epochs) with `item` as one of its
// items ("" for "1,,2" or "1,"). A text of one item is no list: the caller compares it whole.
bool has_list_item(const std::string& list, const std::string& item) {
  const std::vector<std::string> items = split_list(list, ',');
  return items.size() > 1 && std::find(items.begin(), items.end(), item) != items.end();
}

// cxxopts converts typed values while parsing and names only the value ("Argument 'nan' failed
// to parse"), or one item of a list value ("Argument 'x' failed to parse" for --step-epochs 1,x):
// find the flag it was given to, so the message says which one.
[[noreturn]] void rethrow_naming_the_flag(const std::string& what, int argc, char** argv) {
  const std::string open = "\u2018", close = "\u2019";
  const size_t a = what.find(open),
               b = a == std::string::npos ? a : what.find(close, a + open.size());
  if (b != std::string::npos) {
    const std::string value = what.substr(a + open.size(), b - a - open.size());
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      const size_t eq = arg.find('=');
      std::string flag, given;
      if (arg.rfind("--", 0) == 0 && eq != std::string::npos &&
          (arg.substr(eq + 1) == value || has_list_item(arg.substr(eq + 1), value))) {
        flag = arg.substr(0, eq);
        given = arg.substr(eq + 1);
      }
      if ((arg == value || has_list_item(arg, value)) && i > 1 &&
          std::string(argv[i - 1]).rfind("--", 0) == 0) {
        flag = argv[i - 1];
        given = arg;
      }
      if (flag.empty()) continue;
      if (given == value)
        throw Error(ErrorKind::kInput,
                    flag + ": '" + value + "' is not a valid value (see dptrain --help)");
      throw bad_list_item(flag, given, value);
    }
  }
  throw Error(ErrorKind::kInput, what + " (see dptrain --help)");
}

}  // namespace

void check_flag_ranges(const TrainConfig& cfg) {
  for (const Flag& f : flags()) {
    std::visit(
        [&](auto m) {
          if constexpr (is_field<decltype(m)>) {
            using T = std::remove_cvref_t<decltype(cfg.*m)>;
            const auto check = [&](auto v) {
              if constexpr (std::is_integral_v<decltype(v)>) {
                const auto range = range_of<decltype(v)>(f);
                if (range && (std::cmp_less(v, range->first) || std::cmp_greater(v, range->second)))
                  throw out_of_range(f, *range, std::to_string(v), is_number_list<T>);
              }
            };
            if constexpr (is_number_list<T>)
              for (const auto v : cfg.*m) check(v);
            else if constexpr (is_number<T>)
              check(cfg.*m);
          }
        },
        f.field);
  }
}

unsigned command_bit(const std::string& command) {
  return command == "train"      ? kCommandTrain
         : command == "evaluate" ? kCommandEvaluate
         : command == "predict"  ? kCommandPredict
                                 : 0u;
}

namespace {

// "--name" or "--name=value": the name, or "" for anything else (a value, a short option).
std::string flag_name(const std::string& arg) {
  if (arg.size() < 3 || arg.rfind("--", 0) != 0) return "";
  return arg.substr(2, arg.find('=') == std::string::npos ? std::string::npos : arg.find('=') - 2);
}

const char* command_synopsis(unsigned bit) {
  switch (bit) {
    case kCommandEvaluate:
      return "dptrain evaluate --load FILE [--data DIR]: loss, top-1 and top-5 accuracy, "
             "per-class accuracy and the confusion matrix of a saved model on DIR's test split "
             "(launch with mpirun or srun: the test set is split across the ranks)";
    case kCommandPredict:
      return "dptrain predict --load FILE --data DIR --output preds.csv: the top-k classes and "
             "their probabilities for every image of DIR's test split, in its order";
    default:
      return "Data-parallel training of LeNet, ResNet-18/34/50 on Fashion-MNIST, your own images "
             "or synthetic data (launch with mpirun or srun; one rank per GPU or CPU slot); "
             "dptrain evaluate and dptrain predict run a saved model (dptrain evaluate --help)";
  }
}

}  // namespace

double early_timeout(int argc, char** argv) {
  const double fallback = TrainConfig{}.timeout;
  std::string value;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--timeout" && i + 1 < argc)
      value = argv[i + 1];
    else if (arg.rfind("--timeout=", 0) == 0)
      value = arg.substr(10);
  }
  const std::optional<double> v = read_number<double>(value);  // as parse_config reads it
  return v && *v >= 0 && *v <= kMaxTimeoutSeconds ? *v : fallback;
}

bool parse_config(int argc, char** argv, TrainConfig* cfg, std::string* help_text) {
  // The command word comes first; without one, the command is training (as before commands).
  const std::string first = argc > 1 ? argv[1] : "";
  unsigned command = kCommandTrain;
  if (!first.empty() && first[0] != '-') {
    command = command_bit(first);
    DPT_INPUT_CHECK(command != 0, "unknown command '" << printable(first)
                                                      << "' (train, evaluate or predict; see "
                                                         "dptrain --help)");
    cfg->command = first;
    // cxxopts reads argv[0] as the program: the command word takes its place.
    --argc;
    ++argv;
  }
  const std::string program = command == kCommandTrain ? "dptrain" : "dptrain " + cfg->command;
  // A flag of another command is named as such, not as unknown.
  for (int i = 1; i < argc; ++i) {
    const std::string name = flag_name(argv[i]);
    for (const Flag& f : flags())
      DPT_INPUT_CHECK(
          name != f.name || (f.commands & command),
          "--" << f.name << " is not a flag of " << program << " (see " << program << " --help)");
  }
  cxxopts::Options opts(program, command_synopsis(command));
  std::vector<const Flag*> taken;  // the command's flags
  for (const Flag& f : flags())
    if (f.commands & command) {
      opts.add_options(f.group)(f.name, f.help, option_value(f));
      taken.push_back(&f);
    }
  opts.add_options("Output")("h,help", "Print this help")(
      "version",
      "Print what this build is (dptrain's version and git revision, the compiler, oneDNN and "
      "the instruction sets, the CUDA libraries loaded and the GPUs visible, MPI) and exit: "
      "the lines to give in a bug report");
  cxxopts::ParseResult r;
  try {
    r = opts.parse(argc, argv);
  } catch (const std::exception& e) {
    rethrow_naming_the_flag(e.what(), argc, argv);
  }
  if (r.count("help")) {
    *help_text = opts.help();
    return false;
  }
  if (r.count("version")) {
    *help_text = version_report();
    return false;
  }
  DPT_INPUT_CHECK(r.unmatched().empty(),
                  "unexpected argument '" << r.unmatched()[0] << "' (see dptrain --help)");
  for (const Flag* f : taken) {
    if (!f->path || !r.count(f->name)) continue;
    const std::string value = r[f->name].as<std::string>();
    // `--resume "$CKPT"` with the variable unset would start from scratch and then overwrite the
    // checkpoint: an empty path is an error, never "not given".
    DPT_INPUT_CHECK(!value.empty(), "--" << f->name << ": empty path (an unset variable?)");
    // Paths are recorded in JSON (the configuration in checkpoints and the banner, evaluate's
    // --metrics), which holds only UTF-8: a name in another encoding (Latin-1's 0xFF) ended the
    // run with "unexpected failure: [json.exception.type_error.316] invalid UTF-8 byte", exit 3.
    try {
      (void)nlohmann::json(value).dump();
    } catch (const nlohmann::json::type_error&) {
      DPT_INPUT_CHECK(false, "--" << f->name << " " << printable(value, PATH_MAX)
                                  << ": the path is not valid UTF-8, and dptrain records paths "
                                  << "in JSON (checkpoints, --metrics): rename it, or reach it "
                                  << "through a symlink whose name is UTF-8");
    }
  }
  // The recipe's defaults need --model and --recipe; the flags they default follow them, so that
  // an explicit value wins.
  for (const Flag* f : taken)
    if (f->from != Default::kRecipe) assign(*f, r, cfg);
  apply_recipe(cfg);
  for (const Flag* f : taken)
    if (f->from == Default::kRecipe) assign(*f, r, cfg);
  return true;
}

std::string TrainConfig::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const Flag& f : flags())
    for (const JsonValue& v : f.json) j[v.key] = json_of(*this, v.field);
  return j.dump();
}

std::vector<std::pair<std::string, std::string>> agreed_values(const TrainConfig& cfg) {
  auto out = agreed_values(cfg.to_json());
  // Only whether they are given: each decides collectives (the resume broadcasts, the final
  // barrier, the trace gather); the paths themselves are rank 0's business.
  for (const Flag& f : flags())
    if (f.agreement == Agreement::kGiven)
      out.emplace_back("--" + f.name, (cfg.*std::get<std::string TrainConfig::*>(f.field)).empty()
                                          ? "(not given)"
                                          : "(given)");
  return out;
}

std::vector<std::pair<std::string, std::string>> agreed_values(const std::string& config_json) {
  const auto j = parse_metadata_json(config_json);  // a checkpoint's: its nesting bounded
  std::vector<std::pair<std::string, std::string>> out;
  for (const Flag& f : flags())
    if (agreed(f))
      for (const JsonValue& v : f.json)
        out.emplace_back(v.agreed_as, j.contains(v.key) ? j.at(v.key).dump() : "(not recorded)");
  return out;
}

bool may_change_on_resume(const std::string& flag) {
  // Outputs and checks, not the trajectory (the schedule depends on --epochs: kFixed); and
  // --device: a run may move to other hardware (the ranks of one job still agree on it).
  for (const Flag& f : flags())
    for (const JsonValue& v : f.json)
      if (v.agreed_as == flag)
        return f.agreement == Agreement::kResumable || f.agreement == Agreement::kGiven;
  return false;
}

}  // namespace dpt
