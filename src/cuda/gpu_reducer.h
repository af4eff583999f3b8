// Gradient all-reduce of the GPU training path: the host plan's buckets (DataParallel) as slices
// of the device gradient buffer, averaged across ranks while backward still runs. With NCCL the
// host never waits inside a step: stream events order everything (compute -> NCCL -> optimizer).
// Where ranks share a GPU (NCCL refuses that) buckets go through pinned host memory and MPI.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda/gpu_context.h"
#include "dpt/comm.h"
#include "dpt/ddp.h"

namespace dpt::gpu {

class GpuReducer {
 public:
  // grads: the device gradient buffer (num_grads floats, the host layout). nccl: an NCCL
  // communicator over all ranks, whose own stream carries the all-reduces; nullptr selects the MPI
  // fallback (each bucket copied to pinned host memory, averaged by `mpi`, copied back). Every host
  // wait is bounded by the communicators' --timeout. World size 1 works too (an average of one).
  GpuReducer(GpuContext& ctx, float* grads, int64_t num_grads, std::vector<Bucket> buckets, bool overlap,
             Communicator* nccl, Communicator& mpi);
  ~GpuReducer();
  GpuReducer(const GpuReducer&) = delete;
  GpuReducer& operator=(const GpuReducer&) = delete;

  bool uses_nccl() const { return nccl_ != nullptr; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  // Before a synchronised backward: waits (bounded) for the previous step's collectives, then every
  // bucket waits for its gradients again. `step` names it in errors.
  void begin(int64_t step);
  // Backward queued the kernels that finish [begin, end) of the gradient buffer. Bucket k is
  // launched once complete and after bucket k-1 (the same order on every rank): an event on the
  // compute stream, which the communication stream waits for.
  void mark_ready(int64_t begin, int64_t end);
  // After backward: launches what is left (all buckets with --no-overlap) and makes the compute
  // stream wait for every bucket, so the optimizer queued next reads averaged gradients. NCCL: the
  // host does not wait. MPI fallback: the host all-reduces bucket by bucket as their copies land.
  void finish();
  // The host waits, bounded by --timeout, for every collective issued so far. Call before anything
  // that waits for the compute stream without a bound (copies to the host, stream syncs), since the
  // compute stream may wait for a collective that a dead peer never completes.
  void quiesce();
  // Sums `count` device doubles in place across ranks, after the work queued on the compute stream
  // so far and before the work queued after (synchronised BatchNorm's statistics).
  void allreduce_doubles(double* data, int64_t count, const std::string& what);
  // Of the last finished step (NCCL: the all-reduce time measured by CUDA events, available one
  // step later; exposed time 0, since the host does not wait. MPI fallback: host times).
  const ReducerStats& last_stats() const { return stats_; }

  // CUDA graphs (NCCL only). While capturing, the collectives are queued without requests or
  // timing events (nothing may be polled inside a capture). After each launch of a graph holding a
  // step's collectives, graph_launched() hangs one fence on the compute stream in their place: the
  // begin() one step later (so one graph may still run while the host queues the next) or any
  // quiesce() waits for it, bounded by --timeout, so a dead peer still ends the job.
  void set_capturing(bool on);
  void graph_launched(int64_t step);

 private:
  void release() noexcept;
  void launch_ready();
  void launch(size_t k);
  std::string what(size_t k) const;
  void wait_requests(size_t count);

  GpuContext& ctx_;
  float* grads_;
  std::vector<Bucket> buckets_;
  bool overlap_;
  bool capturing_ = false;
  Communicator* nccl_;
  Communicator& mpi_;
  cudaStream_t comm_stream_ = nullptr;  // NCCL's stream, or our copy stream in the MPI fallback
  bool own_stream_ = false;
  float* host_ = nullptr;  // pinned mirror of the gradients (MPI fallback)
  std::vector<cudaEvent_t> ready_, start_, end_, copied_;
  cudaEvent_t done_ = nullptr, bn_ready_ = nullptr, bn_done_ = nullptr;
  std::vector<int64_t> pending_;
  size_t next_ = 0;
  int64_t step_ = 0;
  std::vector<std::unique_ptr<Request>> inflight_;
  size_t settled_ = 0;          // inflight_[0, settled_) belong to finished steps
  std::vector<size_t> timed_;   // buckets of the last finished step with NCCL timing events
  ReducerStats stats_;
};

}  // namespace dpt::gpu
