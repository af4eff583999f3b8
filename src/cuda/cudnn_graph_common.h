// What the graph-API ops (cudnn_graph_conv.cc, cudnn_fused_conv.cc) share: cudnn-frontend's
// include, finishing a graph under the project's numerical rules, building its plans, timing them.
// Include only from those .cc files: it pulls in cudnn_frontend.h.
#pragma once

// Without the frontend's serialisation: nothing here serialises, and its bundled nlohmann/json
// (another version than the one the project links) then stays out of the build.
#define CUDNN_FRONTEND_SKIP_JSON_LIB 1
#include <cudnn_frontend.h>

// The frontend's experimental open-source engines compile kernels with NVRTC; they are only
// registered for HeurMode_t::OPENSOURCE, which nothing here asks for. Weak references (in every
// file that includes the frontend) keep NVRTC from becoming a link and load-time dependency of
// every binary for code that never runs.
#pragma weak nvrtcVersion
#pragma weak nvrtcCreateProgram
#pragma weak nvrtcDestroyProgram
#pragma weak nvrtcCompileProgram
#pragma weak nvrtcGetProgramLogSize
#pragma weak nvrtcGetProgramLog
#pragma weak nvrtcGetCUBINSize
#pragma weak nvrtcGetCUBIN
#pragma weak nvrtcGetPTXSize
#pragma weak nvrtcGetPTX
#pragma weak nvrtcGetErrorString

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "conv_filter.cuh"
#include "cuda/conv_common.h"
#include "cuda/cuda_check.h"
#include "cuda/gpu_context.h"
#include "dpt/error.h"
#include "dpt/log.h"
#include "dpt/text.h"

namespace dpt::gpu::graph_api {

namespace fe = cudnn_frontend;

// A key's array type and the math its plans may use: fp32 strict, fp32 with TF32 tensor cores
// allowed, bf16 arrays (tensor cores, fp32 accumulation).
enum class Io { kFp32, kTf32, kBf16 };
inline const char* io_name(Io io) {
  switch (io) {
    case Io::kFp32:
      return "fp32";
    case Io::kTf32:
      return "tf32";
    case Io::kBf16:
      return "bf16";
  }
  return "?";
}
inline size_t elem_bytes(Io io) { return io == Io::kBf16 ? 2 : 4; }
inline fe::DataType_t data_type(Io io) {
  return io == Io::kBf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::FLOAT;
}

// Cin == 1 or K == 1: OIHW and OHWI are the same bytes.
inline bool same_layout(const ConvGeom& g) { return g.c_in == 1 || g.k == 1; }
inline int64_t filter_elems(const ConvGeom& g) { return g.c_out * g.c_in * g.k * g.k; }
// The filter's strides as a graph describes it: as stored (OIHW) or OHWI (KRSC), the layout
// cuDNN's channels-last engines are built for.
inline std::vector<int64_t> filter_stride(const ConvGeom& g, bool ohwi) {
  const int64_t ci = g.c_in, k = g.k;
  return ohwi ? std::vector<int64_t>{k * k * ci, 1, k * ci, ci}
              : std::vector<int64_t>{ci * k * k, k * k, k, 1};
}

// Whether a plan reading the filter as OHWI (`ohwi`) or OIHW needs w moved into the workspace:
// to OHWI where the layouts differ, or to an aligned copy (conv_common.h).
inline bool moves_filter(const ConvGeom& g, bool ohwi, const void* w) {
  return (ohwi && !same_layout(g)) || !aligned(w);
}
// The filter w (OIHW, io's type) as such a plan reads it: w itself when `to` is null (moves_filter
// false), else moved to `to` in the workspace.
inline const void* place_filter(GpuContext& ctx, const ConvGeom& g, Io io, bool ohwi, const void* w,
                                char* to) {
  if (!to) return w;
  const auto move = ohwi && !same_layout(g) ? cuda::FilterMove::kToOhwi : cuda::FilterMove::kCopy;
  const int64_t kk = g.k * g.k;
  if (io == Io::kBf16)
    CUDA_CHECK(cuda::launch_filter_move_bf16(static_cast<const uint16_t*>(w),
                                             reinterpret_cast<uint16_t*>(to), g.c_out, g.c_in, kk,
                                             move, ctx.stream()));
  else
    CUDA_CHECK(cuda::launch_filter_move(static_cast<const float*>(w), reinterpret_cast<float*>(to),
                                        g.c_out, g.c_in, kk, move, false, ctx.stream()));
  return to;
}

// Per candidate: runs before timing (the first loads its kernels), then timed runs, the fastest
// kept.
constexpr int kWarmupRuns = 1, kTimedRuns = 3;

inline bool fe_failed(const fe::error_t& e) { return e.is_bad(); }
inline std::string fe_message(fe::error_t e) { return e.get_message(); }

struct Event {
  cudaEvent_t e = nullptr;
  Event() { CUDA_CHECK(cudaEventCreate(&e)); }
  ~Event() {
    if (e) cudaEventDestroy(e);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};

// cuDNN's tensors are described with its default 16-byte alignment.
inline void check_activation(const void* p, const char* what, const ConvGeom& g) {
  DPT_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0,
            "convolution " << geom_str(g) << ": " << what
                           << " is not 16-byte aligned, as cuDNN's graph needs");
}

// Building times plans, which synchronises the stream: refused inside a CUDA-graph capture (see
// cudnn_graph_conv.cc), naming what would have been built.
inline void check_not_capturing(const GpuContext& ctx, const std::string& what) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(ctx.stream(), &capture));
  DPT_CHECK(capture == cudaStreamCaptureStatusNone,
            what << " would happen inside a CUDA-graph capture; every shape's first step must run "
                    "eagerly");
}

// A positive integer from environment variable `name`, or `fallback` where it is unset or empty;
// anything else is refused naming the variable.
inline int env_count(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  const std::optional<int> n = read_number<int>(v);  // decimal only, as every number typed
  DPT_INPUT_CHECK(n && *n > 0 && *n <= 1000, name << "=" << v << " is not a count from 1 to 1000");
  return *n;
}

// How many candidate plans a key times at most (DPT_CUDNN_MAX_PLANS, default 8): the heuristics'
// first ones, taken in turn from each variant. Timing every configuration cuDNN lists took up to
// seconds per key; the heuristics' top few hold the winner in practice, as PyTorch's
// cudnn.benchmark "limited" mode assumes.
inline int max_timed_plans() { return env_count("DPT_CUDNN_MAX_PLANS", 8); }

// Whether engines that compile their kernels at run time (NVRTC; cuDNN's behaviour note
// RUNTIME_COMPILATION) may compete for a plain convolution: only with DPT_CUDNN_RUNTIME_COMPILE=1.
// Their first build costs seconds per key, and a machine without NVRTC declines them anyway. The
// fused convolution needs them (runtime fusion has no precompiled engine) and always allows them.
inline bool runtime_compilation_requested() {
  const char* v = std::getenv("DPT_CUDNN_RUNTIME_COMPILE");
  const std::string s = v ? v : "";
  DPT_INPUT_CHECK(s.empty() || s == "0" || s == "1",
                  "DPT_CUDNN_RUNTIME_COMPILE=" << s << " is not 0 or 1");
  return s == "1";
}

// Validates a described graph, builds its operation graph, queries heuristics modes A and
// FALLBACK and deselects what the project never runs: engines that down-convert inputs or reduce
// in reduced precision, tensor-core engines unless `tensor_cores` (fp32 arrays in strict fp32),
// non-deterministic ones unless `nondeterministic`, runtime-compiled ones unless
// `runtime_compiled`, and workspaces over kMaxConvWorkspace. False with *why where cuDNN cannot
// build or rank it.
inline bool finish_graph(fe::graph::Graph& graph, cudnnHandle_t handle, bool tensor_cores,
                         bool nondeterministic, bool runtime_compiled, std::string* why) {
  fe::error_t st = graph.validate();
  if (st.is_good()) st = graph.build_operation_graph(handle);
  if (st.is_good())
    st = graph.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
  if (st.is_bad()) {
    *why = st.get_message();
    return false;
  }
  std::vector<fe::NumericalNote_t> barred{fe::NumericalNote_t::DOWN_CONVERT_INPUTS,
                                          fe::NumericalNote_t::REDUCED_PRECISION_REDUCTION};
  if (!tensor_cores) barred.push_back(fe::NumericalNote_t::TENSOR_CORE);
  if (!nondeterministic) barred.push_back(fe::NumericalNote_t::NONDETERMINISTIC);
  graph.deselect_numeric_notes(barred).deselect_workspace_greater_than(
      static_cast<int64_t>(kMaxConvWorkspace));
  if (!runtime_compiled) graph.deselect_behavior_notes({fe::BehaviorNote_t::RUNTIME_COMPILATION});
  return true;
}

// One built plan of a graph: its engine configuration's index and cuDNN's tag for it.
struct BuiltPlan {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t index = -1;     // in the graph's engine configurations
  std::string tag;        // cuDNN's name of the engine configuration ("eng0_k2=1_k3=0")
  int64_t workspace = 0;  // bytes
};

// The plans of a finished graph that build, in the heuristics' order, each engine configuration
// once (modes A and FALLBACK may both list it), the first `limit` of them; with `only`, just that
// engine tag's.
inline std::vector<BuiltPlan> build_plans(const std::shared_ptr<fe::graph::Graph>& graph,
                                          const std::string* only,
                                          size_t limit = std::numeric_limits<size_t>::max()) {
  std::vector<BuiltPlan> out;
  if (graph->check_support().is_bad()) return out;  // no configuration passes
  std::set<std::string> seen;
  for (int64_t i = 0; i < graph->get_execution_plan_count() && out.size() < limit; ++i) {
    std::string tag;
    if (graph->get_plan_name_at_index(i, tag).is_bad() || !seen.insert(tag).second) continue;
    if (only && tag != *only) continue;
    int64_t ws = 0;
    if (graph->build_plan_at_index(i).is_bad() ||
        graph->get_workspace_size_plan_at_index(i, ws).is_bad())
      continue;
    out.push_back({graph, i, tag, ws});
  }
  return out;
}

// The plans of the first (determinism, tier) step that offers any: deterministic engines of
// each tier in turn, then (with a warning) non-deterministic ones of each tier; with
// `nondeterministic_allowed` (--cudnn-nondeterministic) both kinds from the start. `make(v,
// nondeterministic, &why)` describes and finishes variant v's graph, or returns null saying why;
// P is a BuiltPlan with the variant it came from and its name "<variant_name(v)>:<tag>". At most
// max_timed_plans(), taken in turn from each variant's list in the heuristics' order, so each
// layout's best-ranked engines compete. Throws NoGraphPlan, with every graph's reason, where no
// step offers a plan: `what` names the operation.
template <class P, class V, class Make, class Name>
std::vector<P> candidate_plans(const std::vector<std::vector<V>>& tiers, const Make& make,
                               const Name& variant_name, const std::string& what,
                               bool nondeterministic_allowed, uint64_t* graphs_built) {
  std::vector<P> candidates;
  std::vector<std::vector<P>> per_variant;
  const size_t cap = static_cast<size_t>(max_timed_plans());
  std::string why;
  for (bool nondeterministic : {false, true}) {
    if (nondeterministic_allowed && !nondeterministic) continue;
    for (const auto& tier : tiers) {
      for (const V& v : tier) {
        std::string failed;
        std::shared_ptr<fe::graph::Graph> graph = make(v, nondeterministic, &failed);
        if (!graph) {
          why += DPT_MSG("\n  " << variant_name(v) << ": " << failed);
          continue;
        }
        ++*graphs_built;
        // No more than the cap from one variant: the round robin below takes no more.
        std::vector<BuiltPlan> built = build_plans(graph, nullptr, cap);
        if (built.empty())
          why += DPT_MSG("\n  " << variant_name(v) << (nondeterministic ? "" : " (deterministic)")
                                << ": no engine configuration passes check_support and builds");
        std::vector<P> mine;
        for (BuiltPlan& b : built) {
          P p;
          static_cast<BuiltPlan&>(p) = std::move(b);
          p.variant = v;
          p.name = variant_name(v) + ":" + p.tag;
          mine.push_back(std::move(p));
        }
        per_variant.push_back(std::move(mine));
      }
      // Round robin over the variants, in each one's heuristic order, up to the cap.
      for (size_t rank = 0; candidates.size() < cap; ++rank) {
        bool any = false;
        for (auto& list : per_variant)
          if (rank < list.size() && candidates.size() < cap) {
            candidates.push_back(std::move(list[rank]));
            any = true;
          }
        if (!any) break;
      }
      per_variant.clear();
      if (!candidates.empty()) break;
    }
    if (!candidates.empty()) {
      if (nondeterministic && !nondeterministic_allowed)
        log_warn(DPT_MSG("cuDNN has no deterministic plan for "
                         << what << "; results will not be bit-reproducible"));
      return candidates;
    }
  }
  throw NoGraphPlan(DPT_MSG("cuDNN offers no plan for " << what << ":" << why));
}

// The fastest of `candidates` (each with fields name, workspace, ms, candidates), as PyTorch's
// cudnn.benchmark: `trial(c)` runs one on the call's own operands, kWarmupRuns times, then up to
// kTimedRuns times between events (fewer once it is twice as slow as the best so far); its fastest
// run counts. The context's workspace is grown first to the largest need plus `extra_workspace`, so
// no timed run synchronises. A candidate that throws dpt::Error is passed over; *timed counts those
// that ran. `what` names the operation in messages.
template <class P, class Trial>
P take_fastest(GpuContext& ctx, std::vector<P>& candidates, size_t extra_workspace,
               const std::string& what, const Trial& trial, uint64_t* timed) {
  int64_t most = 0;
  for (const P& c : candidates) most = std::max(most, c.workspace);
  ctx.workspace(static_cast<size_t>(most) + extra_workspace);
  Event start, stop;
  P* best = nullptr;
  int ran = 0;
  for (P& c : candidates) {
    try {
      for (int i = 0; i < kWarmupRuns; ++i) trial(c);
      c.ms = std::numeric_limits<float>::max();
      // A plan already twice as slow as the best so far cannot win: no more runs of it.
      for (int i = 0; i < kTimedRuns && !(best && c.ms > 2 * best->ms); ++i) {
        CUDA_CHECK(cudaEventRecord(start.e, ctx.stream()));
        trial(c);
        CUDA_CHECK(cudaEventRecord(stop.e, ctx.stream()));
        CUDA_CHECK(cudaEventSynchronize(stop.e));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, start.e, stop.e));
        c.ms = std::min(c.ms, ms);
      }
    } catch (const Error& e) {  // a plan that builds but will not run here is only passed over
      c.ms = std::numeric_limits<float>::max();  // not among the times listed below
      log_debug(DPT_MSG("cuDNN graph plan " << c.name << " for " << what
                                            << " did not run: " << e.what()));
      continue;
    }
    ++ran;
    ++*timed;
    if (!best || c.ms < best->ms) best = &c;
  }
  if (!best)
    throw NoGraphPlan(DPT_MSG("none of the " << candidates.size() << " cuDNN plans built for "
                                             << what << " ran"));
  // Every candidate's best time, in the order timed: which layouts and engines lost, and by how
  // much (the winner alone does not show why, e.g., an OIHW plan beat every OHWI one).
  std::ostringstream all;
  for (const P& c : candidates)
    if (c.ms != std::numeric_limits<float>::max()) all << " " << c.name << " " << c.ms;
  log_debug(DPT_MSG("cuDNN graph candidates for " << what << " (name, ms):" << all.str()));
  best->candidates = ran;
  return std::move(*best);
}

}  // namespace dpt::gpu::graph_api
