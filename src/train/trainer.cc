// The training loop. It reads like single-device training: the DataParallel wrapper hides the
// ranks (broadcast, bucketed all-reduce during backward, BatchNorm buffer averaging). Each rank
// trains on its shard of every global batch; evaluation is split across ranks and reduced. The
// compute of a step is the StepEngine (engine.h), written once over the Backend operations.
#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <map>
#include <memory>
#include <set>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <signal.h>
#include <unistd.h>

#include "dpt/backend.h"
#include "dpt/checkpoint.h"
#include "dpt/comm.h"
#include "dpt/ddp.h"
#include "dpt/device.h"
#include "dpt/engine.h"
#include "dpt/error.h"
#include "dpt/idx.h"
#include "dpt/log.h"
#include "dpt/trace.h"
#include "dpt/train.h"

#if DPT_HAVE_CUDA
#include "cuda/gpu_setup.h"
#endif

namespace dpt {

namespace {

std::atomic<int> g_stop_signal{0};  // lock-free: also set from a signal handler
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }
constexpr std::array<int, 4> kStopSignals = {SIGINT, SIGTERM, SIGHUP, SIGUSR1};

sigset_t stop_signal_set() {
  sigset_t set;
  sigemptyset(&set);
  for (const int s : kStopSignals) sigaddset(&set, s);
  return set;
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One-line progress bar on a terminal (rank 0, stderr): step/steps, img/s, running loss, time left.
void draw_progress(int epoch, int epochs, int64_t done, int64_t total, double loss, double ips,
                   double elapsed) {
  const int width = 24;
  const int fill = static_cast<int>(width * done / std::max<int64_t>(total, 1));
  const double left = done > 0 ? elapsed * static_cast<double>(total - done) / static_cast<double>(done) : 0;
  std::fprintf(stderr, "\r\033[Kepoch %d/%d [%.*s%*s] %lld/%lld  %.0f img/s  loss %.4f  %.0f s left",
               epoch, epochs, fill, "########################", width - fill, "",
               static_cast<long long>(done), static_cast<long long>(total), ips, loss, left);
  std::fflush(stderr);
}

// Evaluation split across ranks (rank r scores eval_range), totals summed over all of them.
Totals evaluate(StepEngine& backend, Communicator& comm, int64_t test_n) {
  auto [begin, end] = eval_range(test_n, comm.rank(), comm.size());
  const Totals r = backend.evaluate(begin, end);
  double sums[3] = {r.loss, static_cast<double>(r.correct), static_cast<double>(r.count)};
  comm.allreduce(sums, 3, ReduceOp::kSum, "all-reduce of evaluation counts");
  return {sums[0], static_cast<int64_t>(sums[1]), static_cast<int64_t>(sums[2])};
}


// This rank's position among the ranks on its host (ranks are numbered host by host or not: the
// count of lower ranks with the same host name is the local rank either way).
int local_rank_of(const std::vector<std::string>& hosts, int rank) {
  int local = 0;
  for (int r = 0; r < rank; ++r)
    if (hosts[static_cast<size_t>(r)] == hosts[static_cast<size_t>(rank)]) ++local;
  return local;
}

// Runs fn and makes every rank agree on its input errors, so no rank waits in the next collective
// for one that gave up: when fn throws an input error on any rank, every rank throws
// AgreedInputError (exit 2, no MPI_Abort), the failing ranks with their message and the others
// quietly with `elsewhere`. Other errors propagate (and end the job through main's abort).
template <typename F>
void agree_on_input(Communicator& comm, const std::string& elsewhere, F&& fn) {
  std::string error;
  try {
    fn();
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kInput) throw;
    error = e.what();
  }
  int32_t failed = error.empty() ? 0 : 1;
  comm.allreduce(&failed, 1, ReduceOp::kSum, "all-reduce of the input-error flag");
  if (failed) throw AgreedInputError(error.empty() ? elsewhere : error, error.empty());
}

// "images 60000 of 28x28, checksum 0x...": a data set as every rank must see it.
std::string data_digest(const ImageSet& set) {
  std::ostringstream os;
  os << "images " << set.n << " of " << set.rows << "x" << set.cols << ", checksum 0x" << std::hex
     << checksum(set.labels.data(), set.labels.size(), checksum(set.images.data(), set.images.size()));
  return os.str();
}

// The lines of `text` ("flag<TAB>value" each).
std::vector<std::pair<std::string, std::string>> agreed_lines(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const size_t tab = line.find('\t');
    out.emplace_back(line.substr(0, tab), tab == std::string::npos ? "" : line.substr(tab + 1));
  }
  return out;
}

// Ranks started with different settings (an MPMD line, a stale copy of a job script) would train
// different things, or issue different collectives and hang: every rank compares every rank's
// agreed values and data digests, and a difference ends them all with exit 2 naming the flag and
// the ranks (rank 0 prints it).
void agree_on_config(const TrainConfig& cfg, Communicator& comm, const ImageSet& train, const ImageSet& test) {
  auto values = agreed_values(cfg);
  values.emplace_back("--data (training set)", data_digest(train));
  values.emplace_back("--data (test set)", data_digest(test));
  std::string mine;
  for (const auto& [flag, value] : values) mine += flag + "\t" + value + "\n";
  const std::vector<std::string> all = allgather_text(comm, mine);
  std::vector<std::vector<std::pair<std::string, std::string>>> lines;
  for (const std::string& text : all) lines.push_back(agreed_lines(text));
  for (size_t i = 0; i < lines[0].size(); ++i) {
    std::vector<std::pair<std::string, std::vector<int>>> ranks_of;  // value -> ranks, rank 0's first
    for (int r = 0; r < comm.size(); ++r) {
      const auto& l = lines[static_cast<size_t>(r)];
      const std::string v = i < l.size() && l[i].first == lines[0][i].first ? l[i].second : "(another dptrain version)";
      auto it = std::find_if(ranks_of.begin(), ranks_of.end(), [&](const auto& g) { return g.first == v; });
      if (it == ranks_of.end()) ranks_of.push_back({v, {r}}); else it->second.push_back(r);
    }
    if (ranks_of.size() == 1) continue;
    std::ostringstream os;
    os << "ranks were started with different " << lines[0][i].first << ":";
    for (const auto& [value, ranks] : ranks_of) {
      os << (ranks.size() == 1 ? " rank " : " ranks ");
      for (size_t k = 0; k < ranks.size(); ++k) os << (k ? "," : "") << ranks[k];
      os << " " << (ranks.size() == 1 ? "has " : "have ") << value << ";";
    }
    os << " every rank must be given the same training settings and data";
    throw AgreedInputError(os.str(), comm.rank() != 0);
  }
}

// Every file rank 0 will write can be written, checked before the first step instead of after
// hours of training: its directory exists and is writable, and the file, if there, is writable.
void preflight_outputs(const TrainConfig& cfg) {
  std::vector<std::pair<const char*, std::string>> outputs = {
      {"--metrics", cfg.metrics}, {"--save", cfg.save}, {"--report", cfg.report}, {"--trace", cfg.trace}};
  if (cfg.checkpoints()) outputs.push_back({"--checkpoint-path", cfg.checkpoint_path});
  for (const auto& [flag, path] : outputs) {
    if (path.empty()) continue;
    const std::filesystem::path p(path);
    const std::filesystem::path dir = p.has_parent_path() ? p.parent_path() : std::filesystem::path(".");
    std::error_code ec;
    DPT_INPUT_CHECK(std::filesystem::is_directory(dir, ec),
                    flag << " " << path << ": the directory " << dir.string() << " does not exist");
    DPT_INPUT_CHECK(access(dir.c_str(), W_OK) == 0,
                    flag << " " << path << ": the directory " << dir.string() << " is not writable");
    DPT_INPUT_CHECK(!std::filesystem::exists(p, ec) || access(p.c_str(), W_OK) == 0,
                    flag << " " << path << ": the file exists and is not writable");
    DPT_INPUT_CHECK(!std::filesystem::is_directory(p, ec), flag << " " << path << " is a directory, not a file");
  }
}

// Bytes one image costs in a training step (activations, their gradients, layer temporaries) and
// in an evaluation pass, measured on a probe model on the CPU: the growth of live tensor storage
// from batch 2 to batch 4, halved, so the fixed costs (parameters, plans) cancel.
std::pair<double, double> bytes_per_image(const std::string& name, int classes) {
  double per[2] = {0, 0};
  for (int train = 0; train < 2; ++train) {
    auto probe = make_model(name, classes, cpu_backend());
    int64_t live[2] = {0, 0};
    Tensor x, dl;
    for (int k = 0; k < 2; ++k) {
      const int64_t b = 2 + 2 * k;
      x.resize({b, 28, 28, 1});
      probe->forward(x, train ? Mode::kTrain : Mode::kEval);
      if (train) {
        dl.resize({b, classes});
        BackwardCtx ctx;
        probe->backward(dl, ctx);
      }
      live[k] = Tensor::live_bytes();
    }
    per[train] = static_cast<double>(live[1] - live[0]) / 2;
  }
  return {per[1], per[0]};
}

// The memory this host can still give: MemAvailable, or less under a cgroup (v2 or v1) limit.
double available_bytes() {
  double avail = -1;
  std::ifstream mi("/proc/meminfo");
  for (std::string key; mi >> key;) {
    double kb = 0;
    mi >> kb;
    mi.ignore(64, '\n');
    if (key == "MemAvailable:") avail = kb * 1024;
  }
  auto read_number = [](const char* path) {
    std::ifstream f(path);
    double v = -1;
    return (f >> v) ? v : -1.0;
  };
  for (const auto& [limit, usage] : {std::pair{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
                                     {"/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                      "/sys/fs/cgroup/memory/memory.usage_in_bytes"}}) {
    const double l = read_number(limit), u = read_number(usage);  // "max" reads as no number
    if (l > 0 && u >= 0 && l < 1e18 && (avail < 0 || l - u < avail)) avail = std::max(0.0, l - u);
  }
  return avail;
}

// A batch too large for the host ends in a bare SIGKILL from the kernel hours later (and one too
// large for a GPU in cudaErrorMemoryAllocation mid-step): refuse it now, with the estimate.
// `avail` is what `where` can still give, shared by `sharing` ranks; `extra` is what the run will
// still load there besides the per-image part (nothing on the host, whose MemAvailable already
// lacks what is loaded).
void check_memory(const TrainConfig& cfg, int world, int classes, int sharing, int64_t test_n, double avail,
                  double extra, const std::string& where) {
  if (avail < 0) return;  // no /proc/meminfo: nothing to compare with
  const auto [train, eval] = bytes_per_image(cfg.model, classes);
  const double local = static_cast<double>(cfg.batch_size / world);
  const double eval_batch = static_cast<double>(std::min(cfg.eval_batch_size, std::max<int64_t>(test_n, 1)));
  const double per_rank = std::max(train * local, eval * eval_batch) + extra;
  const double need = per_rank * sharing;
  auto gib = [](double b) { return DPT_MSG(std::fixed << std::setprecision(1) << b / (1 << 30)); };
  auto mib = [](double b) { return DPT_MSG(std::fixed << std::setprecision(2) << b / (1 << 20)); };
  DPT_INPUT_CHECK(need <= avail,
                  "--batch-size " << cfg.batch_size << ": training needs about " << gib(need) << " GiB more memory "
                                  << where << " (" << sharing << " rank(s) x " << gib(per_rank) << " GiB: " << mib(train)
                                  << " MiB per image of a training step x " << cfg.batch_size / world << ", or "
                                  << mib(eval) << " MiB per image of evaluation x " << eval_batch
                                  << (extra > 0 ? DPT_MSG(", + " << gib(extra) << " GiB of parameters, data and cuDNN scratch")
                                                : std::string())
                                  << "), but " << gib(avail) << " GiB is available; use a smaller --batch-size or "
                                  << "--eval-batch-size, or fewer ranks per " << (extra > 0 ? "GPU" : "host"));
  log_debug(DPT_MSG("memory estimate " << where << ": " << gib(need) << " GiB of " << gib(avail) << " GiB available"));
}

// --device for every rank alike: an unusable --device cuda on any rank ends all of them (exit 2,
// the failing ranks say why); auto picks cuda only when every rank sees a device, since CPU and GPU
// ranks cannot share one all-reduce.
std::string agree_on_device(const TrainConfig& cfg, Communicator& comm, int local_rank) {
  std::string device;
  agree_on_input(comm, "--device cuda: another rank has no CUDA device visible",
                 [&] { device = resolve_device(cfg.device, local_rank); });
  int32_t cuda = device == "cuda" ? 1 : 0;
  comm.allreduce(&cuda, 1, ReduceOp::kSum, "all-reduce of the device choice");
  if (device == "cuda" && cuda < comm.size()) {
    if (comm.rank() == 0)
      log_warn(DPT_MSG("--device auto: only " << cuda << " of " << comm.size()
                                              << " ranks see a CUDA device; every rank uses the CPU"));
    device = "cpu";
  }
  if (device == "cpu" && cfg.tf32 && comm.rank() == 0) log_warn("--tf32 has no effect on the CPU");
  if (device == "cpu" && cfg.precision != "fp32" && comm.rank() == 0)
    log_warn("--precision " + cfg.precision + " applies to the GPU only: the CPU trains in fp32");
  return device;
}

// The signals that stop training at the next step boundary with a checkpoint: INT (a terminal),
// TERM (kill, timeout, scancel), HUP (a closed terminal) and USR1, which mpirun forwards to every
// rank on every host while it would answer TERM/INT itself by killing the ranks after 1 s:
// launch/mpirun.sh turns the signals it receives into USR1 for that reason, and the Slurm script
// asks for USR1 before the time limit.
// They are never delivered asynchronously to a thread that computes: a signal frame pushed onto a
// thread inside oneDNN's JIT sgemm corrupted the heap (2 of 6 ResNet-18 runs stopped under load
// crashed in free() inside dnnl_sgemm, in forward and backward alike). main blocks them before MPI
// starts any thread (block_stop_signals), so every thread inherits the mask, and one watcher
// thread takes them with sigtimedwait. A signal that came during set-up is pending until then and
// ends in the agreed stop at the first boundary. The handlers stay installed for a thread that
// did not inherit the mask (run_training called from elsewhere).
class StopSignals {
 public:
  StopSignals() {
    g_stop_signal = 0;
    for (size_t i = 0; i < kStopSignals.size(); ++i) old_[i] = std::signal(kStopSignals[i], on_stop_signal);
    block_stop_signals();
    watcher_ = std::thread([this] {
      const sigset_t set = stop_signal_set();
      const timespec poll{0, 100'000'000};  // how soon the watcher sees that training ended
      while (!done_) {
        const int sig = sigtimedwait(&set, nullptr, &poll);
        if (sig > 0) g_stop_signal = sig;
      }
    });
  }
  ~StopSignals() {
    done_ = true;
    watcher_.join();
    for (size_t i = 0; i < kStopSignals.size(); ++i) std::signal(kStopSignals[i], old_[i]);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // The signal any rank received (0: none) and whether `due` holds on any rank, agreed by every
  // rank in one all-reduce (the step boundary's only collective).
  std::pair<int, bool> agreed(Communicator& comm, bool due) const {
    int32_t v[2] = {g_stop_signal, due ? 1 : 0};
    if (comm.size() > 1) comm.allreduce(v, 2, ReduceOp::kMax, "all-reduce of the stop flag");
    return {v[0], v[1] != 0};
  }

 private:
  std::array<void (*)(int), 4> old_{};
  std::atomic<bool> done_{false};
  std::thread watcher_;
};

// What follows a step whose all-reduced gradients were not finite (the backend did not apply it):
// --nonfinite stop ends the run naming the step and the first tensor; skip goes on, up to
// --nonfinite-max-skips such steps. Every rank sees the same sums (they are of the all-reduced
// gradients), so every rank decides alike without a collective.
class NonFiniteGuard {
 public:
  NonFiniteGuard(const TrainConfig& cfg, Communicator& comm, StepEngine& engine)
      : cfg_(cfg), comm_(comm), engine_(engine) {}
  // Step `step` (global) of epoch `epoch` (0-based) had the sum of squares `sumsq`.
  void check(double sumsq, int64_t step, int epoch) {
    if (std::isfinite(sumsq)) return;
    ++skipped_;
    if (cfg_.nonfinite == "skip" && skipped_ <= cfg_.nonfinite_max_skips) {
      if (comm_.rank() == 0)
        log_warn(DPT_MSG("step " << step + 1 << " (epoch " << epoch + 1 << "): the gradients are not finite; the step "
                                 << "was skipped (" << skipped_ << " of at most " << cfg_.nonfinite_max_skips << ")"));
      return;
    }
    const std::string tensor = engine_.first_nonfinite_gradient();
    std::ostringstream os;
    os << "step " << step + 1 << " (epoch " << epoch + 1 << "): the gradients are not finite"
       << (tensor.empty() ? "" : " (first: " + tensor + ")") << "; the step was not applied and training stops";
    if (cfg_.nonfinite == "skip") os << " after " << skipped_ - 1 << " skipped steps (--nonfinite-max-skips)";
    os << ". Nothing non-finite was saved" << (cfg_.checkpoints() ? "; the last checkpoint is kept" : "")
       << ". A smaller --lr, a longer --warmup-epochs or --clip-grad-norm may help";
    throw AgreedInputError(os.str(), comm_.rank() != 0);
  }
  int64_t skipped() const { return skipped_; }

 private:
  const TrainConfig& cfg_;
  Communicator& comm_;
  StepEngine& engine_;
  int64_t skipped_ = 0;
};

// The file of a checkpoint at `global_step`: --checkpoint-path itself, or with --keep-checkpoints
// "<stem>.step<N><ext>" beside it.
std::string checkpoint_file(const TrainConfig& cfg, int64_t global_step) {
  if (cfg.keep_checkpoints == 0) return cfg.checkpoint_path;
  const std::filesystem::path p(cfg.checkpoint_path);
  return (p.parent_path() / (p.stem().string() + ".step" + std::to_string(global_step) + p.extension().string()))
      .string();
}

// The global step a checkpoint records, read from its header alone (the file is not trusted: a
// name says nothing); -1 when the file is not a readable dptrain checkpoint.
int64_t recorded_step(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  uint64_t n = 0;
  if (!f.read(reinterpret_cast<char*>(&n), 8) || n == 0 || n > (100u << 20)) return -1;
  std::string head(n, '\0');
  if (!f.read(head.data(), static_cast<std::streamsize>(n))) return -1;
  try {
    const auto j = nlohmann::json::parse(head);
    const std::string step = j.at("__metadata__").at("step").get<std::string>();
    return j.at("__metadata__").contains("optimizer_steps") ? std::stoll(step) : -1;  // a --save file: no
  } catch (const std::exception&) {
    return -1;
  }
}

// Every checkpoint this configuration may have written: --checkpoint-path and "<stem>.step*<ext>"
// beside it, newest first by the step each records (unreadable headers last, still tried).
std::vector<std::string> checkpoints_newest_first(const TrainConfig& cfg) {
  const std::filesystem::path p(cfg.checkpoint_path);
  const std::filesystem::path dir = p.has_parent_path() ? p.parent_path() : std::filesystem::path(".");
  const std::string prefix = p.stem().string() + ".step", ext = p.extension().string();
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const bool rotated = name.rfind(prefix, 0) == 0 && name.size() > prefix.size() + ext.size() &&
                         name.compare(name.size() - ext.size(), ext.size(), ext) == 0 &&
                         name.find(".tmp.") == std::string::npos;
    if (e.is_regular_file(ec) && (rotated || name == p.filename().string()))
      found.emplace_back(recorded_step(e.path().string()), e.path().string());
  }
  std::sort(found.begin(), found.end(), std::greater<>());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

// Temporary files of checkpoint writers that no longer run ("<file>.tmp.<pid>", a killed writer's
// leftovers, 85 MB each for ResNet-18) are removed at start-up (rank 0).
void remove_stale_temporaries(const TrainConfig& cfg) {
  const std::filesystem::path p(cfg.checkpoint_path);
  const std::filesystem::path dir = p.has_parent_path() ? p.parent_path() : std::filesystem::path(".");
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const size_t at = name.rfind(".tmp.");
    if (at == std::string::npos || name.rfind(p.stem().string(), 0) != 0) continue;
    const std::string pid = name.substr(at + 5);
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (::kill(static_cast<pid_t>(std::stol(pid)), 0) == 0 || errno != ESRCH) continue;  // its writer runs
    if (std::filesystem::remove(e.path(), ec)) log_info("removed " + e.path().string() + ", left by a killed writer");
  }
}

// Where a resumed run starts: epoch in progress, steps done in it, global step. With
// --allow-config-change and other settings than the checkpoint's, the images per step it was
// written with (0: unchanged), so run_training can recompute the position in the new units.
struct ResumePoint {
  int64_t epoch = 0, epoch_step = 0, global_step = 0;
  int64_t images_per_step_then = 0;
  std::vector<EpochMetrics> history;  // the epochs before (rank 0: the report draws them again)
  bool resumed = false;               // false: a fresh start (no --resume, or auto found nothing)
};

// The checkpoint's training settings against this run's: "--lr 0.1 -> 0.2" for each value that
// differs and that a resumed run may not change silently.
std::vector<std::string> config_changes(const TrainConfig& cfg, const std::string& path, const std::string& then_json) {
  std::vector<std::pair<std::string, std::string>> then;
  try {
    then = agreed_values(then_json);
  } catch (const std::exception&) {
    throw Error(ErrorKind::kInput, DPT_MSG(path << ": metadata 'config' is not valid JSON"));
  }
  const auto now_values = agreed_values(cfg);
  std::vector<std::string> changed;
  for (size_t i = 0; i < then.size(); ++i)  // both in agreed_values' order
    if (!may_change_on_resume(then[i].first) && then[i].second != "(not recorded)" &&
        then[i].second != now_values[i].second)
      changed.push_back(then[i].first + " " + then[i].second + " -> " + now_values[i].second);
  return changed;
}

// Rank 0 reads the checkpoint (no shared file system needed) into the host model and Sgd, and the
// other ranks take its state and position by broadcast; the engine then takes the host state. A
// bad file is reported by rank 0 and ends every rank with exit code 2.
ResumePoint resume(const TrainConfig& cfg, Communicator& comm, Model& model, DataParallel& ddp, Sgd& opt,
                   StepEngine& engine) {
  // epoch, epoch step, global step, optimizer steps, images per step then, found (--resume auto)
  int64_t pos[6] = {0, 0, 0, 0, 0, 1};
  std::vector<EpochMetrics> history;
  std::string path;  // the file resumed (rank 0)
  agree_on_input(comm, "rank 0 could not read --resume " + cfg.resume, [&] {
    if (comm.rank() != 0) return;
    std::map<std::string, std::string> meta;
    if (cfg.resume == "auto") {
      // The newest by the step each file records; one that cannot be read falls back to the one before.
      std::string tried;
      for (const std::string& c : checkpoints_newest_first(cfg)) {
        try {
          meta = load_model(c, model, &opt.momentum_buffer());
          path = c;
          break;
        } catch (const Error& e) {
          if (e.kind() != ErrorKind::kInput) throw;
          log_warn("--resume auto: " + c + " cannot be used (" + e.what() + "): trying the one before");
          tried += (tried.empty() ? "" : ", ") + c;
        }
      }
      if (path.empty()) {
        DPT_INPUT_CHECK(tried.empty(), "--resume auto: no checkpoint beside " << cfg.checkpoint_path
                                                                          << " could be read (" << tried << ")");
        pos[5] = 0;
        log_info("--resume auto: no checkpoint at or beside " + cfg.checkpoint_path + ": starting fresh");
        return;
      }
    } else {
      path = cfg.resume;
      meta = load_model(path, model, &opt.momentum_buffer());
    }
    auto num = [&](const char* key) -> int64_t {
      auto it = meta.find(key);
      DPT_INPUT_CHECK(it != meta.end(), path << ": metadata '" << key << "' is missing: not a dptrain checkpoint");
      try {
        return std::stoll(it->second);
      } catch (const std::exception&) {
        throw Error(ErrorKind::kInput, DPT_MSG(path << ": metadata '" << key << "' is not a number"));
      }
    };
    // Range-checked: a damaged or hand-edited file must not train "epoch -2147483169".
    auto in_range = [&](const char* key, int64_t hi) {
      const int64_t v = num(key);
      DPT_INPUT_CHECK(v >= 0 && v <= hi, path << ": metadata '" << key << "' is " << v << ", outside [0, " << hi
                                                    << "]: not a checkpoint of a run this can continue");
      return v;
    };
    pos[0] = in_range("epoch", 1'000'000);
    pos[1] = in_range("epoch_step", 1'000'000'000);
    pos[2] = in_range("step", 1'000'000'000'000);
    pos[3] = in_range("optimizer_steps", pos[2]);
    if (auto h = meta.find("history"); h != meta.end()) {
      try {
        for (const auto& rec : nlohmann::json::parse(h->second)) history.push_back(EpochMetrics::from_json(rec.dump()));
      } catch (const std::exception&) {
        throw Error(ErrorKind::kInput, DPT_MSG(path << ": metadata 'history' is not a list of epoch records"));
      }
    }
    // The same training, or an explicit change (--allow-config-change).
    auto then = meta.find("config");
    const std::vector<std::string> changed =
        then == meta.end() ? std::vector<std::string>{} : config_changes(cfg, path, then->second);
    if (!changed.empty()) {
      std::string list;
      for (const std::string& c : changed) list += (list.empty() ? "" : ", ") + c;
      DPT_INPUT_CHECK(cfg.allow_config_change,
                      path << ": the checkpoint was written with other training settings (" << list
                                 << "); a resumed run continues the same training (--allow-config-change "
                                    "accepts the change and recomputes the position)");
      log_warn("--allow-config-change: resuming " + path + " with " + list);
      const auto j = nlohmann::json::parse(then->second);
      pos[4] = j.value("batch_size", cfg.batch_size) * j.value("accum_steps", static_cast<int64_t>(cfg.accum_steps));
    }
    auto ws = meta.find("world_size");
    if (ws != meta.end() && ws->second != std::to_string(comm.size()))
      log_warn(path + " was written at world size " + ws->second + ", resuming at " +
               std::to_string(comm.size()) + ": the data order is the same, float sums may differ");
  });
  comm.broadcast(pos, 6, 0, "broadcast of the resume position");
  if (!pos[5]) return {};  // --resume auto found nothing: a fresh start on every rank
  ddp.broadcast_state();
  if (!opt.momentum_buffer().empty())
    comm.broadcast(opt.momentum_buffer().data(), static_cast<int64_t>(opt.momentum_buffer().size()), 0,
                   "broadcast of the optimizer state");
  opt.set_steps(pos[3]);
  engine.from_host();
  log_info(DPT_MSG("resumed from " << path << " at epoch " << pos[0] + 1 << ", step " << pos[1]
                                   << " (global step " << pos[2] << ")"));
  return {pos[0], pos[1], pos[2], pos[4], std::move(history), true};
}

// The start-up banner of rank 0: model, ranks with their hosts and devices, buckets, configuration.
void print_banner(const TrainConfig& cfg, Communicator& comm, const Model& model, DataParallel& ddp,
                  const std::vector<std::string>& hosts, const std::vector<std::string>& devices) {
  if (comm.rank() != 0) return;
  std::ostringstream os;
  os << "dptrain: " << cfg.model << " (" << model.num_parameters() << " parameters), world size " << comm.size()
     << ", " << cfg.threads << " thread(s) per rank\n";
  for (int r = 0; r < comm.size(); ++r)
    os << "  rank " << r << ": " << hosts[static_cast<size_t>(r)] << ", " << devices[static_cast<size_t>(r)] << "\n";
  os << "  gradient buckets: " << ddp.reducer().buckets().size() << " (cap " << cfg.bucket_mb << " MiB, overlap "
     << (cfg.overlap ? "on" : "off") << ")\n";
  os << "configuration:\n" << cfg.to_text();
  log_info(os.str());
}

// Everything a run writes (rank 0) and keeps between epochs: metrics, report, checkpoints, --save.
class RunOutputs {
 public:
  // After a resume, the metrics file keeps only the records up to the checkpoint (the steps run
  // after it, before the interruption, are run again and recorded again), and the report draws the
  // epochs before it again (the checkpoint carries their records).
  RunOutputs(const TrainConfig& cfg, Communicator& comm, Model& model, Sgd& opt, StepEngine& engine,
             const ResumePoint& start)
      : cfg_(cfg), comm_(comm), model_(model), opt_(opt), engine_(engine),
        title_(DPT_MSG(cfg.model << ", " << comm.size() << " rank(s), global batch " << cfg.batch_size)),
        history_(start.history) {
    if (comm.rank() == 0 && !cfg.metrics.empty()) {
      if (start.resumed) keep_records_until(start);
      metrics_.open(cfg.metrics, start.resumed ? std::ios::app : std::ios::trunc);
      DPT_INPUT_CHECK(metrics_.good(), "--metrics: cannot write " << cfg.metrics);
    }
  }

  // One record of a step's metrics (rank 0; the caller made them global).
  void step_record(const nlohmann::json& j) { write_metrics(j.dump()); }

  // A file that could not be written (a full disk, a vanished mount): said once when it happens and
  // again at the end, and training goes on; the metrics, report and trace are not worth a run.
  void output_failed(const std::string& flag, const std::string& what) {
    if (!failed_.insert(flag).second) return;
    log_warn(flag + ": " + what + "; training goes on without it (said again at the end)");
  }
  void report_failures() const {
    if (comm_.rank() != 0 || failed_.empty()) return;
    std::string list;
    for (const std::string& f : failed_) list += (list.empty() ? "" : ", ") + f;
    log_warn("these outputs were not (all) written: " + list + " (see the warnings above)");
  }

  // End of an epoch: the line, the metrics record, the report (rank 0); the checkpoint when due.
  void epoch_done(const EpochMetrics& m, int64_t global_step) {
    history_.push_back(m);
    ran_.push_back(m);
    if (comm_.rank() == 0) {
      char line[256];
      std::snprintf(line, sizeof line, "epoch %d/%d  loss %.4f  train acc %.4f  test acc %.4f  %.2f s/epoch  %.0f img/s",
                    m.epoch, cfg_.epochs, m.train_loss, m.train_acc, m.test_acc, m.epoch_seconds, m.images_per_second);
      if (m.world_size > 1 && m.median_compute_seconds > 0) {
        // The slowest rank's compute per step against the median (the metrics have every rank's).
        const size_t len = std::strlen(line);
        std::snprintf(line + len, sizeof line - len, "  slowest r%d +%.0f%%", m.slowest_rank,
                      (m.slowest_compute_seconds / m.median_compute_seconds - 1) * 100);
      }
      if (cfg_.quiet && m.epoch == cfg_.epochs) std::printf("%s\n", line);
      log_info(line);
      write_metrics(m.to_json());
      if (!cfg_.report.empty()) {
        try {
          write_report_svg(cfg_.report, history_, cfg_.epochs, title_);
        } catch (const Error& e) {
          output_failed("--report", e.what());
        }
      }
    }
    // At an epoch's end: due by epochs, or a step-count checkpoint that falls on this boundary
    // (a step boundary inside the epoch writes those; see run_training).
    if ((cfg_.checkpoint_every > 0 && m.epoch % cfg_.checkpoint_every == 0) || due_by_steps(global_step))
      checkpoint(m.epoch, 0, global_step);
  }

  // Whether --checkpoint-every Nsteps falls on the boundary after `global_step` steps.
  bool due_by_steps(int64_t global_step) const {
    return cfg_.checkpoint_every_steps > 0 && global_step % cfg_.checkpoint_every_steps == 0;
  }

  // Minutes since the last checkpoint (or the start), by this rank's clock.
  double minutes_since_checkpoint() const { return (now() - last_checkpoint_) / 60.0; }

  // The checkpoint due at a step boundary inside an epoch, if any: by steps on every rank alike,
  // by minutes as rank 0's clock says (`minutes_due`, agreed by the caller).
  void maybe_checkpoint(int64_t epoch, int64_t epoch_step, int64_t global_step, bool minutes_due) {
    if (due_by_steps(global_step) || minutes_due)
      checkpoint(epoch, epoch_step, global_step);
  }

  // The training state at a step boundary: epoch in progress and steps done in it.
  void checkpoint(int64_t epoch, int64_t epoch_step, int64_t global_step) {
    engine_.sync_buffers();
    engine_.to_host();
    const std::string file = checkpoint_file(cfg_, global_step);
    refuse_nonfinite(file);
    if (comm_.rank() == 0)
      save_model(file, model_,
                 with(metadata(epoch, global_step), {{"epoch_step", std::to_string(epoch_step)},
                                                     {"optimizer_steps", std::to_string(opt_.steps())},
                                                     {"history", history_json()}}),
                 &opt_.momentum_buffer());
    if (comm_.rank() == 0) prune_checkpoints();
    comm_.barrier();
    last_checkpoint_ = now();
    log_info("checkpoint written to " + file + " (global step " + std::to_string(global_step) + ")");
  }

  // With --keep-checkpoints K: only the K newest (by the step each records) stay.
  void prune_checkpoints() {
    if (cfg_.keep_checkpoints == 0) return;
    const std::vector<std::string> all = checkpoints_newest_first(cfg_);
    std::error_code ec;
    for (size_t k = static_cast<size_t>(cfg_.keep_checkpoints); k < all.size(); ++k)
      if (all[k] != cfg_.checkpoint_path) std::filesystem::remove(all[k], ec);
  }

  // --save at the end: buffers were averaged before the last evaluation; parameters are
  // identical by construction.
  void save(int64_t global_step) {
    if (cfg_.save.empty()) return;
    engine_.to_host();
    refuse_nonfinite(cfg_.save);
    if (comm_.rank() == 0) save_model(cfg_.save, model_, metadata(cfg_.epochs, global_step));
    comm_.barrier();
    log_info("saved " + cfg_.save);
  }

  // The epochs this run trained (not those a resumed checkpoint brought).
  const std::vector<EpochMetrics>& ran() const { return ran_; }

 private:
  // Rewrites --metrics (atomically) without the records past the checkpoint's position: epoch
  // records of later epochs and step records of later steps. Other lines stay.
  void keep_records_until(const ResumePoint& start) {
    std::ifstream in(cfg_.metrics);
    if (!in) return;  // nothing written yet
    std::string kept;
    size_t dropped = 0;
    for (std::string line; std::getline(in, line);) {
      bool keep = true;
      try {
        const auto j = nlohmann::json::parse(line);
        const std::string type = j.value("type", "");
        if (type == "epoch") keep = j.value("epoch", int64_t{0}) <= start.epoch;
        if (type == "step") keep = j.value("step", int64_t{0}) <= start.global_step;
      } catch (const std::exception&) {
      }
      if (keep) kept += line + "\n"; else ++dropped;
    }
    if (!dropped) return;
    const std::string tmp = cfg_.metrics + ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << kept;
      DPT_INPUT_CHECK(out.good(), "--metrics: cannot write " << tmp);
    }
    DPT_INPUT_CHECK(std::rename(tmp.c_str(), cfg_.metrics.c_str()) == 0, "--metrics: cannot replace " << cfg_.metrics);
    log_info(DPT_MSG("--metrics: " << dropped << " record(s) past the checkpoint dropped from " << cfg_.metrics));
  }

  // Nothing non-finite is ever written over a good file (a BatchNorm buffer can still take a NaN
  // from a forward pass whose step was then skipped). The host state is the same on every rank
  // (parameters by construction, buffers averaged, momentum), so every rank refuses alike.
  void refuse_nonfinite(const std::string& path) {
    auto finite = [](const float* v, int64_t n) { return std::all_of(v, v + n, [](float x) { return std::isfinite(x); }); };
    std::string bad;
    for (const Param& p : model_.store().entries())
      if (bad.empty() && !finite(p.value.data(), p.numel())) bad = p.name;
    const auto& mom = opt_.momentum_buffer();
    if (bad.empty() && !finite(mom.data(), static_cast<int64_t>(mom.size()))) bad = "optimizer.momentum_buffer";
    if (!bad.empty())
      throw AgreedInputError(DPT_MSG("not writing " << path << ": '" << bad << "' holds non-finite values (the file "
                                                    << "there, if any, is kept)"),
                             comm_.rank() != 0);
  }

  void write_metrics(const std::string& record) {
    if (!metrics_.is_open() || failed_.count("--metrics")) return;
    metrics_ << record << "\n";
    metrics_.flush();
    if (!metrics_.good()) output_failed("--metrics", "writing " + cfg_.metrics + " failed (disk full?)");
  }

  using Meta = std::map<std::string, std::string>;
  // Metadata of --save files and checkpoints alike; checkpoints add their position in the epoch.
  Meta metadata(int64_t epoch, int64_t global_step) const {
    return Meta{{"config", cfg_.to_json()}, {"epoch", std::to_string(epoch)}, {"step", std::to_string(global_step)},
                {"seed", std::to_string(cfg_.seed)}, {"world_size", std::to_string(comm_.size())}};
  }
  // The epoch records so far, for a resumed run's report.
  std::string history_json() const {
    std::string out = "[";
    for (const EpochMetrics& m : history_) {
      if (out.size() > 1) out += ',';
      out += m.to_json();
    }
    return out + "]";
  }
  static Meta with(Meta m, const Meta& more) {
    m.insert(more.begin(), more.end());
    return m;
  }

  const TrainConfig& cfg_;
  Communicator& comm_;
  Model& model_;
  Sgd& opt_;
  StepEngine& engine_;
  const std::string title_;
  std::ofstream metrics_;
  std::vector<EpochMetrics> history_;  // every epoch of the training, for the report and checkpoints
  std::vector<EpochMetrics> ran_;
  std::set<std::string> failed_;  // outputs that could not be written (rank 0)
  double last_checkpoint_ = now();
};

// A rank counts as a straggler when its compute time per step is more than kStragglerSlower above
// the median of all ranks for kStragglerEpochs epochs in a row: one slow epoch is noise (a page
// cache miss, a checkpoint), a streak is a slow host or a noisy neighbour. With two ranks the
// median is their mean, so the slow one must be 1.5 times the other to be 20 % above it.
constexpr double kStragglerSlower = 0.20;
constexpr int kStragglerEpochs = 3;

// Fills m's per-rank fields from every rank's {compute, wait} seconds per step (`all`, rank-major).
void set_rank_timings(EpochMetrics& m, const std::vector<double>& all) {
  const size_t n = all.size() / 2;
  m.rank_compute_seconds.resize(n), m.rank_wait_seconds.resize(n);
  for (size_t r = 0; r < n; ++r) m.rank_compute_seconds[r] = all[2 * r], m.rank_wait_seconds[r] = all[2 * r + 1];
  const std::vector<double>& c = m.rank_compute_seconds;
  const auto [lo, hi] = std::minmax_element(c.begin(), c.end());
  m.slowest_rank = static_cast<int>(hi - c.begin());  // the first of equals: rank 0 when alone
  m.slowest_compute_seconds = *hi;
  std::vector<double> sorted = c;
  std::sort(sorted.begin(), sorted.end());
  m.median_compute_seconds = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
  m.compute_spread = m.median_compute_seconds > 0 ? (*hi - *lo) / m.median_compute_seconds : 0;
}

// Rank 0's count, per rank, of consecutive epochs above the straggler threshold; warns once per
// streak, when it reaches kStragglerEpochs, naming the rank and its host.
class StragglerWatch {
 public:
  void epoch_done(const EpochMetrics& m, const std::vector<std::string>& hosts) {
    const std::vector<double>& c = m.rank_compute_seconds;
    const double median = m.median_compute_seconds;
    streak_.resize(c.size(), 0);
    for (size_t r = 0; r < c.size(); ++r) {
      if (!(median > 0 && c[r] > median * (1 + kStragglerSlower))) {
        streak_[r] = 0;
        continue;
      }
      if (++streak_[r] != kStragglerEpochs) continue;
      char line[320];
      std::snprintf(line, sizeof line,
                    "rank %zu (host %s) has been %.0f%% slower than the median for %d epochs in a row (%.3g s against "
                    "%.3g s of compute per step): a slow host or a noisy neighbour?",
                    r, hosts[r].c_str(), (c[r] / median - 1) * 100, kStragglerEpochs, c[r], median);
      log_warn(line);
    }
  }

 private:
  std::vector<int> streak_;
};

}  // namespace

std::vector<EpochMetrics> run_training(const TrainConfig& cfg_in, Communicator& comm) {
  TrainConfig cfg = cfg_in;
  const int world = comm.size(), rank = comm.rank();
  // A stop signal (see StopSignals): every rank finishes its step, agrees on stopping at the next
  // boundary, checkpoints if configured, and main exits with 128 + signal.
  StopSignals signals;
  validate_config(cfg, world);
  set_log_level(cfg.quiet ? LogLevel::kWarn : parse_log_level(cfg.log_level));
  omp_set_num_threads(cfg.threads);
  comm.set_timeout(cfg.timeout);
  // Which host each rank runs on: the local rank picks the GPU, and the banner names the hosts.
  const std::vector<std::string> hosts = allgather_text(comm, comm.host());
  const int local_rank = local_rank_of(hosts, rank);
  const std::string device = agree_on_device(cfg, comm, local_rank);
  if (cfg.scale_lr) {
    // Linear scaling rule (Goyal et al.): the rate grows with the batch, after a warm-up.
    cfg.lr *= static_cast<double>(cfg.batch_size) / 256.0;
    cfg.warmup_epochs = std::max(cfg.warmup_epochs, 1.0);
  }

  // Every rank reads the data; if any rank fails, all stop with exit code 2 (the failing ranks say why).
  const double t_load = now();
  ImageSet train, test;
  agree_on_input(comm, "another rank could not read --data " + cfg.data, [&] {
    train = load_image_set(cfg.data, "train");
    test = load_image_set(cfg.data, "t10k");
    DPT_INPUT_CHECK(train.rows == 28 && train.cols == 28 && test.rows == 28 && test.cols == 28,
                    cfg.data << ": images are " << train.rows << "x" << train.cols << ", the models need 28x28");
  });
  log_debug(DPT_MSG("data loaded in " << now() - t_load << " s"));
  agree_on_config(cfg, comm, train, test);
  agree_on_input(comm, "rank 0 cannot write an output file", [&] {
    if (rank == 0) preflight_outputs(cfg);
  });
  const int ranks_here = static_cast<int>(std::count(hosts.begin(), hosts.end(), hosts[static_cast<size_t>(rank)]));
  if (device == "cpu") {
    // Once per host (its first rank): the estimate covers every rank there.
    agree_on_input(comm, "another host has not enough memory for this batch", [&] {
      if (local_rank == 0)
        check_memory(cfg, world, train.num_classes, ranks_here, test.n, available_bytes(), 0, "on this host");
    });
  }

  // The operations the model runs on: the CPU's, or a GPU's (whose context this rank creates here),
  // and how its gradients travel (null: the MPI thread over the host gradients).
  std::unique_ptr<Backend> gpu_ops;
  std::unique_ptr<ReduceTransport> transport;
  auto model_on = [&](Backend& be) { return make_model(cfg.model, train.num_classes, be); };
  std::unique_ptr<Model> model;
  const DType wire = grad_wire_dtype(cfg.grad_dtype);
#if DPT_HAVE_CUDA
  if (device == "cuda") {
    gpu_ops = make_cuda_backend(cfg, local_rank);
    // Every rank checks its GPU (after the context exists, so its own memory is already taken):
    // per image as on the CPU, plus 1 GiB for what a run keeps on the device besides activations
    // (parameters, gradients and momentum: 0.2 GiB for ResNet-18; the data set, 55 MiB; cuDNN's
    // workspace, up to 0.25 GiB per algorithm).
    agree_on_input(comm, "another rank's GPU has not enough memory for this batch", [&] {
      const GpuMemory gm = gpu_memory(*gpu_ops, local_rank, ranks_here);
      check_memory(cfg, world, train.num_classes, gm.ranks_on_gpu, test.n, gm.free_bytes, double(1 << 30),
                   DPT_MSG("on rank " << rank << "'s GPU " << gm.device));
    });
    model = model_on(*gpu_ops);
    transport = make_gpu_transport(comm, *gpu_ops, model->store().device_grads(), model->num_parameters(), wire);
  }
#endif
  if (!model) model = model_on(cpu_backend());
  model->init_parameters(cfg.init, cfg.seed);
  DdpOptions dopt;
  dopt.bucket_mb = cfg.bucket_mb;
  dopt.last_bucket_mb = cfg.last_bucket_mb;
  dopt.overlap = cfg.overlap;
  dopt.sync_bn = cfg.sync_bn;
  dopt.grad_dtype = wire;
  DataParallel ddp(*model, comm, dopt, std::move(transport));
  Sgd opt(model->num_parameters(), cfg.momentum, cfg.weight_decay);
  ShardedSampler sampler(train.n, cfg.batch_size, rank, world, cfg.seed);
  StepEngine engine(cfg, comm, *model, ddp, opt, train, test);
  print_banner(cfg, comm, *model, ddp, hosts, allgather_text(comm, engine.describe()));

  if (rank == 0 && (cfg.checkpoints() || !cfg.resume.empty())) remove_stale_temporaries(cfg);
  ResumePoint start = cfg.resume.empty() ? ResumePoint{} : resume(cfg, comm, *model, ddp, opt, engine);
  RunOutputs out(cfg, comm, *model, opt, engine, start);
  const int64_t batches = sampler.steps_per_epoch();
  int64_t steps = batches / cfg.accum_steps;
  DPT_INPUT_CHECK(steps >= 1, "--accum-steps " << cfg.accum_steps << " leaves no optimizer step in an epoch of "
                                               << batches << " batches");
  if (cfg.max_steps > 0) steps = std::min(steps, cfg.max_steps);
  if (start.images_per_step_then > 0) {
    // Settings changed on purpose: the images of the epoch already trained on stay done, and the
    // schedule continues from the position they make in the new units.
    const int64_t now_per_step = cfg.batch_size * cfg.accum_steps;
    start.epoch_step = std::min(steps, start.epoch_step * start.images_per_step_then / now_per_step);
    start.global_step = start.epoch * steps + start.epoch_step;
    log_info(DPT_MSG("--allow-config-change: continuing at epoch " << start.epoch + 1 << ", step " << start.epoch_step
                                                                   << " (global step " << start.global_step << ")"));
  }
  DPT_INPUT_CHECK(start.epoch_step <= steps, "--resume: the checkpoint is at step " << start.epoch_step
                                                 << " of its epoch, but epochs now have " << steps << " steps");
  const int64_t b = sampler.local_batch();
  int64_t global_step = start.global_step;

  Tracer tracer;
  Tracer* tr = cfg.trace.empty() ? nullptr : &tracer;
  ddp.reducer().set_tracer(tr);
  // Under mpirun a rank's stderr is a pipe even when the user watches a terminal: launch/mpirun.sh
  // tells the ranks (DPT_PROGRESS=1) when its own stderr is a terminal.
  const char* env_tty = std::getenv("DPT_PROGRESS");
  const bool tty = isatty(2) || (env_tty && std::string(env_tty) == "1");
  const bool progress = rank == 0 && !cfg.quiet && log_level() >= LogLevel::kInfo &&
                        (cfg.progress == "on" || (cfg.progress == "auto" && tty));

  NonFiniteGuard guard(cfg, comm, engine);
  StragglerWatch stragglers;
  double boundary_wait_s = 0;  // this epoch's seconds in the stop-flag all-reduce (a wait for peers)
  const bool host_backend = model->store().backend().host_memory();
  // A step boundary inside an epoch: a stop signal (checkpoint, then exit 128+signal), else a
  // checkpoint due by steps or by rank 0's clock (--checkpoint-every Nsteps / Nmin).
  auto at_boundary = [&](int64_t epoch, int64_t epoch_step, bool any_step_since) {
    const bool minutes_due = rank == 0 && any_step_since && cfg.checkpoint_every_minutes > 0 &&
                             out.minutes_since_checkpoint() >= cfg.checkpoint_every_minutes;
    const double agree_t0 = now();
    const auto [sig, due] = signals.agreed(comm, minutes_due);
    boundary_wait_s += now() - agree_t0;
    if (sig) {
      if (cfg.checkpoints()) {
        out.checkpoint(epoch, epoch_step, global_step);
        log_info(DPT_MSG(signal_name(sig) << ": checkpoint of epoch " << epoch + 1 << " step " << epoch_step
                                          << " written to " << checkpoint_file(cfg, global_step)));
      } else if (rank == 0) {
        log_warn(DPT_MSG(signal_name(sig) << ": stopping at global step " << global_step
                                          << " without a checkpoint (no --checkpoint-every was given)"));
      }
      throw Stopped{sig, global_step};
    }
    if (any_step_since) out.maybe_checkpoint(epoch, epoch_step, global_step, due);
  };

  for (int epoch = static_cast<int>(start.epoch); epoch < cfg.epochs; ++epoch) {
    sampler.set_epoch(epoch);
    engine.begin_epoch(sampler, batches);
    double comm_s = 0, exposed_s = 0, step_s = 0, lr = 0;
    boundary_wait_s = 0;
    int64_t seen = 0;
    const int64_t first = epoch == start.epoch ? start.epoch_step : 0;
    const double t0 = now();
    for (int64_t s = first; s < steps; ++s, ++global_step) {
      at_boundary(epoch, s, s > first);
      if (tr && global_step == cfg.trace_begin) tracer.start(comm);
      if (tr && global_step == cfg.trace_end) tracer.stop();
      const double step_t0 = now();
      lr = learning_rate(cfg, global_step, steps);
      engine.step(s * cfg.accum_steps, global_step, lr, tr);
      step_s += now() - step_t0;
      seen += b * cfg.accum_steps;
      // A host backend has the sum at once; a device one is checked at the epoch's end (its
      // non-finite steps were not applied either, so the state stays finite meanwhile).
      if (host_backend) guard.check(engine.last_grad_sumsq(), global_step, epoch);
      const ReducerStats rs = engine.reducer_stats();
      comm_s += rs.comm_seconds;
      exposed_s += rs.exposed_seconds;
      if (cfg.verify_every > 0 && (global_step + 1) % cfg.verify_every == 0) {
        engine.to_host();
        ddp.verify_replicas(global_step);
      }
      if (cfg.metrics_every > 0 && (global_step + 1) % cfg.metrics_every == 0) {
        // Per-step record: the step's global loss (an all-reduce on every rank at the same steps).
        const Totals step = engine.step_totals();
        double st[3] = {step.loss, static_cast<double>(step.correct), static_cast<double>(b * cfg.accum_steps)};
        comm.allreduce(st, 3, ReduceOp::kSum, "all-reduce of step metrics");
        if (rank == 0)
          out.step_record({{"type", "step"}, {"epoch", epoch + 1}, {"step", global_step + 1},
                           {"loss", st[0] / st[2]}, {"train_acc", st[1] / st[2]}, {"lr", lr},
                           {"grad_norm", std::sqrt(engine.last_grad_sumsq())},
                           {"images_per_second", st[2] / (now() - step_t0)}, {"allreduce_seconds", rs.comm_seconds},
                           {"exposed_comm_seconds", rs.exposed_seconds}, {"world_size", world}});
      }
      if (progress && ((s + 1) % 5 == 0 || s + 1 == steps)) {
        const double el = now() - t0;
        draw_progress(epoch + 1, cfg.epochs, s + 1 - first, steps - first,
                      engine.epoch_totals().loss / static_cast<double>(seen), static_cast<double>(seen * world) / el, el);
      }
    }
    if (progress) std::fprintf(stderr, "\r\033[K");
    // A GPU finishes the epoch's queued work here: the time counts, as the images were only queued.
    const double drain_t0 = now();
    const Totals et = engine.epoch_totals();
    const double train_seconds = now() - t0;
    step_s += now() - drain_t0;
    const std::vector<double> sumsq = engine.epoch_grad_sumsq();
    double norm_sum = 0, norm_max = 0;
    int64_t applied = 0, nonfinite = 0;
    for (size_t i = 0; i < sumsq.size(); ++i) {
      if (!host_backend) guard.check(sumsq[i], global_step - static_cast<int64_t>(sumsq.size() - i), epoch);
      if (!std::isfinite(sumsq[i])) {
        ++nonfinite;
        continue;
      }
      const double norm = std::sqrt(sumsq[i]);
      norm_sum += norm, norm_max = std::max(norm_max, norm), ++applied;
    }
    double tsum[3] = {et.loss, static_cast<double>(et.correct), static_cast<double>(seen)};
    comm.allreduce(tsum, 3, ReduceOp::kSum, "all-reduce of training metrics");
    // Every rank's timings per step, gathered once per epoch (no collective per step): compute =
    // time in its steps (plus a GPU's end-of-epoch drain) less the exposed all-reduce wait;
    // wait = that exposed wait plus the stop-flag all-reduce at step boundaries.
    const double n_steps = static_cast<double>(steps - first);
    const double mine[2] = {n_steps > 0 ? std::max(0.0, step_s - exposed_s) / n_steps : 0,
                            n_steps > 0 ? (exposed_s + boundary_wait_s) / n_steps : 0};
    std::vector<double> timings(2 * static_cast<size_t>(world));
    comm.allgather(mine, timings.data(), 2);
    engine.sync_buffers();
    const bool eval_now = cfg.eval_every > 0 && ((epoch + 1) % cfg.eval_every == 0 || epoch + 1 == cfg.epochs);
    const Totals ev = eval_now ? evaluate(engine, comm, test.n) : Totals{};

    EpochMetrics m;
    m.epoch = epoch + 1;
    m.train_loss = tsum[2] > 0 ? tsum[0] / tsum[2] : 0;
    m.train_acc = tsum[2] > 0 ? tsum[1] / tsum[2] : 0;
    m.train_count = static_cast<int64_t>(tsum[2]);
    // Not evaluated this epoch: NaN, written as null in the metrics JSON.
    m.test_loss = ev.count ? ev.loss / static_cast<double>(ev.count) : std::nan("");
    m.test_acc = ev.count ? static_cast<double>(ev.correct) / static_cast<double>(ev.count) : std::nan("");
    m.test_count = ev.count;
    m.steps = steps - first;
    m.lr = lr;
    m.epoch_seconds = train_seconds;
    m.images_per_second = tsum[2] / train_seconds;
    m.comm_seconds = comm_s;
    m.exposed_comm_seconds = exposed_s;
    m.grad_norm = applied ? norm_sum / static_cast<double>(applied) : 0;
    m.grad_norm_max = norm_max;
    m.nonfinite_steps = nonfinite;
    m.world_size = world;
    set_rank_timings(m, timings);
    out.epoch_done(m, global_step);
    if (rank == 0) stragglers.epoch_done(m, hosts);  // after the epoch line it refers to
  }
  if (tr) {
    try {
      // The collectives come first inside; only rank 0's file writing can throw here.
      tracer.write(comm, cfg.trace, comm.host());
      log_info("trace of steps " + std::to_string(cfg.trace_begin) + ":" + std::to_string(cfg.trace_end) +
               " written to " + cfg.trace);
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kInput) throw;
      out.output_failed("--trace", e.what());
    }
  }
  out.save(global_step);
  out.report_failures();
  return out.ran();
}

void block_stop_signals() {
  const sigset_t set = stop_signal_set();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

}  // namespace dpt
