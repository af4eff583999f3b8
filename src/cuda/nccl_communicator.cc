// NCCL implementation of Communicator (see nccl_communicator.h). Counts are elements; pointers are
// device pointers. Only compiled in GPU builds.
//
// The communicator is non-blocking (ncclConfig_t::blocking = 0) so that no NCCL call can hang the
// host: its set-up runs on NCCL's own thread while this one polls it against --timeout. NCCL's
// rule for such a communicator: any call may return ncclInProgress, and then its state
// (ncclCommGetAsyncError) must be polled until it leaves ncclInProgress before the next NCCL call
// on it, or anything else queued on its stream; settle() is that poll, after every call here.
#include "cuda/nccl_communicator.h"

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "cuda/cuda_check.h"
#include "dpt/error.h"
#include "dpt/poll.h"

namespace dpt {

namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

// Pauses between polls: set-up and split take milliseconds to seconds (and NCCL's thread needs the
// core meanwhile); a collective's launch or completion takes microseconds.
constexpr PollPause kSetUpPause{milliseconds(1), milliseconds(10)};
constexpr PollPause kCollectivePause{microseconds(20), microseconds(20)};

// What a timeout's message tells the user to check.
constexpr const char* kPeerBehind = "a peer rank is stopped, dead or far behind";
constexpr const char* kPeerAbsent =
    "a peer rank did not join; check NCCL_SOCKET_IFNAME / the network between hosts, or run with "
    "NCCL_DEBUG=INFO";

ncclDataType_t nccl_type(DType dt) {
  switch (dt) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF64:
      return ncclFloat64;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
    case DType::kU64:
      return ncclUint64;
    case DType::kU8:
      return ncclUint8;
    case DType::kBF16:
      return ncclBfloat16;  // summed by NCCL in float, each partial sum rounded
    case DType::kF16:
      return ncclFloat16;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  return ncclSum;
}

// This rank as its errors name it, and the bound its waits use (--timeout 0: never).
struct Where {
  WaitBound bound;
  int rank;
  std::string host;
};

// The NCCL communicator, shared by an NcclCommunicator and its requests. A timeout or an
// asynchronous error aborts it (ncclCommAbort stops its kernels and threads and frees it) and
// clears it here, so nothing polls or destroys it afterwards.
struct CommHandle {
  ncclComm_t comm = nullptr;
  void abort() {
    if (comm) ncclCommAbort(comm);
    comm = nullptr;
  }
};
using SharedComm = std::shared_ptr<CommHandle>;

[[noreturn]] void throw_timeout(CommHandle& h, const std::string& what, const Where& w,
                                const char* check) {
  h.abort();
  throw Error(
      ErrorKind::kInternal,
      timeout_message(what, w.bound, w.rank,
                      DPT_MSG(" (host " << w.host << "; NCCL communicator aborted): " << check)));
}

// The communicator's asynchronous state: ncclSuccess, or ncclInProgress while an operation of a
// non-blocking communicator is unfinished. Any other state broke the communicator: it is aborted
// (NCCL's documented way out of an error) and the error thrown with NCCL's own explanation.
ncclResult_t comm_state(CommHandle& h, const std::string& what, const Where& w) {
  DPT_CHECK(h.comm != nullptr, what << " on rank " << w.rank << ": the NCCL communicator is gone "
                                    << "(aborted after an error or timeout, or destroyed)");
  ncclResult_t state = ncclSuccess;
  // The query itself can fail: on reaching ncclSuccess it joins NCCL's thread for the finished
  // call and returns that call's error, which breaks the communicator just the same.
  const ncclResult_t queried = ncclCommGetAsyncError(h.comm, &state);
  if (queried != ncclSuccess) state = queried;
  if (state == ncclSuccess || state == ncclInProgress) return state;
  const char* last_error =
      ncclGetLastError(h.comm);  // read before the abort adds messages of its own
  const std::string last = last_error ? last_error : "";
  h.abort();
  throw Error(ErrorKind::kInternal,
              DPT_MSG(what << " failed on rank " << w.rank << " (host " << w.host << "): NCCL "
                           << ncclGetErrorString(state) << (last.empty() ? "" : ": ") << last));
}

// Waits, bounded by w.bound, until the communicator's last call has finished (its state left
// ncclInProgress); on timeout aborts it and throws, naming `what` and what to `check`. Returns at
// the first poll when the call was already complete: every collective launched outside a set-up
// or a first connection, and every call when NCCL_COMM_BLOCKING=1 overrides the configuration.
void settle(CommHandle& h, const std::string& what, const Where& w, const char* check,
            PollPause pause) {
  poll_with_deadline(
      w.bound.seconds(), [&] { return comm_state(h, what, w) != ncclInProgress; },
      [&] { throw_timeout(h, what, w, check); }, pause);
}

class NcclRequest : public Request {
 public:
  NcclRequest(SharedComm comm, cudaStream_t stream, std::string what, Where where)
      : comm_(std::move(comm)), what_(std::move(what)), where_(std::move(where)) {
    CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(event_, stream));
  }
  ~NcclRequest() override { cudaEventDestroy(event_); }
  bool test() override {
    if (done_) return true;
    (void)comm_state(*comm_, what_, where_);  // throws on an asynchronous error
    const cudaError_t e = cudaEventQuery(event_);
    if (e == cudaErrorNotReady) {
      // Not an error, but the runtime may keep it as this thread's last error, and every kernel
      // launcher returns cudaGetLastError(): clear it so the next launch is not reported failed.
      (void)cudaGetLastError();
      return false;
    }
    CUDA_CHECK(e);
    done_ = true;
    return true;
  }
  void wait() override {
    // On timeout the communicator is aborted, which frees the GPU from a collective that can never
    // complete.
    poll_with_deadline(
        where_.bound.seconds(), [&] { return test(); },
        [&] { throw_timeout(*comm_, what_, where_, kPeerBehind); }, kCollectivePause);
  }

 private:
  SharedComm comm_;
  cudaEvent_t event_{};
  std::string what_;
  Where where_;
  bool done_ = false;
};

class NcclCommunicatorImpl final : public NcclCommunicator {
 public:
  NcclCommunicatorImpl(SharedComm comm, int rank, int size, int device, std::string host,
                       double timeout)
      : comm_(std::move(comm)),
        rank_(rank),
        size_(size),
        device_(device),
        host_(std::move(host)),
        timeout_(timeout) {
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaMalloc(&scratch_, sizeof(int32_t)));
  }
  ~NcclCommunicatorImpl() override {
    cudaFree(scratch_);
    cudaStreamDestroy(stream_);
    if (comm_->comm) ncclCommDestroy(comm_->comm);
    comm_->comm = nullptr;  // for requests that outlive this communicator
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& host() const override { return host_; }
  std::unique_ptr<Communicator> duplicate() const override {
    auto child = std::make_shared<CommHandle>();
    // config nullptr: the child inherits this communicator's configuration, non-blocking included.
    NCCL_CHECK(ncclCommSplit(live(), 0, rank_, &child->comm, nullptr));
    // The split is a collective over this communicator: its state, not the child's, is the one in
    // progress, and the child's handle is written when the split completes.
    settle(*comm_, "NCCL communicator split", where(), kPeerBehind, kSetUpPause);
    DPT_CHECK(child->comm != nullptr,
              "ncclCommSplit completed without a communicator on rank " << rank_);
    settle(*child, "NCCL communicator split", where(), kPeerBehind, kSetUpPause);
    return std::make_unique<NcclCommunicatorImpl>(std::move(child), rank_, size_, device_, host_,
                                                  timeout_);
  }
  void set_timeout(double seconds) override { timeout_ = seconds; }
  double timeout() const override { return timeout_; }
  cudaStream_t stream() const override { return stream_; }
  void allreduce_queued(void* data, int64_t count, DType dt, ReduceOp op) override {
    queue_allreduce(data, count, dt, op, "queued all-reduce", timeout_);
  }
  std::unique_ptr<Request> fence(cudaStream_t stream, const std::string& what) override {
    return std::make_unique<NcclRequest>(comm_, stream, what, where());
  }

  std::unique_ptr<Request> iallreduce_raw(void* data, int64_t count, DType dt, ReduceOp op,
                                          const std::string& what) override {
    queue_allreduce(data, count, dt, op, what, timeout_);
    return fence(stream_, what);
  }
  void broadcast_raw(void* data, int64_t count, DType dt, int root,
                     const std::string& what) override {
    NCCL_CHECK(ncclBroadcast(data, data, static_cast<size_t>(count), nccl_type(dt), root, live(),
                             stream_));
    launched(what, timeout_);
    fence(stream_, what)->wait();
  }
  void allgather_raw(const void* send, void* recv, int64_t count, DType dt) override {
    NCCL_CHECK(
        ncclAllGather(send, recv, static_cast<size_t>(count), nccl_type(dt), live(), stream_));
    launched("allgather", timeout_);
    NcclRequest(comm_, stream_, "allgather", where()).wait();
  }
  void barrier(const std::string& what) override {
    iallreduce_raw(scratch_, 1, DType::kI32, ReduceOp::kSum, what)->wait();
  }
  void allreduce_unbounded_raw(void* data, int64_t count, DType dt, ReduceOp op) override {
    // No deadline, as the interface says: neither for the launch nor for the completion.
    queue_allreduce(data, count, dt, op, "all-reduce launch", 0);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  std::string diagnose() override {
    if (!comm_->comm) return "NCCL communicator aborted";
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm_->comm, &async);
    return std::string("NCCL state: ") + ncclGetErrorString(async);
  }

 private:
  Where where() const { return Where{bound(), rank_, host_}; }
  // An in-place all-reduce queued on the stream; `timeout` bounds only the wait for its launch.
  void queue_allreduce(void* data, int64_t count, DType dt, ReduceOp op, const std::string& what,
                       double timeout) {
    NCCL_CHECK(ncclAllReduce(data, data, static_cast<size_t>(count), nccl_type(dt), nccl_op(op),
                             live(), stream_));
    launched(what, timeout);
  }
  // The communicator for the next NCCL call; an error once a timeout or failure aborted it.
  ncclComm_t live() const {
    DPT_CHECK(comm_->comm != nullptr,
              "rank " << rank_
                      << ": the NCCL communicator was aborted after an earlier error or timeout");
    return comm_->comm;
  }
  // After a collective call: waits until NCCL has queued it on the stream (on a non-blocking
  // communicator the first collective of a kind connects the peers on NCCL's thread first), so
  // that an event recorded next, or a call that follows, comes after it.
  void launched(const std::string& what, double timeout) {
    settle(*comm_, what, Where{WaitBound{timeout, 0, {}}, rank_, host_}, kPeerBehind,
           kCollectivePause);
  }

  SharedComm comm_;
  int rank_, size_, device_;
  std::string host_;
  double timeout_;
  cudaStream_t stream_{};
  void* scratch_ = nullptr;
};

}  // namespace

std::unique_ptr<NcclCommunicator> make_nccl_communicator(Communicator& bootstrap, int device) {
  CUDA_CHECK(cudaSetDevice(device));
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (bootstrap.rank() == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  bootstrap.broadcast(reinterpret_cast<uint8_t*>(&id), static_cast<int64_t>(sizeof id), 0,
                      "broadcast of the NCCL unique id");
  // Non-blocking: the call returns at once (ncclInProgress) and NCCL joins the peers on its own
  // thread, so a peer that never joins costs --timeout, then an abort, instead of a hang.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  auto comm = std::make_shared<CommHandle>();
  NCCL_CHECK(ncclCommInitRankConfig(&comm->comm, bootstrap.size(), id, bootstrap.rank(), &config));
  DPT_CHECK(comm->comm != nullptr,
            "ncclCommInitRankConfig returned no communicator on rank " << bootstrap.rank());
  settle(*comm, "NCCL communicator set-up",
         Where{WaitBound{bootstrap.timeout(), 0, {}}, bootstrap.rank(), bootstrap.host()},
         kPeerAbsent, kSetUpPause);
  return std::make_unique<NcclCommunicatorImpl>(std::move(comm), bootstrap.rank(), bootstrap.size(),
                                                device, bootstrap.host(), bootstrap.timeout());
}

}  // namespace dpt
