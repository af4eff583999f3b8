// NCCL implementation of Communicator (see nccl_communicator.h). Counts are elements; pointers are
// device pointers. Only compiled in GPU builds.
#include "cuda/nccl_communicator.h"

#include <chrono>
#include <cstring>
#include <thread>

#include "cuda/cuda_check.h"
#include "dpt/error.h"

namespace dpt {

namespace {

ncclDataType_t nccl_type(DType dt) {
  switch (dt) {
    case DType::kF32: return ncclFloat32;
    case DType::kF64: return ncclFloat64;
    case DType::kI32: return ncclInt32;
    case DType::kI64: return ncclInt64;
    case DType::kU64: return ncclUint64;
    case DType::kU8: return ncclUint8;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  return ncclSum;
}

class NcclRequest : public Request {
 public:
  NcclRequest(ncclComm_t comm, cudaStream_t stream, std::string what, double timeout, int rank)
      : comm_(comm), what_(std::move(what)), timeout_(timeout), rank_(rank) {
    CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(event_, stream));
  }
  ~NcclRequest() override { cudaEventDestroy(event_); }
  bool test() override {
    if (done_) return true;
    ncclResult_t async = ncclSuccess;
    NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
    if (async != ncclSuccess && async != ncclInProgress)
      throw Error(ErrorKind::kInternal, DPT_MSG(what_ << " failed on rank " << rank_ << ": NCCL "
                                                      << ncclGetErrorString(async)));
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
    const auto start = std::chrono::steady_clock::now();
    while (!test()) {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      if (timeout_ > 0 &&
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_) {
        ncclCommAbort(comm_);  // frees the GPU from a collective that can never complete
        throw Error(ErrorKind::kInternal,
                    DPT_MSG(what_ << " did not complete within --timeout " << timeout_ << " s on rank "
                                  << rank_ << " (NCCL communicator aborted): a peer rank is stopped, "
                                                 "dead or far behind"));
      }
    }
  }

 private:
  ncclComm_t comm_;
  cudaEvent_t event_{};
  std::string what_;
  double timeout_;
  int rank_;
  bool done_ = false;
};

}  // namespace

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, int device, std::string host, double timeout)
      : comm_(comm), rank_(rank), size_(size), device_(device), host_(std::move(host)), timeout_(timeout) {
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaMalloc(&scratch_, sizeof(int32_t)));
  }
  ~NcclCommunicator() override {
    cudaFree(scratch_);
    cudaStreamDestroy(stream_);
    ncclCommDestroy(comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& host() const override { return host_; }
  std::unique_ptr<Communicator> duplicate() const override {
    ncclComm_t split;
    NCCL_CHECK(ncclCommSplit(comm_, 0, rank_, &split, nullptr));
    return std::make_unique<NcclCommunicator>(split, rank_, size_, device_, host_, timeout_);
  }
  void set_timeout(double seconds) override { timeout_ = seconds; }
  double timeout() const override { return timeout_; }
  cudaStream_t stream() const { return stream_; }
  void allreduce_queued(void* data, int64_t count, DType dt, ReduceOp op) {
    NCCL_CHECK(ncclAllReduce(data, data, static_cast<size_t>(count), nccl_type(dt), nccl_op(op), comm_, stream_));
  }
  std::unique_ptr<Request> fence(cudaStream_t stream, const std::string& what) {
    return std::make_unique<NcclRequest>(comm_, stream, what, timeout_, rank_);
  }

  std::unique_ptr<Request> iallreduce_raw(void* data, int64_t count, DType dt, ReduceOp op,
                                          const std::string& what) override {
    allreduce_queued(data, count, dt, op);
    return fence(stream_, what);
  }
  std::unique_ptr<Request> ibroadcast_raw(void* data, int64_t count, DType dt, int root,
                                          const std::string& what) override {
    NCCL_CHECK(ncclBroadcast(data, data, static_cast<size_t>(count), nccl_type(dt), root, comm_, stream_));
    return std::make_unique<NcclRequest>(comm_, stream_, what, timeout_, rank_);
  }
  void reduce_raw(const void* send, void* recv, int64_t count, DType dt, ReduceOp op, int root) override {
    NCCL_CHECK(ncclReduce(send, recv, static_cast<size_t>(count), nccl_type(dt), nccl_op(op), root, comm_, stream_));
    NcclRequest(comm_, stream_, "reduce", timeout_, rank_).wait();
  }
  void allgather_raw(const void* send, void* recv, int64_t count, DType dt) override {
    NCCL_CHECK(ncclAllGather(send, recv, static_cast<size_t>(count), nccl_type(dt), comm_, stream_));
    NcclRequest(comm_, stream_, "allgather", timeout_, rank_).wait();
  }
  void barrier() override { iallreduce_raw(scratch_, 1, DType::kI32, ReduceOp::kSum, "barrier")->wait(); }
  void allreduce_unbounded_raw(void* data, int64_t count, DType dt, ReduceOp op) override {
    // NCCL collectives are asynchronous anyway; completion is awaited without a deadline.
    NCCL_CHECK(ncclAllReduce(data, data, static_cast<size_t>(count), nccl_type(dt), nccl_op(op), comm_, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  std::string diagnose() override {
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm_, &async);
    return std::string("NCCL state: ") + ncclGetErrorString(async);
  }

 private:
  ncclComm_t comm_;
  int rank_, size_, device_;
  std::string host_;
  double timeout_;
  cudaStream_t stream_{};
  void* scratch_ = nullptr;
};

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device) {
  CUDA_CHECK(cudaSetDevice(device));
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (bootstrap.rank() == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  bootstrap.broadcast(reinterpret_cast<uint8_t*>(&id), static_cast<int64_t>(sizeof id), 0,
                      "broadcast of the NCCL unique id");
  ncclComm_t comm;
  NCCL_CHECK(ncclCommInitRank(&comm, bootstrap.size(), id, bootstrap.rank()));
  return std::make_unique<NcclCommunicator>(comm, bootstrap.rank(), bootstrap.size(), device,
                                            bootstrap.host(), bootstrap.timeout());
}

cudaStream_t nccl_stream(Communicator& comm) {
  auto* n = dynamic_cast<NcclCommunicator*>(&comm);
  return n ? n->stream() : nullptr;
}

namespace {
NcclCommunicator& as_nccl(Communicator& comm) {
  auto* n = dynamic_cast<NcclCommunicator*>(&comm);
  DPT_CHECK(n != nullptr, "an NCCL communicator was expected (make_nccl_communicator)");
  return *n;
}
}  // namespace

void nccl_allreduce_queued(Communicator& nccl, void* data, int64_t count, DType dt, ReduceOp op) {
  as_nccl(nccl).allreduce_queued(data, count, dt, op);
}

std::unique_ptr<Request> nccl_stream_fence(Communicator& nccl, cudaStream_t stream, const std::string& what) {
  return as_nccl(nccl).fence(stream, what);
}

}  // namespace dpt
