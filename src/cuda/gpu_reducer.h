// The GPU transports of the Reducer (include/dpt/ddp.h): the gradient buckets as slices of the
// device gradient buffer, summed across ranks while backward still runs. With NCCL the host never
// waits inside a step: stream events order everything (compute -> NCCL -> optimizer). Where ranks
// share a GPU (NCCL refuses that) buckets go through pinned host memory and MPI. GPU builds only.
#pragma once

#include <cstdint>
#include <memory>

#include "cuda/cuda_backend.h"
#include "dpt/comm.h"
#include "dpt/ddp.h"

namespace dpt::gpu {

// NCCL on the communicator's own stream, which waits for each bucket's gradients on the compute
// stream; the compute stream waits for the sums at finish(). The host waits (bounded by --timeout)
// only for the collectives of finished steps, in begin() and quiesce(). Capturable into a CUDA
// graph. Timings are CUDA events, read one step later (exposed time 0). Owns `nccl`
// (make_nccl_communicator); when `be` is abandoned its destructor leaks everything instead of
// waiting for the device. World size 1 works too (a sum over one rank).
std::unique_ptr<ReduceTransport> make_nccl_transport(CudaBackend& be, float* grads, int64_t count,
                                                     std::unique_ptr<Communicator> nccl);

// Ranks sharing a GPU: each launched bucket is copied to pinned host memory on a stream of its own,
// summed by `mpi` (bounded by its --timeout) in finish() as the copies land, and copied back; the
// compute stream waits for the copies back. Not capturable. `mpi` must outlive the transport.
std::unique_ptr<ReduceTransport> make_host_mpi_transport(CudaBackend& be, float* grads, int64_t count,
                                                         Communicator& mpi);

}  // namespace dpt::gpu
