// The Reducer: the flat gradient buffer split into buckets (plan_buckets) that are all-reduced in
// order while backward runs, over a transport (how gradients travel between ranks: an MPI
// communication thread on the CPU, NCCL or host MPI in GPU builds, src/cuda/gpu_reducer.h).
// Gradients are SUMMED. DataParallel (ddp.h) builds one for a model.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dpt/comm.h"
#include "dpt/dtype.h"
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
std::vector<Bucket> plan_buckets(std::vector<std::pair<int64_t, int64_t>> bounds, double cap_bytes,
                                 double first_cap_bytes, double last_cap_bytes = 0);

struct ReducerStats {
  double comm_seconds = 0;     // sum over buckets of launch-to-completion time
  double exposed_seconds = 0;  // time the training thread waited for all-reduces
  int64_t buckets = 0;
};

// How the Reducer moves gradients between ranks, and nothing else: the MPI communication thread
// (CPU, make_mpi_transport), NCCL on its own stream or pinned host buffers + MPI (GPU,
// src/cuda/gpu_reducer.h). Every all-reduce SUMS. One transport per Reducer.
class ReduceTransport {
 public:
  virtual ~ReduceTransport() = default;
  // Before a step's first launch: a stream transport waits (bounded by --timeout) for collectives
  // of earlier steps that are still in flight.
  virtual void begin(int64_t step) = 0;
  // Sums [b.begin, b.end) of the gradient buffer across ranks. Called once per bucket per step, in
  // bucket order (the same on every rank); `what` names the all-reduce in errors.
  virtual void launch(size_t k, const Bucket& b, const std::string& what) = 0;
  // Every bucket of the step is launched: returns once the sums are complete (host transports) or
  // ordered before whatever is queued next (stream transports), and fills the timings. A collective
  // not done within --timeout ends the job with an error naming it and the silent ranks.
  virtual void finish(ReducerStats& stats) = 0;
  // Waits (bounded) for everything issued so far: before the host waits on a stream unbounded.
  virtual void quiesce() {}
  // Sums `count` doubles of backend memory across ranks, ordered after the compute queued so far
  // and before the compute queued next (synchronised BatchNorm's statistics).
  virtual void allreduce_doubles(double* data, int64_t count, const std::string& what) = 0;
  // CUDA graphs: whether a step's collectives can be captured into a graph, capture mode (nothing
  // polled, nothing timed), and the fence after a graph holding a step's collectives is launched.
  virtual bool capturable() const { return false; }
  virtual void set_capturing(bool) {}
  virtual void graph_launched(int64_t) {}
  virtual void set_tracer(Tracer*) {}
  // Whether a thread of its own may still be inside a collective that uses its members (finish()
  // timed out): its owner then leaks it instead of destroying it, since the process is ending.
  virtual bool in_use_after_timeout() const { return false; }
};

// The CPU transport: a thread that owns a duplicate of `comm` and all-reduces each launched bucket
// of `grads` (host memory) with MPI's fastest blocking all-reduce; finish() waits for it, bounded
// by comm's --timeout. At world size 1 nothing is sent. allreduce_doubles uses `comm` itself, on
// the calling thread. wire: the type gradients travel in: kF32, or kBF16 / kF16 (--grad-dtype),
// cast from and back to the float buffer around each bucket's all-reduce, which adds in float and
// rounds each partial sum.
std::unique_ptr<ReduceTransport> make_mpi_transport(Communicator& comm, float* grads,
                                                    DType wire = DType::kF32);

// --grad-dtype's value ("fp32", "bf16", "fp16") as the wire type; throws an input error otherwise.
DType grad_wire_dtype(const std::string& name);
// The other way: the --grad-dtype name of a wire type, for messages.
const char* grad_wire_name(DType wire);

// Buckets of the flat gradient buffer all-reduced in order while backward runs, over any transport:
// the one place of the bucket bookkeeping, its checks and its statistics, for every backend.
class Reducer {
 public:
  Reducer(std::unique_ptr<ReduceTransport> transport, std::vector<Bucket> buckets, bool overlap);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  const std::vector<Bucket>& buckets() const { return buckets_; }
  ReduceTransport& transport() { return *transport_; }
  // Starts a step: every bucket waits for its gradients again. `step` names it in errors.
  void begin(int64_t step);
  // Backward announces that [begin, end) of the gradient buffer is final for this step. Bucket k
  // is launched once complete and after bucket k-1 (all ranks issue the same order).
  void mark_ready(int64_t begin, int64_t end);
  // Launches what is left (all buckets with --no-overlap) and finishes the step's all-reduces.
  void wait();
  const ReducerStats& last_stats() const { return stats_; }
  void set_tracer(Tracer* t) { transport_->set_tracer(t); }

 private:
  void launch_ready();

  std::unique_ptr<ReduceTransport> transport_;
  std::vector<Bucket> buckets_;
  bool overlap_;
  std::vector<int64_t> pending_;  // elements still to be marked ready, per bucket
  size_t next_launch_ = 0;
  int64_t step_ = 0;
  ReducerStats stats_;
};

}  // namespace dpt
