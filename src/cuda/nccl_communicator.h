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

class NcclCommunicator;

// Binds this process to `device` and joins an NCCL communicator over the ranks of `bootstrap`,
// waiting at most bootstrap.timeout() seconds (0 = for ever) for every rank to join; past that,
// aborts and throws a kInternal dpt::Error naming the rank, its host and what to check.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device);
// The stream the NCCL communicator issues its collectives on (nullptr for other communicators):
// the GPU reducer records the bucket-ready event on the compute stream and makes this stream wait.
cudaStream_t nccl_stream(Communicator& comm);
// Queues an all-reduce on the NCCL stream and returns no request: the form for a CUDA graph under
// capture, where no event may be polled. Completion is watched by a fence after the graph's launch.
void nccl_allreduce_queued(Communicator& nccl, void* data, int64_t count, DType dt, ReduceOp op);
// A request that completes when everything queued on `stream` so far has run: waited for with the
// NCCL communicator's --timeout, checking NCCL's asynchronous errors and aborting the communicator
// on timeout, exactly as a collective's own request. `what` names it in errors.
std::unique_ptr<Request> nccl_stream_fence(Communicator& nccl, cudaStream_t stream, const std::string& what);

}  // namespace dpt
