// The NCCL and host-MPI transports of the Reducer (see gpu_reducer.h), over one base that owns
// what both need: the communication stream, the events ordering it with the compute stream, the
// wire buffer gradients travel in, and their release. Only compiled in GPU builds.
//
// Both transports take one path whatever the wire type (--grad-dtype): the wire buffer is the
// gradients themselves for fp32 (no cast), else a 16-bit staging buffer the casts fill and empty.
// Per bucket, everything on the communication stream after it waited for the bucket's gradients
// (so the casts, like the all-reduce, overlap the rest of backward and sit in a CUDA graph with
// it):
//   NCCL:     to wire, ncclAllReduce(wire, sum) (16-bit: NCCL adds in float and rounds), from wire.
//   host MPI: to wire, copy wire -> pinned host (16-bit: half the bytes of fp32), MPI sum
//             (16-bit: Communicator's float-add-and-round operation), copy back, from wire.
// A bucket's slice of the wire buffer is its own ([begin, end) as in the gradients), and the
// stream orders one step's use of it after the last's: no other synchronisation is needed.
#include "cuda/gpu_reducer.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/nccl_communicator.h"
#include "dpt/clock.h"
#include "dpt/error.h"
#include "precision.cuh"

namespace dpt::gpu {

namespace {

// What both transports share: the compute stream (the backend's context), the stream the
// collectives or copies run on, the events ordering the two, and their release.
class StreamTransport : public ReduceTransport {
 public:
  ~StreamTransport() override { release(); }
  StreamTransport(const StreamTransport&) = delete;
  StreamTransport& operator=(const StreamTransport&) = delete;

 protected:
  // comm_stream: the stream to order the work on (NCCL's, borrowed); nullptr creates a
  // non-blocking one of its own (non-blocking, as the compute stream, so a CUDA graph capture on
  // the compute stream is never disturbed by it).
  // wire: kF32, or kBF16 / kF16 with a device staging buffer of `count` 16-bit values, allocated
  // once here through the backend (so CUDA graphs count it), never inside a step.
  StreamTransport(CudaBackend& be, float* grads, int64_t count, cudaStream_t comm_stream,
                  DType wire)
      : be_(be),
        ctx_(be.context()),
        grads_(grads),
        count_(count),
        comm_(comm_stream),
        wire_(wire),
        wire_size_(wire == DType::kF32 ? sizeof(float) : sizeof(uint16_t)) {
    DPT_CHECK(wire == DType::kF32 || wire == DType::kBF16 || wire == DType::kF16,
              "gradients travel as fp32, bf16 or fp16");
    try {
      if (!comm_) {
        CUDA_CHECK(cudaStreamCreateWithFlags(&comm_, cudaStreamNonBlocking));
        own_stream_ = true;
      }
      ready_ = event(false);
      done_ = event(false);
      if (compressed())
        stage_ = static_cast<uint16_t*>(be_.allocate(wire_bytes(std::max<int64_t>(count_, 1))));
    } catch (...) {
      release();  // the destructor does not run for a half-built object
      throw;
    }
  }

  // An event released with the transport; timing ones can be read by cudaEventElapsedTime.
  cudaEvent_t event(bool timing) {
    events_.push_back(nullptr);  // owned before it exists: nothing leaks whichever call fails
    CUDA_CHECK(cudaEventCreateWithFlags(&events_.back(),
                                        timing ? cudaEventDefault : cudaEventDisableTiming));
    return events_.back();
  }
  // Bucket k's event in `list`, created on first use: a transport learns the buckets from launch().
  cudaEvent_t bucket_event(std::vector<cudaEvent_t>& list, size_t k, bool timing) {
    while (list.size() <= k) list.push_back(event(timing));
    return list[k];
  }

  void check_bucket(const Bucket& b) const {
    DPT_CHECK(b.begin >= 0 && b.begin <= b.end && b.end <= count_,
              "gradient bucket [" << b.begin << ", " << b.end << ") outside the " << count_
                                  << " gradients");
  }
  // The communication stream waits for the work queued on the compute stream so far (a bucket's
  // gradients). One event serves every wait: a wait binds to the record before it, so the event
  // may be recorded again as soon as the wait is queued (under capture too).
  void comm_follows_compute() {
    CUDA_CHECK(cudaEventRecord(ready_, ctx_.stream()));
    CUDA_CHECK(cudaStreamWaitEvent(comm_, ready_, 0));
  }
  // The compute stream waits for the work queued on the communication stream so far, so what is
  // queued next (the optimizer, the next layer) reads the sums. The host does not wait.
  void compute_follows_comm() {
    CUDA_CHECK(cudaEventRecord(done_, comm_));
    CUDA_CHECK(cudaStreamWaitEvent(ctx_.stream(), done_, 0));
  }
  bool abandoned() const { return be_.abandoned(); }

  bool compressed() const { return wire_ != DType::kF32; }
  size_t wire_bytes(int64_t n) const { return static_cast<size_t>(n) * wire_size_; }
  // Bucket b's slice of the wire buffer: the gradients themselves for fp32, else the staging
  // buffer.
  void* wire_at(const Bucket& b) const {
    return compressed() ? static_cast<void*>(stage_ + b.begin)
                        : static_cast<void*>(grads_ + b.begin);
  }
  // `what` as a bucket's collective names itself in errors: how it travels, and in what if not
  // fp32.
  std::string labelled(const std::string& what, const char* via) const {
    return what + " (" + via +
           (compressed() ? std::string(", ") + grad_wire_name(wire_) : std::string()) + ")";
  }
  // On the communication stream, for a 16-bit wire (nothing for fp32): bucket b's gradients into
  // its slice of the staging buffer, rounded to nearest even; and the slice back (exact).
  void to_wire(const Bucket& b) {
    if (!compressed()) return;
    const int64_t n = b.size();
    CUDA_CHECK(wire_ == DType::kBF16
                   ? cuda::launch_to_bf16(grads_ + b.begin, stage_ + b.begin, n, comm_)
                   : cuda::launch_to_f16(grads_ + b.begin, stage_ + b.begin, n, comm_));
  }
  void from_wire(const Bucket& b) {
    if (!compressed()) return;
    const int64_t n = b.size();
    CUDA_CHECK(wire_ == DType::kBF16
                   ? cuda::launch_from_bf16(stage_ + b.begin, grads_ + b.begin, n, false, comm_)
                   : cuda::launch_from_f16(stage_ + b.begin, grads_ + b.begin, n, false, comm_));
  }
  // Frees the staging buffer once the communication stream's work on it is done. Derived
  // destructors call it while that stream still exists (NCCL's dies with its communicator).
  void release_stage() noexcept {
    if (!stage_ || be_.abandoned()) return;  // abandoned: leak (see release())
    cudaStreamSynchronize(comm_);  // best effort: the casts still queued read and write it
    be_.release(stage_);
    stage_ = nullptr;
  }

  CudaBackend& be_;
  GpuContext& ctx_;
  float* const grads_;
  const int64_t count_;
  cudaStream_t comm_ = nullptr;
  const DType wire_;
  const size_t wire_size_;     // bytes per gradient on the wire
  uint16_t* stage_ = nullptr;  // 16-bit wire: `count_` values on the device

 private:
  void release() noexcept {
    // Abandoned after an error: the streams may never drain (a collective a dead peer never
    // completes) and the process is about to end, so leak rather than call into the device.
    if (be_.abandoned()) return;
    // Still here only when a constructor failed (destructors call release_stage()): nothing queued.
    if (stage_) be_.release(stage_);
    stage_ = nullptr;
    // Best effort, never throwing: events and streams are released once their work completes.
    for (cudaEvent_t e : events_)
      if (e) cudaEventDestroy(e);
    events_.clear();
    if (own_stream_ && comm_) cudaStreamDestroy(comm_);
    comm_ = nullptr;
  }

  std::vector<cudaEvent_t> events_;  // every event created, for release()
  bool own_stream_ = false;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
};

// ---- NCCL ------------------------------------------------------------------------------------

class NcclTransport final : public StreamTransport {
 public:
  NcclTransport(CudaBackend& be, float* grads, int64_t count,
                std::unique_ptr<NcclCommunicator> nccl, DType wire)
      : StreamTransport(be, grads, count, stream_of(nccl.get()), wire), nccl_(std::move(nccl)) {}

  ~NcclTransport() override {
    // ncclCommDestroy finalizes, i.e. waits for the collectives queued: never after an error.
    if (abandoned()) {
      (void)nccl_.release();
      for (auto& r : inflight_) (void)r.release();
    }
    release_stage();  // while NCCL's stream, which the casts run on, still exists
  }

  void begin(int64_t) override {
    wait_requests(settled_);
    launched_.clear();
  }

  void launch(size_t k, const Bucket& b, const std::string& what) override {
    check_bucket(b);
    comm_follows_compute();
    if (capturing_) {  // nothing may be polled or timed inside a capture
      // The casts are kernels on NCCL's stream, captured with the all-reduce between them.
      to_wire(b);
      nccl_->allreduce_queued(wire_at(b), b.size(), wire_, ReduceOp::kSum);
      from_wire(b);
      return;
    }
    const cudaEvent_t start = bucket_event(start_, k, true), end = bucket_event(end_, k, true);
    CUDA_CHECK(cudaEventRecord(start, comm_));
    // The request completes with the all-reduce; the cast back after it is ordered before the
    // compute stream's next work by finish(), and inside the timing (start .. end).
    to_wire(b);
    inflight_.push_back(
        nccl_->iallreduce_raw(wire_at(b), b.size(), wire_, ReduceOp::kSum, labelled(what, "NCCL")));
    from_wire(b);
    CUDA_CHECK(cudaEventRecord(end, comm_));
    launched_.push_back(k);
  }

  void finish(ReducerStats& stats) override {
    if (capturing_) {
      stats.comm_seconds = stats.exposed_seconds = 0;  // replays are not timed (no events inside)
    } else {
      // This step's requests are the next begin()'s to wait for, and its timing events then read.
      timed_.swap(launched_);
      launched_.clear();
      settled_ = inflight_.size();
      stats.comm_seconds = comm_seconds_;  // of the last step whose events have been read
      stats.exposed_seconds = 0;           // the host does not wait
    }
    compute_follows_comm();
  }

  void quiesce() override { wait_requests(inflight_.size()); }

  void allreduce_doubles(double* data, int64_t count, const std::string& what) override {
    comm_follows_compute();
    if (capturing_)
      nccl_->allreduce_queued(data, count, DType::kF64, ReduceOp::kSum);
    else
      inflight_.push_back(nccl_->iallreduce(data, count, ReduceOp::kSum, what));
    compute_follows_comm();
  }

  bool capturable() const override { return true; }
  void set_capturing(bool on) override { capturing_ = on; }

  // After each launch of a graph holding a step's collectives: one fence on the compute stream in
  // their place. The fences before this one are the next begin()'s to wait for; this one is left to
  // the begin() after, so the host queues step k+1 while the GPU still runs step k's graph (no
  // launch gap). quiesce() waits for all of them, bounded by --timeout, so a dead peer still ends
  // the job.
  void graph_launched(int64_t step) override {
    timed_.clear();
    comm_seconds_ = 0;
    settled_ = inflight_.size();
    inflight_.push_back(nccl_->fence(
        ctx_.stream(), DPT_MSG("step " << step << " (a CUDA graph with its NCCL all-reduces)")));
  }

 private:
  static cudaStream_t stream_of(const NcclCommunicator* nccl) {
    DPT_CHECK(nccl != nullptr,
              "the NCCL transport needs an NCCL communicator (make_nccl_communicator)");
    return nccl->stream();
  }

  // Waits for the first `count` requests in flight (each bounded by --timeout, naming itself), then
  // reads the timing events of the last finished step once its requests are among those done.
  void wait_requests(size_t count) {
    for (size_t i = 0; i < count; ++i) inflight_[i]->wait();
    inflight_.erase(inflight_.begin(), inflight_.begin() + static_cast<std::ptrdiff_t>(count));
    settled_ = settled_ > count ? settled_ - count : 0;
    if (timed_.empty()) return;
    // Each end event was recorded right after its request's own event, with nothing in between.
    double seconds = 0;
    for (size_t k : timed_) {
      float ms = 0;
      CUDA_CHECK(cudaEventSynchronize(end_[k]));
      CUDA_CHECK(cudaEventElapsedTime(&ms, start_[k], end_[k]));
      seconds += ms * 1e-3;
    }
    comm_seconds_ = seconds;
    timed_.clear();
  }

  std::unique_ptr<NcclCommunicator> nccl_;
  bool capturing_ = false;
  std::vector<cudaEvent_t> start_, end_;  // per bucket, around its all-reduce (timing)
  std::vector<std::unique_ptr<Request>> inflight_;
  size_t settled_ = 0;            // inflight_[0, settled_) belong to finished steps
  std::vector<size_t> launched_;  // buckets of this step with timing events
  std::vector<size_t> timed_;     // those of the last finished step, until their events are read
  double comm_seconds_ = 0;
};

// ---- pinned host memory and MPI --------------------------------------------------------------

class HostMpiTransport final : public StreamTransport {
 public:
  // A compressed wire casts on the device (into the staging buffer) rather than on the host after
  // an fp32 copy: the copies move half the bytes, and the casts run on the GPU as each bucket is
  // ready, overlapping backward, instead of on the host inside finish(), where they would add to
  // the exposed time. The host never converts (the MPI sum rounds each partial sum itself).
  HostMpiTransport(CudaBackend& be, float* grads, int64_t count, Communicator& mpi, DType wire)
      : StreamTransport(be, grads, count, nullptr, wire), mpi_(mpi) {
    CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host_),
                             wire_bytes(std::max<int64_t>(count, 1)), cudaHostAllocDefault));
  }

  ~HostMpiTransport() override {
    // cudaFreeHost synchronises the device: never after an error (see StreamTransport::release).
    if (host_ && !abandoned()) cudaFreeHost(host_);
    release_stage();
  }

  void begin(int64_t) override { launched_.clear(); }

  void launch(size_t k, const Bucket& b, const std::string& what) override {
    check_bucket(b);
    comm_follows_compute();
    to_wire(b);
    CUDA_CHECK(cudaMemcpyAsync(host_at(b), wire_at(b), wire_bytes(b.size()), cudaMemcpyDeviceToHost,
                               comm_));
    const cudaEvent_t copied = bucket_event(copied_, k, false);
    CUDA_CHECK(cudaEventRecord(copied, comm_));
    launched_.push_back({b, copied, labelled(what, "MPI, through host memory")});
  }

  void finish(ReducerStats& stats) override {
    // Each bucket's copy was queued as soon as backward finished it; the MPI all-reduce of bucket
    // k overlaps the GPU still computing the gradients of the buckets after it.
    const double t0 = now_seconds();
    double comm = 0;
    for (const Launched& l : launched_) {
      CUDA_CHECK(cudaEventSynchronize(l.copied));  // local GPU work only: it always ends
      const double c0 = now_seconds();
      mpi_.iallreduce_raw(host_at(l.range), l.range.size(), wire_, ReduceOp::kSum, l.what)->wait();
      comm += now_seconds() - c0;
      CUDA_CHECK(cudaMemcpyAsync(wire_at(l.range), host_at(l.range), wire_bytes(l.range.size()),
                                 cudaMemcpyHostToDevice, comm_));
      from_wire(l.range);
    }
    launched_.clear();
    stats.comm_seconds = comm;
    stats.exposed_seconds = now_seconds() - t0;
    compute_follows_comm();
  }

  void allreduce_doubles(double* data, int64_t count, const std::string& what) override {
    // The compute stream waits only for local work (copies), so its sync always ends.
    std::vector<double> host(static_cast<size_t>(count));
    CUDA_CHECK(cudaMemcpyAsync(host.data(), data, host.size() * sizeof(double),
                               cudaMemcpyDeviceToHost, ctx_.stream()));
    ctx_.synchronize();
    mpi_.allreduce(host.data(), count, ReduceOp::kSum, what);
    CUDA_CHECK(cudaMemcpyAsync(data, host.data(), host.size() * sizeof(double),
                               cudaMemcpyHostToDevice, ctx_.stream()));
    ctx_.synchronize();  // `host` dies at the end of this scope
  }

  void set_capturing(bool on) override {
    DPT_CHECK(
        !on,
        "only NCCL collectives can be captured into a CUDA graph (ranks sharing a GPU sum by MPI)");
  }

 private:
  struct Launched {
    Bucket range;
    cudaEvent_t copied;  // its copy to host_ is complete
    std::string what;
  };

  // Bucket b's slice of the pinned mirror of the wire buffer.
  void* host_at(const Bucket& b) const { return host_ + wire_bytes(b.begin); }

  Communicator& mpi_;
  uint8_t* host_ = nullptr;  // pinned mirror of the wire buffer (`count` values of the wire type)
  std::vector<cudaEvent_t> copied_;  // per bucket
  std::vector<Launched> launched_;   // this step's buckets, in launch order
};

}  // namespace

std::unique_ptr<ReduceTransport> make_nccl_transport(CudaBackend& be, float* grads, int64_t count,
                                                     std::unique_ptr<NcclCommunicator> nccl,
                                                     DType wire) {
  return std::make_unique<NcclTransport>(be, grads, count, std::move(nccl), wire);
}

std::unique_ptr<ReduceTransport> make_host_mpi_transport(CudaBackend& be, float* grads,
                                                         int64_t count, Communicator& mpi,
                                                         DType wire) {
  return std::make_unique<HostMpiTransport>(be, grads, count, mpi, wire);
}

}  // namespace dpt::gpu
