// SGD over the flat buffers, the per-epoch sharded sampler, the evaluation split and the metrics
// record: the small pieces of training with exact, testable semantics.
#include <cmath>
#include <nlohmann/json.hpp>
#include <type_traits>

#include "cpu/ops.h"
#include "dpt/error.h"
#include "dpt/rng.h"
#include "dpt/train.h"

namespace dpt {

void Sgd::step(float* p, const float* g, double lr) {
  // PyTorch starts the momentum buffer at the first gradient.
  cpu::sgd_update(p, g, buf_.data(), n_, static_cast<float>(lr), static_cast<float>(momentum_),
                  static_cast<float>(weight_decay_), steps_ == 0);
  ++steps_;
}

ShardedSampler::ShardedSampler(int64_t dataset_size, int64_t global_batch, int rank, int world,
                               uint64_t seed)
    : dataset_size_(dataset_size), global_batch_(global_batch), rank_(rank), world_(world),
      seed_(seed) {
  DPT_INPUT_CHECK(global_batch % world == 0, "--batch-size " << global_batch
                                                             << " is not divisible by the world size "
                                                             << world);
  DPT_INPUT_CHECK(global_batch <= dataset_size, "--batch-size " << global_batch
                                                                << " exceeds the training set ("
                                                                << dataset_size << " images)");
  set_epoch(0);
}

void ShardedSampler::set_epoch(int64_t epoch) {
  perm_ = Rng::derive(seed_, static_cast<uint64_t>(epoch), 0x5a3b1e).permutation(dataset_size_);
}

const int64_t* ShardedSampler::local_indices(int64_t step) const {
  DPT_CHECK(step >= 0 && step < steps_per_epoch(), "step " << step << " out of range");
  return perm_.data() + step * global_batch_ + rank_ * local_batch();
}

std::pair<int64_t, int64_t> eval_range(int64_t n, int rank, int world) {
  // Balanced contiguous split: the first n % world ranks take one extra image.
  const int64_t base = n / world, extra = n % world;
  const int64_t begin = rank * base + std::min<int64_t>(rank, extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

EpochMetrics EpochMetrics::from_json(const std::string& json) {
  const auto j = nlohmann::json::parse(json);
  EpochMetrics m;
  auto num = [&](const char* key, auto& field) {
    using T = std::remove_reference_t<decltype(field)>;
    if (!j.contains(key)) return;
    field = j.at(key).is_null() ? static_cast<T>(std::nan("")) : j.at(key).get<T>();
  };
  num("epoch", m.epoch), num("train_loss", m.train_loss), num("train_acc", m.train_acc);
  num("test_loss", m.test_loss), num("test_acc", m.test_acc), num("test_count", m.test_count);
  num("train_count", m.train_count), num("steps", m.steps), num("epoch_seconds", m.epoch_seconds);
  num("images_per_second", m.images_per_second), num("lr", m.lr), num("comm_seconds", m.comm_seconds);
  num("exposed_comm_seconds", m.exposed_comm_seconds), num("grad_norm", m.grad_norm);
  num("grad_norm_max", m.grad_norm_max), num("nonfinite_steps", m.nonfinite_steps), num("world_size", m.world_size);
  num("slowest_rank", m.slowest_rank), num("slowest_compute_seconds", m.slowest_compute_seconds);
  num("median_compute_seconds", m.median_compute_seconds), num("compute_spread", m.compute_spread);
  auto list = [&](const char* key, std::vector<double>& field) {
    if (j.contains(key) && j.at(key).is_array()) field = j.at(key).get<std::vector<double>>();
  };
  list("rank_compute_seconds", m.rank_compute_seconds), list("rank_wait_seconds", m.rank_wait_seconds);
  return m;
}

std::string EpochMetrics::to_json() const {
  nlohmann::json j = {{"type", "epoch"},
                      {"epoch", epoch},
                      {"train_loss", train_loss},
                      {"train_acc", train_acc},
                      {"test_loss", test_loss},
                      {"test_acc", test_acc},
                      {"test_count", test_count},
                      {"train_count", train_count},
                      {"steps", steps},
                      {"lr", lr},
                      {"epoch_seconds", epoch_seconds},
                      {"images_per_second", images_per_second},
                      {"comm_seconds", comm_seconds},
                      {"exposed_comm_seconds", exposed_comm_seconds},
                      {"grad_norm", grad_norm},
                      {"grad_norm_max", grad_norm_max},
                      {"nonfinite_steps", nonfinite_steps},
                      {"world_size", world_size},
                      {"slowest_rank", slowest_rank},
                      {"slowest_compute_seconds", slowest_compute_seconds},
                      {"median_compute_seconds", median_compute_seconds},
                      {"compute_spread", compute_spread},
                      {"rank_compute_seconds", rank_compute_seconds},
                      {"rank_wait_seconds", rank_wait_seconds}};
  return j.dump();
}

}  // namespace dpt
