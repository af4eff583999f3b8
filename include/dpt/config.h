// The training configuration: TrainConfig (a field for every flag of the table in flags.h, with
// recipes' defaults), parsing and validation, and the values every rank must agree on.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dpt/dtype.h"

namespace dpt {

struct TrainConfig {
  // train | evaluate | predict: the first word of the command line (train when none is given); not
  // a flag, so not recorded; main compares it across ranks before anything else (exit 2 when the
  // ranks were started with different commands).
  std::string command = "train";
  std::string model = "lenet";
  std::string stem = "auto";        // auto | imagenet | cifar (models.h: torchvision's ResNets)
  bool zero_init_residual = false;  // each residual block's last BatchNorm weight starts at 0
  std::string recipe = "default";
  int epochs = 10;
  int64_t batch_size = 256;  // global, over all ranks
  double lr = 0.05;
  std::string optimizer = "sgd";  // sgd | adamw (optimizer.h)
  double momentum = 0.9;          // SGD's
  double weight_decay = 5e-4;     // SGD: L2, added to the gradient; AdamW: decoupled
  bool nesterov = false;          // SGD: Nesterov momentum (torch.optim.SGD nesterov=True)
  std::vector<double> betas = {0.9, 0.999};  // AdamW's moment coefficients
  double eps = 1e-8;                         // AdamW's denominator term
  bool no_decay_bn_bias = false;    // no weight decay on 1-D parameters (BatchNorm, biases)
  double label_smoothing = 0;       // CrossEntropyLoss(label_smoothing=E) of the training loss
  std::string schedule = "cosine";  // constant | step | cosine
  double warmup_epochs = 1;
  std::vector<int> step_epochs;  // for schedule=step: multiply by step_gamma at these epochs
  double step_gamma = 0.1;
  std::string init = "kaiming";  // kaiming | d2l
  uint64_t seed = 42;
  std::string data = "/usr/share/datasets/fashion-mnist";
  std::string data_format = "auto";  // auto | idx | cifar10 | cifar100 | npy (dataset.h)
  std::string normalize = "none";  // none | auto | M1,..,Mc/S1,..,Sc: per-channel (x - mean) / std
  std::string augment = "none";    // none | a comma list of crop, crop=P, flip (augment.h)
  std::string device = "auto";     // auto | cpu | cuda
  bool tf32 = false;               // allow TF32 tensor cores in cuBLAS/cuDNN (GPU only)
  bool cudnn_nondeterministic = false;  // let cuDNN's non-deterministic engines compete (GPU only)
  bool cuda_graphs = true;  // replay warm steps and evaluations as CUDA graphs (GPU only)
  std::string precision =
      "fp32";  // fp32 | bf16 (bf16 GEMM operands; convolutions: bf16 on the CPU, TF32 on the GPU)
  // auto | fp32 | bf16: the element type of activations and their gradients
  // (Model::set_activation_dtype); auto: see activation_dtype() below.
  std::string activation_dtype = "auto";
  int threads = 1;
  int64_t max_steps = 0;  // 0 = whole epoch
  int64_t eval_batch_size = 1000;
  int eval_every = 1;                   // evaluate every N epochs and after the last (0 = never)
  std::string metrics;                  // JSON lines file
  std::string save;                     // safetensors at the end
  int checkpoint_every = 0;             // epochs between training checkpoints (0 = none)
  int64_t checkpoint_every_steps = 0;   // --checkpoint-every Nsteps
  double checkpoint_every_minutes = 0;  // --checkpoint-every Nmin
  int keep_checkpoints = 0;  // > 0: files named by step beside --checkpoint-path, the newest K kept
  bool checkpoints() const {
    return checkpoint_every > 0 || checkpoint_every_steps > 0 || checkpoint_every_minutes > 0;
  }
  std::string checkpoint_path = "checkpoint.safetensors";
  std::string init_from;  // train: start from a saved model's parameters and buffers (fine-tuning)
  std::string load;       // evaluate, predict: the saved model (a --save file or a checkpoint)
  std::string output;     // predict: the CSV of each test image's top-k classes
  int top_k = 5;          // predict: classes per image (capped at the class count)
  std::string resume;  // training checkpoint to continue from; "auto": the newest valid one, if any
  bool allow_config_change = false;  // --resume may continue with other training settings
  double bucket_mb = 25;
  double last_bucket_mb = 0;        // 0 = no separate small last bucket
  std::string grad_dtype = "fp32";  // fp32 | bf16 | fp16: the type gradient buckets travel in
  bool overlap = true;
  int accum_steps = 1;
  double clip_grad_norm = 0;         // > 0: clip the global gradient norm (torch clip_grad_norm_)
  std::string nonfinite = "stop";    // stop | skip: what follows a step with non-finite gradients
  int64_t nonfinite_max_skips = 10;  // with skip: at most this many skipped steps in all
  bool sync_bn = false;
  bool scale_lr = false;
  int64_t verify_every = 0;
  double timeout = 300;
  std::string log_level = "info";
  bool quiet = false;
  std::string progress = "auto";            // auto | on | off: the per-epoch progress bar of rank 0
  int64_t metrics_every = 0;                // per-step metric records every N steps (0 = none)
  std::string report;                       // learning-curve SVG, rewritten every epoch
  std::string trace;                        // Chrome-trace JSON of a window of steps
  int64_t trace_begin = 2, trace_end = 12;  // --trace-steps A:B (global steps [A, B))

  std::string to_json() const;  // one line, every field (its keys: flags.h)
  std::string to_text() const;  // "key: value" lines for the start-up banner
};

// The values every rank must share, as (flag, value) pairs in the flag table's order (each flag's
// Agreement, flags.h): everything that shapes the training (model, recipe, optimiser, schedule,
// batch, accumulation, epochs, steps, seed, numerics, buckets, --device as given) or decides which
// collectives a rank issues (evaluation, checkpoints, step metrics, replica checks, and whether
// --resume, --save and --trace are given). Paths, threads, logging and --timeout may differ; the
// data files are compared by digest instead.
std::vector<std::pair<std::string, std::string>> agreed_values(const TrainConfig& cfg);
// The same values (without the three "given" ones) from a configuration's JSON (a checkpoint's
// metadata); keys it lacks read "(not recorded)". Throws on malformed JSON.
std::vector<std::pair<std::string, std::string>> agreed_values(const std::string& config_json);
// Of those, the ones a resumed run may change without changing the trajectory it continues
// (Agreement::kResumable and kGiven).
bool may_change_on_resume(const std::string& flag);
// --activation-dtype resolved: DType::kBF16 or kF32. auto is bf16 under --precision bf16 on a
// device whose convolutions take bf16 natively (`device_bf16_fast`: ComputeDevice::
// fast_bf16_activations: the CPU's bf16 backend, the GPU on cuDNN's graph API), else fp32 (the
// legacy cuDNN API gains nothing from them: H200, 2026-11-26, ResNet-18 2.40 against 2.18
// s/epoch; on the graph API 1.49). A resume refines auto to the checkpoint's type (preflight.cc).
DType activation_dtype(const TrainConfig& cfg, bool device_bf16_fast = false);

// --optimizer adamw's defaults under every recipe (torch.optim.AdamW's): the recipes' rates and
// weight decays are SGD's. An explicit --lr or --weight-decay wins.
inline constexpr double kAdamWDefaultLr = 1e-3, kAdamWDefaultWeightDecay = 0.01;

// Parses argv (cxxopts): an optional command word first (train, evaluate, predict: cfg->command),
// then the flags the command takes (the flag table's `commands`; a flag of another command is an
// input error naming it and the command); the recipe sets defaults, explicit flags override them;
// bad values are input errors naming the flag. Returns false when --help was printed (exit 0).
bool parse_config(int argc, char** argv, TrainConfig* cfg, std::string* help_text);
// --timeout as argv gives it, read before MPI starts (parse_config runs after, once the ranks can
// agree on a flag error): what bounds MPI_Init (MpiSession). The default where it is absent, and
// where its value is not a number in [0, kMaxTimeoutSeconds] (parse_config then names the error).
double early_timeout(int argc, char** argv);
// --checkpoint-every's value: N or Nepochs, Nsteps, Nmin (input error naming the flag otherwise).
void parse_checkpoint_every(const std::string& value, TrainConfig* cfg);
// Applies recipe defaults for cfg.model/cfg.recipe (used by parse_config and by tests): the
// model's learning rate for the recipe (models.h), the recipe's other settings.
void apply_recipe(TrainConfig* cfg);
// --recipe's help: each recipe's settings, with its learning rate for each model.
std::string recipe_help();
// Checks ranges and the world size (batch divisible by it); throws input errors naming the flag.
void validate_config(const TrainConfig& cfg, int world_size);

}  // namespace dpt
