// What the driver's components work on, built the way run_training builds it, for tests that
// exercise one component without a training run: a CPU LeNet wrapped by DataParallel, its Optimizer
// and a StepEngine over the data in cfg.data. One rank (an MPI singleton).
#pragma once

#include <memory>
#include <utility>

#include "dpt/comm.h"
#include "dpt/config.h"
#include "dpt/dataset.h"
#include "dpt/ddp.h"
#include "dpt/engine.h"
#include "dpt/models.h"
#include "dpt/nn.h"
#include "dpt/optimizer.h"
#include "test_util.h"

namespace dpt::test {

struct EngineRig {
  std::unique_ptr<Communicator> comm = world_comm();
  TrainConfig cfg;
  ImageSet train, test;
  std::unique_ptr<Model> model;
  std::unique_ptr<DataParallel> ddp;
  std::unique_ptr<Optimizer> opt;
  std::unique_ptr<StepEngine> engine;

  explicit EngineRig(const TrainConfig& c) : cfg(c) {
    DataSets data = load_data(cfg.data, "idx");
    train = std::move(data.train);
    test = std::move(data.test);
    model = make_model(cfg.model, 10, cpu_backend());
    model->init_parameters(cfg.init, cfg.seed);
    ddp = std::make_unique<DataParallel>(*model, *comm, DdpOptions{});
    opt = std::make_unique<Optimizer>(model->num_parameters(), cfg);
    engine = std::make_unique<StepEngine>(cfg, *comm, *model, *ddp, *opt, train, test);
  }
};

}  // namespace dpt::test
