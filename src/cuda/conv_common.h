// What the cuDNN convolution ops share: CudnnConv (cudnn_conv.cc, legacy API), CudnnGraphConv
// (cudnn_graph_conv.cc, graph API) and FusedConvGenstats: the geometry as text for messages,
// cuDNN's int limit, the alignment test for weight pointers, the cap on per-call scratch and the
// record of a key's chosen plan.
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dpt/backend.h"
#include "dpt/error.h"

namespace dpt::gpu {

// Algorithms or plans needing more scratch than this are passed over (cuDNN ranks by speed, not
// by memory, and the workspace is shared by every op of the context).
constexpr size_t kMaxConvWorkspace = size_t{256} << 20;

// One key's chosen plan, for bench/gpu_conv_bench and the tests (the graph-API ops' choices()).
struct PlanChoice {
  std::string key, plan;
  float ms = 0;           // its time per call when timed (0 when seeded)
  int candidates = 0;     // plans timed for it (0 when seeded)
  int64_t workspace = 0;  // its cuDNN workspace, bytes
};

// The choices of a map from key to plan (fields name, ms, candidates, workspace).
template <class Plans>
std::vector<PlanChoice> choices_of(const Plans& plans) {
  std::vector<PlanChoice> out;
  for (const auto& [key, p] : plans) out.push_back({key, p.name, p.ms, p.candidates, p.workspace});
  return out;
}

inline std::string geom_str(const ConvGeom& g) {
  return DPT_MSG("N=" << g.n << " H=" << g.h << " W=" << g.w << " Cin=" << g.c_in << " Cout="
                      << g.c_out << " K=" << g.k << " stride=" << g.stride << " pad=" << g.pad);
}

inline int as_int(int64_t v, const ConvGeom& g) {
  DPT_CHECK(v > 0 && v <= INT_MAX,
            "convolution " << geom_str(g) << ": a dimension does not fit cuDNN's int");
  return static_cast<int>(v);
}

// Refuses what no convolution can run: a non-positive stride, negative padding, an empty output.
inline void check_geometry(const ConvGeom& g) {
  DPT_CHECK(g.stride > 0 && g.pad >= 0 && g.oh() > 0 && g.ow() > 0,
            "convolution " << geom_str(g) << " is empty");
}

// Whether a device pointer has cudaMalloc's alignment. A weight or gradient pointer into the flat
// parameter buffers may sit at any 4-byte offset, and cuDNN's kernels were 10-20x slower on such
// pointers (1x1 stride-2 backward: 3 ms against 0.2 ms), so both ops copy those through the
// aligned workspace.
inline bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 256 == 0; }

// Thrown by the graph-API convolution where cuDNN offers no plan that builds and runs for a key
// (bf16 channel counts that are not multiples of 8, say: LeNet's 1->20 and 20->50, ResNet-18's
// 1->64 on Fashion-MNIST). The CUDA backend then runs that layer's direction on the legacy API
// (cuda_backend.cc), so such a layer trains instead of stopping the run.
class NoGraphPlan : public Error {
 public:
  explicit NoGraphPlan(const std::string& what) : Error(ErrorKind::kInternal, what) {}
};

}  // namespace dpt::gpu
