// --clip-grad-norm's coefficient, torch.nn.utils.clip_grad_norm_'s, in one place for the CPU's
// optimizer (src/cpu/cpu_backend.cc) and the CUDA kernels (kernels/optimizer.cu compiles this
// header with nvcc).
#pragma once

#include <cmath>

#include "dpt/host_device.h"

namespace dpt {

// torch computes, for fp32 gradients, total_norm = the norm of the per-tensor norms (each in fp32),
// then clip_coef = max_norm / (total_norm + 1e-6), which Tensor.__rtruediv__ evaluates as
// reciprocal(total_norm + 1e-6) * max_norm, every operation in fp32; clamps it to at most 1 and
// always multiplies the gradients by it. dptrain's norm is the square root of one sum of squares
// over the whole flat gradient accumulated in double (sum_squares), the same value as torch's up to
// its fp32 rounding, rounded to float here; from there the arithmetic is torch's, operation by
// operation. So a norm just under max_norm (max_norm / (norm + 1e-6) < 1) is scaled, as in torch
// (it was left alone: dptrain scaled only above max_norm), and an unclipped step multiplies by
// exactly 1, which the optimizers skip: its bits are those of no clipping. grad_sumsq is finite
// (the optimizers' non-finite guard comes first); max_norm <= 0 is clipping off.
DPT_HOST_DEVICE inline float clip_coefficient(double grad_sumsq, float max_norm) {
  if (!(max_norm > 0.f)) return 1.f;
  const float norm = static_cast<float>(sqrt(grad_sumsq));
  const float coef = (1.f / (norm + 1e-6f)) * max_norm;
  return coef < 1.f ? coef : 1.f;
}

}  // namespace dpt
