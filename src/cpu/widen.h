// The CPU's 16-bit activation overloads (backend.h) are that header's rule taken literally: each
// bfloat16 input widened into float scratch, the float operation, each output rounded to nearest
// even when the Widened goes out of scope. One definition, so the CPU is the reference the GPU's
// one-pass kernels are checked against.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "dpt/half.h"

namespace dpt::cpu {

class Widened {
 public:
  Widened() = default;
  Widened(const Widened&) = delete;
  Widened& operator=(const Widened&) = delete;
  // Rounds every out() buffer into its destination (also when the operation threw: the caller's
  // outputs are then unspecified either way).
  ~Widened() {
    for (const Out& o : outs_)
      for (int64_t i = 0; i < o.n; ++i) o.dst[i].bits = bf16_from_float(o.buf[i]);
  }
  // A float copy of x[0, n) (exact), or null for null.
  const float* in(const BFloat16* x, int64_t n) {
    if (!x) return nullptr;
    std::vector<float>& b = bufs_.emplace_back(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) b[static_cast<size_t>(i)] = float_from_bf16(x[i].bits);
    return b.data();
  }
  // Float storage for an output of n values that lands in y at scope end, or null for null.
  float* out(BFloat16* y, int64_t n) {
    if (!y) return nullptr;
    std::vector<float>& b = bufs_.emplace_back(static_cast<size_t>(n));
    outs_.push_back({b.data(), y, n});
    return b.data();
  }

 private:
  struct Out {
    const float* buf;
    BFloat16* dst;
    int64_t n;
  };
  std::deque<std::vector<float>> bufs_;  // deque: earlier buffers stay where they are
  std::vector<Out> outs_;
};

}  // namespace dpt::cpu
