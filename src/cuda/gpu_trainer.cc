// GpuBackend (see gpu_trainer.h): the data sets live on the device; a step gathers its batch by
// index, runs the Model (built on the CUDA operations backend), scores it with kernels/softmax_xent into per-batch device totals, hangs
// the GpuReducer on backward's gradient announcements and updates the flat buffers with
// kernels/sgd_update. The host reads nothing back inside a step; it waits (bounded) only for the
// previous step's collectives. Once warm, a whole step (forward, backward, NCCL all-reduces,
// optimizer) and a whole evaluation pass are replayed as CUDA graphs. Only compiled in GPU builds.
#include "cuda/gpu_trainer.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <map>
#include <numeric>
#include <utility>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/cuda_graph.h"
#include "cuda/cuda_backend.h"
#include "cuda/gpu_reducer.h"
#include "cuda/nccl_communicator.h"
#include "dpt/comm.h"
#include "dpt/ddp.h"
#include "dpt/device.h"
#include "dpt/idx.h"
#include "dpt/log.h"
#include "dpt/trace.h"
#include "gather_images.cuh"
#include "loss_sums.cuh"
#include "sgd_update.cuh"
#include "softmax_xent.cuh"
#include "store_scalar.cuh"

namespace dpt {

namespace {

using gpu::DeviceBuffer;

// A device copy of a host array (uploaded once; the copy completes before this returns).
template <typename T>
DeviceBuffer upload(gpu::GpuContext& ctx, const T* host, size_t count) {
  DeviceBuffer d(std::max<size_t>(count, 1) * sizeof(T));
  if (count) CUDA_CHECK(cudaMemcpyAsync(d.as<void>(), host, count * sizeof(T), cudaMemcpyHostToDevice, ctx.stream()));
  ctx.synchronize();
  return d;
}

// Whether two ranks would drive the same physical GPU (NCCL refuses that): every rank's device
// UUID, gathered. UUIDs, not local ranks against device counts, so per-rank CUDA_VISIBLE_DEVICES
// (Slurm's --gpus-per-task) is recognised as distinct GPUs.
bool ranks_share_a_gpu(Communicator& comm, const cudaDeviceProp& prop) {
  constexpr int64_t kBytes = sizeof(prop.uuid.bytes);
  std::vector<uint8_t> mine(kBytes), all(static_cast<size_t>(kBytes * comm.size()));
  std::memcpy(mine.data(), prop.uuid.bytes, kBytes);
  comm.allgather(mine.data(), all.data(), kBytes);
  for (int a = 0; a < comm.size(); ++a)
    for (int b = a + 1; b < comm.size(); ++b)
      if (std::memcmp(all.data() + a * kBytes, all.data() + b * kBytes, kBytes) == 0) return true;
  return false;
}

// What this backend keeps on the device, in one object so that an error path can abandon it whole
// (see ~GpuBackend; the model and the context are the CudaBackend's, abandoned with it). Members
// are destroyed in reverse order: buffers, reducer, NCCL.
struct GpuState {
  std::unique_ptr<Communicator> nccl;
  std::unique_ptr<gpu::GpuReducer> reducer;
  DeviceBuffer momentum;
  DeviceBuffer train_images, train_labels, test_images, test_labels, test_index;
  DeviceBuffer epoch_index;  // int64: this rank's indices of every micro-batch of the epoch
  DeviceBuffer batch_stats;  // double [batches][2]: loss sum and correct count of each micro-batch
  DeviceBuffer labels, loss_rows, correct_rows;
  // Fixed addresses a step reads and writes, so a CUDA graph can replay it: the micro-batch's
  // indices and its loss/correct totals are copied in and out around it, the learning rate stored.
  DeviceBuffer step_index, step_stats, lr;
  DeviceBuffer eval_labels, eval_loss_rows, eval_correct_rows, eval_sums;
  Tensor x, dlogits, eval_x;
  // Destroyed before the buffers they point into (members go in reverse order).
  gpu::StreamGraph step_graph;
  std::map<std::pair<int64_t, int64_t>, gpu::StreamGraph> eval_graphs;  // by test range
};

class GpuBackend : public TrainBackend {
 public:
  GpuBackend(const TrainConfig& cfg, Communicator& comm, gpu::CudaBackend& be, Model& model, DataParallel& ddp,
             Sgd& opt, const ImageSet& train, const ImageSet& test)
      : cfg_(cfg),
        comm_(comm),
        be_(be),
        model_(model),
        ddp_(ddp),
        opt_(opt),
        classes_(model.num_classes()),
        pixels_(train.rows * train.cols),
        batch_(cfg.batch_size / comm.size()),
        eval_batch_(std::max<int64_t>(1, std::min(cfg.eval_batch_size, test.n))),
        // Gradients are averaged across ranks (ncclAvg), so each rank scales by its own images.
        grad_scale_(1.f / static_cast<float>(batch_ * cfg.accum_steps)),
        uncaught_(std::uncaught_exceptions()) {
    DPT_CHECK(&model.store().backend() == &be, "the GPU backend needs a model built on the CUDA operations");
    const int device = be.context().device();
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    describe_ = DPT_MSG("cuda:" << device << " (" << prop.name << ")");
    const bool shared = comm.size() > 1 && ranks_share_a_gpu(comm, prop);
    if (shared && comm.rank() == 0)
      log_info("ranks share a GPU (NCCL needs one per rank): gradients are averaged by MPI through host memory");

    s_ = std::make_unique<GpuState>();
    gpu::GpuContext& ctx = be.context();
    if (comm.size() > 1 && !shared) s_->nccl = make_nccl_communicator(comm, device);
    const int64_t n = model.store().num_params();
    if (comm.size() > 1) {
      s_->reducer = std::make_unique<gpu::GpuReducer>(ctx, model.store().device_grads(), n, ddp.reducer().buckets(),
                                                      cfg.overlap, s_->nccl.get(), comm);
      if (cfg.sync_bn) {
        // Replaces DataParallel's host all-reduce: the statistics are in device memory here.
        gpu::GpuReducer* r = s_->reducer.get();
        model.net().visit([r](Layer& l) {
          set_batchnorm_sync(l, [r](double* data, int64_t count) {
            r->allreduce_doubles(data, count, "sync-bn statistics");
          });
        });
      }
    }
    if (cfg.momentum > 0) {
      s_->momentum = DeviceBuffer(static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(float));
      DPT_CHECK(static_cast<int64_t>(opt.momentum_buffer().size()) == n, "momentum buffer size");
    }

    DPT_CHECK(train.rows == test.rows && train.cols == test.cols && pixels_ > 0, "train and test image sizes differ");
    s_->train_images = upload(ctx, train.images.data(), train.images.size());
    s_->train_labels = upload(ctx, train.labels.data(), train.labels.size());
    s_->test_images = upload(ctx, test.images.data(), test.images.size());
    s_->test_labels = upload(ctx, test.labels.data(), test.labels.size());
    std::vector<int64_t> iota(static_cast<size_t>(test.n));
    std::iota(iota.begin(), iota.end(), int64_t{0});
    s_->test_index = upload(ctx, iota.data(), iota.size());

    s_->step_index = DeviceBuffer(static_cast<size_t>(batch_) * sizeof(int64_t));
    s_->step_stats = DeviceBuffer(2 * sizeof(double));
    s_->lr = DeviceBuffer(sizeof(float));
    s_->labels = DeviceBuffer(static_cast<size_t>(batch_) * sizeof(int32_t));
    s_->loss_rows = DeviceBuffer(static_cast<size_t>(batch_) * sizeof(float));
    s_->correct_rows = DeviceBuffer(static_cast<size_t>(batch_) * sizeof(int32_t));
    s_->eval_labels = DeviceBuffer(static_cast<size_t>(eval_batch_) * sizeof(int32_t));
    s_->eval_loss_rows = DeviceBuffer(static_cast<size_t>(eval_batch_) * sizeof(float));
    s_->eval_correct_rows = DeviceBuffer(static_cast<size_t>(eval_batch_) * sizeof(int32_t));
    s_->eval_sums = DeviceBuffer(2 * sizeof(double));
    s_->x.resize({batch_, train.rows, train.cols, 1}, &be);
    s_->dlogits.resize({batch_, classes_}, &be);
    // CUDA graphs need a static step: one micro-batch per optimizer step, NCCL (not host MPI) for
    // the collectives, and no --trace (whose spans time the phases of an eager step).
    step_graphs_ = cfg.cuda_graphs && cfg.accum_steps == 1 && cfg.trace.empty() &&
                   (!s_->reducer || s_->reducer->uses_nccl());
    eval_graphs_ = cfg.cuda_graphs;
    if (cfg.cuda_graphs && !step_graphs_ && comm.rank() == 0)
      log_debug(DPT_MSG("CUDA graphs for evaluation only: training steps need --accum-steps 1, no --trace and "
                        "NCCL (" << (s_->reducer && !s_->reducer->uses_nccl() ? "ranks share a GPU" : "as configured")
                                 << ")"));
    from_host();
  }

  ~GpuBackend() override {
    // Unwinding from an error, collectives may never complete (a dead peer) and every teardown call
    // that waits for the device would hang the job instead of ending it: abandon the device state
    // (the process is about to end). Otherwise drain the collectives first, bounded by --timeout.
    bool abandon = std::uncaught_exceptions() > uncaught_;
    if (!abandon && s_) {
      try {
        quiesce();
        ctx().synchronize();  // nothing queued may outlive the buffers freed next
      } catch (const std::exception& e) {
        log_warn(DPT_MSG("GPU teardown: " << e.what()));
        abandon = true;
      }
    }
    if (abandon) {
      be_.abandon();  // the model's tensors and the context are leaked with it
      (void)s_.release();
    }
  }

  std::string describe() const override { return describe_; }

  void begin_epoch(const ShardedSampler& sampler, int64_t batches) override {
    DPT_CHECK(sampler.local_batch() == batch_, "sampler batch " << sampler.local_batch() << " != " << batch_);
    gpu::GpuContext& ctx = this->ctx();
    // The previous epoch's gathers may still be queued: the new indices go in stream order after them.
    // `index_host_` stays alive until the next upload (pageable copies are staged when queued anyway).
    index_host_.resize(static_cast<size_t>(std::max<int64_t>(batches, 1) * batch_));
    for (int64_t i = 0; i < batches; ++i)
      std::copy(sampler.local_indices(i), sampler.local_indices(i) + batch_, index_host_.begin() + i * batch_);
    const size_t index_bytes = index_host_.size() * sizeof(int64_t);
    const size_t stats_bytes = static_cast<size_t>(std::max<int64_t>(batches, 1)) * 2 * sizeof(double);
    if (s_->epoch_index.bytes() < index_bytes || s_->batch_stats.bytes() < stats_bytes) {
      quiesce();
      ctx.synchronize();  // the old buffers may still be read by queued kernels
      s_->epoch_index = DeviceBuffer(index_bytes);
      s_->batch_stats = DeviceBuffer(stats_bytes);
    }
    CUDA_CHECK(cudaMemcpyAsync(s_->epoch_index.as<void>(), index_host_.data(), index_bytes, cudaMemcpyHostToDevice,
                               ctx.stream()));
    CUDA_CHECK(cudaMemsetAsync(s_->batch_stats.as<void>(), 0, stats_bytes, ctx.stream()));
    batches_ = batches;
    epoch_first_ = step_first_ = last_ = -1;
    // Allocations happen between epochs (evaluation shapes, this method): a step graph that one
    // rank can no longer replay is dropped by every rank, so all ranks replay or capture alike.
    gpu::StreamGraph& graph = s_->step_graph;
    if (step_graphs_ && graph.exists() && !all_ranks(graph.valid(), "agreement on replaying the step's CUDA graph"))
      graph.reset();  // not warm either: its last run was a replay
  }

  void micro_step(int64_t batch, int64_t step, bool sync, bool accumulate, Tracer* tr) override {
    DPT_CHECK(batch >= 0 && batch < batches_, "micro-batch " << batch << " outside the epoch's " << batches_);
    if (epoch_first_ < 0) epoch_first_ = batch;
    if (!accumulate) step_first_ = batch;
    last_ = batch;
    if (step_graphs_) {
      // The whole step runs in optimizer_step, as one graph once warm.
      DPT_CHECK(sync && !accumulate, "a CUDA-graph step has one micro-batch");
      deferred_batch_ = batch;
      deferred_step_ = step;
      return;
    }
    stage_in(batch);
    if (sync && s_->reducer) s_->reducer->begin(step);
    forward_backward(sync, accumulate, tr);
    stage_out(batch);
  }

  void finish_gradient_sync() override {
    if (s_->reducer && deferred_batch_ < 0) s_->reducer->finish();
  }

  ReducerStats reducer_stats() const override { return s_->reducer ? s_->reducer->last_stats() : ReducerStats{}; }

  void optimizer_step(double lr) override {
    const bool first = opt_.steps() == 0;  // momentum starts from the first gradient
    CUDA_CHECK(cuda::launch_store_scalar(s_->lr.as<float>(), static_cast<float>(lr), ctx().stream()));
    if (deferred_batch_ >= 0) {
      graph_step(first);
    } else {
      update(first);
    }
    opt_.set_steps(opt_.steps() + 1);
  }

  Totals step_totals() override { return totals(step_first_); }
  Totals epoch_totals() override { return totals(epoch_first_); }

  Totals evaluate(int64_t begin, int64_t end) override {
    Totals t;
    if (end <= begin) return t;
    quiesce();
    gpu::GpuContext& ctx = this->ctx();
    const cudaStream_t st = ctx.stream();
    auto body = [&] {
      for (int64_t s = begin; s < end; s += eval_batch_) {
        const int64_t b = std::min(eval_batch_, end - s);
        s_->eval_x.resize({b, s_->x.dim(1), s_->x.dim(2), s_->x.dim(3)}, &be_);
        CUDA_CHECK(cuda::launch_gather_images(s_->test_images.as<uint8_t>(), s_->test_labels.as<uint8_t>(),
                                              s_->test_index.as<int64_t>() + s, b, pixels_, s_->eval_x.data(),
                                              s_->eval_labels.as<int32_t>(), st));
        const Tensor& logits = model_.forward(s_->eval_x, Mode::kEval);
        CUDA_CHECK(cuda::launch_softmax_xent(logits.data(), s_->eval_labels.as<int32_t>(), b, classes_, 0.f,
                                             s_->eval_loss_rows.as<float>(), s_->eval_correct_rows.as<int32_t>(),
                                             nullptr, st));
        CUDA_CHECK(cuda::launch_loss_sums(s_->eval_loss_rows.as<float>(), s_->eval_correct_rows.as<int32_t>(), b,
                                          s_->eval_sums.as<double>(), s != begin, st));
      }
    };
    // No collectives inside: each rank decides alone. Captured on the second pass over the same
    // range (the first allocates the evaluation shapes' activations and workspaces).
    gpu::StreamGraph& graph = s_->eval_graphs[{begin, end}];
    const bool capture = eval_graphs_ && graph.warm();
    const auto ran = graph.run(st, capture, [](bool) {}, body, [](bool captured) { return captured; });
    if (ran == gpu::StreamGraph::Ran::kCaptured)
      log_debug(DPT_MSG("CUDA graph of the evaluation of test images [" << begin << ", " << end << ") captured: "
                                                                           << graph.nodes() << " nodes"));
    if (capture && ran == gpu::StreamGraph::Ran::kEager) {
      log_warn(DPT_MSG("CUDA graph capture of the evaluation failed (" << graph.failure()
                                                                         << "): evaluation runs without graphs"));
      eval_graphs_ = false;
    }
    double sums[2] = {0, 0};
    CUDA_CHECK(cudaMemcpyAsync(sums, s_->eval_sums.as<void>(), sizeof sums, cudaMemcpyDeviceToHost, st));
    ctx.synchronize();
    t.loss = sums[0];
    t.correct = static_cast<int64_t>(sums[1]);
    t.count = end - begin;
    return t;
  }

  void sync_buffers() override {
    if (comm_.size() == 1) return;  // as DataParallel::sync_buffers: nothing to average
    quiesce();
    model_.store().buffers_to_host();
    ddp_.sync_buffers();
    model_.store().buffers_from_host();
  }

  void to_host() override {
    quiesce();
    model_.store().to_host();
    if (cfg_.momentum > 0)
      copy_momentum(opt_.momentum_buffer().data(), s_->momentum.as<float>(), cudaMemcpyDeviceToHost);
  }

  void from_host() override {
    quiesce();
    model_.store().from_host();
    if (cfg_.momentum > 0)
      copy_momentum(s_->momentum.as<float>(), opt_.momentum_buffer().data(), cudaMemcpyHostToDevice);
  }

 private:
  // Before the host waits for the compute stream without a bound: the collectives it may wait for
  // are complete (or --timeout ended the job).
  void quiesce() {
    if (s_->reducer) s_->reducer->quiesce();
  }

  // A micro-batch's indices to the step's fixed index buffer; its loss/correct totals back out to
  // the epoch's per-batch slots. Device-to-device copies in stream order, outside any graph.
  void stage_in(int64_t batch) {
    CUDA_CHECK(cudaMemcpyAsync(s_->step_index.as<void>(), s_->epoch_index.as<int64_t>() + batch * batch_,
                               static_cast<size_t>(batch_) * sizeof(int64_t), cudaMemcpyDeviceToDevice,
                               ctx().stream()));
  }
  void stage_out(int64_t batch) {
    CUDA_CHECK(cudaMemcpyAsync(s_->batch_stats.as<double>() + 2 * batch, s_->step_stats.as<void>(),
                               2 * sizeof(double), cudaMemcpyDeviceToDevice, ctx().stream()));
  }

  // The staged micro-batch: gather, forward, loss, backward; with sync, backward hands each finished
  // gradient range to the reducer (whose begin() the caller has called).
  void forward_backward(bool sync, bool accumulate, Tracer* tr) {
    const cudaStream_t st = ctx().stream();
    {
      TraceScope span(tr, "data", "data");
      CUDA_CHECK(cuda::launch_gather_images(s_->train_images.as<uint8_t>(), s_->train_labels.as<uint8_t>(),
                                            s_->step_index.as<int64_t>(), batch_, pixels_, s_->x.data(),
                                            s_->labels.as<int32_t>(), st));
    }
    const Tensor* logits;
    {
      TraceScope span(tr, "forward", "forward");
      logits = &model_.forward(s_->x, Mode::kTrain);
    }
    CUDA_CHECK(cuda::launch_softmax_xent(logits->data(), s_->labels.as<int32_t>(), batch_, classes_, grad_scale_,
                                         s_->loss_rows.as<float>(), s_->correct_rows.as<int32_t>(),
                                         s_->dlogits.data(), st));
    CUDA_CHECK(cuda::launch_loss_sums(s_->loss_rows.as<float>(), s_->correct_rows.as<int32_t>(), batch_,
                                      s_->step_stats.as<double>(), false, st));
    TraceScope span(tr, "backward", "backward");
    BackwardCtx bctx;
    bctx.accumulate = accumulate;
    if (sync && s_->reducer) {
      gpu::GpuReducer* r = s_->reducer.get();
      bctx.on_ready = [r](int64_t b, int64_t e) { r->mark_ready(b, e); };
    }
    model_.backward(s_->dlogits, bctx);
  }

  // The optimizer over the flat buffers, at the learning rate stored in s_->lr.
  void update(bool first) {
    ParamStore& m = model_.store();
    CUDA_CHECK(cuda::launch_sgd_update(m.device_params(), m.device_grads(),
                                       cfg_.momentum > 0 ? s_->momentum.as<float>() : nullptr, m.num_params(), s_->lr.as<float>(), static_cast<float>(cfg_.momentum),
                                       static_cast<float>(cfg_.weight_decay), first, ctx().stream()));
  }

  // Whether `mine` holds on every rank: an MPI all-reduce where the step holds NCCL collectives
  // (which NCCL requires to be captured on all ranks or on none), else this rank's value.
  bool all_ranks(bool mine, const char* what) {
    if (!s_->reducer) return mine;
    int32_t v = mine ? 1 : 0;
    comm_.allreduce(&v, 1, ReduceOp::kMin, what);
    return v == 1;
  }

  // The deferred micro-batch as one whole step: replayed from the graph when it is valid, captured
  // once a step has run eagerly without allocating (warm) on every rank, else eager. The run's
  // first step is always eager (it starts the momentum buffer, which a graph must not repeat).
  void graph_step(bool first) {
    const int64_t batch = std::exchange(deferred_batch_, -1), step = deferred_step_;
    gpu::GpuReducer* r = s_->reducer.get();
    gpu::StreamGraph& graph = s_->step_graph;
    if (graph.exists() && !graph.valid()) {
      // Nothing allocates inside an epoch once warm, and begin_epoch drops graphs that went stale.
      DPT_CHECK(!r, "rank " << comm_.rank() << " allocated device memory inside an epoch after capturing its "
                                                "step's CUDA graph; replaying on the other ranks would desynchronise NCCL");
      graph.reset();  // one rank, no collectives: just capture again when warm
    }
    if (r) r->begin(step);  // collectives two steps back, bounded by --timeout
    stage_in(batch);
    // Uniform across ranks: the replay state was agreed in begin_epoch, and the capture decision is
    // agreed here (only on eager steps, i.e. while warming up).
    const bool capture =
        !graph.exists() && all_ranks(!first && graph.warm(), "agreement on capturing the step's CUDA graph");
    auto prepare = [&](bool capturing) {
      if (!r) return;
      r->set_capturing(capturing);
      r->begin(step);  // a dropped capture may have counted some gradients already
    };
    auto body = [&] {
      forward_backward(true, false, nullptr);
      if (r) r->finish();
      update(first);
    };
    const auto ran = graph.run(ctx().stream(), capture, prepare, body, [&](bool captured) {
      return all_ranks(captured, "agreement on the CUDA graph capture of the step");
    });
    if (r) r->set_capturing(false);
    if (ran != gpu::StreamGraph::Ran::kEager && r) r->graph_launched(step);
    if (ran == gpu::StreamGraph::Ran::kCaptured && comm_.rank() == 0)
      log_debug(DPT_MSG("CUDA graph of the training step captured at step " << step << ": " << graph.nodes()
                                                                            << " nodes"));
    if (capture && ran == gpu::StreamGraph::Ran::kEager) {
      // Not retried (on any rank: the verdict was agreed): a collective queued into a dropped
      // capture is not worth a second risk.
      log_warn(DPT_MSG("CUDA graph capture of the training step failed on rank " << comm_.rank() << " ("
                                                                                   << graph.failure()
                                                                                   << "): steps run without graphs"));
      step_graphs_ = false;
    }
    stage_out(batch);
  }

  void copy_momentum(float* dst, const float* src, cudaMemcpyKind kind) {
    const size_t bytes = opt_.momentum_buffer().size() * sizeof(float);
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, ctx().stream()));
    ctx().synchronize();
  }

  // Micro-batches [first, last_] of the epoch, summed as the CPU loop sums them: within each
  // optimizer step first, then the steps in order.
  Totals totals(int64_t first) {
    Totals t;
    if (first < 0 || last_ < first) return t;
    quiesce();
    const size_t count = static_cast<size_t>(last_ - first + 1);
    stats_host_.resize(2 * count);
    CUDA_CHECK(cudaMemcpyAsync(stats_host_.data(), s_->batch_stats.as<double>() + 2 * first,
                               stats_host_.size() * sizeof(double), cudaMemcpyDeviceToHost, ctx().stream()));
    ctx().synchronize();
    double step_loss = 0, step_hits = 0;
    for (size_t i = 0; i < count; ++i) {
      const int64_t batch = first + static_cast<int64_t>(i);
      step_loss += stats_host_[2 * i];
      step_hits += stats_host_[2 * i + 1];
      if ((batch + 1) % cfg_.accum_steps == 0 || batch == last_) {
        t.loss += step_loss;
        t.correct += static_cast<int64_t>(step_hits);
        step_loss = step_hits = 0;
      }
    }
    t.count = static_cast<int64_t>(count) * batch_;
    return t;
  }

  gpu::GpuContext& ctx() { return be_.context(); }

  const TrainConfig& cfg_;
  Communicator& comm_;
  gpu::CudaBackend& be_;
  Model& model_;
  DataParallel& ddp_;
  Sgd& opt_;
  const int64_t classes_, pixels_, batch_, eval_batch_;
  const float grad_scale_;
  const int uncaught_;
  std::string describe_;
  std::unique_ptr<GpuState> s_;
  std::vector<int64_t> index_host_;
  std::vector<double> stats_host_;
  int64_t batches_ = 0, epoch_first_ = -1, step_first_ = -1, last_ = -1;
  bool step_graphs_ = false, eval_graphs_ = false;
  int64_t deferred_batch_ = -1, deferred_step_ = 0;  // a graph step's micro-batch, run by optimizer_step
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const TrainConfig& cfg, int local_rank) {
  const int count = cuda_device_count();
  DPT_INPUT_CHECK(count > 0, "--device cuda: no CUDA device visible on local rank " << local_rank);
  auto be = std::make_unique<gpu::CudaBackend>(local_rank % count);
  be->context().set_tf32(cfg.tf32);
  be->context().set_bf16(cfg.precision == "bf16");
  return be;
}

std::unique_ptr<TrainBackend> make_gpu_backend(const TrainConfig& cfg, Communicator& comm, Backend& ops, Model& model,
                                               DataParallel& ddp, Sgd& opt, const ImageSet& train,
                                               const ImageSet& test) {
  auto* be = dynamic_cast<gpu::CudaBackend*>(&ops);
  DPT_CHECK(be != nullptr, "make_gpu_backend needs the CUDA operations backend, got " << ops.name());
  return std::make_unique<GpuBackend>(cfg, comm, *be, model, ddp, opt, train, test);
}

}  // namespace dpt
