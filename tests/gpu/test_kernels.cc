// The kernels/ launchers that tests/unit/test_backend_ops.cc (every backend operation against
// references, on the CUDA backend too) cannot reach or cannot stress: the fp32 <-> bf16 / fp16
// casts (compressed gradients, --grad-dtype, and the operands of --precision bf16 GEMMs), bit for
// bit against the host's compress16 / decompress16 (dpt/half.h) over every special value, and the
// loss sums at the row counts where their one block's stride wraps. Skipped where no CUDA device is
// visible (CI).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "batchnorm.cuh"
#include "cuda/cuda_check.h"
#include "dpt/dtype.h"
#include "dpt/half.h"
#include "dpt/rng.h"
#include "gpu_test_util.h"
#include "loss.cuh"
#include "pooling.cuh"
#include "precision.cuh"

namespace dpt {
namespace {

using test::Dev;
using test::random;

// Which form BatchNorm's passes take (kernels/vec_rows.cuh): 16 bytes of a row per thread where
// the channels are a multiple of 8 (bf16) or 4 (fp32), at most 256 such vectors a row, and every
// pointer 16-byte aligned; one element per thread otherwise. BackendOps'
// BatchNormPassesGiveTheSameBitsAtAnyAlignment compares the two forms at offsets 0 and 1: this
// says that those offsets do take different forms. Addresses only: no device needed.
TEST(Kernels, BatchNormPassesTake16BytesOnlyWhereTheyFit) {
  alignas(64) static float buf[64];
  const void* at0 = buf;
  const void* f1 = buf + 1;                                 // 4 bytes past
  const void* h1 = reinterpret_cast<const char*>(buf) + 2;  // 2 bytes past
  using cuda::bn_rows_in_16_bytes;
  for (int64_t c : {16, 264}) {
    EXPECT_TRUE(bn_rows_in_16_bytes(5003, c, 4, {at0, at0, nullptr})) << c;
    EXPECT_TRUE(bn_rows_in_16_bytes(5003, c, 2, {at0, at0, nullptr})) << c;
    EXPECT_FALSE(bn_rows_in_16_bytes(5003, c, 4, {f1, f1, nullptr})) << c;
    EXPECT_FALSE(bn_rows_in_16_bytes(5003, c, 2, {h1, h1, nullptr})) << c;
    EXPECT_FALSE(bn_rows_in_16_bytes(5003, c, 2, {at0, h1})) << c << ": any pointer";
  }
  EXPECT_TRUE(bn_rows_in_16_bytes(10, 12, 4, {at0}));     // 3 vectors of 4 floats
  EXPECT_FALSE(bn_rows_in_16_bytes(10, 12, 2, {at0}));    // 12 is no multiple of 8 bf16
  EXPECT_TRUE(bn_rows_in_16_bytes(10, 2048, 2, {at0}));   // 256 vectors
  EXPECT_FALSE(bn_rows_in_16_bytes(10, 2056, 2, {at0}));  // 257
  EXPECT_FALSE(bn_rows_in_16_bytes(0, 16, 2, {at0}));     // no rows
}

// One block of 256 threads sums the rows in strides of 256 (backend_ops' 6 rows never wrap): none,
// one, either side of a stride and several; overwriting, then accumulating.
TEST(Kernels, LossSumsInDoubleOverwriteAndAccumulate) {
  SKIP_WITHOUT_GPU();
  for (int64_t n : {0, 1, 255, 256, 257, 1000}) {
    auto loss = random(static_cast<size_t>(n), 14, 0, 5);
    std::vector<int32_t> hits(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) hits[static_cast<size_t>(i)] = static_cast<int32_t>(i % 3 == 0);
    double want = 0, want_hits = 0;
    for (int64_t i = 0; i < n; ++i)
      want += loss[static_cast<size_t>(i)], want_hits += hits[static_cast<size_t>(i)];
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

// ---- The fp32 <-> 16-bit casts against the host's compress16 / decompress16
// ----------------------

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
// Max-pooling's 32-bit and 64-bit index forms (kernels/pooling.cu) give the same bits, in the
// 16-byte (16 channels) and one-channel (3 channels) forms, fp32 and bf16, with ties and a NaN:
// real tensors take the 64-bit form only past 2^31 - 2^24 elements, which no other test reaches.
TEST(Kernels, MaxPoolIndexWidthsGiveTheSameBits) {
  SKIP_WITHOUT_GPU();
  for (const int64_t c : {16, 3})
    for (const bool bf16 : {false, true}) {
      SCOPED_TRACE(std::to_string(c) + (bf16 ? " bf16 channels" : " fp32 channels"));
      const int64_t n = 2, h = 9, w = 10, oh = 5, ow = 5;  // 3/2/1
      std::vector<float> x = random(static_cast<size_t>(n * h * w * c), 31);
      for (float& v : x) v = std::round(v * 2.f) / 2.f;  // ties
      x[static_cast<size_t>(c + 1)] = NAN;               // pixel (0, 1), channel 1
      const std::vector<float> dy = random(static_cast<size_t>(n * oh * ow * c), 32);
      auto run = [&](bool wide) {
        cuda::set_maxpool_wide_indices_for_tests(wide);
        std::pair<std::vector<uint32_t>, std::vector<uint32_t>> out;
        if (bf16) {
          Dev<uint16_t> x_(test::to_bf16(x)), dy_(test::to_bf16(dy)), y_(dy.size()), dx_(x.size());
          CUDA_CHECK(cuda::launch_maxpool_forward(x_.p, y_.p, n, h, w, c, 3, 2, 1, nullptr));
          CUDA_CHECK(
              cuda::launch_maxpool_backward(x_.p, dy_.p, dx_.p, n, h, w, c, 3, 2, 1, nullptr));
          for (uint16_t b : y_.host()) out.first.push_back(b);
          for (uint16_t b : dx_.host()) out.second.push_back(b);
        } else {
          Dev<float> x_(x), dy_(dy), y_(dy.size()), dx_(x.size());
          CUDA_CHECK(cuda::launch_maxpool_forward(x_.p, y_.p, n, h, w, c, 3, 2, 1, nullptr));
          CUDA_CHECK(
              cuda::launch_maxpool_backward(x_.p, dy_.p, dx_.p, n, h, w, c, 3, 2, 1, nullptr));
          for (float f : y_.host()) out.first.push_back(bits_of(f));
          for (float f : dx_.host()) out.second.push_back(bits_of(f));
        }
        cuda::set_maxpool_wide_indices_for_tests(false);
        return out;
      };
      const auto narrow = run(false), wide = run(true);
      EXPECT_EQ(wide.first, narrow.first) << "y";
      EXPECT_EQ(wide.second, narrow.second) << "dx";
    }
}

bool is_nan16(uint16_t h, DType dt) {
  return dt == DType::kBF16 ? (h & 0x7fffu) > 0x7f80u : (h & 0x7fffu) > 0x7c00u;
}

// Every kind of input the casts treat specially, then 2^20 random bit patterns (every exponent,
// sign and payload) and 10^5 values of gradient-like size.
std::vector<float> wire_cast_inputs() {
  std::vector<float> x;
  for (uint32_t u :
       {// signed zeros, infinities, the largest finite float (bf16 overflow to infinity)
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
  for (float f :
       {// fp16's largest finite value, the last float that rounds down to it, the tie that
        // overflows to infinity (65520), and past it
        65504.f, -65504.f, 65519.996f, 65520.f, -65520.f, 65536.f, 1e10f, -1e30f,
        // fp16 ties: 1 + 2^-11 (down to even 1), 1 + 3 * 2^-11 (up to even), at 2048 (spacing 2)
        1.f + 0x1p-11f, 1.f + 3 * 0x1p-11f, -(1.f + 0x1p-11f), 2049.f, 2051.f, 0x1.002p0f,
        // fp16 subnormals: the smallest (2^-24), ties between subnormals (2^-25 down to zero,
        // 3 * 2^-25 up to 2^-23), just past a tie, the largest, and the tie into the normals
        0x1p-24f, -0x1p-24f, 0x1p-25f, -0x1p-25f, 3 * 0x1p-25f, 0x1.000002p-25f, 0x1p-26f,
        0x1.ff8p-15f, 0x1p-14f - 0x1p-25f, 0x1p-14f, 5 * 0x1p-25f, 0x1p-20f + 0x1p-25f,
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
    CUDA_CHECK(dt == DType::kBF16
                   ? cuda::launch_to_bf16(x_.p, y_.p, static_cast<int64_t>(n), nullptr)
                   : cuda::launch_to_f16(x_.p, y_.p, static_cast<int64_t>(n), nullptr));
    const std::vector<uint16_t> got = y_.host();
    size_t nans = 0;
    for (size_t i = 0; i < n; ++i) {
      if (std::isnan(x[i])) {
        ++nans;
        ASSERT_TRUE(is_nan16(got[i], dt) && is_nan16(want[i], dt))
            << "NaN input " << i << " (bits " << std::hex << bits_of(x[i]) << ") gave " << got[i];
      } else {
        ASSERT_EQ(got[i], want[i])
            << "input " << i << " = " << x[i] << " (bits " << std::hex << bits_of(x[i]) << ")";
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
    CUDA_CHECK(dt == DType::kBF16
                   ? cuda::launch_from_bf16(a_.p, y_.p, static_cast<int64_t>(n), false, nullptr)
                   : cuda::launch_from_f16(a_.p, y_.p, static_cast<int64_t>(n), false, nullptr));
    CUDA_CHECK(dt == DType::kBF16
                   ? cuda::launch_from_bf16(a_.p, acc_.p, static_cast<int64_t>(n), true, nullptr)
                   : cuda::launch_from_f16(a_.p, acc_.p, static_cast<int64_t>(n), true, nullptr));
    const std::vector<float> got = y_.host(), got_acc = acc_.host();
    for (size_t i = 0; i < n; ++i) {
      if (is_nan16(all[i], dt)) {
        ASSERT_TRUE(std::isnan(got[i]) && std::isnan(want[i])) << "pattern " << std::hex << i;
        ASSERT_TRUE(std::isnan(got_acc[i])) << "pattern " << std::hex << i;
      } else {
        ASSERT_EQ(bits_of(got[i]), bits_of(want[i])) << "pattern " << std::hex << i;
        const float sum = base[i] + want[i];
        ASSERT_TRUE(bits_of(got_acc[i]) == bits_of(sum) ||
                    (std::isnan(sum) && std::isnan(got_acc[i])))
            << "accumulated, pattern " << std::hex << i;
      }
    }
  }
}

}  // namespace
}  // namespace dpt
