// Which images a rank takes: the shuffled, sharded order of training batches and the split of
// the test set for evaluation.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace dpt {

// Epoch e's order of the training set: one permutation from (seed, e), the same on every rank.
// Global batch s is positions [s*B, (s+1)*B); rank r takes its B/k slice. The last incomplete
// batch is dropped, so every rank takes the same number of steps.
class ShardedSampler {
 public:
  ShardedSampler(int64_t dataset_size, int64_t global_batch, int rank, int world, uint64_t seed);
  void set_epoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }
  int64_t steps_per_epoch() const { return dataset_size_ / global_batch_; }
  int64_t local_batch() const { return global_batch_ / world_; }
  // The indices of this rank's part of global batch `step` (local_batch() of them).
  const int64_t* local_indices(int64_t step) const;

 private:
  int64_t dataset_size_, global_batch_;
  int rank_, world_;
  uint64_t seed_;
  int64_t epoch_ = 0;
  std::vector<int64_t> perm_;
};

// Evaluation split: rank r scores test images [begin, end) so ranks cover each image exactly once.
std::pair<int64_t, int64_t> eval_range(int64_t n, int rank, int world);

}  // namespace dpt
