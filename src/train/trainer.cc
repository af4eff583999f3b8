// The training loop. It reads like single-device training: the DataParallel wrapper hides the
// ranks (broadcast, bucketed all-reduce during backward, BatchNorm buffer averaging), the
// StepEngine (engine.h) computes a step over the Backend operations, and the components around it
// each own one job: the pre-flight (preflight.h), the device (device.h), checkpoints
// (checkpoint.h), rank 0's outputs (metrics.h), stop signals (signals.h), the non-finite guard
// (guard.h). Each rank trains on its shard of every global batch; evaluation is split and reduced.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <thread>

#include "dpt/checkpoint.h"
#include "dpt/clock.h"
#include "dpt/comm.h"
#include "dpt/config.h"
#include "dpt/ddp.h"
#include "dpt/engine.h"
#include "dpt/error.h"
#include "dpt/log.h"
#include "dpt/metrics.h"
#include "dpt/model_file.h"
#include "dpt/models.h"
#include "dpt/nn.h"
#include "dpt/optimizer.h"
#include "dpt/preflight.h"
#include "dpt/run.h"
#include "dpt/safetensors.h"
#include "dpt/sampler.h"
#include "dpt/text.h"
#include "dpt/trace.h"
#include "train/guard.h"
#include "train/signals.h"

namespace dpt {

namespace {

// What every epoch of a run uses, built once by run_training.
struct Run {
  const TrainConfig& cfg;
  Communicator& comm;
  const std::vector<std::string>& hosts;
  Model& model;
  DataParallel& ddp;
  ShardedSampler& sampler;
  StepEngine& engine;
  CheckpointManager& checkpoints;
  MetricsLogger& log;
  NonFiniteGuard& guard;
  StopSignals& signals;
  Tracer& tracer;
  Tracer* tr;              // &tracer with --trace, else null
  int64_t batches, steps;  // micro-batches and optimizer steps per epoch
  int64_t test_n;
  double slow_factor;  // DPT_FAULT_SLOW_RANK on this rank, else 1
};

// DPT_FAULT_SLOW_RANK=r:f, an operator's fault injection (as NCCL's NCCL_* test settings are):
// rank r's steps take f times their own time, by a sleep after each one, so that the straggler
// watch, --timeout and the wait figures can be seen at work with certainty, whatever else loads
// the machine. Returns this rank's factor (1: not slowed); a value that does not parse, a rank
// outside the world or a factor outside 1..1000 is an input error naming the variable.
double slow_factor(int rank, int world) {
  const char* v = std::getenv("DPT_FAULT_SLOW_RANK");
  if (!v || !*v) return 1;
  // Read as the flags' numbers are (text.h's read_number): decimal, nothing around them.
  const std::vector<std::string> parts = split_list(v, ':');
  std::optional<int> rank_read;
  std::optional<double> factor_read;
  if (parts.size() == 2)
    rank_read = read_number<int>(parts[0]), factor_read = read_number<double>(parts[1]);
  const int r = rank_read.value_or(-1);
  const double f = factor_read.value_or(0);
  DPT_INPUT_CHECK(
      rank_read && factor_read && f >= 1 && f <= 1000,
      "DPT_FAULT_SLOW_RANK=" << v << ": want RANK:FACTOR, a factor from 1 to 1000 (e.g. 1:10)");
  DPT_INPUT_CHECK(r >= 0 && r < world, "DPT_FAULT_SLOW_RANK=" << v << ": rank " << r
                                                              << " does not exist at world size "
                                                              << world);
  if (r != rank) return 1;
  log_warn(DPT_MSG("DPT_FAULT_SLOW_RANK=" << v << ": fault injection: this rank's steps take " << f
                                          << " times their time"));
  return f;
}

// An epoch's sums over its steps (seconds, images) and the last learning rate.
struct EpochTally {
  double comm_s = 0, exposed_s = 0, step_s = 0, boundary_wait_s = 0, lr = 0;
  int64_t seen = 0;
};

// Evaluation split across ranks (rank r scores eval_range), totals summed over all of them. A rank
// that receives a stop signal scores no more batches (StopSignals::received: ranks score different
// counts, so they agree after, in the same all-reduce): then no rank has test metrics this epoch
// (empty totals), and the next step boundary stops the run with its checkpoint, as ever.
Totals evaluate(StepEngine& engine, Communicator& comm, int64_t test_n, const StopSignals& stop,
                int epoch, bool last) {
  auto [begin, end] = eval_range(test_n, comm.rank(), comm.size());
  log_debug(
      DPT_MSG("evaluating test images [" << begin << ", " << end << ") of epoch " << epoch + 1));
  const std::optional<Totals> mine =
      engine.evaluate(begin, end, [&] { return stop.received() != 0; });
  const Totals r = mine.value_or(Totals{});
  double sums[4] = {r.loss, static_cast<double>(r.correct), static_cast<double>(r.count),
                    mine ? 0.0 : 1.0};
  comm.allreduce(sums, 4, ReduceOp::kSum, "all-reduce of evaluation counts");
  if (sums[3] > 0) {
    if (comm.rank() == 0)
      log_warn(DPT_MSG("a stop signal ended the evaluation of epoch "
                       << epoch + 1 << " early on " << sums[3]
                       << " rank(s): no test metrics for it; "
                       << (last ? "training is complete, so the run ends as it would have"
                                : "the run stops at the next step boundary, after its "
                                  "checkpoint")));
    return {};
  }
  return {sums[0], static_cast<int64_t>(sums[1]), static_cast<int64_t>(sums[2])};
}

// --init-from: rank 0 reads the file into its freshly initialised model (a classifier head of
// another class count keeps its initial values), and DataParallel's start-up broadcast of rank 0's
// parameters and buffers makes every replica that model, so no other rank needs the file.
void init_from(const TrainConfig& cfg, Communicator& comm, Model& model, const Preflight& pf) {
  std::vector<std::string> head;
  const std::string reading = "reading --init-from " + cfg.init_from + " (rank 0)";
  agree_on_input(comm, "rank 0 could not start from --init-from " + cfg.init_from, reading, [&] {
    if (comm.rank() != 0) return;
    const std::string what = "--init-from " + cfg.init_from;
    const auto meta = read_metadata(cfg.init_from);
    // What read_metadata alone can tell, before the tensors are read.
    const auto norm = meta.find("normalize");
    if (norm != meta.end() && norm->second != pf.normalize.text())
      log_warn(DPT_MSG(what << ": the model was trained with --normalize "
                            << printable(norm->second) << ", this run uses "
                            << pf.normalize.text()));
    head = init_from_file(cfg.init_from, model, model_spec(cfg.model).head);
  });
  if (comm.rank() != 0) return;
  std::string kept;
  for (const std::string& h : head) kept += (kept.empty() ? "" : ", ") + h;
  if (kept.empty())
    log_info("starting from --init-from " + cfg.init_from);
  else
    log_info(DPT_MSG("starting from --init-from " << cfg.init_from << "; the classifier head is "
                                                  << "re-initialised for " << model.num_classes()
                                                  << " classes: " << kept));
}

// The start-up banner of rank 0: model, ranks with their hosts and devices, buckets, configuration.
void print_banner(const TrainConfig& cfg, Communicator& comm, const Model& model, DataParallel& ddp,
                  const Preflight& pf, const std::vector<std::string>& devices) {
  if (comm.rank() != 0) return;
  std::ostringstream os;
  os << "dptrain: " << cfg.model << " (" << model.num_parameters() << " parameters), world size "
     << comm.size() << ", " << cfg.threads << " thread(s) per rank\n";
  for (int r = 0; r < comm.size(); ++r)
    os << "  rank " << r << ": " << pf.hosts[static_cast<size_t>(r)] << ", "
       << devices[static_cast<size_t>(r)] << "\n";
  os << "  data: " << pf.data_format << ", " << pf.train.n << " training and " << pf.test.n
     << " test images of " << pf.train.shape_text() << " (HxWxC), " << pf.train.num_classes
     << " classes; normalize " << pf.normalize.text() << ", augment " << pf.augment.text() << "\n";
  os << "  gradient buckets: " << ddp.reducer().buckets().size() << " (cap " << cfg.bucket_mb
     << " MiB, overlap " << (cfg.overlap ? "on" : "off") << ")\n";
  os << "configuration:\n" << cfg.to_text();
  log_info(os.str());
}

// A step boundary inside an epoch (`any_step_since`: this run took a step since the epoch or the
// resume began): a stop signal (checkpoint, then exit 128 + signal), else a checkpoint due by
// steps or by rank 0's clock; `so_far` gives the epoch's sums for it (a collective). Returns the
// seconds spent waiting for the peers in the agreement.
double at_boundary(Run& r, const Position& at, bool any_step_since,
                   const std::function<EpochSoFar()>& so_far) {
  const double t0 = now_seconds();
  const auto [sig, minutes_due] =
      r.signals.agreed(r.comm, any_step_since && r.checkpoints.minutes_due());
  const double waited = now_seconds() - t0;
  if (sig) {
    if (r.cfg.checkpoints()) {
      // At an epoch's first boundary the epoch's own checkpoint may be this very step's already.
      if (!r.checkpoints.saved_at(at.global_step))
        r.checkpoints.save(at, r.log.history(), so_far());
      log_info(DPT_MSG(signal_name(sig)
                       << ": checkpoint of epoch " << at.epoch + 1 << " step " << at.epoch_step
                       << " written to " << checkpoint_file(r.cfg, at.global_step)));
    } else if (r.comm.rank() == 0) {
      log_warn(DPT_MSG(signal_name(sig) << ": stopping at global step " << at.global_step
                                        << " without a checkpoint (--checkpoint-every is off)"));
    }
    throw Stopped{sig, at.global_step};
  }
  if (any_step_since) r.checkpoints.save_if_due(at, false, minutes_due, r.log.history(), so_far);
  return waited;
}

// The diagnostics of a step: replica check, step record, progress bar.
void after_step(Run& r, const Position& at, int64_t first, const EpochTally& t,
                const ReducerStats& rs, double step_t0, double epoch_t0) {
  const TrainConfig& cfg = r.cfg;
  const int64_t global_step = at.global_step;
  if (cfg.verify_every > 0 && (global_step + 1) % cfg.verify_every == 0) {
    r.engine.to_host();
    r.ddp.verify_replicas(global_step);
  }
  if (cfg.metrics_every > 0 && (global_step + 1) % cfg.metrics_every == 0) {
    // The step's global loss: an all-reduce on every rank at the same steps.
    const Totals step = r.engine.step_totals();
    double st[3] = {step.loss, static_cast<double>(step.correct),
                    static_cast<double>(r.sampler.local_batch() * cfg.accum_steps)};
    r.comm.allreduce(st, 3, ReduceOp::kSum, "all-reduce of step metrics");
    if (r.comm.rank() == 0)
      r.log.step_record({static_cast<int>(at.epoch) + 1, global_step + 1, st[0] / st[2],
                         st[1] / st[2], t.lr, std::sqrt(r.engine.last_grad_sumsq()),
                         st[2] / (now_seconds() - step_t0), rs.comm_seconds, rs.exposed_seconds,
                         r.comm.size()});
  }
  const int64_t s = at.epoch_step;
  if (r.log.progress() && ((s + 1) % 5 == 0 || s + 1 == r.steps)) {
    const double el = now_seconds() - epoch_t0;
    r.log.draw_progress(static_cast<int>(at.epoch) + 1, s + 1 - first, r.steps - first,
                        r.engine.epoch_totals().loss / static_cast<double>(t.seen),
                        static_cast<double>(t.seen * r.comm.size()) / el, el);
  }
}

// The epoch's sums: `before` (those of its steps before this run, carried by the checkpoint
// resumed) and this run's `steps` steps, whose totals on this rank are `et`, summed over the
// ranks, with the squared gradient norms of those steps (StepEngine::epoch_grad_sumsq). The norms
// are added on in step order, as the uninterrupted run adds them. Collective.
EpochSoFar add_epoch_part(Run& r, EpochSoFar sums, const Totals& et, const EpochTally& t,
                          const std::vector<double>& sumsq, int64_t steps, double seconds) {
  double tsum[3] = {et.loss, static_cast<double>(et.correct), static_cast<double>(t.seen)};
  r.comm.allreduce(tsum, 3, ReduceOp::kSum, "all-reduce of training metrics");
  sums.loss += tsum[0];
  sums.correct += static_cast<int64_t>(tsum[1]);
  sums.count += static_cast<int64_t>(tsum[2]);
  sums.steps += steps;
  sums.seconds += seconds;
  sums.comm_seconds += t.comm_s;
  sums.exposed_seconds += t.exposed_s;
  for (const double s : sumsq) {
    if (!std::isfinite(s)) {
      ++sums.nonfinite;
      continue;
    }
    const double norm = std::sqrt(s);
    sums.norm_sum += norm, sums.norm_max = std::max(sums.norm_max, norm), ++sums.applied;
  }
  return sums;
}

// The epoch's record from its tally (and `before`: see add_epoch_part): the global training
// totals, every rank's timings per step of this run (compute = time in its steps less the exposed
// all-reduce wait; wait = that wait plus the boundaries' agreement), the evaluation when due.
// Collective.
EpochMetrics epoch_metrics(Run& r, int epoch, int64_t first, int64_t global_step, EpochTally t,
                           double t0, const EpochSoFar& before) {
  const TrainConfig& cfg = r.cfg;
  const bool host_backend = r.model.store().backend().host_memory();
  // A GPU finishes the epoch's queued work here: the time counts, as the images were only queued.
  const double drain_t0 = now_seconds();
  const Totals et = r.engine.epoch_totals();
  const double train_seconds = now_seconds() - t0;
  t.step_s += now_seconds() - drain_t0;
  const std::vector<double> sumsq = r.engine.epoch_grad_sumsq();
  // A device backend's steps are checked here (its non-finite steps were not applied either).
  if (!host_backend)
    for (size_t i = 0; i < sumsq.size(); ++i)
      r.guard.check(sumsq[i], global_step - static_cast<int64_t>(sumsq.size() - i), epoch);
  const EpochSoFar all = add_epoch_part(r, before, et, t, sumsq, r.steps - first, train_seconds);
  const double n_steps = static_cast<double>(r.steps - first);
  const double mine[2] = {n_steps > 0 ? std::max(0.0, t.step_s - t.exposed_s) / n_steps : 0,
                          n_steps > 0 ? (t.exposed_s + t.boundary_wait_s) / n_steps : 0};
  std::vector<double> timings(2 * static_cast<size_t>(r.comm.size()));
  r.comm.allgather(mine, timings.data(), 2);
  r.engine.sync_buffers();
  const bool eval_now =
      cfg.eval_every > 0 && ((epoch + 1) % cfg.eval_every == 0 || epoch + 1 == cfg.epochs);
  const Totals ev =
      eval_now ? evaluate(r.engine, r.comm, r.test_n, r.signals, epoch, epoch + 1 == cfg.epochs)
               : Totals{};

  EpochMetrics m;
  m.epoch = epoch + 1;
  const double count = static_cast<double>(all.count);
  m.train_loss = count > 0 ? all.loss / count : 0;
  m.train_acc = count > 0 ? static_cast<double>(all.correct) / count : 0;
  m.train_count = all.count;
  // Not evaluated this epoch: NaN, written as null in the metrics JSON.
  m.test_loss = ev.count ? ev.loss / static_cast<double>(ev.count) : std::nan("");
  m.test_acc =
      ev.count ? static_cast<double>(ev.correct) / static_cast<double>(ev.count) : std::nan("");
  m.test_count = ev.count;
  m.steps = all.steps;
  m.lr = t.lr;
  m.epoch_seconds = all.seconds;
  m.images_per_second = count / all.seconds;
  m.train_tflops = m.images_per_second * 3.0 * static_cast<double>(r.model.forward_flops()) / 1e12;
  m.comm_seconds = all.comm_seconds;
  m.exposed_comm_seconds = all.exposed_seconds;
  // Of the applied steps; none applied (every step skipped): null in --metrics, as a step's is.
  m.grad_norm = all.applied ? all.norm_sum / static_cast<double>(all.applied) : std::nan("");
  m.grad_norm_max = all.applied ? all.norm_max : std::nan("");
  m.nonfinite_steps = all.nonfinite;
  m.world_size = r.comm.size();
  set_rank_timings(m, timings);
  return m;
}

// One epoch from step `first` of it (`before`: the sums of the steps before it, from the checkpoint
// resumed); returns the global step after it.
int64_t run_epoch(Run& r, int epoch, int64_t first, int64_t global_step, const EpochSoFar& before) {
  const TrainConfig& cfg = r.cfg;
  const bool host_backend = r.model.store().backend().host_memory();
  r.sampler.set_epoch(epoch);
  r.engine.begin_epoch(r.sampler, r.batches);
  EpochTally t;
  const double t0 = now_seconds();

  // ---- the steps ----
  for (int64_t s = first; s < r.steps; ++s, ++global_step) {
    const Position at{epoch, s, global_step};
    t.boundary_wait_s += at_boundary(r, at, s > first, [&] {
      return add_epoch_part(r, before, r.engine.epoch_totals(), t, r.engine.epoch_grad_sumsq(),
                            s - first, now_seconds() - t0);
    });
    if (r.tr && global_step == cfg.trace_begin) r.tracer.start(r.comm);
    if (r.tr && global_step == cfg.trace_end) r.tracer.stop();
    const double step_t0 = now_seconds();
    t.lr = learning_rate(cfg, global_step, r.steps);
    r.engine.step(s * cfg.accum_steps, global_step, t.lr, r.tr);
    const ReducerStats rs = r.engine.reducer_stats();
    if (r.slow_factor > 1) {
      // The step's own time (less its wait for the peers) made slow_factor times as long.
      const double own = std::max(0.0, now_seconds() - step_t0 - rs.exposed_seconds);
      std::this_thread::sleep_for(std::chrono::duration<double>(own * (r.slow_factor - 1)));
    }
    t.step_s += now_seconds() - step_t0;
    t.seen += r.sampler.local_batch() * cfg.accum_steps;
    // A host backend has the sum at once; a device one is checked at the epoch's end.
    if (host_backend) r.guard.check(r.engine.last_grad_sumsq(), global_step, epoch);
    t.comm_s += rs.comm_seconds;
    t.exposed_s += rs.exposed_seconds;
    after_step(r, at, first, t, rs, step_t0, t0);
  }
  r.log.end_progress();

  // ---- the epoch's record, its outputs and its checkpoint ----
  const EpochMetrics m = epoch_metrics(r, epoch, first, global_step, t, t0, before);
  r.log.epoch_done(m, r.hosts);
  r.checkpoints.save_if_due({m.epoch, 0, global_step}, true, false, r.log.history());
  return global_step;
}

// Where the loop starts: the resumed position, recomputed in the new units when the settings
// changed on purpose (--allow-config-change: the images of the epoch already trained on stay done,
// rounded down to a whole step of the new size, so up to a step's images less one are trained
// again; the log says how many).
Position start_position(const TrainConfig& cfg, const ResumePoint& start, int64_t steps) {
  Position at = start.at;
  if (start.images_per_step_then > 0) {
    const int64_t now_per_step = cfg.batch_size * cfg.accum_steps;
    const int64_t done = at.epoch_step * start.images_per_step_then;
    at.epoch_step = std::min(steps, done / now_per_step);
    at.global_step = at.epoch * steps + at.epoch_step;
    const int64_t again = done - at.epoch_step * now_per_step;
    log_info(DPT_MSG(
        "--allow-config-change: continuing at epoch "
        << at.epoch + 1 << ", step " << at.epoch_step << " (global step " << at.global_step << ")"
        << (again > 0
                ? DPT_MSG(": the epoch's " << done << " images trained so far "
                                           << "are not a whole number of steps of " << now_per_step
                                           << ", so the last " << again << " are trained again")
                : std::string())));
  }
  DPT_INPUT_CHECK(at.epoch_step <= steps, "--resume: the checkpoint is at step "
                                              << at.epoch_step
                                              << " of its epoch, but epochs now have " << steps
                                              << " steps");
  return at;
}

}  // namespace

std::vector<EpochMetrics> run_training(const TrainConfig& cfg_in, Communicator& comm) {
  TrainConfig cfg = cfg_in;
  const int world = comm.size(), rank = comm.rank();
  // A stop signal: every rank finishes its step, agrees on stopping at the next boundary,
  // checkpoints if configured, and main exits with 128 + signal. Until signals.hold() below (the
  // start-up), it ends the job at once.
  StopSignals signals;
  validate_config(cfg, world);
  set_log_level(cfg.quiet ? LogLevel::kWarn : parse_log_level(cfg.log_level));
  omp_set_num_threads(cfg.threads);
  comm.set_timeout(cfg.timeout);
  if (cfg.scale_lr) apply_scale_lr(&cfg);
  Preflight pf = run_preflight(cfg, comm);
  // From here on the configuration holds the activation type the device resolved, not "auto":
  // checkpoints and --save record it, the banner shows it, and a resume compares types, so a run
  // resumed where auto resolves otherwise (the legacy cuDNN API, the CPU) is a changed setting.
  cfg.activation_dtype = pf.activations == DType::kBF16 ? "bf16" : "fp32";

  // The model on the device's operations, its gradients' transport, the optimizer, the engine.
  ComputeDevice& device = *pf.device;
  auto model = make_model(cfg.model, pf.train.num_classes, device.ops(), pf.input_shape(),
                          {cfg.stem, cfg.zero_init_residual});
  model->set_activation_dtype(pf.activations);
  auto transport = device.transport(comm, model->store().device_grads(), model->num_parameters(),
                                    grad_wire_dtype(cfg.grad_dtype));
  model->init_parameters(cfg.init, cfg.seed);
  if (!cfg.init_from.empty()) init_from(cfg, comm, *model, pf);
  DdpOptions dopt;
  dopt.bucket_mb = cfg.bucket_mb;
  dopt.last_bucket_mb = cfg.last_bucket_mb;
  dopt.overlap = cfg.overlap;
  dopt.sync_bn = cfg.sync_bn;
  dopt.grad_dtype = grad_wire_dtype(cfg.grad_dtype);
  DataParallel ddp(*model, comm, dopt, std::move(transport));
  Optimizer opt(model->num_parameters(), cfg);
  ShardedSampler sampler(pf.train.n, cfg.batch_size, rank, world, cfg.seed);
  StepEngine engine(cfg, comm, *model, ddp, opt, pf.train, pf.test, pf.normalize, pf.augment);
  print_banner(cfg, comm, *model, ddp, pf, allgather_text(comm, engine.describe()));

  double slow = 1;
  agree_on_input(comm, "DPT_FAULT_SLOW_RANK: another rank refused its value",
                 [&] { slow = slow_factor(rank, world); });

  // Where training starts, and what it writes: from here on a stop signal waits for the agreed
  // stop at a step boundary (before, the start-up ended at once: it had nothing to save).
  signals.hold();
  CheckpointManager checkpoints(cfg, comm, *model, ddp, opt, engine, input_metadata(pf));
  const ResumePoint start = cfg.resume.empty() ? ResumePoint{} : checkpoints.load(pf.checkpoints);
  MetricsLogger log(cfg, rank, world, start.history, start.resumed, start.at.epoch,
                    start.at.global_step);
  if (pf.ranks_outnumber_cores) {
    log.watch_stragglers(false);
    if (rank == 0)
      log_info(
          "the straggler watch is off: on some host the ranks outnumber the cores, so they "
          "take turns and one rank's slower steps say nothing of its host");
  }
  const int64_t batches = sampler.steps_per_epoch();
  int64_t steps = batches / cfg.accum_steps;
  DPT_INPUT_CHECK(steps >= 1, "--accum-steps " << cfg.accum_steps
                                               << " leaves no optimizer step in an epoch of "
                                               << batches << " batches");
  if (cfg.max_steps > 0) steps = std::min(steps, cfg.max_steps);
  const Position at = start_position(cfg, start, steps);
  // The resumed epoch's sums, in this run's steps (another batch under --allow-config-change: the
  // position's; images trained again count again).
  EpochSoFar so_far = start.so_far;
  if (so_far.steps > 0) so_far.steps = at.epoch_step;
  checkpoints.claim(at.global_step, static_cast<int64_t>(cfg.epochs) * steps, pf.checkpoints);

  Tracer tracer;
  NonFiniteGuard guard(cfg, comm, engine);
  Run r{cfg,
        comm,
        pf.hosts,
        *model,
        ddp,
        sampler,
        engine,
        checkpoints,
        log,
        guard,
        signals,
        tracer,
        cfg.trace.empty() ? nullptr : &tracer,
        batches,
        steps,
        pf.test.n,
        slow};
  ddp.reducer().set_tracer(r.tr);
  int64_t global_step = at.global_step;
  if (start.resumed && at.epoch >= cfg.epochs)
    log_info(DPT_MSG("the checkpoint resumed is at epoch "
                     << at.epoch + 1 << ", step " << at.epoch_step << ", past --epochs "
                     << cfg.epochs << ": nothing is left to train"));
  for (int epoch = static_cast<int>(at.epoch); epoch < cfg.epochs; ++epoch)
    global_step = epoch == at.epoch ? run_epoch(r, epoch, at.epoch_step, global_step, so_far)
                                    : run_epoch(r, epoch, 0, global_step, {});
  // The stretch after the last checkpoint (Nsteps, N epochs or Nmin that did not fall on the end).
  if (global_step > at.global_step)
    checkpoints.save_last({cfg.epochs, 0, global_step}, log.history());

  // --save before the trace: the trained model is the run's result, and nothing of the trace's
  // (its size above all) may cost it.
  checkpoints.save_final(global_step);
  if (r.tr) {
    try {
      // The collectives come first inside; only rank 0's file writing can throw here.
      const int64_t dropped = tracer.write(comm, cfg.trace, comm.host());
      // The tracer starts at step A itself (run_epoch), so a window past the run's last step, or
      // one a resumed run began after, traces less than --trace-steps says, or nothing: say so,
      // rather than report an empty file as the window written.
      const int64_t first = at.global_step, end = global_step;  // this run's steps: [first, end)
      const bool started = cfg.trace_begin >= first && cfg.trace_begin < end;
      const std::string window =
          std::to_string(cfg.trace_begin) + ":" + std::to_string(cfg.trace_end);
      const std::string traced = started ? std::to_string(cfg.trace_begin) + ":" +
                                               std::to_string(std::min(cfg.trace_end, end))
                                         : "";
      if (comm.rank() == 0 && (!started || cfg.trace_end > end))
        log_warn(DPT_MSG("--trace-steps "
                         << window << ": this run's global steps were " << first << ":" << end
                         << " (the trace starts at step " << cfg.trace_begin << " itself): "
                         << (started ? "only steps " + traced + " were traced"
                                     : "no step was traced, " + cfg.trace + " has no spans")));
      if (comm.rank() == 0 && dropped > 0)
        log_warn(DPT_MSG("--trace-steps "
                         << window << ": the trace keeps at most " << Tracer::kMaxSpans
                         << " spans (" << tracer.share() << " per rank at this world size), and "
                         << dropped << " more were dropped: the window's last steps are missing "
                         << "from " << cfg.trace << "; a narrower --trace-steps is traced whole"));
      log_info("trace of steps " + (started ? traced : std::string("(none)")) + " written to " +
               cfg.trace);
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kInput) throw;
      log.output_failed("--trace", e.what());
    }
  }
  log.report_failures();
  return log.ran();
}

}  // namespace dpt
