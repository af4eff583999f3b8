// The Reducer (include/dpt/reducer.h): bucket planning, the buckets all-reduced in order while
// backward runs over a transport, and the CPU's transport (an MPI communication thread).
#include "dpt/reducer.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "dpt/clock.h"
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
      if (!wait_running(cv_, lock, timeout_duration(timeout), done)) {
        const Launched& l = launched_[completed_];
        stuck_ = true;
        lock.unlock();
        throw Error(ErrorKind::kInternal, timeout_message(l.what, WaitBound{timeout, 0, {}},
                                                          comm_->rank(), ": " + comm_->diagnose()));
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
  bool in_use_after_timeout() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stuck_;
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
  mutable std::mutex mu_;
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

Reducer::~Reducer() {
  // Destroying a transport whose thread is still blocked in MPI_Allreduce freed the communicator,
  // mutex and buffers under it: once the job's abort woke the thread, it crashed (a segfault and a
  // backtrace after the clean timeout error). The process is ending: leak it instead.
  if (transport_ && transport_->in_use_after_timeout()) (void)transport_.release();
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

}  // namespace dpt
