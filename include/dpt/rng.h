// Rng: a small, fully specified random generator (splitmix64 + Box-Muller), so that a seed gives
// the same initial weights and the same data order on every rank, compiler and machine.
#pragma once

#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

namespace dpt {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  // Derives an independent stream from (seed, a, b), e.g. (seed, epoch) for the sampler.
  static Rng derive(uint64_t seed, uint64_t a, uint64_t b = 0) {
    Rng r(seed ^ 0x9e3779b97f4a7c15ULL);
    uint64_t s = r.next() ^ (a * 0xbf58476d1ce4e5b9ULL);
    Rng r2(s);
    return Rng(r2.next() ^ (b * 0x94d049bb133111ebULL));
  }
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  // Uniform integer in [0, n) without modulo bias worth caring about at our sizes (n < 2^32).
  uint64_t below(uint64_t n) { return static_cast<uint64_t>(uniform() * static_cast<double>(n)); }
  double normal() {
    if (have_spare_) {
      have_spare_ = false;
      return spare_;
    }
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = r * std::sin(2.0 * M_PI * u2);
    have_spare_ = true;
    return r * std::cos(2.0 * M_PI * u2);
  }
  // Fisher-Yates permutation of [0, n).
  std::vector<int64_t> permutation(int64_t n) {
    std::vector<int64_t> p(static_cast<size_t>(n));
    std::iota(p.begin(), p.end(), 0);
    for (int64_t i = n - 1; i > 0; --i) std::swap(p[i], p[below(static_cast<uint64_t>(i + 1))]);
    return p;
  }

 private:
  uint64_t state_;
  bool have_spare_ = false;
  double spare_ = 0;
};

}  // namespace dpt
