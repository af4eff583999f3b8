// Data parallelism as a wrapper, in the manner of PyTorch's DistributedDataParallel: wrap a Model
// and a Communicator, and the training loop reads like single-device training. The wrapper checks
// the replicas agree, broadcasts rank 0's parameters, and all-reduces gradient buckets (contiguous
// slices of the flat gradient buffer, in backward order) on a communication thread while backward
// runs. Gradients are SUMMED; the loss is scaled by 1/global_batch, so k ranks match 1 rank.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dpt/comm.h"
#include "dpt/nn.h"
#include "dpt/trace.h"

namespace dpt {

struct Bucket {
  int64_t begin = 0, end = 0;  // element range of the flat gradient buffer
  int64_t size() const { return end - begin; }
};

// Splits [0, total) at parameter boundaries into buckets of at most cap_bytes (a parameter larger
// than the cap gets a bucket of its own); the first bucket is capped at first_cap_bytes so
// communication starts early, and with last_cap_bytes > 0 the parameters at the end are split
// off into a last bucket of at most that size (at least one parameter): its all-reduce cannot
// start before backward ends, so it is the part that stays exposed. `bounds` are the
// parameters' [begin, end) ranges in any order.
std::vector<Bucket> plan_buckets(std::vector<std::pair<int64_t, int64_t>> bounds,
                                 double cap_bytes, double first_cap_bytes,
                                 double last_cap_bytes = 0);

struct ReducerStats {
  double comm_seconds = 0;     // sum over buckets of launch-to-completion time
  double exposed_seconds = 0;  // time wait() blocked the training thread
  int64_t buckets = 0;
};

class Reducer {
 public:
  // comm: a communicator used only by the reducer's thread. grads: the flat gradient buffer.
  Reducer(std::unique_ptr<Communicator> comm, float* grads, std::vector<Bucket> buckets,
          bool overlap);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  const std::vector<Bucket>& buckets() const { return buckets_; }
  // Starts a step: every bucket waits for its gradients again. `step` names it in errors.
  void begin(int64_t step);
  // Backward announces that [begin, end) of the gradient buffer is final for this step. Bucket k
  // is launched once complete and after bucket k-1 (all ranks issue the same order).
  void mark_ready(int64_t begin, int64_t end);
  // Launches what is left (all buckets with --no-overlap) and waits for every all-reduce.
  void wait();
  const ReducerStats& last_stats() const { return stats_; }
  // Bucket all-reduces are recorded as "comm" spans on the communication thread when active.
  void set_tracer(Tracer* t) { tracer_ = t; }

 private:
  void launch_ready_locked();
  void thread_main();

  std::unique_ptr<Communicator> comm_;
  Tracer* tracer_ = nullptr;
  float* grads_;
  std::vector<Bucket> buckets_;
  bool overlap_;
  std::vector<int64_t> pending_;  // elements still to be marked ready, per bucket
  size_t next_launch_ = 0;
  int64_t step_ = 0;
  ReducerStats stats_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<size_t> queue_;
  size_t completed_ = 0;
  double comm_seconds_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
  bool stuck_ = false;  // wait() timed out: the thread may never return from its collective
  std::thread thread_;
};

struct DdpOptions {
  double bucket_mb = 25.0;
  double first_bucket_mb = 1.0;
  // > 0: the first layers' gradients (produced last) get a last bucket of at most this size and
  // a quarter of all gradients, so less is left to all-reduce after backward. Off by default: on
  // 2-core CPU hosts the extra overlap competes with backward for the cores (docs/PERFORMANCE.md).
  double last_bucket_mb = 0;
  bool overlap = true;
  bool sync_bn = false;
};

class DataParallel {
 public:
  DataParallel(Model& model, Communicator& comm, const DdpOptions& options);
  Model& module() { return model_; }
  Communicator& comm() { return comm_; }
  Reducer& reducer() { return *reducer_; }

  const Tensor& forward(const Tensor& x, Mode mode) { return model_.forward(x, mode); }
  // Backward with the bucketed all-reduce hung on each layer's gradient announcement.
  // sync=false (gradient-accumulation micro-steps) only accumulates locally.
  void backward(const Tensor& dlogits, int64_t step, bool sync = true, bool accumulate = false,
                Tracer* tracer = nullptr);
  // Waits for the all-reduces of the last synchronised backward (call before the optimizer).
  void finish_gradient_sync() { reducer_->wait(); }
  // Gives every rank rank 0's parameters and buffers (done at construction; again after a resume).
  void broadcast_state();
  // Makes BatchNorm running statistics identical on every rank (their average).
  void sync_buffers();
  // Compares a checksum of the parameters across ranks; throws naming the ranks that differ.
  void verify_replicas(int64_t step);

 private:
  void check_replicas();
  Model& model_;
  Communicator& comm_;
  DdpOptions options_;
  std::unique_ptr<Reducer> reducer_;
};

}  // namespace dpt
