// StepEngine (see include/dpt/engine.h): one training step, evaluation and state synchronisation,
// written once over the Backend operations. A step gathers its micro-batch by index from the data
// set in backend memory, runs the Model, scores it with the backend's softmax_xent into per-batch
// totals in backend memory, hangs the Reducer on backward's gradient announcements, and updates the
// flat buffers with the backend's sgd_update or adamw_update. The host reads nothing back inside a
// step. Where the backend records work (CUDA graphs), a warm step and a warm evaluation pass are
// replayed whole.
#include "dpt/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <numeric>
#include <utility>

#include "dpt/comm.h"
#include "dpt/error.h"
#include "dpt/log.h"
#include "dpt/text.h"
#include "dpt/trace.h"

namespace dpt {

StepEngine::StepEngine(const TrainConfig& cfg, Communicator& comm, Model& model, DataParallel& ddp,
                       Optimizer& opt, const ImageSet& train, const ImageSet& test,
                       const Normalization& normalize, const AugmentSpec& augment)
    : cfg_(cfg),
      comm_(comm),
      model_(model),
      be_(model.store().backend()),
      ddp_(ddp),
      opt_(opt),
      decay_ranges_(decay_ranges(model.store(), cfg.no_decay_bn_bias)),
      classes_(model.num_classes()),
      pixels_(train.pixels()),
      batch_(cfg.batch_size / comm.size()),
      eval_batch_(std::max<int64_t>(1, std::min(cfg.eval_batch_size, test.n))),
      // The gradients are summed across ranks: each rank scales its loss by the global batch.
      grad_scale_(1.f / static_cast<float>(cfg.batch_size * cfg.accum_steps)),
      uncaught_(std::uncaught_exceptions()),
      augment_(augment) {
  DPT_CHECK(train.rows == test.rows && train.cols == test.cols && train.channels == test.channels &&
                pixels_ > 0,
            "train and test image shapes differ");
  // For an external profiler (ncu --profile-from-start off): the window of global steps it sees.
  // A diagnostic, read by each rank alone: a bad value is warned about and ignored, never an
  // error one rank raises while the others train on.
  if (const char* v = std::getenv("DPT_PROFILE_STEPS"); v && *v) {
    // Read as --trace-steps is (text.h's read_number): decimal, nothing around the numbers.
    const std::vector<std::string> ends = split_list(v, ':');
    std::optional<int64_t> a, b;
    if (ends.size() == 2) a = read_number<int64_t>(ends[0]), b = read_number<int64_t>(ends[1]);
    if (a && b && *a >= 0 && *b > *a)
      profile_from_ = *a, profile_to_ = *b;
    else
      log_warn(DPT_MSG(
          "DPT_PROFILE_STEPS=" << v << " is not A:B with 0 <= A < B (global steps): ignored"));
  }
  eval_spec_.rows = train.rows, eval_spec_.cols = train.cols, eval_spec_.channels = train.channels;
  if (normalize.any()) {
    mean_ = DeviceArray<float>(be_, train.channels);
    std_ = DeviceArray<float>(be_, train.channels);
    set_normalization(normalize);
    eval_spec_.mean = mean_.data(), eval_spec_.std = std_.data();
  }
  train_spec_ = eval_spec_;
  if (augment_.any()) {
    step_draws_ = DeviceArray<uint32_t>(be_, batch_);
    train_spec_.pad = augment_.pad;
    train_spec_.draws = step_draws_.data();  // a fixed address, as a recorded step needs
  }
  train_images_ = DeviceArray<uint8_t>::mirror(be_, train.images.data(),
                                               static_cast<int64_t>(train.images.size()));
  train_labels_ = DeviceArray<Label>::mirror(be_, train.labels.data(),
                                             static_cast<int64_t>(train.labels.size()));
  test_images_ = DeviceArray<uint8_t>::mirror(be_, test.images.data(),
                                              static_cast<int64_t>(test.images.size()));
  test_labels_ =
      DeviceArray<Label>::mirror(be_, test.labels.data(), static_cast<int64_t>(test.labels.size()));
  std::vector<int64_t> iota(static_cast<size_t>(test.n));
  std::iota(iota.begin(), iota.end(), int64_t{0});
  test_index_ = DeviceArray<int64_t>(be_, test.n);
  test_index_.copy_from_host(iota.data(), test.n);
  step_index_ = DeviceArray<int64_t>(be_, batch_);
  step_stats_ = DeviceArray<double>(be_, 2);
  eval_sums_ = DeviceArray<double>(be_, 2);
  labels_ = DeviceArray<int32_t>(be_, batch_);
  eval_labels_ = DeviceArray<int32_t>(be_, eval_batch_);
  lr_ = DeviceArray<float>(be_, 1);
  step_sumsq_ = DeviceArray<double>(be_, 1);
  const int64_t n = model.store().num_params();
  DPT_CHECK(opt.adamw() == (cfg.optimizer == "adamw"),
            "optimizer " << opt.name() << " for --optimizer " << cfg.optimizer);
  if (!opt.momentum_buffer().empty()) {
    DPT_CHECK(static_cast<int64_t>(opt.momentum_buffer().size()) == n, "momentum buffer size");
    momentum_ = DeviceArray<float>(be_, n);
  }
  if (opt.adamw()) {
    DPT_CHECK(static_cast<int64_t>(opt.exp_avg().size()) == n &&
                  static_cast<int64_t>(opt.exp_avg_sq().size()) == n,
              "AdamW moment sizes");
    exp_avg_ = DeviceArray<float>(be_, n);
    exp_avg_sq_ = DeviceArray<float>(be_, n);
    adamw_step_ = DeviceArray<double>(be_, 1);
  }
  x_.resize({batch_, train.rows, train.cols, train.channels}, &be_);
  dlogits_.resize({batch_, classes_}, &be_);
  // A recorded step must be static: one micro-batch per optimizer step, collectives the transport
  // can record (NCCL, or none), and no --trace (whose spans time the phases of an eager step).
  step_graph_ = cfg.cuda_graphs ? be_.make_recorder() : nullptr;
  eval_graphs_on_ = step_graph_ != nullptr;
  step_graphs_ = step_graph_ && cfg.accum_steps == 1 && cfg.trace.empty() &&
                 ddp.reducer().transport().capturable();
  if (eval_graphs_on_ && !step_graphs_ && comm.rank() == 0)
    log_debug(DPT_MSG(
        "CUDA graphs for evaluation only: training steps need --accum-steps 1, no --trace and "
        "NCCL ("
        << (ddp.reducer().transport().capturable() ? "as configured" : "ranks share a GPU")
        << ")"));
  from_host();
}

// Into the arrays the specs point at (fixed addresses: a recorded step reads them).
void StepEngine::set_normalization(const Normalization& normalize) {
  DPT_CHECK(
      static_cast<int64_t>(normalize.mean.size()) == channels() &&
          normalize.std.size() == normalize.mean.size() && mean_.size() == channels(),
      "normalisation of " << normalize.mean.size() << " channels for images of " << channels());
  mean_.copy_from_host(normalize.mean.data(), channels());
  std_.copy_from_host(normalize.std.data(), channels());
}

StepEngine::~StepEngine() {
  // Unwinding from an error, collectives may never complete (a dead peer) and every teardown call
  // that waits for the device would hang the job instead of ending it: abandon the backend's state
  // (the process is about to end). Otherwise drain the collectives first, bounded by --timeout.
  bool abandon = std::uncaught_exceptions() > uncaught_;
  if (!abandon) {
    try {
      quiesce();
      be_.synchronize();  // nothing queued may outlive the buffers freed next
    } catch (const std::exception& e) {
      log_warn(DPT_MSG("teardown of the " << be_.name() << " backend: " << e.what()));
      abandon = true;
    }
  }
  if (abandon) be_.abandon();
}

void StepEngine::begin_epoch(const ShardedSampler& sampler, int64_t batches) {
  DPT_CHECK(sampler.local_batch() == batch_,
            "sampler batch " << sampler.local_batch() << " != " << batch_);
  // The previous epoch's gathers may still be queued: the new indices go in stream order after
  // them.
  index_host_.resize(static_cast<size_t>(std::max<int64_t>(batches, 1) * batch_));
  for (int64_t i = 0; i < batches; ++i)
    std::copy(sampler.local_indices(i), sampler.local_indices(i) + batch_,
              index_host_.begin() + i * batch_);
  const int64_t indices = static_cast<int64_t>(index_host_.size()),
                stats = 2 * std::max<int64_t>(batches, 1);
  const int64_t steps = std::max<int64_t>(batches / cfg_.accum_steps, 1);
  if (epoch_index_.size() < indices || batch_stats_.size() < stats || grad_sumsq_.size() < steps) {
    quiesce();  // the old arrays may still be read by queued work, which may wait for collectives
    epoch_index_ = DeviceArray<int64_t>(be_, indices);
    batch_stats_ = DeviceArray<double>(be_, stats);
    grad_sumsq_ = DeviceArray<double>(be_, steps);
    if (augment_.any()) epoch_draws_ = DeviceArray<uint32_t>(be_, indices);
  }
  epoch_index_.copy_from_host(index_host_.data(), indices);
  if (augment_.any()) {
    // Drawn per (seed, epoch, image): the same image gets the same crop and flip at any rank count.
    draws_host_.resize(index_host_.size());
    for (size_t i = 0; i < index_host_.size(); ++i)
      draws_host_[i] = image_draw(augment_, cfg_.seed, sampler.epoch(), index_host_[i]);
    epoch_draws_.copy_from_host(draws_host_.data(), indices);
  }
  be_.zero(batch_stats_.data(), static_cast<size_t>(stats) * sizeof(double));
  batches_ = batches;
  epoch_first_ = step_first_ = last_ = -1;
  // Allocations happen between epochs (evaluation shapes, this method): a step graph that one rank
  // can no longer replay is dropped by every rank, so all ranks replay or capture alike.
  if (step_graphs_ && step_graph_->exists() &&
      !all_ranks(step_graph_->valid(), "agreement on replaying the step's CUDA graph"))
    step_graph_->reset();  // not warm either: its last run was a replay
}

void StepEngine::step(int64_t first_batch, int64_t step, double lr, Tracer* tr) {
  DPT_CHECK(first_batch >= 0 && first_batch + cfg_.accum_steps <= batches_,
            "micro-batches [" << first_batch << ", " << first_batch + cfg_.accum_steps
                              << ") outside the epoch's " << batches_);
  const bool first = opt_.steps() == 0;  // momentum starts from the first gradient
  if (step == profile_from_) be_.profiler_window(true);
  if (epoch_first_ < 0) epoch_first_ = first_batch;
  step_first_ = first_batch;
  last_ = first_batch + cfg_.accum_steps - 1;
  be_.store_scalar(lr_.data(), static_cast<float>(lr));
  Reducer& reducer = ddp_.reducer();
  if (step_graphs_) {
    count_training_forward();  // one micro-batch: a recorded step has no accumulation
    recorded_step(first_batch, step, first);
  } else {
    {
      // The parameters change only in update(), below: the backend converts the weights for its
      // kernels once for all the micro-batches.
      WeightsFixed fixed(be_);
      for (int micro = 0; micro < cfg_.accum_steps; ++micro) {
        const bool sync = micro + 1 == cfg_.accum_steps;
        count_training_forward();
        stage_in(first_batch + micro);
        if (sync) reducer.begin(step);
        forward_backward(sync, micro > 0, tr);
        stage_out(first_batch + micro);
      }
    }
    {
      TraceScope span(tr, "wait for all-reduce", "wait");
      reducer.wait();
    }
    TraceScope span(tr, "optimizer", "optimizer");
    update(first);
  }
  be_.copy(grad_sumsq_.data() + step_first_ / cfg_.accum_steps, step_sumsq_.data(), sizeof(double));
  stats_ = reducer.last_stats();
  if (std::exchange(replayed_, false)) stats_.comm_seconds = stats_.exposed_seconds = 0;
  opt_.set_steps(opt_.steps() + 1);
  if (step + 1 == profile_to_) be_.profiler_window(false);
}

// Before each training forward: each BatchNorm adds 1 to its num_batches_tracked float, exact up to
// 2^24, so after 2^24 forwards the count moves to the host's int64 first (a few one-float copies
// each way, in stream order, between steps: once per 2^24 micro-batches on a GPU). The float
// stopped at 2^24, so a run past 16777216 steps saved that count ever after. Every rank folds at
// the same forward: the counters stay equal across ranks.
void StepEngine::count_training_forward() {
  constexpr int64_t kExactInFloat = int64_t{1} << 24;
  if (forwards_since_fold_ >= kExactInFloat) {
    model_.store().fold_counters();
    forwards_since_fold_ = 0;
  }
  ++forwards_since_fold_;
}

// A micro-batch's indices to the step's fixed index array; its loss/correct totals back out to the
// epoch's per-batch slots. Copies in stream order, outside any recording.
void StepEngine::stage_in(int64_t batch) {
  be_.copy(step_index_.data(), epoch_index_.data() + batch * batch_,
           static_cast<size_t>(batch_) * sizeof(int64_t));
  if (augment_.any())
    be_.copy(step_draws_.data(), epoch_draws_.data() + batch * batch_,
             static_cast<size_t>(batch_) * sizeof(uint32_t));
}

void StepEngine::stage_out(int64_t batch) {
  be_.copy(batch_stats_.data() + 2 * batch, step_stats_.data(), 2 * sizeof(double));
}

// The staged micro-batch: gather, forward, loss, backward; with sync, backward hands each finished
// gradient range to the reducer (whose begin() the caller has called).
void StepEngine::forward_backward(bool sync, bool accumulate, Tracer* tr) {
  {
    TraceScope span(tr, "data", "data");
    be_.gather_images(train_images_.data(), train_labels_.data(), train_labels_.size(), train_spec_,
                      step_index_.data(), batch_, x_.data(), labels_.data());
  }
  const Tensor* logits;
  {
    TraceScope span(tr, "forward", "forward");
    logits = &model_.forward(x_, Mode::kTrain);
  }
  be_.softmax_xent(logits->data(), labels_.data(), batch_, classes_, grad_scale_,
                   static_cast<float>(cfg_.label_smoothing), dlogits_.data(), step_stats_.data(),
                   false);
  TraceScope span(tr, "backward", "backward");
  BackwardCtx ctx = ddp_.backward_ctx(sync, accumulate, tr);
  model_.backward(dlogits_, ctx);
}

// The optimizer over the flat buffers, at the learning rate stored in lr_: the all-reduced
// gradients' sum of squares first (the same on every rank), which the update reads to skip a
// non-finite step and to clip (--clip-grad-norm). One call per run of the buffer with its own
// weight decay (--no-decay-bn-bias); without it one call over everything.
void StepEngine::update(bool first) {
  ParamStore& m = model_.store();
  be_.sum_squares(m.device_grads(), m.num_params(), step_sumsq_.data());
  const auto clip = static_cast<float>(cfg_.clip_grad_norm);
  for (size_t r = 0; r < decay_ranges_.size(); ++r) {
    const int64_t at = decay_ranges_[r].begin, count = decay_ranges_[r].end - at;
    const double wd = decay_ranges_[r].decay ? cfg_.weight_decay : 0.0;
    if (opt_.adamw()) {
      be_.adamw_update(m.device_params() + at, m.device_grads() + at, exp_avg_.data() + at,
                       exp_avg_sq_.data() + at, count, lr_.data(), adamw_step_.data(),
                       r + 1 == decay_ranges_.size(), cfg_.betas[0], cfg_.betas[1], cfg_.eps, wd,
                       step_sumsq_.data(), clip);
    } else {
      be_.sgd_update(m.device_params() + at, m.device_grads() + at,
                     momentum_.size() > 0 ? momentum_.data() + at : nullptr, count, lr_.data(),
                     static_cast<float>(cfg_.momentum), static_cast<float>(wd), cfg_.nesterov,
                     first, step_sumsq_.data(), clip);
    }
  }
}

std::vector<double> StepEngine::epoch_grad_sumsq() {
  if (epoch_first_ < 0) return {};
  // Steps of the epoch run so far, as indices within it (micro-batches / accumulation).
  const int64_t first_step = epoch_first_ / cfg_.accum_steps,
                last_step = step_first_ / cfg_.accum_steps;
  quiesce();
  std::vector<double> out(static_cast<size_t>(last_step - first_step + 1));
  grad_sumsq_.copy_to_host(out.data(), static_cast<int64_t>(out.size()), first_step);
  return out;
}

double StepEngine::last_grad_sumsq() {
  if (step_first_ < 0) return 0;
  quiesce();
  double v = 0;
  grad_sumsq_.copy_to_host(&v, 1, step_first_ / cfg_.accum_steps);
  return v;
}

std::string StepEngine::first_nonfinite_gradient() {
  quiesce();
  ParamStore& store = model_.store();
  store.grads_to_host();
  const Param* first = nullptr;
  for (const Param& p : store.entries()) {
    if (p.is_buffer || (first && p.offset > first->offset)) continue;
    const float* g = store.grads() + p.offset;
    if (std::any_of(g, g + p.numel(), [](float v) { return !std::isfinite(v); })) first = &p;
  }
  return first ? first->name : "";
}

// Whether `mine` holds on every rank: an MPI all-reduce where the step holds collectives (which
// NCCL requires to be captured on all ranks or on none), else this rank's value.
bool StepEngine::all_ranks(bool mine, const char* what) {
  if (comm_.size() == 1) return mine;
  int32_t v = mine ? 1 : 0;
  comm_.allreduce(&v, 1, ReduceOp::kMin, what);
  return v == 1;
}

// One micro-batch as one whole step: replayed from the recording when it is valid, captured once a
// step has run eagerly without allocating (warm) on every rank, else eager. The run's first step is
// always eager (it starts the momentum buffer, which a replay must not repeat).
void StepEngine::recorded_step(int64_t batch, int64_t step, bool first) {
  Reducer& r = ddp_.reducer();
  ReduceTransport& t = r.transport();
  Recorder& graph = *step_graph_;
  if (graph.exists() && !graph.valid()) {
    // Nothing allocates inside an epoch once warm, and begin_epoch drops recordings that went
    // stale.
    DPT_CHECK(
        comm_.size() == 1,
        "rank " << comm_.rank()
                << " allocated device memory inside an epoch after capturing "
                   "its step's CUDA graph; replaying on the other ranks would desynchronise NCCL");
    graph.reset();  // one rank, no collectives: just capture again when warm
  }
  r.begin(step);  // collectives two steps back, bounded by --timeout
  stage_in(batch);
  // Uniform across ranks: the replay state was agreed in begin_epoch, and the capture decision is
  // agreed here (only on eager steps, i.e. while warming up).
  const bool capture = !graph.exists() && all_ranks(!first && graph.warm(),
                                                    "agreement on capturing the step's CUDA graph");
  auto prepare = [&](bool capturing) {
    t.set_capturing(capturing);
    r.begin(step);  // a dropped capture may have counted some gradients already
  };
  auto body = [&] {
    {
      // As in step(): the weights converted once for the forward and backward passes (on the GPU
      // the layers' filter copies, whose conversion a captured step then holds as a node).
      WeightsFixed fixed(be_);
      forward_backward(true, false, nullptr);
    }
    r.wait();
    update(first);
  };
  const auto ran = graph.run(capture, prepare, body, [&](bool captured) {
    return all_ranks(captured, "agreement on the CUDA graph capture of the step");
  });
  t.set_capturing(false);
  if (ran != Recorder::Ran::kEager) t.graph_launched(step);
  // A replay is not timed (no events inside a graph), and no wait() ran to say so.
  replayed_ = ran == Recorder::Ran::kReplayed;
  if (ran == Recorder::Ran::kCaptured && comm_.rank() == 0)
    log_debug(DPT_MSG("CUDA graph of the training step captured at step "
                      << step << ": " << graph.nodes() << " nodes"));
  if (capture && ran == Recorder::Ran::kEager) {
    // Not retried (on any rank: the verdict was agreed): a collective queued into a dropped capture
    // is not worth a second risk.
    log_warn(DPT_MSG("CUDA graph capture of the training step failed on rank "
                     << comm_.rank() << " (" << graph.failure() << "): steps run without graphs"));
    step_graphs_ = false;
  }
  stage_out(batch);
}

std::optional<Totals> StepEngine::evaluate(int64_t begin, int64_t end,
                                           const std::function<bool()>& stop) {
  Totals t;
  if (end <= begin) return t;
  quiesce();
  WeightsFixed fixed(be_);  // no parameter changes during an evaluation
  // Asked between batches when they run one by one: a stop signal during a long evaluation (a
  // large test set on a CPU) waited for its end, past a batch system's warning time, and the
  // epoch's checkpoint comes after it. Never inside a capture: the graph must hold every batch.
  bool asking = false, cut = false;
  auto body = [&] {
    for (int64_t s = begin; s < end; s += eval_batch_) {
      if (asking && stop()) {
        cut = true;
        break;
      }
      const int64_t b = std::min(eval_batch_, end - s);
      eval_x_.resize({b, x_.dim(1), x_.dim(2), x_.dim(3)}, &be_);
      be_.gather_images(test_images_.data(), test_labels_.data(), test_labels_.size(), eval_spec_,
                        test_index_.data() + s, b, eval_x_.data(), eval_labels_.data());
      const Tensor& logits = model_.forward(eval_x_, Mode::kInfer);
      be_.softmax_xent(logits.data(), eval_labels_.data(), b, classes_, 0.f, 0.f, nullptr,
                       eval_sums_.data(), s != begin);
    }
  };
  if (!eval_graphs_on_) {
    asking = static_cast<bool>(stop);
    body();
    if (cut) return std::nullopt;  // the caller records no test metrics
  } else {
    // No collectives inside: each rank decides alone. Captured on the pass over the same range
    // after an eager one that allocated nothing (the first allocates the evaluation shapes'
    // buffers and workspaces).
    auto& graph = eval_graphs_[{begin, end}];
    if (!graph) graph = be_.make_recorder();
    const bool capture = graph->warm();
    const auto ran = graph->run(
        capture, [](bool) {}, body, [](bool captured) { return captured; });
    if (ran == Recorder::Ran::kCaptured)
      log_debug(DPT_MSG("CUDA graph of the evaluation of test images ["
                        << begin << ", " << end << ") captured: " << graph->nodes() << " nodes"));
    if (capture && ran == Recorder::Ran::kEager) {
      log_warn(DPT_MSG("CUDA graph capture of the evaluation failed ("
                       << graph->failure() << "): evaluation runs without graphs"));
      eval_graphs_on_ = false;
    }
  }
  double sums[2] = {0, 0};
  eval_sums_.copy_to_host(sums, 2);
  t.loss = sums[0];
  t.correct = static_cast<int64_t>(sums[1]);
  t.count = end - begin;
  return t;
}

void StepEngine::sync_buffers() {
  if (comm_.size() == 1) return;  // as DataParallel::sync_buffers: nothing to average
  quiesce();
  ParamStore& store = model_.store();
  store.buffers_to_host();
  ddp_.sync_buffers();
  store.buffers_from_host();
}

void StepEngine::to_host() {
  quiesce();
  model_.store().to_host();
  momentum_.copy_to_host(opt_.momentum_buffer().data(), momentum_.size());
  exp_avg_.copy_to_host(opt_.exp_avg().data(), exp_avg_.size());
  exp_avg_sq_.copy_to_host(opt_.exp_avg_sq().data(), exp_avg_sq_.size());
  if (opt_.adamw()) {
    double t = 0;
    adamw_step_.copy_to_host(&t, 1);
    opt_.set_adamw_step(static_cast<int64_t>(t));
  }
}

void StepEngine::from_host() {
  quiesce();
  model_.store().from_host();
  // The counters' floats now hold the host's counts since their last fold (a model trained by an
  // earlier engine; a checkpoint loaded: 0). Folded here (a one-float copy each way per counter),
  // they all count from 0, so the next fold is 2^24 forwards away.
  model_.store().fold_counters();
  forwards_since_fold_ = 0;
  momentum_.copy_from_host(opt_.momentum_buffer().data(), momentum_.size());
  exp_avg_.copy_from_host(opt_.exp_avg().data(), exp_avg_.size());
  exp_avg_sq_.copy_from_host(opt_.exp_avg_sq().data(), exp_avg_sq_.size());
  if (opt_.adamw()) {
    const auto t = static_cast<double>(opt_.adamw_step());
    adamw_step_.copy_from_host(&t, 1);
  }
}

// Micro-batches [first, last_] of the epoch, summed within each optimizer step first, then the
// steps in order (the order in which a rank's totals have always been summed).
Totals StepEngine::totals(int64_t first) {
  Totals t;
  if (first < 0 || last_ < first) return t;
  quiesce();
  const int64_t count = last_ - first + 1;
  stats_host_.resize(static_cast<size_t>(2 * count));
  batch_stats_.copy_to_host(stats_host_.data(), 2 * count, 2 * first);
  double step_loss = 0, step_hits = 0;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t batch = first + i;
    step_loss += stats_host_[static_cast<size_t>(2 * i)];
    step_hits += stats_host_[static_cast<size_t>(2 * i + 1)];
    if ((batch + 1) % cfg_.accum_steps == 0 || batch == last_) {
      t.loss += step_loss;
      t.correct += static_cast<int64_t>(step_hits);
      step_loss = step_hits = 0;
    }
  }
  t.count = count * batch_;
  return t;
}

}  // namespace dpt
