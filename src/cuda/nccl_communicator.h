// The NCCL Communicator (GPU builds): the same interface as the MPI one, on device buffers.
// Rank 0 creates the unique id, the bootstrap (MPI) communicator broadcasts it, every rank joins
// with ncclCommInitRank. Collectives run on the communicator's own stream; a request is a CUDA
// event on it, polled with the same --timeout as MPI waits; on timeout the NCCL communicator is
// aborted (ncclCommAbort) so no kernel spins forever, and ncclCommGetAsyncError is checked.
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "dpt/comm.h"

namespace dpt {

class NcclCommunicator;

// Binds this process to `device` and joins an NCCL communicator over the ranks of `bootstrap`.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device);
// The stream the NCCL communicator issues its collectives on (nullptr for other communicators):
// the GPU reducer records the bucket-ready event on the compute stream and makes this stream wait.
cudaStream_t nccl_stream(Communicator& comm);

}  // namespace dpt
