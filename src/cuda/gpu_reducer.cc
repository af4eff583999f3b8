// GpuReducer (see gpu_reducer.h): events and streams for the NCCL path, pinned staging for the MPI
// fallback. Only compiled in GPU builds.
#include "cuda/gpu_reducer.h"

#include <algorithm>
#include <chrono>

#include "cuda/cuda_check.h"
#include "cuda/nccl_communicator.h"

namespace dpt::gpu {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

cudaEvent_t make_event(bool timing) {
  cudaEvent_t e = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  return e;
}

}  // namespace

GpuReducer::GpuReducer(GpuContext& ctx, float* grads, int64_t num_grads, std::vector<Bucket> buckets, bool overlap,
                       Communicator* nccl, Communicator& mpi)
    : ctx_(ctx), grads_(grads), buckets_(std::move(buckets)), overlap_(overlap), nccl_(nccl), mpi_(mpi) {
  DPT_CHECK(!buckets_.empty() && buckets_.front().begin == 0 && buckets_.back().end == num_grads,
            "GPU gradient buckets do not cover the " << num_grads << " gradients");
  pending_.resize(buckets_.size());
  try {
    if (nccl_) {
      comm_stream_ = nccl_stream(*nccl_);
      DPT_CHECK(comm_stream_ != nullptr, "GpuReducer needs an NCCL communicator (make_nccl_communicator)");
    } else {
      CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
      own_stream_ = true;
      CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host_), static_cast<size_t>(num_grads) * sizeof(float),
                               cudaHostAllocDefault));
    }
    for (size_t k = 0; k < buckets_.size(); ++k) {
      ready_.push_back(make_event(false));
      if (nccl_) {
        start_.push_back(make_event(true));
        end_.push_back(make_event(true));
      } else {
        copied_.push_back(make_event(false));
      }
    }
    done_ = make_event(false);
    bn_ready_ = make_event(false);
    bn_done_ = make_event(false);
  } catch (...) {
    release();  // the destructor does not run for a half-built object
    throw;
  }
}

GpuReducer::~GpuReducer() { release(); }

void GpuReducer::release() noexcept {
  // Best effort, never throwing: events and streams are released once their work completes.
  for (auto* list : {&ready_, &start_, &end_, &copied_})
    for (cudaEvent_t e : *list) cudaEventDestroy(e);
  ready_.clear(), start_.clear(), end_.clear(), copied_.clear();
  for (cudaEvent_t* e : {&done_, &bn_ready_, &bn_done_})
    if (*e) cudaEventDestroy(*e), *e = nullptr;
  if (host_) cudaFreeHost(host_), host_ = nullptr;
  if (own_stream_ && comm_stream_) cudaStreamDestroy(comm_stream_);
  comm_stream_ = nullptr;
}

std::string GpuReducer::what(size_t k) const {
  return DPT_MSG("all-reduce of gradient bucket " << k << " (" << buckets_[k].size() << " floats) in step " << step_
                                                  << (nccl_ ? " (NCCL)" : " (MPI, through host memory)"));
}

void GpuReducer::wait_requests(size_t count) {
  for (size_t i = 0; i < count; ++i) inflight_[i]->wait();  // each bounded by --timeout, naming itself
  inflight_.erase(inflight_.begin(), inflight_.begin() + static_cast<std::ptrdiff_t>(count));
  settled_ = settled_ > count ? settled_ - count : 0;
  if (!timed_.empty()) {
    // Each end event was recorded right after its request's own event, with nothing in between.
    double seconds = 0;
    for (size_t k : timed_) {
      float ms = 0;
      CUDA_CHECK(cudaEventSynchronize(end_[k]));
      CUDA_CHECK(cudaEventElapsedTime(&ms, start_[k], end_[k]));
      seconds += ms * 1e-3;
    }
    stats_.comm_seconds = seconds;
    timed_.clear();
  }
}

void GpuReducer::begin(int64_t step) {
  wait_requests(settled_);
  step_ = step;
  for (size_t k = 0; k < buckets_.size(); ++k) pending_[k] = buckets_[k].size();
  next_ = 0;
}

void GpuReducer::quiesce() { wait_requests(inflight_.size()); }

void GpuReducer::mark_ready(int64_t begin, int64_t end) {
  // A handful of buckets: a linear walk is cheaper than anything clever.
  for (size_t k = 0; k < buckets_.size(); ++k) {
    const int64_t overlap = std::min(end, buckets_[k].end) - std::max(begin, buckets_[k].begin);
    if (overlap <= 0) continue;
    pending_[k] -= overlap;
    DPT_CHECK(pending_[k] >= 0, "gradients of bucket " << k << " announced twice in step " << step_);
  }
  if (overlap_) launch_ready();
}

void GpuReducer::launch_ready() {
  while (next_ < buckets_.size() && pending_[next_] == 0) launch(next_++);
}

void GpuReducer::launch(size_t k) {
  const Bucket& b = buckets_[k];
  CUDA_CHECK(cudaEventRecord(ready_[k], ctx_.stream()));
  CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, ready_[k], 0));
  if (capturing_) {
    nccl_allreduce_queued(*nccl_, grads_ + b.begin, b.size(), DType::kF32, ReduceOp::kAvg);
  } else if (nccl_) {
    CUDA_CHECK(cudaEventRecord(start_[k], comm_stream_));
    inflight_.push_back(nccl_->iallreduce(grads_ + b.begin, b.size(), ReduceOp::kAvg, what(k)));
    CUDA_CHECK(cudaEventRecord(end_[k], comm_stream_));
  } else {
    CUDA_CHECK(cudaMemcpyAsync(host_ + b.begin, grads_ + b.begin, static_cast<size_t>(b.size()) * sizeof(float),
                               cudaMemcpyDeviceToHost, comm_stream_));
    CUDA_CHECK(cudaEventRecord(copied_[k], comm_stream_));
  }
}

void GpuReducer::finish() {
  for (size_t k = 0; k < buckets_.size(); ++k)
    DPT_CHECK(pending_[k] == 0, "bucket " << k << " of step " << step_ << " is missing " << pending_[k]
                                          << " gradient elements after backward");
  launch_ready();
  if (capturing_) {
    stats_.comm_seconds = stats_.exposed_seconds = 0;  // replays are not timed (no events inside)
  } else if (nccl_) {
    timed_.clear();
    for (size_t k = 0; k < buckets_.size(); ++k) timed_.push_back(k);
    settled_ = inflight_.size();
    stats_.exposed_seconds = 0;
  } else {
    // Each bucket's copy was queued as soon as backward finished it; the MPI all-reduce of bucket
    // k overlaps the GPU still computing the gradients of the buckets after it.
    const double t0 = now_seconds();
    double comm = 0;
    for (size_t k = 0; k < buckets_.size(); ++k) {
      const Bucket& b = buckets_[k];
      CUDA_CHECK(cudaEventSynchronize(copied_[k]));  // local GPU work only: it always ends
      const double c0 = now_seconds();
      mpi_.allreduce(host_ + b.begin, b.size(), ReduceOp::kAvg, what(k));
      comm += now_seconds() - c0;
      CUDA_CHECK(cudaMemcpyAsync(grads_ + b.begin, host_ + b.begin, static_cast<size_t>(b.size()) * sizeof(float),
                                 cudaMemcpyHostToDevice, comm_stream_));
    }
    stats_.comm_seconds = comm;
    stats_.exposed_seconds = now_seconds() - t0;
  }
  stats_.buckets = static_cast<int64_t>(buckets_.size());
  CUDA_CHECK(cudaEventRecord(done_, comm_stream_));
  CUDA_CHECK(cudaStreamWaitEvent(ctx_.stream(), done_, 0));
}

void GpuReducer::set_capturing(bool on) {
  DPT_CHECK(!on || nccl_, "only NCCL collectives can be captured into a CUDA graph");
  capturing_ = on;
}

void GpuReducer::graph_launched(int64_t step) {
  step_ = step;
  timed_.clear();
  stats_ = ReducerStats{};
  stats_.buckets = static_cast<int64_t>(buckets_.size());
  // The fences before this one are the next begin()'s to wait for; this one is left to the begin()
  // after, so the host queues step k+1 while the GPU still runs step k's graph (no launch gap).
  settled_ = inflight_.size();
  inflight_.push_back(nccl_stream_fence(*nccl_, ctx_.stream(),
                                        DPT_MSG("step " << step << " (a CUDA graph with its NCCL all-reduces)")));
}

void GpuReducer::allreduce_doubles(double* data, int64_t count, const std::string& what) {
  if (nccl_) {
    // Events may be recorded again once the waits on their last record are queued.
    CUDA_CHECK(cudaEventRecord(bn_ready_, ctx_.stream()));
    CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, bn_ready_, 0));
    if (capturing_)
      nccl_allreduce_queued(*nccl_, data, count, DType::kF64, ReduceOp::kSum);
    else
      inflight_.push_back(nccl_->iallreduce(data, count, ReduceOp::kSum, what));
    CUDA_CHECK(cudaEventRecord(bn_done_, comm_stream_));
    CUDA_CHECK(cudaStreamWaitEvent(ctx_.stream(), bn_done_, 0));
    return;
  }
  // MPI fallback: the compute stream waits only for local work (copies), so its sync always ends.
  std::vector<double> host(static_cast<size_t>(count));
  CUDA_CHECK(cudaMemcpyAsync(host.data(), data, host.size() * sizeof(double), cudaMemcpyDeviceToHost, ctx_.stream()));
  ctx_.synchronize();
  mpi_.allreduce(host.data(), count, ReduceOp::kSum, what);
  CUDA_CHECK(cudaMemcpyAsync(data, host.data(), host.size() * sizeof(double), cudaMemcpyHostToDevice, ctx_.stream()));
  ctx_.synchronize();  // `host` dies at the end of this scope
}

}  // namespace dpt::gpu
