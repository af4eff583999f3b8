// CudnnConv (see cudnn_conv.h) on cuDNN 9's legacy convolution API (cudnn_cnn.h, deprecated in 9
// but shipped; the libcudnn shim exports it). Only compiled in GPU builds.
//
// Layouts: activations are NHWC tensors. cuDNN's best-supported NHWC configuration has the filter
// in NHWC too (KRSC = [Cout][K][K][Cin]), the layout frameworks pair with channels-last data, so
// weights are transformed OIHW -> OHWI into the workspace on each call (weights change every step;
// the transform is tiny next to the convolution) and dW comes back through the inverse transform,
// which also does the accumulate (beta = 1). When Cin == 1 or K == 1 the two layouts are the same
// bytes and no transform is made.
//
// Numerics: CUDNN_FMA_MATH, because CUDNN_DEFAULT_MATH lets cuDNN run fp32 convolutions as TF32 on
// tensor cores (Ampere and newer), 10-bit mantissas that would break agreement with the CPU
// backend. With --tf32 or --precision bf16 (GpuContext::tensor_ops) the descriptor asks for
// CUDNN_DEFAULT_MATH and tensor-op algorithms are accepted too, each run under the math type cuDNN
// ranked it with; fp16 down-conversion (CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) never is. Without it
// every algorithm runs under CUDNN_FMA_MATH, whatever math type the ranking lists. Algorithms come
// from cuDNN's heuristic ranking (cudnnGet*_v7), not from timing (cudnnFind*): the choice is then a
// function of shape and device only, the same on every run and rank, which keeps runs and resumes
// bit-reproducible; deterministic algorithms are preferred. bench/gpu_conv_bench compares the pick
// with cuDNN's timed search (survey): on an H100, for ResNet-18 at batch 256, the pick was the
// fastest deterministic algorithm or within 0.3 ms of it; a non-deterministic backward-filter
// algorithm was up to 1.4 ms faster (fp32, 28x28 64->128 1x1 stride 2).
//
// --precision bf16 convolves fp32 tensors on TF32 tensor cores, not bf16 copies: measured on an
// H100 with cuDNN 9 (bench/gpu_conv_bench, ResNet-18 at batch 256, docs/PERFORMANCE.md), this
// legacy API's NHWC bf16 engines were slower than TF32 in every direction and pathological in
// backward-data (27 ms per call where TF32 takes 0.16 ms), so a bf16 step took 418 ms against
// 20 ms in TF32. TF32 rounds operands to 10-bit mantissas, finer than bf16's 7; the Linear
// layers' GEMMs still take bf16 operands (cublas_linear.cc). For the same reason bf16 activations
// (--activation-dtype bf16) are convolved in fp32 here: widened exactly into the context's staging
// (two grow-only slots, so nothing is allocated after a shape's first call), convolved by the fp32
// path, the outputs rounded once. The graph API (cudnn_graph_conv.cc) convolves them natively.
//
// Alignment: weights at a 4-byte offset into the flat parameter buffers are slow in cuDNN
// (conv_common.h), so weights that need no layout change are still copied into the aligned
// workspace, and dW written there, unless the pointer is 256-byte aligned (cudaMalloc's own).
#include "cuda/cudnn_conv.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda/bf16_ptr.h"
#include "cuda/conv_common.h"
#include "cuda/cublas_linear.h"
#include "cuda/cuda_check.h"
#include "dpt/log.h"
#include "precision.cuh"

namespace dpt::gpu {

namespace {

// Whether an algorithm's math type is allowed: tensor-op math only where tensor cores are (TF32
// or bf16 allowed), and never with fp16 down-conversion.
bool math_allowed(cudnnMathType_t m, bool tensor_ops) {
  if (m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) return false;
  return tensor_ops || m != CUDNN_TENSOR_OP_MATH;
}
// The descriptor's math type while cuDNN ranks algorithms (and between calls).
cudnnMathType_t base_math(bool tensor_ops) {
  return tensor_ops ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
}
// The math type an algorithm listed with `m` runs under: FMA (never TF32) unless tensor cores are
// allowed.
cudnnMathType_t run_math(cudnnMathType_t m, bool tensor_ops) {
  return tensor_ops ? m : CUDNN_FMA_MATH;
}

std::string no_algorithm(const char* direction, const ConvGeom& g) {
  return DPT_MSG("cuDNN offers no " << direction << " algorithm for convolution " << geom_str(g));
}

// x, y and the filter of convolution g as fp32 descriptors in `format` (for the filter, NHWC is
// KRSC and NCHW is KCRS).
void set_descriptors(cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t y,
                     cudnnFilterDescriptor_t w, cudnnTensorFormat_t format, const ConvGeom& g) {
  const int n = as_int(g.n, g), h = as_int(g.h, g), wd = as_int(g.w, g), ci = as_int(g.c_in, g),
            co = as_int(g.c_out, g), k = as_int(g.k, g), oh = as_int(g.oh(), g),
            ow = as_int(g.ow(), g);
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(x, format, CUDNN_DATA_FLOAT, n, ci, h, wd));
  CUDNN_CHECK(cudnnSetTensor4dDescriptor(y, format, CUDNN_DATA_FLOAT, n, co, oh, ow));
  CUDNN_CHECK(cudnnSetFilter4dDescriptor(w, CUDNN_DATA_FLOAT, format, co, ci, k, k));
}

// The first algorithm in cuDNN's ranking (best first) that succeeded, uses an allowed math type,
// has a workspace size cuDNN confirms for this descriptor set under that math type (cuDNN answers
// NOT_SUPPORTED for layouts an algorithm lacks) within kMaxConvWorkspace, and is deterministic
// (any, with --cudnn-nondeterministic: `nondeterministic`); only if none is, the first
// non-deterministic one (with a warning). Returns false when nothing qualifies.
template <class Perf, class Algo, class WorkspaceOf>
bool pick(const std::vector<Perf>& perf, int count, bool tensor_ops, bool nondeterministic,
          WorkspaceOf workspace_of, const char* what, const ConvGeom& g, Algo* algo,
          cudnnMathType_t* math, size_t* ws) {
  for (int pass = nondeterministic ? 1 : 0; pass < 2; ++pass)
    for (int i = 0; i < count; ++i) {
      const Perf& p = perf[static_cast<size_t>(i)];
      if (p.status != CUDNN_STATUS_SUCCESS || !math_allowed(p.mathType, tensor_ops)) continue;
      if (pass == 0 && p.determinism != CUDNN_DETERMINISTIC) continue;
      size_t bytes = 0;
      const cudnnMathType_t m = run_math(p.mathType, tensor_ops);
      if (workspace_of(p.algo, m, &bytes) != CUDNN_STATUS_SUCCESS || bytes > kMaxConvWorkspace)
        continue;
      if (pass == 1 && !nondeterministic && p.determinism != CUDNN_DETERMINISTIC)
        log_warn(DPT_MSG("cuDNN has no deterministic "
                         << what << " algorithm for convolution " << geom_str(g)
                         << "; results will not be bit-reproducible"));
      log_debug(DPT_MSG("cuDNN " << what << " for convolution " << geom_str(g) << ": algorithm "
                                 << p.algo << " (rank " << i + 1 << " of " << count
                                 << "), math type " << m << ", workspace " << bytes << " bytes"));
      *algo = p.algo;
      *math = m;
      *ws = bytes;
      return true;
    }
  return false;
}

// The descriptors every direction's cuDNN calls take, in their own orders.
struct Descs {
  cudnnHandle_t h;
  cudnnTensorDescriptor_t x, y;
  cudnnFilterDescriptor_t w;
  cudnnConvolutionDescriptor_t conv;
};
// Device buffers for a timed search (survey): y doubles as dy.
struct Bufs {
  void *x, *w, *y, *dx, *dw;
};

// cuDNN's calls and types for each direction, so that one search serves all three.
struct FwdOps {
  using Algo = cudnnConvolutionFwdAlgo_t;
  using Perf = cudnnConvolutionFwdAlgoPerf_t;
  static constexpr const char* kName = "forward";
  static cudnnStatus_t max_count(cudnnHandle_t h, int* n) {
    return cudnnGetConvolutionForwardAlgorithmMaxCount(h, n);
  }
  static cudnnStatus_t rank(const Descs& d, int max, int* got, Perf* p) {
    return cudnnGetConvolutionForwardAlgorithm_v7(d.h, d.x, d.w, d.conv, d.y, max, got, p);
  }
  static cudnnStatus_t workspace(const Descs& d, Algo a, size_t* bytes) {
    return cudnnGetConvolutionForwardWorkspaceSize(d.h, d.x, d.w, d.conv, d.y, a, bytes);
  }
  static cudnnStatus_t find(const Descs& d, const Bufs& b, int max, int* got, Perf* p, void* ws,
                            size_t wsb) {
    return cudnnFindConvolutionForwardAlgorithmEx(d.h, d.x, b.x, d.w, b.w, d.conv, d.y, b.y, max,
                                                  got, p, ws, wsb);
  }
};
struct BwdDataOps {
  using Algo = cudnnConvolutionBwdDataAlgo_t;
  using Perf = cudnnConvolutionBwdDataAlgoPerf_t;
  static constexpr const char* kName = "backward-data";
  static cudnnStatus_t max_count(cudnnHandle_t h, int* n) {
    return cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, n);
  }
  static cudnnStatus_t rank(const Descs& d, int max, int* got, Perf* p) {
    return cudnnGetConvolutionBackwardDataAlgorithm_v7(d.h, d.w, d.y, d.conv, d.x, max, got, p);
  }
  static cudnnStatus_t workspace(const Descs& d, Algo a, size_t* bytes) {
    return cudnnGetConvolutionBackwardDataWorkspaceSize(d.h, d.w, d.y, d.conv, d.x, a, bytes);
  }
  static cudnnStatus_t find(const Descs& d, const Bufs& b, int max, int* got, Perf* p, void* ws,
                            size_t wsb) {
    return cudnnFindConvolutionBackwardDataAlgorithmEx(d.h, d.w, b.w, d.y, b.y, d.conv, d.x, b.dx,
                                                       max, got, p, ws, wsb);
  }
};
struct BwdFilterOps {
  using Algo = cudnnConvolutionBwdFilterAlgo_t;
  using Perf = cudnnConvolutionBwdFilterAlgoPerf_t;
  static constexpr const char* kName = "backward-filter";
  static cudnnStatus_t max_count(cudnnHandle_t h, int* n) {
    return cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, n);
  }
  static cudnnStatus_t rank(const Descs& d, int max, int* got, Perf* p) {
    return cudnnGetConvolutionBackwardFilterAlgorithm_v7(d.h, d.x, d.y, d.conv, d.w, max, got, p);
  }
  static cudnnStatus_t workspace(const Descs& d, Algo a, size_t* bytes) {
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(d.h, d.x, d.y, d.conv, d.w, a, bytes);
  }
  static cudnnStatus_t find(const Descs& d, const Bufs& b, int max, int* got, Perf* p, void* ws,
                            size_t wsb) {
    return cudnnFindConvolutionBackwardFilterAlgorithmEx(d.h, d.x, b.x, d.y, b.y, d.conv, d.w, b.dw,
                                                         max, got, p, ws, wsb);
  }
};

}  // namespace

// One direction's algorithm and how to run it.
template <class Algo>
struct ConvChoice {
  bool have = false;
  Algo algo{};
  size_t ws = 0;
  cudnnMathType_t math = CUDNN_FMA_MATH;
};

namespace {

// cuDNN's ranking for one direction, then pick(). False when nothing qualifies (or cuDNN cannot
// rank this descriptor set at all, as for a data type no engine supports).
// Room for every algorithm of a direction (their count in *max), with the descriptor's math type
// set for ranking: where the heuristic ranking (search) and the timed one (timed) both start.
template <class Ops>
std::vector<typename Ops::Perf> perf_slots(const Descs& d, bool tensor_ops, int* max) {
  CUDNN_CHECK(Ops::max_count(d.h, max));
  CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, base_math(tensor_ops)));
  return std::vector<typename Ops::Perf>(static_cast<size_t>(std::max(*max, 1)));
}

template <class Ops>
bool search(const Descs& d, bool tensor_ops, bool nondeterministic, const ConvGeom& g,
            ConvChoice<typename Ops::Algo>* c) {
  int max = 0, got = 0;
  std::vector<typename Ops::Perf> perf = perf_slots<Ops>(d, tensor_ops, &max);
  if (Ops::rank(d, max, &got, perf.data()) != CUDNN_STATUS_SUCCESS) return false;
  auto ws_of = [&](typename Ops::Algo a, cudnnMathType_t m, size_t* bytes) {
    const cudnnStatus_t st = cudnnSetConvolutionMathType(d.conv, m);
    return st != CUDNN_STATUS_SUCCESS ? st : Ops::workspace(d, a, bytes);
  };
  return pick(perf, got, tensor_ops, nondeterministic, ws_of, Ops::kName, g, &c->algo, &c->math,
              &c->ws);
}

// cuDNN's timed search for one direction, appended to `out` with the chosen algorithm marked.
template <class Ops>
void timed(const Descs& d, const Bufs& b, bool tensor_ops,
           const ConvChoice<typename Ops::Algo>& chosen, void* ws, size_t wsb,
           std::vector<CudnnConv::AlgoTime>* out) {
  int max = 0, got = 0;
  std::vector<typename Ops::Perf> perf = perf_slots<Ops>(d, tensor_ops, &max);
  CUDNN_CHECK(Ops::find(d, b, max, &got, perf.data(), ws, wsb));
  for (int i = 0; i < got; ++i) {
    const auto& p = perf[static_cast<size_t>(i)];
    if (p.status != CUDNN_STATUS_SUCCESS || !math_allowed(p.mathType, tensor_ops)) continue;
    out->push_back({Ops::kName, static_cast<int>(p.algo), p.mathType,
                    p.determinism == CUDNN_DETERMINISTIC, p.memory, p.time,
                    chosen.have && p.algo == chosen.algo && p.mathType == chosen.math});
  }
}

}  // namespace

struct CudnnConv::Entry {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnTensorDescriptor_t w_oihw = nullptr,
                          w_ohwi = nullptr;  // the weights as plain tensors, for transforms
  cudnnFilterDescriptor_t w = nullptr;       // the filter as cuDNN convolves it (NHWC)
  cudnnConvolutionDescriptor_t conv = nullptr;
  bool same_layout = false;  // Cin == 1 or K == 1: OIHW and OHWI are the same bytes
  size_t weight_bytes = 0;   // fp32
  int64_t x_elems = 0, y_elems = 0, w_elems = 0;
  int64_t rows = 0;  // N*OH*OW: the output as a row-major [rows, Cout] matrix
  ConvChoice<cudnnConvolutionFwdAlgo_t> fwd;
  ConvChoice<cudnnConvolutionBwdDataAlgo_t> bwd_data;
  ConvChoice<cudnnConvolutionBwdFilterAlgo_t> bwd_filter;

  Entry() = default;
  Entry(const Entry&) = delete;
  Entry& operator=(const Entry&) = delete;
  ~Entry() {
    if (x) cudnnDestroyTensorDescriptor(x);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (w_oihw) cudnnDestroyTensorDescriptor(w_oihw);
    if (w_ohwi) cudnnDestroyTensorDescriptor(w_ohwi);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
  }
};

CudnnConv::CudnnConv(GpuContext& ctx) : ctx_(ctx) {}
CudnnConv::~CudnnConv() = default;

CudnnConv::Entry& CudnnConv::entry(const ConvGeom& g) {
  const Key key{g.n, g.h, g.w, g.c_in, g.c_out, g.k, g.stride, g.pad};
  auto it = cache_.find(key);
  if (it != cache_.end()) return *it->second;

  check_geometry(g);
  const int n = as_int(g.n, g), ci = as_int(g.c_in, g), co = as_int(g.c_out, g), k = as_int(g.k, g),
            s = as_int(g.stride, g), oh = as_int(g.oh(), g), ow = as_int(g.ow(), g);
  const int p = static_cast<int>(g.pad);
  auto e = std::make_unique<Entry>();  // owns each descriptor as soon as it exists
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&e->x));
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&e->y));
  CUDNN_CHECK(cudnnCreateFilterDescriptor(&e->w));
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&e->w_oihw));
  CUDNN_CHECK(
      cudnnSetTensor4dDescriptor(e->w_oihw, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, co, ci, k, k));
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&e->w_ohwi));
  CUDNN_CHECK(
      cudnnSetTensor4dDescriptor(e->w_ohwi, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, co, ci, k, k));
  CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&e->conv));
  // PyTorch's Conv2d is a cross-correlation (no kernel flip). Compute in fp32 for both precisions.
  CUDNN_CHECK(cudnnSetConvolution2dDescriptor(e->conv, p, p, s, s, 1, 1, CUDNN_CROSS_CORRELATION,
                                              CUDNN_DATA_FLOAT));
  describe(*e, g);
  int dn = 0, dc = 0, dh = 0, dw = 0;
  CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(e->conv, e->x, e->w, &dn, &dc, &dh, &dw));
  DPT_CHECK(dn == n && dc == co && dh == oh && dw == ow,
            "cuDNN's output shape " << dn << "x" << dc << "x" << dh << "x" << dw
                                    << " for convolution " << geom_str(g)
                                    << " differs from ConvGeom's");
  e->same_layout = g.c_in == 1 || g.k == 1;
  e->w_elems = g.c_out * g.c_in * g.k * g.k;
  e->weight_bytes = static_cast<size_t>(e->w_elems) * sizeof(float);
  e->rows = g.n * g.oh() * g.ow();
  e->x_elems = g.n * g.h * g.w * g.c_in;
  e->y_elems = e->rows * g.c_out;
  return *cache_.emplace(key, std::move(e)).first->second;
}

void CudnnConv::describe(Entry& e, const ConvGeom& g) {
  set_descriptors(e.x, e.y, e.w, CUDNN_TENSOR_NHWC, g);
  CUDNN_CHECK(cudnnSetConvolutionMathType(e.conv, base_math(ctx_.tensor_ops())));
}

void CudnnConv::choose(Entry& e, const ConvGeom& g, bool bwd_data, bool bwd_filter) {
  const Descs d{ctx_.cudnn(), e.x, e.y, e.w, e.conv};
  const bool tc = ctx_.tensor_ops(), nd = ctx_.nondeterministic();
  if (!e.fwd.have)
    DPT_CHECK(e.fwd.have = search<FwdOps>(d, tc, nd, g, &e.fwd), no_algorithm(FwdOps::kName, g));
  if (bwd_data && !e.bwd_data.have)
    DPT_CHECK(e.bwd_data.have = search<BwdDataOps>(d, tc, nd, g, &e.bwd_data),
              no_algorithm(BwdDataOps::kName, g));
  if (bwd_filter && !e.bwd_filter.have)
    DPT_CHECK(e.bwd_filter.have = search<BwdFilterOps>(d, tc, nd, g, &e.bwd_filter),
              no_algorithm(BwdFilterOps::kName, g));
}

void CudnnConv::forward(const ConvGeom& g, const float* x, const float* w, const float* b,
                        float* y) {
  Entry& e = entry(g);
  cudnnHandle_t h = ctx_.cudnn();
  choose(e, g, false, false);
  WorkspaceLayout layout;
  const bool transform = !e.same_layout || !aligned(w);
  const size_t at_w = transform ? layout.add(e.weight_bytes) : 0;
  const size_t at_algo = layout.add(e.fwd.ws);
  char* ws = static_cast<char*>(ctx_.workspace(layout.total()));
  const float one = 1.f, zero = 0.f;
  const float* wk = w;
  if (transform) {
    float* wt = reinterpret_cast<float*>(ws + at_w);
    CUDNN_CHECK(cudnnTransformTensor(h, &one, e.w_oihw, w, &zero, e.w_ohwi, wt));
    wk = wt;
  }
  // One descriptor serves three directions whose algorithms may differ in math type.
  CUDNN_CHECK(cudnnSetConvolutionMathType(e.conv, e.fwd.math));
  CUDNN_CHECK(cudnnConvolutionForward(h, &one, e.x, x, e.w, wk, e.conv, e.fwd.algo, ws + at_algo,
                                      e.fwd.ws, &zero, e.y, y));
  if (b) add_row_bias(ctx_, y, b, e.rows, g.c_out);
}

void CudnnConv::backward(const ConvGeom& g, const float* x, const float* w, const float* dy,
                         float* dx, float* dw, float* db, bool accumulate) {
  Entry& e = entry(g);
  cudnnHandle_t h = ctx_.cudnn();
  choose(e, g, dx != nullptr, dw != nullptr);
  // Workspace: [OHWI weights (for dx)] [OHWI dW] [algorithm scratch, shared by the two calls].
  WorkspaceLayout layout;
  const bool transform_w = dx && (!e.same_layout || !aligned(w));
  const bool transform_dw = dw && (!e.same_layout || !aligned(dw));
  const size_t at_w = transform_w ? layout.add(e.weight_bytes) : 0;
  const size_t at_dw = transform_dw ? layout.add(e.weight_bytes) : 0;
  const size_t algo_ws = std::max(dx ? e.bwd_data.ws : 0, dw ? e.bwd_filter.ws : 0);
  const size_t at_algo = layout.add(algo_ws);
  char* ws = static_cast<char*>(ctx_.workspace(layout.total()));
  const float one = 1.f, zero = 0.f, beta = accumulate ? 1.f : 0.f;
  if (dx) {
    const float* wk = w;
    if (transform_w) {
      float* wt = reinterpret_cast<float*>(ws + at_w);
      CUDNN_CHECK(cudnnTransformTensor(h, &one, e.w_oihw, w, &zero, e.w_ohwi, wt));
      wk = wt;
    }
    CUDNN_CHECK(cudnnSetConvolutionMathType(e.conv, e.bwd_data.math));
    CUDNN_CHECK(cudnnConvolutionBackwardData(h, &one, e.w, wk, e.y, dy, e.conv, e.bwd_data.algo,
                                             ws + at_algo, e.bwd_data.ws, &zero, e.x, dx));
  }
  if (dw) {
    CUDNN_CHECK(cudnnSetConvolutionMathType(e.conv, e.bwd_filter.math));
    // cuDNN writes dW (OHWI) to the workspace, to transform back to OIHW (adding into dw when
    // accumulating), or straight into dw.
    float* dwt = transform_dw ? reinterpret_cast<float*>(ws + at_dw) : dw;
    CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, &one, e.x, x, e.y, dy, e.conv, e.bwd_filter.algo,
                                               ws + at_algo, e.bwd_filter.ws,
                                               transform_dw ? &zero : &beta, e.w, dwt));
    if (transform_dw)
      CUDNN_CHECK(cudnnTransformTensor(h, &one, e.w_ohwi, dwt, &beta, e.w_oihw, dw));
  }
  // Bias gradient: dy is a row-major [N*OH*OW, Cout] matrix; its column sums, in double like the
  // CPU.
  if (db) column_sums(ctx_, dy, e.rows, g.c_out, db, accumulate);
}

// Staging slot 0 holds the widened input (x, or dy in backward), slot 1 the fp32 output, then in
// backward the widened x for dW (the fp32 dx is rounded out before, in stream order).
float* CudnnConv::staged(int slot, int64_t elems) {
  return static_cast<float*>(ctx_.staging(slot, static_cast<size_t>(elems) * sizeof(float)));
}

void CudnnConv::forward(const ConvGeom& g, const BFloat16* x, const float* w, const float* b,
                        BFloat16* y) {
  const Entry& e = entry(g);
  cudaStream_t s = ctx_.stream();
  float* x32 = staged(0, e.x_elems);
  float* y32 = staged(1, e.y_elems);
  CUDA_CHECK(cuda::launch_from_bf16(bits(x), x32, e.x_elems, false, s));
  forward(g, x32, w, b, y32);
  CUDA_CHECK(cuda::launch_to_bf16(y32, bits(y), e.y_elems, s));
}

void CudnnConv::backward(const ConvGeom& g, const BFloat16* x, const float* w, const BFloat16* dy,
                         BFloat16* dx, float* dw, float* db, bool accumulate) {
  const Entry& e = entry(g);
  cudaStream_t s = ctx_.stream();
  float* dy32 = staged(0, e.y_elems);
  CUDA_CHECK(cuda::launch_from_bf16(bits(dy), dy32, e.y_elems, false, s));
  // Two fp32 calls, so that dx and the widened x can share slot 1 (one activation's fp32 copy
  // less).
  if (dx) {
    float* dx32 = staged(1, e.x_elems);
    backward(g, nullptr, w, dy32, dx32, nullptr, nullptr, false);
    CUDA_CHECK(cuda::launch_to_bf16(dx32, bits(dx), e.x_elems, s));
  }
  if (!dw && !db) return;
  float* x32 = nullptr;
  if (dw) {
    x32 = staged(1, e.x_elems);
    CUDA_CHECK(cuda::launch_from_bf16(bits(x), x32, e.x_elems, false, s));
  }
  backward(g, x32, w, dy32, nullptr, dw, db, accumulate);
}

std::vector<CudnnConv::AlgoTime> CudnnConv::survey(const ConvGeom& g, bool nchw) {
  Entry& e = entry(g);
  choose(e, g, true, true);
  const size_t elem = sizeof(float);  // zeros: timing only
  DeviceBuffer x(e.x_elems * elem), w(e.w_elems * elem), y(e.y_elems * elem), dx(e.x_elems * elem),
      dw(e.w_elems * elem), ws(kMaxConvWorkspace);
  for (DeviceBuffer* b : {&x, &w, &y, &dx, &dw})
    CUDA_CHECK(cudaMemset(b->as<void>(), 0, b->bytes()));
  ctx_.synchronize();
  Descs d{ctx_.cudnn(), e.x, e.y, e.w, e.conv};
  // nchw: the same convolution described channels-first (what PyTorch's default layout gets), to
  // see what that layout's engines would give; none of them is dptrain's pick.
  struct Nchw {
    cudnnTensorDescriptor_t x = nullptr, y = nullptr;
    cudnnFilterDescriptor_t w = nullptr;
    ~Nchw() {
      if (x) cudnnDestroyTensorDescriptor(x);
      if (y) cudnnDestroyTensorDescriptor(y);
      if (w) cudnnDestroyFilterDescriptor(w);
    }
  } alt;
  ConvChoice<cudnnConvolutionFwdAlgo_t> fwd = e.fwd;
  ConvChoice<cudnnConvolutionBwdDataAlgo_t> bwd_data = e.bwd_data;
  ConvChoice<cudnnConvolutionBwdFilterAlgo_t> bwd_filter = e.bwd_filter;
  if (nchw) {
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&alt.x));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&alt.y));
    CUDNN_CHECK(cudnnCreateFilterDescriptor(&alt.w));
    set_descriptors(alt.x, alt.y, alt.w, CUDNN_TENSOR_NCHW, g);
    d = {ctx_.cudnn(), alt.x, alt.y, alt.w, e.conv};
    fwd.have = bwd_data.have = bwd_filter.have = false;
  }
  const Bufs b{x.as<void>(), w.as<void>(), y.as<void>(), dx.as<void>(), dw.as<void>()};
  std::vector<AlgoTime> out;
  const bool tc = ctx_.tensor_ops();
  timed<FwdOps>(d, b, tc, fwd, ws.as<void>(), ws.bytes(), &out);
  timed<BwdDataOps>(d, b, tc, bwd_data, ws.as<void>(), ws.bytes(), &out);
  timed<BwdFilterOps>(d, b, tc, bwd_filter, ws.as<void>(), ws.bytes(), &out);
  CUDNN_CHECK(cudnnSetConvolutionMathType(e.conv, base_math(tc)));
  return out;
}

}  // namespace dpt::gpu
