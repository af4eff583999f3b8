// The GPU training backend (--device cuda): this rank's steps, evaluation and optimizer on one GPU,
// behind the TrainBackend interface that run_training drives. Only compiled in GPU builds.
#pragma once

#include <memory>

#include "dpt/train.h"

namespace dpt {

class Backend;
class Communicator;
class DataParallel;
struct ImageSet;

// The CUDA operations backend (src/cuda/cuda_backend.h) on GPU local_rank mod visible devices, with
// --tf32 and --precision applied: the model is built on it.
std::unique_ptr<Backend> make_cuda_backend(const TrainConfig& cfg, int local_rank);

// Joins an NCCL communicator over `comm` when every rank has a GPU of its own (else averages
// gradients by MPI through host memory, with one log line), uploads both data sets and the model's
// state. Collective: every rank calls it. `ops` is make_cuda_backend's and `model` is built on it;
// cfg is the run's validated configuration; everything passed must outlive the backend.
std::unique_ptr<TrainBackend> make_gpu_backend(const TrainConfig& cfg, Communicator& comm, Backend& ops, Model& model,
                                               DataParallel& ddp, Sgd& opt, const ImageSet& train,
                                               const ImageSet& test);

}  // namespace dpt
