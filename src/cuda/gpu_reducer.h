// The GPU transports of the Reducer (include/dpt/reducer.h): the gradient buckets as slices of the
// device gradient buffer, summed across ranks while backward still runs. With NCCL the host never
// waits inside a step: stream events order everything (compute -> NCCL -> optimizer). Where ranks
// share a GPU (NCCL refuses that) buckets go through pinned host memory and MPI. GPU builds only.
#pragma once

#include <cstdint>
#include <memory>

#include "cuda/cuda_backend.h"
#include "cuda/nccl_communicator.h"
#include "dpt/comm.h"
#include "dpt/reducer.h"

namespace dpt::gpu {

// NCCL on the communicator's own stream, which waits for each bucket's gradients on the compute
// stream; the compute stream waits for the sums at finish(). The host waits (bounded by --timeout)
// only for the collectives of finished steps, in begin() and quiesce(). Capturable into a CUDA
// graph. Timings are CUDA events, read one step later (exposed time 0). Owns `nccl`
// (make_nccl_communicator); when `be` is abandoned its destructor leaks everything instead of
// waiting for the device. World size 1 works too (a sum over one rank).
// wire: the type gradients travel in (--grad-dtype). kF32 all-reduces the gradient buffer in place;
// kBF16 / kF16 cast each bucket into a device staging buffer of `count` 16-bit values (allocated
// here, once), all-reduce that (NCCL adds in float and rounds each partial sum) and cast the sums
// back into the gradients, all three on NCCL's stream (capturable; at world size 1 too, where the
// gradients come back rounded to 16 bits).
std::unique_ptr<ReduceTransport> make_nccl_transport(CudaBackend& be, float* grads, int64_t count,
                                                     std::unique_ptr<NcclCommunicator> nccl,
                                                     DType wire = DType::kF32);

// Ranks sharing a GPU: each launched bucket is copied to pinned host memory on a stream of its own,
// summed by `mpi` (bounded by its --timeout) in finish() as the copies land, and copied back; the
// compute stream waits for the copies back. Not capturable. `mpi` must outlive the transport.
// wire: kF32 copies the floats; kBF16 / kF16 cast each bucket on the GPU into a device staging
// buffer and copy those 16-bit values (half the bytes) to pinned host memory, where `mpi` sums them
// (its 16-bit sum: float additions, each rounded), then back and cast into the gradients.
std::unique_ptr<ReduceTransport> make_host_mpi_transport(CudaBackend& be, float* grads,
                                                         int64_t count, Communicator& mpi,
                                                         DType wire = DType::kF32);

}  // namespace dpt::gpu
