// DataParallel under mpirun (-np 1, 2, 4): k ranks with B/k images each end where one replica
// with the whole batch B ends; bucket plans and overlap do not change the result; replica and
// divergence checks name the rank; --sync-bn equals single-replica BatchNorm; evaluation covers
// the test set once; gradient accumulation equals one big batch.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "cpu/ops.h"
#include "dpt/checkpoint.h"
#include "dpt/comm.h"
#include "dpt/ddp.h"
#include "dpt/error.h"
#include "dpt/models.h"
#include "dpt/rng.h"
#include "dpt/safetensors.h"
#include "dpt/train.h"
#include "test_util.h"

namespace dpt {
namespace {

std::unique_ptr<Communicator> world() { return test::world_comm(); }

// A deterministic global batch of B images/labels (the same on every rank).
struct Batch {
  Tensor x;
  std::vector<int32_t> y;
};
Batch global_batch(int64_t B, const Shape& per_sample, uint64_t seed) {
  Batch b;
  Shape s{B};
  s.insert(s.end(), per_sample.begin(), per_sample.end());
  b.x.resize(s);
  Rng rng(seed);
  for (int64_t i = 0; i < b.x.numel(); ++i) b.x.data()[i] = static_cast<float>(rng.uniform());
  for (int64_t i = 0; i < B; ++i) b.y.push_back(static_cast<int32_t>(rng.below(10)));
  return b;
}

// Slice rows [begin, begin+n) of a batch.
Batch slice(const Batch& g, int64_t begin, int64_t n) {
  Batch b;
  Shape s = g.x.shape();
  const int64_t per = g.x.numel() / s[0];
  s[0] = n;
  b.x.resize(s);
  std::copy(g.x.data() + begin * per, g.x.data() + (begin + n) * per, b.x.data());
  b.y.assign(g.y.begin() + begin, g.y.begin() + begin + n);
  return b;
}

// One optimizer step of DataParallel training on this rank's part of the global batch.
void train_steps(DataParallel& ddp, Sgd& opt, int64_t B, int steps, int accum, uint64_t seed) {
  Communicator& c = ddp.comm();
  const int64_t local = B / c.size() / accum;
  for (int s = 0; s < steps; ++s) {
    Batch g = global_batch(B, ddp.module().input_shape(), seed + static_cast<uint64_t>(s));
    for (int m = 0; m < accum; ++m) {
      Batch b = slice(g, (m * c.size() + c.rank()) * local, local);
      const Tensor& logits = ddp.forward(b.x, Mode::kTrain);
      Tensor dl(logits.shape());
      cpu::softmax_xent(logits.data(), b.y.data(), local, logits.dim(1),
                        1.f / static_cast<float>(B), dl.data(), nullptr);
      ddp.backward(dl, s, /*sync=*/m + 1 == accum, /*accumulate=*/m > 0);
    }
    ddp.finish_gradient_sync();
    opt.step(ddp.module().store().params(), ddp.module().store().grads(), 0.02);
  }
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
  DdpOptions o;
  DataParallel ddp(*m, *self, o);
  Sgd opt(m->num_parameters(), 0.9, 1e-4);
  train_steps(ddp, opt, B, steps, 1, seed);
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
      Sgd opt(m->num_parameters(), 0.9, 1e-4);
      train_steps(ddp, opt, B, 4, 1, 100);
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
  DdpOptions o;
  DataParallel ddp(*m, *c, o);
  Sgd opt(m->num_parameters(), 0.9, 1e-4);
  train_steps(ddp, opt, 48, 4, /*accum=*/2, 100);
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
    Sgd opt(ref->num_parameters(), 0.9, 0);
    train_steps(d, opt, B, 3, 1, 700);
    ref_params = params_of(*ref);
    ref_stats.assign(ref->store().buffers(), ref->store().buffers() + ref->store().num_buffers());
  }
  for (bool sync : {true, false}) {
    auto m = small_bn_model();
    DdpOptions o;
    o.sync_bn = sync;
    DataParallel d(*m, *c, o);
    Sgd opt(m->num_parameters(), 0.9, 0);
    train_steps(d, opt, B, 3, 1, 700);
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

TEST(DataParallel, EvaluationCountsEveryTestImageOnce) {
  auto c = world();
  const std::string dir = test::shared_synthetic_dir(*c, "eval", 600, 997, 9);  // 997: odd
  TrainConfig cfg = test::small_config("lenet", dir, 2, 60);
  cfg.eval_batch_size = 128;
  cfg.metrics = dir + "/metrics.jsonl";
  auto hist = run_training(cfg, *c);
  ASSERT_EQ(hist.size(), 2u);
  EXPECT_EQ(hist[1].test_count, 997);
  EXPECT_EQ(hist[1].train_count, 600 / 60 * 60);
  EXPECT_EQ(hist[1].world_size, c->size());
  EXPECT_GT(hist[1].test_acc, 0.9);
  // Every rank returns the same, reduced metrics.
  auto acc = c->allgather(hist[1].test_acc);
  for (double a : acc) EXPECT_EQ(a, acc[0]);
  c->barrier();
  if (c->rank() == 0) {
    std::ifstream f(cfg.metrics);
    std::string line;
    int lines = 0;
    while (std::getline(f, line)) ++lines;
    EXPECT_EQ(lines, 2);
    std::filesystem::remove_all(dir);
  }
}

}  // namespace
}  // namespace dpt
