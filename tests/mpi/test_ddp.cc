// DataParallel under mpirun (-np 1, 2, 4), trained through the StepEngine as run_training trains:
// k ranks with B/k images each end where one replica with the whole batch B ends; bucket plans and
// overlap do not change the result; replica and divergence checks name the rank; --sync-bn equals
// single-replica BatchNorm; evaluation covers the test set once and an epoch's images per second
// are its images over its seconds; --data synthetic is the same on every rank and the shards
// partition it; gradient accumulation equals one big batch.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dpt/comm.h"
#include "dpt/config.h"
#include "dpt/dataset.h"
#include "dpt/ddp.h"
#include "dpt/engine.h"
#include "dpt/error.h"
#include "dpt/models.h"
#include "dpt/nn.h"
#include "dpt/optimizer.h"
#include "dpt/rng.h"
#include "dpt/run.h"
#include "dpt/sampler.h"
#include "test_util.h"

namespace dpt {
namespace {

std::unique_ptr<Communicator> world() { return test::world_comm(); }

// n random single-channel images of rows x cols with labels < 10: the same on every rank.
ImageSet random_images(int64_t n, int64_t rows, int64_t cols, uint64_t seed) {
  ImageSet set;
  set.n = n, set.rows = rows, set.cols = cols;
  Rng rng(seed);
  set.images.resize(static_cast<size_t>(n * rows * cols));
  for (uint8_t& v : set.images) v = static_cast<uint8_t>(rng.below(256));
  set.labels.resize(static_cast<size_t>(n));
  for (Label& l : set.labels) l = static_cast<Label>(rng.below(10));
  return set;
}

// `steps` optimizer steps of data-parallel training as run_training runs them: a StepEngine over
// `ddp` on epoch 0 of a set of steps x B random images (global batch B per optimizer step, in
// `accum` micro-batches; each rank takes its B/k slice of every micro-batch), SGD with momentum
// 0.9 at lr 0.02. The model's host parameters and buffers hold the result.
void train_steps(Model& m, Communicator& c, DataParallel& ddp, int64_t B, int steps, int accum,
                 double weight_decay, uint64_t seed) {
  const Shape& in = m.input_shape();  // {H, W, 1}
  const ImageSet data = random_images(steps * B, in[0], in[1], seed);
  TrainConfig cfg;
  cfg.batch_size = B / accum;
  cfg.accum_steps = accum;
  cfg.momentum = 0.9;
  cfg.weight_decay = weight_decay;
  cfg.seed = seed;
  Optimizer opt(m.num_parameters(), cfg);
  StepEngine engine(cfg, c, m, ddp, opt, data, data);
  ShardedSampler sampler(data.n, cfg.batch_size, c.rank(), c.size(), cfg.seed);
  engine.begin_epoch(sampler, sampler.steps_per_epoch());
  for (int s = 0; s < steps; ++s) engine.step(static_cast<int64_t>(s) * accum, s, 0.02, nullptr);
  engine.to_host();
}

std::vector<float> params_of(Model& m) {
  return std::vector<float>(m.store().params(), m.store().params() + m.store().num_params());
}

// max |a - b| / max |b|: relative to the parameters' scale, so near-zero entries (biases) do not
// turn float summation-order noise into large ratios.
double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return diff / scale;
}

// The single-replica reference: the whole batch B on this process alone.
std::vector<float> reference_params(const std::string& model, int64_t B, int steps, uint64_t seed) {
  auto self = make_mpi_self_communicator();
  auto m = make_model(model);
  m->init_parameters("kaiming", 11);
  DataParallel ddp(*m, *self, DdpOptions{});
  train_steps(*m, *self, ddp, B, steps, 1, 1e-4, seed);
  return params_of(*m);
}

TEST(DataParallel, LenetMatchesSingleReplicaForEveryBucketPlan) {
  auto c = world();
  const int64_t B = 48;
  const auto ref = reference_params("lenet", B, 4, 100);
  std::vector<std::vector<float>> results;
  for (double mb : {1e-7, 25.0, 1e4}) {  // one parameter per bucket, the default, one bucket
    for (bool overlap : {true, false}) {
      auto m = make_model("lenet");
      // Rank-dependent initialisation: the broadcast from rank 0 must make the replicas equal.
      m->init_parameters("kaiming", 11 + static_cast<uint64_t>(c->rank()) * 1000);
      DdpOptions o;
      o.bucket_mb = mb;
      o.first_bucket_mb = mb;
      o.overlap = overlap;
      if (mb == 25.0) o.last_bucket_mb = 1.0;  // the opt-in small last bucket
      DataParallel ddp(*m, *c, o);
      if (mb == 1e-7) {
        EXPECT_EQ(ddp.reducer().buckets().size(), 8u);
      }
      if (mb == 25.0) {  // LeNet's 516 KB: fc layers, then conv1 + conv2 (101 KB <= a quarter)
        ASSERT_EQ(ddp.reducer().buckets().size(), 2u);
        EXPECT_EQ(ddp.reducer().buckets()[1].begin,
                  std::min(m->store().find("conv2.weight")->offset,
                           m->store().find("conv2.bias")->offset));
        EXPECT_EQ(ddp.reducer().buckets()[1].end, m->num_parameters());
      }
      if (mb == 1e4) {
        EXPECT_EQ(ddp.reducer().buckets().size(), 1u);
      }
      train_steps(*m, *c, ddp, B, 4, 1, 1e-4, 100);
      ddp.verify_replicas(4);
      results.push_back(params_of(*m));
      EXPECT_LT(max_rel_diff(results.back(), ref), 1e-4)
          << "bucket_mb " << mb << " overlap " << overlap;
    }
  }
  // The bucket plan changes which floats travel together, not what is summed. With 2 ranks each
  // sum has two terms, so results are bit-identical; with more, MPI picks the reduction order by
  // message size, so only float rounding may differ (exact sums: Collectives.ReducerPlans...).
  for (size_t i = 1; i < results.size(); ++i) {
    if (c->size() <= 2) {
      EXPECT_EQ(results[i], results[0]) << i;
    } else {
      EXPECT_LT(max_rel_diff(results[i], results[0]), 1e-6) << i;
    }
  }
}

TEST(DataParallel, GradientAccumulationEqualsOneBigBatch) {
  auto c = world();
  const auto ref = reference_params("lenet", 48, 4, 100);
  auto m = make_model("lenet");
  m->init_parameters("kaiming", 11);
  DataParallel ddp(*m, *c, DdpOptions{});
  train_steps(*m, *c, ddp, 48, 4, /*accum=*/2, 1e-4, 100);
  EXPECT_LT(max_rel_diff(params_of(*m), ref), 1e-4);
}

TEST(DataParallel, MismatchedReplicasNameTheRankAndTensor) {
  auto c = world();
  if (c->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  auto m = make_model("lenet", c->rank() == 1 ? 11 : 10);
  try {
    DataParallel ddp(*m, *c, DdpOptions{});
    FAIL() << "replicas with different fc2 shapes were accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("fc2.weight"), std::string::npos) << msg;
  }
}

TEST(DataParallel, DivergedReplicasAreDetected) {
  auto c = world();
  if (c->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  auto m = make_model("lenet");
  m->init_parameters("kaiming", 1);
  DataParallel ddp(*m, *c, DdpOptions{});
  ddp.verify_replicas(0);  // equal after the broadcast
  if (c->rank() == c->size() - 1) m->store().params()[17] += 1e-3f;
  try {
    ddp.verify_replicas(5);
    FAIL() << "divergence not detected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank(s) " + std::to_string(c->size() - 1)),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("step 5"), std::string::npos) << e.what();
  }
}

// conv -> BN -> ReLU -> global pool -> linear on 6x6 inputs: small enough to compare exactly.
std::unique_ptr<Model> small_bn_model() {
  auto net = std::make_unique<Sequential>();
  net->add("conv", make_conv2d(4, 3, 1, 1))
      .add("bn", make_batchnorm2d())
      .add("", make_relu())
      .add("", make_global_avgpool())
      .add("fc", make_linear(10));
  auto m = std::make_unique<Model>("small_bn", std::move(net), Shape{6, 6, 1}, 10);
  m->init_parameters("kaiming", 5);
  return m;
}

TEST(DataParallel, SyncBatchNormMatchesSingleReplicaBatchNorm) {
  auto c = world();
  const int64_t B = 16;
  auto self = make_mpi_self_communicator();
  auto ref = small_bn_model();
  std::vector<float> ref_params, ref_stats;
  {
    DataParallel d(*ref, *self, DdpOptions{});
    train_steps(*ref, *self, d, B, 3, 1, 0, 700);
    ref_params = params_of(*ref);
    ref_stats.assign(ref->store().buffers(), ref->store().buffers() + ref->store().num_buffers());
  }
  for (bool sync : {true, false}) {
    auto m = small_bn_model();
    DdpOptions o;
    o.sync_bn = sync;
    DataParallel d(*m, *c, o);
    train_steps(*m, *c, d, B, 3, 1, 0, 700);
    const double diff = max_rel_diff(params_of(*m), ref_params);
    if (sync || c->size() == 1) {
      EXPECT_LT(diff, 1e-4) << "sync " << sync;
      d.sync_buffers();
      std::vector<float> stats(m->store().buffers(),
                               m->store().buffers() + m->store().num_buffers());
      // Running means of synchronised BN are the global means: equal on every rank and to the
      // reference.
      EXPECT_LT(max_rel_diff(stats, ref_stats), 1e-4);
    } else {
      // Per-replica statistics differ from whole-batch ones: the comparison above can fail.
      EXPECT_GT(diff, 1e-4);
    }
  }
}

// sync_buffers averages the running means and variances across ranks and leaves the counters
// (num_batches_tracked), equal on every rank, exact. Two BatchNorms, so a counter lies between
// statistics in registration order. Each rank's statistics are i + 1 + 2 x rank (element i), whose
// average over k ranks, i + k, is exact in float; every counter's float holds 2^23 + 1 on top of
// an int64 base. The 3-rank run (mpi_ddp_np3_counters) is the one where a float average of the
// counters is not exact: 3 x 8388609 rounds to 25165828 in float, a third of which is 8388610 (at
// 2 and 4 ranks the sums are exact).
TEST(DataParallel, SyncBuffersAveragesStatisticsAndKeepsCountersExact) {
  auto c = world();
  const int k = c->size();
  auto net = std::make_unique<Sequential>();
  net->add("conv1", make_conv2d(4, 3, 1, 1))
      .add("bn1", make_batchnorm2d())
      .add("", make_relu())
      .add("conv2", make_conv2d(3, 3, 1, 1))
      .add("bn2", make_batchnorm2d())
      .add("", make_global_avgpool())
      .add("fc", make_linear(10));
  Model m("two_bn", std::move(net), Shape{6, 6, 1}, 10);
  m.init_parameters("kaiming", 5);
  DataParallel d(m, *c, DdpOptions{});
  constexpr float kCount = 8388609.f;  // 2^23 + 1
  constexpr int64_t kBase = int64_t{1} << 40;
  int counters = 0, statistics = 0;
  for (Param& p : m.store().entries()) {
    if (!p.is_buffer) continue;
    float* v = p.value.data();
    if (p.is_counter) {
      p.counter_base = kBase;
      v[0] = kCount;
      ++counters;
    } else {
      for (int64_t i = 0; i < p.numel(); ++i) v[i] = static_cast<float>(i + 1 + 2 * c->rank());
      ++statistics;
    }
  }
  ASSERT_EQ(counters, 2);
  ASSERT_EQ(statistics, 4);
  d.sync_buffers();
  for (const Param& p : m.store().entries()) {
    if (!p.is_buffer) continue;
    const float* v = p.value.data();
    if (p.is_counter) {
      EXPECT_EQ(v[0], kCount) << p.name << " at " << k << " ranks";
      const std::vector<int64_t> all = c->allgather(counter_value(p));
      for (int r = 0; r < k; ++r) EXPECT_EQ(all[static_cast<size_t>(r)], kBase + 8388609) << p.name;
    } else {
      for (int64_t i = 0; i < p.numel(); ++i)
        EXPECT_EQ(v[i], static_cast<float>(i + k))
            << p.name << "[" << i << "] at " << k << " ranks";
    }
  }
}

// --data synthetic draws the same sets on every rank from the seed (nothing is sent between
// ranks), so the sampler's shards address the same images everywhere: over an epoch each rank takes
// exactly steps x B/k training images, none twice and none another rank takes, and the labels the
// ranks see together are those one rank sees taking the whole batches.
TEST(DataParallel, SyntheticSetsAreTheSameOnEveryRankAndTheShardsPartitionThem) {
  auto c = world();
  const int k = c->size();
  const DataSets d = load_data("synthetic:6x5x3:1000:13", "auto", 42);
  const uint64_t mine[4] = {checksum(d.train.images.data(), d.train.images.size()),
                            checksum(d.train.labels.data(), d.train.labels.size() * sizeof(Label)),
                            checksum(d.test.images.data(), d.test.images.size()),
                            checksum(d.test.labels.data(), d.test.labels.size() * sizeof(Label))};
  std::vector<uint64_t> all(4 * static_cast<size_t>(k));
  c->allgather(mine, all.data(), 4);
  for (int r = 0; r < k; ++r)
    for (int i = 0; i < 4; ++i) EXPECT_EQ(all[4 * r + i], mine[i]) << "rank " << r << " part " << i;

  const int64_t B = 48, steps = 1000 / B;  // 20 steps, the last 40 images dropped
  for (const int64_t epoch : {0, 3}) {
    ShardedSampler mine_s(d.train.n, B, c->rank(), k, 42), whole(d.train.n, B, 0, 1, 42);
    mine_s.set_epoch(epoch), whole.set_epoch(epoch);
    ASSERT_EQ(mine_s.steps_per_epoch(), steps);
    ASSERT_EQ(mine_s.local_batch(), B / k);
    std::vector<int64_t> taken;
    for (int64_t s = 0; s < steps; ++s)
      taken.insert(taken.end(), mine_s.local_indices(s), mine_s.local_indices(s) + B / k);
    ASSERT_EQ(static_cast<int64_t>(taken.size()), steps * B / k);
    std::vector<int64_t> every(taken.size() * static_cast<size_t>(k));
    c->allgather(taken.data(), every.data(), static_cast<int64_t>(taken.size()));
    std::vector<int64_t> seen(static_cast<size_t>(d.train.n));
    std::vector<int64_t> labels(13), reference(13);
    for (int64_t i : every) {
      ASSERT_TRUE(i >= 0 && i < d.train.n) << i;
      ++seen[static_cast<size_t>(i)];
      ++labels[d.train.labels[static_cast<size_t>(i)]];
    }
    int64_t once = 0;
    for (int64_t n : seen) {
      EXPECT_LE(n, 1);
      once += n == 1;
    }
    EXPECT_EQ(once, steps * B) << "epoch " << epoch;
    for (int64_t s = 0; s < steps; ++s)
      for (int64_t j = 0; j < B; ++j) ++reference[d.train.labels[whole.local_indices(s)[j]]];
    EXPECT_EQ(labels, reference) << "epoch " << epoch;
  }
}

// Through run_training: k ranks on --data synthetic train as one rank with the whole batch does
// (each rank draws the sets itself, from --seed alone), to float summation order.
TEST(DataParallel, SyntheticDataTrainsAsOneRankDoes) {
  auto c = world();
  TrainConfig cfg = test::small_config("lenet", "synthetic:28x28x1:256:10", 1, 32);
  cfg.max_steps = 3;
  const auto hist = run_training(cfg, *c);
  ASSERT_EQ(hist.size(), 1u);
  EXPECT_EQ(hist[0].train_count, 3 * 32);
  EXPECT_EQ(hist[0].test_count, 26);  // ceil(256 / 10)
  double one[2] = {0, 0};
  if (c->rank() == 0) {
    auto self = make_mpi_self_communicator();
    const auto ref = run_training(cfg, *self);
    one[0] = ref.at(0).train_loss, one[1] = ref.at(0).test_loss;
  }
  c->broadcast(one, 2);
  EXPECT_NEAR(hist[0].train_loss, one[0], 1e-5 * one[0]);
  EXPECT_NEAR(hist[0].test_loss, one[1], 1e-5 * one[1]);
}

TEST(DataParallel, EvaluationCountsEveryTestImageOnce) {
  auto c = world();
  const std::string dir = test::shared_synthetic_dir(*c, "eval", 600, 997, 9);  // 997: odd
  TrainConfig cfg = test::small_config("lenet", dir, 2, 60);
  cfg.eval_batch_size = 128;
  cfg.metrics = dir + "/metrics.jsonl";
  cfg.save = dir + "/model.st";
  const auto start = std::chrono::steady_clock::now();
  auto hist = run_training(cfg, *c);
  const double run_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(hist.size(), 2u);
  EXPECT_EQ(hist[1].test_count, 997);
  EXPECT_EQ(hist[1].train_count, 600 / 60 * 60);
  EXPECT_EQ(hist[1].world_size, c->size());
  EXPECT_GT(hist[1].test_acc, 0.9);
  // A fresh epoch's images per second are its images on every rank (600 here: 10 steps of 60)
  // over its seconds, and those seconds are within the run's own (an epoch cannot outlast it).
  double epochs_seconds = 0;
  for (const EpochMetrics& e : hist) {
    EXPECT_EQ(e.train_count, 600) << "epoch " << e.epoch;
    EXPECT_GT(e.epoch_seconds, 0) << "epoch " << e.epoch;
    EXPECT_DOUBLE_EQ(e.images_per_second, 600 / e.epoch_seconds) << "epoch " << e.epoch;
    epochs_seconds += e.epoch_seconds;
  }
  EXPECT_LE(epochs_seconds, run_seconds);
  // Every rank returns the same, reduced metrics.
  auto acc = c->allgather(hist[1].test_acc);
  for (double a : acc) EXPECT_EQ(a, acc[0]);
  // The reduced loss and hits are those of the whole test set: `dptrain evaluate`'s own scoring
  // (per-image log-sum-exp in double, infer.cc) of the saved model at one rank, the same images.
  if (c->rank() == 0) {
    auto self = make_mpi_self_communicator();
    TrainConfig ev = cfg;
    ev.command = "evaluate";
    ev.load = cfg.save;
    ev.save.clear();
    ev.metrics = dir + "/evaluate.json";
    run_evaluate(ev, *self);
    std::ifstream f(ev.metrics);
    const nlohmann::json j = nlohmann::json::parse(f);
    EXPECT_EQ(j.at("count").get<int64_t>(), 997);
    EXPECT_NEAR(hist[1].test_loss, j.at("loss").get<double>(), 1e-5 * j.at("loss").get<double>());
    EXPECT_EQ(std::lround(hist[1].test_acc * 997), j.at("top1_correct").get<int64_t>());
  }
  c->barrier("test barrier");
  if (c->rank() == 0) {
    std::ifstream f(cfg.metrics);
    std::string line;
    int lines = 0;
    while (std::getline(f, line)) {
      ++lines;
      // The --metrics record says what the returned history says, to the bit.
      const nlohmann::json j = nlohmann::json::parse(line);
      const int64_t count = j.at("train_count").get<int64_t>();
      EXPECT_EQ(count, 600) << line;
      EXPECT_DOUBLE_EQ(j.at("images_per_second").get<double>(),
                       static_cast<double>(count) / j.at("epoch_seconds").get<double>())
          << line;
    }
    EXPECT_EQ(lines, 2);
    std::filesystem::remove_all(dir);
  }
}

}  // namespace
}  // namespace dpt
