// The arithmetic peak of one core, measured: VDPBF16PS (the bf16 dot product oneDNN's
// avx512_core_bf16 kernels run on) and fp32 FMA on 512-bit registers, 12 independent accumulators
// each (enough to cover the latency), best of 7 runs. The yardstick docs/PERFORMANCE.md holds
// dptrain's and PyTorch's GFLOP/s against. Skips (exit 77) on a CPU without AVX512-BF16.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace {

constexpr int kAcc = 12;
constexpr long kIters = 50'000'000;

// The accumulators are results: stored where the compiler must assume they are read.
__attribute__((target("avx512f"))) void keep(const __m512 (&acc)[kAcc]) {
  alignas(64) float out[16];
  for (const auto& x : acc) {
    _mm512_store_ps(out, x);
    asm volatile("" : : "r"(out) : "memory");
  }
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

__attribute__((target("avx512f,avx512bf16"))) double bf16_gflops() {
  __m512 acc[kAcc];
  for (auto& a : acc) a = _mm512_setzero_ps();
  __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = a;
  const auto t0 = std::chrono::steady_clock::now();
  for (long it = 0; it < kIters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
    asm volatile("" : "+v"(a), "+v"(b));  // the operands stay in registers, the loop stays
  }
  const double s = seconds_since(t0);
  keep(acc);
  return 64.0 * kAcc * kIters / s / 1e9;  // 32 pairs, a multiply and an add each
}

__attribute__((target("avx512f,fma"))) double fp32_gflops() {
  __m512 acc[kAcc];
  for (auto& a : acc) a = _mm512_setzero_ps();
  __m512 a = _mm512_set1_ps(1e-9f), b = _mm512_set1_ps(1.f);
  const auto t0 = std::chrono::steady_clock::now();
  for (long it = 0; it < kIters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_fmadd_ps(a, b, acc[i]);
    asm volatile("" : "+v"(a), "+v"(b));
  }
  const double s = seconds_since(t0);
  keep(acc);
  return 32.0 * kAcc * kIters / s / 1e9;
}

}  // namespace

int main() {
  if (!__builtin_cpu_supports("avx512bf16")) {
    std::puts("skip: this CPU has no AVX512-BF16");
    return 77;
  }
  double bf16 = 0, fp32 = 0;
  for (int r = 0; r < 7; ++r) {
    bf16 = std::max(bf16, bf16_gflops());
    fp32 = std::max(fp32, fp32_gflops());
  }
  std::printf("one core: bf16 VDPBF16PS %.1f GFLOP/s, fp32 FMA %.1f GFLOP/s (zmm, best of 7)\n",
              bf16, fp32);
}
