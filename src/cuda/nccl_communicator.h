// The NCCL Communicator (GPU builds): the same interface as the MPI one, on device buffers.
// Rank 0 creates the unique id, the bootstrap (MPI) communicator broadcasts it, every rank joins
// with a non-blocking ncclCommInitRankConfig polled against the bootstrap's --timeout, so a peer
// that never joins ends the set-up with an error instead of a hang. Collectives run on the
// communicator's own stream; a request is a CUDA event on it, polled with the same --timeout as
// MPI waits; on timeout the NCCL communicator is aborted (ncclCommAbort) so no kernel spins
// forever, and ncclCommGetAsyncError is checked.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>

#include "dpt/comm.h"

namespace dpt {

// A Communicator over NCCL, with what the GPU reducer needs beyond the interface: the stream the
// collectives run on, an all-reduce queued without a request (for CUDA graphs), and a fence.
class NcclCommunicator : public Communicator {
 public:
  // The stream the collectives are issued on: the GPU reducer records the bucket-ready event on the
  // compute stream and makes this stream wait.
  virtual cudaStream_t stream() const = 0;
  // Queues an all-reduce on stream() and returns no request: the form for a CUDA graph under
  // capture, where no event may be polled. Completion is watched by a fence after the graph's
  // launch.
  virtual void allreduce_queued(void* data, int64_t count, DType dt, ReduceOp op) = 0;
  // A request that completes when everything queued on `stream` so far has run: waited for with
  // this communicator's --timeout, checking NCCL's asynchronous errors and aborting the
  // communicator on timeout, exactly as a collective's own request. `what` names it in errors.
  virtual std::unique_ptr<Request> fence(cudaStream_t stream, const std::string& what) = 0;
};

// Binds this process to `device` and joins an NCCL communicator over the ranks of `bootstrap`,
// waiting at most bootstrap.timeout() seconds (0 = for ever) for every rank to join; past that,
// aborts and throws a kInternal dpt::Error naming the rank, its host and what to check.
std::unique_ptr<NcclCommunicator> make_nccl_communicator(Communicator& bootstrap, int device);

}  // namespace dpt
