// Every loop dispatched by instruction-set level (src/cpu/isa.h) run at each level this CPU can
// execute, against the generic x86-64 copy: the hand-written loops of ops.h bit for bit, the
// Winograd passes bit for bit between AVX2 and AVX-512 and within a stated bound of the generic
// copy. (The suites ops, gradcheck and backend_ops also run whole with DPT_ISA=avx2 and =generic:
// tests/meson.build.) Plus the level's names, DPT_ISA parsing and the test override.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cpu/isa.h"
#include "cpu/ops.h"
#include "cpu/winograd.h"
#include "dpt/error.h"
#include "test_util.h"

namespace dpt {
namespace {

using cpu::Isa;

// The levels this machine runs, lowest first (always generic).
std::vector<Isa> runnable_levels() {
  std::vector<Isa> out;
  for (Isa isa : cpu::kAllIsas)
    if (isa <= cpu::cpu_isa()) out.push_back(isa);
  return out;
}

std::vector<float> random_floats(int64_t n, std::mt19937_64& g) {
  std::vector<float> v(static_cast<size_t>(n));
  test::fill_uniform(v.data(), n, g);
  return v;
}

// Named outputs of one run, as bytes: what "bit for bit" compares.
using Outputs = std::map<std::string, std::vector<unsigned char>>;
template <class T>
void keep(Outputs& out, const std::string& name, const std::vector<T>& v) {
  auto& bytes = out[name];
  bytes.resize(v.size() * sizeof(T));
  std::memcpy(bytes.data(), v.data(), bytes.size());
}

// Every loop of ops.h that is not oneDNN's, on inputs whose channel counts leave vector tails at
// every width (1, 5, 20, 67), overlapping and non-overlapping pools, accumulation, both SGD
// forms: the same inputs at every level (fixed seed).
Outputs run_loops() {
  Outputs out;
  std::mt19937_64 g(11);
  for (int64_t c : {1, 5, 20, 67}) {
    const std::string tag = DPT_MSG("c" << c << " ");
    const int64_t n = 3, h = 7, w = 6, m = n * h * w, size = m * c;
    const auto x = random_floats(size, g), dy = random_floats(size, g), b = random_floats(size, g);
    std::vector<float> y(static_cast<size_t>(size)), y2(y.size());
    cpu::relu_forward(x.data(), y.data(), size);
    keep(out, tag + "relu_forward", y);
    cpu::relu_backward(x.data(), dy.data(), y.data(), size);
    keep(out, tag + "relu_backward", y);
    cpu::add(x.data(), b.data(), y.data(), size);
    keep(out, tag + "add", y);
    cpu::add_inplace(y.data(), dy.data(), size);
    keep(out, tag + "add_inplace", y);
    for (auto [k, s] : {std::pair{2, 2}, std::pair{3, 1}}) {
      const std::string pool = tag + "k" + std::to_string(k) + "s" + std::to_string(s) + " ";
      const int64_t pooled = n * ((h - k) / s + 1) * ((w - k) / s + 1) * c;
      std::vector<float> p(static_cast<size_t>(pooled));
      cpu::avgpool_forward(x.data(), p.data(), n, h, w, c, k, s);
      keep(out, pool + "avgpool_forward", p);
      cpu::relu_avgpool_forward(x.data(), p.data(), n, h, w, c, k, s);
      keep(out, pool + "relu_avgpool_forward", p);
      cpu::avgpool_backward(dy.data(), y.data(), n, h, w, c, k, s);  // dy's first `pooled` values
      keep(out, pool + "avgpool_backward", y);
      cpu::relu_avgpool_backward(x.data(), dy.data(), y.data(), n, h, w, c, k, s);
      keep(out, pool + "relu_avgpool_backward", y);
    }
    {  // torchvision's max-pool, 3/2/1
      const int64_t pooled = n * ((h + 2 - 3) / 2 + 1) * ((w + 2 - 3) / 2 + 1) * c;
      std::vector<float> p(static_cast<size_t>(pooled));
      cpu::maxpool_forward(x.data(), p.data(), n, h, w, c, 3, 2, 1);
      keep(out, tag + "maxpool_forward", p);
      cpu::maxpool_backward(x.data(), dy.data(), y.data(), n, h, w, c, 3, 2, 1);
      keep(out, tag + "maxpool_backward", y);
    }
    std::vector<float> gp(static_cast<size_t>(n * c));
    cpu::global_avgpool_forward(x.data(), gp.data(), n, h * w, c);
    keep(out, tag + "global_avgpool_forward", gp);
    cpu::global_avgpool_backward(dy.data(), y.data(), n, h * w, c);
    keep(out, tag + "global_avgpool_backward", y);

    std::vector<double> s1(static_cast<size_t>(c)), s2(s1.size());
    cpu::bn_sums(x.data(), m, c, s1.data(), s2.data());
    keep(out, tag + "bn_sums sum", s1);
    keep(out, tag + "bn_sums sumsq", s2);
    const auto mean = random_floats(c, g), gamma = random_floats(c, g), beta = random_floats(c, g);
    std::vector<float> invstd(static_cast<size_t>(c));
    for (auto& v : invstd) v = 0.5f + static_cast<float>(g() % 1000) / 1000.f;
    // Plain and with each fused part: the residual add (b) and the ReLU in the forward, the ReLU's
    // mask (its output: b) with and without storing dz in the backward.
    for (bool res : {false, true})
      for (bool relu : {false, true}) {
        cpu::bn_apply(x.data(), y.data(), mean.data(), invstd.data(), gamma.data(), beta.data(), m,
                      c, res ? b.data() : nullptr, relu);
        keep(out, tag + "bn_apply" + (res ? " residual" : "") + (relu ? " relu" : ""), y);
      }
    for (int mask = 0; mask < 3; ++mask) {  // none, masked, masked with dz stored
      const std::string form = mask == 0 ? "" : mask == 1 ? " masked" : " masked dz";
      const float* relu_out = mask > 0 ? b.data() : nullptr;
      cpu::bn_backward_sums(x.data(), dy.data(), relu_out, mean.data(), invstd.data(), m, c,
                            s1.data(), s2.data(), mask == 2 ? y2.data() : nullptr);
      keep(out, tag + "bn_backward_sums dy" + form, s1);
      keep(out, tag + "bn_backward_sums dy_xhat" + form, s2);
      if (mask == 2) keep(out, tag + "bn_backward_sums dz", y2);
      // As CpuBatchNorm does: the stored dz, else dy masked again on the fly.
      cpu::bn_backward_apply(x.data(), mask == 2 ? y2.data() : dy.data(),
                             mask == 1 ? relu_out : nullptr, mean.data(), invstd.data(),
                             gamma.data(), s1.data(), s2.data(), static_cast<double>(2 * m), m, c,
                             y.data());
      keep(out, tag + "bn_backward_apply" + form, y);
    }

    std::vector<float> cols(static_cast<size_t>(c), 0.25f);
    cpu::column_sums(x.data(), m, c, cols.data(), false);
    cpu::column_sums(dy.data(), m, c, cols.data(), true);
    keep(out, tag + "column_sums", cols);
    cpu::nhwc_to_chw(x.data(), y.data(), n, h, w, c);
    keep(out, tag + "nhwc_to_chw", y);
    for (auto [k, s, pad] : {std::tuple{3, 1, 1}, std::tuple{5, 2, 2}}) {
      const std::string conv = tag + "k" + std::to_string(k) + "s" + std::to_string(s) + " ";
      const int64_t oh = (h + 2 * pad - k) / s + 1, ow = (w + 2 * pad - k) / s + 1;
      std::vector<float> col(static_cast<size_t>(n * oh * ow * k * k * c));
      cpu::im2col_nhwc(x.data(), n, h, w, c, k, s, pad, col.data());
      keep(out, conv + "im2col_nhwc", col);
      for (size_t i = 0; i < col.size(); ++i) col[i] += static_cast<float>(i % 7) * 0.125f;
      cpu::col2im_nhwc(col.data(), n, h, w, c, k, s, pad, y.data());
      keep(out, conv + "col2im_nhwc", y);
    }
    cpu::chw_to_nhwc(x.data(), y.data(), n, h, w, c);
    keep(out, tag + "chw_to_nhwc", y);
  }
  const int64_t np = 1003;  // not a multiple of any vector width
  const auto grad = random_floats(np, g);
  for (float momentum : {0.f, 0.9f})
    for (float coef : {1.f, 0.37f}) {
      auto p = random_floats(np, g), buf = random_floats(np, g);
      cpu::sgd_update(p.data(), grad.data(), buf.data(), np, 0.05f, momentum, 5e-4f, momentum > 0,
                      coef);
      cpu::sgd_update(p.data(), grad.data(), buf.data(), np, 0.05f, momentum, 5e-4f, false, coef);
      keep(out, "sgd m" + std::to_string(momentum) + " coef" + std::to_string(coef) + " p", p);
      keep(out, "sgd m" + std::to_string(momentum) + " coef" + std::to_string(coef) + " buf", buf);
    }
  // The recipe options' loops (Nesterov SGD, AdamW), which must give every rank the same bits too.
  for (float coef : {1.f, 0.37f}) {
    const std::string c = " coef" + std::to_string(coef);
    auto p = random_floats(np, g), buf = random_floats(np, g);
    for (bool first : {true, false})
      cpu::sgd_update(p.data(), grad.data(), buf.data(), np, 0.05f, 0.9f, 5e-4f, first, coef, true);
    keep(out, "nesterov" + c + " p", p);
    keep(out, "nesterov" + c + " buf", buf);
    auto q = random_floats(np, g);
    std::vector<float> m(static_cast<size_t>(np)), v(static_cast<size_t>(np));
    for (int t = 1; t <= 2; ++t)
      cpu::adamw_update(q.data(), grad.data(), m.data(), v.data(), np,
                        cpu::adamw_scalars(0.01, t, 0.9, 0.999, 1e-8, 0.01, coef));
    keep(out, "adamw" + c + " p", q);
    keep(out, "adamw" + c + " exp_avg", m);
    keep(out, "adamw" + c + " exp_avg_sq", v);
  }
  keep(out, "sum_squares", std::vector<double>{cpu::sum_squares(grad.data(), np)});
  const int64_t rows = 37, classes = 10;
  const auto logits = random_floats(rows * classes, g);
  std::vector<int32_t> labels(static_cast<size_t>(rows));
  for (auto& l : labels) l = static_cast<int32_t>(g() % classes);
  std::vector<float> dlogits(static_cast<size_t>(rows * classes));
  int64_t hits = 0;
  const double loss = cpu::softmax_xent(logits.data(), labels.data(), rows, classes, 1.f / 256,
                                        dlogits.data(), &hits);
  keep(out, "softmax_xent loss, hits", std::vector<double>{loss, static_cast<double>(hits)});
  keep(out, "softmax_xent dlogits", dlogits);
  const double smoothed = cpu::softmax_xent(logits.data(), labels.data(), rows, classes, 1.f / 256,
                                            dlogits.data(), &hits, 0.1f);
  keep(out, "softmax_xent smoothed loss", std::vector<double>{smoothed});
  keep(out, "softmax_xent smoothed dlogits", dlogits);
  return out;
}

TEST(Isa, NamesParseBackAndUnknownIsAnInputError) {
  for (Isa isa : cpu::kAllIsas) EXPECT_EQ(cpu::parse_isa(cpu::isa_name(isa)), isa);
  try {
    cpu::parse_isa("avx-512");
    FAIL() << "an unknown level was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("DPT_ISA=avx-512"), std::string::npos) << e.what();
  }
}

TEST(Isa, ActiveLevelIsRunnableAndTheOverrideIsScoped) {
  const Isa before = cpu::active_isa();
  EXPECT_LE(before, cpu::cpu_isa());
  for (Isa isa : runnable_levels()) {
    cpu::ScopedIsa scoped(isa);
    EXPECT_EQ(cpu::active_isa(), isa);
    EXPECT_NE(cpu::isa_report().find(std::string(cpu::isa_name(isa)) +
                                     " (CPU: " + cpu::isa_name(cpu::cpu_isa())),
              std::string::npos)
        << cpu::isa_report();
  }
  EXPECT_EQ(cpu::active_isa(), before);
  if (cpu::cpu_isa() < Isa::kAvx512) {
    EXPECT_ANY_THROW(cpu::ScopedIsa too_high(Isa::kAvx512));
  }
}

// The loops keep lanes independent and sums in a fixed order, and none contracts a multiply and an
// add into an FMA (ops_loops.inc), so every level must give the generic copy's bits.
TEST(IsaLoops, EveryLevelGivesTheGenericBits) {
  Outputs generic;
  {
    cpu::ScopedIsa scoped(Isa::kGeneric);
    generic = run_loops();
  }
  for (Isa isa : runnable_levels()) {
    cpu::ScopedIsa scoped(isa);
    const Outputs got = run_loops();
    ASSERT_EQ(got.size(), generic.size());
    for (const auto& [name, bytes] : generic)
      EXPECT_TRUE(got.at(name) == bytes) << name << " differs at " << cpu::isa_name(isa);
  }
  std::printf("levels run: %zu (up to %s)\n", runnable_levels().size(),
              cpu::isa_name(cpu::cpu_isa()));
}

// The Winograd passes at every level on shapes with vector tails (channels 17, 33, 24) and
// every tile size the models use (F(4,3) / F(3,4)) or the tables offer (F(2,3), F(2,5), F(4,5)).
// AVX2 and AVX-512 run the same operations lane by lane with the same FMAs: equal bits. The
// generic copy rounds each product before adding it; every copy is within 2e-5 of the output
// scale of the exact result (tests/unit/test_ops.cc, Winograd.EveryTileSizeMatchesDirectLoops,
// which also runs at each level), so two copies differ by at most 4e-5 of it.
TEST(IsaWinograd, SameBitsOnAvx2AndAvx512AndWithinTheBoundOfGeneric) {
  struct Case {
    int64_t n, hw, cin, cout, k, pad;
    int m, mw;
  } cases[] = {{2, 9, 17, 33, 3, 1, 4, 4},
               {3, 7, 24, 17, 3, 1, 4, 4},
               {2, 6, 33, 24, 3, 0, 2, 4},
               {1, 11, 17, 20, 5, 2, 4, 4},
               {2, 9, 20, 17, 5, 0, 2, 2}};
  bool any_rounding_difference = false;
  for (const Case& c : cases) {
    SCOPED_TRACE("cin " + std::to_string(c.cin) + " cout " + std::to_string(c.cout) + " k " +
                 std::to_string(c.k) + " m " + std::to_string(c.m) + " mw " + std::to_string(c.mw));
    const cpu::ConvGeom geo{c.n, c.hw, c.hw, c.cin, c.cout, c.k, 1, c.pad};
    std::mt19937_64 g(5);
    const auto x = random_floats(geo.n * geo.h * geo.w * geo.c_in, g);
    const auto w = random_floats(geo.c_out * geo.c_in * geo.k * geo.k, g);
    const auto b = random_floats(geo.c_out, g);
    const auto dy = random_floats(geo.n * geo.oh() * geo.ow() * geo.c_out, g);
    auto run = [&](Isa isa) {
      cpu::ScopedIsa scoped(isa);
      cpu::WinogradConv wc;
      std::vector<float> y(dy.size()), dx(x.size()), dw(w.size(), 0.5f);
      wc.forward(geo, c.m, x.data(), w.data(), b.data(), y.data());
      wc.backward_data(geo, c.m, w.data(), dy.data(), dx.data());
      wc.backward_weights(geo, c.mw, x.data(), dy.data(), dw.data(), true);
      std::vector<std::vector<float>> all{y, dx, dw};
      return all;
    };
    const auto generic = run(Isa::kGeneric);
    std::vector<std::vector<float>> fma;  // the first FMA level's result
    for (Isa isa : runnable_levels()) {
      if (isa == Isa::kGeneric) continue;
      const auto got = run(isa);
      if (fma.empty()) fma = got;
      for (size_t part = 0; part < got.size(); ++part) {
        const char* what[] = {"y", "dx", "dw"};
        EXPECT_TRUE(got[part] == fma[part])
            << what[part] << " differs between FMA levels at " << cpu::isa_name(isa);
        double scale = 0, worst = 0;
        for (float v : generic[part]) scale = std::max(scale, std::fabs(static_cast<double>(v)));
        for (size_t i = 0; i < got[part].size(); ++i)
          worst = std::max(worst, std::fabs(static_cast<double>(got[part][i]) - generic[part][i]));
        EXPECT_LE(worst, 4e-5 * scale)
            << what[part] << " at " << cpu::isa_name(isa) << " vs generic";
        any_rounding_difference |= worst > 0;
      }
    }
  }
  // FMA and separate rounding give some different bits on these inputs: proof that the override
  // really switched the code that ran.
  if (cpu::cpu_isa() >= Isa::kAvx2) {
    EXPECT_TRUE(any_rounding_difference);
  }
}

}  // namespace
}  // namespace dpt
