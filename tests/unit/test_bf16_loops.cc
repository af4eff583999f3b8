// The CPU's one-pass bfloat16 activation loops (ops.h's templates for T = BFloat16) against the
// reference they replace (widen.h: inputs widened into float copies, the float loop, each output
// rounded to nearest even by bf16_from_float): the same bits for every loop, on random values and
// on the special ones (NaN, infinities, signed zeros, bf16 subnormals, rounding ties; a NaN's sign
// and payload may differ). The suite
// also runs with DPT_ISA=avx2 and generic, so every compiled level meets the reference.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cpu/ops.h"
#include "cpu/widen.h"
#include "dpt/half.h"

namespace dpt {
namespace {

using Bf = std::vector<BFloat16>;

// n bfloat16 values: mostly uniform in [-2, 2], with every 7th one special (the specials cycle),
// so each loop meets NaN, infinities, zeros of both signs, subnormals and the largest finite.
Bf random_bf16(int64_t n, uint64_t seed) {
  static const uint16_t kSpecial[] = {
      0x7fc0, 0xffc1,  // NaNs (quiet, with payload)
      0x7f80, 0xff80,  // +-inf
      0x0000, 0x8000,  // +-0
      0x0001, 0x8003,  // subnormals (2^-133 and -3 * 2^-133)
      0x007f, 0x7f7f,  // the largest subnormal and the largest finite
      0x3f80, 0x3b80,  // 1 and 2^-8: 1 + 2^-8 is a tie to even
  };
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> d(-2.f, 2.f);
  Bf v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[i].bits = i % 7 == 3 ? kSpecial[(i / 7) % std::size(kSpecial)] : bf16_from_float(d(g));
  return v;
}

bool is_nan(BFloat16 v) { return (v.bits & 0x7fff) > 0x7f80; }

// Asserts a and b hold the same bits, or both a NaN: which operand's NaN a float addition passes
// on (and its sign) depends on the order the compiler put the operands in, which IEEE 754 leaves
// open and no result of training depends on.
void expect_same_bits(const Bf& fast, const Bf& ref, const std::string& what) {
  ASSERT_EQ(fast.size(), ref.size()) << what;
  int64_t bad = 0;
  for (size_t i = 0; i < fast.size(); ++i)
    if (fast[i].bits != ref[i].bits && !(is_nan(fast[i]) && is_nan(ref[i])) && ++bad <= 5)
      ADD_FAILURE() << what << "[" << i << "]: one pass 0x" << std::hex << fast[i].bits
                    << ", reference 0x" << ref[i].bits;
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << fast.size() << " values differ";
}

// Runs the op twice: `fast` on the bf16 arrays (the one-pass loops), and `ref` through
// cpu::Widened on the float loops (the reference); `ins` are read, `outs` written. Outputs start as
// different garbage on the two sides, so a value the op does not write shows up.
template <typename Fast, typename Ref>
void check(const std::string& what, std::vector<const Bf*> ins, std::vector<int64_t> out_sizes,
           Fast fast, Ref ref) {
  SCOPED_TRACE(what);
  std::vector<Bf> out_fast, out_ref;
  std::vector<const BFloat16*> in_ptrs;
  for (const Bf* in : ins) in_ptrs.push_back(in->data());
  std::vector<BFloat16*> fast_ptrs, ref_ptrs;
  for (int64_t n : out_sizes) {
    out_fast.emplace_back(static_cast<size_t>(n), BFloat16{0x1234});
    out_ref.emplace_back(static_cast<size_t>(n), BFloat16{0x4321});
  }
  for (auto& o : out_fast) fast_ptrs.push_back(o.data());
  for (auto& o : out_ref) ref_ptrs.push_back(o.data());
  fast(in_ptrs, fast_ptrs);
  {
    cpu::Widened f;
    std::vector<const float*> fin;
    std::vector<float*> fout;
    for (size_t i = 0; i < ins.size(); ++i)
      fin.push_back(f.in(ins[i]->data(), static_cast<int64_t>(ins[i]->size())));
    for (size_t i = 0; i < out_sizes.size(); ++i) fout.push_back(f.out(ref_ptrs[i], out_sizes[i]));
    ref(fin, fout);
  }
  for (size_t i = 0; i < out_sizes.size(); ++i)
    expect_same_bits(out_fast[i], out_ref[i], what + " output " + std::to_string(i));
}

// The same, with one op generic over the pointer types for both sides.
template <typename Op>
void check(const std::string& what, std::vector<const Bf*> ins, std::vector<int64_t> out_sizes,
           Op op) {
  check(what, std::move(ins), std::move(out_sizes), op, op);
}

TEST(Bf16Loops, ElementwiseGiveTheReferenceBits) {
  for (int64_t n : {1, 15, 16, 17, 1000, 70001}) {  // tails of every vector width, and threads
    const Bf a = random_bf16(n, 1), b = random_bf16(n, 2);
    check("relu_forward n=" + std::to_string(n), {&a}, {n},
          [&](auto in, auto out) { cpu::relu_forward(in[0], out[0], n); });
    check("relu_backward", {&a, &b}, {n},
          [&](auto in, auto out) { cpu::relu_backward(in[0], in[1], out[0], n); });
    check("add", {&a, &b}, {n}, [&](auto in, auto out) { cpu::add(in[0], in[1], out[0], n); });
  }
}

TEST(Bf16Loops, RoundingTiesGoToEvenAndSubnormalsStay) {
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: the even neighbour is 1. 2^-133 + 2^-133 is the
  // subnormal 2^-132, which VCVTNEPS2BF16 would flush to zero.
  const Bf a{{0x3f80}, {0x0001}, {0x3f81}}, b{{0x3b80}, {0x0001}, {0x3b80}};
  Bf y(3);
  cpu::add(a.data(), b.data(), y.data(), 3);
  EXPECT_EQ(y[0].bits, 0x3f80);  // 1 + 2^-8 -> 1 (even)
  EXPECT_EQ(y[1].bits, 0x0002);  // the subnormal sum is kept
  EXPECT_EQ(y[2].bits, 0x3f82);  // (1 + 2^-7) + 2^-8: the tie goes up to the even 1 + 2^-6
}

// The conversions Backend::convert runs (the input images, the logits): the scalar rule's bits,
// on float bit patterns from the whole range (NaNs, infinities, float subnormals, exact bf16
// values and ties among them), and the exact widening back.
TEST(Bf16Loops, ConversionsGiveTheScalarRulesBits) {
  std::mt19937_64 g(17);
  for (int64_t n : {1, 15, 16, 17, 1000, 70001}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      uint32_t u = static_cast<uint32_t>(g());
      if (i % 5 == 1) u = (u & 0xffff0000u) | 0x8000u;  // a tie
      if (i % 5 == 2) u &= 0x807fffffu;                 // a float subnormal
      if (i % 11 == 3) u = (u & 0x80000000u) | 0x7f800000u | (i % 3 ? 0u : (u & 0x7fffffu));
      x[static_cast<size_t>(i)] = std::bit_cast<float>(u);
    }
    Bf y(static_cast<size_t>(n), BFloat16{0x1234});
    cpu::round_to_bf16(x.data(), y.data(), n);
    Bf ref(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ref[i].bits = bf16_from_float(x[static_cast<size_t>(i)]);
    expect_same_bits(y, ref, "round_to_bf16 n=" + std::to_string(n));
    std::vector<float> back(static_cast<size_t>(n), -7.f);
    cpu::widen_bf16(y.data(), back.data(), n);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(back[static_cast<size_t>(i)]),
                static_cast<uint32_t>(y[i].bits) << 16)
          << "widen_bf16 [" << i << "]";
  }
}

TEST(Bf16Loops, PoolingGivesTheReferenceBits) {
  struct P {
    int64_t n, h, w, c;
    int k, s;
  };
  for (const P& p :
       {P{2, 6, 6, 3, 2, 2}, P{3, 7, 5, 17, 2, 2}, P{2, 7, 7, 5, 3, 2}, P{1, 9, 8, 33, 3, 1}}) {
    const int64_t oh = (p.h - p.k) / p.s + 1, ow = (p.w - p.k) / p.s + 1;
    const int64_t in = p.n * p.h * p.w * p.c, out = p.n * oh * ow * p.c;
    const std::string tag = "pool " + std::to_string(p.h) + "x" + std::to_string(p.w) + " c" +
                            std::to_string(p.c) + " k" + std::to_string(p.k) + " s" +
                            std::to_string(p.s);
    const Bf x = random_bf16(in, 3), dy = random_bf16(out, 4);
    check("avgpool_forward " + tag, {&x}, {out},
          [&](auto i, auto o) { cpu::avgpool_forward(i[0], o[0], p.n, p.h, p.w, p.c, p.k, p.s); });
    check("relu_avgpool_forward " + tag, {&x}, {out}, [&](auto i, auto o) {
      cpu::relu_avgpool_forward(i[0], o[0], p.n, p.h, p.w, p.c, p.k, p.s);
    });
    check("avgpool_backward " + tag, {&dy}, {in},
          [&](auto i, auto o) { cpu::avgpool_backward(i[0], o[0], p.n, p.h, p.w, p.c, p.k, p.s); });
    check("relu_avgpool_backward " + tag, {&x, &dy}, {in}, [&](auto i, auto o) {
      cpu::relu_avgpool_backward(i[0], i[1], o[0], p.n, p.h, p.w, p.c, p.k, p.s);
    });
    // Max pooling at padding 0 and at torchvision's k/2 (the window sizes above).
    for (const int pad : {0, p.k / 2}) {
      const int64_t moh = (p.h + 2 * pad - p.k) / p.s + 1, mow = (p.w + 2 * pad - p.k) / p.s + 1;
      const int64_t mout = p.n * moh * mow * p.c;
      const Bf mdy = random_bf16(mout, 6);
      const std::string mtag = tag + " pad" + std::to_string(pad);
      check("maxpool_forward " + mtag, {&x}, {mout}, [&](auto i, auto o) {
        cpu::maxpool_forward(i[0], o[0], p.n, p.h, p.w, p.c, p.k, p.s, pad);
      });
      check("maxpool_backward " + mtag, {&x, &mdy}, {in}, [&](auto i, auto o) {
        cpu::maxpool_backward(i[0], i[1], o[0], p.n, p.h, p.w, p.c, p.k, p.s, pad);
      });
    }
    const int64_t hw = p.h * p.w;
    const Bf gdy = random_bf16(p.n * p.c, 5);
    check("global_avgpool_forward " + tag, {&x}, {p.n * p.c},
          [&](auto i, auto o) { cpu::global_avgpool_forward(i[0], o[0], p.n, hw, p.c); });
    check("global_avgpool_backward " + tag, {&gdy}, {in},
          [&](auto i, auto o) { cpu::global_avgpool_backward(i[0], o[0], p.n, hw, p.c); });
    check("nhwc_to_chw " + tag, {&x}, {in},
          [&](auto i, auto o) { cpu::nhwc_to_chw(i[0], o[0], p.n, p.h, p.w, p.c); });
    check("chw_to_nhwc " + tag, {&x}, {in},
          [&](auto i, auto o) { cpu::chw_to_nhwc(i[0], o[0], p.n, p.h, p.w, p.c); });
  }
}

TEST(Bf16Loops, BatchNormGivesTheReferenceBits) {
  for (const auto& [m, c] : {std::pair<int64_t, int64_t>{37, 3}, {300, 64}, {1000, 17}}) {
    // Appended, not "m" + a temporary: g++ 12 warns on that (-Wrestrict, a false positive).
    std::string tag = "m";
    tag.append(std::to_string(m)).append(" c").append(std::to_string(c));
    std::mt19937_64 g(7);
    std::uniform_real_distribution<float> d(-1.f, 1.f), pos(0.5f, 2.f);
    std::vector<float> mean(c), invstd(c), gamma(c), beta(c);
    for (int64_t ch = 0; ch < c; ++ch)
      mean[ch] = d(g), invstd[ch] = pos(g), gamma[ch] = pos(g), beta[ch] = d(g);
    std::vector<double> sdy(c), sdx(c);
    for (int64_t ch = 0; ch < c; ++ch) sdy[ch] = d(g) * 10, sdx[ch] = d(g) * 10;
    const Bf x = random_bf16(m * c, 8), dy = random_bf16(m * c, 9), res = random_bf16(m * c, 10),
             relu_out = random_bf16(m * c, 11);
    {
      // The sums are doubles of exactly widened values: equal to the float loop's.
      std::vector<double> s1(c), q1(c), s2(c), q2(c);
      cpu::bn_sums(x.data(), m, c, s1.data(), q1.data());
      cpu::Widened f;
      cpu::bn_sums(f.in(x.data(), m * c), m, c, s2.data(), q2.data());
      for (int64_t ch = 0; ch < c; ++ch) {
        EXPECT_EQ(std::memcmp(&s1[ch], &s2[ch], 8), 0) << tag << " sum " << ch;
        EXPECT_EQ(std::memcmp(&q1[ch], &q2[ch], 8), 0) << tag << " sumsq " << ch;
      }
    }
    for (bool residual : {false, true})
      for (bool relu : {false, true})
        check("bn_apply " + tag + (residual ? " residual" : "") + (relu ? " relu" : ""), {&x, &res},
              {m * c}, [&](auto i, auto o) {
                cpu::bn_apply(i[0], o[0], mean.data(), invstd.data(), gamma.data(), beta.data(), m,
                              c, residual ? i[1] : nullptr, relu);
              });
    for (bool mask : {false, true}) {
      const std::string mtag = tag + (mask ? " masked" : "");
      std::vector<double> a1(c), b1(c), a2(c), b2(c);
      check(
          "bn_backward_sums " + mtag, {&x, &dy, &relu_out}, {m * c},
          [&](auto i, auto o) {
            cpu::bn_backward_sums(i[0], i[1], mask ? i[2] : nullptr, mean.data(), invstd.data(), m,
                                  c, a1.data(), b1.data(), o[0]);
          },
          [&](auto i, auto o) {
            cpu::bn_backward_sums(i[0], i[1], mask ? i[2] : nullptr, mean.data(), invstd.data(), m,
                                  c, a2.data(), b2.data(), o[0]);
          });
      for (int64_t ch = 0; ch < c; ++ch) {
        EXPECT_EQ(std::memcmp(&a1[ch], &a2[ch], 8), 0) << mtag << " sum_dy " << ch;
        EXPECT_EQ(std::memcmp(&b1[ch], &b2[ch], 8), 0) << mtag << " sum_dy_xhat " << ch;
      }
      check("bn_backward_apply " + mtag, {&x, &dy, &relu_out}, {m * c}, [&](auto i, auto o) {
        cpu::bn_backward_apply(i[0], i[1], mask ? i[2] : nullptr, mean.data(), invstd.data(),
                               gamma.data(), sdy.data(), sdx.data(), double(m), m, c, o[0]);
      });
    }
  }
}

}  // namespace
}  // namespace dpt
