// The GPU training backend (--device cuda): this rank's steps, evaluation and optimizer on one GPU,
// behind the TrainBackend interface that run_training drives. Only compiled in GPU builds.
#pragma once

#include <memory>

#include "dpt/train.h"

namespace dpt {

class Communicator;
class DataParallel;
struct ImageSet;

// Binds this rank to GPU (local_rank mod visible devices), joins an NCCL communicator over `comm`
// when every rank has a GPU of its own (else averages gradients by MPI through host memory, with one
// log line), uploads both data sets and the model's state. Collective: every rank calls it. cfg is
// the run's validated configuration; everything passed must outlive the backend.
std::unique_ptr<TrainBackend> make_gpu_backend(const TrainConfig& cfg, Communicator& comm, int local_rank,
                                               Model& model, DataParallel& ddp, Sgd& opt, const ImageSet& train,
                                               const ImageSet& test);

}  // namespace dpt
