// The training loop. It reads like single-device training: the DataParallel wrapper hides the
// ranks (broadcast, bucketed all-reduce during backward, BatchNorm buffer averaging). Each rank
// trains on its shard of every global batch; evaluation is split across ranks and reduced.
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cpu/ops.h"
#include "dpt/checkpoint.h"
#include "dpt/comm.h"
#include "dpt/ddp.h"
#include "dpt/error.h"
#include "dpt/idx.h"
#include "dpt/log.h"
#include "dpt/train.h"

namespace dpt {

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Resolves --device on this build: a CUDA device is used only by the GPU backend (later issue).
std::string resolve_device(const std::string& want) {
  if (want == "cuda")
    throw Error(ErrorKind::kInput,
                "--device cuda: no CUDA device visible to this build (the GPU backend is not "
                "available); use --device cpu or auto");
  return "cpu";
}

struct EvalResult {
  double loss_sum = 0;
  int64_t correct = 0, count = 0;
};

EvalResult evaluate(DataParallel& ddp, const ImageSet& test, int64_t batch, Tensor& x,
                    std::vector<int32_t>& labels) {
  Communicator& comm = ddp.comm();
  auto [begin, end] = eval_range(test.n, comm.rank(), comm.size());
  EvalResult r;
  std::vector<int64_t> idx;
  for (int64_t s = begin; s < end; s += batch) {
    const int64_t b = std::min(batch, end - s);
    idx.resize(static_cast<size_t>(b));
    for (int64_t i = 0; i < b; ++i) idx[static_cast<size_t>(i)] = s + i;
    x.resize({b, test.rows, test.cols, 1});
    images_to_float(test, idx.data(), b, x.data());
    labels.resize(static_cast<size_t>(b));
    for (int64_t i = 0; i < b; ++i) labels[static_cast<size_t>(i)] = test.labels[static_cast<size_t>(s + i)];
    const Tensor& logits = ddp.forward(x, Mode::kEval);
    int64_t hits = 0;
    r.loss_sum += cpu::softmax_xent(logits.data(), labels.data(), b, logits.dim(1), 0.f, nullptr, &hits);
    r.correct += hits;
    r.count += b;
  }
  double sums[3] = {r.loss_sum, static_cast<double>(r.correct), static_cast<double>(r.count)};
  comm.allreduce(sums, 3, ReduceOp::kSum, "all-reduce of evaluation counts");
  return {sums[0], static_cast<int64_t>(sums[1]), static_cast<int64_t>(sums[2])};
}

}  // namespace

std::vector<EpochMetrics> run_training(const TrainConfig& cfg_in, Communicator& comm) {
  TrainConfig cfg = cfg_in;
  const int world = comm.size(), rank = comm.rank();
  validate_config(cfg, world);
  set_log_level(cfg.quiet ? LogLevel::kWarn : parse_log_level(cfg.log_level));
  omp_set_num_threads(cfg.threads);
  comm.set_timeout(cfg.timeout);
  const std::string device = resolve_device(cfg.device);
  if (cfg.scale_lr) {
    // Linear scaling rule (Goyal et al.): the rate grows with the batch, after a warm-up.
    cfg.lr *= static_cast<double>(cfg.batch_size) / 256.0;
    cfg.warmup_epochs = std::max(cfg.warmup_epochs, 1.0);
  }

  const double t_load = now();
  ImageSet train = load_image_set(cfg.data, "train");
  ImageSet test = load_image_set(cfg.data, "t10k");
  DPT_INPUT_CHECK(train.rows == 28 && train.cols == 28 && test.rows == 28 && test.cols == 28,
                  cfg.data << ": images are " << train.rows << "x" << train.cols
                           << ", the models need 28x28");
  log_debug(DPT_MSG("data loaded in " << now() - t_load << " s"));

  auto model = make_model(cfg.model, train.num_classes);
  model->init_parameters(cfg.init, cfg.seed);
  DdpOptions dopt;
  dopt.bucket_mb = cfg.bucket_mb;
  dopt.overlap = cfg.overlap;
  dopt.sync_bn = cfg.sync_bn;
  DataParallel ddp(*model, comm, dopt);
  ParamStore& store = model->store();
  Sgd opt(store.num_params(), cfg.momentum, cfg.weight_decay);
  ShardedSampler sampler(train.n, cfg.batch_size, rank, world, cfg.seed);

  // Which host each rank runs on, for the banner.
  std::vector<char> host(64, 0), hosts(static_cast<size_t>(64 * world));
  std::snprintf(host.data(), host.size(), "%s", comm.host().c_str());
  comm.allgather(reinterpret_cast<uint8_t*>(host.data()), reinterpret_cast<uint8_t*>(hosts.data()), 64);
  if (rank == 0) {
    std::ostringstream os;
    os << "dptrain: " << cfg.model << " (" << store.num_params() << " parameters), world size "
       << world << ", " << cfg.threads << " thread(s) per rank\n";
    for (int r = 0; r < world; ++r) os << "  rank " << r << ": " << hosts.data() + 64 * r << ", " << device << "\n";
    os << "  gradient buckets: " << ddp.reducer().buckets().size() << " (cap " << cfg.bucket_mb
       << " MiB, overlap " << (cfg.overlap ? "on" : "off") << ")\n";
    os << "configuration:\n" << cfg.to_text();
    log_info(os.str());
  }

  std::ofstream metrics;
  if (rank == 0 && !cfg.metrics.empty()) {
    metrics.open(cfg.metrics, std::ios::trunc);
    DPT_INPUT_CHECK(metrics.good(), "--metrics: cannot write " << cfg.metrics);
  }

  const int64_t batches = sampler.steps_per_epoch();
  int64_t steps = batches / cfg.accum_steps;
  DPT_INPUT_CHECK(steps >= 1, "--accum-steps " << cfg.accum_steps << " leaves no optimizer step in an epoch of "
                                               << batches << " batches");
  if (cfg.max_steps > 0) steps = std::min(steps, cfg.max_steps);
  const int64_t b = sampler.local_batch();
  const float grad_scale = 1.f / static_cast<float>(cfg.batch_size * cfg.accum_steps);
  Tensor x({b, 28, 28, 1}), dlogits({b, train.num_classes});
  std::vector<int32_t> labels(static_cast<size_t>(b));
  Tensor ex;
  std::vector<int32_t> elabels;
  std::vector<EpochMetrics> history;
  int64_t global_step = 0;

  for (int epoch = 0; epoch < cfg.epochs; ++epoch) {
    sampler.set_epoch(epoch);
    double loss_sum = 0, comm_s = 0, exposed_s = 0, lr = 0;
    int64_t correct = 0, seen = 0;
    const double t0 = now();
    for (int64_t s = 0; s < steps; ++s, ++global_step) {
      for (int micro = 0; micro < cfg.accum_steps; ++micro) {
        const int64_t* idx = sampler.local_indices(s * cfg.accum_steps + micro);
        images_to_float(train, idx, b, x.data());
        for (int64_t i = 0; i < b; ++i) labels[static_cast<size_t>(i)] = train.labels[static_cast<size_t>(idx[i])];
        const Tensor& logits = ddp.forward(x, Mode::kTrain);
        int64_t hits = 0;
        loss_sum += cpu::softmax_xent(logits.data(), labels.data(), b, logits.dim(1), grad_scale,
                                      dlogits.data(), &hits);
        correct += hits;
        seen += b;
        const bool last = micro + 1 == cfg.accum_steps;
        ddp.backward(dlogits, global_step, /*sync=*/last, /*accumulate=*/micro > 0);
      }
      ddp.finish_gradient_sync();
      lr = learning_rate(cfg, global_step, steps);
      opt.step(store.params(), store.grads(), lr);
      comm_s += ddp.reducer().last_stats().comm_seconds;
      exposed_s += ddp.reducer().last_stats().exposed_seconds;
      if (cfg.verify_every > 0 && (global_step + 1) % cfg.verify_every == 0) ddp.verify_replicas(global_step);
    }
    const double train_seconds = now() - t0;
    double tsum[3] = {loss_sum, static_cast<double>(correct), static_cast<double>(seen)};
    comm.allreduce(tsum, 3, ReduceOp::kSum, "all-reduce of training metrics");
    ddp.sync_buffers();
    EvalResult ev = evaluate(ddp, test, cfg.eval_batch_size, ex, elabels);

    EpochMetrics m;
    m.epoch = epoch + 1;
    m.train_loss = tsum[0] / tsum[2];
    m.train_acc = tsum[1] / tsum[2];
    m.train_count = static_cast<int64_t>(tsum[2]);
    m.test_loss = ev.loss_sum / static_cast<double>(ev.count);
    m.test_acc = static_cast<double>(ev.correct) / static_cast<double>(ev.count);
    m.test_count = ev.count;
    m.steps = steps;
    m.lr = lr;
    m.epoch_seconds = train_seconds;
    m.images_per_second = tsum[2] / train_seconds;
    m.comm_seconds = comm_s;
    m.exposed_comm_seconds = exposed_s;
    m.world_size = world;
    history.push_back(m);
    if (rank == 0) {
      char line[256];
      std::snprintf(line, sizeof line,
                    "epoch %d/%d  loss %.4f  train acc %.4f  test acc %.4f  %.2f s/epoch  %.0f img/s",
                    m.epoch, cfg.epochs, m.train_loss, m.train_acc, m.test_acc, m.epoch_seconds,
                    m.images_per_second);
      if (cfg.quiet && epoch + 1 == cfg.epochs) std::printf("%s\n", line);
      log_info(line);
      if (metrics.is_open()) {
        metrics << m.to_json() << "\n";
        metrics.flush();
      }
    }
  }
  if (!cfg.save.empty()) {
    // Buffers were averaged before the last evaluation; parameters are identical by construction.
    if (rank == 0)
      save_model(cfg.save, *model,
                 {{"config", cfg.to_json()}, {"epoch", std::to_string(cfg.epochs)},
                  {"step", std::to_string(global_step)}, {"seed", std::to_string(cfg.seed)},
                  {"world_size", std::to_string(world)}, {"format", "dptrain-model-v1"}});
    comm.barrier();
    log_info("saved " + cfg.save);
  }
  return history;
}

}  // namespace dpt
