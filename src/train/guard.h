// The non-finite guard: what follows a training step whose all-reduced gradients were not finite.
// Private to the driver.
#pragma once

#include <cstdint>

namespace dpt {

class Communicator;
class StepEngine;
struct TrainConfig;

// What follows a step whose all-reduced gradients were not finite (the backend did not apply it):
// --nonfinite stop ends the run naming the step and the first tensor; skip goes on, up to
// --nonfinite-max-skips such steps. Every rank sees the same sums (they are of the all-reduced
// gradients), so every rank decides alike without a collective.
class NonFiniteGuard {
 public:
  NonFiniteGuard(const TrainConfig& cfg, Communicator& comm, StepEngine& engine)
      : cfg_(cfg), comm_(comm), engine_(engine) {}
  // Step `step` (global) of epoch `epoch` (0-based) had the sum of squares `sumsq`: returns when
  // it was finite or may be skipped, throws AgreedInputError when training must stop.
  void check(double sumsq, int64_t step, int epoch);
  int64_t skipped() const { return skipped_; }

 private:
  const TrainConfig& cfg_;
  Communicator& comm_;
  StepEngine& engine_;
  int64_t skipped_ = 0;
};

}  // namespace dpt
