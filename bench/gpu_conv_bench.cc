// Where a GPU training step's time goes, per convolution geometry: a model's forward and backward
// on the CUDA backend timed whole (CUDA events, no synchronisation inside), then once more with
// every convolution call timed in place (a backend whose ConvOp wraps the API's convolution), then,
// for the legacy API, cuDNN's own timed search (cudnnFind*Ex) for each geometry beside the
// algorithm dptrain's heuristic picked, and the same search on channels-first (NCHW) descriptors;
// for the graph API (CudnnGraphConv, DPT_CUDNN_API=graph), the plan it timed and kept per key.
// Modes: fp32 (FMA math), tf32 (--tf32), bf16 (--precision bf16: convolutions on TF32), and, on the
// graph API only, bf16io: every convolution through the bf16 entry points (x, w, dy cast to bf16
// outside the timed call, outputs widened after it; the whole-step time includes those casts),
// what a bf16-activation path would run.
// --api legacy,graph prints both tables per mode from one run. --fused (graph-API builds) instead
// times, per ResNet-18 fusion site (cudnn_fused_conv.h), cuDNN's fused prologue+conv+genstats in
// bf16 against the separate passes it replaces: the BatchNorm apply+ReLU kernel, the bf16 graph
// convolution and the statistics kernel. GPU builds only.
// Usage: build/bench/gpu_conv_bench [--model resnet18] [--batch 256] [--steps 10] [--modes
// fp32,tf32,bf16]
//        [--api legacy|graph|legacy,graph] [--survey] [--fused]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#include "cuda/cudnn_conv.h"
#ifdef DPT_HAVE_CUDNN_FRONTEND
#include "batchnorm.cuh"
#include "cuda/conv_common.h"
#include "cuda/cudnn_fused_conv.h"
#include "cuda/cudnn_graph_conv.h"
#endif
#include "dpt/models.h"
#include "dpt/nn.h"
#include "dpt/rng.h"
#include "dpt/text.h"
#include "precision.cuh"

namespace {

using dpt::ConvGeom;
using dpt::gpu::CudnnConv;
using dpt::gpu::CudnnGraphConv;  // declared by cuda_backend.h; defined where the build has the
                                 // frontend
using dpt::gpu::DeviceBuffer;

std::string key_of(const ConvGeom& g) {
  std::ostringstream s;
  s << g.h << "x" << g.w << " " << g.c_in << "->" << g.c_out << " k" << g.k << " s" << g.stride;
  return s.str();
}

struct Times {
  int calls_fwd = 0, calls_bwd = 0;
  double fwd_ms = 0, bwd_ms = 0;
  ConvGeom g;
};

// A device copy in bf16 (bit patterns) of fp32 arrays, grown as needed.
struct Bf16Copy {
  DeviceBuffer buf;
  uint16_t* of(const float* x, int64_t n, cudaStream_t s) {
    uint16_t* p = room(n);
    CUDA_CHECK(dpt::cuda::launch_to_bf16(x, p, n, s));
    return p;
  }
  uint16_t* room(int64_t n) {
    const size_t bytes = static_cast<size_t>(n) * sizeof(uint16_t);
    if (buf.bytes() < bytes) buf = DeviceBuffer(bytes);
    return buf.as<uint16_t>();
  }
};

// Times each call with a pair of events on the context's stream, synchronising after it: a
// profile, so the sum exceeds the unprofiled step a little (launch gaps are no longer hidden).
// `inner` is the layer's op (legacy: its own CudnnConv; graph: the backend's shared one); with
// `bf16io`, calls go to its bf16 entry points instead, the casts outside the timed interval.
class TimedConv : public dpt::ConvOp {
 public:
  TimedConv(dpt::gpu::GpuContext& ctx, std::shared_ptr<dpt::ConvOp> inner, CudnnGraphConv* bf16io,
            std::map<std::string, Times>* table, bool* on)
      : ctx_(ctx), inner_(std::move(inner)), bf16io_(bf16io), table_(table), on_(on) {
    CUDA_CHECK(cudaEventCreate(&a_));
    CUDA_CHECK(cudaEventCreate(&b_));
  }
  ~TimedConv() override {
    cudaEventDestroy(a_);
    cudaEventDestroy(b_);
  }
  void forward(const ConvGeom& g, const float* x, const float* w, const float* b,
               float* y) override {
    double ms = 0;
    if (bf16io_) {
#ifdef DPT_HAVE_CUDNN_FRONTEND
      const auto [nx, ny, s, x16, w16] = operands16(g, x, w);
      uint16_t* y16 = y16_.room(ny);
      ms = time([&] { bf16io_->forward_bf16(g, x16, w16, b, bf(y16)); });
      CUDA_CHECK(dpt::cuda::launch_from_bf16(y16, y, ny, false, s));
#endif
    } else {
      ms = time([&] { inner_->forward(g, x, w, b, y); });
    }
    if (*on_) add(g, ms, true);
  }
  void backward(const ConvGeom& g, const float* x, const float* w, const float* dy, float* dx,
                float* dw, float* db, bool accumulate) override {
    double ms = 0;
    if (bf16io_) {
#ifdef DPT_HAVE_CUDNN_FRONTEND
      const auto [nx, ny, s, x16, w16] = operands16(g, x, w);
      const auto* dy16 = bf(dy16_.of(dy, ny, s));
      uint16_t* dx16 = dx ? dx16_.room(nx) : nullptr;
      ms = time([&] {
        bf16io_->backward_bf16(g, x16, w16, dy16, dx ? bf(dx16) : nullptr, dw, db, accumulate);
      });
      if (dx) CUDA_CHECK(dpt::cuda::launch_from_bf16(dx16, dx, nx, false, s));
#endif
    } else {
      ms = time([&] { inner_->backward(g, x, w, dy, dx, dw, db, accumulate); });
    }
    if (*on_) add(g, ms, false);
  }
  // 16-bit activations (a model with --activation-dtype bf16): the layer's own bf16 path, timed.
  void forward(const ConvGeom& g, const dpt::BFloat16* x, const float* w, const float* b,
               dpt::BFloat16* y) override {
    const double ms = time([&] { inner_->forward(g, x, w, b, y); });
    if (*on_) add(g, ms, true);
  }
  void backward(const ConvGeom& g, const dpt::BFloat16* x, const float* w, const dpt::BFloat16* dy,
                dpt::BFloat16* dx, float* dw, float* db, bool accumulate) override {
    const double ms = time([&] { inner_->backward(g, x, w, dy, dx, dw, db, accumulate); });
    if (*on_) add(g, ms, false);
  }

 private:
  static __nv_bfloat16* bf(uint16_t* p) { return reinterpret_cast<__nv_bfloat16*>(p); }
  // x and w as bf16 copies (made once per pointer and size), with the sizes of x and y and the
  // stream.
  struct Operands16 {
    int64_t nx, ny;
    cudaStream_t s;
    const __nv_bfloat16 *x16, *w16;
  };
  Operands16 operands16(const ConvGeom& g, const float* x, const float* w) {
    const int64_t nx = g.n * g.h * g.w * g.c_in, nw = g.c_out * g.c_in * g.k * g.k;
    cudaStream_t s = ctx_.stream();
    return {nx, g.n * g.oh() * g.ow() * g.c_out, s, bf(x16_.of(x, nx, s)), bf(w16_.of(w, nw, s))};
  }
  template <class F>
  double time(F f) {
    if (!*on_) {
      f();
      return 0;
    }
    CUDA_CHECK(cudaEventRecord(a_, ctx_.stream()));
    f();
    CUDA_CHECK(cudaEventRecord(b_, ctx_.stream()));
    CUDA_CHECK(cudaEventSynchronize(b_));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a_, b_));
    return ms;
  }
  void add(const ConvGeom& g, double ms, bool fwd) {
    Times& t = (*table_)[key_of(g)];
    t.g = g;
    (fwd ? t.fwd_ms : t.bwd_ms) += ms;
    ++(fwd ? t.calls_fwd : t.calls_bwd);
  }
  dpt::gpu::GpuContext& ctx_;
  std::shared_ptr<dpt::ConvOp> inner_;
  CudnnGraphConv* bf16io_;  // whose bf16 entry points run, or null
  Bf16Copy x16_, w16_, dy16_, y16_, dx16_;
  std::map<std::string, Times>* table_;
  bool* on_;
  cudaEvent_t a_{}, b_{};
};

// api "legacy": a CudnnConv per layer (kept for the survey); "graph": one CudnnGraphConv shared
// by every layer, as CudaBackend shares it.
class ProfilingBackend : public dpt::gpu::CudaBackend {
 public:
  ProfilingBackend(std::string api, bool bf16io)
      : CudaBackend(0), api_(std::move(api)), bf16io_(bf16io) {}
  std::unique_ptr<dpt::ConvOp> make_conv() override {
    std::shared_ptr<dpt::ConvOp> inner;
    CudnnGraphConv* bf16io = nullptr;
    if (api_ == "legacy") {
      auto conv = std::make_shared<CudnnConv>(context());
      convs.push_back(conv.get());
      inner = conv;
    } else {
#ifdef DPT_HAVE_CUDNN_FRONTEND
      if (!graph) graph = std::make_shared<CudnnGraphConv>(context());
      inner = graph;
      if (bf16io_) bf16io = graph.get();
#endif
    }
    return std::make_unique<TimedConv>(context(), std::move(inner), bf16io, &table, &profiling);
  }
  std::map<std::string, Times> table;
  bool profiling = false;
  std::vector<CudnnConv*> convs;
  std::shared_ptr<CudnnGraphConv> graph;

 private:
  std::string api_;
  bool bf16io_;
};

const char* math_name(cudnnMathType_t m) {
  switch (m) {
    case CUDNN_DEFAULT_MATH:
      return "default";
    case CUDNN_TENSOR_OP_MATH:
      return "tensor";
    case CUDNN_FMA_MATH:
      return "fma";
    default:
      return "other";
  }
}

void run_mode(const std::string& model_name, const std::string& mode, const std::string& api,
              int64_t batch, int steps, bool survey) {
  ProfilingBackend be(api, mode == "bf16io");
  be.context().set_tf32(mode == "tf32");
  be.context().set_bf16(mode == "bf16");
  auto model = dpt::make_model(model_name, 10, be);
  model->init_parameters("kaiming", 1);
  dpt::Rng r(2);
  std::vector<float> hx(static_cast<size_t>(batch * 28 * 28)), hdl(static_cast<size_t>(batch * 10));
  for (auto& v : hx) v = static_cast<float>(r.uniform(0, 1));
  for (auto& v : hdl) v = static_cast<float>(r.uniform(-1, 1) / static_cast<double>(batch));
  dpt::Tensor x({batch, 28, 28, 1}, &be), dl({batch, 10}, &be);
  be.copy_from_host(x.data(), hx.data(), hx.size() * sizeof(float));
  be.copy_from_host(dl.data(), hdl.data(), hdl.size() * sizeof(float));
  auto step = [&] {
    dpt::BackwardCtx ctx;
    model->forward(x, dpt::Mode::kTrain);
    model->backward(dl, ctx);
  };
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 2; ++i) step();  // algorithm or plan choice, workspace growth
  be.synchronize();
  const double setup_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  CUDA_CHECK(cudaEventRecord(a, be.context().stream()));
  for (int i = 0; i < steps; ++i) step();
  CUDA_CHECK(cudaEventRecord(b, be.context().stream()));
  CUDA_CHECK(cudaEventSynchronize(b));
  float total = 0;
  CUDA_CHECK(cudaEventElapsedTime(&total, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  be.profiling = true;
  for (int i = 0; i < steps; ++i) step();
  be.profiling = false;
  double conv_sum = 0;
  for (const auto& [k, t] : be.table) conv_sum += (t.fwd_ms + t.bwd_ms) / steps;
  std::printf(
      "\n## %s %s batch %lld, cuDNN %s API: step %.2f ms (forward+backward, mean of %d), "
      "convolutions "
      "%.2f ms of it when timed one by one; the first two steps (choices, workspace) took %.1f s\n",
      model_name.c_str(), mode.c_str(), static_cast<long long>(batch), api.c_str(), total / steps,
      steps, conv_sum, setup_s);
  std::printf("| geometry | layers | forward ms | backward ms |\n|---|---|---|---|\n");
  for (const auto& [k, t] : be.table)
    std::printf("| %s | %d | %.3f | %.3f |\n", k.c_str(), t.calls_fwd / steps, t.fwd_ms / steps,
                t.bwd_ms / steps);
#ifdef DPT_HAVE_CUDNN_FRONTEND
  if (be.graph) {
    std::printf("\ncuDNN graph plans kept (the fastest of those timed on the first step):\n");
    for (const CudnnGraphConv::Choice& c : be.graph->choices())
      std::printf("- %s: %s, %.3f ms, fastest of %d, workspace %lld bytes\n", c.key.c_str(),
                  c.plan.c_str(), c.ms, c.candidates, static_cast<long long>(c.workspace));
  }
#endif
  if (!survey || be.convs.empty()) return;
  std::printf(
      "\ncuDNN's timed search per geometry (ms per call; * = dptrain's pick, d = deterministic), "
      "in "
      "dptrain's NHWC and, for comparison, NCHW:\n");
  for (const auto& [k, t] : be.table)
    for (bool nchw : {false, true}) {
      std::printf("- %s %s:", k.c_str(), nchw ? "NCHW" : "NHWC");
      const char* dir = "";
      for (const CudnnConv::AlgoTime& a : be.convs.front()->survey(t.g, nchw)) {
        if (std::string(dir) != a.direction) std::printf("\n    %s:", dir = a.direction);
        std::printf(" %d/%s%s%s %.3f", a.algo, math_name(a.math), a.deterministic ? "/d" : "",
                    a.chosen ? "*" : "", a.ms);
      }
      std::printf("\n");
    }
}

#ifdef DPT_HAVE_CUDNN_FRONTEND
// Mean time per call of f over `steps` calls on the stream, after one untimed call (plan choice).
template <class F>
double ms_per_call(cudaStream_t s, int steps, F f) {
  f();
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  CUDA_CHECK(cudaEventRecord(a, s));
  for (int i = 0; i < steps; ++i) f();
  CUDA_CHECK(cudaEventRecord(b, s));
  CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / steps;
}

// --fused: one table row per ResNet-18 fusion site. The separate passes are what the layers run
// today with 16-bit activations: y = BN-apply+ReLU(x) with mean 0 and invstd 1 (so the kernel's
// scale and shift are the fused op's scale and bias), the graph convolution, then the channel
// sums the next BatchNorm takes (in double: the layers' statistics).
void run_fused(int64_t batch, int steps) {
  using dpt::gpu::FusedConvGenstats;
  dpt::gpu::CudaBackend be(0);
  dpt::gpu::GpuContext& ctx = be.context();
  FusedConvGenstats fused(ctx);
  CudnnGraphConv conv(ctx);
  cudaStream_t s = ctx.stream();
  std::printf(
      "\n## fused BatchNorm-prologue convolution with genstats, bf16, batch %lld (ms per call, "
      "mean of %d)\n",
      static_cast<long long>(batch), steps);
  std::printf(
      "| site | geometry | pattern | fused | apply+relu | conv | stats | separate | separate/fused "
      "| fused "
      "plan |\n|---|---|---|---|---|---|---|---|---|---|\n");
  for (const dpt::gpu::FusionSite& site : dpt::gpu::resnet18_fusion_sites(batch)) {
    const ConvGeom& g = site.g;
    const int64_t m_in = g.n * g.h * g.w, m_out = g.n * g.oh() * g.ow();
    const int64_t nx = m_in * g.c_in, ny = m_out * g.c_out, nw = g.c_out * g.c_in * g.k * g.k;
    dpt::Rng r(7);
    std::vector<float> hx(static_cast<size_t>(nx)), hw(static_cast<size_t>(nw));
    for (auto& v : hx) v = static_cast<float>(r.uniform(-1, 1));
    for (auto& v : hw) v = static_cast<float>(r.uniform(-0.05, 0.05));
    DeviceBuffer fx(hx.size() * 4), fw(hw.size() * 4), x(hx.size() * 2), w(hw.size() * 2),
        a(hx.size() * 2), y(static_cast<size_t>(ny) * 2), scale(static_cast<size_t>(g.c_in) * 4),
        bias(static_cast<size_t>(g.c_in) * 4), zero(static_cast<size_t>(g.c_in) * 4),
        one(static_cast<size_t>(g.c_in) * 4), sum(static_cast<size_t>(g.c_out) * 4),
        sq(static_cast<size_t>(g.c_out) * 4), dsum(static_cast<size_t>(g.c_out) * 8),
        dsq(static_cast<size_t>(g.c_out) * 8),
        scratch(static_cast<size_t>(dpt::cuda::bn_sums_scratch_elems(m_out, g.c_out)) * 8);
    CUDA_CHECK(cudaMemcpy(fx.as<float>(), hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(fw.as<float>(), hw.data(), hw.size() * 4, cudaMemcpyHostToDevice));
    const std::vector<float> h_one(static_cast<size_t>(g.c_in), 1.f), h_scale(h_one.size(), 1.5f),
        h_bias(h_one.size(), -0.25f), h_zero(h_one.size(), 0.f);
    for (auto [buf, h] :
         {std::pair{&scale, &h_scale}, {&bias, &h_bias}, {&zero, &h_zero}, {&one, &h_one}})
      CUDA_CHECK(cudaMemcpy(buf->as<float>(), h->data(), h->size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(dpt::cuda::launch_to_bf16(fx.as<float>(), x.as<uint16_t>(), nx, s));
    CUDA_CHECK(dpt::cuda::launch_to_bf16(fw.as<float>(), w.as<uint16_t>(), nw, s));
    const auto nv = [](const DeviceBuffer& b) { return b.as<__nv_bfloat16>(); };
    const char* pattern = site.prologue ? "scale-bias-relu-conv-genstats" : "conv-genstats";
    double fused_ms = -1;
    std::string plan = "unsupported";
    try {
      fused_ms = ms_per_call(s, steps, [&] {
        fused.forward_bf16(g, nv(x), site.prologue ? scale.as<float>() : nullptr,
                           site.prologue ? bias.as<float>() : nullptr, nv(w), nv(y),
                           sum.as<float>(), sq.as<float>());
      });
      for (const FusedConvGenstats::Choice& c : fused.choices())
        if (c.key == dpt::gpu::geom_str(g) + " " + pattern + " bf16") plan = c.plan;
    } catch (const dpt::Error& e) {
      std::fprintf(stderr, "%s %s: %s\n", site.name, pattern, e.what());
    }
    const double apply_ms =
        site.prologue ? ms_per_call(s, steps,
                                    [&] {
                                      CUDA_CHECK(dpt::cuda::launch_bn_apply(
                                          x.as<uint16_t>(), a.as<uint16_t>(), zero.as<float>(),
                                          one.as<float>(), scale.as<float>(), bias.as<float>(),
                                          m_in, g.c_in, nullptr, true, s));
                                    })
                      : 0;
    const DeviceBuffer& conv_in = site.prologue ? a : x;
    const double conv_ms =
        ms_per_call(s, steps, [&] { conv.forward_bf16(g, nv(conv_in), nv(w), nullptr, nv(y)); });
    const double stats_ms = ms_per_call(s, steps, [&] {
      CUDA_CHECK(dpt::cuda::launch_bn_sums(y.as<uint16_t>(), m_out, g.c_out, dsum.as<double>(),
                                           dsq.as<double>(), nullptr, scratch.as<double>(), s));
    });
    const double separate = apply_ms + conv_ms + stats_ms;
    std::printf("| %s | %s | %s | %s | %.3f | %.3f | %.3f | %.3f | %s | %s |\n", site.name,
                dpt::gpu::geom_str(g).c_str(), pattern,
                fused_ms < 0 ? "-" : std::to_string(fused_ms).substr(0, 6).c_str(), apply_ms,
                conv_ms, stats_ms, separate,
                fused_ms <= 0 ? "-" : std::to_string(separate / fused_ms).substr(0, 5).c_str(),
                plan.c_str());
  }
}
#endif

}  // namespace

int main(int argc, char** argv) {
  std::string model = "resnet18", modes = "fp32,tf32,bf16", apis = "legacy";
  int64_t batch = 256;
  int steps = 10;
  bool survey = false, fused = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--model" && i + 1 < argc)
      model = argv[++i];
    else if (a == "--batch" && i + 1 < argc)
      batch = std::atoll(argv[++i]);
    else if (a == "--steps" && i + 1 < argc)
      steps = std::atoi(argv[++i]);
    else if (a == "--modes" && i + 1 < argc)
      modes = argv[++i];
    else if (a == "--api" && i + 1 < argc)
      apis = argv[++i];
    else if (a == "--survey")
      survey = true;
    else if (a == "--fused")
      fused = true;
    else {
      std::fprintf(stderr, "gpu_conv_bench: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (batch < 1 || steps < 1) {
    std::fprintf(stderr, "gpu_conv_bench: --batch and --steps must be >= 1\n");
    return 2;
  }
  if (fused) {
#ifdef DPT_HAVE_CUDNN_FRONTEND
    run_fused(batch, steps);
    return 0;
#else
    std::fprintf(
        stderr,
        "gpu_conv_bench: --fused: this build has no cuDNN graph API (launch/cudnn_frontend.sh)\n");
    return 2;
#endif
  }
  const std::vector<std::string> mode_list = dpt::split_list(modes, ','),
                                 api_list = dpt::split_list(apis, ',');
  for (const std::string& a : api_list) {
    if (a != "legacy" && a != "graph") {
      std::fprintf(stderr, "gpu_conv_bench: --api: unknown API '%s' (legacy|graph)\n", a.c_str());
      return 2;
    }
#ifndef DPT_HAVE_CUDNN_FRONTEND
    if (a == "graph") {
      std::fprintf(stderr,
                   "gpu_conv_bench: --api graph: this build has no cuDNN graph API "
                   "(launch/cudnn_frontend.sh)\n");
      return 2;
    }
#endif
  }
  for (const std::string& m : mode_list) {
    if (m != "fp32" && m != "tf32" && m != "bf16" && m != "bf16io") {
      std::fprintf(stderr, "gpu_conv_bench: --modes: unknown mode '%s' (fp32|tf32|bf16|bf16io)\n",
                   m.c_str());
      return 2;
    }
    for (const std::string& a : api_list) {
      if (m == "bf16io" && a != "graph") {
        std::printf("\n## %s bf16io, cuDNN %s API: skipped (bf16 arrays need the graph API)\n",
                    model.c_str(), a.c_str());
        continue;
      }
      run_mode(model, m, a, batch, steps, survey);
    }
  }
  return 0;
}
