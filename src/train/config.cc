// Command-line flags (cxxopts), recipes and validation of TrainConfig. A recipe sets the defaults
// of the optimisation flags; a flag given explicitly always wins.
#include "dpt/config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cxxopts.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dpt/augment.h"
#include "dpt/dataset.h"
#include "dpt/error.h"
#include "dpt/reducer.h"

namespace dpt {

namespace {
// Values are converted here, so a value that does not parse is reported with its flag.
template <typename T>
T flag(const cxxopts::ParseResult& r, const char* name) {
  try {
    return r[name].as<T>();
  } catch (const std::exception& e) {
    throw Error(ErrorKind::kInput, std::string("--") + name + ": " + e.what());
  }
}
}  // namespace

void parse_checkpoint_every(const std::string& v, TrainConfig* c) {
  // A number, then an optional unit: epochs (the default), steps or minutes.
  size_t end = 0;
  double n = 0;
  try {
    n = std::stod(v, &end);
  } catch (const std::exception&) {
    end = 0;
  }
  std::string unit = v.substr(end);
  DPT_INPUT_CHECK(
      end > 0 && std::isfinite(n) && n >= 0,
      "--checkpoint-every: '" << v << "' is not N, Nepochs, Nsteps or Nmin with N >= 0");
  c->checkpoint_every = 0, c->checkpoint_every_steps = 0, c->checkpoint_every_minutes = 0;
  if (unit.empty() || unit == "epoch" || unit == "epochs" || unit == "steps" || unit == "step") {
    DPT_INPUT_CHECK(n == std::floor(n) && n <= 1e9,
                    "--checkpoint-every: '" << v << "': a whole number of "
                                            << (unit.rfind("step", 0) == 0 ? "steps" : "epochs"));
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

void apply_recipe(TrainConfig* c) {
  DPT_INPUT_CHECK(c->model == "lenet" || c->model == "resnet18",
                  "--model: unknown model '" << c->model << "' (lenet|resnet18)");
  if (c->recipe == "d2l") {
    // The seed chapter exactly: N(0, 0.01) weights, zero biases, plain SGD, constant rate.
    c->init = "d2l";
    c->lr = c->model == "lenet" ? 0.2 : 0.1;
    c->momentum = 0;
    c->weight_decay = 0;
    c->schedule = "constant";
    c->warmup_epochs = 0;
  } else if (c->recipe == "default") {
    // He init + SGD momentum 0.9, weight decay 5e-4, one warm-up epoch, cosine decay to 0.
    c->init = "kaiming";
    c->lr = c->model == "lenet" ? 0.05 : 0.1;
    c->momentum = 0.9;
    c->weight_decay = 5e-4;
    c->schedule = "cosine";
    c->warmup_epochs = 1;
  } else {
    throw Error(ErrorKind::kInput, "--recipe: unknown recipe '" + c->recipe + "' (default|d2l)");
  }
}

bool parse_config(int argc, char** argv, TrainConfig* cfg, std::string* help_text) {
  TrainConfig d;  // the built-in defaults shown in --help
  cxxopts::Options opts("dptrain",
                        "Data-parallel training of LeNet / ResNet-18 on Fashion-MNIST "
                        "(launch with mpirun or srun; one rank per GPU or CPU slot)");
  auto s = [](auto v) {
    std::ostringstream os;
    os << v;
    return os.str();
  };
  // clang-format off
  opts.add_options("Model and recipe")
    ("model", "lenet | resnet18", cxxopts::value<std::string>()->default_value(d.model))
    ("recipe", "default (He init, momentum 0.9, wd 5e-4, warm-up 1 epoch, cosine; lr 0.05 lenet, "
               "0.1 resnet18) | d2l (the seed: N(0,0.01) init, plain SGD, lr 0.2 lenet / 0.1 resnet18)",
     cxxopts::value<std::string>()->default_value(d.recipe))
    ("epochs", "Training epochs", cxxopts::value<int>()->default_value(s(d.epochs)))
    ("batch-size", "Global batch size (split evenly over ranks)",
     cxxopts::value<int64_t>()->default_value(s(d.batch_size)))
    ("lr", "Peak learning rate (default: from the recipe)", cxxopts::value<double>())
    ("momentum", "SGD momentum (default: from the recipe)", cxxopts::value<double>())
    ("weight-decay", "L2 weight decay (default: from the recipe)", cxxopts::value<double>())
    ("schedule", "constant | step | cosine (default: from the recipe)", cxxopts::value<std::string>())
    ("warmup-epochs", "Linear warm-up epochs (default: from the recipe)", cxxopts::value<double>())
    ("step-epochs", "Epochs at which schedule=step multiplies the rate by --step-gamma, e.g. 5,8",
     cxxopts::value<std::vector<int>>())
    ("step-gamma", "Factor of schedule=step", cxxopts::value<double>()->default_value(s(d.step_gamma)))
    ("init", "kaiming | d2l (default: from the recipe)", cxxopts::value<std::string>())
    ("seed", "Seed of initialisation and data order", cxxopts::value<uint64_t>()->default_value(s(d.seed)))
    ("scale-lr", "Linear scaling rule: lr *= batch/256, with at least 1 warm-up epoch");
  opts.add_options("Data and device")
    ("data", "Directory of the data set: IDX files (train-/t10k-images-idx3-ubyte[.gz] or -idx4-, "
             "...-labels-idx1-ubyte[.gz]), CIFAR-10/100 binary batches or NumPy .npy arrays (USAGE: \"Bring your "
             "own data\")", cxxopts::value<std::string>()->default_value(d.data))
    ("data-format", "auto (detected from the file names) | idx | cifar10 | cifar100 | npy",
     cxxopts::value<std::string>()->default_value(d.data_format))
    ("normalize", "none | auto (per-channel mean and std of the training set) | M1,..,Mc/S1,..,Sc: inputs "
                  "become (x/255 - mean) / std per channel; recorded in checkpoints and --save",
     cxxopts::value<std::string>()->default_value(d.normalize))
    ("augment", "none | a comma list of crop (random crop with zero padding of max(1, size/8) pixels: 4 for "
                "32x32), crop=P (padding P), flip (horizontal, p = 1/2); every draw a function of "
                "(seed, epoch, image), so results do not depend on the rank count",
     cxxopts::value<std::string>()->default_value(d.augment))
    ("device", "auto (cuda when every rank sees a CUDA device, else cpu) | cpu | cuda: one GPU per rank, "
               "by local rank", cxxopts::value<std::string>()->default_value(d.device))
    ("tf32", "Let cuBLAS/cuDNN use TF32 tensor cores for fp32 products on the GPU: faster, with 10-bit "
             "mantissa products (off: results agree with the CPU to fp32 rounding)")
    ("precision", "fp32 | bf16: Linear GEMMs on bf16 operands and convolutions on bf16 (CPU, which needs "
                  "AVX512-BF16 or AMX-BF16) or TF32 (GPU) operands, fp32 accumulation; master weights, the "
                  "gradient buffers, the optimizer and the all-reduce stay fp32",
     cxxopts::value<std::string>()->default_value(d.precision))
    ("activation-dtype", "auto | fp32 | bf16: the type activations and their gradients are stored in between "
                         "layers (bf16: rounded to bfloat16 after every layer, as PyTorch autocast stores them; "
                         "parameters, gradients, BatchNorm statistics and the loss stay fp32); auto is fp32 for now",
     cxxopts::value<std::string>()->default_value(d.activation_dtype))
    ("no-cuda-graphs", "On the GPU, launch every kernel of every step instead of replaying warm steps and "
                       "evaluations as CUDA graphs (same results; for profiling)")
    ("threads", "Compute threads per rank", cxxopts::value<int>()->default_value(s(d.threads)))
    ("max-steps", "At most N training steps per epoch (0 = all)",
     cxxopts::value<int64_t>()->default_value(s(d.max_steps)))
    ("eval-batch-size", "Batch size of evaluation", cxxopts::value<int64_t>()->default_value(s(d.eval_batch_size)))
    ("eval-every", "Evaluate every N epochs and after the last one (0 = never: speed runs)",
     cxxopts::value<int>()->default_value(s(d.eval_every)));
  opts.add_options("Data parallelism")
    ("bucket-mb", "Gradient bucket cap in MiB (the first bucket is capped at 1 MiB)",
     cxxopts::value<double>()->default_value(s(d.bucket_mb)))
    ("last-bucket-mb", "Cap in MiB of a separate last bucket for the first layers' gradients, which "
     "backward produces last (0 = none; at most a quarter of all gradients)",
     cxxopts::value<double>()->default_value(s(d.last_bucket_mb)))
    ("no-overlap", "All-reduce after backward instead of during it")
    ("grad-dtype", "fp32 | bf16 | fp16: the type gradient buckets travel in (half the bytes in 16 bits; "
                   "summed in float, rounded per partial sum; master weights and the optimizer stay fp32)",
     cxxopts::value<std::string>()->default_value(d.grad_dtype))
    ("accum-steps", "Gradient accumulation micro-steps per optimizer step",
     cxxopts::value<int>()->default_value(s(d.accum_steps)))
    ("sync-bn", "Share BatchNorm batch statistics across ranks")
    ("clip-grad-norm", "Scale the all-reduced gradients down to this global L2 norm when above it, as "
     "torch.nn.utils.clip_grad_norm_ (0 = off)", cxxopts::value<double>()->default_value(s(d.clip_grad_norm)))
    ("nonfinite", "A step whose gradients are not finite (NaN/Inf) is never applied; then: stop (name the "
     "step and the tensor, exit 2) | skip (go on; stop after --nonfinite-max-skips such steps)",
     cxxopts::value<std::string>()->default_value(d.nonfinite))
    ("nonfinite-max-skips", "With --nonfinite skip: stop at the step that would skip more than N in all",
     cxxopts::value<int64_t>()->default_value(s(d.nonfinite_max_skips)))
    ("verify-every", "Compare parameter checksums across ranks every N steps (0 = never)",
     cxxopts::value<int64_t>()->default_value(s(d.verify_every)))
    ("timeout", "Seconds a collective may take before every rank stops (0 = never)",
     cxxopts::value<double>()->default_value(s(d.timeout)));
  opts.add_options("Output")
    ("metrics", "Write one JSON line per epoch to FILE", cxxopts::value<std::string>())
    ("save", "Write parameters and buffers to FILE (safetensors) at the end", cxxopts::value<std::string>())
    ("checkpoint-every", "Write a training checkpoint every N epochs (N or Nepochs), N steps (Nsteps) or N "
     "minutes (Nmin, decided by rank 0's clock); 0 = never", cxxopts::value<std::string>()->default_value("0"))
    ("keep-checkpoints", "Name checkpoints by their step beside --checkpoint-path (stem.stepN.ext) and keep "
     "the newest K (0 = one file at --checkpoint-path, replaced each time)",
     cxxopts::value<int>()->default_value(s(d.keep_checkpoints)))
    ("checkpoint-path", "Where training checkpoints go (replaced atomically each time)",
     cxxopts::value<std::string>()->default_value(d.checkpoint_path))
    ("resume", "Continue training from a checkpoint FILE (parameters, buffers, optimizer, position)",
     cxxopts::value<std::string>())
    ("allow-config-change", "Let --resume continue with training settings other than the checkpoint's "
     "(refused otherwise); the position in the epoch is recomputed for a new batch or accumulation")
    ("metrics-every", "Also write a per-step record to --metrics every N steps (0 = never)",
     cxxopts::value<int64_t>()->default_value(s(d.metrics_every)))
    ("report", "Learning-curve SVG, rewritten after every epoch (open it in a browser)",
     cxxopts::value<std::string>())
    ("trace", "Chrome-trace/Perfetto timeline JSON of --trace-steps, all ranks", cxxopts::value<std::string>())
    ("trace-steps", "Window A:B of global steps the trace covers",
     cxxopts::value<std::string>()->default_value(std::to_string(d.trace_begin) + ":" + std::to_string(d.trace_end)))
    ("log-level", "error | warn | info | debug", cxxopts::value<std::string>()->default_value(d.log_level))
    ("quiet", "Print only errors and the final line")
    ("progress", "Progress bar on rank 0: auto (when stderr, or launch/mpirun.sh's, is a terminal) | on | off",
     cxxopts::value<std::string>()->default_value(d.progress))
    ("h,help", "Print this help");
  // clang-format on
  cxxopts::ParseResult r;
  try {
    r = opts.parse(argc, argv);
  } catch (const std::exception& e) {
    // cxxopts converts typed values while parsing and names only the value ("Argument 'nan' failed
    // to parse"): find the flag it was given to, so the message says which one.
    const std::string what = e.what(), open = "\u2018", close = "\u2019";
    const size_t a = what.find(open),
                 b = a == std::string::npos ? a : what.find(close, a + open.size());
    if (b != std::string::npos) {
      const std::string value = what.substr(a + open.size(), b - a - open.size());
      for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        const size_t eq = arg.find('=');
        std::string flag;
        if (arg.rfind("--", 0) == 0 && eq != std::string::npos && arg.substr(eq + 1) == value)
          flag = arg.substr(0, eq);
        if (arg == value && i > 1 && std::string(argv[i - 1]).rfind("--", 0) == 0)
          flag = argv[i - 1];
        if (!flag.empty())
          throw Error(ErrorKind::kInput,
                      flag + ": '" + value + "' is not a valid value (see dptrain --help)");
      }
    }
    throw Error(ErrorKind::kInput, what + " (see dptrain --help)");
  }
  if (r.count("help")) {
    *help_text = opts.help();
    return false;
  }
  DPT_INPUT_CHECK(r.unmatched().empty(),
                  "unexpected argument '" << r.unmatched()[0] << "' (see dptrain --help)");
  // `--resume "$CKPT"` with the variable unset would start from scratch and then overwrite the
  // checkpoint: an empty path is an error, never "not given".
  for (const char* path_flag :
       {"data", "metrics", "save", "checkpoint-path", "resume", "report", "trace"})
    DPT_INPUT_CHECK(!r.count(path_flag) || !r[path_flag].as<std::string>().empty(),
                    "--" << path_flag << ": empty path (an unset variable?)");
  {
    cfg->model = flag<std::string>(r, "model");
    cfg->recipe = flag<std::string>(r, "recipe");
    apply_recipe(cfg);
    cfg->epochs = flag<int>(r, "epochs");
    cfg->batch_size = flag<int64_t>(r, "batch-size");
    if (r.count("lr")) cfg->lr = flag<double>(r, "lr");
    if (r.count("momentum")) cfg->momentum = flag<double>(r, "momentum");
    if (r.count("weight-decay")) cfg->weight_decay = flag<double>(r, "weight-decay");
    if (r.count("schedule")) cfg->schedule = flag<std::string>(r, "schedule");
    if (r.count("warmup-epochs")) cfg->warmup_epochs = flag<double>(r, "warmup-epochs");
    if (r.count("step-epochs")) cfg->step_epochs = flag<std::vector<int>>(r, "step-epochs");
    cfg->step_gamma = flag<double>(r, "step-gamma");
    if (r.count("init")) cfg->init = flag<std::string>(r, "init");
    cfg->seed = flag<uint64_t>(r, "seed");
    cfg->scale_lr = r.count("scale-lr") > 0;
    cfg->data = flag<std::string>(r, "data");
    cfg->data_format = flag<std::string>(r, "data-format");
    cfg->normalize = flag<std::string>(r, "normalize");
    cfg->augment = flag<std::string>(r, "augment");
    cfg->device = flag<std::string>(r, "device");
    cfg->tf32 = r.count("tf32") > 0;
    cfg->cuda_graphs = r.count("no-cuda-graphs") == 0;
    cfg->precision = flag<std::string>(r, "precision");
    cfg->activation_dtype = flag<std::string>(r, "activation-dtype");
    cfg->threads = flag<int>(r, "threads");
    cfg->max_steps = flag<int64_t>(r, "max-steps");
    cfg->eval_batch_size = flag<int64_t>(r, "eval-batch-size");
    cfg->eval_every = flag<int>(r, "eval-every");
    cfg->bucket_mb = flag<double>(r, "bucket-mb");
    cfg->last_bucket_mb = flag<double>(r, "last-bucket-mb");
    cfg->grad_dtype = flag<std::string>(r, "grad-dtype");
    cfg->overlap = r.count("no-overlap") == 0;
    cfg->accum_steps = flag<int>(r, "accum-steps");
    cfg->sync_bn = r.count("sync-bn") > 0;
    cfg->clip_grad_norm = flag<double>(r, "clip-grad-norm");
    cfg->nonfinite = flag<std::string>(r, "nonfinite");
    cfg->nonfinite_max_skips = flag<int64_t>(r, "nonfinite-max-skips");
    cfg->verify_every = flag<int64_t>(r, "verify-every");
    cfg->timeout = flag<double>(r, "timeout");
    if (r.count("metrics")) cfg->metrics = flag<std::string>(r, "metrics");
    if (r.count("save")) cfg->save = flag<std::string>(r, "save");
    parse_checkpoint_every(flag<std::string>(r, "checkpoint-every"), cfg);
    cfg->keep_checkpoints = flag<int>(r, "keep-checkpoints");
    cfg->checkpoint_path = flag<std::string>(r, "checkpoint-path");
    if (r.count("resume")) cfg->resume = flag<std::string>(r, "resume");
    cfg->allow_config_change = r.count("allow-config-change") > 0;
    cfg->log_level = flag<std::string>(r, "log-level");
    cfg->quiet = r.count("quiet") > 0;
    cfg->progress = flag<std::string>(r, "progress");
    cfg->metrics_every = flag<int64_t>(r, "metrics-every");
    if (r.count("report")) cfg->report = flag<std::string>(r, "report");
    if (r.count("trace")) cfg->trace = flag<std::string>(r, "trace");
    const std::string window = flag<std::string>(r, "trace-steps");
    long long a = -1, b = -1;
    char tail = 0;
    DPT_INPUT_CHECK(std::sscanf(window.c_str(), "%lld:%lld%c", &a, &b, &tail) == 2,
                    "--trace-steps: '" << window << "' is not A:B");
    cfg->trace_begin = a;
    cfg->trace_end = b;
  }
  return true;
}

namespace {
// Whether two paths name the same file (as they would be resolved; neither needs to exist).
bool same_file(const std::string& a, const std::string& b) {
  std::error_code ea, eb;
  const auto pa = std::filesystem::weakly_canonical(a, ea),
             pb = std::filesystem::weakly_canonical(b, eb);
  return ea || eb ? a == b : pa == pb;
}
}  // namespace

void validate_config(const TrainConfig& c, int world) {
  // A --save file (parameters only) written over a training checkpoint would end every later
  // resume.
  DPT_INPUT_CHECK(
      c.save.empty() || !c.checkpoints() || !same_file(c.save, c.checkpoint_path),
      "--save " << c.save
                << " names the training checkpoint (--checkpoint-path): choose another file");
  DPT_INPUT_CHECK(
      c.save.empty() || c.resume.empty() || !same_file(c.save, c.resume),
      "--save " << c.save << " names the checkpoint being resumed (--resume): choose another file");
  DPT_INPUT_CHECK(c.model == "lenet" || c.model == "resnet18",
                  "--model: unknown model '" << c.model << "' (lenet|resnet18)");
  DPT_INPUT_CHECK(c.epochs >= 1, "--epochs must be >= 1, got " << c.epochs);
  DPT_INPUT_CHECK(c.batch_size >= 1, "--batch-size must be >= 1, got " << c.batch_size);
  DPT_INPUT_CHECK(std::isfinite(c.lr) && c.lr > 0, "--lr must be > 0, got " << c.lr);
  DPT_INPUT_CHECK(c.momentum >= 0 && c.momentum < 1,
                  "--momentum must be in [0, 1), got " << c.momentum);
  DPT_INPUT_CHECK(c.weight_decay >= 0, "--weight-decay must be >= 0, got " << c.weight_decay);
  DPT_INPUT_CHECK(c.schedule == "constant" || c.schedule == "step" || c.schedule == "cosine",
                  "--schedule: '" << c.schedule << "' is not constant|step|cosine");
  DPT_INPUT_CHECK(c.warmup_epochs >= 0, "--warmup-epochs must be >= 0, got " << c.warmup_epochs);
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
  DPT_INPUT_CHECK(c.threads >= 1 && c.threads <= 1024,
                  "--threads must be in 1..1024, got " << c.threads);
  DPT_INPUT_CHECK(c.max_steps >= 0, "--max-steps must be >= 0, got " << c.max_steps);
  DPT_INPUT_CHECK(c.eval_batch_size >= 1,
                  "--eval-batch-size must be >= 1, got " << c.eval_batch_size);
  DPT_INPUT_CHECK(c.eval_every >= 0, "--eval-every must be >= 0, got " << c.eval_every);
  DPT_INPUT_CHECK(std::isfinite(c.bucket_mb) && c.bucket_mb > 0,
                  "--bucket-mb must be > 0, got " << c.bucket_mb);
  (void)grad_wire_dtype(c.grad_dtype);  // names the flag and the value when it is none of the three
  DPT_INPUT_CHECK(std::isfinite(c.last_bucket_mb) && c.last_bucket_mb >= 0,
                  "--last-bucket-mb must be >= 0, got " << c.last_bucket_mb);
  DPT_INPUT_CHECK(c.accum_steps >= 1, "--accum-steps must be >= 1, got " << c.accum_steps);
  DPT_INPUT_CHECK(std::isfinite(c.clip_grad_norm) && c.clip_grad_norm >= 0,
                  "--clip-grad-norm must be >= 0 (0 = off), got " << c.clip_grad_norm);
  DPT_INPUT_CHECK(c.nonfinite == "stop" || c.nonfinite == "skip",
                  "--nonfinite must be stop or skip, got '" << c.nonfinite << "'");
  DPT_INPUT_CHECK(c.nonfinite_max_skips >= 0,
                  "--nonfinite-max-skips must be >= 0, got " << c.nonfinite_max_skips);
  DPT_INPUT_CHECK(c.verify_every >= 0, "--verify-every must be >= 0, got " << c.verify_every);
  DPT_INPUT_CHECK(c.timeout >= 0, "--timeout must be >= 0, got " << c.timeout);
  DPT_INPUT_CHECK(c.checkpoint_every >= 0,
                  "--checkpoint-every must be >= 0, got " << c.checkpoint_every);
  DPT_INPUT_CHECK(c.keep_checkpoints >= 0,
                  "--keep-checkpoints must be >= 0, got " << c.keep_checkpoints);
  DPT_INPUT_CHECK(!c.checkpoint_path.empty(), "--checkpoint-path must not be empty");
  DPT_INPUT_CHECK(c.progress == "auto" || c.progress == "on" || c.progress == "off",
                  "--progress: '" << c.progress << "' is not auto|on|off");
  DPT_INPUT_CHECK(c.metrics_every >= 0, "--metrics-every must be >= 0, got " << c.metrics_every);
  DPT_INPUT_CHECK(c.trace_begin >= 0 && c.trace_end > c.trace_begin,
                  "--trace-steps: need 0 <= A < B, got " << c.trace_begin << ":" << c.trace_end);
  DPT_INPUT_CHECK(c.batch_size % world == 0,
                  "--batch-size " << c.batch_size << " is not divisible by the world size " << world
                                  << " (each rank takes batch/world images a step)");
}

std::string TrainConfig::to_json() const {
  nlohmann::json j = {
      {"model", model},
      {"recipe", recipe},
      {"epochs", epochs},
      {"batch_size", batch_size},
      {"lr", lr},
      {"momentum", momentum},
      {"weight_decay", weight_decay},
      {"schedule", schedule},
      {"warmup_epochs", warmup_epochs},
      {"step_epochs", step_epochs},
      {"step_gamma", step_gamma},
      {"init", init},
      {"seed", seed},
      {"data", data},
      {"data_format", data_format},
      {"normalize", normalize},
      {"augment", augment},
      {"device", device},
      {"tf32", tf32},
      {"cuda_graphs", cuda_graphs},
      {"precision", precision},
      {"activation_dtype", activation_dtype},
      {"threads", threads},
      {"max_steps", max_steps},
      {"eval_batch_size", eval_batch_size},
      {"eval_every", eval_every},
      {"metrics", metrics},
      {"save", save},
      {"checkpoint_every", checkpoint_every},
      {"checkpoint_every_steps", checkpoint_every_steps},
      {"checkpoint_every_minutes", checkpoint_every_minutes},
      {"keep_checkpoints", keep_checkpoints},
      {"checkpoint_path", checkpoint_path},
      {"resume", resume},
      {"allow_config_change", allow_config_change},
      {"bucket_mb", bucket_mb},
      {"last_bucket_mb", last_bucket_mb},
      {"grad_dtype", grad_dtype},
      {"overlap", overlap},
      {"accum_steps", accum_steps},
      {"clip_grad_norm", clip_grad_norm},
      {"nonfinite", nonfinite},
      {"nonfinite_max_skips", nonfinite_max_skips},
      {"sync_bn", sync_bn},
      {"scale_lr", scale_lr},
      {"verify_every", verify_every},
      {"timeout", timeout},
      {"log_level", log_level},
      {"quiet", quiet},
      {"progress", progress},
      {"metrics_every", metrics_every},
      {"report", report},
      {"trace", trace},
      {"trace_steps", std::to_string(trace_begin) + ":" + std::to_string(trace_end)}};
  return j.dump();
}

std::vector<std::pair<std::string, std::string>> agreed_values(const TrainConfig& cfg) {
  auto out = agreed_values(cfg.to_json());
  // Only whether they are given: each decides collectives (the resume broadcasts, the final
  // barrier, the trace gather); the paths themselves are rank 0's business.
  for (const auto& [flag, value] :
       {std::pair<const char*, const std::string*>{"--resume", &cfg.resume},
        {"--save", &cfg.save},
        {"--trace", &cfg.trace}})
    out.emplace_back(flag, value->empty() ? "(not given)" : "(given)");
  return out;
}

std::vector<std::pair<std::string, std::string>> agreed_values(const std::string& config_json) {
  static const char* const kKeys[] = {"model",
                                      "recipe",
                                      "epochs",
                                      "batch_size",
                                      "lr",
                                      "momentum",
                                      "weight_decay",
                                      "schedule",
                                      "warmup_epochs",
                                      "step_epochs",
                                      "step_gamma",
                                      "init",
                                      "seed",
                                      "device",
                                      "tf32",
                                      "cuda_graphs",
                                      "precision",
                                      "activation_dtype",
                                      "max_steps",
                                      "eval_batch_size",
                                      "eval_every",
                                      "checkpoint_every",
                                      "checkpoint_every_steps",
                                      "checkpoint_every_minutes",
                                      "bucket_mb",
                                      "last_bucket_mb",
                                      "grad_dtype",
                                      "accum_steps",
                                      "sync_bn",
                                      "scale_lr",
                                      "verify_every",
                                      "metrics_every",
                                      "trace_steps",
                                      "clip_grad_norm",
                                      "nonfinite",
                                      "nonfinite_max_skips",
                                      "data_format",
                                      "normalize",
                                      "augment"};
  const auto j = nlohmann::json::parse(config_json);
  std::vector<std::pair<std::string, std::string>> out;
  for (const char* key : kKeys) {
    std::string flag =
        std::string("--") + (std::string(key) == "cuda_graphs" ? "no_cuda_graphs" : key);
    std::replace(flag.begin(), flag.end(), '_', '-');
    out.emplace_back(flag, j.contains(key) ? j.at(key).dump() : "(not recorded)");
  }
  return out;
}

bool may_change_on_resume(const std::string& flag) {
  // Outputs and checks, not the trajectory (the schedule depends on --epochs: not listed here);
  // and --device: a run may move to other hardware (the ranks of one job still agree on it).
  static const char* const kFree[] = {"--eval-batch-size",
                                      "--eval-every",
                                      "--checkpoint-every",
                                      "--checkpoint-every-steps",
                                      "--checkpoint-every-minutes",
                                      "--verify-every",
                                      "--metrics-every",
                                      "--trace-steps",
                                      "--resume",
                                      "--save",
                                      "--trace",
                                      "--no-cuda-graphs",
                                      "--bucket-mb",
                                      "--last-bucket-mb",
                                      "--nonfinite",
                                      "--nonfinite-max-skips",
                                      "--device"};
  return std::find(std::begin(kFree), std::end(kFree), flag) != std::end(kFree);
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
