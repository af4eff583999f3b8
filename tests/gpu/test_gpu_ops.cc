// The CUDA backend's operations (cuDNN convolution, cuBLAS Linear, BatchNorm kernels) against the
// CPU's on fresh random inputs: relative error under 1e-5 in fp32 (no TF32). Skipped, with exit code
// 77 so meson reports SKIP (gpu_test_main.cc), where no CUDA device is visible (CI).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "cpu/conv.h"
#include "cpu/ops.h"
#include "cpu/winograd.h"
#include "cuda/cublas_linear.h"
#include "cuda/cuda_backend.h"
#include "cuda/cudnn_conv.h"
#include "dpt/device.h"
#include "dpt/nn.h"
#include "dpt/rng.h"
#include "gpu_test_util.h"

namespace dpt {
namespace {

using test::Dev;
using test::expect_close;
using test::random;

// ---- Memory --------------------------------------------------------------------------------------

// The backend's storage comes zero-filled (the storage just freed, which held other values, is
// likely handed out again) and is counted with every DeviceBuffer, since a CUDA graph captured
// before an allocation must not be replayed; copies round-trip in stream order.
TEST(GpuOps, BackendMemoryIsZeroedCountedAndCopied) {
  SKIP_WITHOUT_GPU();
  gpu::CudaBackend be(0);
  const size_t n = 1000, bytes = n * sizeof(float);
  const auto v = random(n, 50);
  {
    Tensor used({static_cast<int64_t>(n)}, &be);
    be.copy_from_host(used.data(), v.data(), bytes);
  }
  const uint64_t before = gpu::DeviceBuffer::allocations();
  Tensor a({static_cast<int64_t>(n)}, &be), b({static_cast<int64_t>(n)}, &be);
  EXPECT_EQ(gpu::DeviceBuffer::allocations(), before + 2);
  EXPECT_EQ(test::to_host(be, a), std::vector<float>(n, 0.f));
  be.copy_from_host(a.data(), v.data(), bytes);
  be.copy(b.data(), a.data(), bytes);
  EXPECT_EQ(test::to_host(be, b), v);
  be.zero(a.data(), bytes);
  EXPECT_EQ(test::to_host(be, a), std::vector<float>(n, 0.f));
  a.resize({static_cast<int64_t>(n / 2)});  // within its capacity: no new allocation
  EXPECT_EQ(gpu::DeviceBuffer::allocations(), before + 2);
}

// ---- Convolution ---------------------------------------------------------------------------------

struct ConvCase {
  const char* name;
  int64_t n, h, c_in, c_out, k, stride, pad;
};

// LeNet's two convolutions and every distinct ResNet-18 convolution shape on 28x28 inputs:
// 3x3 pad 1 stride 1 and 2, the 1x1 stride-2 shortcuts, 5x5 and 3x3 without padding.
const ConvCase kConvCases[] = {
    {"lenet.conv1 3x3 p0 Cin=1", 4, 28, 1, 20, 3, 1, 0},
    {"lenet.conv2 5x5 p0", 4, 13, 20, 50, 5, 1, 0},
    {"resnet.conv1 3x3 p1 Cin=1", 2, 28, 1, 64, 3, 1, 1},
    {"resnet.layer1 3x3 p1 s1", 2, 28, 64, 64, 3, 1, 1},
    {"resnet.layer2.0.conv1 3x3 p1 s2", 2, 28, 64, 128, 3, 2, 1},
    {"resnet.layer2.0.downsample 1x1 s2", 2, 28, 64, 128, 1, 2, 0},
    {"resnet.layer3.0.conv1 3x3 p1 s2", 2, 14, 128, 256, 3, 2, 1},
    {"resnet.layer3 3x3 p1 s1", 2, 7, 256, 256, 3, 1, 1},
    {"resnet.layer4.0.conv1 3x3 p1 s2 (odd input)", 2, 7, 256, 512, 3, 2, 1},
    {"resnet.layer4.0.downsample 1x1 s2 (odd input)", 2, 7, 256, 512, 1, 2, 0},
    {"resnet.layer4 3x3 p1 s1", 2, 4, 512, 512, 3, 1, 1},
};

// Largest |gpu - cpu| over max(1, max |cpu|): the scale expect_close measures against.
double rel_error(const std::vector<float>& gpu, const std::vector<float>& cpu) {
  double scale = 1, err = 0;
  for (float c : cpu) scale = std::max(scale, std::fabs(static_cast<double>(c)));
  for (size_t i = 0; i < gpu.size() && i < cpu.size(); ++i)
    err = std::max(err, std::fabs(static_cast<double>(gpu[i]) - cpu[i]));
  return err / scale;
}

// On tensor cores (convolutions under --tf32 or --precision bf16: TF32, 11-bit significands,
// relative rounding 2^-11; Linear GEMMs under --precision bf16: 8-bit, 2^-9) the products are of
// rounded operands accumulated in fp32: within 1e-2 of the fp32 CPU, and visibly not fp32 (an
// error above 1e-6 shows the tensor-core path really ran).
constexpr double kBf16Tol = 1e-2;
void expect_bf16_rounding(const std::vector<float>& gpu, const std::vector<float>& cpu, const std::string& what) {
  const double e = rel_error(gpu, cpu);
  EXPECT_GT(e, 1e-6) << what << ": no tensor-core rounding visible";
  EXPECT_LT(e, kBf16Tol) << what;
}

// What each layer check compares: y, dx, dw (overwritten) and dw accumulated without dx.
struct LayerResults {
  std::vector<float> y, dx, dw, dw_acc;
};
// bf16: the GPU ran on tensor cores (rounded operands), whose rounding must then show.
void expect_layer(const LayerResults& gpu, const LayerResults& cpu, const std::string& what, bool bf16, double tol_y,
                  double tol_dw) {
  // y only: for a small batch cuDNN may rank an FMA backward-filter algorithm first (measured: dW
  // of the stride-2 ResNet shapes at N=2 came back exact), which is allowed.
  if (bf16) expect_bf16_rounding(gpu.y, cpu.y, what + ": y");
  expect_close(gpu.y, cpu.y, what + ": y", tol_y);
  expect_close(gpu.dx, cpu.dx, what + ": dx", tol_y);
  expect_close(gpu.dw, cpu.dw, what + ": dw", tol_dw);
  expect_close(gpu.dw_acc, cpu.dw_acc, what + ": dw accumulated (dx = null)", tol_dw);
}

// Forward; backward with dx, overwriting; backward without dx, accumulating into existing
// gradients. Each output against cpu::ConvPrimitives.
void check_conv(gpu::GpuContext& ctx, gpu::CudnnConv& conv, const ConvCase& c, bool bias, uint64_t seed) {
  const ConvGeom g{c.n, c.h, c.h, c.c_in, c.c_out, c.k, c.stride, c.pad};
  const std::string what = std::string(c.name) + (bias ? " +bias" : " no bias") + " N=" + std::to_string(c.n);
  const size_t xs = static_cast<size_t>(g.n * g.h * g.w * g.c_in);
  const size_t ys = static_cast<size_t>(g.n * g.oh() * g.ow() * g.c_out);
  const size_t ws = static_cast<size_t>(g.c_out * g.c_in * g.k * g.k);
  const size_t bs = static_cast<size_t>(g.c_out);
  auto x = random(xs, seed), w = random(ws, seed + 1, -0.5, 0.5), b = random(bs, seed + 2);
  auto dy = random(ys, seed + 3), dw0 = random(ws, seed + 4), db0 = random(bs, seed + 5);

  cpu::ConvPrimitives ref;
  std::vector<float> y(ys), dx(xs), dw(ws), db(bs), dw_acc = dw0, db_acc = db0;
  ref.forward(g, x.data(), w.data(), bias ? b.data() : nullptr, y.data());
  ref.backward(g, x.data(), w.data(), dy.data(), dx.data(), dw.data(), bias ? db.data() : nullptr, false);
  ref.backward(g, x.data(), w.data(), dy.data(), nullptr, dw_acc.data(), bias ? db_acc.data() : nullptr, true);

  Dev<float> x_(x), w_(w), b_(b), dy_(dy), y_(ys), dx_(xs), dw_(ws), db_(bs), dwa_(dw0), dba_(db0);
  conv.forward(g, x_.p, w_.p, bias ? b_.p : nullptr, y_.p);
  conv.backward(g, x_.p, w_.p, dy_.p, dx_.p, dw_.p, bias ? db_.p : nullptr, false);
  conv.backward(g, x_.p, w_.p, dy_.p, nullptr, dwa_.p, bias ? dba_.p : nullptr, true);
  ctx.synchronize();
  // The CPU reference runs Winograd on stride-1 3x3 shapes with >= 16 channels; its own error is
  // up to 2e-5 of the output's scale (tests/unit/test_ops.cc), so 1e-5 would fail on the CPU's
  // rounding, not the GPU's.
  const cpu::WinogradChoice wc = cpu::winograd_choice(g);
  const bool tc = ctx.tensor_ops();  // TF32 under --tf32 and --precision bf16 alike
  // Channel counts that are multiples of 8 are tensor-core shapes: there the rounding must show.
  const bool visible = tc && c.c_in % 8 == 0 && c.c_out % 8 == 0;
  expect_layer({y_.host(), dx_.host(), dw_.host(), dwa_.host()}, {y, dx, dw, dw_acc}, what, visible,
               tc ? kBf16Tol : wc.m ? 5e-5 : 1e-5, tc ? kBf16Tol : wc.mw ? 5e-5 : 1e-5);
  if (bias) {  // column sums of the fp32 dy: fp32 agreement in both precisions
    expect_close(db_.host(), db, what + ": db");
    expect_close(dba_.host(), db_acc, what + ": db accumulated (dx = null)");
  } else {
    expect_close(dba_.host(), db0, what + ": db untouched without bias");
  }
}

TEST(GpuOps, ConvolutionMatchesCpuOnLeNetAndResNet18Shapes) {
  SKIP_WITHOUT_GPU();
  gpu::CudaBackend be(0);
  gpu::GpuContext& ctx = be.context();
  uint64_t seed = 100;
  for (const ConvCase& c : kConvCases)
    for (bool bias : {true, false}) {
      gpu::CudnnConv conv(ctx);
      check_conv(ctx, conv, c, bias, seed += 10);
      if (HasFatalFailure()) return;
    }
}

// --precision bf16 and --tf32 both convolve on TF32 tensor cores (cudnn_conv.cc says why).
TEST(GpuOps, TensorCoreConvolutionMatchesCpuWithinTf32Rounding) {
  SKIP_WITHOUT_GPU();
  for (bool bf16 : {true, false}) {
    gpu::CudaBackend be(0);
    gpu::GpuContext& ctx = be.context();
    if (bf16) ctx.set_bf16(true);
    else ctx.set_tf32(true);
    uint64_t seed = 500;
    for (const ConvCase& c : kConvCases) {
      gpu::CudnnConv conv(ctx);
      check_conv(ctx, conv, c, /*bias=*/true, seed += 10);
      if (HasFatalFailure()) return;
    }
  }
}

// A weight pointer at a 4-byte offset (where a flat parameter buffer may put one) gives the
// same results as an aligned one: such weights go through the aligned workspace.
TEST(GpuOps, ConvolutionOnUnalignedWeightsMatchesCpu) {
  SKIP_WITHOUT_GPU();
  gpu::CudaBackend be(0);
  gpu::GpuContext& ctx = be.context();
  const ConvGeom g{4, 14, 14, 64, 128, 1, 2, 0};
  const size_t xs = static_cast<size_t>(g.n * g.h * g.w * g.c_in), ys = static_cast<size_t>(g.n * g.oh() * g.ow() * g.c_out);
  const size_t ws = static_cast<size_t>(g.c_out * g.c_in);
  auto x = random(xs, 71), dy = random(ys, 72), w = random(ws, 73, -0.5, 0.5);
  std::vector<float> w1(ws + 1, 0.f), dw1(ws + 1, 0.f), y(ys), dx(xs), dw(ws);
  std::copy(w.begin(), w.end(), w1.begin() + 1);
  cpu::ConvPrimitives ref;
  ref.forward(g, x.data(), w.data(), nullptr, y.data());
  ref.backward(g, x.data(), w.data(), dy.data(), dx.data(), dw.data(), nullptr, false);
  Dev<float> x_(x), dy_(dy), w_(w1), dw_(dw1), y_(ys), dx_(xs);
  gpu::CudnnConv conv(ctx);
  conv.forward(g, x_.p, w_.p + 1, nullptr, y_.p);
  conv.backward(g, x_.p, w_.p + 1, dy_.p, dx_.p, dw_.p + 1, nullptr, false);
  ctx.synchronize();
  const std::vector<float> gdw = dw_.host();
  EXPECT_EQ(gdw[0], 0.f) << "the float before dW was written";
  expect_close(y_.host(), y, "unaligned 1x1: y", 1e-5);
  expect_close(dx_.host(), dx, "unaligned 1x1: dx", 1e-5);
  expect_close({gdw.begin() + 1, gdw.end()}, dw, "unaligned 1x1: dw", 1e-5);
}

TEST(GpuOps, ConvolutionCachesPerGeometry) {
  SKIP_WITHOUT_GPU();
  gpu::CudaBackend be(0);
  gpu::GpuContext& ctx = be.context();
  gpu::CudnnConv conv(ctx);  // one layer seeing several batch sizes, as at an epoch's last batch
  for (int64_t n : {3, 1, 3, 2}) {
    check_conv(ctx, conv, {"resnet.layer2.0.conv1 3x3 p1 s2", n, 28, 64, 128, 3, 2, 1}, true, 900 + n);
    if (HasFatalFailure()) return;
    check_conv(ctx, conv, {"5x5 p0 64->128 (same object)", n, 13, 64, 128, 5, 1, 0}, false, 950 + n);
    if (HasFatalFailure()) return;
  }
}

// ---- Linear --------------------------------------------------------------------------------------

// The backend's forward, backward overwriting, backward accumulating without dx, against
// src/cpu/ops.h.
void check_linear(gpu::CudaBackend& be, int64_t n, int64_t in, int64_t out, bool bias, uint64_t seed) {
  const std::string what = "linear " + std::to_string(n) + "x" + std::to_string(in) + "->" + std::to_string(out) +
                           (bias ? " +bias" : " no bias");
  const size_t xs = static_cast<size_t>(n * in), ys = static_cast<size_t>(n * out);
  const size_t ws = static_cast<size_t>(out * in), bs = static_cast<size_t>(out);
  auto x = random(xs, seed), w = random(ws, seed + 1, -0.2, 0.2), b = random(bs, seed + 2);
  auto dy = random(ys, seed + 3), dw0 = random(ws, seed + 4), db0 = random(bs, seed + 5);
  std::vector<float> y(ys), dx(xs), dw(ws), db(bs), dw_acc = dw0, db_acc = db0;
  const float* bp = bias ? b.data() : nullptr;
  cpu::linear_forward(x.data(), w.data(), bp, y.data(), n, in, out);
  cpu::linear_backward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), bias ? db.data() : nullptr, n, in, out,
                       false);
  cpu::linear_backward(x.data(), w.data(), dy.data(), nullptr, dw_acc.data(), bias ? db_acc.data() : nullptr, n, in,
                       out, true);

  Dev<float> x_(x), w_(w), b_(b), dy_(dy), y_(ys), dx_(xs), dw_(ws), db_(bs), dwa_(dw0), dba_(db0);
  be.linear_forward(x_.p, w_.p, bias ? b_.p : nullptr, y_.p, n, in, out);
  be.linear_backward(x_.p, w_.p, dy_.p, dx_.p, dw_.p, bias ? db_.p : nullptr, n, in, out, false);
  be.linear_backward(x_.p, w_.p, dy_.p, nullptr, dwa_.p, bias ? dba_.p : nullptr, n, in, out, true);
  be.context().synchronize();
  const bool bf16 = be.context().bf16();
  const double tol = bf16 ? kBf16Tol : 1e-5;
  expect_layer({y_.host(), dx_.host(), dw_.host(), dwa_.host()}, {y, dx, dw, dw_acc}, what, bf16, tol, tol);
  expect_close(dba_.host(), bias ? db_acc : db0, what + ": db accumulated");
  if (bias) expect_close(db_.host(), db, what + ": db");
}

// LeNet fc1, fc2 and ResNet-18's fc, at an odd batch size; fp32 and bf16 operands.
TEST(GpuOps, LinearMatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (bool bf16 : {false, true}) {
    gpu::CudaBackend be(0);
    be.context().set_bf16(bf16);
    uint64_t seed = bf16 ? 700 : 300;
    for (auto [n, in, out] : {std::tuple<int64_t, int64_t, int64_t>{37, 800, 128}, {37, 128, 10}, {37, 512, 10},
                              {1, 800, 128}})
      for (bool bias : {true, false}) {
        SCOPED_TRACE(bf16 ? "bf16" : "fp32");
        check_linear(be, n, in, out, bias, seed += 10);
        if (HasFatalFailure()) return;
      }
  }
}

TEST(GpuOps, ColumnSumsAccumulateInDouble) {
  SKIP_WITHOUT_GPU();
  gpu::CudaBackend be(0);
  gpu::GpuContext& ctx = be.context();
  // Many rows (several reduction chunks) and an odd column count (a partial channel tile).
  const int64_t rows = 2 * 28 * 28 * 13 + 7, cols = 67;
  auto a = random(static_cast<size_t>(rows * cols), 400), out0 = random(static_cast<size_t>(cols), 401);
  std::vector<float> sum(static_cast<size_t>(cols)), acc = out0;
  cpu::column_sums(a.data(), rows, cols, sum.data(), false);
  cpu::column_sums(a.data(), rows, cols, acc.data(), true);
  Dev<float> a_(a), s_(static_cast<size_t>(cols)), acc_(out0);
  gpu::column_sums(ctx, a_.p, rows, cols, s_.p, false);
  gpu::column_sums(ctx, a_.p, rows, cols, acc_.p, true);
  expect_close(s_.host(), sum, "column sums");
  expect_close(acc_.host(), acc, "column sums accumulated");
}

// ---- BatchNorm -----------------------------------------------------------------------------------

// The CPU reference is the BatchNorm2d layer itself (src/nn/layers.cc), so the GPU op is held to
// the layer's formulas, momentum convention and unbiased running variance, not to a re-derivation.
struct CpuBatchNorm {
  ParamStore store;
  std::unique_ptr<Layer> layer;
  Param *gamma, *beta, *mean, *var, *count;
  CpuBatchNorm(int64_t h, int64_t w, int64_t c, double momentum, double eps)
      : layer(make_batchnorm2d(momentum, eps)) {
    layer->build({h, w, c}, store, "bn");
    store.finalize();
    gamma = store.find("bn.weight"), beta = store.find("bn.bias");
    mean = store.find("bn.running_mean"), var = store.find("bn.running_var");
    count = store.find("bn.num_batches_tracked");
  }
  static std::vector<float> get(const Tensor& t) { return {t.data(), t.data() + t.numel()}; }
  static void set(Tensor& t, const std::vector<float>& v) { std::copy(v.begin(), v.end(), t.data()); }
};

TEST(GpuOps, BatchNormMatchesCpuLayer) {
  SKIP_WITHOUT_GPU();
  gpu::CudaBackend be(0);
  struct Case {
    int64_t n, h, c;
  };
  uint64_t seed = 500;
  // ResNet-18's BatchNorm widths; 16x28x28 rows spans many reduction chunks, C = 64 two tiles.
  for (Case k : {Case{16, 28, 64}, Case{8, 14, 128}, Case{4, 4, 512}, Case{3, 7, 256}}) {
    const double momentum = 0.1, eps = 1e-5;
    const int64_t m = k.n * k.h * k.h, c = k.c;
    const std::string what = "batchnorm N=" + std::to_string(k.n) + " H=W=" + std::to_string(k.h) +
                             " C=" + std::to_string(c);
    const size_t xs = static_cast<size_t>(m * c), cs = static_cast<size_t>(c);
    CpuBatchNorm ref(k.h, k.h, c, momentum, eps);
    auto gamma = random(cs, seed += 10, 0.5, 1.5), beta = random(cs, seed + 1);
    auto rmean = random(cs, seed + 2), rvar = random(cs, seed + 3, 0.5, 2.0);
    CpuBatchNorm::set(ref.gamma->value, gamma), CpuBatchNorm::set(ref.beta->value, beta);
    CpuBatchNorm::set(ref.mean->value, rmean), CpuBatchNorm::set(ref.var->value, rvar);
    // Per-channel offsets and spreads so mean and variance matter.
    auto x1 = random(xs, seed + 4), x2 = random(xs, seed + 5), dy = random(xs, seed + 6);
    auto off = random(cs, seed + 7, -3, 3), spread = random(cs, seed + 8, 0.2, 4);
    for (size_t i = 0; i < xs; ++i) {
      x1[i] = off[i % cs] + spread[i % cs] * x1[i];
      x2[i] = 0.5f * off[i % cs] + spread[i % cs] * x2[i];
    }

    const std::unique_ptr<BatchNormOp> bn = be.make_batchnorm(c, momentum, eps);
    Dev<float> g_(gamma), b_(beta), rm_(rmean), rv_(rvar), nbt_(std::vector<float>{0.f});
    Dev<float> x1_(x1), x2_(x2), dy_(dy), y_(xs), dx_(xs), dg_(cs), db_(cs);
    Tensor tx1 = Tensor::view(x1.data(), {k.n, k.h, k.h, c}), tx2 = Tensor::view(x2.data(), {k.n, k.h, k.h, c});
    Tensor tdy = Tensor::view(dy.data(), {k.n, k.h, k.h, c});
    Tensor y, dx;

    // Two training steps: the running statistics move twice and the counter reaches 2.
    ref.layer->forward(tx1, y, Mode::kTrain);
    bn->forward_train(x1_.p, y_.p, m, g_.p, b_.p, rm_.p, rv_.p, nbt_.p, {});
    expect_close(y_.host(), CpuBatchNorm::get(y), what + ": training y, step 1");
    ref.layer->forward(tx2, y, Mode::kTrain);
    bn->forward_train(x2_.p, y_.p, m, g_.p, b_.p, rm_.p, rv_.p, nbt_.p, {});
    expect_close(y_.host(), CpuBatchNorm::get(y), what + ": training y, step 2");
    expect_close(rm_.host(), CpuBatchNorm::get(ref.mean->value), what + ": running_mean");
    expect_close(rv_.host(), CpuBatchNorm::get(ref.var->value), what + ": running_var");
    EXPECT_EQ(nbt_.host()[0], ref.count->value.data()[0]) << what;
    EXPECT_EQ(nbt_.host()[0], 2.f) << what;

    // Backward of the second step: overwrite with dx, then accumulate without dx.
    BackwardCtx bctx;
    ref.layer->backward(tx2, y, tdy, &dx, bctx);
    const auto dgamma = CpuBatchNorm::get(ref.gamma->grad), dbeta = CpuBatchNorm::get(ref.beta->grad);
    bn->backward(x2_.p, dy_.p, dx_.p, m, g_.p, dg_.p, db_.p, false, {});
    expect_close(dx_.host(), CpuBatchNorm::get(dx), what + ": training dx");
    expect_close(dg_.host(), dgamma, what + ": dgamma");
    expect_close(db_.host(), dbeta, what + ": dbeta");
    bctx.accumulate = true;
    ref.layer->backward(tx2, y, tdy, nullptr, bctx);
    bn->backward(x2_.p, dy_.p, nullptr, m, g_.p, dg_.p, db_.p, true, {});
    expect_close(dg_.host(), CpuBatchNorm::get(ref.gamma->grad), what + ": dgamma accumulated (dx = null)");
    expect_close(db_.host(), CpuBatchNorm::get(ref.beta->grad), what + ": dbeta accumulated (dx = null)");

    // Evaluation: running statistics normalise, nothing moves, dx = dy * gamma * invstd.
    ref.layer->forward(tx1, y, Mode::kEval);
    bn->forward_eval(x1_.p, y_.p, m, g_.p, b_.p, rm_.p, rv_.p);
    expect_close(y_.host(), CpuBatchNorm::get(y), what + ": eval y");
    ref.layer->backward(tx1, y, tdy, &dx, bctx);
    bn->backward(x1_.p, dy_.p, dx_.p, m, g_.p, dg_.p, db_.p, true, {});
    expect_close(dx_.host(), CpuBatchNorm::get(dx), what + ": eval dx");
    expect_close(dg_.host(), CpuBatchNorm::get(ref.gamma->grad), what + ": eval dgamma accumulated");
    expect_close(rm_.host(), CpuBatchNorm::get(ref.mean->value), what + ": running_mean after eval");
    EXPECT_EQ(nbt_.host()[0], 2.f) << what;
    if (HasFatalFailure()) return;
  }
}

TEST(GpuOps, BatchNormSyncHookSeesStatsAndSums) {
  SKIP_WITHOUT_GPU();
  gpu::CudaBackend be(0);
  // A fake "other replica" with identical data: doubling every sum (count included) must leave
  // y and dx unchanged, exactly as the CPU layer's synchronised path does at world size 2.
  const int64_t n = 4, h = 7, c = 96, m = n * h * h;
  const size_t xs = static_cast<size_t>(m * c), cs = static_cast<size_t>(c);
  auto x = random(xs, 600, -2, 3), dy = random(xs, 601), gamma = random(cs, 602, 0.5, 1.5);
  auto beta = random(cs, 603);
  Dev<float> x_(x), dy_(dy), g_(gamma), b_(beta), rm0_(cs), rv0_(std::vector<float>(cs, 1.f)), rm1_(cs),
      rv1_(std::vector<float>(cs, 1.f));
  Dev<float> y0_(xs), y1_(xs), dx0_(xs), dx1_(xs), dg_(cs), db_(cs);
  std::vector<int64_t> seen;
  // The backend's copies are ordered on its stream and wait, as the hook's contract asks.
  const ChannelSumFn twice = [&](double* d, int64_t count) {
    seen.push_back(count);
    std::vector<double> hbuf(static_cast<size_t>(count));
    be.copy_to_host(hbuf.data(), d, hbuf.size() * sizeof(double));
    for (double& v : hbuf) v *= 2;
    be.copy_from_host(d, hbuf.data(), hbuf.size() * sizeof(double));
  };
  const std::unique_ptr<BatchNormOp> plain = be.make_batchnorm(c, 0.1, 1e-5), synced = be.make_batchnorm(c, 0.1, 1e-5);
  plain->forward_train(x_.p, y0_.p, m, g_.p, b_.p, rm0_.p, rv0_.p, nullptr, {});
  synced->forward_train(x_.p, y1_.p, m, g_.p, b_.p, rm1_.p, rv1_.p, nullptr, twice);
  plain->backward(x_.p, dy_.p, dx0_.p, m, g_.p, dg_.p, db_.p, false, {});
  synced->backward(x_.p, dy_.p, dx1_.p, m, g_.p, dg_.p, db_.p, false, twice);
  ASSERT_EQ(seen, (std::vector<int64_t>{2 * c + 1, 2 * c}));
  expect_close(y1_.host(), y0_.host(), "synced y");
  expect_close(dx1_.host(), dx0_.host(), "synced dx");
  expect_close(rm1_.host(), rm0_.host(), "synced running_mean");
  // The unbiased correction uses the all-reduced count (2m), so running_var differs by design.
  const auto rv0 = rv0_.host(), rv1 = rv1_.host();
  for (size_t i = 0; i < cs; ++i) {
    const double var_b = (rv0[i] - 0.9) / 0.1 * (m - 1) / m;  // back out the biased variance
    EXPECT_NEAR(rv1[i], 0.9 + 0.1 * var_b * (2.0 * m) / (2.0 * m - 1), 1e-5) << i;
  }
}

}  // namespace
}  // namespace dpt
