// The fused scale-bias-ReLU-convolution-genstats op (src/cuda/cudnn_fused_conv.h) on a GPU, against
// the unfused composition computed independently in double on the host. Skipped, with exit code 77
// (gpu_test_main.cc), where no CUDA device is visible.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "cuda/conv_common.h"
#include "cuda/cuda_backend.h"
#include "cuda/cudnn_fused_conv.h"
#include "dpt/error.h"
#include "dpt/half.h"
#include "dpt/rng.h"
#include "gpu_test_util.h"

namespace dpt {
namespace {

using gpu::FusedConvGenstats;
using gpu::GpuContext;
using test::Dev;

size_t count(int64_t v) { return static_cast<size_t>(v); }
size_t x_size(const ConvGeom& g) { return count(g.n * g.h * g.w * g.c_in); }
size_t y_size(const ConvGeom& g) { return count(g.n * g.oh() * g.ow() * g.c_out); }
size_t w_size(const ConvGeom& g) { return count(g.c_out * g.c_in * g.k * g.k); }
float round_bf16(float f) { return float_from_bf16(bf16_from_float(f)); }

// Operands. "Exact" ones sit on grids that make every step before the output's own rounding exact
// in bf16 and fp32: x = i/32 (|i| <= 32), scale a power of two in [1/2, 2], bias = j/64 (|j| <=
// 32), so x*scale + bias = k/64 with |k| <= 160 < 256 (8 significant bits: a bf16 value); w any
// bf16 value, so each product has at most 16 significant bits (exact in fp32). Otherwise x, scale,
// bias and w are arbitrary bf16 values and the prologue's result may be rounded before the
// convolution.
struct Operands {
  ConvGeom g;
  std::vector<float> x, scale, bias, w;  // every value a bf16 value
};
Operands operands(const ConvGeom& g, uint64_t seed, bool exact) {
  Rng r(seed);
  const auto grid = [&](size_t n, int range, double step) {
    std::vector<float> v(n);
    for (float& f : v) f = static_cast<float>(std::floor(r.uniform(-range, range + 1)) * step);
    return v;
  };
  Operands o{g, {}, {}, {}, test::random(w_size(g), seed + 1, -0.5, 0.5)};
  if (exact) {
    o.x = grid(x_size(g), 32, 1.0 / 32);
    o.bias = grid(count(g.c_in), 32, 1.0 / 64);
    o.scale.resize(count(g.c_in));
    for (float& s : o.scale)
      s = static_cast<float>(std::ldexp(1.0, static_cast<int>(std::floor(r.uniform(-1, 2)))));
  } else {
    o.x = test::random(x_size(g), seed + 2, -1, 1);
    o.scale = test::random(count(g.c_in), seed + 3, 0.25, 2);
    o.bias = test::random(count(g.c_in), seed + 4, -0.5, 0.5);
  }
  for (auto* v : {&o.x, &o.scale, &o.bias, &o.w})
    for (float& f : *v) f = round_bf16(f);
  return o;
}

// The unfused composition in double: a = relu(x*scale + bias) (or x), zero padding around a,
// direct convolution, and the channel sums of y. mag[i] = sum |a*w| over y[i]'s terms: the scale
// of its accumulation error; abs_sum[c] = sum |y| over the channel.
struct Reference {
  std::vector<double> y, mag, sum, sqsum;
};
Reference reference(const Operands& o, bool prologue) {
  const ConvGeom& g = o.g;
  std::vector<double> a(o.x.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const size_t c = i % count(g.c_in);
    a[i] = prologue ? std::max(0.0, double(o.x[i]) * o.scale[c] + o.bias[c]) : o.x[i];
  }
  Reference r;
  r.y.assign(y_size(g), 0);
  r.mag.assign(y_size(g), 0);
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t oh = 0; oh < g.oh(); ++oh)
      for (int64_t ow = 0; ow < g.ow(); ++ow) {
        const size_t yo = count(((n * g.oh() + oh) * g.ow() + ow) * g.c_out);
        for (int64_t kh = 0; kh < g.k; ++kh)
          for (int64_t kw = 0; kw < g.k; ++kw) {
            const int64_t xo = test::tap_offset(g, n, oh, ow, kh, kw);
            if (xo < 0) continue;
            for (int64_t co = 0; co < g.c_out; ++co) {
              double acc = 0, m = 0;
              for (int64_t ci = 0; ci < g.c_in; ++ci) {
                const double t =
                    a[count(xo + ci)] * o.w[count(((co * g.c_in + ci) * g.k + kh) * g.k + kw)];
                acc += t;
                m += std::fabs(t);
              }
              r.y[yo + count(co)] += acc;
              r.mag[yo + count(co)] += m;
            }
          }
      }
  r.sum.assign(count(g.c_out), 0);
  r.sqsum.assign(count(g.c_out), 0);
  for (size_t i = 0; i < r.y.size(); ++i) {
    r.sum[i % count(g.c_out)] += r.y[i];
    r.sqsum[i % count(g.c_out)] += r.y[i] * r.y[i];
  }
  return r;
}

// Error bounds, from the roundings each path may make:
// - y[i]: its own rounding to the output type (bf16: 2^-9 relative, doubled to 2^-8 for any
//   rounding mode; fp32: nothing beyond accumulation), fp32 accumulation over at most 4608 terms
//   in any order (n * 2^-24 * mag < 2^-11 * mag), and with arbitrary inputs the prologue's result
//   possibly rounded to bf16 before the tensor cores read it (2^-8 * mag, doubled likewise).
// - the statistics: from y's unrounded or rounded values, each within e[i] of the reference, so
//   sum within sum_i e[i] and sqsum within sum_i (2|y[i]| e[i] + e[i]^2), plus fp32 accumulation
//   over the M = N*OH*OW rows (M * 2^-24 of sum |y|, of sum y^2).
// A missing ReLU, a prologue applied to the padding, a wrong channel or a missing batch are all
// O(1) relative errors: far outside these.
struct Bounds {
  double out_rel;       // y's own rounding, relative
  double prologue_rel;  // the prologue's rounding, relative to mag
};
constexpr double kAccum = 0x1p-11;

struct Outcome {
  std::vector<float> y, sum, sqsum;
  std::string plan;
};

// Checks one run's outputs against the reference; at most a few failures printed per array.
void expect_matches(const Outcome& gpu, const Reference& ref, const ConvGeom& g, Bounds b,
                    const std::string& what) {
  ASSERT_EQ(gpu.y.size(), ref.y.size()) << what;
  const size_t c_out = count(g.c_out);
  std::vector<double> sum_bound(c_out, 0), sq_bound(c_out, 0), abs_sum(c_out, 0), sq_ref(c_out, 0);
  int shown = 0;
  size_t bad = 0;
  for (size_t i = 0; i < ref.y.size(); ++i) {
    const double e = b.out_rel * std::fabs(ref.y[i]) + (kAccum + b.prologue_rel) * ref.mag[i];
    const size_t c = i % c_out;
    sum_bound[c] += e;
    sq_bound[c] += 2 * std::fabs(ref.y[i]) * e + e * e;
    abs_sum[c] += std::fabs(ref.y[i]);
    sq_ref[c] += ref.y[i] * ref.y[i];
    if (std::fabs(gpu.y[i] - ref.y[i]) > e) {
      ++bad;
      if (shown++ < 5)
        ADD_FAILURE() << what << ": y[" << i << "] (channel " << c << ") = " << gpu.y[i]
                      << ", unfused " << ref.y[i] << ", bound " << e << " [plan " << gpu.plan
                      << "]";
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": elements of y outside their bound, of " << ref.y.size();
  const double rows = static_cast<double>(g.n * g.oh() * g.ow()) * 0x1p-24;
  shown = 0;
  for (size_t c = 0; c < c_out; ++c) {
    const double ds = std::fabs(gpu.sum[c] - ref.sum[c]), bs = sum_bound[c] + rows * abs_sum[c];
    const double dq = std::fabs(gpu.sqsum[c] - ref.sqsum[c]), bq = sq_bound[c] + rows * sq_ref[c];
    if ((ds > bs || dq > bq) && shown++ < 5)
      ADD_FAILURE() << what << ": channel " << c << ": sum " << gpu.sum[c] << " (unfused "
                    << ref.sum[c] << ", bound " << bs << "), sqsum " << gpu.sqsum[c] << " (unfused "
                    << ref.sqsum[c] << ", bound " << bq << ") [plan " << gpu.plan << "]";
  }
}

using test::bf;
using test::from_bf16;
using test::to_bf16;

// The plan op chose for the key of g (the only key containing its text and pattern).
std::string plan_of(const FusedConvGenstats& op, const ConvGeom& g, bool prologue, const char* io) {
  const std::string want =
      gpu::geom_str(g) + (prologue ? " scale-bias-relu-conv-genstats " : " conv-genstats ") + io;
  for (const FusedConvGenstats::Choice& c : op.choices())
    if (c.key == want) return c.plan;
  return "(none)";
}

// One bf16 run; scale and bias at an offset of `sb_offset` floats and w of `w_offset` elements in
// their buffers (0: as allocated).
Outcome run_bf16(FusedConvGenstats& op, const Operands& o, bool prologue, size_t sb_offset = 0,
                 size_t w_offset = 0) {
  const ConvGeom& g = o.g;
  std::vector<float> scale(sb_offset, 0.f), bias(sb_offset, 0.f);
  scale.insert(scale.end(), o.scale.begin(), o.scale.end());
  bias.insert(bias.end(), o.bias.begin(), o.bias.end());
  std::vector<uint16_t> w(w_offset, 0);
  const std::vector<uint16_t> w16 = to_bf16(o.w);
  w.insert(w.end(), w16.begin(), w16.end());
  Dev<uint16_t> x(to_bf16(o.x)), wd(w), y(y_size(g));
  Dev<float> s(scale), b(bias), sum(std::vector<float>(count(g.c_out), 1e30f)),
      sq(std::vector<float>(count(g.c_out), 1e30f));
  op.forward_bf16(g, bf(x.p), prologue ? s.p + sb_offset : nullptr,
                  prologue ? b.p + sb_offset : nullptr, bf(wd.p + w_offset), bf(y.p), sum.p, sq.p);
  return {from_bf16(y.host()), sum.host(), sq.host(), plan_of(op, g, prologue, "bf16")};
}

Outcome run_fp32(FusedConvGenstats& op, const Operands& o, bool prologue) {
  const ConvGeom& g = o.g;
  Dev<float> x(o.x), w(o.w), y(y_size(g)), s(o.scale), b(o.bias), sum(count(g.c_out)),
      sq(count(g.c_out));
  op.forward(g, x.p, prologue ? s.p : nullptr, prologue ? b.p : nullptr, w.p, y.p, sum.p, sq.p);
  return {y.host(), sum.host(), sq.host(), plan_of(op, g, prologue, "fp32")};
}

// Small shapes of the ResNet-18 patterns (batch 3, the host reference stays fast): 3x3 stride 1
// and 2, the 1x1 stride-2 shortcut, an odd input.
const ConvGeom kSmall[] = {
    {3, 14, 14, 64, 64, 3, 1, 1},
    {3, 14, 14, 64, 128, 3, 2, 1},
    {3, 14, 14, 64, 128, 1, 2, 0},
    {3, 7, 7, 256, 512, 3, 2, 1},
};

// A call that throws reports it as a failure naming the key and cuDNN's reasons (the op's message).
// With `may_decline`, cuDNN declining the pattern (gpu::NoGraphPlan) is reported, not failed: on
// an H200 with cuDNN 9.19 (2026-11-26) no engine took the scale-bias-ReLU prologue in bf16 at any
// ResNet-18 shape, while the plain conv-genstats pattern ran everywhere. A key declined once is
// not searched again in this process (each search compiles candidates for seconds).
std::set<std::string>& declined_keys() {
  static std::set<std::string> keys;
  return keys;
}
template <class F>
bool runs(const std::string& what, F f, bool may_decline = false) {
  if (may_decline && declined_keys().count(what.substr(0, what.rfind(" bf16")))) {
    std::printf("%s: declined by cuDNN (earlier in this run)\n", what.c_str());
    return false;
  }
  try {
    f();
    return true;
  } catch (const gpu::NoGraphPlan& e) {
    if (!may_decline) {
      ADD_FAILURE() << what << ": " << e.what();
      return false;
    }
    EXPECT_NE(std::string(e.what()).find(what.substr(0, what.find(" prologue"))), std::string::npos)
        << "the refusal does not name the geometry: " << e.what();
    declined_keys().insert(what.substr(0, what.rfind(" bf16")));
    std::printf("%s: declined by cuDNN\n", what.c_str());
    return false;
  } catch (const Error& e) {
    ADD_FAILURE() << what << ": " << e.what();
    return false;
  }
}

// ---- bf16 numerics
// ---------------------------------------------------------------------------------

TEST(FusedConv, Bf16MatchesUnfusedWithinOneRoundingOnExactInputs) {
  SKIP_WITHOUT_GPU();
  gpu::CudaBackend be(0);
  FusedConvGenstats op(be.context());
  uint64_t seed = 100;
  for (const ConvGeom& g : kSmall)
    for (bool prologue : {true, false}) {
      const Operands o = operands(g, seed += 10, true);
      const std::string what =
          gpu::geom_str(g) + (prologue ? " prologue" : " plain") + " bf16 exact";
      Outcome out;
      if (!runs(
              what, [&] { out = run_bf16(op, o, prologue); }, prologue))
        continue;
      std::printf("%s -> %s\n", what.c_str(), out.plan.c_str());
      expect_matches(out, reference(o, prologue), g, {0x1p-8, 0}, what);
    }
}

TEST(FusedConv, Bf16MatchesUnfusedOnArbitraryInputs) {
  SKIP_WITHOUT_GPU();
  gpu::CudaBackend be(0);
  FusedConvGenstats op(be.context());
  uint64_t seed = 200;
  for (const ConvGeom& g : {kSmall[0], kSmall[1]})
    for (bool prologue : {true, false}) {
      const Operands o = operands(g, seed += 10, false);
      const std::string what =
          gpu::geom_str(g) + (prologue ? " prologue" : " plain") + " bf16 arbitrary";
      Outcome out;
      if (!runs(
              what, [&] { out = run_bf16(op, o, prologue); }, prologue))
        continue;
      expect_matches(out, reference(o, prologue), g, {0x1p-8, 0x1p-8}, what);
    }
}

// scale and bias at a 4-byte offset (where a flat parameter buffer may put them) and w at a
// 2-byte one go through the workspace to the same plan: the same bits as aligned operands. Where
// cuDNN declines the prologue, the plain pattern's unaligned w alone.
TEST(FusedConv, UnalignedParametersGiveTheSameBits) {
  SKIP_WITHOUT_GPU();
  gpu::CudaBackend be(0);
  FusedConvGenstats op(be.context());
  const Operands o = operands(kSmall[0], 300, true);
  Outcome aligned, offset;
  const bool prologue = runs(
      gpu::geom_str(o.g) + " prologue bf16 aligned", [&] { aligned = run_bf16(op, o, true); },
      true);
  if (!prologue) {
    ASSERT_TRUE(runs("plain aligned", [&] { aligned = run_bf16(op, o, false); }));
  }
  ASSERT_TRUE(runs("offset", [&] { offset = run_bf16(op, o, prologue, prologue ? 1 : 0, 1); }));
  EXPECT_EQ(aligned.plan, offset.plan);
  EXPECT_EQ(0, std::memcmp(aligned.y.data(), offset.y.data(), aligned.y.size() * sizeof(float)))
      << "y";
  EXPECT_EQ(aligned.sum, offset.sum);
  EXPECT_EQ(aligned.sqsum, offset.sqsum);
}

// A second call on a known key builds and times nothing, overwrites the statistics (filled with
// 1e30 before each call) and gives the same y; the statistics may differ in the last bits only
// where the plan is non-deterministic (then cuDNN's warning was logged). The plain pattern: the
// one cuDNN offers at every ResNet-18 shape.
TEST(FusedConv, PlanCacheBuildsEachKeyOnce) {
  SKIP_WITHOUT_GPU();
  gpu::CudaBackend be(0);
  FusedConvGenstats op(be.context());
  EXPECT_EQ(op.graphs_built(), 0u);
  const Operands o = operands(kSmall[1], 400, true);
  Outcome first, second;
  ASSERT_TRUE(runs("first", [&] { first = run_bf16(op, o, false); }));
  const uint64_t built = op.graphs_built(), timed = op.plans_timed();
  EXPECT_GE(built, 1u);
  EXPECT_GE(timed, 1u);
  ASSERT_TRUE(runs("second", [&] { second = run_bf16(op, o, false); }));
  EXPECT_EQ(op.graphs_built(), built);
  EXPECT_EQ(op.plans_timed(), timed);
  EXPECT_EQ(op.choices().size(), 1u);
  EXPECT_EQ(0, std::memcmp(first.y.data(), second.y.data(), first.y.size() * sizeof(float)));
  expect_matches(second, reference(o, false), o.g, {0x1p-8, 0}, "second call");
}

TEST(FusedConv, MismatchedScaleAndBiasAreRefused) {
  SKIP_WITHOUT_GPU();
  gpu::CudaBackend be(0);
  FusedConvGenstats op(be.context());
  const ConvGeom g = kSmall[0];
  Dev<uint16_t> x(x_size(g)), w(w_size(g)), y(y_size(g));
  Dev<float> s(count(g.c_in)), sum(count(g.c_out)), sq(count(g.c_out));
  EXPECT_THROW(op.forward_bf16(g, bf(x.p), s.p, nullptr, bf(w.p), bf(y.p), sum.p, sq.p), Error);
}

// ---- fp32: run where cuDNN supports it, otherwise say so
// ------------------------------------------

TEST(FusedConv, Fp32WhereSupported) {
  SKIP_WITHOUT_GPU();
  gpu::CudaBackend be(0);  // strict fp32: no TF32 engine may run
  FusedConvGenstats op(be.context());
  std::string unsupported;
  uint64_t seed = 500;
  for (const ConvGeom& g : {kSmall[0], kSmall[2]})
    for (bool prologue : {true, false}) {
      const Operands o = operands(g, seed += 10, true);
      const std::string what = gpu::geom_str(g) + (prologue ? " prologue" : " plain") + " fp32";
      Outcome out;
      try {
        out = run_fp32(op, o, prologue);
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(gpu::geom_str(g)), std::string::npos) << e.what();
        unsupported += "\n" + what + ": " + e.what();
        continue;
      }
      std::printf("%s -> %s\n", what.c_str(), out.plan.c_str());
      expect_matches(out, reference(o, prologue), g, {0, 0}, what);
    }
  if (!unsupported.empty())
    std::printf("fp32 fused patterns cuDNN declined:%s\n", unsupported.c_str());
}

// ---- ResNet-18's geometries at batch 256
// ----------------------------------------------------------

// Every fusion site builds a plan, or reports clearly (a dpt::Error naming the geometry) that
// cuDNN has none; where it runs, its statistics agree with its own y (the host sums y as
// returned: each within the y-rounding of the epilogue's values, M = 200704 rows at most).
TEST(FusedConv, ResNet18GeometriesBuildOrReportUnsupported) {
  SKIP_WITHOUT_GPU();
  gpu::CudaBackend be(0);
  FusedConvGenstats op(be.context());
  std::printf(
      "| site | geometry | pattern | plan | ms | candidates |\n|---|---|---|---|---|---|\n");
  int ran = 0;
  for (const gpu::FusionSite& site : gpu::resnet18_fusion_sites(256)) {
    const ConvGeom& g = site.g;
    const size_t nx = x_size(g), ny = y_size(g);
    Rng r(600 + static_cast<uint64_t>(g.h * g.c_out));
    std::vector<uint16_t> hx(nx), hw(w_size(g));
    for (uint16_t& v : hx) v = bf16_from_float(static_cast<float>(r.uniform(-1, 1)));
    const double fan = std::sqrt(static_cast<double>(g.c_in * g.k * g.k));
    for (uint16_t& v : hw) v = bf16_from_float(static_cast<float>(r.uniform(-1, 1) / fan));
    Dev<uint16_t> x(hx), w(hw), y(ny);
    Dev<float> s(std::vector<float>(count(g.c_in), 1.5f)),
        b(std::vector<float>(count(g.c_in), -0.25f)), sum(count(g.c_out)), sq(count(g.c_out));
    const char* pattern = site.prologue ? "scale-bias-relu-conv-genstats" : "conv-genstats";
    try {
      op.forward_bf16(g, bf(x.p), site.prologue ? s.p : nullptr, site.prologue ? b.p : nullptr,
                      bf(w.p), bf(y.p), sum.p, sq.p);
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(gpu::geom_str(g)), std::string::npos)
          << "the refusal does not name the geometry: " << msg;
      std::printf("| %s | %s | %s | unsupported | | |\n", site.name, gpu::geom_str(g).c_str(),
                  pattern);
      std::printf("  (%s)\n", msg.c_str());
      continue;
    }
    ++ran;
    const std::vector<float> gy = from_bf16(y.host()), gs = sum.host(), gq = sq.host();
    const size_t c_out = count(g.c_out);
    std::vector<double> hs(c_out, 0), hq(c_out, 0), habs(c_out, 0);
    for (size_t i = 0; i < ny; ++i) {
      hs[i % c_out] += gy[i];
      hq[i % c_out] += double(gy[i]) * gy[i];
      habs[i % c_out] += std::fabs(gy[i]);
    }
    const double rows = static_cast<double>(g.n * g.oh() * g.ow()) * 0x1p-24;
    int shown = 0;
    for (size_t c = 0; c < c_out && shown < 3; ++c) {
      const double bs = 0x1p-8 * habs[c] + rows * habs[c], bq = 0x1p-7 * hq[c] + rows * hq[c];
      if (std::fabs(gs[c] - hs[c]) > bs || std::fabs(gq[c] - hq[c]) > bq) {
        ++shown;
        ADD_FAILURE() << site.name << " " << gpu::geom_str(g) << " channel " << c << ": sum "
                      << gs[c] << " vs " << hs[c] << " of its y (bound " << bs << "), sqsum "
                      << gq[c] << " vs " << hq[c] << " (bound " << bq << ")";
      }
    }
    for (const FusedConvGenstats::Choice& c : op.choices())
      if (c.key == gpu::geom_str(g) + " " + pattern + " bf16")
        std::printf("| %s | %s | %s | %s | %.3f | %d |\n", site.name, gpu::geom_str(g).c_str(),
                    pattern, c.plan.c_str(), c.ms, c.candidates);
  }
  std::printf("%d of %zu ResNet-18 fusion sites ran fused\n", ran,
              gpu::resnet18_fusion_sites(256).size());
}

}  // namespace
}  // namespace dpt
