// What tests/unit/test_backend_ops.cc (every backend operation against references, on the CUDA
// backend too) cannot see of the CUDA backend: tensor-core numerics (TF32 convolutions, bf16 GEMM
// operands), cuDNN's per-geometry algorithm cache, weights at unaligned addresses, and allocations
// counted for CUDA graphs. Against the CPU's operations on fresh random inputs. Skipped, with exit
// code 77 so meson reports SKIP (gpu_test_main.cc), where no CUDA device is visible (CI).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "cpu/conv.h"
#include "cpu/ops.h"
#include "cpu/winograd.h"
#include "cuda/cuda_backend.h"
#include "cuda/cudnn_conv.h"
#include "dpt/tensor.h"
#include "gpu_test_util.h"

namespace dpt {
namespace {

using test::Dev;
using test::expect_close;
using test::random;

// ---- Memory
// --------------------------------------------------------------------------------------

// The backend's storage is counted with every DeviceBuffer, since a CUDA graph captured before an
// allocation may hold pointers to storage it replaced and must not be replayed (StreamGraph watches
// the count); a resize within capacity allocates nothing, so it leaves a graph valid.
TEST(GpuOps, BackendAllocationsAreCountedForCudaGraphs) {
  SKIP_WITHOUT_GPU();
  gpu::CudaBackend be(0);
  const int64_t n = 1000;
  const uint64_t before = gpu::DeviceBuffer::allocations();
  Tensor a({n}, &be), b({n}, &be);
  EXPECT_EQ(gpu::DeviceBuffer::allocations(), before + 2);
  a.resize({n / 2});
  EXPECT_EQ(gpu::DeviceBuffer::allocations(), before + 2);
}

// ---- Convolution
// ---------------------------------------------------------------------------------

struct ConvCase {
  const char* name;
  int64_t n, h, c_in, c_out, k, stride, pad;
};

// LeNet's two convolutions and every distinct ResNet-18 convolution shape on 28x28 inputs:
// 3x3 pad 1 stride 1 and 2, the 1x1 stride-2 shortcuts, 5x5 and 3x3 without padding. (In fp32 the
// models' parity tests, tests/gpu/test_gpu_model.cc, run them all.)
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
void expect_bf16_rounding(const std::vector<float>& gpu, const std::vector<float>& cpu,
                          const std::string& what) {
  const double e = rel_error(gpu, cpu);
  EXPECT_GT(e, 1e-6) << what << ": no tensor-core rounding visible";
  EXPECT_LT(e, kBf16Tol) << what;
}

// What each layer check compares: y, dx, dw (overwritten) and dw accumulated without dx.
struct LayerResults {
  std::vector<float> y, dx, dw, dw_acc;
};
// bf16: the GPU ran on tensor cores (rounded operands), whose rounding must then show.
void expect_layer(const LayerResults& gpu, const LayerResults& cpu, const std::string& what,
                  bool bf16, double tol_y, double tol_dw) {
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
void check_conv(gpu::GpuContext& ctx, gpu::CudnnConv& conv, const ConvCase& c, bool bias,
                uint64_t seed) {
  const ConvGeom g{c.n, c.h, c.h, c.c_in, c.c_out, c.k, c.stride, c.pad};
  const std::string what =
      std::string(c.name) + (bias ? " +bias" : " no bias") + " N=" + std::to_string(c.n);
  const size_t xs = static_cast<size_t>(g.n * g.h * g.w * g.c_in);
  const size_t ys = static_cast<size_t>(g.n * g.oh() * g.ow() * g.c_out);
  const size_t ws = static_cast<size_t>(g.c_out * g.c_in * g.k * g.k);
  const size_t bs = static_cast<size_t>(g.c_out);
  auto x = random(xs, seed), w = random(ws, seed + 1, -0.5, 0.5), b = random(bs, seed + 2);
  auto dy = random(ys, seed + 3), dw0 = random(ws, seed + 4), db0 = random(bs, seed + 5);

  cpu::ConvPrimitives ref;
  std::vector<float> y(ys), dx(xs), dw(ws), db(bs), dw_acc = dw0, db_acc = db0;
  ref.forward(g, x.data(), w.data(), bias ? b.data() : nullptr, y.data());
  ref.backward(g, x.data(), w.data(), dy.data(), dx.data(), dw.data(), bias ? db.data() : nullptr,
               false);
  ref.backward(g, x.data(), w.data(), dy.data(), nullptr, dw_acc.data(),
               bias ? db_acc.data() : nullptr, true);

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
               tc     ? kBf16Tol
               : wc.m ? 5e-5
                      : 1e-5,
               tc      ? kBf16Tol
               : wc.mw ? 5e-5
                       : 1e-5);
  if (bias) {  // column sums of the fp32 dy: fp32 agreement in both precisions
    expect_close(db_.host(), db, what + ": db");
    expect_close(dba_.host(), db_acc, what + ": db accumulated (dx = null)");
  } else {
    expect_close(dba_.host(), db0, what + ": db untouched without bias");
  }
}

// --precision bf16 and --tf32 both convolve on TF32 tensor cores (cudnn_conv.cc says why).
TEST(GpuOps, TensorCoreConvolutionMatchesCpuWithinTf32Rounding) {
  SKIP_WITHOUT_GPU();
  for (bool bf16 : {true, false}) {
    gpu::CudaBackend be(0);
    gpu::GpuContext& ctx = be.context();
    if (bf16)
      ctx.set_bf16(true);
    else
      ctx.set_tf32(true);
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
  const size_t xs = static_cast<size_t>(g.n * g.h * g.w * g.c_in),
               ys = static_cast<size_t>(g.n * g.oh() * g.ow() * g.c_out);
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
    check_conv(ctx, conv, {"resnet.layer2.0.conv1 3x3 p1 s2", n, 28, 64, 128, 3, 2, 1}, true,
               900 + n);
    if (HasFatalFailure()) return;
    check_conv(ctx, conv, {"5x5 p0 64->128 (same object)", n, 13, 64, 128, 5, 1, 0}, false,
               950 + n);
    if (HasFatalFailure()) return;
  }
}

// ---- Linear
// --------------------------------------------------------------------------------------

// The backend's forward, backward overwriting, backward accumulating without dx, against
// src/cpu/ops.h.
void check_linear(gpu::CudaBackend& be, int64_t n, int64_t in, int64_t out, bool bias,
                  uint64_t seed) {
  const std::string what = "linear " + std::to_string(n) + "x" + std::to_string(in) + "->" +
                           std::to_string(out) + (bias ? " +bias" : " no bias");
  const size_t xs = static_cast<size_t>(n * in), ys = static_cast<size_t>(n * out);
  const size_t ws = static_cast<size_t>(out * in), bs = static_cast<size_t>(out);
  auto x = random(xs, seed), w = random(ws, seed + 1, -0.2, 0.2), b = random(bs, seed + 2);
  auto dy = random(ys, seed + 3), dw0 = random(ws, seed + 4), db0 = random(bs, seed + 5);
  std::vector<float> y(ys), dx(xs), dw(ws), db(bs), dw_acc = dw0, db_acc = db0;
  const float* bp = bias ? b.data() : nullptr;
  cpu::linear_forward(x.data(), w.data(), bp, y.data(), n, in, out);
  cpu::linear_backward(x.data(), w.data(), dy.data(), dx.data(), dw.data(),
                       bias ? db.data() : nullptr, n, in, out, false);
  cpu::linear_backward(x.data(), w.data(), dy.data(), nullptr, dw_acc.data(),
                       bias ? db_acc.data() : nullptr, n, in, out, true);

  Dev<float> x_(x), w_(w), b_(b), dy_(dy), y_(ys), dx_(xs), dw_(ws), db_(bs), dwa_(dw0), dba_(db0);
  be.linear_forward(x_.p, w_.p, bias ? b_.p : nullptr, y_.p, n, in, out);
  be.linear_backward(x_.p, w_.p, dy_.p, dx_.p, dw_.p, bias ? db_.p : nullptr, n, in, out, false);
  be.linear_backward(x_.p, w_.p, dy_.p, nullptr, dwa_.p, bias ? dba_.p : nullptr, n, in, out, true);
  be.context().synchronize();
  const bool bf16 = be.context().bf16();
  const double tol = bf16 ? kBf16Tol : 1e-5;
  expect_layer({y_.host(), dx_.host(), dw_.host(), dwa_.host()}, {y, dx, dw, dw_acc}, what, bf16,
               tol, tol);
  expect_close(dba_.host(), bias ? db_acc : db0, what + ": db accumulated");
  if (bias) expect_close(db_.host(), db, what + ": db");
}

// --precision bf16: LeNet fc1, fc2 and ResNet-18's fc on bf16 copies of the operands (kernels/
// precision.cuh) accumulated in fp32, at an odd batch size and at batch 1.
TEST(GpuOps, Bf16LinearMatchesCpuWithinBf16Rounding) {
  SKIP_WITHOUT_GPU();
  gpu::CudaBackend be(0);
  be.context().set_bf16(true);
  uint64_t seed = 700;
  for (auto [n, in, out] : {std::tuple<int64_t, int64_t, int64_t>{37, 800, 128},
                            {37, 128, 10},
                            {37, 512, 10},
                            {1, 800, 128}})
    for (bool bias : {true, false}) {
      check_linear(be, n, in, out, bias, seed += 10);
      if (HasFatalFailure()) return;
    }
}

}  // namespace
}  // namespace dpt
