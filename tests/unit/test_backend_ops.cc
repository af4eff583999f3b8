// test-backend-ops (ggml's harness is the model): every operation of the Backend interface and
// every layer, run on each backend ("cpu"; "cuda" in GPU builds with a visible device, else skipped
// with the reason) against independent references: direct loops and double-precision formulas
// written here, the same layer on the CPU backend, and central finite differences.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "dpt/backend.h"
#include "dpt/device.h"
#include "dpt/error.h"
#include "dpt/models.h"
#include "dpt/nn.h"
#include "dpt/tensor.h"
#include "test_util.h"
#ifdef DPT_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace dpt {
namespace {

using test::to_backend;
using test::to_backend_array;
using test::to_host;

std::vector<float> uniform(size_t n, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}
size_t sz(int64_t n) { return static_cast<size_t>(n); }
std::vector<double> as_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// ---- comparisons --------------------------------------------------------------------------------

// How a result is held to its reference. kExact: the reference does the same float arithmetic
// (copies, selections, one add), == on every backend. kOrdered: the reference sums in the CPU's
// order (pooling), == on the CPU; a device kernel may sum in another order, so the floors below.
// kApprox: |got - ref| <= rel * max|ref| + abs, rel 1e-4 (abs 0) on the CPU, 1e-4 and an absolute
// floor of 1e-5 elsewhere (test_gpu_ops.cc's scale).
enum class Cmp { kExact, kOrdered, kApprox };
struct Tol {
  bool exact;
  double rel, abs;
};

// Element-wise comparison; reports the first few mismatches (`where` names an index) and fails
// when the reference is all zeros for an approximate check (it could not tell wrong from right).
void expect_match(const std::vector<float>& got, const std::vector<double>& ref,
                  const std::string& what, Tol t,
                  const std::function<std::string(size_t)>& where = {}) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double scale = 0;
  for (double r : ref) scale = std::max(scale, std::fabs(r));
  if (!t.exact) {
    EXPECT_GT(scale, 0.0) << what << ": the reference is all zeros";
  }
  const double tol = t.rel * scale + t.abs;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i];
    const bool ok = t.exact ? g == ref[i] : std::fabs(g - ref[i]) <= tol;
    if (ok) continue;
    if (++bad <= 5)
      ADD_FAILURE() << what << ": index " << i << (where ? " (" + where(i) + ")" : std::string())
                    << " got " << g << ", expected " << ref[i]
                    << (t.exact ? " exactly" : ", tolerance " + std::to_string(tol));
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " values differ";
}
void expect_match(const std::vector<float>& got, const std::vector<float>& ref,
                  const std::string& what, Tol t) {
  expect_match(got, as_double(ref), what, t);
}

// ---- the backends -------------------------------------------------------------------------------

// One CUDA backend for the whole suite (a context per test would cost more than the tests).
std::unique_ptr<Backend>& shared_cuda() {
  static std::unique_ptr<Backend> be;
  return be;
}

class BackendOps : public ::testing::TestWithParam<std::string> {
 public:
  static void TearDownTestSuite() { shared_cuda().reset(); }

 protected:
  void SetUp() override {
    if (GetParam() == "cpu") {
      be_ = &cpu_backend();
      return;
    }
    ASSERT_EQ(GetParam(), "cuda");
#ifdef DPT_HAVE_CUDA
    if (cuda_device_count() == 0) GTEST_SKIP() << "cuda: no CUDA device visible";
    if (!shared_cuda()) shared_cuda() = std::make_unique<gpu::CudaBackend>(0);
    be_ = shared_cuda().get();
#else
    GTEST_SKIP() << "cuda: this build has no CUDA backend (configure with -Dgpu=enabled)";
#endif
  }
  Backend& be() { return *be_; }
  bool is_cpu() const { return be_->name() == "cpu"; }
  Tol tol(Cmp c) const {
    if (c == Cmp::kExact || (c == Cmp::kOrdered && is_cpu())) return {true, 0, 0};
    return is_cpu() ? Tol{false, 1e-4, 0} : Tol{false, 1e-4, 1e-5};
  }
  // A float array of backend memory holding v, and its values back on the host.
  DeviceArray<float> put(const std::vector<float>& v) { return to_backend_array(be(), v); }
  static std::vector<float> get(const DeviceArray<float>& a) { return to_host(a); }

  // One BatchNorm training forward and backward (not accumulating) through `hook` on fresh buffers:
  // running statistics 0 and 1, outputs prefilled with 7 so an unwritten value shows.
  struct SyncedBn {
    std::vector<float> y, rm, rv, dx, dg, db;
  };
  SyncedBn synced_bn(int64_t c, int64_t m, double eps, const std::vector<float>& x,
                     const std::vector<float>& dy, const std::vector<float>& gamma,
                     const std::vector<float>& beta, const ChannelSumFn& hook) {
    const size_t xs = x.size(), cs = static_cast<size_t>(c);
    auto x_ = put(x), dy_ = put(dy), g_ = put(gamma), b_ = put(beta);
    auto rm_ = put(std::vector<float>(cs, 0.f)), rv_ = put(std::vector<float>(cs, 1.f));
    auto y_ = put(std::vector<float>(xs, 7.f)), dx_ = put(std::vector<float>(xs, 7.f));
    auto dg_ = put(std::vector<float>(cs, 7.f)), db_ = put(std::vector<float>(cs, 7.f));
    const std::unique_ptr<BatchNormOp> bn = be().make_batchnorm(c, 0.1, eps);
    bn->forward_train(x_.data(), y_.data(), m, g_.data(), b_.data(), rm_.data(), rv_.data(),
                      nullptr, hook, nullptr, false);
    bn->backward(x_.data(), dy_.data(), dx_.data(), m, g_.data(), dg_.data(), db_.data(), false,
                 hook, nullptr, nullptr);
    return {get(y_), get(rm_), get(rv_), get(dx_), get(dg_), get(db_)};
  }

  // BatchNormPassesGiveTheSameBitsAtAnyAlignment at one shape.
  void bn_same_bits_at_any_alignment(int64_t c, int64_t m);

  Backend* be_ = nullptr;
};

// ---- memory -------------------------------------------------------------------------------------

TEST_P(BackendOps, AllocateIsZeroedAndAligned) {
  const size_t n = 1000, bytes = n * sizeof(float);
  const std::vector<float> garbage(n, 7.f);
  // A block that held values and was released is likely handed out again: it must come back zeroed.
  void* used = be().allocate(bytes);
  be().copy_from_host(used, garbage.data(), bytes);
  be().release(used);
  for (size_t b : {bytes, size_t{13}, size_t{64}}) {
    SCOPED_TRACE("bytes " + std::to_string(b));
    void* p = be().allocate(b);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
    std::vector<uint8_t> h(b, 0xAB);
    be().copy_to_host(h.data(), p, b);
    EXPECT_EQ(h, std::vector<uint8_t>(b, 0));
    be().release(p);
  }
}

TEST_P(BackendOps, CopyZeroAndHostRoundTrip) {
  const size_t n = 777, bytes = n * sizeof(float);
  const std::vector<float> v = uniform(n, 1);
  auto* a = static_cast<float*>(be().allocate(bytes));
  auto* b = static_cast<float*>(be().allocate(bytes));
  be().copy_from_host(a, v.data(), bytes);
  std::vector<float> h(n, -1.f);
  be().copy_to_host(h.data(), a, bytes);
  EXPECT_EQ(h, v) << "copy_from_host then copy_to_host";
  be().copy(b, a, bytes);
  be().copy_to_host(h.data(), b, bytes);
  EXPECT_EQ(h, v) << "copy within backend memory";
  // Sub-ranges: offsets on both sides, and zero() of a middle slice only.
  be().copy(b + 10, a + 500, 100 * sizeof(float));
  be().zero(a + 200, 50 * sizeof(float));
  std::vector<float> want_a = v, want_b = v;
  std::fill(want_a.begin() + 200, want_a.begin() + 250, 0.f);
  std::copy(v.begin() + 500, v.begin() + 600, want_b.begin() + 10);
  be().copy_to_host(h.data(), a, bytes);
  EXPECT_EQ(h, want_a) << "zero of a slice";
  be().copy_to_host(h.data(), b, bytes);
  EXPECT_EQ(h, want_b) << "copy between offsets";
  std::vector<float> part(30);
  be().copy_to_host(part.data(), b + 5, part.size() * sizeof(float));
  EXPECT_EQ(part, std::vector<float>(want_b.begin() + 5, want_b.begin() + 35))
      << "copy_to_host from an offset";
  be().copy_from_host(b + 700, v.data(), 5 * sizeof(float));
  be().copy_to_host(h.data(), b, bytes);
  std::copy(v.begin(), v.begin() + 5, want_b.begin() + 700);
  EXPECT_EQ(h, want_b) << "copy_from_host to an offset";
  be().release(a);
  be().release(b);
  // The test helpers and Tensor storage go through the same calls.
  Tensor t = to_backend(be(), v, {7, 111});
  EXPECT_EQ(t.backend(), &be());
  EXPECT_EQ(to_host(be(), t), v);
  t.zero();
  EXPECT_EQ(to_host(be(), t), std::vector<float>(n, 0.f));
}

TEST_P(BackendOps, DeviceArrayMirrorViewsHostMemoryElseCopies) {
  std::vector<uint8_t> host(300);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint8_t>(i * 7 + 3);
  const std::vector<uint8_t> orig = host;
  DeviceArray<uint8_t> m =
      DeviceArray<uint8_t>::mirror(be(), host.data(), static_cast<int64_t>(host.size()));
  EXPECT_EQ(m.size(), static_cast<int64_t>(host.size()));
  EXPECT_EQ(to_host(m), orig);
  host[5] = 0;  // a view sees the change, a copy does not
  if (be().host_memory()) {
    EXPECT_EQ(m.data(), host.data()) << "a host backend's mirror is a view";
    EXPECT_EQ(to_host(m)[5], 0);
  } else {
    EXPECT_NE(m.data(), host.data()) << "a device backend's mirror is a copy";
    EXPECT_EQ(to_host(m), orig);
  }
  // Owned arrays are zero-filled, move-only, and move their storage.
  DeviceArray<int64_t> z(be(), 9);
  EXPECT_EQ(to_host(z), std::vector<int64_t>(9, 0));
  z.copy_from_host(std::vector<int64_t>{4, 5}.data(), 2, 3);
  int64_t* p = z.data();
  DeviceArray<int64_t> moved(std::move(z));
  EXPECT_EQ(moved.data(), p);
  EXPECT_EQ(z.data(), nullptr);
  EXPECT_EQ(z.size(), 0);
  EXPECT_EQ(to_host(moved), (std::vector<int64_t>{0, 0, 0, 4, 5, 0, 0, 0, 0}));
}

// ---- convolution --------------------------------------------------------------------------------

// Direct convolution in double over NHWC x [n,h,w,cin], OIHW w: y, and for dy the gradients dx,
// dw and db (the loops of the definition, nothing shared with the backends).
struct ConvRef {
  std::vector<double> y, dx, dw, db;
};
ConvRef conv_reference(const ConvGeom& g, const std::vector<float>& x, const std::vector<float>& w,
                       const float* b, const std::vector<float>& dy) {
  const int64_t oh = g.oh(), ow = g.ow();
  ConvRef r;
  r.y.assign(sz(g.n * oh * ow * g.c_out), 0.0);
  r.dx.assign(x.size(), 0.0);
  r.dw.assign(w.size(), 0.0);
  r.db.assign(sz(g.c_out), 0.0);
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j)
        for (int64_t co = 0; co < g.c_out; ++co) {
          const size_t yi = sz(((n * oh + i) * ow + j) * g.c_out + co);
          double acc = b ? b[co] : 0.0;
          const double d = dy[yi];
          r.db[sz(co)] += d;
          for (int64_t ci = 0; ci < g.c_in; ++ci)
            for (int64_t kh = 0; kh < g.k; ++kh)
              for (int64_t kw = 0; kw < g.k; ++kw) {
                const int64_t hi = i * g.stride - g.pad + kh, wi = j * g.stride - g.pad + kw;
                if (hi < 0 || hi >= g.h || wi < 0 || wi >= g.w) continue;
                const size_t xi = sz(((n * g.h + hi) * g.w + wi) * g.c_in + ci);
                const size_t wk = sz(((co * g.c_in + ci) * g.k + kh) * g.k + kw);
                acc += static_cast<double>(x[xi]) * w[wk];
                r.dx[xi] += d * w[wk];
                r.dw[wk] += d * x[xi];
              }
          r.y[yi] = acc;
        }
  return r;
}

TEST_P(BackendOps, ConvForwardBackward) {
  struct Case {
    const char* name;
    ConvGeom g;  // n, h, w, c_in, c_out, k, stride, pad
    bool bias;
  };
  const Case cases[] = {
      {"3x3 s1 p0", {2, 6, 5, 3, 4, 3, 1, 0}, true},
      {"3x3 s2 p1, odd width", {2, 7, 8, 3, 5, 3, 2, 1}, true},
      {"3x3 s1 p1, 16 channels (the CPU's Winograd shape)", {1, 5, 6, 16, 16, 3, 1, 1}, false},
      {"1x1 s1", {2, 4, 4, 6, 5, 1, 1, 0}, true},
      {"1x1 s2, odd size", {2, 7, 7, 4, 6, 1, 2, 0}, false},
      {"5x5 p2, no bias", {2, 6, 6, 2, 3, 5, 1, 2}, false},
      {"5x5 p0", {2, 9, 8, 2, 3, 5, 1, 0}, true},
      // LeNet's conv2 at batch 24: the CPU's im2col + sgemm backward takes blocks of 19 images
      // (conv.cc), so its weight gradient is the sum over two blocks.
      {"5x5 p0, 24 images (two of the sgemm path's blocks)", {24, 13, 13, 20, 6, 5, 1, 0}, true},
  };
  uint64_t seed = 100;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const ConvGeom& g = c.g;
    const size_t xs = sz(g.n * g.h * g.w * g.c_in), ys = sz(g.n * g.oh() * g.ow() * g.c_out);
    const size_t ws = sz(g.c_out * g.c_in * g.k * g.k), bs = sz(g.c_out);
    const auto x = uniform(xs, ++seed), w = uniform(ws, ++seed, -0.5f, 0.5f),
               b = uniform(bs, ++seed);
    const auto dy = uniform(ys, ++seed), dw0 = uniform(ws, ++seed), db0 = uniform(bs, ++seed);
    const ConvRef ref = conv_reference(g, x, w, c.bias ? b.data() : nullptr, dy);

    auto x_ = put(x), w_ = put(w), b_ = put(b), dy_ = put(dy);
    auto y_ = put(std::vector<float>(ys, 7.f)), dx_ = put(std::vector<float>(xs, 7.f));
    auto dw_ = put(std::vector<float>(ws, 7.f)), db_ = put(std::vector<float>(bs, 7.f));
    auto dwa_ = put(dw0), dba_ = put(db0);
    const std::unique_ptr<ConvOp> op = be().make_conv();
    op->forward(g, x_.data(), w_.data(), c.bias ? b_.data() : nullptr, y_.data());
    op->backward(g, x_.data(), w_.data(), dy_.data(), dx_.data(), dw_.data(),
                 c.bias ? db_.data() : nullptr, false);
    op->backward(g, x_.data(), w_.data(), dy_.data(), nullptr, dwa_.data(),
                 c.bias ? dba_.data() : nullptr, true);
    expect_match(get(y_), ref.y, "y", tol(Cmp::kApprox));
    expect_match(get(dx_), ref.dx, "dx (overwritten)", tol(Cmp::kApprox));
    expect_match(get(dw_), ref.dw, "dw (overwritten)", tol(Cmp::kApprox));
    std::vector<double> dw_acc(ws), db_acc(bs);
    for (size_t i = 0; i < ws; ++i) dw_acc[i] = dw0[i] + ref.dw[i];
    for (size_t i = 0; i < bs; ++i) db_acc[i] = db0[i] + ref.db[i];
    expect_match(get(dwa_), dw_acc, "dw accumulated (dx null)", tol(Cmp::kApprox));
    if (c.bias) {
      expect_match(get(db_), ref.db, "db (overwritten)", tol(Cmp::kApprox));
      expect_match(get(dba_), db_acc, "db accumulated (dx null)", tol(Cmp::kApprox));
    }
    // The same op at another batch size (plans are cached per geometry): the first image alone.
    ConvGeom g1 = g;
    g1.n = 1;
    auto y1_ = put(std::vector<float>(ys / sz(g.n), 7.f));
    op->forward(g1, x_.data(), w_.data(), c.bias ? b_.data() : nullptr, y1_.data());
    expect_match(
        get(y1_),
        std::vector<double>(ref.y.begin(), ref.y.begin() + static_cast<int64_t>(ys / sz(g.n))),
        "y at batch 1 on the same op", tol(Cmp::kApprox));
    if (HasFatalFailure()) return;
  }
}

// ---- batch normalisation ------------------------------------------------------------------------

// Per-channel sums of x and x^2 over the rows of an [m, c] array, in double.
void channel_sums(const std::vector<float>& x, int64_t c, std::vector<double>& sum,
                  std::vector<double>& sumsq) {
  sum.assign(sz(c), 0.0);
  sumsq.assign(sz(c), 0.0);
  for (size_t i = 0; i < x.size(); ++i) {
    sum[i % sz(c)] += x[i];
    sumsq[i % sz(c)] += static_cast<double>(x[i]) * x[i];
  }
}

// BatchNorm's formulas in double, for statistics (mean, biased var) taken over `count` rows.
struct BnRef {
  std::vector<double> mean, var, invstd;
  double count = 0;
  BnRef(const std::vector<double>& sum, const std::vector<double>& sumsq, double n, double eps)
      : mean(sum.size()), var(sum.size()), invstd(sum.size()), count(n) {
    for (size_t c = 0; c < sum.size(); ++c) {
      mean[c] = sum[c] / n;
      var[c] = sumsq[c] / n - mean[c] * mean[c];
      invstd[c] = 1.0 / std::sqrt(var[c] + eps);
    }
  }
  std::vector<double> apply(const std::vector<float>& x, const std::vector<float>& gamma,
                            const std::vector<float>& beta) const {
    const size_t c = mean.size();
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i)
      y[i] = (x[i] - mean[i % c]) * invstd[i % c] * gamma[i % c] + beta[i % c];
    return y;
  }
  // [sum dy, sum dy*xhat] over these rows (the layout of the backward sync hook's buffer).
  std::vector<double> backward_sums(const std::vector<float>& x,
                                    const std::vector<float>& dy) const {
    const size_t c = mean.size();
    std::vector<double> s(2 * c, 0.0);
    for (size_t i = 0; i < x.size(); ++i) {
      s[i % c] += dy[i];
      s[c + i % c] += dy[i] * (x[i] - mean[i % c]) * invstd[i % c];
    }
    return s;
  }
  // dx = gamma invstd (dy - sum_dy/count - xhat sum_dy_xhat/count) with `sums` over every replica.
  std::vector<double> dx(const std::vector<float>& x, const std::vector<float>& dy,
                         const std::vector<float>& gamma, const std::vector<double>& sums) const {
    const size_t c = mean.size();
    std::vector<double> d(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const size_t ch = i % c;
      const double xhat = (x[i] - mean[ch]) * invstd[ch];
      d[i] = gamma[ch] * invstd[ch] * (dy[i] - sums[ch] / count - xhat * sums[c + ch] / count);
    }
    return d;
  }
};

// Values with per-channel offsets and spreads, so the statistics are far from (0, 1).
std::vector<float> bn_input(size_t n, int64_t c, uint64_t seed) {
  std::vector<float> x = uniform(n, seed);
  const auto off = uniform(sz(c), seed + 1, -3.f, 3.f),
             spread = uniform(sz(c), seed + 2, 0.3f, 4.f);
  for (size_t i = 0; i < n; ++i) x[i] = off[i % sz(c)] + spread[i % sz(c)] * x[i];
  return x;
}

TEST_P(BackendOps, BatchNormTrainEvalBackward) {
  const int64_t c = 5, m = 3 * 4 * 4;  // N*H*W rows
  const double momentum = 0.1, eps = 1e-5;
  const size_t xs = sz(m * c), cs = sz(c);
  const auto x1 = bn_input(xs, c, 200), x2 = bn_input(xs, c, 210), dy = uniform(xs, 220);
  const auto gamma = uniform(cs, 221, 0.5f, 1.5f), beta = uniform(cs, 222);
  const auto rm0 = uniform(cs, 223), rv0 = uniform(cs, 224, 0.5f, 2.f);
  const auto d0 = uniform(cs, 225);  // prior gradients the accumulating backward adds to

  auto g_ = put(gamma), b_ = put(beta), rm_ = put(rm0), rv_ = put(rv0), nbt_ = put({0.f});
  auto x1_ = put(x1), x2_ = put(x2), dy_ = put(dy), y_ = put(std::vector<float>(xs, 7.f));
  auto dx_ = put(std::vector<float>(xs, 7.f)), dg_ = put(std::vector<float>(cs, 7.f)),
       db_ = put(std::vector<float>(cs, 7.f));
  const std::unique_ptr<BatchNormOp> bn = be().make_batchnorm(c, momentum, eps);

  // Two training steps: the batch statistics normalise; running statistics move twice (unbiased
  // variance), the counter reaches 2.
  std::vector<double> rm(rm0.begin(), rm0.end()), rv(rv0.begin(), rv0.end());
  std::vector<double> s, ss;
  channel_sums(x1, c, s, ss);
  const BnRef ref1(s, ss, static_cast<double>(m), eps);
  bn->forward_train(x1_.data(), y_.data(), m, g_.data(), b_.data(), rm_.data(), rv_.data(),
                    nbt_.data(), {}, nullptr, false);
  expect_match(get(y_), ref1.apply(x1, gamma, beta), "training y, step 1", tol(Cmp::kApprox));
  channel_sums(x2, c, s, ss);
  const BnRef ref2(s, ss, static_cast<double>(m), eps);
  bn->forward_train(x2_.data(), y_.data(), m, g_.data(), b_.data(), rm_.data(), rv_.data(),
                    nbt_.data(), {}, nullptr, false);
  expect_match(get(y_), ref2.apply(x2, gamma, beta), "training y, step 2", tol(Cmp::kApprox));
  for (const BnRef* r : {&ref1, &ref2})
    for (size_t ch = 0; ch < cs; ++ch) {
      rm[ch] = (1 - momentum) * rm[ch] + momentum * r->mean[ch];
      rv[ch] = (1 - momentum) * rv[ch] + momentum * r->var[ch] * m / (m - 1.0);
    }
  expect_match(get(rm_), rm, "running_mean", tol(Cmp::kApprox));
  expect_match(get(rv_), rv, "running_var (unbiased)", tol(Cmp::kApprox));
  EXPECT_EQ(get(nbt_), std::vector<float>{2.f});

  // Backward of step 2: overwrite with dx, then accumulate onto d0 without dx.
  const std::vector<double> sums = ref2.backward_sums(x2, dy);
  const std::vector<double> dbeta(sums.begin(), sums.begin() + c),
      dgamma(sums.begin() + c, sums.end());
  bn->backward(x2_.data(), dy_.data(), dx_.data(), m, g_.data(), dg_.data(), db_.data(), false, {},
               nullptr, nullptr);
  expect_match(get(dx_), ref2.dx(x2, dy, gamma, sums), "training dx", tol(Cmp::kApprox));
  expect_match(get(dg_), dgamma, "dgamma", tol(Cmp::kApprox));
  expect_match(get(db_), dbeta, "dbeta", tol(Cmp::kApprox));
  auto dga_ = put(d0), dba_ = put(d0);
  bn->backward(x2_.data(), dy_.data(), nullptr, m, g_.data(), dga_.data(), dba_.data(), true, {},
               nullptr, nullptr);
  std::vector<double> dg_acc(cs), db_acc(cs);
  for (size_t ch = 0; ch < cs; ++ch)
    dg_acc[ch] = d0[ch] + dgamma[ch], db_acc[ch] = d0[ch] + dbeta[ch];
  expect_match(get(dga_), dg_acc, "dgamma accumulated (dx null)", tol(Cmp::kApprox));
  expect_match(get(dba_), db_acc, "dbeta accumulated (dx null)", tol(Cmp::kApprox));

  // Evaluation: the running statistics (as the backend holds them) normalise and do not move; the
  // backward then treats them as constants: dx = dy gamma invstd, dgamma = sum dy xhat.
  const std::vector<float> rm_now = get(rm_), rv_now = get(rv_);
  std::vector<double> ev_mean(cs), ev_invstd(cs);
  std::vector<double> y_ev(xs), dx_ev(xs), dg_ev(cs, 0.0), db_ev(cs, 0.0);
  for (size_t i = 0; i < xs; ++i) {
    const size_t ch = i % cs;
    const double inv = 1.0 / std::sqrt(static_cast<double>(rv_now[ch]) + eps),
                 xhat = (x1[i] - rm_now[ch]) * inv;
    y_ev[i] = xhat * gamma[ch] + beta[ch];
    dx_ev[i] = dy[i] * gamma[ch] * inv;
    dg_ev[ch] += dy[i] * xhat;
    db_ev[ch] += dy[i];
  }
  bn->forward_eval(x1_.data(), y_.data(), m, g_.data(), b_.data(), rm_.data(), rv_.data(), nullptr,
                   false);
  expect_match(get(y_), y_ev, "eval y", tol(Cmp::kApprox));
  EXPECT_EQ(get(rm_), rm_now) << "eval moved running_mean";
  EXPECT_EQ(get(rv_), rv_now) << "eval moved running_var";
  EXPECT_EQ(get(nbt_), std::vector<float>{2.f}) << "eval moved num_batches_tracked";
  bn->backward(x1_.data(), dy_.data(), dx_.data(), m, g_.data(), dg_.data(), db_.data(), false, {},
               nullptr, nullptr);
  expect_match(get(dx_), dx_ev, "eval dx", tol(Cmp::kApprox));
  expect_match(get(dg_), dg_ev, "eval dgamma", tol(Cmp::kApprox));
  expect_match(get(db_), db_ev, "eval dbeta", tol(Cmp::kApprox));
}

// set_mean_shift (a folded convolution bias): the training forward of x normalises x as ever, and
// the running mean moves toward mean(x) + shift, as the forward of x + shift would move it; the
// running variance and backward do not see the shift.
TEST_P(BackendOps, BatchNormMeanShiftMovesOnlyTheRunningMean) {
  const int64_t c = 5, m = 3 * 4 * 4;
  const double momentum = 0.1, eps = 1e-5;
  const size_t xs = sz(m * c), cs = sz(c);
  const auto x = bn_input(xs, c, 230), dy = uniform(xs, 231);
  const auto gamma = uniform(cs, 232, 0.5f, 1.5f), beta = uniform(cs, 233);
  const auto rm0 = uniform(cs, 234), rv0 = uniform(cs, 235, 0.5f, 2.f);
  const auto shift = uniform(cs, 236, -2.f, 2.f);
  auto x_ = put(x), dy_ = put(dy), g_ = put(gamma), b_ = put(beta), s_ = put(shift);
  auto rm_ = put(rm0), rv_ = put(rv0), y_ = put(std::vector<float>(xs, 7.f));
  auto dx_ = put(std::vector<float>(xs, 7.f)), dg_ = put(std::vector<float>(cs, 7.f)),
       db_ = put(std::vector<float>(cs, 7.f));
  const std::unique_ptr<BatchNormOp> bn = be().make_batchnorm(c, momentum, eps);
  bn->set_mean_shift(s_.data());
  bn->forward_train(x_.data(), y_.data(), m, g_.data(), b_.data(), rm_.data(), rv_.data(), nullptr,
                    {}, nullptr, false);
  std::vector<double> s, ss;
  channel_sums(x, c, s, ss);
  const BnRef ref(s, ss, static_cast<double>(m), eps);
  expect_match(get(y_), ref.apply(x, gamma, beta), "training y (the unshifted x normalised)",
               tol(Cmp::kApprox));
  std::vector<double> rm(cs), rv(cs);
  for (size_t ch = 0; ch < cs; ++ch) {
    rm[ch] = (1 - momentum) * rm0[ch] + momentum * (ref.mean[ch] + shift[ch]);
    rv[ch] = (1 - momentum) * rv0[ch] + momentum * ref.var[ch] * m / (m - 1.0);
  }
  expect_match(get(rm_), rm, "running_mean (toward mean + shift)", tol(Cmp::kApprox));
  expect_match(get(rv_), rv, "running_var (shift-invariant)", tol(Cmp::kApprox));
  const std::vector<double> sums = ref.backward_sums(x, dy);
  bn->backward(x_.data(), dy_.data(), dx_.data(), m, g_.data(), dg_.data(), db_.data(), false, {},
               nullptr, nullptr);
  expect_match(get(dx_), ref.dx(x, dy, gamma, sums), "dx", tol(Cmp::kApprox));
  // Unset, the next forward moves the running mean toward mean(x) alone.
  bn->set_mean_shift(nullptr);
  bn->forward_train(x_.data(), y_.data(), m, g_.data(), b_.data(), rm_.data(), rv_.data(), nullptr,
                    {}, nullptr, false);
  for (size_t ch = 0; ch < cs; ++ch) rm[ch] = (1 - momentum) * rm[ch] + momentum * ref.mean[ch];
  expect_match(get(rm_), rm, "running_mean after set_mean_shift(nullptr)", tol(Cmp::kApprox));
}

// A ChannelSumFn standing in for the all-reduce over replicas: reads the backend's doubles, lets
// `combine` change them (the peer's contribution), writes them back; records each count.
ChannelSumFn host_hook(Backend& be, std::vector<int64_t>& seen,
                       std::function<void(std::vector<double>&, size_t call)> combine) {
  return [&be, &seen, combine](double* d, int64_t count) {
    std::vector<double> h(sz(count));
    be.copy_to_host(h.data(), d, h.size() * sizeof(double));
    combine(h, seen.size());
    seen.push_back(count);
    be.copy_from_host(d, h.data(), h.size() * sizeof(double));
  };
}

TEST_P(BackendOps, BatchNormSyncHookDoublingIsTheInputSeenTwice) {
  // Doubling every sum (the count too) is a replica holding the same data: the statistics are those
  // of x seen twice, so y and dx are unchanged, running_var's unbiased correction uses 2m rows, and
  // dgamma/dbeta stay this replica's own sums.
  const int64_t c = 4, m = 2 * 3 * 3;  // few rows: m/(m-1) and 2m/(2m-1) differ by 3%
  const double eps = 1e-5;
  const size_t xs = sz(m * c), cs = sz(c);
  const auto x = bn_input(xs, c, 300), dy = uniform(xs, 301), gamma = uniform(cs, 302, 0.5f, 1.5f);
  const auto beta = uniform(cs, 303);
  std::vector<int64_t> seen;
  const ChannelSumFn twice = host_hook(be(), seen, [](std::vector<double>& h, size_t) {
    for (double& v : h) v *= 2;
  });
  const SyncedBn r = synced_bn(c, m, eps, x, dy, gamma, beta, twice);
  ASSERT_EQ(seen, (std::vector<int64_t>{2 * c + 1, 2 * c}));

  std::vector<float> xx = x;  // x seen twice
  xx.insert(xx.end(), x.begin(), x.end());
  std::vector<double> s, ss;
  channel_sums(xx, c, s, ss);
  const BnRef ref(s, ss, 2.0 * m, eps);
  std::vector<double> rm(cs), rv(cs);
  for (size_t ch = 0; ch < cs; ++ch) {
    rm[ch] = 0.1 * ref.mean[ch];
    rv[ch] = 0.9 + 0.1 * ref.var[ch] * (2.0 * m) / (2.0 * m - 1);
  }
  const std::vector<double> local = ref.backward_sums(x, dy);
  std::vector<double> both = local;
  for (double& v : both) v *= 2;
  expect_match(r.y, ref.apply(x, gamma, beta), "synced y", tol(Cmp::kApprox));
  expect_match(r.rm, rm, "synced running_mean", tol(Cmp::kApprox));
  expect_match(r.rv, rv, "synced running_var (2m rows)", tol(Cmp::kApprox));
  expect_match(r.dx, ref.dx(x, dy, gamma, both), "synced dx", tol(Cmp::kApprox));
  expect_match(r.dg, std::vector<double>(local.begin() + c, local.end()), "synced dgamma (local)",
               tol(Cmp::kApprox));
  expect_match(r.db, std::vector<double>(local.begin(), local.begin() + c), "synced dbeta (local)",
               tol(Cmp::kApprox));
}

TEST_P(BackendOps, BatchNormSyncHookAddsAPeersStatistics) {
  // A peer replica with different data: its sums, added by the hook, must enter the statistics
  // (y normalised over both inputs) and the input gradient (dx uses both replicas' sums).
  const int64_t c = 3, m = 2 * 2 * 4;
  const double eps = 1e-5;
  const size_t xs = sz(m * c), cs = sz(c);
  const auto x = bn_input(xs, c, 310), peer = bn_input(xs, c, 320), dy = uniform(xs, 330),
             dyp = uniform(xs, 331);
  const auto gamma = uniform(cs, 332, 0.5f, 1.5f), beta = uniform(cs, 333);
  std::vector<double> s, ss, ps, pss;
  channel_sums(x, c, s, ss);
  channel_sums(peer, c, ps, pss);
  std::vector<double> ts(cs), tss(cs);
  for (size_t ch = 0; ch < cs; ++ch) ts[ch] = s[ch] + ps[ch], tss[ch] = ss[ch] + pss[ch];
  const BnRef ref(ts, tss, 2.0 * m, eps);
  const std::vector<double> peer_bwd = ref.backward_sums(peer, dyp),
                            local = ref.backward_sums(x, dy);
  std::vector<double> both(2 * cs);
  for (size_t i = 0; i < both.size(); ++i) both[i] = local[i] + peer_bwd[i];

  std::vector<int64_t> seen;
  const ChannelSumFn add_peer = host_hook(be(), seen, [&](std::vector<double>& h, size_t call) {
    if (call == 0) {
      ASSERT_EQ(h.size(), 2 * cs + 1);
      EXPECT_DOUBLE_EQ(h[2 * cs], static_cast<double>(m)) << "the row count";
      for (size_t ch = 0; ch < cs; ++ch) h[ch] += ps[ch], h[cs + ch] += pss[ch];
      h[2 * cs] += static_cast<double>(m);
    } else {
      ASSERT_EQ(h.size(), 2 * cs);
      for (size_t i = 0; i < h.size(); ++i) h[i] += peer_bwd[i];
    }
  });
  const SyncedBn r = synced_bn(c, m, eps, x, dy, gamma, beta, add_peer);
  ASSERT_EQ(seen, (std::vector<int64_t>{2 * c + 1, 2 * c}));
  expect_match(r.y, ref.apply(x, gamma, beta), "y over both replicas' statistics",
               tol(Cmp::kApprox));
  expect_match(r.dx, ref.dx(x, dy, gamma, both), "dx with both replicas' sums", tol(Cmp::kApprox));
  expect_match(r.dg, std::vector<double>(local.begin() + c, local.end()), "dgamma (local)",
               tol(Cmp::kApprox));
  expect_match(r.db, std::vector<double>(local.begin(), local.begin() + c), "dbeta (local)",
               tol(Cmp::kApprox));
}

// The fused forms of one BatchNormOp (backend.h) against that backend's separate operations, bit
// for bit (the same kernels with the epilogue or mask added, so on every backend): forward with a
// residual and the ReLU = plain forward, add(relu); backward with relu_out (dz stored or masked on
// the fly) = relu_backward, then the plain backward; training with a --sync-bn style hook, and
// evaluation. The separate forms themselves are held to the references above.
TEST_P(BackendOps, BatchNormFusedEqualsSeparateOps) {
  const int64_t c = 6, m = 2 * 5 * 3;
  const double eps = 1e-5;
  const size_t xs = sz(m * c), cs = sz(c);
  const auto x = bn_input(xs, c, 600), res = uniform(xs, 601), dy = uniform(xs, 602);
  const auto gamma = uniform(cs, 603, 0.5f, 1.5f), beta = uniform(cs, 604),
             rv0 = uniform(cs, 605, 0.5f, 2.f);
  auto x_ = put(x), res_ = put(res), dy_ = put(dy), g_ = put(gamma), b_ = put(beta);
  std::vector<int64_t> seen;
  const ChannelSumFn twice = host_hook(be(), seen, [](std::vector<double>& h, size_t) {
    for (double& v : h) v *= 2;
  });
  for (Mode mode : {Mode::kTrain, Mode::kEval})
    for (bool with_res : {false, true}) {
      SCOPED_TRACE(std::string(mode == Mode::kTrain ? "train" : "eval") +
                   (with_res ? " residual" : ""));
      const float* r = with_res ? res_.data() : nullptr;
      // Two ops with their own running statistics: fused, and separate.
      auto rm_f = put(std::vector<float>(cs, 0.f)), rv_f = put(rv0),
           rm_s = put(std::vector<float>(cs, 0.f)), rv_s = put(rv0);
      const std::unique_ptr<BatchNormOp> fused = be().make_batchnorm(c, 0.1, eps),
                                         sep = be().make_batchnorm(c, 0.1, eps);
      auto y_f = put(std::vector<float>(xs, 7.f)), t_s = put(std::vector<float>(xs, 7.f)),
           y_s = put(std::vector<float>(xs, 7.f));
      if (mode == Mode::kTrain) {
        fused->forward_train(x_.data(), y_f.data(), m, g_.data(), b_.data(), rm_f.data(),
                             rv_f.data(), nullptr, twice, r, true);
        sep->forward_train(x_.data(), t_s.data(), m, g_.data(), b_.data(), rm_s.data(), rv_s.data(),
                           nullptr, twice, nullptr, false);
      } else {
        fused->forward_eval(x_.data(), y_f.data(), m, g_.data(), b_.data(), rm_f.data(),
                            rv_f.data(), r, true);
        sep->forward_eval(x_.data(), t_s.data(), m, g_.data(), b_.data(), rm_s.data(), rv_s.data(),
                          nullptr, false);
      }
      if (with_res)
        be().add(t_s.data(), res_.data(), y_s.data(), static_cast<int64_t>(xs), true);
      else
        be().relu_forward(t_s.data(), y_s.data(), static_cast<int64_t>(xs));
      const std::vector<float> y = get(y_s);
      expect_match(get(y_f), y, "fused forward", tol(Cmp::kExact));
      expect_match(get(rv_f), get(rv_s), "running_var", tol(Cmp::kExact));
      const auto on = std::count_if(y.begin(), y.end(), [](float v) { return v > 0.f; });
      EXPECT_TRUE(on > static_cast<long>(xs) / 5 && on < static_cast<long>(xs) * 4 / 5)
          << on << " of " << xs;

      auto dz_ = put(std::vector<float>(xs, 7.f));
      be().relu_backward(y_s.data(), dy_.data(), dz_.data(), static_cast<int64_t>(xs));
      auto dx_s = put(std::vector<float>(xs, 7.f)), dg_s = put(std::vector<float>(cs, 7.f)),
           db_s = put(std::vector<float>(cs, 7.f));
      sep->backward(x_.data(), dz_.data(), dx_s.data(), m, g_.data(), dg_s.data(), db_s.data(),
                    false, twice, nullptr, nullptr);
      for (bool store_dz : {false, true}) {
        SCOPED_TRACE(store_dz ? "dz stored" : "masked on the fly");
        auto dx_f = put(std::vector<float>(xs, 7.f)), dg_f = put(std::vector<float>(cs, 7.f)),
             db_f = put(std::vector<float>(cs, 7.f)), dzo = put(std::vector<float>(xs, 7.f));
        fused->backward(x_.data(), dy_.data(), dx_f.data(), m, g_.data(), dg_f.data(), db_f.data(),
                        false, twice, y_f.data(), store_dz ? dzo.data() : nullptr);
        expect_match(get(dx_f), get(dx_s), "fused dx", tol(Cmp::kExact));
        expect_match(get(dg_f), get(dg_s), "fused dgamma", tol(Cmp::kExact));
        expect_match(get(db_f), get(db_s), "fused dbeta", tol(Cmp::kExact));
        if (store_dz) expect_match(get(dzo), get(dz_), "dz", tol(Cmp::kExact));
      }
    }
  // The hook saw the fused and the separate ops alike: per training forward one [sum, sumsq,
  // count] and per training backward with dx one [sum dy, sum dy*xhat].
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 2 * c + 1), 4);
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 2 * c), 6);
}

// ---- element-wise -------------------------------------------------------------------------------

TEST_P(BackendOps, ReluForwardBackward) {
  const size_t n = 517;
  std::vector<float> x = uniform(n, 400), dy = uniform(n, 401);
  for (size_t i = 0; i < n; i += 9) x[i] = 0.f;  // the kink itself: relu(0) = 0, no gradient
  std::vector<float> y(n), dx(n);
  for (size_t i = 0; i < n; ++i) {
    y[i] = x[i] > 0.f ? x[i] : 0.f;
    dx[i] = y[i] > 0.f ? dy[i] : 0.f;
  }
  auto x_ = put(x), dy_ = put(dy), y_ = put(std::vector<float>(n, 7.f)),
       dx_ = put(std::vector<float>(n, 7.f));
  be().relu_forward(x_.data(), y_.data(), static_cast<int64_t>(n));
  be().relu_backward(y_.data(), dy_.data(), dx_.data(), static_cast<int64_t>(n));
  expect_match(get(y_), y, "relu y", tol(Cmp::kExact));
  expect_match(get(dx_), dx, "relu dx", tol(Cmp::kExact));
}

TEST_P(BackendOps, AddWithAndWithoutRelu) {
  const size_t n = 1031;
  const auto a = uniform(n, 410), b = uniform(n, 411);
  auto a_ = put(a), b_ = put(b);
  for (bool relu : {false, true}) {
    SCOPED_TRACE(relu ? "relu" : "plain");
    std::vector<float> y(n);
    for (size_t i = 0; i < n; ++i) {
      y[i] = a[i] + b[i];
      if (relu) y[i] = y[i] > 0.f ? y[i] : 0.f;
    }
    auto y_ = put(std::vector<float>(n, 7.f));
    be().add(a_.data(), b_.data(), y_.data(), static_cast<int64_t>(n), relu);
    expect_match(get(y_), y, "add", tol(Cmp::kExact));
    EXPECT_EQ(get(a_), a) << "an operand changed";
    // From the second element on: pointers off 16-byte alignment (the GPU's one-element form).
    y_ = put(std::vector<float>(n, 7.f));
    be().add(a_.data() + 1, b_.data() + 1, y_.data() + 1, static_cast<int64_t>(n - 1), relu);
    std::vector<float> want = y;
    want[0] = 7.f;
    expect_match(get(y_), want, "add from the second element", tol(Cmp::kExact));
  }
}

// ---- pooling ------------------------------------------------------------------------------------

// AvgPool2d in float, summing in the CPU's order: forward window row by row then * 1/k^2;
// backward each covering window's dy * 1/k^2 in window order, masked by relu(x) when fused.
std::vector<float> avgpool_ref_forward(const std::vector<float>& x, int64_t n, int64_t h, int64_t w,
                                       int64_t c, int k, int s, bool relu) {
  const int64_t oh = (h - k) / s + 1, ow = (w - k) / s + 1;
  const float inv = 1.f / static_cast<float>(k * k);
  std::vector<float> y(sz(n * oh * ow * c));
  for (int64_t b = 0; b < n; ++b)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j)
        for (int64_t ch = 0; ch < c; ++ch) {
          float acc = 0.f;
          for (int di = 0; di < k; ++di)
            for (int dj = 0; dj < k; ++dj) {
              const float v = x[sz(((b * h + i * s + di) * w + j * s + dj) * c + ch)];
              acc += relu ? (v > 0.f ? v : 0.f) : v;
            }
          y[sz(((b * oh + i) * ow + j) * c + ch)] = acc * inv;
        }
  return y;
}
std::vector<float> avgpool_ref_backward(const std::vector<float>& dy,
                                        const std::vector<float>* relu_x, int64_t n, int64_t h,
                                        int64_t w, int64_t c, int k, int s) {
  const int64_t oh = (h - k) / s + 1, ow = (w - k) / s + 1;
  const float inv = 1.f / static_cast<float>(k * k);
  std::vector<float> dx(sz(n * h * w * c));
  for (int64_t b = 0; b < n; ++b)
    for (int64_t r = 0; r < h; ++r)
      for (int64_t q = 0; q < w; ++q)
        for (int64_t ch = 0; ch < c; ++ch) {
          const size_t at = sz(((b * h + r) * w + q) * c + ch);
          float acc = 0.f;
          for (int64_t i = 0; i < oh; ++i)
            for (int64_t j = 0; j < ow; ++j)
              if (r >= i * s && r < i * s + k && q >= j * s && q < j * s + k)
                acc += dy[sz(((b * oh + i) * ow + j) * c + ch)] * inv;
          dx[at] = relu_x && !((*relu_x)[at] > 0.f) ? 0.f : acc;
        }
  return dx;
}

TEST_P(BackendOps, AvgPoolForwardBackwardPlainAndFusedRelu) {
  struct Case {
    int64_t n, h, w, c;
    int k, s;
  };
  // Floor mode dropping a row and a column (5x7, 2/2), overlapping windows (3/1), and 3/2 (overlap
  // by one, odd sizes).
  const Case cases[] = {{2, 5, 7, 3, 2, 2}, {2, 5, 4, 2, 3, 1}, {1, 7, 6, 4, 3, 2}};
  uint64_t seed = 500;
  for (const Case& k : cases)
    for (bool relu : {false, true}) {
      SCOPED_TRACE("k=" + std::to_string(k.k) + " s=" + std::to_string(k.s) +
                   (relu ? " fused relu" : ""));
      const int64_t oh = (k.h - k.k) / k.s + 1, ow = (k.w - k.k) / k.s + 1;
      const size_t xs = sz(k.n * k.h * k.w * k.c), ys = sz(k.n * oh * ow * k.c);
      std::vector<float> x = uniform(xs, ++seed), dy = uniform(ys, ++seed);
      for (size_t i = 0; i < xs; i += 11) x[i] = 0.f;  // the fused ReLU's kink
      auto x_ = put(x), dy_ = put(dy), y_ = put(std::vector<float>(ys, 7.f)),
           dx_ = put(std::vector<float>(xs, 7.f));
      be().avgpool_forward(x_.data(), y_.data(), k.n, k.h, k.w, k.c, k.k, k.s, relu);
      be().avgpool_backward(dy_.data(), relu ? x_.data() : nullptr, dx_.data(), k.n, k.h, k.w, k.c,
                            k.k, k.s);
      expect_match(get(y_), avgpool_ref_forward(x, k.n, k.h, k.w, k.c, k.k, k.s, relu), "avgpool y",
                   tol(Cmp::kOrdered));
      expect_match(get(dx_),
                   avgpool_ref_backward(dy, relu ? &x : nullptr, k.n, k.h, k.w, k.c, k.k, k.s),
                   "avgpool dx (uncovered positions 0)", tol(Cmp::kOrdered));
    }
}

// MaxPool2d by its definition (backend.h): per output and channel, the window's in-image positions
// in row-major order, the first strictly greater value (or a NaN) taking over; backward adds each
// output's gradient at its winner, outputs in row-major order.
void maxpool_ref(const std::vector<float>& x, const std::vector<float>& dy, int64_t n, int64_t h,
                 int64_t w, int64_t c, int k, int s, int pad, std::vector<float>* y,
                 std::vector<float>* dx) {
  const int64_t oh = (h + 2 * pad - k) / s + 1, ow = (w + 2 * pad - k) / s + 1;
  y->assign(sz(n * oh * ow * c), 0.f);
  dx->assign(sz(n * h * w * c), 0.f);
  for (int64_t b = 0; b < n; ++b)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j)
        for (int64_t ch = 0; ch < c; ++ch) {
          float best = -INFINITY;
          int64_t at = -1;
          for (int64_t r = i * s - pad; r < i * s - pad + k; ++r)
            for (int64_t q = j * s - pad; q < j * s - pad + k; ++q) {
              if (r < 0 || r >= h || q < 0 || q >= w) continue;
              const int64_t idx = ((b * h + r) * w + q) * c + ch;
              const float v = x[sz(idx)];
              if (at < 0 || v > best || std::isnan(v)) {
                at = idx;
                best = v;
              }
            }
          const int64_t o = ((b * oh + i) * ow + j) * c + ch;
          (*y)[sz(o)] = best;
          (*dx)[sz(at)] += dy[sz(o)];
        }
}

TEST_P(BackendOps, MaxPoolForwardBackwardFirstMaximumWins) {
  struct Case {
    int64_t n, h, w, c;
    int k, s, pad;
  };
  // torchvision's 3/2/1 (odd and even sizes), no padding with a floor-mode remainder, overlapping
  // windows at stride 1, and 33 channels (every vector width's tail). In fp32 (this test's type)
  // 16, 8 and 4 channels take the GPU's 16-byte form (4 lanes a thread); bf16's 8 lanes are
  // compared with the one-lane form in MaxPoolGivesTheSameBitsAtAnyAlignment.
  const Case cases[] = {{2, 7, 6, 3, 3, 2, 1}, {2, 8, 8, 4, 3, 2, 1},  {1, 5, 7, 2, 2, 2, 0},
                        {2, 4, 5, 3, 3, 1, 1}, {1, 9, 8, 33, 3, 2, 1}, {2, 9, 10, 16, 3, 2, 1},
                        {1, 6, 7, 8, 2, 2, 0}};
  uint64_t seed = 600;
  for (const Case& k : cases)
    for (const bool ties : {false, true}) {
      SCOPED_TRACE("k=" + std::to_string(k.k) + " s=" + std::to_string(k.s) +
                   " pad=" + std::to_string(k.pad) + (ties ? " with ties" : ""));
      const int64_t oh = (k.h + 2 * k.pad - k.k) / k.s + 1, ow = (k.w + 2 * k.pad - k.k) / k.s + 1;
      const size_t xs = sz(k.n * k.h * k.w * k.c), ys = sz(k.n * oh * ow * k.c);
      std::vector<float> x = uniform(xs, ++seed), dy = uniform(ys, ++seed);
      // Ties: five levels, so most windows hold their maximum more than once (the first wins).
      if (ties)
        for (float& v : x) v = std::round(v * 2.f) / 2.f;
      std::vector<float> y, dx;
      maxpool_ref(x, dy, k.n, k.h, k.w, k.c, k.k, k.s, k.pad, &y, &dx);
      auto x_ = put(x), dy_ = put(dy), y_ = put(std::vector<float>(ys, 7.f)),
           dx_ = put(std::vector<float>(xs, 7.f));
      be().maxpool_forward(x_.data(), y_.data(), k.n, k.h, k.w, k.c, k.k, k.s, k.pad);
      be().maxpool_backward(x_.data(), dy_.data(), dx_.data(), k.n, k.h, k.w, k.c, k.k, k.s, k.pad);
      expect_match(get(y_), as_double(y), "maxpool y", tol(Cmp::kExact));
      expect_match(get(dx_), as_double(dx), "maxpool dx (0 where nothing wins)", tol(Cmp::kExact));
    }
  // A NaN wins its windows (PyTorch's rule), and only the NaN gets their gradient: in channel 1 of
  // 2 (one lane a thread) and of 16 (a lane of a 16-byte group, beside lanes without a NaN).
  for (const int64_t c : {2, 16}) {
    SCOPED_TRACE("NaN, " + std::to_string(c) + " channels");
    std::vector<float> x = uniform(sz(1 * 4 * 4 * c), 700), dy = uniform(sz(1 * 2 * 2 * c), 701);
    x[sz((1 * 4 + 1) * c + 1)] = NAN;  // row 1, column 1, channel 1: inside output (0,0) and others
    std::vector<float> y, dx;
    maxpool_ref(x, dy, 1, 4, 4, c, 3, 2, 1, &y, &dx);
    auto x_ = put(x), dy_ = put(dy), y_ = put(std::vector<float>(y.size(), 7.f)),
         dx_ = put(std::vector<float>(x.size(), 7.f));
    be().maxpool_forward(x_.data(), y_.data(), 1, 4, 4, c, 3, 2, 1);
    be().maxpool_backward(x_.data(), dy_.data(), dx_.data(), 1, 4, 4, c, 3, 2, 1);
    const std::vector<float> got_y = get(y_), got_dx = get(dx_);
    for (size_t i = 0; i < y.size(); ++i)
      EXPECT_TRUE(std::isnan(y[i]) ? std::isnan(got_y[i]) : got_y[i] == y[i]) << "y " << i;
    EXPECT_TRUE(std::isnan(y[1])) << "the reference: output (0,0) channel 1 is the NaN";
    EXPECT_EQ(got_dx, dx);
  }
}

TEST_P(BackendOps, GlobalAvgPoolForwardBackward) {
  const int64_t n = 3, hw = 4 * 5, c = 6;
  const auto x = uniform(sz(n * hw * c), 600), dy = uniform(sz(n * c), 601);
  const float inv = 1.f / static_cast<float>(hw);
  std::vector<float> y(sz(n * c)), dx(x.size());
  for (int64_t b = 0; b < n; ++b)
    for (int64_t ch = 0; ch < c; ++ch) {
      float acc = 0.f;
      for (int64_t p = 0; p < hw; ++p) acc += x[sz((b * hw + p) * c + ch)];
      y[sz(b * c + ch)] = acc * inv;
      for (int64_t p = 0; p < hw; ++p) dx[sz((b * hw + p) * c + ch)] = dy[sz(b * c + ch)] * inv;
    }
  auto x_ = put(x), dy_ = put(dy), y_ = put(std::vector<float>(y.size(), 7.f)),
       dx_ = put(std::vector<float>(x.size(), 7.f));
  be().global_avgpool_forward(x_.data(), y_.data(), n, hw, c);
  be().global_avgpool_backward(dy_.data(), dx_.data(), n, hw, c);
  expect_match(get(y_), y, "global avgpool y", tol(Cmp::kOrdered));
  expect_match(get(dx_), dx, "global avgpool dx", tol(Cmp::kOrdered));
}

// ---- layout -------------------------------------------------------------------------------------

TEST_P(BackendOps, FlattenBothWays) {
  const int64_t n = 2, h = 3, w = 4, c = 5;
  const auto x = uniform(sz(n * h * w * c), 700);
  std::vector<float> chw(x.size());  // PyTorch's flatten order: (c, h, w) per image
  for (int64_t b = 0; b < n; ++b)
    for (int64_t i = 0; i < h; ++i)
      for (int64_t j = 0; j < w; ++j)
        for (int64_t ch = 0; ch < c; ++ch)
          chw[sz(b * c * h * w + (ch * h + i) * w + j)] = x[sz(((b * h + i) * w + j) * c + ch)];
  auto x_ = put(x), f_ = put(std::vector<float>(x.size(), 7.f)),
       back_ = put(std::vector<float>(x.size(), 7.f));
  be().flatten(x_.data(), f_.data(), n, h, w, c, /*to_chw=*/true);
  expect_match(get(f_), chw, "NHWC -> CHW", tol(Cmp::kExact));
  auto chw_ = put(chw);
  be().flatten(chw_.data(), back_.data(), n, h, w, c, /*to_chw=*/false);
  expect_match(get(back_), x, "CHW -> NHWC", tol(Cmp::kExact));
}

// ---- linear -------------------------------------------------------------------------------------

TEST_P(BackendOps, LinearForwardBackward) {
  const int64_t n = 5, in = 7, out = 4;
  uint64_t seed = 800;
  for (bool bias : {true, false}) {
    SCOPED_TRACE(bias ? "bias" : "no bias");
    const auto x = uniform(sz(n * in), ++seed), w = uniform(sz(out * in), ++seed),
               b = uniform(sz(out), ++seed);
    const auto dy = uniform(sz(n * out), ++seed), dw0 = uniform(sz(out * in), ++seed),
               db0 = uniform(sz(out), ++seed);
    std::vector<double> y(sz(n * out)), dx(sz(n * in), 0.0), dw(sz(out * in), 0.0),
        db(sz(out), 0.0);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t o = 0; o < out; ++o) {
        double acc = bias ? b[sz(o)] : 0.0;
        const double d = dy[sz(r * out + o)];
        db[sz(o)] += d;
        for (int64_t i = 0; i < in; ++i) {
          acc += static_cast<double>(x[sz(r * in + i)]) * w[sz(o * in + i)];
          dx[sz(r * in + i)] += d * w[sz(o * in + i)];
          dw[sz(o * in + i)] += d * x[sz(r * in + i)];
        }
        y[sz(r * out + o)] = acc;
      }
    auto x_ = put(x), w_ = put(w), b_ = put(b), dy_ = put(dy),
         y_ = put(std::vector<float>(y.size(), 7.f));
    auto dx_ = put(std::vector<float>(dx.size(), 7.f)),
         dw_ = put(std::vector<float>(dw.size(), 7.f));
    auto db_ = put(std::vector<float>(db.size(), 7.f)), dwa_ = put(dw0), dba_ = put(db0);
    be().linear_forward(x_.data(), w_.data(), bias ? b_.data() : nullptr, y_.data(), n, in, out);
    be().linear_backward(x_.data(), w_.data(), dy_.data(), dx_.data(), dw_.data(),
                         bias ? db_.data() : nullptr, n, in, out, false);
    be().linear_backward(x_.data(), w_.data(), dy_.data(), nullptr, dwa_.data(),
                         bias ? dba_.data() : nullptr, n, in, out, true);
    expect_match(get(y_), y, "y", tol(Cmp::kApprox));
    expect_match(get(dx_), dx, "dx", tol(Cmp::kApprox));
    expect_match(get(dw_), dw, "dw (overwritten)", tol(Cmp::kApprox));
    std::vector<double> dw_acc(dw.size()), db_acc(db.size());
    for (size_t i = 0; i < dw.size(); ++i) dw_acc[i] = dw0[i] + dw[i];
    for (size_t i = 0; i < db.size(); ++i) db_acc[i] = db0[i] + db[i];
    expect_match(get(dwa_), dw_acc, "dw accumulated (dx null)", tol(Cmp::kApprox));
    if (bias) {
      expect_match(get(db_), db, "db (overwritten)", tol(Cmp::kApprox));
      expect_match(get(dba_), db_acc, "db accumulated (dx null)", tol(Cmp::kApprox));
    }
  }
}

// ---- training-step operations -------------------------------------------------------------------

TEST_P(BackendOps, GatherImages) {
  const int64_t num = 6, pixels = 10;
  std::vector<uint8_t> images(sz(num * pixels));
  std::vector<dpt::Label> labels(sz(num));
  for (size_t i = 0; i < images.size(); ++i) images[i] = static_cast<uint8_t>((i * 37 + 11) % 256);
  images[3] = 0, images[4] = 255;
  // Both bytes of a 16-bit class number in use (ImageNet's 1,000 classes need the second).
  for (size_t i = 0; i < labels.size(); ++i)
    labels[i] = static_cast<dpt::Label>((i * 13107 + 999) % 65536);
  const std::vector<int64_t> idx = {5, 0, 3, 3, 1};  // repeats, first and last image
  const int64_t count = static_cast<int64_t>(idx.size());
  DeviceArray<uint8_t> im_ = DeviceArray<uint8_t>::mirror(be(), images.data(), num * pixels);
  DeviceArray<dpt::Label> lab_ = DeviceArray<dpt::Label>::mirror(be(), labels.data(), num);
  DeviceArray<int64_t> idx_ = to_backend_array(be(), idx);
  // One row more than gathered: it must keep its values.
  auto x_ = put(std::vector<float>(sz((count + 1) * pixels), 7.f));
  DeviceArray<int32_t> lo_ = to_backend_array(be(), std::vector<int32_t>(sz(count + 1), -1));
  ImageBatchSpec spec;
  spec.rows = 2, spec.cols = 5, spec.channels = 1;  // 10 pixels
  be().gather_images(im_.data(), lab_.data(), num, spec, idx_.data(), count, x_.data(), lo_.data());
  std::vector<float> x(sz((count + 1) * pixels), 7.f);
  std::vector<int32_t> lo(sz(count + 1), -1);
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t p = 0; p < pixels; ++p)
      x[sz(i * pixels + p)] = static_cast<float>(images[sz(idx[sz(i)] * pixels + p)]) / 255.f;
    lo[sz(i)] = labels[sz(idx[sz(i)])];
  }
  expect_match(get(x_), x, "gathered pixels / 255", tol(Cmp::kExact));
  EXPECT_EQ(to_host(lo_), lo);
}

// --augment crop=2,flip and --normalize on 5x4x3 images, against the recipe written out directly:
// zero-pad by 2, take the 5x4 window at (oy, ox), mirror it, then (v / 255 - mean[c]) / std[c].
TEST_P(BackendOps, GatherImagesCropFlipNormalize) {
  const int64_t num = 3, rows = 5, cols = 4, ch = 3, per = rows * cols * ch;
  const int pad = 2;
  std::vector<uint8_t> images(sz(num * per));
  std::vector<dpt::Label> labels = {4, 7, 1000};
  for (size_t i = 0; i < images.size(); ++i) images[i] = static_cast<uint8_t>((i * 53 + 5) % 256);
  const std::vector<int64_t> idx = {2, 0, 1, 2};
  // Offsets at both extremes and in between, with and without the flip.
  const std::vector<uint32_t> draws = {pack_draw(0, 0, false), pack_draw(4, 4, true),
                                       pack_draw(2, 2, false), pack_draw(1, 3, true)};
  const std::vector<float> mean = {0.5f, 0.25f, 0.75f}, stdev = {0.2f, 0.3f, 0.4f};
  const int64_t count = static_cast<int64_t>(idx.size());
  DeviceArray<uint8_t> im_ = DeviceArray<uint8_t>::mirror(be(), images.data(), num * per);
  DeviceArray<dpt::Label> lab_ = DeviceArray<dpt::Label>::mirror(be(), labels.data(), num);
  DeviceArray<int64_t> idx_ = to_backend_array(be(), idx);
  DeviceArray<uint32_t> dr_ = to_backend_array(be(), draws);
  DeviceArray<float> mean_ = to_backend_array(be(), mean), std_ = to_backend_array(be(), stdev);
  auto x_ = put(std::vector<float>(sz(count * per), 7.f));
  DeviceArray<int32_t> lo_ = to_backend_array(be(), std::vector<int32_t>(sz(count), -1));
  ImageBatchSpec spec;
  spec.rows = rows, spec.cols = cols, spec.channels = ch, spec.pad = pad;
  spec.draws = dr_.data(), spec.mean = mean_.data(), spec.std = std_.data();
  be().gather_images(im_.data(), lab_.data(), num, spec, idx_.data(), count, x_.data(), lo_.data());
  const int oys[] = {0, 4, 2, 1}, oxs[] = {0, 4, 2, 3};
  const bool flips[] = {false, true, false, true};
  std::vector<float> x(sz(count * per));
  for (int64_t i = 0; i < count; ++i) {
    // The padded image, then the window, then the mirror.
    const int64_t ph = rows + 2 * pad, pw = cols + 2 * pad;
    std::vector<int> padded(sz(ph * pw * ch), 0);
    for (int64_t y = 0; y < rows; ++y)
      for (int64_t xx = 0; xx < cols; ++xx)
        for (int64_t c = 0; c < ch; ++c)
          padded[sz(((y + pad) * pw + xx + pad) * ch + c)] =
              images[sz(idx[sz(i)] * per + (y * cols + xx) * ch + c)];
    for (int64_t y = 0; y < rows; ++y)
      for (int64_t xx = 0; xx < cols; ++xx)
        for (int64_t c = 0; c < ch; ++c) {
          const int64_t wx = flips[i] ? cols - 1 - xx : xx;
          const int v = padded[sz(((y + oys[i]) * pw + wx + oxs[i]) * ch + c)];
          x[sz(i * per + (y * cols + xx) * ch + c)] =
              (static_cast<float>(v) / 255.f - mean[sz(c)]) / stdev[sz(c)];
        }
  }
  expect_match(get(x_), x, "cropped, flipped, normalised pixels", tol(Cmp::kExact));
  EXPECT_EQ(to_host(lo_), (std::vector<int32_t>{1000, 4, 7, 1000}));
}

TEST_P(BackendOps, SoftmaxCrossEntropy) {
  const int64_t n = 6, k = 5;
  const float scale = 0.25f;
  const auto z = uniform(sz(n * k), 900, -3.f, 3.f);
  // Labels: the argmax for even rows (hits), another class for odd rows (misses).
  std::vector<int32_t> labels(sz(n));
  std::vector<double> d(sz(n * k));
  double loss = 0, hits = 0;
  for (int64_t r = 0; r < n; ++r) {
    const float* zr = z.data() + r * k;
    const int32_t arg = static_cast<int32_t>(std::max_element(zr, zr + k) - zr);
    labels[sz(r)] =
        r % 2 == 0 ? arg : (arg + 1 + static_cast<int32_t>(r)) % static_cast<int32_t>(k);
    if (labels[sz(r)] == arg) hits += 1;
    double se = 0;
    for (int64_t j = 0; j < k; ++j) se += std::exp(static_cast<double>(zr[j]));
    const double lse = std::log(se);
    loss += lse - zr[labels[sz(r)]];
    for (int64_t j = 0; j < k; ++j)
      d[sz(r * k + j)] = (std::exp(zr[j] - lse) - (j == labels[sz(r)] ? 1.0 : 0.0)) * scale;
  }
  ASSERT_EQ(hits, 3.0);
  auto z_ = put(z), d_ = put(std::vector<float>(d.size(), 7.f));
  DeviceArray<int32_t> l_ = to_backend_array(be(), labels);
  DeviceArray<double> s_ = to_backend_array(be(), std::vector<double>{100.0, 100.0});
  be().softmax_xent(z_.data(), l_.data(), n, k, scale, 0.f, d_.data(), s_.data(), false);
  expect_match(get(d_), d, "dlogits", tol(Cmp::kApprox));
  std::vector<double> s = to_host(s_);
  EXPECT_NEAR(s[0], loss, 1e-4 * loss) << "summed loss (overwritten)";
  EXPECT_EQ(s[1], hits) << "argmax hits (overwritten)";
  // Accumulating without dlogits: the totals double, dlogits untouched.
  be().softmax_xent(z_.data(), l_.data(), n, k, scale, 0.f, nullptr, s_.data(), true);
  s = to_host(s_);
  EXPECT_NEAR(s[0], 2 * loss, 2e-4 * loss) << "summed loss (accumulated)";
  EXPECT_EQ(s[1], 2 * hits) << "argmax hits (accumulated)";
  expect_match(get(d_), d, "dlogits after a call without them", tol(Cmp::kApprox));
}

// softmax_xent's reference in double over rows of k logits: each term measured from the row's
// maximum (the first one, torch.argmax's, takes the hit), label smoothing e as torch's
// cross_entropy; d gets (softmax - q) * scale, loss and hits the batch totals.
struct XentRef {
  std::vector<double> d;
  double loss = 0, hits = 0;
};
XentRef xent_reference(const std::vector<float>& z, const std::vector<int32_t>& labels, int64_t k,
                       double scale, double e) {
  XentRef out;
  out.d.resize(z.size());
  for (size_t r = 0; r < labels.size(); ++r) {
    const float* zr = z.data() + static_cast<int64_t>(r) * k;
    const int64_t arg = std::max_element(zr, zr + k) - zr;
    const int32_t y = labels[r];
    out.hits += y == arg;
    const double mx = zr[arg];
    double se = 0, mean = 0;
    for (int64_t j = 0; j < k; ++j) {
      se += std::exp(static_cast<double>(zr[j]) - mx);
      mean += (static_cast<double>(zr[j]) - mx) / static_cast<double>(k);
    }
    const double ls = std::log(se), ny = ls - (static_cast<double>(zr[y]) - mx);
    out.loss += e > 0 ? (1 - e) * ny + e * (ls - mean) : ny;
    for (int64_t j = 0; j < k; ++j) {
      const double q = (j == y ? 1 - e : 0.0) + e / static_cast<double>(k);
      out.d[sz(static_cast<int64_t>(r) * k + j)] =
          (std::exp(static_cast<double>(zr[j]) - mx - ls) - q) * scale;
    }
  }
  return out;
}

// More classes than a block has threads (the CUDA kernel refused k > 1024 with
// cudaErrorInvalidValue, though it strides over the row: a 2000-class run failed at its first
// step), and logits far from 0: rows offset by 1e5, where a float log-sum-exp formed as
// log(se) + max is rounded to the maximum's units (ulp 0.0078), moving every probability by up to
// 0.4 %; the reference measures each logit from its row's maximum, as torch's log_softmax does.
TEST_P(BackendOps, SoftmaxXentManyClassesAndLogitsFarFromZero) {
  const int64_t n = 4, k = 3000;
  const float scale = 0.5f;
  auto z = uniform(sz(n * k), 920, -3.f, 3.f);
  for (int64_t i = 2 * k; i < n * k; ++i) z[sz(i)] += 1e5f;
  std::vector<int32_t> labels(sz(n));
  for (int64_t r = 0; r < n; ++r) {
    const float* zr = z.data() + r * k;
    const int64_t arg = std::max_element(zr, zr + k) - zr;
    labels[sz(r)] = static_cast<int32_t>(r % 2 == 0 ? arg : (arg + 7 * r + 1) % k);
  }
  const XentRef want = xent_reference(z, labels, k, scale, 0);
  ASSERT_EQ(want.hits, 2.0);
  auto z_ = put(z), d_ = put(std::vector<float>(want.d.size(), 7.f));
  DeviceArray<int32_t> l_ = to_backend_array(be(), labels);
  DeviceArray<double> s_ = to_backend_array(be(), std::vector<double>{100.0, 100.0});
  be().softmax_xent(z_.data(), l_.data(), n, k, scale, 0.f, d_.data(), s_.data(), false);
  expect_match(get(d_), want.d, "dlogits", tol(Cmp::kApprox));
  const std::vector<double> s = to_host(s_);
  EXPECT_NEAR(s[0], want.loss, 1e-4 * want.loss) << "summed loss";
  EXPECT_EQ(s[1], want.hits) << "argmax hits";
}

// Tied maxima: the first takes the hit (torch.argmax), also where the GPU kernel's warp holds the
// tied logits in one lane (indices 32 apart) or in different lanes whose order differs from the
// indices' (33 before 2 in lane order), and with three ties across lanes 31, 0 and 3; and ties far
// from 0 (the rows [m, m, -m], [m, -m, m] and [-m, m, -m] at m from 1e4 to 1e30, label smoothing 0
// and 0.1), where each maximum keeps p = 1/2 and the tied row's loss log 2 only if every term is
// measured from the maximum (76af95c: in float, log(se) + max dropped log 2 from |max| ~ 2^24 on).
// Not run on a GPU when written.
TEST_P(BackendOps, SoftmaxXentTiesTakeTheFirstMaximumAndKeepTheirShare) {
  const float scale = 0.5f;
  const auto check = [&](const std::vector<float>& z, const std::vector<int32_t>& labels, int64_t k,
                         float e, double hits) {
    const auto n = static_cast<int64_t>(labels.size());
    const XentRef want = xent_reference(z, labels, k, scale, e);
    ASSERT_EQ(want.hits, hits) << "the reference's hits";
    auto z_ = put(z), d_ = put(std::vector<float>(z.size(), 7.f));
    DeviceArray<int32_t> l_ = to_backend_array(be(), labels);
    DeviceArray<double> s_ = to_backend_array(be(), std::vector<double>{100.0, 100.0});
    be().softmax_xent(z_.data(), l_.data(), n, k, scale, e, d_.data(), s_.data(), false);
    expect_match(get(d_), want.d, "dlogits", tol(Cmp::kApprox));
    const std::vector<double> s = to_host(s_);
    EXPECT_NEAR(s[0], want.loss, 1e-4 * std::fabs(want.loss)) << "summed loss";
    EXPECT_EQ(s[1], hits) << "argmax hits";
  };
  {
    SCOPED_TRACE("ties across the warp's lanes, 100 classes");
    const int64_t k = 100;
    std::vector<float> z = uniform(sz(4 * k), 930);
    const std::vector<std::vector<int64_t>> tied = {{6, 70}, {2, 33}, {31, 64, 99}, {96, 97}};
    for (size_t r = 0; r < tied.size(); ++r)
      for (const int64_t j : tied[r]) z[sz(static_cast<int64_t>(r) * k + j)] = 2.f;
    // Rows 0 and 2 labelled with their first maximum (hits); rows 1 and 3 with a later one.
    check(z, {6, 33, 31, 97}, k, 0.f, 2.0);
  }
  for (const float m : {1e4f, 1e8f, 1e12f, 1e16f, 1e30f})
    for (const float e : {0.f, 0.1f}) {
      SCOPED_TRACE("m = " + std::to_string(m) + ", label smoothing " + std::to_string(e));
      check({m, m, -m, m, -m, m, -m, m, -m}, {0, 1, 1}, 3, e, 2.0);
    }
}

TEST_P(BackendOps, StoreScalar) {
  auto a_ = put({1.f, 2.f, 3.f, 4.f});
  be().store_scalar(a_.data() + 2, 0.3f);
  EXPECT_EQ(get(a_), (std::vector<float>{1.f, 2.f, 0.3f, 4.f}));
  be().store_scalar(a_.data(), -5.5f);
  EXPECT_EQ(get(a_), (std::vector<float>{-5.5f, 2.f, 0.3f, 4.f}));
}

TEST_P(BackendOps, SgdUpdateMomentumOnOffAndFirstStep) {
  const int64_t n = 37;
  const float lr = 0.5f, mom = 0.9f, wd = 0.1f;
  const auto p0 = uniform(sz(n), 1000), g1 = uniform(sz(n), 1001), g2 = uniform(sz(n), 1002);
  const auto garbage = uniform(sz(n), 1003);
  auto lr_ = put({0.f});
  be().store_scalar(lr_.data(), lr);  // the learning rate lives in backend memory

  // Momentum: the first step sets buf = d (whatever buf held), later ones buf = mom buf + d.
  std::vector<double> p(p0.begin(), p0.end()), buf(sz(n));
  auto p_ = put(p0), g1_ = put(g1), g2_ = put(g2), buf_ = put(garbage);
  be().sgd_update(p_.data(), g1_.data(), buf_.data(), n, lr_.data(), mom, wd, false, true, nullptr,
                  0.f);
  for (size_t i = 0; i < sz(n); ++i) {
    buf[i] = g1[i] + wd * p[i];
    p[i] -= lr * buf[i];
  }
  expect_match(get(p_), p, "momentum, first step: p", tol(Cmp::kApprox));
  expect_match(get(buf_), buf, "momentum, first step: buf", tol(Cmp::kApprox));
  be().sgd_update(p_.data(), g2_.data(), buf_.data(), n, lr_.data(), mom, wd, false, false, nullptr,
                  0.f);
  for (size_t i = 0; i < sz(n); ++i) {
    buf[i] = mom * buf[i] + g2[i] + wd * p[i];
    p[i] -= lr * buf[i];
  }
  expect_match(get(p_), p, "momentum, second step: p", tol(Cmp::kApprox));
  expect_match(get(buf_), buf, "momentum, second step: buf", tol(Cmp::kApprox));

  // Without momentum the buffer is not used: p -= lr (g + wd p), buf keeps its values.
  std::vector<double> q(p0.begin(), p0.end());
  auto q_ = put(p0), qbuf_ = put(garbage);
  for (bool first : {true, false}) {
    be().sgd_update(q_.data(), g1_.data(), qbuf_.data(), n, lr_.data(), 0.f, wd, false, first,
                    nullptr, 0.f);
    for (size_t i = 0; i < sz(n); ++i) q[i] -= lr * (g1[i] + wd * q[i]);
  }
  expect_match(get(q_), q, "no momentum: p after two steps", tol(Cmp::kApprox));
  EXPECT_EQ(get(qbuf_), garbage) << "no momentum: buf touched";
}

TEST_P(BackendOps, SumSquaresInDouble) {
  // Values whose squares need double: 3e20^2 overflows float; the sum must not.
  for (int64_t n : {0, 1, 5, 1000, 70001}) {
    std::vector<float> x = uniform(sz(n), 1100 + static_cast<uint64_t>(n), -2.f, 2.f);
    if (n > 3) x[3] = 3e20f;
    double ref = 0;
    for (float v : x) ref += static_cast<double>(v) * static_cast<double>(v);
    auto x_ = put(x.empty() ? std::vector<float>{9.f} : x);
    auto out_ = to_backend_array(be(), std::vector<double>{-1.0});
    be().sum_squares(x_.data(), n, out_.data());
    const double got = to_host(out_)[0];
    EXPECT_NEAR(got, ref, 1e-12 * std::max(1.0, ref)) << "n " << n;
  }
}

// The guard and clipping of sgd_update against PyTorch's rules written out: a non-finite sum of
// squares leaves everything as it was; clip_grad_norm_ scales by min(1, max_norm / (norm + 1e-6)).
TEST_P(BackendOps, SgdUpdateGuardAndClip) {
  const int64_t n = 29;
  const float lr = 0.25f, mom = 0.9f, wd = 0.01f;
  const auto p0 = uniform(sz(n), 1200), g = uniform(sz(n), 1201, -3.f, 3.f),
             b0 = uniform(sz(n), 1202);
  double sumsq = 0;
  for (float v : g) sumsq += static_cast<double>(v) * v;
  const double norm = std::sqrt(sumsq);
  auto lr_ = put({0.f});
  be().store_scalar(lr_.data(), lr);
  auto g_ = put(g);
  for (double bad : {std::nan(""), HUGE_VAL, -HUGE_VAL}) {
    auto p_ = put(p0), buf_ = put(b0);
    auto s_ = to_backend_array(be(), std::vector<double>{bad});
    be().sgd_update(p_.data(), g_.data(), buf_.data(), n, lr_.data(), mom, wd, false, false,
                    s_.data(), 1.f);
    EXPECT_EQ(get(p_), p0) << "a non-finite step changed the parameters (" << bad << ")";
    EXPECT_EQ(get(buf_), b0) << "a non-finite step changed the momentum (" << bad << ")";
  }
  auto s_ = to_backend_array(be(), std::vector<double>{sumsq});
  for (double max_norm : {0.0, norm * 2, norm / 4}) {  // off, above the norm (no change), below it
    const double c = max_norm > 0 ? std::min(1.0, max_norm / (norm + 1e-6)) : 1.0;
    std::vector<double> p(p0.begin(), p0.end()), buf(b0.begin(), b0.end());
    for (size_t i = 0; i < sz(n); ++i) {
      buf[i] = mom * buf[i] + c * g[i] + wd * p[i];
      p[i] -= lr * buf[i];
    }
    auto p_ = put(p0), buf_ = put(b0);
    be().sgd_update(p_.data(), g_.data(), buf_.data(), n, lr_.data(), mom, wd, false, false,
                    s_.data(), static_cast<float>(max_norm));
    expect_match(get(p_), p, "clip " + std::to_string(max_norm) + ": p", tol(Cmp::kApprox));
    expect_match(get(buf_), buf, "clip " + std::to_string(max_norm) + ": buf", tol(Cmp::kApprox));
  }
  // A norm of about 1e-5, where clip_grad_norm_'s 1e-6 is a tenth of the denominator (above, it is
  // below the tolerance): plain SGD from p = 0 at a rate of 1e5, so p is -1e5 c g.
  std::vector<float> small(g.size());
  double small_sumsq = 0;
  for (size_t i = 0; i < small.size(); ++i) {
    small[i] = g[i] * 1e-6f;
    small_sumsq += static_cast<double>(small[i]) * small[i];
  }
  const double small_norm = std::sqrt(small_sumsq), max_norm = small_norm / 4,
               c = max_norm / (small_norm + 1e-6);
  auto small_ = put(small), big_lr_ = put({0.f});
  be().store_scalar(big_lr_.data(), 1e5f);
  auto small_s_ = to_backend_array(be(), std::vector<double>{small_sumsq});
  auto p_ = put(std::vector<float>(sz(n), 0.f));
  be().sgd_update(p_.data(), small_.data(), nullptr, n, big_lr_.data(), 0.f, 0.f, false, false,
                  small_s_.data(), static_cast<float>(max_norm));
  std::vector<double> p(sz(n));
  for (size_t i = 0; i < sz(n); ++i) p[i] = -1e5 * c * small[i];
  expect_match(get(p_), p, "clip at a norm of about 1e-5: p", tol(Cmp::kApprox));
}

// torch.nn.utils.clip_grad_norm_ multiplies the gradients by min(1, max_norm / (norm + 1e-6))
// ALWAYS, computed in fp32 as reciprocal(norm + 1e-6) * max_norm (Tensor.__rtruediv__): a norm at
// or just under max_norm, within the 1e-6, is scaled too. dptrain scaled only where norm >
// max_norm, so at a norm of ~0.01 and max_norm = norm + 5e-7 its step was 1 + 5e-5 times torch's.
// Plain SGD from p = 0 at a rate of 1 makes p = -(c g) exactly, so the coefficient shows bit for
// bit; an unclipped step (c clamped to 1) is exactly -g.
TEST_P(BackendOps, ClipGradNormScalesJustUnderTheLimitAsTorch) {
  const int64_t n = 37;
  std::vector<float> g = uniform(sz(n), 1210, -0.004f, 0.004f);
  double sumsq = 0;
  for (float v : g) sumsq += static_cast<double>(v) * v;
  const double norm = std::sqrt(sumsq);
  ASSERT_GT(norm, 0.005);
  ASSERT_LT(norm, 0.05);
  auto lr_ = put({0.f});
  be().store_scalar(lr_.data(), 1.f);
  auto g_ = put(g);
  auto s_ = to_backend_array(be(), std::vector<double>{sumsq});
  // max_norm - norm: just above the norm (the window), equal, under it (clipped all along), and
  // above it by more than the 1e-6 (c clamped to 1).
  for (const double above : {5e-7, 0.0, -1e-3, 2e-6}) {
    SCOPED_TRACE("max_norm = norm + " + std::to_string(above));
    const auto max_norm = static_cast<float>(norm + above);
    const float torch_c = std::min(1.f, (1.f / (static_cast<float>(norm) + 1e-6f)) * max_norm);
    if (above < 1e-6)
      EXPECT_LT(torch_c, 1.f - 1e-5f) << "torch scales here";
    else
      EXPECT_EQ(torch_c, 1.f) << "torch leaves the gradient as it is";
    auto p_ = put(std::vector<float>(sz(n), 0.f));
    be().sgd_update(p_.data(), g_.data(), nullptr, n, lr_.data(), 0.f, 0.f, false, false, s_.data(),
                    max_norm);
    std::vector<double> want(sz(n));
    for (size_t i = 0; i < sz(n); ++i) want[i] = -(torch_c * g[i]);
    expect_match(get(p_), want, "p = -(c g)", tol(Cmp::kExact));
  }
}

// torch.nn.CrossEntropyLoss(label_smoothing=e) as its documentation defines it, in double: with
// log p = log_softmax(z), each row's loss is (1-e) (-log p_y) + e/k sum_j (-log p_j), and the
// gradient of the summed loss (times the scale) is p - ((1-e) onehot + e/k).
TEST_P(BackendOps, SoftmaxXentLabelSmoothingMatchesTorch) {
  const int64_t n = 7, k = 10;
  const float scale = 0.125f;
  const auto z = uniform(sz(n * k), 910, -4.f, 4.f);
  std::vector<int32_t> labels(sz(n));
  for (int64_t r = 0; r < n; ++r) labels[sz(r)] = static_cast<int32_t>((3 * r + 1) % k);
  DeviceArray<int32_t> l_ = to_backend_array(be(), labels);
  auto z_ = put(z);
  // 1 (the uniform target alone, which torch accepts) and the float just under it too.
  for (const float e : {0.1f, 0.35f, std::nextafter(1.f, 0.f), 1.f}) {
    SCOPED_TRACE("label_smoothing " + std::to_string(e));
    double loss = 0, hits = 0;
    std::vector<double> d(sz(n * k));
    for (int64_t r = 0; r < n; ++r) {
      const float* zr = z.data() + r * k;
      double se = 0;
      for (int64_t j = 0; j < k; ++j) se += std::exp(static_cast<double>(zr[j]));
      std::vector<double> logp(sz(k));
      for (int64_t j = 0; j < k; ++j) logp[sz(j)] = zr[j] - std::log(se);
      const int32_t y = labels[sz(r)];
      double smooth = 0;
      for (int64_t j = 0; j < k; ++j) smooth += -logp[sz(j)];
      loss += (1.0 - e) * -logp[sz(y)] + e / static_cast<double>(k) * smooth;
      hits += (std::max_element(zr, zr + k) - zr) == y;
      for (int64_t j = 0; j < k; ++j) {
        const double q = (j == y ? 1.0 - e : 0.0) + e / static_cast<double>(k);
        d[sz(r * k + j)] = (std::exp(logp[sz(j)]) - q) * scale;
      }
    }
    auto d_ = put(std::vector<float>(d.size(), 7.f));
    DeviceArray<double> s_ = to_backend_array(be(), std::vector<double>{100.0, 100.0});
    be().softmax_xent(z_.data(), l_.data(), n, k, scale, e, d_.data(), s_.data(), false);
    expect_match(get(d_), d, "dlogits", tol(Cmp::kApprox));
    const std::vector<double> s = to_host(s_);
    EXPECT_NEAR(s[0], loss, 1e-4 * loss) << "summed smoothed loss";
    EXPECT_EQ(s[1], hits) << "argmax hits (smoothing does not change them)";
    // Each row's gradient still sums to zero (q sums to 1, as the softmax does).
    const std::vector<float> got = get(d_);
    for (int64_t r = 0; r < n; ++r) {
      double row = 0;
      for (int64_t j = 0; j < k; ++j) row += got[sz(r * k + j)];
      EXPECT_NEAR(row, 0.0, 1e-6) << "row " << r;
    }
  }
}

// PyTorch itself, where /usr/bin/python3 imports torch (Debian's python3-torch; skipped otherwise):
// F.cross_entropy(label_smoothing=e, reduction='sum') and its gradient at e = 0, 0.1, the float
// under 1 and 1 (which dptrain refused), and clip_grad_norm_ over three tensors (torch's norm of
// the per-tensor norms) at max_norm just above the norm (torch scales there; dptrain did not),
// under it and well above it. One interpreter start per backend; the values travel as JSON (a
// float's value exactly, as a double).
const char* kTorchScript = R"PY(
import json, sys
try:
    import torch
except ImportError:
    sys.exit(77)
a = json.load(open(sys.argv[1]))
out = {'ce': [], 'clip': []}
z0 = torch.tensor(a['z'], dtype=torch.float32).reshape(a['n'], a['k'])
y = torch.tensor(a['labels'], dtype=torch.int64)
for e in a['es']:
    z = z0.clone().requires_grad_(True)
    loss = torch.nn.functional.cross_entropy(z, y, label_smoothing=e, reduction='sum')
    loss.backward()
    out['ce'].append({'loss': loss.item(), 'grad': z.grad.flatten().tolist()})
for m in a['max_norms']:
    ps = [torch.nn.Parameter(t.clone()) for t in
          torch.tensor(a['g'], dtype=torch.float32).split(a['splits'])]
    for p in ps:
        p.grad = p.detach().clone()
    norm = torch.nn.utils.clip_grad_norm_(ps, m)
    out['clip'].append({'norm': norm.item(), 'g': torch.cat([p.grad for p in ps]).tolist()})
print(json.dumps(out))
)PY";

TEST_P(BackendOps, SoftmaxXentAndClipMatchPythonTorch) {
  if (::access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "/usr/bin/python3 not available";
  const int64_t n = 6, k = 7, len = 40;
  const auto z = uniform(sz(n * k), 1610, -3.f, 3.f);
  std::vector<int32_t> labels(sz(n));
  for (int64_t r = 0; r < n; ++r) labels[sz(r)] = static_cast<int32_t>((2 * r + 3) % k);
  const std::vector<float> es = {0.f, 0.1f, std::nextafter(1.f, 0.f), 1.f};
  const auto g = uniform(sz(len), 1611, -0.003f, 0.003f);
  double sumsq = 0;
  for (float v : g) sumsq += static_cast<double>(v) * v;
  const double norm = std::sqrt(sumsq);
  const std::vector<float> max_norms = {static_cast<float>(norm + 5e-7),
                                        static_cast<float>(norm / 3), static_cast<float>(norm * 2)};
  const std::string dir = test::make_temp_dir("torch_ref");
  {
    const nlohmann::json in = {{"z", z},
                               {"n", n},
                               {"k", k},
                               {"labels", labels},
                               {"es", es},
                               {"g", g},
                               {"splits", {10, 25, 5}},
                               {"max_norms", max_norms}};
    std::ofstream(dir + "/in.json") << in.dump();
    std::ofstream(dir + "/ref.py") << kTorchScript;
  }
  const std::string cmd = "/usr/bin/python3 " + dir + "/ref.py " + dir + "/in.json > " + dir +
                          "/out.json 2> " + dir + "/err.txt";
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status)) << status;
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << "/usr/bin/python3 cannot import torch";
  ASSERT_EQ(WEXITSTATUS(status), 0) << std::ifstream(dir + "/err.txt").rdbuf();
  nlohmann::json out;
  std::ifstream(dir + "/out.json") >> out;
  std::filesystem::remove_all(dir);

  DeviceArray<int32_t> l_ = to_backend_array(be(), labels);
  auto z_ = put(z);
  for (size_t i = 0; i < es.size(); ++i) {
    SCOPED_TRACE("label_smoothing " + std::to_string(es[i]));
    const auto& ref = out["ce"][i];
    auto d_ = put(std::vector<float>(sz(n * k), 7.f));
    DeviceArray<double> s_ = to_backend_array(be(), std::vector<double>{0.0, 0.0});
    be().softmax_xent(z_.data(), l_.data(), n, k, 1.f, es[i], d_.data(), s_.data(), false);
    expect_match(get(d_), ref["grad"].get<std::vector<double>>(), "dlogits vs torch",
                 tol(Cmp::kApprox));
    const double loss = ref["loss"].get<double>();
    EXPECT_NEAR(to_host(s_)[0], loss, (is_cpu() ? 1e-6 : 1e-4) * loss) << "summed loss vs torch";
  }
  auto lr_ = put({0.f});
  be().store_scalar(lr_.data(), 1.f);
  auto g_ = put(g);
  auto s_ = to_backend_array(be(), std::vector<double>{sumsq});
  for (size_t i = 0; i < max_norms.size(); ++i) {
    SCOPED_TRACE("max_norm " + std::to_string(max_norms[i]) + ", norm " + std::to_string(norm));
    EXPECT_NEAR(out["clip"][i]["norm"].get<double>(), norm, 1e-6 * norm) << "torch's norm";
    // Plain SGD from 0 at a rate of 1: p = -(the clipped gradient). Our norm and torch's differ in
    // their last bits at most (double against fp32 sums), so the coefficients do too; the step
    // dptrain took without scaling was 3e-5 off, beyond this tolerance.
    auto p_ = put(std::vector<float>(sz(len), 0.f));
    be().sgd_update(p_.data(), g_.data(), nullptr, len, lr_.data(), 0.f, 0.f, false, false,
                    s_.data(), max_norms[i]);
    std::vector<double> want;
    for (double v : out["clip"][i]["g"].get<std::vector<double>>()) want.push_back(-v);
    expect_match(get(p_), want, "p = -(torch's clipped gradient)", {false, 1e-6, 0});
  }
}

// torch.optim.AdamW (amsgrad off), its documented algorithm in double, over four steps with the
// step count in backend memory: p *= 1 - lr wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps). The steps are compared as changes
// (p - p_before), which hold every term, and the moments as they are.
struct RefAdamW {
  double b1, b2, eps;
  std::vector<double> p, m, v;
  int64_t t = 0;
  // One step at `lr` with per-element weight decay wd(i) and gradient scale c: the changes of p.
  std::vector<double> step(const std::vector<float>& g, double lr,
                           const std::function<double(size_t)>& wd, double c = 1.0) {
    ++t;
    std::vector<double> dp(p.size());
    for (size_t i = 0; i < p.size(); ++i) {
      const double before = p[i], gi = c * g[i];
      p[i] *= 1.0 - lr * wd(i);
      m[i] = b1 * m[i] + (1.0 - b1) * gi;
      v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
      const double bc1 = 1.0 - std::pow(b1, static_cast<double>(t)),
                   bc2 = 1.0 - std::pow(b2, static_cast<double>(t));
      p[i] -= lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + eps);
      dp[i] = p[i] - before;
    }
    return dp;
  }
};

std::vector<float> changes(const std::vector<float>& now, const std::vector<float>& before) {
  std::vector<float> d(now.size());
  for (size_t i = 0; i < d.size(); ++i)
    d[i] = static_cast<float>(double{now[i]} - double{before[i]});
  return d;
}

// torch.optim.SGD(momentum=mu, nesterov=True, weight_decay=wd), its documented algorithm in double:
// d = g + wd p; b = d on the first step, else mu b + d; p -= lr (d + mu b). The steps are compared
// as changes too: plain momentum would move by lr b alone.
TEST_P(BackendOps, SgdUpdateNesterovMatchesTorch) {
  const int64_t n = 41;
  const float lr = 0.3f, mom = 0.9f, wd = 0.05f;
  auto lr_ = put({0.f});
  be().store_scalar(lr_.data(), lr);
  const auto p0 = uniform(sz(n), 1300), garbage = uniform(sz(n), 1301);
  std::vector<double> p(p0.begin(), p0.end()), b(sz(n));
  auto p_ = put(p0), buf_ = put(garbage);
  for (int step = 0; step < 3; ++step) {
    const auto g = uniform(sz(n), 1310 + static_cast<uint64_t>(step), -2.f, 2.f);
    auto g_ = put(g);
    const std::vector<float> before = get(p_);
    be().sgd_update(p_.data(), g_.data(), buf_.data(), n, lr_.data(), mom, wd, true, step == 0,
                    nullptr, 0.f);
    std::vector<double> dp(sz(n));
    for (size_t i = 0; i < sz(n); ++i) {
      const double d = g[i] + double{wd} * p[i];
      b[i] = step == 0 ? d : double{mom} * b[i] + d;
      dp[i] = -double{lr} * (d + double{mom} * b[i]);
      p[i] += dp[i];
    }
    const std::string at = "nesterov step " + std::to_string(step) + ": ";
    expect_match(changes(get(p_), before), dp, at + "p - p_before", tol(Cmp::kApprox));
    expect_match(get(p_), p, at + "p", tol(Cmp::kApprox));
    expect_match(get(buf_), b, at + "buf", tol(Cmp::kApprox));
  }
  // Nesterov without momentum is plain SGD (the flag refuses it; the kernel ignores it).
  std::vector<double> q(p0.begin(), p0.end());
  auto q_ = put(p0), qbuf_ = put(garbage);
  const auto g = uniform(sz(n), 1320);
  auto g_ = put(g);
  be().sgd_update(q_.data(), g_.data(), qbuf_.data(), n, lr_.data(), 0.f, wd, true, true, nullptr,
                  0.f);
  for (size_t i = 0; i < sz(n); ++i) q[i] -= lr * (g[i] + wd * q[i]);
  expect_match(get(q_), q, "no momentum: p", tol(Cmp::kApprox));
  EXPECT_EQ(get(qbuf_), garbage) << "no momentum: buf touched";
}

TEST_P(BackendOps, AdamwUpdateMatchesTorch) {
  const int64_t n = 53;
  const double b1 = 0.8, b2 = 0.99, eps = 1e-6, wd = 0.1;
  const auto p0 = uniform(sz(n), 1400);
  RefAdamW ref{
      b1, b2, eps, {p0.begin(), p0.end()}, std::vector<double>(sz(n)), std::vector<double>(sz(n))};
  auto p_ = put(p0), m_ = put(std::vector<float>(sz(n))), v_ = put(std::vector<float>(sz(n)));
  auto t_ = to_backend_array(be(), std::vector<double>{0.0});
  auto lr_ = put({0.f});
  for (int step = 0; step < 4; ++step) {
    const float lr = 0.05f * static_cast<float>(step + 1);  // a schedule: the rate read each step
    be().store_scalar(lr_.data(), lr);
    auto g = uniform(sz(n), 1410 + static_cast<uint64_t>(step), -2.f, 2.f);
    if (step == 1) g[3] = 0.f;  // a zero gradient still moves a parameter by its moments
    auto g_ = put(g);
    const std::vector<float> before = get(p_);
    be().adamw_update(p_.data(), g_.data(), m_.data(), v_.data(), n, lr_.data(), t_.data(), true,
                      b1, b2, eps, wd, nullptr, 0.f);
    const auto dp = ref.step(g, lr, [&](size_t) { return wd; });
    const std::string at = "AdamW step " + std::to_string(step + 1) + ": ";
    expect_match(changes(get(p_), before), dp, at + "p - p_before", tol(Cmp::kApprox));
    expect_match(get(m_), ref.m, at + "exp_avg", tol(Cmp::kApprox));
    expect_match(get(v_), ref.v, at + "exp_avg_sq", tol(Cmp::kApprox));
    EXPECT_EQ(to_host(t_)[0], step + 1) << at << "the step count";
  }
}

// Why --eps must be at least float's smallest normal: a parameter whose gradient is still 0 has
// zero moments, so its update is 0 / (0 + eps): 0 at that eps, NaN at eps 0.
TEST_P(BackendOps, AdamwSmallestEpsKeepsAZeroGradientsParameterAsItIs) {
  const int64_t n = 9;
  const auto p0 = uniform(sz(n), 1450);
  for (const double eps : {double{std::numeric_limits<float>::min()}, 0.0}) {
    auto p_ = put(p0), m_ = put(std::vector<float>(sz(n))), v_ = put(std::vector<float>(sz(n)));
    auto g_ = put(std::vector<float>(sz(n)));
    auto t_ = to_backend_array(be(), std::vector<double>{0.0});
    auto lr_ = put({0.f});
    be().store_scalar(lr_.data(), 0.1f);
    be().adamw_update(p_.data(), g_.data(), m_.data(), v_.data(), n, lr_.data(), t_.data(), true,
                      0.9, 0.999, eps, 0.0, nullptr, 0.f);
    const auto p = get(p_);
    for (size_t i = 0; i < sz(n); ++i) {
      if (eps > 0)
        ASSERT_EQ(p[i], p0[i]) << i;
      else
        ASSERT_TRUE(std::isnan(p[i])) << i << ": " << p[i];
    }
  }
}

// One step cut into ranges of their own weight decay (--no-decay-bn-bias) counts once, in the call
// that says so; the non-finite guard leaves everything, the count too; clipping scales the
// gradients by clip_grad_norm_'s coefficient before the moments see them.
TEST_P(BackendOps, AdamwUpdateRangesGuardAndClip) {
  const int64_t n = 30, cut = 11;
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.2;
  const float lr = 0.1f;
  const auto p0 = uniform(sz(n), 1500), g = uniform(sz(n), 1501, -3.f, 3.f);
  double sumsq = 0;
  for (float x : g) sumsq += double{x} * x;
  const double norm = std::sqrt(sumsq);
  auto lr_ = put({0.f});
  be().store_scalar(lr_.data(), lr);
  auto g_ = put(g);
  // Resumed at step 5 (t = 6 for this update): the moments and count come from a checkpoint.
  const auto m0 = uniform(sz(n), 1502, -0.5f, 0.5f), v0 = uniform(sz(n), 1503, 0.f, 0.5f);
  for (const double max_norm : {0.0, norm / 3}) {
    SCOPED_TRACE("clip " + std::to_string(max_norm));
    const double c = max_norm > 0 ? max_norm / (norm + 1e-6) : 1.0;
    RefAdamW ref{
        b1, b2, eps, {p0.begin(), p0.end()}, {m0.begin(), m0.end()}, {v0.begin(), v0.end()}, 5};
    auto p_ = put(p0), m_ = put(m0), v_ = put(v0);
    auto t_ = to_backend_array(be(), std::vector<double>{5.0});
    auto s_ = to_backend_array(be(), std::vector<double>{sumsq});
    const auto mf = static_cast<float>(max_norm);
    // [0, cut) without decay, [cut, n) with it; the count moves in the second call only.
    be().adamw_update(p_.data(), g_.data(), m_.data(), v_.data(), cut, lr_.data(), t_.data(), false,
                      b1, b2, eps, 0.0, s_.data(), mf);
    EXPECT_EQ(to_host(t_)[0], 5.0) << "the first range counted the step";
    be().adamw_update(p_.data() + cut, g_.data() + cut, m_.data() + cut, v_.data() + cut, n - cut,
                      lr_.data(), t_.data(), true, b1, b2, eps, wd, s_.data(), mf);
    EXPECT_EQ(to_host(t_)[0], 6.0) << "the step was not counted once";
    const auto dp = ref.step(
        g, lr, [&](size_t i) { return i < sz(cut) ? 0.0 : wd; }, c);
    expect_match(changes(get(p_), p0), dp, "p - p_before", tol(Cmp::kApprox));
    expect_match(get(m_), ref.m, "exp_avg", tol(Cmp::kApprox));
    expect_match(get(v_), ref.v, "exp_avg_sq", tol(Cmp::kApprox));
  }
  for (double bad : {std::nan(""), HUGE_VAL}) {
    auto p_ = put(p0), m_ = put(m0), v_ = put(v0);
    auto t_ = to_backend_array(be(), std::vector<double>{5.0});
    auto s_ = to_backend_array(be(), std::vector<double>{bad});
    be().adamw_update(p_.data(), g_.data(), m_.data(), v_.data(), n, lr_.data(), t_.data(), true,
                      b1, b2, eps, wd, s_.data(), 1.f);
    EXPECT_EQ(get(p_), p0) << "a non-finite step changed the parameters (" << bad << ")";
    EXPECT_EQ(get(m_), m0) << "a non-finite step changed exp_avg (" << bad << ")";
    EXPECT_EQ(get(v_), v0) << "a non-finite step changed exp_avg_sq (" << bad << ")";
    EXPECT_EQ(to_host(t_)[0], 5.0) << "a non-finite step was counted (" << bad << ")";
  }
}

// ---- layers on the backend ----------------------------------------------------------------------

// Parameter values for a store: BatchNorm gammas (Init::kOnes) in [0.5, 1.5], running means in
// [-0.5, 0.5], running variances in [0.5, 2], counters 0, everything else in [-0.5, 0.5].
void init_values(ParamStore& st, uint64_t seed) {
  std::mt19937_64 g(seed);
  for (Param& p : st.entries()) {
    float* v = p.value.data();
    if (p.is_counter) {
      std::fill(v, v + p.numel(), 0.f);
    } else if (p.is_buffer && p.name.ends_with("running_var")) {
      test::fill_uniform(v, p.numel(), g, 0.5f, 2.f);
    } else if (p.init == Init::kOnes) {
      test::fill_uniform(v, p.numel(), g, 0.5f, 1.5f);
    } else {
      test::fill_uniform(v, p.numel(), g, -0.5f, 0.5f);
    }
  }
}

// Which parameter an index of the flat gradient array belongs to.
std::string param_at(const ParamStore& st, size_t i) {
  for (const Param& p : st.entries())
    if (!p.is_buffer && static_cast<int64_t>(i) >= p.offset &&
        static_cast<int64_t>(i) < p.offset + p.numel())
      return p.name + "[" + std::to_string(static_cast<int64_t>(i) - p.offset) + "]";
  return "?";
}

// Every parameter's gradient range is announced exactly once, the announcements are disjoint and
// grow a prefix [0, k) of the flat gradient array (nn.h's invariant), and a layer without
// parameters announces nothing.
void expect_announcements(const ParamStore& st,
                          const std::vector<std::pair<int64_t, int64_t>>& ranges,
                          const std::string& what) {
  SCOPED_TRACE(what);
  const int64_t np = st.num_params();
  if (np == 0) {
    EXPECT_TRUE(ranges.empty()) << "announcements from a layer without parameters";
    return;
  }
  std::vector<int> times(sz(np), 0);
  int64_t next = 0;
  for (const auto& [b, e] : ranges) {
    ASSERT_TRUE(0 <= b && b < e && e <= np)
        << "range [" << b << ", " << e << ") outside [0, " << np << ")";
    EXPECT_EQ(b, next) << "announcements do not grow a prefix";
    next = e;
    for (int64_t j = b; j < e; ++j) ++times[sz(j)];
  }
  for (const Param& p : st.entries()) {
    if (p.is_buffer) continue;
    int lo = 1 << 30, hi = 0;
    for (int64_t j = p.offset; j < p.offset + p.numel(); ++j)
      lo = std::min(lo, times[sz(j)]), hi = std::max(hi, times[sz(j)]);
    EXPECT_TRUE(lo == 1 && hi == 1) << p.name << " announced " << lo << " to " << hi << " times";
  }
}

struct LayerCase {
  std::string what;
  std::function<std::unique_ptr<Layer>()> make;
  Shape in;  // per sample
  int64_t n = 2;
  Mode mode = Mode::kTrain;
  float gap = 0;     // inputs kept at |x| >= gap (a ReLU on the input: no kink within the step)
  double shift = 0;  // added to the input per channel (BatchNorm statistics away from (0, 1))
  // ReLUs behind train-mode BatchNorm (Residual, Sequential): their kinks cannot be kept away from
  // the step, so a smaller step, several difference quotients (see check_input_gradient), and the
  // loss's rounding noise (measured: ~1e-6 on these losses) in the tolerances.
  bool kinks = false;
  float eps = 1e-2f;  // finite-difference step
  double noise = 0;   // rounding noise of one loss evaluation
  // Inputs a shuffled ramp, 0.05 apart (for max-pooling: no window's winner changes within the
  // finite-difference step, where uniform draws would put near-ties inside it).
  bool distinct = false;
};
LayerCase with_kinks(LayerCase lc) {
  lc.kinks = true;
  lc.eps = 2e-3f;
  lc.noise = 1e-6;
  return lc;
}

// dL/dx of L = sum r*y on the backend against central differences of L, each evaluated by a
// forward on the backend (float) and summed in double on the host, on up to 128 coordinates.
// FD_VERBOSE=1 prints each coordinate.
void check_input_gradient(Backend& be, Layer& layer, const LayerCase& lc, const Shape& xs,
                          const std::vector<float>& x, const std::vector<float>& r,
                          const std::vector<float>& dx) {
  SCOPED_TRACE(lc.what + ": finite differences of dx");
  Tensor t(xs, &be), y;  // reused: a device backend allocates once
  std::vector<float> yh;
  auto loss = [&](const std::vector<float>& v) {
    be.copy_from_host(t.data(), v.data(), v.size() * sizeof(float));
    layer.forward(t, y, lc.mode);
    yh.resize(sz(y.numel()));
    be.copy_to_host(yh.data(), y.data(), yh.size() * sizeof(float));
    double l = 0;
    for (size_t i = 0; i < yh.size(); ++i) l += static_cast<double>(r[i]) * yh[i];
    return l;
  };
  std::vector<size_t> idx(x.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::shuffle(idx.begin(), idx.end(), std::mt19937_64(17));
  idx.resize(std::min<size_t>(idx.size(), 128));
  // Difference quotients over the offsets actually applied (those of the rounded floats), each
  // with its share of the loss's rounding noise.
  struct Diff {
    double d, noise;
  };
  const double l0 = loss(x);
  auto at = [&](size_t i, float h) {
    std::vector<float> v = x;
    v[i] = x[i] + h;
    return std::pair<double, double>{static_cast<double>(v[i]) - x[i], loss(v)};
  };
  auto central = [&](std::pair<double, double> p, std::pair<double, double> m) {
    return Diff{(p.second - m.second) / (p.first - m.first), 2 * lc.noise / (p.first - m.first)};
  };
  // One-sided, second order (exact for quadratics) from the offsets a and b on the same side.
  auto one_sided = [&](std::pair<double, double> pa, std::pair<double, double> pb) {
    const double a = pa.first, b = pb.first;
    const double w0 = -(1 / a + 1 / b), wa = b / (a * (b - a)), wb = -a / (b * (b - a));
    return Diff{w0 * l0 + wa * pa.second + wb * pb.second,
                lc.noise * (std::fabs(w0) + std::fabs(wa) + std::fabs(wb))};
  };
  // Estimates of each coordinate's derivative: the central difference; with kinks also the central
  // difference at half the step and the one-sided ones on either side. A ReLU whose kink lies
  // within the step spoils the differences crossing it, not those on the side away from it (at a
  // kink the analytic gradient is one side's slope).
  std::vector<std::pair<size_t, std::vector<Diff>>> pts;
  double max_num = 0;
  for (size_t i : idx) {
    const auto p = at(i, lc.eps), m = at(i, -lc.eps);
    std::vector<Diff> e{central(p, m)};
    if (lc.kinks) {
      const auto p2 = at(i, lc.eps / 2), m2 = at(i, -lc.eps / 2);
      e.push_back(central(p2, m2));
      e.push_back(one_sided(p2, p));
      e.push_back(one_sided(m2, m));
    }
    max_num = std::max(max_num, std::fabs(e[0].d));
    pts.emplace_back(i, std::move(e));
  }
  ASSERT_GT(max_num, 1e-2) << "the numeric gradient is ~0: the check would mean nothing";
  // Per estimate: 3e-3 of max(|estimate|, a tenth of the sample's largest), plus its noise.
  const double floor = 0.1 * max_num, rtol = 3e-3;
  auto tol_of = [&](const Diff& e) { return rtol * std::max(floor, std::fabs(e.d)) + e.noise; };
  int skipped = 0, checked = 0;
  double err2 = 0, num2 = 0, worst = 0;
  for (const auto& [i, e] : pts) {
    const double a = dx[i];
    size_t best = 0;
    double lo = e[0].d, hi = e[0].d;
    for (size_t k = 0; k < e.size(); ++k) {
      if (std::fabs(a - e[k].d) / tol_of(e[k]) < std::fabs(a - e[best].d) / tol_of(e[best]))
        best = k;
      lo = std::min(lo, e[k].d), hi = std::max(hi, e[k].d);
    }
    const double ratio = std::fabs(a - e[best].d) / tol_of(e[best]);
    // No estimate matches, and they disagree among themselves: a ReLU flipped within the step.
    const bool skip = ratio > 1 && hi - lo > tol_of(e[0]) + e.back().noise;
    if (std::getenv("FD_VERBOSE")) {
      std::printf("  %-24s x[%zu] analytic %.7f numeric", lc.what.c_str(), i, a);
      for (const Diff& d : e) std::printf(" %.7f", d.d);
      std::printf(" err/tol %.3f%s\n", ratio, skip ? " skipped" : "");
    }
    if (skip) {
      ++skipped;
      continue;
    }
    ++checked;
    err2 += (a - e[best].d) * (a - e[best].d);
    num2 += e[best].d * e[best].d;
    worst = std::max(worst, ratio);
    EXPECT_NEAR(a, e[best].d, tol_of(e[best])) << "coordinate " << i;
  }
  EXPECT_LE(skipped, static_cast<int>(pts.size()) / 4) << "too many coordinates at ReLU kinks";
  EXPECT_GT(checked, 0);
  EXPECT_LT(std::sqrt(err2), 1e-2 * std::sqrt(num2)) << "relative L2 error over the sample";
  if (std::getenv("FD_VERBOSE"))
    std::printf("  %-24s checked %d skipped %d worst err/tol %.3f\n", lc.what.c_str(), checked,
                skipped, worst);
}

// One layer kind on the backend: built on a ParamStore there and, as the reference, on the CPU
// backend with the same parameter values. Forward, backward (overwriting, then accumulating) and
// the running statistics must agree; the announcements cover every parameter once; and dx must
// match finite differences computed on the backend.
// A layer built on a backend and, as the reference, on the CPU backend with the same parameter
// and buffer values (init_values(seed)); xs, ys: the batch's input and output shapes; x: the
// case's input (its gap and shift applied), r: a second uniform array shaped like the output.
struct LayerPair {
  LayerPair(Backend& be) : st(be), rst(cpu_backend()) {}
  ParamStore st, rst;
  std::unique_ptr<Layer> layer, ref;
  Shape xs, ys;
  std::vector<float> x, r;
};
void build_pair(LayerPair& p, const LayerCase& lc, uint64_t seed) {
  p.layer = lc.make(), p.ref = lc.make();
  const Shape out = p.layer->build(lc.in, p.st, "l");
  ASSERT_EQ(p.ref->build(lc.in, p.rst, "l"), out);
  p.st.finalize();
  p.rst.finalize();
  ASSERT_EQ(p.st.num_params(), p.rst.num_params());
  init_values(p.st, seed);
  std::copy(p.st.params(), p.st.params() + p.st.num_params(), p.rst.params());
  std::copy(p.st.buffers(), p.st.buffers() + p.st.num_buffers(), p.rst.buffers());
  p.st.from_host();
  p.rst.from_host();
  p.xs = p.ys = Shape{lc.n};
  p.xs.insert(p.xs.end(), lc.in.begin(), lc.in.end());
  p.ys.insert(p.ys.end(), out.begin(), out.end());
  p.x = uniform(sz(shape_numel(p.xs)), seed + 1);
  p.r = uniform(sz(shape_numel(p.ys)), seed + 2);
  if (lc.distinct) {
    for (size_t i = 0; i < p.x.size(); ++i) p.x[i] = 0.05f * static_cast<float>(i) - 3.f;
    std::shuffle(p.x.begin(), p.x.end(), std::mt19937_64(seed));
  }
  const int64_t ch = lc.in.back();
  for (size_t i = 0; i < p.x.size(); ++i) {
    if (lc.gap > 0) p.x[i] = (p.x[i] < 0 ? -lc.gap : lc.gap) + (1 - lc.gap) * p.x[i];
    p.x[i] += static_cast<float>(lc.shift * static_cast<double>(i % sz(ch)));
  }
}

void check_layer(Backend& be, Tol tol, const LayerCase& lc, uint64_t seed) {
  SCOPED_TRACE(lc.what + " on " + be.name());
  LayerPair p(be);
  build_pair(p, lc, seed);
  if (::testing::Test::HasFatalFailure()) return;
  ParamStore &st = p.st, &rst = p.rst;
  const std::unique_ptr<Layer>&layer = p.layer, &ref = p.ref;
  const Shape &xs = p.xs, &ys = p.ys;
  const std::vector<float>& r = p.r;
  std::vector<float>& x = p.x;
  const Tensor x_ = to_backend(be, x, xs), r_ = to_backend(be, r, ys);
  const Tensor xr = to_backend(cpu_backend(), x, xs), rr = to_backend(cpu_backend(), r, ys);

  Tensor y_, yr;
  layer->forward(x_, y_, lc.mode);
  ref->forward(xr, yr, lc.mode);
  ASSERT_EQ(y_.shape(), ys);
  expect_match(to_host(be, y_), as_double(to_host(cpu_backend(), yr)), "y", tol);

  // Backward must overwrite dx and the gradients (both start as garbage).
  const std::vector<float> garbage(sz(st.num_params()), -3.f);
  if (st.num_params() > 0) {
    be.copy_from_host(st.device_grads(), garbage.data(), garbage.size() * sizeof(float));
    std::copy(garbage.begin(), garbage.end(), rst.device_grads());
  }
  Tensor dx_ = to_backend(be, std::vector<float>(x.size(), 7.f), xs), dxr;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  BackwardCtx ctx, rctx;
  ctx.on_ready = [&](int64_t b, int64_t e) { ranges.emplace_back(b, e); };
  layer->backward(x_, y_, r_, &dx_, ctx);
  ref->backward(xr, yr, rr, &dxr, rctx);
  ASSERT_EQ(dx_.shape(), xs);
  const std::vector<float> dx = to_host(be, dx_);
  expect_match(dx, as_double(to_host(cpu_backend(), dxr)), "dx", tol);
  st.grads_to_host();
  const std::vector<float> g1(st.grads(), st.grads() + st.num_params());
  const std::vector<double> gref(rst.grads(), rst.grads() + rst.num_params());
  if (st.num_params() > 0)
    expect_match(g1, gref, "parameter gradients", tol, [&](size_t i) { return param_at(st, i); });
  if (st.num_buffers() > 0) {
    st.buffers_to_host();
    expect_match(std::vector<float>(st.buffers(), st.buffers() + st.num_buffers()),
                 std::vector<double>(rst.buffers(), rst.buffers() + rst.num_buffers()),
                 "running statistics", tol);
  }
  expect_announcements(st, ranges, "announcements");

  // Accumulating: the gradients double, dx is the same, the announcements are the same.
  ranges.clear();
  ctx.accumulate = true;
  Tensor dx2;
  layer->forward(x_, y_, lc.mode);  // a composite's backward handed its activations back
  layer->backward(x_, y_, r_, &dx2, ctx);
  expect_match(to_host(be, dx2), as_double(dx), "dx of the accumulating backward", tol);
  if (st.num_params() > 0) {
    st.grads_to_host();
    std::vector<double> twice(g1.begin(), g1.end());
    for (double& v : twice) v *= 2;
    expect_match(std::vector<float>(st.grads(), st.grads() + st.num_params()), twice,
                 "accumulated gradients", tol, [&](size_t i) { return param_at(st, i); });
  }
  expect_announcements(st, ranges, "announcements (accumulating)");
  if (::testing::Test::HasFatalFailure()) return;

  check_input_gradient(be, *layer, lc, xs, x, r, dx);
}

TEST_P(BackendOps, LayerConv2d) {
  check_layer(be(), tol(Cmp::kApprox),
              {"conv 3x3 p1", [] { return make_conv2d(4, 3, 1, 1); }, {5, 6, 3}}, 2000);
  check_layer(be(), tol(Cmp::kApprox),
              {"conv 3x3 s2 p1", [] { return make_conv2d(5, 3, 2, 1); }, {7, 8, 3}}, 2010);
  check_layer(be(), tol(Cmp::kApprox),
              {"conv 1x1 s2 no bias", [] { return make_conv2d(6, 1, 2, 0, false); }, {7, 7, 4}},
              2020);
  check_layer(be(), tol(Cmp::kApprox),
              {"conv 5x5 p2 no bias", [] { return make_conv2d(3, 5, 1, 2, false); }, {6, 6, 2}},
              2030);
}

TEST_P(BackendOps, LayerBatchNorm2d) {
  LayerCase lc{"batchnorm train", [] { return make_batchnorm2d(); }, {4, 3, 3}, 3};
  lc.shift = 0.7;
  check_layer(be(), tol(Cmp::kApprox), lc, 2100);
  lc.what = "batchnorm eval";
  lc.mode = Mode::kEval;
  check_layer(be(), tol(Cmp::kApprox), lc, 2110);
}

TEST_P(BackendOps, LayerBatchNorm2dRelu) {
  LayerCase lc =
      with_kinks({"batchnorm+relu train", [] { return make_batchnorm2d_relu(); }, {4, 3, 3}, 3});
  lc.shift = 0.7;
  check_layer(be(), tol(Cmp::kApprox), lc, 2150);
  lc.what = "batchnorm+relu eval";
  lc.mode = Mode::kEval;
  check_layer(be(), tol(Cmp::kApprox), lc, 2160);
}

TEST_P(BackendOps, LayerReLU) {
  LayerCase lc{"relu", [] { return make_relu(); }, {3, 4, 5}};
  lc.gap = 0.1f;
  check_layer(be(), tol(Cmp::kApprox), lc, 2200);
}

TEST_P(BackendOps, LayerAvgPool2d) {
  check_layer(be(), tol(Cmp::kApprox),
              {"avgpool 2/2", [] { return make_avgpool2d(2, 2); }, {5, 7, 3}}, 2300);
  check_layer(be(), tol(Cmp::kApprox),
              {"avgpool 3/1", [] { return make_avgpool2d(3, 1); }, {5, 4, 2}}, 2310);
}

TEST_P(BackendOps, LayerReluAvgPool2d) {
  LayerCase lc{"relu+avgpool 2/2", [] { return make_relu_avgpool2d(2, 2); }, {5, 7, 3}};
  lc.gap = 0.1f;
  check_layer(be(), tol(Cmp::kApprox), lc, 2400);
  lc = {"relu+avgpool 3/1", [] { return make_relu_avgpool2d(3, 1); }, {5, 4, 2}};
  lc.gap = 0.1f;
  check_layer(be(), tol(Cmp::kApprox), lc, 2410);
}

TEST_P(BackendOps, LayerMaxPool2d) {
  LayerCase lc{"maxpool 3/2/1", [] { return make_maxpool2d(3, 2, 1); }, {7, 6, 3}};
  lc.distinct = true;
  check_layer(be(), tol(Cmp::kApprox), lc, 2600);
  lc = {"maxpool 2/2/0", [] { return make_maxpool2d(2, 2, 0); }, {5, 7, 2}};
  lc.distinct = true;
  check_layer(be(), tol(Cmp::kApprox), lc, 2610);
}

TEST_P(BackendOps, LayerTorchvisionBlocks) {
  check_layer(
      be(), tol(Cmp::kApprox),
      with_kinks({"basic block", [] { return make_basic_block(3, 1, false, false); }, {5, 5, 3}}),
      2700);
  check_layer(be(), tol(Cmp::kApprox),
              with_kinks({"basic block downsample s2",
                          [] { return make_basic_block(4, 2, true, false); },
                          {6, 6, 3}}),
              2710);
  check_layer(be(), tol(Cmp::kApprox),
              with_kinks({"bottleneck downsample s2",
                          [] { return make_bottleneck(2, 2, true, false); },
                          {6, 6, 4}}),
              2720);
}

TEST_P(BackendOps, LayerGlobalAvgPool) {
  check_layer(be(), tol(Cmp::kApprox),
              {"global avgpool", [] { return make_global_avgpool(); }, {3, 4, 5}}, 2500);
}

TEST_P(BackendOps, LayerFlatten) {
  check_layer(be(), tol(Cmp::kApprox), {"flatten", [] { return make_flatten(); }, {2, 3, 4}}, 2600);
}

TEST_P(BackendOps, LayerLinear) {
  check_layer(be(), tol(Cmp::kApprox), {"linear", [] { return make_linear(7); }, {13}, 4}, 2700);
  check_layer(be(), tol(Cmp::kApprox),
              {"linear no bias", [] { return make_linear(5, false); }, {9}, 3}, 2710);
}

TEST_P(BackendOps, LayerResidual) {
  LayerCase lc =
      with_kinks({"residual identity", [] { return make_residual(3, false, 1); }, {5, 5, 3}});
  check_layer(be(), tol(Cmp::kApprox), lc, 2800);
  // 8 input channels on the 1x1 stride-2 shortcut (oneDNN's jit_1x1 note in test_gradcheck.cc).
  lc = with_kinks({"residual 1x1 s2", [] { return make_residual(4, true, 2); }, {6, 6, 8}});
  check_layer(be(), tol(Cmp::kApprox), lc, 2810);
  lc.what = "residual 1x1 s2 eval";
  lc.mode = Mode::kEval;
  check_layer(be(), tol(Cmp::kApprox), lc, 2820);
}

TEST_P(BackendOps, LayerSmallSequential) {
  // conv-BN-ReLU+pool-flatten-linear: the leaves chained, announcements in backward order.
  const LayerCase lc = with_kinks({"sequential",
                                   [] {
                                     auto s = std::make_unique<Sequential>();
                                     s->add("conv", make_conv2d(4, 3, 1, 1))
                                         .add("bn", make_batchnorm2d())
                                         .add("", make_relu_avgpool2d(2, 2))
                                         .add("", make_flatten())
                                         .add("fc", make_linear(5));
                                     return std::unique_ptr<Layer>(std::move(s));
                                   },
                                   {6, 6, 2},
                                   3});
  check_layer(be(), tol(Cmp::kApprox), lc, 2900);
}

// ---- 16-bit activations (backend.h's rule: widen, the float op, round to nearest even) ----------

// Host floats rounded to bfloat16 and widened back: the values a bf16 tensor can hold.
std::vector<float> bf16_rounded(std::vector<float> v) {
  for (float& f : v) f = float_from_bf16(bf16_from_float(f));
  return v;
}
// A bfloat16 tensor of `shape` in be's memory holding v rounded, and a bf16 tensor's values
// widened.
Tensor to_backend16(Backend& be, const std::vector<float>& v, const Shape& shape) {
  Tensor t(shape, &be, DType::kBF16);
  std::vector<BFloat16> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i].bits = bf16_from_float(v[i]);
  if (!h.empty()) be.copy_from_host(t.ptr<BFloat16>(), h.data(), h.size() * sizeof(BFloat16));
  return t;
}
std::vector<float> to_host16(Backend& be, const Tensor& t) {
  std::vector<BFloat16> h(static_cast<size_t>(t.numel()));
  if (!h.empty()) be.copy_to_host(h.data(), t.ptr<BFloat16>(), h.size() * sizeof(BFloat16));
  std::vector<float> v(h.size());
  for (size_t i = 0; i < h.size(); ++i) v[i] = float_from_bf16(h[i].bits);
  return v;
}

// One layer on the backend with bfloat16 activations against the same layer on the CPU with float
// activations, fed the same (bf16-representable) x and dy. A leaf layer computes one float
// operation between its input and its output, so its bf16 output is the float output rounded once,
// its bf16 dx the float dx rounded once, and its parameter gradients and running statistics the
// float ones: `out` and `grads` say how closely (exact on the CPU). A composite rounds between its
// leaves as well, which `out` must allow for.
void check_layer_bf16(Backend& be, Tol out, Tol grads, const LayerCase& lc, uint64_t seed) {
  SCOPED_TRACE(lc.what + " (bf16 activations) on " + be.name());
  LayerPair p(be);
  build_pair(p, lc, seed);
  if (::testing::Test::HasFatalFailure()) return;
  const std::vector<float> x = bf16_rounded(p.x), dy = bf16_rounded(p.r);

  const Tensor x16 = to_backend16(be, x, p.xs), dy16 = to_backend16(be, dy, p.ys);
  const Tensor xr = to_backend(cpu_backend(), x, p.xs), dyr = to_backend(cpu_backend(), dy, p.ys);
  Tensor y16, yr, dx16, dxr;
  p.layer->forward(x16, y16, lc.mode);
  p.ref->forward(xr, yr, lc.mode);
  ASSERT_EQ(y16.dtype(), DType::kBF16);
  ASSERT_EQ(y16.shape(), p.ys);
  expect_match(to_host16(be, y16), as_double(bf16_rounded(to_host(cpu_backend(), yr))), "y", out);
  BackwardCtx ctx, rctx;
  p.layer->backward(x16, y16, dy16, &dx16, ctx);
  p.ref->backward(xr, yr, dyr, &dxr, rctx);
  ASSERT_EQ(dx16.dtype(), DType::kBF16);
  expect_match(to_host16(be, dx16), as_double(bf16_rounded(to_host(cpu_backend(), dxr))), "dx",
               out);
  if (p.st.num_params() > 0) {
    p.st.grads_to_host();
    expect_match(std::vector<float>(p.st.grads(), p.st.grads() + p.st.num_params()),
                 std::vector<double>(p.rst.grads(), p.rst.grads() + p.rst.num_params()),
                 "parameter gradients", grads);
  }
  if (p.st.num_buffers() > 0) {
    p.st.buffers_to_host();
    expect_match(std::vector<float>(p.st.buffers(), p.st.buffers() + p.st.num_buffers()),
                 std::vector<double>(p.rst.buffers(), p.rst.buffers() + p.rst.num_buffers()),
                 "running statistics", grads);
  }
}

// Tolerances of the bf16 checks. A device's float result may differ from the CPU's in the last
// bits (kApprox), and two float values that close can round to neighbouring bf16 values: one bf16
// ulp, 2^-7 of the value, plus the float tolerance. Products (convolutions, Linear) also take their
// weights as bf16 operands on a GPU (autocast's rule): 2^-9 relative per term, bounded here by
// four ulps of the largest output. Exact on the CPU, whose bf16 form is its float form.
Tol tol16(const BackendOps& t, bool products) {
  if (t.GetParam() == "cpu") return {true, 0, 0};
  return {false, (products ? 4.0 : 1.0) * std::ldexp(1.0, -7) + 1e-4, 1e-5};
}

TEST_P(BackendOps, TensorHoldsFloatOrBf16AndRefusesTheOtherReading) {
  Tensor t({3, 40}, &be(), DType::kBF16);
  EXPECT_EQ(t.dtype(), DType::kBF16);
  EXPECT_EQ(t.bytes(), 240u);
  EXPECT_NE(t.ptr<BFloat16>(), nullptr);
  try {
    (void)t.data();
    ADD_FAILURE() << "a bfloat16 tensor was read as float";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[3, 40] holds bfloat16, read as float32"),
              std::string::npos)
        << e.what();
  }
  // Storage is reused across element types while it fits: the float form needs 480 bytes, more
  // than the 256 allocated (240 rounded to 64), so it grows; 240 bf16 values fit in that again.
  const int64_t before = Tensor::live_bytes();
  t.resize({3, 40}, &be(), DType::kF32);
  EXPECT_EQ(t.bytes(), 480u);
  EXPECT_EQ(Tensor::live_bytes(), before + 512 - 256);
  const void* p = t.data();
  t.resize({6, 40}, &be(), DType::kBF16);
  EXPECT_EQ(static_cast<const void*>(t.ptr<BFloat16>()), p);
  EXPECT_THROW((void)t.ptr<float>(), Error);
}

// A tensor of v.size() + 1 elements of type dt holding v from element `off` on (the rest 0): at
// off 1 its data is 4 (fp32) or 2 (bf16) bytes past a 16-byte boundary.
Tensor offset_tensor(Backend& be, const std::vector<float>& v, DType dt, int off) {
  std::vector<float> padded(v.size() + 1, 0.f);
  std::copy(v.begin(), v.end(), padded.begin() + off);
  const Shape s{static_cast<int64_t>(padded.size())};
  return dt == DType::kBF16 ? to_backend16(be, padded, s) : test::to_backend(be, padded, s);
}

// The GPU's BatchNorm passes take 16 bytes of a row per thread where the channels are a multiple
// of 8 and every pointer is 16-byte aligned (kernels/vec_rows.cuh), one element per thread
// otherwise, each element computed by the same functions: the same op on the same values at a
// 16-byte boundary and one element past it gives the same bits, forward and backward, training
// and evaluation, plain and with the residual join and ReLU, fp32 and bf16. The statistics' and
// the backward's partial sums take 16 bytes a thread too (channel_reduce.cuh), over the same rows
// in the same order. Two shapes: 16 channels x 5003 rows (20 chunks of the reduction, more than a
// block's chunk groups, and no multiple of any block's rows), and 264 channels x 15013 rows (33
// bf16 or 66 fp32 vectors a row: a partial last channel tile, idle threads in the apply passes'
// blocks, and more rows than the apply passes' capped grid covers at once, so threads walk on).
// tests/gpu/test_kernels.cc checks that offsets 0 and 1 take the two forms. (The CPU has one form:
// the small shape keeps its test quick there.)
TEST_P(BackendOps, BatchNormPassesGiveTheSameBitsAtAnyAlignment) {
  // 20 and 37 rows: one chunk whose row lanes hold 2-3 and 4-5 rows (kRowBatch = 4's batched
  // loop never, or once and then the tail).
  bn_same_bits_at_any_alignment(16, 20);
  bn_same_bits_at_any_alignment(16, 37);
  bn_same_bits_at_any_alignment(16, 5003);
  if (!is_cpu()) bn_same_bits_at_any_alignment(264, 15013);
}

void BackendOps::bn_same_bits_at_any_alignment(int64_t c, int64_t m) {
  SCOPED_TRACE(std::to_string(c) + " channels x " + std::to_string(m) + " rows");
  const size_t xs = sz(m * c), cs = sz(c);
  const auto x = bn_input(xs, c, 700), res = uniform(xs, 701), dy = uniform(xs, 702);
  auto g_ = put(uniform(cs, 703, 0.5f, 1.5f)), b_ = put(uniform(cs, 704));
  for (DType dt : {DType::kF32, DType::kBF16})
    for (bool join : {false, true})
      for (Mode mode : {Mode::kTrain, Mode::kEval}) {
        SCOPED_TRACE(std::string(dt == DType::kBF16 ? "bf16" : "fp32") +
                     (join ? ", residual + ReLU" : "") +
                     (mode == Mode::kTrain ? ", train" : ", eval"));
        auto run = [&]<typename T>(int off) {
          const std::vector<float> sevens(xs, 7.f);  // outputs prefilled: an unwritten value shows
          Tensor x_ = offset_tensor(be(), x, dt, off), r_ = offset_tensor(be(), res, dt, off),
                 dy_ = offset_tensor(be(), dy, dt, off), y_ = offset_tensor(be(), sevens, dt, off),
                 dx_ = offset_tensor(be(), sevens, dt, off),
                 dz_ = offset_tensor(be(), sevens, dt, off);
          auto rm_ = put(std::vector<float>(cs, 0.f)), rv_ = put(std::vector<float>(cs, 1.f));
          auto dg_ = put(std::vector<float>(cs, 7.f)), db_ = put(std::vector<float>(cs, 7.f));
          const std::unique_ptr<BatchNormOp> bn = be().make_batchnorm(c, 0.1, 1e-5);
          const T *xp = x_.ptr<T>() + off, *rp = join ? r_.ptr<T>() + off : nullptr;
          T *yp = y_.ptr<T>() + off, *dxp = dx_.ptr<T>() + off;
          if (mode == Mode::kTrain)
            bn->forward_train(xp, yp, m, g_.data(), b_.data(), rm_.data(), rv_.data(), nullptr, {},
                              rp, join);
          else
            bn->forward_eval(xp, yp, m, g_.data(), b_.data(), rm_.data(), rv_.data(), rp, join);
          bn->backward(xp, dy_.ptr<T>() + off, dxp, m, g_.data(), dg_.data(), db_.data(), false, {},
                       join ? yp : nullptr, join ? dz_.ptr<T>() + off : nullptr);
          auto host = [&](const Tensor& t) {
            std::vector<float> h = dt == DType::kBF16 ? to_host16(be(), t) : test::to_host(be(), t);
            return std::vector<float>(h.begin() + off, h.begin() + off + static_cast<int64_t>(xs));
          };
          return std::vector<std::vector<float>>{host(y_), host(dx_), host(dz_), get(dg_),
                                                 get(db_), get(rm_),  get(rv_)};
        };
        auto both = [&]<typename T>() {
          const auto aligned = run.template operator()<T>(0),
                     offset = run.template operator()<T>(1);
          const char* what[] = {"y", "dx", "dz", "dgamma", "dbeta", "running_mean", "running_var"};
          for (size_t k = 0; k < aligned.size(); ++k)
            expect_match(offset[k], std::vector<double>(aligned[k].begin(), aligned[k].end()),
                         what[k], tol(Cmp::kExact));
        };
        if (dt == DType::kBF16)
          both.template operator()<BFloat16>();
        else
          both.template operator()<float>();
      }
}

// The GPU's max-pooling takes 16 bytes of channels a thread (4 fp32, 8 bf16) where the channel
// count is a multiple of that and every pointer is 16-byte aligned, one channel a thread otherwise
// (kernels/pooling.cu): one element past a 16-byte boundary gives the same bits, forward and
// backward, fp32 and bf16, with ties (five levels) and a NaN in a 16-byte group.
TEST_P(BackendOps, MaxPoolGivesTheSameBitsAtAnyAlignment) {
  struct Case {
    int64_t n, h, w, c;
    int k, s, pad;
  };
  const Case cases[] = {{2, 9, 10, 16, 3, 2, 1}, {1, 6, 7, 8, 2, 2, 0}, {2, 5, 6, 24, 3, 1, 1}};
  const auto bits = [](const std::vector<float>& v) {
    std::vector<uint32_t> b(v.size());
    std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
    return b;
  };
  for (const Case& k : cases)
    for (const DType dt : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(std::to_string(k.c) + " channels, " + (dt == DType::kBF16 ? "bf16" : "fp32"));
      const int64_t oh = (k.h + 2 * k.pad - k.k) / k.s + 1, ow = (k.w + 2 * k.pad - k.k) / k.s + 1;
      const size_t xs = sz(k.n * k.h * k.w * k.c), ys = sz(k.n * oh * ow * k.c);
      std::vector<float> x = uniform(xs, 900), dy = uniform(ys, 901);
      for (float& v : x) v = std::round(v * 2.f) / 2.f;
      x[sz(k.c + 1)] = NAN;  // pixel (0, 1), channel 1
      auto run = [&]<typename T>(int off) {
        Tensor x_ = offset_tensor(be(), x, dt, off), dy_ = offset_tensor(be(), dy, dt, off),
               y_ = offset_tensor(be(), std::vector<float>(ys, 7.f), dt, off),
               dx_ = offset_tensor(be(), std::vector<float>(xs, 7.f), dt, off);
        be().maxpool_forward(x_.ptr<T>() + off, y_.ptr<T>() + off, k.n, k.h, k.w, k.c, k.k, k.s,
                             k.pad);
        be().maxpool_backward(x_.ptr<T>() + off, dy_.ptr<T>() + off, dx_.ptr<T>() + off, k.n, k.h,
                              k.w, k.c, k.k, k.s, k.pad);
        auto host = [&](const Tensor& t, size_t size) {
          std::vector<float> h = dt == DType::kBF16 ? to_host16(be(), t) : test::to_host(be(), t);
          return std::vector<float>(h.begin() + off, h.begin() + off + static_cast<int64_t>(size));
        };
        return std::make_pair(host(y_, ys), host(dx_, xs));
      };
      const auto both = [&]<typename T>() {
        const auto aligned = run.template operator()<T>(0), offset = run.template operator()<T>(1);
        EXPECT_EQ(bits(offset.first), bits(aligned.first)) << "y";
        EXPECT_EQ(bits(offset.second), bits(aligned.second)) << "dx";
      };
      if (dt == DType::kBF16)
        both.template operator()<BFloat16>();
      else
        both.template operator()<float>();
    }
}

// The GPU's ReLU and residual-add passes (kernels/activation.cu's map kernel) take 16 bytes a
// thread (4 fp32, 8 bf16) where every pointer is 16-byte aligned, then the last n % V elements one
// a thread, and one element a thread where any pointer is not. Each operand and the output at a
// 16-byte boundary or one element past it, alone or together, and lengths 1 to 9 and 1031 (no
// whole group, whole groups, groups and a tail), fp32 and bf16: every value is the float op on the
// widened inputs rounded once (bf16), and the element beside the n written keeps its 7. Not run on
// a GPU when written (886c90f's 16-byte form had only aligned cases, and offset 1 for the add).
TEST_P(BackendOps, ElementwisePassesAtAnyAlignmentAndLength) {
  struct Offsets {
    int a, b, y;
  };
  const Offsets offsets[] = {{0, 0, 0}, {1, 1, 1}, {1, 0, 0}, {0, 1, 0}, {0, 0, 1}};
  const char* names[] = {"relu", "relu backward", "add", "add + relu"};
  for (const DType dt : {DType::kF32, DType::kBF16})
    for (const int64_t n : {1, 3, 4, 7, 8, 9, 1031}) {
      std::vector<float> a = uniform(sz(n), 960), b = uniform(sz(n), 961);
      for (size_t i = 0; i < a.size(); i += 5) a[i] = 0.f;  // the ReLU's kink
      if (dt == DType::kBF16) a = bf16_rounded(a), b = bf16_rounded(b);
      for (const Offsets& o : offsets)
        for (int op = 0; op < 4; ++op) {
          SCOPED_TRACE(std::string(names[op]) + ", " + (dt == DType::kBF16 ? "bf16" : "fp32") +
                       ", n " + std::to_string(n) + ", offsets " + std::to_string(o.a) + "/" +
                       std::to_string(o.b) + "/" + std::to_string(o.y));
          const std::vector<float> sevens(sz(n) + 1, 7.f);
          std::vector<float> want(sz(n));
          for (size_t i = 0; i < want.size(); ++i) {
            const float sum = a[i] + b[i];
            want[i] = op == 0   ? (a[i] > 0.f ? a[i] : 0.f)
                      : op == 1 ? (a[i] > 0.f ? b[i] : 0.f)
                      : op == 2 ? sum
                                : (sum > 0.f ? sum : 0.f);
          }
          if (dt == DType::kBF16) want = bf16_rounded(want);
          std::vector<float> want_all = sevens;
          std::copy(want.begin(), want.end(), want_all.begin() + o.y);
          const Tensor a_ = offset_tensor(be(), a, dt, o.a), b_ = offset_tensor(be(), b, dt, o.b);
          const Shape ys{n + 1};
          Tensor y_ = dt == DType::kBF16 ? to_backend16(be(), sevens, ys)
                                         : test::to_backend(be(), sevens, ys);
          const auto call = [&]<typename T>() {
            const T *ap = a_.ptr<T>() + o.a, *bp = b_.ptr<T>() + o.b;
            T* yp = y_.ptr<T>() + o.y;
            if (op == 0) be().relu_forward(ap, yp, n);
            if (op == 1) be().relu_backward(ap, bp, yp, n);
            if (op >= 2) be().add(ap, bp, yp, n, op == 3);
          };
          if (dt == DType::kBF16)
            call.template operator()<BFloat16>();
          else
            call.template operator()<float>();
          const std::vector<float> got =
              dt == DType::kBF16 ? to_host16(be(), y_) : test::to_host(be(), y_);
          expect_match(got, as_double(want_all), "y", tol(Cmp::kExact));
        }
    }
}

TEST_P(BackendOps, Bf16ConvertRoundsToNearestEven) {
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: to the even 1. 1 + 3 * 2^-8 halfway between
  // 1 + 2^-7 and 1 + 2^-6: to the even 1 + 2^-6. A float subnormal keeps its top bits; the largest
  // float overflows to infinity; -0 stays -0.
  const std::vector<float> in{1.f + std::ldexp(1.f, -8),
                              1.f + 3 * std::ldexp(1.f, -8),
                              std::ldexp(1.f, -130),
                              std::numeric_limits<float>::max(),
                              -0.f,
                              -2.5f};
  const std::vector<float> want{1.f,
                                1.f + std::ldexp(1.f, -6),
                                std::ldexp(1.f, -130),
                                std::numeric_limits<float>::infinity(),
                                -0.f,
                                -2.5f};
  auto x = put(in);
  DeviceArray<BFloat16> y(be(), static_cast<int64_t>(in.size()));
  DeviceArray<float> back(be(), static_cast<int64_t>(in.size()));
  be().convert(x.data(), y.data(), y.size());
  be().convert(y.data(), back.data(), y.size());
  const std::vector<float> got = get(back);
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(got[i], want[i]) << "value " << i;
    EXPECT_EQ(std::signbit(got[i]), std::signbit(want[i])) << "value " << i;
  }
}

TEST_P(BackendOps, Bf16AddRoundsTheFloatSumOnce) {
  // 1 + 2^-8: the float sum is exact, its bf16 the even neighbour 1; 1 + 2^-8 + 2^-8 = 1 + 2^-7
  // (two bf16 additions in sequence would give 1); with the ReLU, -1 + 0.5 gives 0. Three values,
  // then the same three repeated over 19 (two 16-byte groups of 8 and a tail of 3 on the GPU).
  const float p = std::ldexp(1.f, -8);
  const std::vector<float> av{1.f, 1.f + std::ldexp(1.f, -7), -1.f}, bv{p, p, 0.5f};
  const std::vector<float> plain{1.f, 1.f + std::ldexp(1.f, -6), -0.5f},
      relu{1.f, 1.f + std::ldexp(1.f, -6), 0.f};
  for (const int64_t n : {3, 19}) {
    SCOPED_TRACE(std::to_string(n) + " values");
    std::vector<float> a, b, want_plain, want_relu;
    for (int64_t i = 0; i < n; ++i) {
      a.push_back(av[sz(i % 3)]);
      b.push_back(bv[sz(i % 3)]);
      want_plain.push_back(plain[sz(i % 3)]);
      want_relu.push_back(relu[sz(i % 3)]);
    }
    const Tensor a_ = to_backend16(be(), a, {n}), b_ = to_backend16(be(), b, {n});
    Tensor y({n}, &be(), DType::kBF16);
    be().add(a_.ptr<BFloat16>(), b_.ptr<BFloat16>(), y.ptr<BFloat16>(), n, false);
    EXPECT_EQ(to_host16(be(), y), want_plain);
    be().add(a_.ptr<BFloat16>(), b_.ptr<BFloat16>(), y.ptr<BFloat16>(), n, true);
    EXPECT_EQ(to_host16(be(), y), want_relu);
  }
}

// The parameter gradients' tolerance of a bf16 convolution. cuDNN's graph API writes a bf16
// input's weight gradient in bf16 (no fp32-dW engine for bf16 inputs in cuDNN 9.19; see
// cudnn_graph_conv.cc), which is then widened: one round to nearest even of the fp32-accumulated
// value, an error of at most half a bf16 ulp, 2^-8 of the value and so of the largest one, on top
// of the float tolerance. The legacy API (and a layer the graph API has no plan for, which falls
// back to it) computes dW in fp32: the float tolerance alone, which this bound contains.
Tol conv_grad_tol16(bool graph_api, Tol float_tol) {
  if (!graph_api) return float_tol;
  return {false, std::ldexp(1.0, -8) + float_tol.rel, float_tol.abs};
}

TEST_P(BackendOps, Bf16LeafLayersAreTheFloatLayersRoundedOnce) {
  const Tol ew = tol16(*this, false), prod = tol16(*this, true),
            g = is_cpu() ? Tol{true, 0, 0} : tol(Cmp::kApprox);
#ifdef DPT_HAVE_CUDA
  const bool graph = !is_cpu() && static_cast<gpu::CudaBackend&>(be()).graph_api();
#else
  const bool graph = false;
#endif
  const Tol gc = conv_grad_tol16(graph, g);
  check_layer_bf16(be(), prod, gc,
                   {"conv 3x3 p1", [] { return make_conv2d(4, 3, 1, 1); }, {5, 6, 3}}, 4000);
  check_layer_bf16(
      be(), prod, gc,
      {"conv 3x3 s1 p1, 16 channels", [] { return make_conv2d(16, 3, 1, 1, false); }, {5, 6, 16}},
      4010);
  check_layer_bf16(be(), prod, gc,
                   {"conv 5x5 p2", [] { return make_conv2d(3, 5, 1, 2); }, {6, 6, 2}}, 4020);
  check_layer_bf16(be(), prod, g, {"linear", [] { return make_linear(7); }, {13}, 4}, 4030);
  LayerCase bn{"batchnorm train", [] { return make_batchnorm2d(); }, {4, 3, 3}, 3};
  bn.shift = 0.7;
  check_layer_bf16(be(), ew, g, bn, 4040);
  bn = {"batchnorm+relu train", [] { return make_batchnorm2d_relu(); }, {4, 3, 3}, 3};
  bn.shift = 0.7;
  check_layer_bf16(be(), ew, g, bn, 4050);
  bn.what = "batchnorm+relu eval";
  bn.mode = Mode::kEval;
  check_layer_bf16(be(), ew, g, bn, 4060);
  check_layer_bf16(be(), ew, g, {"relu", [] { return make_relu(); }, {3, 4, 5}}, 4070);
  check_layer_bf16(be(), ew, g, {"avgpool 2/2", [] { return make_avgpool2d(2, 2); }, {5, 7, 3}},
                   4080);
  check_layer_bf16(be(), ew, g,
                   {"relu+avgpool 3/1", [] { return make_relu_avgpool2d(3, 1); }, {5, 4, 2}}, 4090);
  check_layer_bf16(be(), ew, g,
                   {"maxpool 3/2/1", [] { return make_maxpool2d(3, 2, 1); }, {7, 6, 3}}, 4095);
  check_layer_bf16(be(), ew, g,  // 16 channels: the GPU's 16-byte form (8 bf16 lanes a thread)
                   {"maxpool 3/2/1 x16", [] { return make_maxpool2d(3, 2, 1); }, {7, 6, 16}}, 4096);
  check_layer_bf16(be(), ew, g, {"global avgpool", [] { return make_global_avgpool(); }, {3, 4, 5}},
                   4100);
  check_layer_bf16(be(), ew, g, {"flatten", [] { return make_flatten(); }, {2, 3, 4}}, 4110);
}

TEST_P(BackendOps, Bf16ResidualRoundsBetweenItsLeaves) {
  // conv1, bn1+ReLU, conv2, bn2+join round their outputs to bf16 (and dz, dmid, ... backward):
  // four roundings of up to 2^-9 each on the way to y, amplified by BatchNorm's normalisation
  // (invstd ~ 1/std of a conv output, here ~1): 2^-5 of the largest value holds them with room,
  // 2^-4 for dx (one more BatchNorm backward on each branch) and the parameter gradients.
  const Tol y{false, std::ldexp(1.0, -5), 0}, d{false, std::ldexp(1.0, -4), 0};
  check_layer_bf16(be(), y, d,
                   {"residual identity", [] { return make_residual(3, false, 1); }, {5, 5, 3}},
                   4200);
  check_layer_bf16(be(), y, d,
                   {"residual 1x1 s2", [] { return make_residual(4, true, 2); }, {6, 6, 8}}, 4210);
}

// The d2l models with bf16 activations on the backend against the float models on the CPU, same
// parameters, input and dlogits. Forward, a rounding to bf16 after every layer (2^-9 relative
// each, about 10 on LeNet's path and 40 on ResNet-18's, partly cancelling) keeps the logits within
// 2^-5 norm-relative (measured on the CPU: 0.0027 LeNet, 0.0068 ResNet-18). Backward, each
// train-mode BatchNorm projects the mean and the xhat component out of its gradient, and where
// those dominate dy the rounding of dy weighs more in what is left: ResNet-18's gradient differs
// from the float one by 0.21 norm-relative here (PyTorch 2.15's CPU autocast, bf16 operands as
// well, by 0.37 on the same shapes at 32x32), LeNet's (no BatchNorm) by 0.046. The bounds, 2^-3
// for LeNet and 2^-1 for ResNet-18, catch a wrong gradient (a sign, a missing term, a wrong mask
// gives O(1)), not rounding.
double norm_rel(const std::vector<float>& got, const std::vector<float>& ref) {
  double d = 0, r = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    d += (static_cast<double>(got[i]) - ref[i]) * (static_cast<double>(got[i]) - ref[i]);
    r += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(d / r);
}

TEST_P(BackendOps, Bf16ModelsTrackTheirFloatForm) {
  struct Case {
    const char* name;
    Shape input;
    double grad_bound;
  } const cases[] = {{"lenet", {28, 28, 1}, 0.125}, {"resnet18", {16, 16, 3}, 0.5}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto m = make_model(c.name, 10, be(), c.input),
         r = make_model(c.name, 10, cpu_backend(), c.input);
    m->init_parameters("kaiming", 7);
    r->init_parameters("kaiming", 7);
    m->set_activation_dtype(DType::kBF16);
    const int64_t n = 8;
    Shape xs{n};
    xs.insert(xs.end(), c.input.begin(), c.input.end());
    const std::vector<float> x = uniform(sz(shape_numel(xs)), 11, 0.f, 1.f),
                             dl = uniform(sz(n * 10), 12);
    const Tensor x_ = to_backend(be(), x, xs), xr = to_backend(cpu_backend(), x, xs);
    const Tensor dl_ = to_backend(be(), dl, {n, 10}), dlr = to_backend(cpu_backend(), dl, {n, 10});
    const Tensor& logits = m->forward(x_, Mode::kTrain);
    ASSERT_EQ(logits.dtype(), DType::kF32);
    const double el =
        norm_rel(to_host(be(), logits), to_host(cpu_backend(), r->forward(xr, Mode::kTrain)));
    BackwardCtx ctx, rctx;
    m->backward(dl_, ctx);
    r->backward(dlr, rctx);
    m->store().grads_to_host();
    ParamStore &ms = m->store(), &rs = r->store();
    const double eg = norm_rel(std::vector<float>(ms.grads(), ms.grads() + ms.num_params()),
                               std::vector<float>(rs.grads(), rs.grads() + rs.num_params()));
    std::printf("  %s with bf16 activations on %s: logits %.3g, gradients %.3g norm-relative\n",
                c.name, be().name().c_str(), el, eg);
    EXPECT_GT(el, 0.0)
        << "the bf16 model computed the float model's exact logits: no rounding happened";
    EXPECT_LE(el, std::ldexp(1.0, -5));
    EXPECT_LE(eg, c.grad_bound);
  }
}

std::string backend_name(const ::testing::TestParamInfo<std::string>& info) { return info.param; }
INSTANTIATE_TEST_SUITE_P(Backends, BackendOps,
                         ::testing::Values(std::string("cpu"), std::string("cuda")), backend_name);

}  // namespace
}  // namespace dpt
