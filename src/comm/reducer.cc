// Bucket planning, the Reducer (buckets all-reduced in order while backward runs, over a
// transport), the CPU's transport (an MPI communication thread) and the DataParallel wrapper.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "dpt/clock.h"
#include "dpt/ddp.h"
#include "dpt/error.h"
#include "dpt/half.h"
#include "dpt/log.h"
#include "dpt/poll.h"

namespace dpt {

std::vector<Bucket> plan_buckets(std::vector<std::pair<int64_t, int64_t>> bounds, double cap_bytes,
                                 double first_cap_bytes, double last_cap_bytes) {
  std::sort(bounds.begin(), bounds.end());
  std::vector<Bucket> out;
  for (const auto& [b, e] : bounds) {
    DPT_CHECK(out.empty() || b == out.back().end, "parameters do not tile the gradient buffer");
    const double cap = out.size() <= 1 ? first_cap_bytes : cap_bytes;
    if (out.empty() || static_cast<double>((out.back().size() + (e - b)) * 4) > cap)
      out.push_back(Bucket{b, e});
    else
      out.back().end = e;
  }
  if (last_cap_bytes > 0 && !out.empty()) {
    // The longest run of trailing parameters of the last bucket that fits the cap (at least one).
    const Bucket last = out.back();
    int64_t split = last.end;
    for (auto it = bounds.rbegin(); it != bounds.rend() && it->first > last.begin; ++it) {
      if (split != last.end && static_cast<double>((last.end - it->first) * 4) > last_cap_bytes)
        break;
      split = it->first;
    }
    if (split > last.begin && split < last.end) {
      out.back().end = split;
      out.push_back(Bucket{split, last.end});
    }
  }
  return out;
}

// ---- the MPI transport -------------------------------------------------------------------------

namespace {

class MpiThreadTransport : public ReduceTransport {
 public:
  MpiThreadTransport(Communicator& comm, float* grads, DType wire)
      : main_(comm), comm_(comm.duplicate()), grads_(grads), wire_(wire) {
    DPT_CHECK(wire == DType::kF32 || wire == DType::kBF16 || wire == DType::kF16,
              "gradients travel as fp32, bf16 or fp16");
    if (comm_->size() > 1) thread_ = std::thread([this] { thread_main(); });
  }
  ~MpiThreadTransport() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) {
      // A thread stuck in a collective that will never finish cannot be joined; the process is
      // ending anyway (the job is aborted after a timeout).
      if (error_ || stuck_)
        thread_.detach();
      else
        thread_.join();
    }
  }

  void begin(int64_t) override {
    std::lock_guard<std::mutex> lock(mu_);
    DPT_CHECK(queue_.empty() && completed_ == launched_.size(),
              "Reducer::begin with all-reduces in flight");
    launched_.clear();
    completed_ = 0;
    comm_seconds_ = 0;
  }

  void launch(size_t k, const Bucket& b, const std::string& what) override {
    std::lock_guard<std::mutex> lock(mu_);
    launched_.push_back({k, b, what});
    if (!thread_.joinable()) {  // one rank: nothing to reduce
      completed_ = launched_.size();
      return;
    }
    queue_.push_back(launched_.size() - 1);
    cv_.notify_all();
  }

  void finish(ReducerStats& stats) override {
    const double t0 = now_seconds();
    std::unique_lock<std::mutex> lock(mu_);
    // The communication thread uses MPI's blocking all-reduce (the fast, tuned algorithms), so the
    // --timeout is enforced here, by the waiter: it names the bucket and asks the peers who is
    // gone.
    auto done = [this] { return completed_ == launched_.size() || error_; };
    const double timeout = comm_->timeout();
    if (timeout > 0) {
      if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout), done)) {
        const Launched& l = launched_[completed_];
        stuck_ = true;
        lock.unlock();
        throw Error(ErrorKind::kInternal,
                    timeout_message(l.what, timeout, comm_->rank(), ": " + comm_->diagnose()));
      }
    } else {
      cv_.wait(lock, done);
    }
    if (error_) std::rethrow_exception(error_);
    stats.exposed_seconds = now_seconds() - t0;
    stats.comm_seconds = comm_seconds_;
  }

  void allreduce_doubles(double* data, int64_t count, const std::string& what) override {
    if (main_.size() > 1) main_.allreduce(data, count, ReduceOp::kSum, what);
  }
  bool capturable() const override { return comm_->size() == 1; }  // nothing to capture
  void set_tracer(Tracer* t) override { tracer_ = t; }

 private:
  struct Launched {
    size_t bucket;
    Bucket range;
    std::string what;
  };

  void thread_main() {
    for (;;) {
      Launched l;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        l = launched_[queue_.front()];
        queue_.pop_front();
      }
      try {
        const double t0 = now_seconds();
        const double s0 = tracer_ && tracer_->active() ? tracer_->now_us() : 0;
        float* g = grads_ + l.range.begin;
        if (wire_ == DType::kF32) {
          comm_->allreduce_unbounded_raw(g, l.range.size(), DType::kF32, ReduceOp::kSum);
        } else {
          // Compressed: cast into 16-bit values, sum those (in float, rounded per partial sum),
          // cast back. The optimizer and the master weights never see anything but float.
          if (static_cast<int64_t>(wire_buf_.size()) < l.range.size())
            wire_buf_.resize(static_cast<size_t>(l.range.size()));
          compress16(g, wire_buf_.data(), l.range.size(), wire_);
          comm_->allreduce_unbounded_raw(wire_buf_.data(), l.range.size(), wire_, ReduceOp::kSum);
          decompress16(wire_buf_.data(), g, l.range.size(), wire_);
        }
        const double dt = now_seconds() - t0;
        if (tracer_ && tracer_->active())
          tracer_->span("allreduce bucket " + std::to_string(l.bucket), "comm", Tracer::kComm, s0,
                        tracer_->now_us());
        std::lock_guard<std::mutex> lock(mu_);
        comm_seconds_ += dt;
        ++completed_;
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        error_ = std::current_exception();
        cv_.notify_all();
        return;
      }
      cv_.notify_all();
    }
  }

  Communicator& main_;
  std::unique_ptr<Communicator>
      comm_;  // the thread's own: its collectives never interleave with main_'s
  float* grads_;
  DType wire_;
  std::vector<uint16_t>
      wire_buf_;  // the thread's: a bucket in 16-bit values (compressed wire only)
  Tracer* tracer_ = nullptr;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Launched> launched_;  // this step's launches, in order
  std::deque<size_t> queue_;        // indices into launched_ not yet taken by the thread
  size_t completed_ = 0;
  double comm_seconds_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
  bool stuck_ = false;  // finish() timed out: the thread may never return from its collective
  std::thread thread_;
};

}  // namespace

std::unique_ptr<ReduceTransport> make_mpi_transport(Communicator& comm, float* grads, DType wire) {
  return std::make_unique<MpiThreadTransport>(comm, grads, wire);
}

DType grad_wire_dtype(const std::string& name) {
  if (name == "fp32") return DType::kF32;
  if (name == "bf16") return DType::kBF16;
  if (name == "fp16") return DType::kF16;
  throw Error(ErrorKind::kInput, "--grad-dtype: '" + name + "' is not fp32|bf16|fp16");
}

const char* grad_wire_name(DType wire) {
  return wire == DType::kBF16 ? "bf16" : wire == DType::kF16 ? "fp16" : "fp32";
}

// ---- Reducer ---------------------------------------------------------------------------------

Reducer::Reducer(std::unique_ptr<ReduceTransport> transport, std::vector<Bucket> buckets,
                 bool overlap)
    : transport_(std::move(transport)), buckets_(std::move(buckets)), overlap_(overlap) {
  DPT_CHECK(transport_ != nullptr, "Reducer without a transport");
  pending_.resize(buckets_.size());
}

void Reducer::begin(int64_t step) {
  transport_->begin(step);
  step_ = step;
  for (size_t k = 0; k < buckets_.size(); ++k) pending_[k] = buckets_[k].size();
  next_launch_ = 0;
}

void Reducer::mark_ready(int64_t begin, int64_t end) {
  // Buckets are sorted and disjoint: find the first that overlaps and walk forward.
  auto it = std::upper_bound(buckets_.begin(), buckets_.end(), begin,
                             [](int64_t v, const Bucket& b) { return v < b.end; });
  for (; it != buckets_.end() && it->begin < end; ++it) {
    const int64_t overlap = std::min(end, it->end) - std::max(begin, it->begin);
    int64_t& left = pending_[static_cast<size_t>(it - buckets_.begin())];
    left -= overlap;
    DPT_CHECK(left >= 0, "gradients of bucket " << (it - buckets_.begin())
                                                << " announced twice in step " << step_);
  }
  if (overlap_) launch_ready();
}

void Reducer::launch_ready() {
  while (next_launch_ < buckets_.size() && pending_[next_launch_] == 0) {
    const size_t k = next_launch_++;
    transport_->launch(k, buckets_[k],
                       DPT_MSG("all-reduce of gradient bucket " << k << " (" << buckets_[k].size()
                                                                << " floats) in step " << step_));
  }
}

void Reducer::wait() {
  for (size_t k = 0; k < buckets_.size(); ++k)
    DPT_CHECK(pending_[k] == 0, "bucket " << k << " of step " << step_ << " is missing "
                                          << pending_[k] << " gradient elements at wait()");
  launch_ready();
  stats_ = ReducerStats{};
  transport_->finish(stats_);
  stats_.buckets = static_cast<int64_t>(buckets_.size());
}

// ---- DataParallel ------------------------------------------------------------------------------

DataParallel::DataParallel(Model& model, Communicator& comm, const DdpOptions& options,
                           std::unique_ptr<ReduceTransport> transport)
    : model_(model), comm_(comm), options_(options) {
  DPT_INPUT_CHECK(options.bucket_mb > 0, "--bucket-mb must be > 0, got " << options.bucket_mb);
  DPT_INPUT_CHECK(options.last_bucket_mb >= 0,
                  "--last-bucket-mb must be >= 0, got " << options.last_bucket_mb);
  check_replicas();
  broadcast_state();
  ParamStore& store = model_.store();

  std::vector<std::pair<int64_t, int64_t>> bounds;
  for (const auto& p : store.entries())
    if (!p.is_buffer) bounds.emplace_back(p.offset, p.offset + p.numel());
  const double mib = 1024.0 * 1024.0;
  const double first_cap = std::min(options.first_bucket_mb, options.bucket_mb) * mib;
  const double total_bytes = 4.0 * static_cast<double>(store.num_params());
  auto buckets = plan_buckets(bounds, options.bucket_mb * mib, first_cap,
                              std::min(options.last_bucket_mb * mib, total_bytes / 4));
  // Every rank must issue the same all-reduces: compare the plans once.
  const uint64_t h = checksum(buckets.data(), buckets.size() * sizeof(Bucket));
  const auto all = comm_.allgather(h);
  for (int r = 0; r < comm_.size(); ++r)
    DPT_CHECK(all[static_cast<size_t>(r)] == all[0],
              "gradient bucket plan of rank " << r << " differs from rank 0's");
  if (!transport) transport = make_mpi_transport(comm_, store.device_grads(), options.grad_dtype);
  reducer_ = std::make_unique<Reducer>(std::move(transport), std::move(buckets), options.overlap);
  if (options.sync_bn && comm_.size() > 1) {
    // Through the transport: the statistics are in the backend's memory, ordered with its compute.
    ReduceTransport* t = &reducer_->transport();
    model_.net().visit([t](Layer& l) {
      set_batchnorm_sync(
          l, [t](double* data, int64_t n) { t->allreduce_doubles(data, n, "sync-bn statistics"); });
    });
  }
}

void DataParallel::broadcast_state() {
  ParamStore& store = model_.store();
  comm_.broadcast(store.params(), store.num_params(), 0, "broadcast of parameters");
  if (store.num_buffers() > 0)
    comm_.broadcast(store.buffers(), store.num_buffers(), 0, "broadcast of buffers");
}

void DataParallel::check_replicas() {
  // Every rank gathers every rank's signature, so all of them can name the same difference.
  const std::vector<std::string> all = allgather_text(comm_, model_.signature());
  for (int r = 1; r < comm_.size(); ++r) {
    const std::string& ref = all[0];
    const std::string& other = all[static_cast<size_t>(r)];
    if (other == ref) continue;
    // Find the first differing line (tensor).
    size_t a = 0, b = 0;
    for (;;) {
      size_t ea = ref.find('\n', a), eb = other.find('\n', b);
      std::string la = ref.substr(a, ea == std::string::npos ? std::string::npos : ea - a);
      std::string lb = other.substr(b, eb == std::string::npos ? std::string::npos : eb - b);
      if (la != lb || ea == std::string::npos || eb == std::string::npos) {
        throw Error(ErrorKind::kInput,
                    DPT_MSG("model replicas differ: rank "
                            << r << " has '" << (lb.empty() ? "(nothing)" : lb)
                            << "' where rank 0 has '" << (la.empty() ? "(nothing)" : la) << "'"));
      }
      a = ea + 1;
      b = eb + 1;
    }
  }
}

BackwardCtx DataParallel::backward_ctx(bool sync, bool accumulate, Tracer* tracer) {
  BackwardCtx ctx;
  ctx.accumulate = accumulate;
  ctx.tracer = tracer;
  if (sync) {
    Reducer* r = reducer_.get();
    ctx.on_ready = [r](int64_t b, int64_t e) { r->mark_ready(b, e); };
  }
  return ctx;
}

void DataParallel::backward(const Tensor& dlogits, int64_t step, bool sync, bool accumulate,
                            Tracer* tracer) {
  if (sync) reducer_->begin(step);
  BackwardCtx ctx = backward_ctx(sync, accumulate, tracer);
  model_.backward(dlogits, ctx);
}

void DataParallel::sync_buffers() {
  ParamStore& store = model_.store();
  if (comm_.size() > 1 && store.num_buffers() > 0)
    comm_.allreduce(store.buffers(), store.num_buffers(), ReduceOp::kAvg,
                    "all-reduce of BatchNorm running statistics");
}

void DataParallel::verify_replicas(int64_t step) {
  ParamStore& store = model_.store();
  const uint64_t h =
      checksum(store.params(), static_cast<size_t>(store.num_params()) * sizeof(float));
  const auto all = comm_.allgather(h);
  std::string bad;
  for (int r = 1; r < comm_.size(); ++r)
    if (all[static_cast<size_t>(r)] != all[0]) bad += (bad.empty() ? "" : ", ") + std::to_string(r);
  if (!bad.empty())
    throw Error(ErrorKind::kInternal,
                DPT_MSG("replicas diverged at step " << step << ": parameters of rank(s) " << bad
                                                     << " differ from rank 0's"));
}

}  // namespace dpt
