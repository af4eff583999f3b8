// The sampler (include/dpt/sampler.h): epoch e's permutation from (seed, e), each rank's slice of
// every global batch, and the balanced split of the test set.
#include "dpt/sampler.h"

#include <algorithm>

#include "dpt/error.h"
#include "dpt/rng.h"

namespace dpt {

ShardedSampler::ShardedSampler(int64_t dataset_size, int64_t global_batch, int rank, int world,
                               uint64_t seed)
    : dataset_size_(dataset_size),
      global_batch_(global_batch),
      rank_(rank),
      world_(world),
      seed_(seed) {
  DPT_INPUT_CHECK(
      global_batch % world == 0,
      "--batch-size " << global_batch << " is not divisible by the world size " << world);
  DPT_INPUT_CHECK(global_batch <= dataset_size, "--batch-size " << global_batch
                                                                << " exceeds the training set ("
                                                                << dataset_size << " images)");
  set_epoch(0);
}

void ShardedSampler::set_epoch(int64_t epoch) {
  epoch_ = epoch;
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

}  // namespace dpt
