// Communicator: typed collectives (counts in elements, never bytes), synchronous and
// asynchronous, behind one interface over MPI (src/comm/communicator.cc) and, in GPU builds, NCCL
// (src/cuda/nccl_communicator.cc). Every blocking wait is bounded by the communicator's timeout,
// so a dead or stopped peer ends the job instead of hanging it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dpt/dtype.h"
#include "dpt/poll.h"

namespace dpt {

enum class ReduceOp { kSum, kAvg, kMax, kMin };

// An operation in flight; wait() blocks (bounded by the timeout), test() polls.
class Request {
 public:
  virtual ~Request() = default;
  virtual void wait() = 0;
  virtual bool test() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const std::string& host() const = 0;
  // A new communicator over the same ranks with its own ordering of collectives (the reducer's
  // thread uses one so its all-reduces never interleave with the main thread's).
  virtual std::unique_ptr<Communicator> duplicate() const = 0;
  // Seconds a collective may take before the job is ended (0 = unbounded).
  virtual void set_timeout(double seconds) = 0;
  virtual double timeout() const = 0;
  // Seconds the collectives started from now on may take beyond the timeout, and what for (their
  // timeout message gives both); 0 ends it. agree_on_input sets it (GraceScope).
  void set_grace(double seconds, std::string why) {
    grace_ = seconds;
    grace_why_ = std::move(why);
  }

  virtual std::unique_ptr<Request> iallreduce_raw(void* data, int64_t count, DType dt, ReduceOp op,
                                                  const std::string& what) = 0;
  virtual void broadcast_raw(void* data, int64_t count, DType dt, int root,
                             const std::string& what) = 0;
  virtual void allgather_raw(const void* send, void* recv, int64_t count_per_rank, DType dt) = 0;
  // `what` names it in a timeout's message ("barrier after writing checkpoint ...").
  virtual void barrier(const std::string& what) = 0;
  // The library's fastest blocking all-reduce, with no timeout of its own: for a thread whose
  // waiter enforces the timeout (the Reducer), since MPI's non-blocking collectives use slower
  // algorithms and progress only while polled.
  virtual void allreduce_unbounded_raw(void* data, int64_t count, DType dt, ReduceOp op) = 0;
  // After a timeout: which ranks are silent or behind, as a sentence for the error message.
  virtual std::string diagnose() = 0;

  // Typed helpers: the only way the rest of the code calls collectives.
  template <typename T>
  void allreduce(T* data, int64_t count, ReduceOp op = ReduceOp::kSum,
                 const std::string& what = "allreduce") {
    iallreduce_raw(data, count, dtype_of<T>(), op, what)->wait();
  }
  template <typename T>
  std::unique_ptr<Request> iallreduce(T* data, int64_t count, ReduceOp op = ReduceOp::kSum,
                                      const std::string& what = "allreduce") {
    return iallreduce_raw(data, count, dtype_of<T>(), op, what);
  }
  template <typename T>
  void broadcast(T* data, int64_t count, int root = 0, const std::string& what = "broadcast") {
    broadcast_raw(data, count, dtype_of<T>(), root, what);
  }
  template <typename T>
  std::vector<T> allgather(const T& value) {
    std::vector<T> out(static_cast<size_t>(size()));
    allgather_raw(&value, out.data(), 1, dtype_of<T>());
    return out;
  }
  template <typename T>
  void allgather(const T* send, T* recv, int64_t count_per_rank) {
    allgather_raw(send, recv, count_per_rank, dtype_of<T>());
  }

 protected:
  // The bound of a collective started now.
  WaitBound bound() const { return {timeout(), grace_, grace_why_}; }

 private:
  double grace_ = 0;
  std::string grace_why_;
};

// A grace (Communicator::set_grace) for the collectives started while it lives.
class GraceScope {
 public:
  GraceScope(Communicator& comm, double seconds, std::string why) : comm_(comm) {
    comm_.set_grace(seconds, std::move(why));
  }
  ~GraceScope() { comm_.set_grace(0, {}); }
  GraceScope(const GraceScope&) = delete;
  GraceScope& operator=(const GraceScope&) = delete;

 private:
  Communicator& comm_;
};

// A cheap, platform-independent checksum for cross-rank agreement checks (FNV-1a over 64-bit words,
// then the tail bytes): the same bytes give the same value on every rank.
uint64_t checksum(const void* data, size_t bytes, uint64_t seed = 1469598103934665603ULL);

// Every rank's `mine`, in rank order: host names, device names, signatures, a rank's settings.
// Small texts only: each is padded to the longest and the whole sent as one MPI count, so every
// rank holds world size x the longest text, and a text past 2 GiB ends the job ("collective count
// out of range", exit 3). Bulk data goes otherwise (predict's rows: infer.cc's RowsWriter).
std::vector<std::string> allgather_text(Communicator& comm, const std::string& mine);

// MPI must be initialised (see bootstrap.h). Wraps a duplicate of MPI_COMM_WORLD, whose collectives
// and whose own set-up (collective too) are bounded by `timeout` seconds (0: no bound; the run
// sets its --timeout again once the flags are read).
std::unique_ptr<Communicator> make_mpi_communicator(double timeout = 0);
// A communicator of this process alone (MPI_COMM_SELF): single-replica reference runs in tests.
std::unique_ptr<Communicator> make_mpi_self_communicator();

}  // namespace dpt
