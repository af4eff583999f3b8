// MetricsLogger (include/dpt/metrics.h): rank 0's outputs of a run, and the epoch record's JSON.
#include "dpt/metrics.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <type_traits>

#include "dpt/device.h"
#include "dpt/error.h"
#include "dpt/files.h"
#include "dpt/log.h"
#include "dpt/safetensors.h"

namespace dpt {

EpochMetrics EpochMetrics::from_json(const std::string& json) {
  const auto j = parse_metadata_json(json);  // a checkpoint's record: its nesting bounded
  EpochMetrics m;
  auto num = [&](const char* key, auto& field) {
    using T = std::remove_reference_t<decltype(field)>;
    if (!j.contains(key)) return;
    field = j.at(key).is_null() ? static_cast<T>(std::nan("")) : j.at(key).get<T>();
  };
  num("epoch", m.epoch), num("train_loss", m.train_loss), num("train_acc", m.train_acc);
  num("test_loss", m.test_loss), num("test_acc", m.test_acc), num("test_count", m.test_count);
  num("train_count", m.train_count), num("steps", m.steps), num("epoch_seconds", m.epoch_seconds);
  num("images_per_second", m.images_per_second), num("train_tflops", m.train_tflops),
      num("lr", m.lr), num("comm_seconds", m.comm_seconds);
  num("exposed_comm_seconds", m.exposed_comm_seconds), num("grad_norm", m.grad_norm);
  num("grad_norm_max", m.grad_norm_max), num("nonfinite_steps", m.nonfinite_steps),
      num("world_size", m.world_size);
  num("slowest_rank", m.slowest_rank), num("slowest_compute_seconds", m.slowest_compute_seconds);
  num("median_compute_seconds", m.median_compute_seconds), num("compute_spread", m.compute_spread);
  auto list = [&](const char* key, std::vector<double>& field) {
    if (j.contains(key) && j.at(key).is_array()) field = j.at(key).get<std::vector<double>>();
  };
  list("rank_compute_seconds", m.rank_compute_seconds),
      list("rank_wait_seconds", m.rank_wait_seconds);
  return m;
}

std::string EpochMetrics::to_json() const {
  nlohmann::json j = {{"type", "epoch"},
                      {"epoch", epoch},
                      {"train_loss", train_loss},
                      {"train_acc", train_acc},
                      {"test_loss", test_loss},
                      {"test_acc", test_acc},
                      {"test_count", test_count},
                      {"train_count", train_count},
                      {"steps", steps},
                      {"lr", lr},
                      {"epoch_seconds", epoch_seconds},
                      {"images_per_second", images_per_second},
                      {"train_tflops", train_tflops},
                      {"comm_seconds", comm_seconds},
                      {"exposed_comm_seconds", exposed_comm_seconds},
                      {"grad_norm", grad_norm},
                      {"grad_norm_max", grad_norm_max},
                      {"nonfinite_steps", nonfinite_steps},
                      {"world_size", world_size},
                      {"slowest_rank", slowest_rank},
                      {"slowest_compute_seconds", slowest_compute_seconds},
                      {"median_compute_seconds", median_compute_seconds},
                      {"compute_spread", compute_spread},
                      {"rank_compute_seconds", rank_compute_seconds},
                      {"rank_wait_seconds", rank_wait_seconds}};
  return j.dump();
}

std::string EpochSoFar::to_json() const {
  // nlohmann writes the shortest text that reads back to the same double: the sums resume exact.
  return nlohmann::json{{"loss", loss},
                        {"correct", correct},
                        {"count", count},
                        {"steps", steps},
                        {"norm_sum", norm_sum},
                        {"norm_max", norm_max},
                        {"applied", applied},
                        {"nonfinite", nonfinite},
                        {"seconds", seconds},
                        {"comm_seconds", comm_seconds},
                        {"exposed_seconds", exposed_seconds}}
      .dump();
}

EpochSoFar EpochSoFar::from_json(const std::string& json) {
  const auto j = parse_metadata_json(json);  // a checkpoint's: its nesting bounded
  auto sum = [&](const char* key) {
    const double v = j.at(key).get<double>();  // throws on a missing key or a non-number
    if (!std::isfinite(v) || v < 0) throw std::invalid_argument(key);
    return v;
  };
  auto count = [&](const char* key) {
    const double v = sum(key);
    if (v != std::floor(v) || v > 9e15) throw std::invalid_argument(key);
    return static_cast<int64_t>(v);
  };
  EpochSoFar e;
  e.loss = sum("loss"), e.correct = count("correct"), e.count = count("count");
  e.steps = count("steps"), e.norm_sum = sum("norm_sum"), e.norm_max = sum("norm_max");
  e.applied = count("applied"), e.nonfinite = count("nonfinite"), e.seconds = sum("seconds");
  e.comm_seconds = sum("comm_seconds"), e.exposed_seconds = sum("exposed_seconds");
  // applied + nonfinite (the optimizer steps taken) may exceed steps: --allow-config-change at a
  // larger batch recounts the steps done in the new, larger steps (trainer.cc), not the
  // optimizer's.
  if (e.correct > e.count) throw std::invalid_argument("inconsistent counts");
  return e;
}

void set_rank_timings(EpochMetrics& m, const std::vector<double>& all) {
  const size_t n = all.size() / 2;
  m.rank_compute_seconds.resize(n), m.rank_wait_seconds.resize(n);
  for (size_t r = 0; r < n; ++r)
    m.rank_compute_seconds[r] = all[2 * r], m.rank_wait_seconds[r] = all[2 * r + 1];
  const std::vector<double>& c = m.rank_compute_seconds;
  // max_element: the first of equals (minmax_element's max is the last).
  const auto lo = std::min_element(c.begin(), c.end()), hi = std::max_element(c.begin(), c.end());
  m.slowest_rank = static_cast<int>(hi - c.begin());  // the first of equals: rank 0 when alone
  m.slowest_compute_seconds = *hi;
  std::vector<double> sorted = c;
  std::sort(sorted.begin(), sorted.end());
  m.median_compute_seconds = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
  m.compute_spread = m.median_compute_seconds > 0 ? (*hi - *lo) / m.median_compute_seconds : 0;
}

std::vector<int> StragglerWatch::epoch_done(const EpochMetrics& m,
                                            const std::vector<std::string>& hosts) {
  const std::vector<double>& c = m.rank_compute_seconds;
  const double median = m.median_compute_seconds;
  std::vector<int> warned;
  streak_.resize(c.size(), 0);
  for (size_t r = 0; r < c.size(); ++r) {
    if (!(median > 0 && c[r] > median * (1 + kSlower))) {
      streak_[r] = 0;
      continue;
    }
    if (++streak_[r] != kEpochs) continue;
    char line[320];
    std::snprintf(line, sizeof line,
                  "rank %zu (host %s) has been %.0f%% slower than the median for %d epochs in a "
                  "row (%.3g s against "
                  "%.3g s of compute per step): a slow host or a noisy neighbour?",
                  r, r < hosts.size() ? hosts[r].c_str() : "?", (c[r] / median - 1) * 100, kEpochs,
                  c[r], median);
    log_warn(line);
    warned.push_back(static_cast<int>(r));
  }
  return warned;
}

MetricsLogger::MetricsLogger(const TrainConfig& cfg, int rank, int world,
                             std::vector<EpochMetrics> before, bool resumed, int64_t resumed_epoch,
                             int64_t resumed_step)
    : cfg_(cfg),
      rank_(rank),
      title_(DPT_MSG(cfg.model << ", " << world << " rank(s), global batch " << cfg.batch_size)),
      history_(std::move(before)) {
  // Under mpirun a rank's stderr is a pipe even when the user watches a terminal: launch/mpirun.sh
  // tells the ranks (DPT_PROGRESS=1) when its own stderr is a terminal.
  const char* env_tty = std::getenv("DPT_PROGRESS");
  const bool tty = isatty(2) || (env_tty && std::string(env_tty) == "1");
  progress_ = rank == 0 && !cfg.quiet && log_level() >= LogLevel::kInfo &&
              (cfg.progress == "on" || (cfg.progress == "auto" && tty));
  if (rank != 0 || cfg.metrics.empty()) return;
  if (resumed) keep_records_until(resumed_epoch, resumed_step);
  metrics_.open(cfg.metrics, resumed ? std::ios::app : std::ios::trunc);
  DPT_INPUT_CHECK(metrics_.good(), "--metrics: cannot write " << cfg.metrics);
  struct stat st {};
  if (::stat(cfg.metrics.c_str(), &st) == 0 && S_ISREG(st.st_mode))
    metrics_dev_ = st.st_dev, metrics_ino_ = st.st_ino;
}

void MetricsLogger::draw_progress(int epoch, int64_t done, int64_t total, double loss, double ips,
                                  double elapsed) {
  const int width = 24;
  const int fill = static_cast<int>(width * done / std::max<int64_t>(total, 1));
  const double left =
      done > 0 ? elapsed * static_cast<double>(total - done) / static_cast<double>(done) : 0;
  std::fprintf(stderr,
               "\r\033[Kepoch %d/%d [%.*s%*s] %lld/%lld  %.0f img/s  loss %.4f  %.0f s left", epoch,
               cfg_.epochs, fill, "########################", width - fill, "",
               static_cast<long long>(done), static_cast<long long>(total), ips, loss, left);
  std::fflush(stderr);
}

void MetricsLogger::end_progress() {
  if (progress_) std::fprintf(stderr, "\r\033[K");
}

void MetricsLogger::step_record(const StepRecord& r) {
  const nlohmann::json j = {{"type", "step"},
                            {"epoch", r.epoch},
                            {"step", r.step},
                            {"loss", r.loss},
                            {"train_acc", r.train_acc},
                            {"lr", r.lr},
                            {"grad_norm", r.grad_norm},
                            {"images_per_second", r.images_per_second},
                            {"allreduce_seconds", r.allreduce_seconds},
                            {"exposed_comm_seconds", r.exposed_comm_seconds},
                            {"world_size", r.world_size}};
  write_metrics(j.dump());
}

void MetricsLogger::output_failed(const std::string& flag, const std::string& what) {
  if (!failed_.insert(flag).second) return;
  log_warn(flag + ": " + what + "; training goes on without it (said again at the end)");
}

void MetricsLogger::report_failures() {
  if (rank_ != 0) return;
  check_metrics_path();  // removed after the last record: that one is lost too
  std::set<std::string> failed = failed_;
  if (metrics_path_lost_) failed.insert("--metrics");
  if (failed.empty()) return;
  std::string list;
  for (const std::string& f : failed) list += (list.empty() ? "" : ", ") + f;
  log_warn("these outputs were not (all) written: " + list + " (see the warnings above)");
}

void MetricsLogger::epoch_done(const EpochMetrics& m, const std::vector<std::string>& hosts) {
  history_.push_back(m);
  ran_.push_back(m);
  if (rank_ != 0) return;
  char line[256];
  std::snprintf(line, sizeof line,
                "epoch %d/%d  loss %.4f  train acc %.4f  test acc %.4f  %.2f s/epoch  %.0f img/s",
                m.epoch, cfg_.epochs, m.train_loss, m.train_acc, m.test_acc, m.epoch_seconds,
                m.images_per_second);
  if (m.train_tflops > 0) {
    const size_t len = std::strlen(line);
    std::snprintf(line + len, sizeof line - len, "  %.3g TFLOP/s", m.train_tflops);
  }
  if (m.world_size > 1 && m.median_compute_seconds > 0) {
    // The slowest rank's compute per step against the median (the metrics have every rank's).
    const size_t len = std::strlen(line);
    std::snprintf(line + len, sizeof line - len, "  slowest r%d +%.0f%%", m.slowest_rank,
                  (m.slowest_compute_seconds / m.median_compute_seconds - 1) * 100);
  }
  if (cfg_.quiet && m.epoch == cfg_.epochs) log_result(line);  // stdout, whatever the log level
  log_info(line);
  write_metrics(m.to_json());
  if (!cfg_.report.empty()) {
    try {
      write_report_svg(cfg_.report, history_, cfg_.epochs, title_);
    } catch (const Error& e) {
      output_failed("--report", e.what());
    }
  }
  if (watch_) stragglers_.epoch_done(m, hosts);  // after the epoch line it refers to
}

// Rewrites --metrics (atomically) without the records past the checkpoint's position: epoch
// records of later epochs and step records of later steps. Other lines stay.
void MetricsLogger::keep_records_until(int64_t epoch, int64_t global_step) {
  struct stat st {};
  if (::stat(cfg_.metrics.c_str(), &st) != 0 || S_ISCHR(st.st_mode))
    return;  // nothing written yet, or a device
  // Read whole, and kept lines copied: about three times its size at the peak. A file far larger
  // than a run's records (a sparse 20 GB file, another program's) was read for a minute and ended
  // in std::bad_alloc, exit 3 (or the OOM killer): refused first, naming it and both sizes.
  const HostMemory mem = host_memory();
  const double size = static_cast<double>(st.st_size), gib = 1 << 30;
  DPT_INPUT_CHECK(mem.bytes < 0 || 3 * size <= mem.bytes,
                  "--metrics " << cfg_.metrics << " is " << std::fixed << std::setprecision(2)
                               << size / gib << " GiB: trimming it to the checkpoint's records "
                               << "takes about 3 times that in memory, and " << mem.bytes / gib
                               << " GiB is available (" << mem.source
                               << "); is it this training's metrics file? Move it away or give "
                                  "--metrics another file");
  std::string text;
  {
    FILE* f = ::fdopen(open_input_file(cfg_.metrics, "--metrics"), "r");  // never blocks on a FIFO
    DPT_INPUT_CHECK(f, "--metrics: cannot read " << cfg_.metrics);
    char buf[1 << 16];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
    std::fclose(f);
  }
  std::string kept;
  size_t dropped = 0;
  // A last line without its newline is a record cut short: the run that wrote it stopped
  // mid-write (a full disk, a kill). Appended to as it was, this run's first record went on that
  // line and was lost to every JSON reader; a cut record that does not parse is dropped, one that
  // does gets its newline.
  const bool cut = !text.empty() && text.back() != '\n';
  bool cut_dropped = false;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(at, end - at);
    const bool last = end == text.size();
    at = end + 1;
    bool keep = true;
    try {
      const auto j = nlohmann::json::parse(line);
      const std::string type = j.value("type", "");
      if (type == "epoch") keep = j.value("epoch", int64_t{0}) <= epoch;
      if (type == "step") keep = j.value("step", int64_t{0}) <= global_step;
    } catch (const std::exception&) {
      if (cut && last) keep = false, cut_dropped = true;  // other lines that are no record stay
    }
    if (keep)
      kept += line + "\n";
    else if (!(cut && last))
      ++dropped;
  }
  if (!dropped && !cut) return;
  // Another user's file in a sticky directory (their training's --metrics in /tmp, continued by
  // this user) is appended to in place, and a fresh run truncates it in place, but the rename that
  // trims it atomically is its owner's alone: "cannot rename ...: Operation not permitted" ended
  // the resume at start. Trimmed in place instead, as the appends that follow write it.
  if (may_replace_by_rename(cfg_.metrics, "--metrics"))
    write_file_atomic(cfg_.metrics, kept, "--metrics");
  else
    rewrite_file_in_place(cfg_.metrics, kept, "--metrics");
  if (dropped)
    log_info(DPT_MSG("--metrics: " << dropped << " record(s) past the checkpoint dropped from "
                                   << cfg_.metrics));
  if (cut_dropped)
    log_warn(DPT_MSG("--metrics: " << cfg_.metrics << " ended in a record cut short (a write that "
                                   << "failed: a full disk?); it was dropped"));
}

void MetricsLogger::write_metrics(const std::string& record) {
  if (!metrics_.is_open() || failed_.count("--metrics")) return;
  metrics_ << record << "\n";
  metrics_.flush();
  if (!metrics_.good()) {
    output_failed("--metrics", "writing " + cfg_.metrics + " failed (disk full?)");
    return;
  }
  check_metrics_path();
}

void MetricsLogger::check_metrics_path() {
  // The records go to the file opened at the start. Removed since (rm, its directory removed: a
  // clean-up that ran too early), they went to a file no name reaches, without a word, and the run
  // ended with no --metrics at all; replaced (moved away, another file put there), they are not in
  // the file the path names. Said once, and again at the end. The records still go to the file
  // opened (moved away, it holds them all; stopping would lose them there too). Only a name that
  // is gone counts (ENOENT, ENOTDIR): another failure of stat (ESTALE or EIO on NFS) may pass, so
  // it is asked again at the next record.
  if (metrics_ino_ == 0 || metrics_path_lost_ || failed_.count("--metrics")) return;
  struct stat st {};
  std::string what;
  if (::stat(cfg_.metrics.c_str(), &st) != 0) {
    if (errno != ENOENT && errno != ENOTDIR) return;
    what = " was removed while the run appended to it (" + std::string(std::strerror(errno)) +
           "): the records written since go to a file no name reaches";
  } else if (st.st_dev != metrics_dev_ || st.st_ino != metrics_ino_) {
    what =
        " was replaced while the run appended to it (another file put there): the records go "
        "on into the file opened at the start (moved away?), not the one the path names";
  } else {
    return;
  }
  metrics_path_lost_ = true;  // listed at the end; a later write failure is still said
  log_warn("--metrics: " + cfg_.metrics + what + " (said again at the end)");
}

}  // namespace dpt
