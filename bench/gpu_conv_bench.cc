// Where a GPU training step's time goes, per convolution geometry: a model's forward and backward
// on the CUDA backend timed whole (CUDA events, no synchronisation inside), then once more with
// every convolution call timed in place (a backend whose ConvOp wraps CudnnConv), then cuDNN's own
// timed search (cudnnFind*Ex) for each geometry beside the algorithm dptrain's heuristic picked, and
// the same search on channels-first (NCHW) descriptors.
// Modes: fp32 (FMA math), tf32 (--tf32), bf16 (--precision bf16). GPU builds only.
// Usage: build/bench/gpu_conv_bench [--model resnet18] [--batch 256] [--steps 10] [--modes fp32,tf32,bf16]
//        [--survey]
#include <cuda_runtime.h>

#include <algorithm>
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
#include "dpt/nn.h"
#include "dpt/rng.h"

namespace {

using dpt::ConvGeom;
using dpt::gpu::CudnnConv;

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

// Times each call with a pair of events on the context's stream, synchronising after it: a
// profile, so the sum exceeds the unprofiled step a little (launch gaps are no longer hidden).
class TimedConv : public dpt::ConvOp {
 public:
  TimedConv(dpt::gpu::GpuContext& ctx, std::map<std::string, Times>* table, bool* on, std::vector<CudnnConv*>* all)
      : ctx_(ctx), inner_(ctx), table_(table), on_(on) {
    all->push_back(&inner_);
    CUDA_CHECK(cudaEventCreate(&a_));
    CUDA_CHECK(cudaEventCreate(&b_));
  }
  ~TimedConv() override {
    cudaEventDestroy(a_);
    cudaEventDestroy(b_);
  }
  void forward(const ConvGeom& g, const float* x, const float* w, const float* b, float* y) override {
    const double ms = time([&] { inner_.forward(g, x, w, b, y); });
    if (*on_) add(g, ms, true);
  }
  void backward(const ConvGeom& g, const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                bool accumulate) override {
    const double ms = time([&] { inner_.backward(g, x, w, dy, dx, dw, db, accumulate); });
    if (*on_) add(g, ms, false);
  }

 private:
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
  CudnnConv inner_;
  std::map<std::string, Times>* table_;
  bool* on_;
  cudaEvent_t a_{}, b_{};
};

class ProfilingBackend : public dpt::gpu::CudaBackend {
 public:
  ProfilingBackend() : CudaBackend(0) {}
  std::unique_ptr<dpt::ConvOp> make_conv() override {
    return std::make_unique<TimedConv>(context(), &table, &profiling, &convs);
  }
  std::map<std::string, Times> table;
  bool profiling = false;
  std::vector<CudnnConv*> convs;
};

const char* math_name(cudnnMathType_t m) {
  switch (m) {
    case CUDNN_DEFAULT_MATH: return "default";
    case CUDNN_TENSOR_OP_MATH: return "tensor";
    case CUDNN_FMA_MATH: return "fma";
    default: return "other";
  }
}

void run_mode(const std::string& model_name, const std::string& mode, int64_t batch, int steps, bool survey) {
  ProfilingBackend be;
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
  for (int i = 0; i < 2; ++i) step();  // algorithm choice, workspace growth
  be.synchronize();
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
  std::printf("\n## %s %s batch %lld: step %.2f ms (forward+backward, mean of %d), convolutions %.2f ms of it "
              "when timed one by one\n",
              model_name.c_str(), mode.c_str(), static_cast<long long>(batch), total / steps, steps, conv_sum);
  std::printf("| geometry | layers | forward ms | backward ms |\n|---|---|---|---|\n");
  for (const auto& [k, t] : be.table)
    std::printf("| %s | %d | %.3f | %.3f |\n", k.c_str(), t.calls_fwd / steps, t.fwd_ms / steps,
                t.bwd_ms / steps);
  if (!survey || be.convs.empty()) return;
  std::printf("\ncuDNN's timed search per geometry (ms per call; * = dptrain's pick, d = deterministic), in "
              "dptrain's NHWC and, for comparison, NCHW:\n");
  for (const auto& [k, t] : be.table)
    for (bool nchw : {false, true}) {
      std::printf("- %s %s:", k.c_str(), nchw ? "NCHW" : "NHWC");
      const char* dir = "";
      for (const CudnnConv::AlgoTime& a : be.convs.front()->survey(t.g, nchw)) {
        if (std::string(dir) != a.direction) std::printf("\n    %s:", dir = a.direction);
        std::printf(" %d/%s%s%s %.3f", a.algo, math_name(a.math), a.deterministic ? "/d" : "", a.chosen ? "*" : "",
                    a.ms);
      }
      std::printf("\n");
    }
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = "resnet18", modes = "fp32,tf32,bf16";
  int64_t batch = 256;
  int steps = 10;
  bool survey = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--model" && i + 1 < argc) model = argv[++i];
    else if (a == "--batch" && i + 1 < argc) batch = std::atoll(argv[++i]);
    else if (a == "--steps" && i + 1 < argc) steps = std::atoi(argv[++i]);
    else if (a == "--modes" && i + 1 < argc) modes = argv[++i];
    else if (a == "--survey") survey = true;
    else {
      std::fprintf(stderr, "gpu_conv_bench: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (batch < 1 || steps < 1) {
    std::fprintf(stderr, "gpu_conv_bench: --batch and --steps must be >= 1\n");
    return 2;
  }
  std::stringstream ms(modes);
  for (std::string m; std::getline(ms, m, ',');) {
    if (m != "fp32" && m != "tf32" && m != "bf16") {
      std::fprintf(stderr, "gpu_conv_bench: --modes: unknown mode '%s' (fp32|tf32|bf16)\n", m.c_str());
      return 2;
    }
    run_mode(model, m, batch, steps, survey);
  }
  return 0;
}
