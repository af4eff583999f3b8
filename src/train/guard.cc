// The non-finite guard (src/train/guard.h): --nonfinite stop|skip and --nonfinite-max-skips.
#include "train/guard.h"

#include <cmath>
#include <sstream>
#include <string>

#include "dpt/comm.h"
#include "dpt/engine.h"
#include "dpt/error.h"
#include "dpt/log.h"

namespace dpt {

void NonFiniteGuard::check(double sumsq, int64_t step, int epoch) {
  if (std::isfinite(sumsq)) return;
  ++skipped_;
  if (cfg_.nonfinite == "skip" && skipped_ <= cfg_.nonfinite_max_skips) {
    if (comm_.rank() == 0)
      log_warn(DPT_MSG("step " << step + 1 << " (epoch " << epoch + 1
                               << "): the gradients are not finite; the step "
                               << "was skipped (" << skipped_ << " of at most "
                               << cfg_.nonfinite_max_skips << ")"));
    return;
  }
  const std::string tensor = engine_.first_nonfinite_gradient();
  std::ostringstream os;
  os << "step " << step + 1 << " (epoch " << epoch + 1 << "): the gradients are not finite"
     << (tensor.empty() ? "" : " (first: " + tensor + ")")
     << "; the step was not applied and training stops";
  if (cfg_.nonfinite == "skip")
    os << " after " << skipped_ - 1 << " skipped steps (--nonfinite-max-skips)";
  os << ". Nothing non-finite was saved"
     << (cfg_.checkpoints() ? "; the last checkpoint is kept" : "")
     << ". A smaller --lr, a longer --warmup-epochs or --clip-grad-norm may help";
  throw AgreedInputError(os.str(), comm_.rank() != 0);
}

}  // namespace dpt
