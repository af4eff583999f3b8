// After training: `dptrain evaluate` and `dptrain predict` run a saved model (--load, a --save file
// or a checkpoint) over the test split of --data, split across the ranks. The test set is cut into
// batches of --eval-batch-size at fixed global boundaries and whole batches go to ranks, so every
// image is scored in the same batch with the same neighbours at any world size: its logits are the
// same bits, and everything computed from them (in double, on the host) is too. Counts are
// integers, per-batch loss sums are each made by one rank and reduced into slots of their own, then
// added in batch order: 1, 2 and 4 ranks print and write the same numbers.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "dpt/comm.h"
#include "dpt/config.h"
#include "dpt/error.h"
#include "dpt/files.h"
#include "dpt/log.h"
#include "dpt/model_file.h"
#include "dpt/models.h"
#include "dpt/preflight.h"
#include "dpt/run.h"
#include "dpt/safetensors.h"
#include "dpt/sampler.h"
#include "dpt/text.h"
#include "train/signals.h"

namespace dpt {

namespace {

// What a saved model's metadata says it is (save_model and input_metadata write it).
struct SavedModel {
  std::string model;
  std::string stem = "auto";  // the recorded stem of a torchvision-layout model (--save's "stem")
  Shape input;
  int classes = 0;
  Normalization normalize;
};

SavedModel saved_model(const std::map<std::string, std::string>& meta, const std::string& path) {
  auto get = [&](const char* key) {
    const auto it = meta.find(key);
    DPT_INPUT_CHECK(it != meta.end(), "--load " << path << ": its metadata has no '" << key
                                                << "' (not a file dptrain's --save wrote)");
    return it->second;
  };
  SavedModel s;
  s.model = get("model");
  try {
    (void)model_spec(s.model);
  } catch (const Error&) {
    throw Error(ErrorKind::kInput, DPT_MSG("--load " << path << ": holds a '" << printable(s.model)
                                                     << "' model, which this dptrain does not "
                                                     << "know (" << model_names() << ")"));
  }
  const std::string shape = get("input_shape"), classes = get("num_classes");
  // Three positive integers and a class count, each read as every number is (text.h's
  // read_number: decimal digits only, within the type): sscanf's %lld took " 4" and "+4" for 4,
  // and would turn "99999999999999999999" into 9223372036854775807, passed on to messages as the
  // file's.
  Shape hwc;
  for (const std::string& dim : split_list(shape, ','))
    hwc.push_back(read_number<int64_t>(dim).value_or(0));
  DPT_INPUT_CHECK(
      hwc.size() == 3 && std::all_of(hwc.begin(), hwc.end(), [](int64_t d) { return d > 0; }),
      "--load " << path << ": input_shape '" << printable(shape)
                << "' is not H,W,C (three positive integers)");
  const std::optional<int> k = read_number<int>(classes);
  DPT_INPUT_CHECK(k && *k >= 1 && *k <= 1 << 20,
                  "--load " << path << ": num_classes '" << printable(classes)
                            << "' is not a class count (a whole number from 1 to " << (1 << 20)
                            << ", in decimal digits)");
  s.input = hwc;
  s.classes = *k;
  if (const auto stem = meta.find("stem"); stem != meta.end()) {
    // Else the run would refuse a --stem the user never gave ("--stem cifar: --model lenet has a
    // fixed stem").
    DPT_INPUT_CHECK(model_spec(s.model).stems,
                    "--load " << path << ": its metadata records the stem '"
                              << printable(stem->second) << "' for a " << s.model
                              << " model, whose stem is fixed (not a file dptrain's --save wrote)");
    DPT_INPUT_CHECK(stem->second == "imagenet" || stem->second == "cifar",
                    "--load " << path << ": stem '" << printable(stem->second)
                              << "' is neither imagenet nor cifar");
    s.stem = stem->second;
  }
  const auto mean = meta.find("normalize_mean"), stdev = meta.find("normalize_std");
  if (mean != meta.end() || stdev != meta.end()) {
    DPT_INPUT_CHECK(mean != meta.end() && stdev != meta.end(),
                    "--load " << path << ": its metadata has only one of normalize_mean and "
                              << "normalize_std");
    try {
      s.normalize = resolve_normalize(mean->second + "/" + stdev->second, nullptr);
    } catch (const Error& e) {
      throw Error(ErrorKind::kInput,
                  DPT_MSG("--load "
                          << path << ": metadata normalize_mean and normalize_std: " << e.what()));
    }
  }
  return s;
}

// The saved model against the data: its class count, image shape and normalisation's channels.
void check_fit(const SavedModel& s, const Preflight& pf, const TrainConfig& cfg) {
  const std::string model = "--load " + cfg.load, data = "--data " + cfg.data;
  DPT_INPUT_CHECK(s.input == pf.input_shape(), model << " takes images of " << s.input[0] << "x"
                                                     << s.input[1] << "x" << s.input[2]
                                                     << " (HxWxC); " << data << " has images of "
                                                     << pf.test.shape_text());
  DPT_INPUT_CHECK(s.classes == pf.train.num_classes,
                  model << " has " << s.classes << " classes; " << data << " has "
                        << pf.train.num_classes << " (its labels)");
  DPT_INPUT_CHECK(
      !s.normalize.any() || static_cast<int64_t>(s.normalize.mean.size()) == pf.test.channels,
      model << " normalises " << s.normalize.mean.size() << " channels (" << s.normalize.text()
            << "); " << data << " has images of " << pf.test.channels << " channel(s)");
}

// A saved model on this rank's device, the same on every rank, and the data it runs on.
struct Loaded {
  TrainConfig cfg;
  Preflight pf;
  SavedModel saved;
  std::unique_ptr<Model> model;
};

// The metadata is read by rank 0 and sent to the others (only rank 0 needs the file, as for
// --resume), the pre-flight runs as for training (settings, data, outputs, device), the fit is
// checked, and rank 0's tensors are broadcast.
Loaded load_saved(const TrainConfig& cfg_in, Communicator& comm) {
  Loaded l{cfg_in, {}, {}, nullptr};
  TrainConfig& cfg = l.cfg;
  validate_config(cfg, comm.size());
  set_log_level(cfg.quiet ? LogLevel::kWarn : parse_log_level(cfg.log_level));
  omp_set_num_threads(cfg.threads);
  comm.set_timeout(cfg.timeout);
  std::string meta;
  std::map<std::string, std::string> first;  // rank 0: the metadata as read here
  const std::string reading = "reading --load " + cfg.load + " (rank 0)";
  agree_on_input(comm, "rank 0 could not read --load " + cfg.load, reading, [&] {
    if (comm.rank() != 0) return;
    check_input_file(cfg.load, "--load");
    first = read_metadata(cfg.load);
    (void)saved_model(first, cfg.load);
    meta = nlohmann::json(first).dump();
  });
  meta = allgather_text(comm, meta)[0];
  l.saved =
      saved_model(nlohmann::json::parse(meta).get<std::map<std::string, std::string>>(), cfg.load);
  // The pre-flight checks the data against the file's model; the normalisation is the file's.
  cfg.model = l.saved.model;
  cfg.stem = l.saved.stem;
  cfg.normalize = "none";
  l.pf = run_preflight(cfg, comm);
  agree_on_input(comm, "--load " + cfg.load + " does not fit --data " + cfg.data,
                 [&] { check_fit(l.saved, l.pf, cfg); });
  l.model = make_model(l.saved.model, l.saved.classes, l.pf.device->ops(), l.saved.input,
                       {l.saved.stem, false});
  l.model->set_activation_dtype(l.pf.activations);
  // The tensors are read last, after the data: a file put in the place of --load meanwhile (a
  // training's next checkpoint renamed over it) would be scored under the first one's model,
  // classes and normalisation. Every --save and checkpoint records its step, data and settings,
  // so another file's metadata differs.
  const std::string loading = "reading the tensors of --load " + cfg.load + " (rank 0)";
  agree_on_input(comm, "rank 0 could not load --load " + cfg.load, loading, [&] {
    if (comm.rank() != 0) return;
    DPT_INPUT_CHECK(load_model(cfg.load, *l.model) == first,
                    "--load " << cfg.load
                              << " changed while this run read it: its metadata differs from "
                              << "what was read at the start (another file put in its place, "
                              << "such as a training's next checkpoint); nothing was scored: "
                              << "run again, or score a copy");
  });
  ParamStore& store = l.model->store();
  comm.broadcast(store.params(), store.num_params(), 0, "broadcast of the loaded parameters");
  if (store.num_buffers() > 0)
    comm.broadcast(store.buffers(), store.num_buffers(), 0, "broadcast of the loaded buffers");
  store.from_host();
  log_info(DPT_MSG("dptrain " << cfg.command << ": " << l.saved.model << " from " << cfg.load
                              << " (" << l.saved.classes << " classes, images of "
                              << l.pf.test.shape_text() << ", normalize "
                              << l.saved.normalize.text() << "), " << l.pf.test.n
                              << " test images of " << cfg.data << ", world size " << comm.size()));
  return l;
}

// The test set's batches: [i B, (i + 1) B), B = --eval-batch-size (at most the set).
struct Batches {
  int64_t per = 1, count = 0;
};
Batches batches_of(const Loaded& l) {
  const int64_t n = l.pf.test.n, per = std::max<int64_t>(1, std::min(l.cfg.eval_batch_size, n));
  return {per, (n + per - 1) / per};
}

// A stop signal on any rank (INT, TERM, HUP, USR1: signals.h) ends every rank here with exit
// 128 + signal before anything is written. Every rank calls it at the same points.
void stop_point(const StopSignals& stop, Communicator& comm) {
  if (const int sig = stop.agreed(comm, false).first) throw Stopped{sig, -1};
}

// Every batch of this rank: `fn(batch, first image, count, logits)`, the logits float [count,
// classes] on the host. Rank r takes batches eval_range(batches, r, world); a rank that receives a
// stop signal skips the rest of its batches, and every rank agrees on stopping after them. Logits
// that are not finite (finite weights so large that they overflow float: a damaged or hand-made
// file) have no softmax: the rank that meets one skips the rest of its batches, and every rank
// ends with exit 2 naming the first such image of that rank, before anything is written.
template <typename F>
void score(Loaded& l, Communicator& comm, const StopSignals& stop, F&& fn) {
  Model& model = *l.model;
  Backend& be = model.store().backend();
  const ImageSet& test = l.pf.test;
  const int64_t n = test.n, classes = model.num_classes();
  const auto [per, batches] = batches_of(l);
  auto images = DeviceArray<uint8_t>::mirror(be, test.images.data(),
                                             static_cast<int64_t>(test.images.size()));
  auto labels =
      DeviceArray<Label>::mirror(be, test.labels.data(), static_cast<int64_t>(test.labels.size()));
  ImageBatchSpec spec;
  spec.rows = test.rows, spec.cols = test.cols, spec.channels = test.channels;
  DeviceArray<float> mean, stdev;
  if (l.saved.normalize.any()) {
    mean = DeviceArray<float>(be, test.channels);
    stdev = DeviceArray<float>(be, test.channels);
    mean.copy_from_host(l.saved.normalize.mean.data(), test.channels);
    stdev.copy_from_host(l.saved.normalize.std.data(), test.channels);
    spec.mean = mean.data(), spec.std = stdev.data();
  }
  DeviceArray<int64_t> index(be, per);
  DeviceArray<int32_t> gathered(be, per);
  std::vector<int64_t> index_host(static_cast<size_t>(per));
  std::vector<float> logits_host;
  Tensor x;
  const auto [b0, b1] = eval_range(batches, comm.rank(), comm.size());
  std::string overflow;
  for (int64_t b = b0; b < b1 && !stop.received() && overflow.empty(); ++b) {
    const int64_t first = b * per, count = std::min(per, n - first);
    std::iota(index_host.begin(), index_host.begin() + count, first);
    index.copy_from_host(index_host.data(), count);
    x.resize({count, test.rows, test.cols, test.channels}, &be);
    be.gather_images(images.data(), labels.data(), labels.size(), spec, index.data(), count,
                     x.data(), gathered.data());
    const Tensor& logits = model.forward(x, Mode::kInfer);
    logits_host.resize(static_cast<size_t>(count * classes));
    be.copy_to_host(logits_host.data(), logits.data(), logits_host.size() * sizeof(float));
    const auto it = std::find_if(logits_host.begin(), logits_host.end(),
                                 [](float v) { return !std::isfinite(v); });
    if (it != logits_host.end()) {
      const int64_t at = it - logits_host.begin();
      overflow = DPT_MSG("--load " << l.cfg.load << ": the model's logit of class " << at % classes
                                   << " for test image " << first + at / classes << " is " << *it
                                   << ": its weights overflow float (a damaged file?); nothing "
                                   << "was written");
      break;
    }
    fn(b, first, count, logits_host.data());
  }
  agree_on_input(comm,
                 "--load " + l.cfg.load + ": the model's logits are not finite (another rank)",
                 [&] { DPT_INPUT_CHECK(overflow.empty(), overflow); });
  stop_point(stop, comm);
}

// One image's scores from its float logits, in double: the log-softmax, and the classes by
// decreasing logit (ties: the lower class first, as the training loss's argmax counts a hit).
// Every log-probability is taken relative to the largest logit m, (z - m) - log(sum exp(z - m)):
// the log-sum-exp itself, m + log(sum), rounds the log away when |m| is large (logits of 1e31,
// all equal, made every probability 1 and the loss 0 instead of 0.1 and ln 10). The logits are
// finite (score refuses any other).
struct ImageScores {
  double max = 0, log_sum = 0;
  std::vector<int> order;
  double log_prob(float z) const { return (static_cast<double>(z) - max) - log_sum; }
};

ImageScores image_scores(const float* z, int64_t classes, int64_t keep) {
  ImageScores s;
  s.max = z[0];
  for (int64_t j = 1; j < classes; ++j) s.max = std::max(s.max, static_cast<double>(z[j]));
  double sum = 0;
  for (int64_t j = 0; j < classes; ++j) sum += std::exp(static_cast<double>(z[j]) - s.max);
  s.log_sum = std::log(sum);
  s.order.resize(static_cast<size_t>(classes));
  std::iota(s.order.begin(), s.order.end(), 0);
  std::partial_sort(s.order.begin(), s.order.begin() + keep, s.order.end(),
                    [&](int a, int b) { return z[a] > z[b] || (z[a] == z[b] && a < b); });
  s.order.resize(static_cast<size_t>(keep));
  return s;
}

// Classes up to which evaluate prints the confusion matrix (a wider one is only in --metrics).
constexpr int64_t kPrintedMatrix = 32;
// Classes up to which it counts the matrix at all: k * k counters are all-reduced and written,
// 8 MB for ImageNet's 1,000 classes but 3.8 GB for ImageNet-21k's 21,841; above this only each
// class's count and hits are kept.
constexpr int64_t kMatrixClasses = 1024;

// Writes `text` to rank 0's `path` (output paths are rank 0's, as in training: another rank's
// value, or its lack, changes nothing), every rank agreeing on a failure (exit 2 on all of them).
// Every rank calls it, with the flag or without.
void write_output(Communicator& comm, const std::string& path, const std::string& text,
                  const std::string& flag) {
  const std::string file = allgather_text(comm, path)[0];
  if (file.empty()) return;
  const std::string writing = "writing " + flag + " " + file + " (rank 0)";
  agree_on_input(comm, "rank 0 could not write " + flag + " " + file, writing, [&] {
    if (comm.rank() == 0) write_file_atomic(file, text, flag);
  });
}

// Rows of --output are written, and sent to rank 0, in pieces of at most this many bytes.
constexpr size_t kRowsPiece = size_t{8} << 20;

// predict's --output on rank 0, written as the rows are made: rank 0's own in pieces as it scores
// them, then every other rank's in rank order (the set's order: rank r scores a contiguous run of
// batches after rank r - 1's), each sent from it in pieces by broadcast. No rank holds more than
// its own rows and one piece (all-gathered, every rank held every rank's rows, padded, four to five
// times over, and a rank's rows past 2 GiB, the most one collective counts, ended the run with
// exit 3 after its whole scoring). The file is a temporary one beside --output (AtomicFile, made
// at the first piece), renamed over it only once whole: a stop, an error or a refusal unwinds it
// away and leaves an older file as it was. A failure to write (a full disk) is kept, so that rank
// 0 still takes part in every broadcast, and agreed on by every rank at the end (exit 2 on all).
class RowsWriter {
 public:
  // Every rank, with its own --output (rank 0's is written, as in training).
  RowsWriter(Communicator& comm, const std::string& path, std::string header)
      : comm_(comm), file_(allgather_text(comm, path)[0]), pending_(std::move(header)) {
    // A piece and a few rows' room: no doubling of the buffer on the way to a piece.
    if (comm_.rank() == 0) rows_.reserve(kRowsPiece + (size_t{1} << 20));
  }

  // This rank's rows so far: rank 0 writes them once they make a piece.
  std::string& rows() { return rows_; }
  void flush_piece() {
    if (comm_.rank() == 0 && rows_.size() >= kRowsPiece) write(rows_);
  }

  // Every rank, once scoring is done: the other ranks' rows to rank 0, and the file committed.
  void finish() {
    const std::vector<int64_t> lens = comm_.allgather(static_cast<int64_t>(rows_.size()));
    if (comm_.rank() == 0) write(rows_);
    std::vector<uint8_t> piece;
    for (int r = 1; r < comm_.size(); ++r) {
      for (int64_t at = 0; at < lens[static_cast<size_t>(r)];) {
        const int64_t n =
            std::min<int64_t>(static_cast<int64_t>(kRowsPiece), lens[static_cast<size_t>(r)] - at);
        piece.resize(static_cast<size_t>(n));
        if (comm_.rank() == r)
          std::copy_n(rows_.data() + at, static_cast<size_t>(n),
                      reinterpret_cast<char*>(piece.data()));
        comm_.broadcast(piece.data(), n, r, "broadcast of --output rows");
        if (comm_.rank() == 0) attempt([&] { out_->write(piece.data(), piece.size()); });
        at += n;
      }
    }
    if (comm_.rank() == 0)
      attempt([&] {
        if (!out_) open();
        out_->commit();
      });
    agree_on_input(comm_, "rank 0 could not write --output " + file_,
                   [&] { DPT_INPUT_CHECK(error_.empty(), error_); });
  }

 private:
  void open() {
    out_ = std::make_unique<AtomicFile>(file_, "--output");
    out_->write(pending_.data(), pending_.size());
    pending_.clear();
  }
  // Rank 0: `text` after what is written so far, then emptied (its capacity kept for the next).
  void write(std::string& text) {
    attempt([&] {
      if (!out_) open();
      out_->write(text.data(), text.size());
    });
    text.clear();
  }
  // Runs a step of the file's writing unless one failed before; an input error is kept for the
  // agreement in finish().
  template <typename F>
  void attempt(F&& fn) {
    if (!error_.empty()) return;
    try {
      fn();
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kInput) throw;
      error_ = e.what();
      out_.reset();  // its temporary file removed
    }
  }

  Communicator& comm_;
  const std::string file_;
  std::string pending_;  // the header, until the file is opened
  std::string rows_;
  std::unique_ptr<AtomicFile> out_;
  std::string error_;
};

}  // namespace

void run_evaluate(const TrainConfig& cfg_in, Communicator& comm) {
  StopSignals stop;
  Loaded l = load_saved(cfg_in, comm);
  stop_point(stop, comm);
  const int64_t k = l.saved.classes, top = std::min<int64_t>(5, k), n = l.pf.test.n;
  const int64_t batches = batches_of(l).count;
  std::vector<double> batch_loss(static_cast<size_t>(batches), 0.0);
  // The confusion matrix [true][predicted] (or, above kMatrixClasses, [true][count, hits]), then
  // the top-5 hits.
  const bool matrix = k <= kMatrixClasses;
  const int64_t cells = matrix ? k * k : 2 * k;
  std::vector<int64_t> counts(static_cast<size_t>(cells + 1), 0);
  score(l, comm, stop, [&](int64_t b, int64_t first, int64_t count, const float* z) {
    double loss = 0;
    for (int64_t i = 0; i < count; ++i) {
      const float* zi = z + i * k;
      const int label = l.pf.test.labels[static_cast<size_t>(first + i)];
      const ImageScores s = image_scores(zi, k, top);
      loss -= s.log_prob(zi[label]);
      if (matrix) {
        ++counts[static_cast<size_t>(label * k + s.order[0])];
      } else {
        ++counts[static_cast<size_t>(2 * label)];
        if (s.order[0] == label) ++counts[static_cast<size_t>(2 * label + 1)];
      }
      if (std::find(s.order.begin(), s.order.end(), label) != s.order.end())
        ++counts[static_cast<size_t>(cells)];
    }
    batch_loss[static_cast<size_t>(b)] = loss;
  });
  // Each slot holds one rank's sum and zeros elsewhere: the all-reduce adds only zeros to it.
  comm.allreduce(batch_loss.data(), batches, ReduceOp::kSum, "all-reduce of evaluation losses");
  comm.allreduce(counts.data(), static_cast<int64_t>(counts.size()), ReduceOp::kSum,
                 "all-reduce of evaluation counts");
  // Every rank has the sums: rank 0 alone prints (log_info, log_result), and every rank takes part
  // in the agreement on its --metrics write.
  double loss = 0;
  for (double v : batch_loss) loss += v;  // in batch order, whatever the world size
  int64_t correct = 0;
  nlohmann::json per_class = nlohmann::json::array(), class_count = nlohmann::json::array(),
                 confusion = nlohmann::json::array();
  std::ostringstream table;
  for (int64_t t = 0; t < k; ++t) {
    nlohmann::json row = nlohmann::json::array();
    int64_t total = matrix ? 0 : counts[static_cast<size_t>(2 * t)];
    for (int64_t p = 0; matrix && p < k; ++p) {
      const int64_t c = counts[static_cast<size_t>(t * k + p)];
      row.push_back(c);
      total += c;
    }
    const int64_t hit = counts[static_cast<size_t>(matrix ? t * k + t : 2 * t + 1)];
    correct += hit;
    if (matrix) confusion.push_back(row);
    class_count.push_back(total);
    per_class.push_back(total
                            ? nlohmann::json(static_cast<double>(hit) / static_cast<double>(total))
                            : nlohmann::json(nullptr));
    table << "  class " << t << ": ";
    if (total)
      table << static_cast<double>(hit) / static_cast<double>(total) << " (" << hit << "/" << total
            << ")";
    else
      table << "no test images";
    if (k <= kPrintedMatrix) {
      table << "  |";
      for (const auto& c : row) table << " " << c.get<int64_t>();
    }
    table << "\n";
  }
  const int64_t top5 = counts[static_cast<size_t>(cells)];
  const double dn = static_cast<double>(n);
  nlohmann::json j = {{"type", "evaluate"},
                      {"load", l.cfg.load},
                      {"model", l.saved.model},
                      {"data", l.cfg.data},
                      {"split", "test"},
                      {"count", n},
                      {"classes", k},
                      {"loss", n ? loss / dn : 0.0},
                      {"top1", n ? static_cast<double>(correct) / dn : 0.0},
                      {"top1_correct", correct},
                      {"top5", n ? static_cast<double>(top5) / dn : 0.0},
                      {"top5_correct", top5},
                      {"top5_k", top},
                      {"per_class_accuracy", per_class},
                      {"per_class_count", class_count},
                      {"confusion", matrix ? confusion : nlohmann::json(nullptr)}};
  std::ostringstream os;
  os.precision(6);
  os << (k <= kPrintedMatrix
             ? "per-class accuracy and confusion matrix (rows: true class; columns: predicted "
               "class):\n"
         : matrix ? "per-class accuracy (the confusion matrix is in --metrics):\n"
                  : "per-class accuracy (no confusion matrix above 1024 classes):\n")
     << table.str();
  log_info(os.str());
  std::ostringstream res;
  res.precision(6);
  res << "evaluate: " << n << " test images: loss " << (n ? loss / dn : 0.0) << ", top-1 "
      << (n ? static_cast<double>(correct) / dn : 0.0) << " (" << correct << "/" << n << "), top-"
      << top << " " << (n ? static_cast<double>(top5) / dn : 0.0) << " (" << top5 << "/" << n
      << ")";
  log_result(res.str());
  write_output(comm, l.cfg.metrics, j.dump() + "\n", "--metrics");
}

void run_predict(const TrainConfig& cfg_in, Communicator& comm) {
  StopSignals stop;
  Loaded l = load_saved(cfg_in, comm);
  stop_point(stop, comm);
  const int64_t k = l.saved.classes, top = std::min<int64_t>(l.cfg.top_k, k);
  std::string header = "index,label";
  for (int64_t c = 1; c <= top; ++c)
    header += ",class" + std::to_string(c) + ",prob" + std::to_string(c);
  header += "\n";
  RowsWriter out(comm, l.cfg.output, std::move(header));
  std::string& rows = out.rows();
  char cell[64];
  score(l, comm, stop, [&](int64_t, int64_t first, int64_t count, const float* z) {
    for (int64_t i = 0; i < count; ++i) {
      const float* zi = z + i * k;
      const ImageScores s = image_scores(zi, k, top);
      rows += std::to_string(first + i) + "," +
              std::to_string(l.pf.test.labels[static_cast<size_t>(first + i)]);
      for (int c : s.order) {
        std::snprintf(cell, sizeof cell, ",%d,%.6g", c, std::exp(s.log_prob(zi[c])));
        rows += cell;
      }
      rows += "\n";
      out.flush_piece();
    }
  });
  out.finish();
  log_result(DPT_MSG("predict: top-" << top << " classes of " << l.pf.test.n
                                     << " test images written to " << l.cfg.output));
}

}  // namespace dpt
