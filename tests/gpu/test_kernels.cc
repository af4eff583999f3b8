// Every CUDA kernel of kernels/ against the CPU backend (src/cpu/ops.h) on fresh random inputs:
// relative error under 1e-5 in fp32; the bf16 conversions bit for bit, and the bf16 / fp16 casts of
// compressed gradients (--grad-dtype) bit for bit against the host's (dpt/half.h). Skipped where no
// CUDA device is visible (CI).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "activation.cuh"
#include "cpu/ops.h"
#include "cuda/cuda_check.h"
#include "data.cuh"
#include "dpt/comm.h"
#include "dpt/device.h"
#include "dpt/half.h"
#include "dpt/rng.h"
#include "gpu_test_util.h"
#include "loss.cuh"
#include "optimizer.cuh"
#include "pooling.cuh"
#include "precision.cuh"

namespace dpt {
namespace {

using test::Dev;
using test::expect_close;
using test::random;

TEST(Kernels, ReluForwardBackward) {
  SKIP_WITHOUT_GPU();
  const size_t n = 100003;
  auto x = random(n, 1), dy = random(n, 2);
  std::vector<float> y(n), dx(n);
  cpu::relu_forward(x.data(), y.data(), n);
  cpu::relu_backward(y.data(), dy.data(), dx.data(), n);
  Dev<float> dx_(x), dy_(dy), y_(n), g_(n);
  CUDA_CHECK(cuda::launch_relu_forward(dx_.p, y_.p, n, nullptr));
  CUDA_CHECK(cuda::launch_relu_backward(y_.p, dy_.p, g_.p, n, nullptr));
  expect_close(y_.host(), y);
  expect_close(g_.host(), dx);
}

TEST(Kernels, ResidualAddWithAndWithoutRelu) {
  SKIP_WITHOUT_GPU();
  const size_t n = 4097;
  auto a = random(n, 3), b = random(n, 4);
  std::vector<float> y(n), r(n);
  cpu::add(a.data(), b.data(), y.data(), n);
  cpu::relu_forward(y.data(), r.data(), n);
  Dev<float> a_(a), b_(b), y_(n), r_(n);
  CUDA_CHECK(cuda::launch_add(a_.p, b_.p, y_.p, n, false, nullptr));
  CUDA_CHECK(cuda::launch_add(a_.p, b_.p, r_.p, n, true, nullptr));
  expect_close(y_.host(), y);
  expect_close(r_.host(), r);
}

TEST(Kernels, AvgPoolForwardBackwardFloorMode) {
  SKIP_WITHOUT_GPU();
  // Non-overlapping (LeNet's 2/2 on even and odd sizes) and overlapping windows; plain and fused
  // with the ReLU before the pool (against the CPU's fused loops, which take a different path for
  // non-overlapping windows).
  for (bool relu : {false, true})
    for (auto [h, k, s] : {std::tuple{26, 2, 2}, std::tuple{9, 2, 2}, std::tuple{7, 3, 2}}) {
      const int64_t n = 3, c = 20, oh = (h - k) / s + 1;
      auto x = random(n * h * h * c, 5), dy = random(n * oh * oh * c, 6);
      std::vector<float> y(dy.size()), dx(x.size());
      if (relu) {
        cpu::relu_avgpool_forward(x.data(), y.data(), n, h, h, c, k, s);
        cpu::relu_avgpool_backward(x.data(), dy.data(), dx.data(), n, h, h, c, k, s);
      } else {
        cpu::avgpool_forward(x.data(), y.data(), n, h, h, c, k, s);
        cpu::avgpool_backward(dy.data(), dx.data(), n, h, h, c, k, s);
      }
      Dev<float> x_(x), dy_(dy), y_(y.size()), dx_(dx.size());
      CUDA_CHECK(cuda::launch_avgpool_forward(x_.p, y_.p, n, h, h, c, k, s, relu, nullptr));
      CUDA_CHECK(cuda::launch_avgpool_backward(dy_.p, relu ? x_.p : nullptr, dx_.p, n, h, h, c, k, s, nullptr));
      SCOPED_TRACE(testing::Message() << "h=" << h << " k=" << k << " s=" << s << " relu=" << relu);
      expect_close(y_.host(), y);
      expect_close(dx_.host(), dx);
    }
}

TEST(Kernels, FlattenPermutationBothWays) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 3, h = 4, w = 5, c = 50;  // LeNet's flatten is 4x4x50; w != h catches swaps
  auto x = random(n * h * w * c, 13);
  std::vector<float> chw(x.size()), back(x.size());
  cpu::nhwc_to_chw(x.data(), chw.data(), n, h, w, c);
  cpu::chw_to_nhwc(chw.data(), back.data(), n, h, w, c);
  Dev<float> x_(x), y_(x.size()), z_(x.size());
  CUDA_CHECK(cuda::launch_permute_nhwc_chw(x_.p, y_.p, n, h, w, c, true, nullptr));
  CUDA_CHECK(cuda::launch_permute_nhwc_chw(y_.p, z_.p, n, h, w, c, false, nullptr));
  EXPECT_EQ(y_.host(), chw);  // a permutation: exact
  EXPECT_EQ(z_.host(), x);
}

TEST(Kernels, LossSumsInDoubleOverwriteAndAccumulate) {
  SKIP_WITHOUT_GPU();
  for (int64_t n : {0, 1, 255, 256, 257, 1000}) {
    auto loss = random(static_cast<size_t>(n), 14, 0, 5);
    std::vector<int32_t> hits(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) hits[static_cast<size_t>(i)] = static_cast<int32_t>(i % 3 == 0);
    double want = 0, want_hits = 0;
    for (int64_t i = 0; i < n; ++i) want += loss[static_cast<size_t>(i)], want_hits += hits[static_cast<size_t>(i)];
    Dev<float> l_(loss);
    Dev<int32_t> h_(hits);
    Dev<double> out(std::vector<double>{7.0, 9.0});
    CUDA_CHECK(cuda::launch_loss_sums(l_.p, h_.p, n, out.p, false, nullptr));
    auto got = out.host();
    EXPECT_NEAR(got[0], want, 1e-12 * std::max(1.0, want)) << n;
    EXPECT_EQ(got[1], want_hits) << n;
    CUDA_CHECK(cuda::launch_loss_sums(l_.p, h_.p, n, out.p, true, nullptr));
    got = out.host();
    EXPECT_NEAR(got[0], 2 * want, 1e-12 * std::max(1.0, want)) << n;
    EXPECT_EQ(got[1], 2 * want_hits) << n;
  }
}

TEST(Kernels, GlobalAvgPool) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 5, hw = 49, c = 512;
  auto x = random(n * hw * c, 7), dy = random(n * c, 8);
  std::vector<float> y(n * c), dx(x.size());
  cpu::global_avgpool_forward(x.data(), y.data(), n, hw, c);
  cpu::global_avgpool_backward(dy.data(), dx.data(), n, hw, c);
  Dev<float> x_(x), dy_(dy), y_(y.size()), dx_(dx.size());
  CUDA_CHECK(cuda::launch_global_avgpool_forward(x_.p, y_.p, n, hw, c, nullptr));
  CUDA_CHECK(cuda::launch_global_avgpool_backward(dy_.p, dx_.p, n, hw, c, nullptr));
  expect_close(y_.host(), y);
  expect_close(dx_.host(), dx);
}

TEST(Kernels, GatherImagesScalesTo01) {
  SKIP_WITHOUT_GPU();
  const int64_t images = 50, pixels = 784;
  std::vector<uint8_t> data(images * pixels);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7);
  std::vector<uint8_t> labels(images);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<uint8_t>(i % 10);
  std::vector<int64_t> idx{49, 0, 17, 17, 3};
  Dev<uint8_t> d_(data), l_(labels);
  Dev<int64_t> i_(idx);
  Dev<float> out(idx.size() * pixels), plain(idx.size() * pixels);
  Dev<int32_t> got_labels(idx.size());
  CUDA_CHECK(cuda::launch_gather_images(d_.p, l_.p, i_.p, static_cast<int64_t>(idx.size()), pixels, out.p,
                                        got_labels.p, nullptr));
  CUDA_CHECK(cuda::launch_gather_images(d_.p, nullptr, i_.p, static_cast<int64_t>(idx.size()), pixels, plain.p,
                                        nullptr, nullptr));
  EXPECT_EQ(cuda::launch_gather_images(d_.p, l_.p, i_.p, 1, pixels, out.p, nullptr, nullptr), cudaErrorInvalidValue);
  auto got = out.host();
  // Exactly the CPU's images_to_float (x / 255.f, not x * (1/255.f), which differs for half the bytes).
  for (size_t r = 0; r < idx.size(); ++r)
    for (int64_t p = 0; p < pixels; ++p)
      ASSERT_EQ(got[r * pixels + p], static_cast<float>(data[idx[r] * pixels + p]) / 255.f);
  EXPECT_EQ(plain.host(), got);
  const auto gl = got_labels.host();
  for (size_t r = 0; r < idx.size(); ++r) EXPECT_EQ(gl[r], labels[idx[r]]) << r;
}

TEST(Kernels, SoftmaxCrossEntropyAndCorrectCount) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 257, k = 10;
  auto z = random(n * k, 9, -8, 8);
  std::vector<int32_t> y(n);
  Rng r(10);
  for (auto& v : y) v = static_cast<int32_t>(r.below(k));
  std::vector<float> dl(z.size());
  int64_t hits = 0;
  const double loss = cpu::softmax_xent(z.data(), y.data(), n, k, 1.f / n, dl.data(), &hits);
  Dev<float> z_(z), l_(n), d_(z.size());
  Dev<int32_t> y_(y), c_(n);
  CUDA_CHECK(cuda::launch_softmax_xent(z_.p, y_.p, n, k, 1.f / n, l_.p, c_.p, d_.p, nullptr));
  double gl = 0;
  for (float v : l_.host()) gl += v;
  int64_t gc = 0;
  for (int32_t v : c_.host()) gc += v;
  EXPECT_NEAR(gl, loss, 1e-5 * loss);
  EXPECT_EQ(gc, hits);
  expect_close(d_.host(), dl);
}

// bf16 is the top half of an fp32 bit pattern. Round to nearest, ties to even, from the bits:
// the reference the conversion kernels are checked against, bit for bit.
uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;  // NaN: the canonical bf16 NaN, as CUDA gives
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float bf16_value(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

TEST(Kernels, Bf16ConversionsRoundToNearestEvenAndWidenExactly) {
  SKIP_WITHOUT_GPU();
  auto x = random(100003, 31, -3, 3);
  // Ties (the low 16 bits exactly 0x8000, both parities), carries into the exponent, signed zeros,
  // infinities, the largest finite float and subnormals.
  for (uint32_t u : {0x3f808000u, 0x3f818000u, 0x3fff8000u, 0x7f7fffffu, 0x80000000u, 0x00000000u, 0x7f800000u,
                     0xff800000u, 0x00008001u, 0x807fffffu}) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    x.push_back(f);
  }
  const size_t n = x.size();
  std::vector<uint16_t> want(n);
  std::vector<float> wide(n), base = random(n, 32), acc(n);
  for (size_t i = 0; i < n; ++i) {
    want[i] = bf16_bits(x[i]);
    wide[i] = bf16_value(want[i]);
    acc[i] = base[i] + wide[i];
  }
  Dev<float> x_(x), w_(n), a_(base);
  Dev<uint16_t> b_(n);
  CUDA_CHECK(cuda::launch_to_bf16(x_.p, b_.p, static_cast<int64_t>(n), nullptr));
  CUDA_CHECK(cuda::launch_from_bf16(b_.p, w_.p, static_cast<int64_t>(n), false, nullptr));
  CUDA_CHECK(cuda::launch_from_bf16(b_.p, a_.p, static_cast<int64_t>(n), true, nullptr));
  EXPECT_EQ(b_.host(), want);
  const auto got = w_.host(), got_acc = a_.host();
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(std::memcmp(&got[i], &wide[i], sizeof(float)), 0) << "widened " << i;
    ASSERT_EQ(got_acc[i], acc[i]) << "accumulated " << i;
  }
}

// ---- The casts of compressed gradients (--grad-dtype) against the host's compress16/decompress16 --

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
bool is_nan16(uint16_t h, DType dt) {
  return dt == DType::kBF16 ? (h & 0x7fffu) > 0x7f80u : (h & 0x7fffu) > 0x7c00u;
}

// Every kind of input the casts treat specially, then 2^20 random bit patterns (every exponent,
// sign and payload) and 10^5 values of gradient-like size.
std::vector<float> wire_cast_inputs() {
  std::vector<float> x;
  for (uint32_t u : {
           // signed zeros, infinities, the largest finite float (bf16 overflow to infinity)
           0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7f7fffffu, 0xff7fffffu, 0x7f7f7fffu,
           // NaNs: quiet, signalling, with payloads, both signs
           0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fbfffffu, 0x7fffffffu, 0x7f80c000u,
           // float subnormals: the smallest, the largest, bf16 ties among them (0x8000: down to
           // even zero; 0x18000: up to even 2) and just past a tie
           0x00000001u, 0x80000001u, 0x007fffffu, 0x807fffffu, 0x00008000u, 0x00018000u, 0x00008001u,
           // bf16 ties in the normals (low half exactly 0x8000, both parities) and a carry into
           // the exponent
           0x3f808000u, 0x3f818000u, 0xbf808000u, 0x3fff8000u, 0x3f80ffffu, 0x3f807fffu}) {
    x.push_back(from_bits(u));
  }
  for (float f : {
           // fp16's largest finite value, the last float that rounds down to it, the tie that
           // overflows to infinity (65520), and past it
           65504.f, -65504.f, 65519.996f, 65520.f, -65520.f, 65536.f, 1e10f, -1e30f,
           // fp16 ties: 1 + 2^-11 (down to even 1), 1 + 3 * 2^-11 (up to even), at 2048 (spacing 2)
           1.f + 0x1p-11f, 1.f + 3 * 0x1p-11f, -(1.f + 0x1p-11f), 2049.f, 2051.f, 0x1.002p0f,
           // fp16 subnormals: the smallest (2^-24), ties between subnormals (2^-25 down to zero,
           // 3 * 2^-25 up to 2^-23), just past a tie, the largest, and the tie into the normals
           0x1p-24f, -0x1p-24f, 0x1p-25f, -0x1p-25f, 3 * 0x1p-25f, 0x1.000002p-25f, 0x1p-26f, 0x1.ff8p-15f,
           0x1p-14f - 0x1p-25f, 0x1p-14f, 5 * 0x1p-25f, 0x1p-20f + 0x1p-25f,
           // ordinary values
           1.f, -1.f, 0.1f, -3.14159f, 1e-3f, 1e-8f})
    x.push_back(f);
  Rng r(41);
  for (int i = 0; i < (1 << 20); ++i) x.push_back(from_bits(static_cast<uint32_t>(r.next())));
  for (float f : random(100000, 42, -1, 1)) x.push_back(f * 1e-3f);
  return x;
}

// fp32 -> 16-bit on the GPU equals compress16, bit for bit: rounding to nearest even, ties,
// subnormals, overflow to infinity. A NaN must give a NaN: the GPU's is canonical (0x7fff for
// bf16), the host's keeps sign and payload, and a NaN summed stays a NaN whatever its bits.
TEST(Kernels, WireCastsToBf16AndFp16MatchCompress16) {
  SKIP_WITHOUT_GPU();
  const std::vector<float> x = wire_cast_inputs();
  const size_t n = x.size();
  Dev<float> x_(x);
  for (DType dt : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dt == DType::kBF16 ? "bf16" : "fp16");
    std::vector<uint16_t> want(n);
    compress16(x.data(), want.data(), static_cast<int64_t>(n), dt);
    Dev<uint16_t> y_(n);
    CUDA_CHECK(dt == DType::kBF16 ? cuda::launch_to_bf16(x_.p, y_.p, static_cast<int64_t>(n), nullptr)
                                  : cuda::launch_to_f16(x_.p, y_.p, static_cast<int64_t>(n), nullptr));
    const std::vector<uint16_t> got = y_.host();
    size_t nans = 0;
    for (size_t i = 0; i < n; ++i) {
      if (std::isnan(x[i])) {
        ++nans;
        ASSERT_TRUE(is_nan16(got[i], dt) && is_nan16(want[i], dt)) << "NaN input " << i << " (bits " << std::hex
                                                                     << bits_of(x[i]) << ") gave " << got[i];
      } else {
        ASSERT_EQ(got[i], want[i]) << "input " << i << " = " << x[i] << " (bits " << std::hex << bits_of(x[i]) << ")";
      }
    }
    EXPECT_GT(nans, 7u);  // the listed NaNs, and the random patterns' own
  }
  // The cases named above, spelled out (fp16): the largest finite value stays, 65520 overflows.
  std::vector<uint16_t> h(3);
  const float edge[] = {65504.f, 65520.f, 0x1p-25f};
  compress16(edge, h.data(), 3, DType::kF16);
  EXPECT_EQ(h, (std::vector<uint16_t>{0x7bff, 0x7c00, 0x0000}));
}

// 16-bit -> fp32 on the GPU equals decompress16 for all 65536 bit patterns (exact widening, signed
// zeros, subnormals, infinities), NaN for NaN; accumulation adds the widened value in float.
TEST(Kernels, WireCastsFromBf16AndFp16MatchDecompress16) {
  SKIP_WITHOUT_GPU();
  std::vector<uint16_t> all(1 << 16);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  const size_t n = all.size();
  Dev<uint16_t> a_(all);
  const std::vector<float> base = random(n, 43);
  for (DType dt : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dt == DType::kBF16 ? "bf16" : "fp16");
    std::vector<float> want(n);
    decompress16(all.data(), want.data(), static_cast<int64_t>(n), dt);
    Dev<float> y_(n), acc_(base);
    CUDA_CHECK(dt == DType::kBF16 ? cuda::launch_from_bf16(a_.p, y_.p, static_cast<int64_t>(n), false, nullptr)
                                  : cuda::launch_from_f16(a_.p, y_.p, static_cast<int64_t>(n), false, nullptr));
    CUDA_CHECK(dt == DType::kBF16 ? cuda::launch_from_bf16(a_.p, acc_.p, static_cast<int64_t>(n), true, nullptr)
                                  : cuda::launch_from_f16(a_.p, acc_.p, static_cast<int64_t>(n), true, nullptr));
    const std::vector<float> got = y_.host(), got_acc = acc_.host();
    for (size_t i = 0; i < n; ++i) {
      if (is_nan16(all[i], dt)) {
        ASSERT_TRUE(std::isnan(got[i]) && std::isnan(want[i])) << "pattern " << std::hex << i;
        ASSERT_TRUE(std::isnan(got_acc[i])) << "pattern " << std::hex << i;
      } else {
        ASSERT_EQ(bits_of(got[i]), bits_of(want[i])) << "pattern " << std::hex << i;
        const float sum = base[i] + want[i];
        ASSERT_TRUE(bits_of(got_acc[i]) == bits_of(sum) || (std::isnan(sum) && std::isnan(got_acc[i])))
            << "accumulated, pattern " << std::hex << i;
      }
    }
  }
}

TEST(Kernels, SgdMatchesCpuOptimizerFormula) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 12345;
  auto p = random(n, 11), g = random(n, 12);
  std::vector<float> buf(n, 0.f), pc = p;
  Dev<float> p_(p), g_(g), b_(buf), lr_(size_t{1});
  for (int step = 0; step < 3; ++step) {
    const float lr = 0.1f * static_cast<float>(step + 1);  // a new rate each step, read from the device
    CUDA_CHECK(cuda::launch_store_scalar(lr_.p, lr, nullptr));
    CUDA_CHECK(cuda::launch_sgd_update(p_.p, g_.p, b_.p, n, lr_.p, 0.9f, 1e-3f, step == 0, nullptr, 0.f, nullptr));
    for (int64_t i = 0; i < n; ++i) {
      const float d = g[i] + 1e-3f * pc[i];
      buf[i] = step == 0 ? d : 0.9f * buf[i] + d;
      pc[i] -= lr * buf[i];
    }
  }
  expect_close(p_.host(), pc);
}

}  // namespace
}  // namespace dpt
