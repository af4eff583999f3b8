// Data parallelism as a wrapper, in the manner of PyTorch's DistributedDataParallel: DataParallel
// wraps a Model and a Communicator, checks the replicas agree, broadcasts rank 0's parameters, and
// owns the Reducer (reducer.h) that all-reduces gradient buckets (contiguous slices of the flat
// gradient buffer, in backward order) over its transport while backward runs. The StepEngine
// (engine.h) runs every training step through it. Gradients are SUMMED; the loss is scaled by
// 1/global_batch, so k ranks match 1 rank.
#pragma once

#include <cstdint>
#include <memory>

#include "dpt/comm.h"
#include "dpt/nn.h"
#include "dpt/reducer.h"
#include "dpt/trace.h"

namespace dpt {

struct DdpOptions {
  double bucket_mb = 25.0;
  double first_bucket_mb = 1.0;
  // > 0: the first layers' gradients (produced last) get a last bucket of at most this size and
  // a quarter of all gradients, so less is left to all-reduce after backward. Off by default: on
  // 2-core CPU hosts the extra overlap competes with backward for the cores (docs/PERFORMANCE.md).
  double last_bucket_mb = 0;
  bool overlap = true;
  bool sync_bn = false;
  DType grad_dtype = DType::kF32;  // the wire type of the default (MPI) transport
};

class DataParallel {
 public:
  // transport: how gradients travel (null: make_mpi_transport over comm and the host gradients).
  DataParallel(Model& model, Communicator& comm, const DdpOptions& options,
               std::unique_ptr<ReduceTransport> transport = nullptr);
  Reducer& reducer() { return *reducer_; }

  // The context of a backward pass: with sync, each layer's gradient announcement marks its range
  // ready in the Reducer (whose begin() the caller has called: the StepEngine begins the step
  // before anything else of it is queued, and waits for it before the optimizer); without (the
  // micro-steps of gradient accumulation before the last) gradients only accumulate locally.
  BackwardCtx backward_ctx(bool sync, bool accumulate, Tracer* tracer);
  // Gives every rank rank 0's parameters and buffers (done at construction; again after a resume).
  void broadcast_state();
  // Makes BatchNorm running statistics identical on every rank (their average); the counters,
  // equal on every rank already, are left out.
  void sync_buffers();
  // Compares a checksum of the parameters across ranks; throws naming the ranks that differ.
  void verify_replicas(int64_t step);

 private:
  void check_replicas();
  Model& model_;
  Communicator& comm_;
  std::unique_ptr<Reducer> reducer_;
};

}  // namespace dpt
