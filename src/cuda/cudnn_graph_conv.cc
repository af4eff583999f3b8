// CudnnGraphConv (see cudnn_graph_conv.h) on cuDNN's graph API through cudnn-frontend. Only
// compiled in GPU builds that found the frontend's headers (launch/cudnn_frontend.sh); the only
// file that includes them.
//
// Graphs: one per key (geometry, direction, data type and math), built on the first call that
// needs it. That call must be eager: building times plans, which synchronises the stream. The
// trainer's first step of every shape is eager (StreamGraph captures only warm work); a build
// during a capture anyway is refused with an error, after which StreamGraph drops the capture and
// runs the step eagerly, which builds. Once built, a call is a weight move at most, one
// execute_plan_at_index and the bias kernels: nothing allocates, so it can be captured.
//
// Layouts: activations NHWC (NCHW dims with channels-last strides). The filter is described
// either as stored (OIHW strides) or as OHWI (KRSC), the layout cuDNN's channels-last engines are
// built for. A model's layer (SharedGraphConv) keeps FilterCopies: its filter moved (and, for
// bf16 plans, rounded) once per WeightSpan, shared by forward and backward-data; the plain entry
// points move it through the workspace on each call (kernels/conv_filter.cuh). A weight gradient
// comes back the same way, per call. Both layouts' plans compete in the timing below, the
// per-call moves included where there are any. With Cin == 1 or K == 1 the two are the same
// bytes and only OHWI is described. Weights or dW at an unaligned address go through the aligned
// workspace or a copy too (conv_common.h). The graph API's convolutions have no beta, so an
// accumulated dW is computed into the workspace and added by the same move.
//
// Numerics: fp32 compute throughout. fp32 arrays without GpuContext::tensor_ops() deselect every
// engine with the TENSOR_CORE numerical note (TF32 on Ampere and newer: 10-bit mantissas); with
// --tf32 or --precision bf16 those engines compete too. Engines that down-convert inputs (fp32 to
// fp16) or reduce in reduced precision are never taken, nor non-deterministic ones unless a key
// has no other plan (then with a warning) or --cudnn-nondeterministic lets them compete: runs
// stay bit-reproducible for a given set of plans.
// bf16 arrays: BFLOAT16 tensors, FLOAT compute. Their weight gradient is asked for in fp32 first
// (dW is an fp32 buffer, and a bf16 dW is rounded before its accumulation); where no engine writes
// fp32 from bf16 inputs it is computed in bf16 into the workspace, then widened and added (the
// plan's name says "+bf16dw"). cuDNN 9.19's heuristics offer no fp32-dW engine for any shape of
// the two models (queried without a device for sm_90), so today bf16 dW is the rule. The bias goes
// through the kernels CudnnConv uses (on a bf16 output: an fp32 addition, rounded once more).
//
// Plan choice, as PyTorch's cudnn.benchmark: the engine configurations heuristics modes A and
// FALLBACK offer that pass the notes above, the workspace cap (conv_common.h) and check_support,
// up to DPT_CUDNN_MAX_PLANS of them in turn from each filter layout, are built and run on the
// call's own operands, once to warm up and then up to kTimedRuns times
// between cudaEvents on the context's stream (fewer once it is twice as slow as the best so far);
// its fastest run counts, the fastest plan is kept. The context's shared workspace is grown once,
// before the first timed run, to the largest need among the candidates, so no timed run
// synchronises. Trials of the forward and backward-data directions write the call's own output
// (the chosen plan overwrites it after); backward-filter trials write a temporary buffer, so
// accumulation sees only the real run. Timings are noisy: two runs, or two ranks, may choose
// different plans for one key, and their results may then differ in the last bits.
// plan_choices() and set_plan_choices() let a resumed run replay a run's choices.
#include "cuda/cudnn_graph_conv.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <sstream>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "conv_filter.cuh"
#include "cuda/bf16_ptr.h"
#include "cuda/conv_common.h"
#include "cuda/cublas_linear.h"
#include "cuda/cuda_check.h"
#include "cuda/cudnn_graph_common.h"
#include "dpt/log.h"
#include "precision.cuh"

namespace dpt::gpu {

namespace fe = cudnn_frontend;

namespace {

using graph_api::check_activation;
using graph_api::elem_bytes;
using graph_api::fe_failed;
using graph_api::fe_message;
using graph_api::filter_elems;
using graph_api::Io;
using graph_api::io_name;
using graph_api::same_layout;

enum class Dir { kForward, kBackwardData, kBackwardFilter };
const char* dir_name(Dir d) {
  switch (d) {
    case Dir::kForward:
      return "forward";
    case Dir::kBackwardData:
      return "backward-data";
    case Dir::kBackwardFilter:
      return "backward-filter";
  }
  return "?";
}

std::string key_of(const ConvGeom& g, Dir d, Io io) {
  return geom_str(g) + " " + dir_name(d) + " " + io_name(io);
}

// How a plan's graph lays the filter out (see the file comment), and for bf16 backward-filter
// whether dW comes out in bf16.
struct Variant {
  bool ohwi = false;
  bool dw_bf16 = false;
};
std::string variant_name(Variant v) {
  return std::string(v.ohwi ? "ohwi" : "oihw") + (v.dw_bf16 ? "+bf16dw" : "");
}

// The variants a key's plans may come from, in tiers: a later tier only where no earlier one
// offers a plan.
std::vector<std::vector<Variant>> variant_tiers(const ConvGeom& g, Dir d, Io io) {
  std::vector<Variant> first;
  if (!same_layout(g)) first.push_back({false, false});
  first.push_back({true, false});
  std::vector<std::vector<Variant>> tiers{first};
  if (d == Dir::kBackwardFilter && io == Io::kBf16) {
    for (Variant& v : first) v.dw_bf16 = true;
    tiers.push_back(first);
  }
  return tiers;
}

// Fixed uids, so every graph's variant pack is built the same way: in the backward directions
// "y" is dy, and x (backward-data) or w (backward-filter) is the output.
constexpr int64_t kUidX = 1, kUidW = 2, kUidY = 3;

// The plan name a key without a graph-API plan is recorded under (plan_choices()).
const std::string kLegacy = "legacy";

// The filter of one call: w in the call's element type, OIHW, as given (the entry points without a
// layer's copies: moved per call as a plan needs it); or, with `copies`, w is the fp32 master
// weights and the plan reads the layer's copy in its own type and layout (FilterCopies).
struct Filter {
  const void* w = nullptr;
  FilterCopies* copies = nullptr;
};

// One built plan of one variant's graph.
struct Plan : graph_api::BuiltPlan {
  Variant variant;
  std::string name;    // "<variant>:<engine tag>"
  float ms = 0;        // when timed
  int candidates = 0;  // plans timed against it (0: seeded)
};

// One variant's graph with its heuristics' engine configurations queried and filtered (see the
// file comment), or null with *why where cuDNN cannot build or rank it.
std::shared_ptr<fe::graph::Graph> make_graph(cudnnHandle_t handle, const ConvGeom& g, Dir d, Io io,
                                             Variant v, bool nondeterministic, std::string* why) {
  using fe::DataType_t;
  const DataType_t t = graph_api::data_type(io);
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(t)
      .set_intermediate_data_type(DataType_t::FLOAT)
      .set_compute_data_type(DataType_t::FLOAT);

  struct Operand {
    const char* name;
    int64_t uid;
    DataType_t type;
    std::vector<int64_t> dim, stride;
  };
  const int64_t ci = g.c_in, co = g.c_out, k = g.k, oh = g.oh(), ow = g.ow();
  const Operand x{"x", kUidX, t, {g.n, ci, g.h, g.w}, {g.h * g.w * ci, 1, g.w * ci, ci}};
  const Operand y{"y", kUidY, t, {g.n, co, oh, ow}, {oh * ow * co, 1, ow * co, co}};
  const DataType_t wt =
      d == Dir::kBackwardFilter && io == Io::kBf16 && !v.dw_bf16 ? DataType_t::FLOAT : t;
  const Operand w{"w", kUidW, wt, {co, ci, k, k}, graph_api::filter_stride(g, v.ohwi)};
  auto describe = [](fe::graph::Tensor_attributes& a, const Operand& o) {
    a.set_name(o.name).set_uid(o.uid).set_data_type(o.type).set_dim(o.dim).set_stride(o.stride);
  };
  auto input = [&](const Operand& o) {
    fe::graph::Tensor_attributes a;
    describe(a, o);
    return graph->tensor(a);
  };
  auto output = [&](const std::shared_ptr<fe::graph::Tensor_attributes>& a, const Operand& o) {
    describe(*a, o);
    a->set_output(true);
  };
  const std::vector<int64_t> pad{g.pad, g.pad}, stride{g.stride, g.stride}, dilation{1, 1};
  switch (d) {
    case Dir::kForward:
      output(
          graph->conv_fprop(
              input(x), input(w),
              fe::graph::Conv_fprop_attributes().set_padding(pad).set_stride(stride).set_dilation(
                  dilation)),
          y);
      break;
    case Dir::kBackwardData:
      output(
          graph->conv_dgrad(
              input(y), input(w),
              fe::graph::Conv_dgrad_attributes().set_padding(pad).set_stride(stride).set_dilation(
                  dilation)),
          x);
      break;
    case Dir::kBackwardFilter:
      output(
          graph->conv_wgrad(
              input(y), input(x),
              fe::graph::Conv_wgrad_attributes().set_padding(pad).set_stride(stride).set_dilation(
                  dilation)),
          w);
      break;
  }
  if (!graph_api::finish_graph(*graph, handle, io != Io::kFp32, nondeterministic,
                               graph_api::runtime_compilation_requested(), why))
    return nullptr;
  return graph;
}

// The plans of one variant's graph that build, in the heuristics' order, each engine
// configuration once (modes A and FALLBACK may both list it); with `only`, just that engine tag's.
std::vector<Plan> build_plans(const std::shared_ptr<fe::graph::Graph>& graph, Variant v,
                              const std::string* only) {
  std::vector<Plan> out;
  for (graph_api::BuiltPlan& b : graph_api::build_plans(graph, only)) {
    Plan p;
    static_cast<graph_api::BuiltPlan&>(p) = std::move(b);
    p.variant = v;
    p.name = variant_name(v) + ":" + p.tag;
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace

// Trials below: a callable running one candidate plan on the call's operands.
struct CudnnGraphConv::Impl {
  GpuContext& ctx;
  std::map<std::string, Plan> plans;         // by key
  std::map<std::string, std::string> seeds;  // key -> plan name, for keys not built yet
  // Keys cuDNN offers no plan for -> why: each refused again at once (NoGraphPlan), and recorded
  // as kLegacy in plan_choices() so that a resumed run takes the same path without searching.
  std::map<std::string, std::string> unplannable;
  uint64_t graphs_built = 0, plans_timed = 0;
  double total_seconds = 0;  // spent choosing plans

  explicit Impl(GpuContext& c) : ctx(c) {}

  template <class T>
  Io io_of() const {
    if constexpr (std::is_same_v<T, float>)
      return ctx.tensor_ops() ? Io::kTf32 : Io::kFp32;
    else
      return Io::kBf16;
  }

  // The key's plan, built (seeded or timed through `trial`, which runs a candidate on the call's
  // operands) on its first use.
  template <class Trial>
  const Plan& plan(const ConvGeom& g, Dir d, Io io, const Trial& trial) {
    const std::string key = key_of(g, d, io);
    if (auto it = plans.find(key); it != plans.end()) return it->second;
    if (auto it = unplannable.find(key); it != unplannable.end()) throw NoGraphPlan(it->second);
    const auto t0 = std::chrono::steady_clock::now();
    std::string recorded;
    if (auto seed = seeds.find(key); seed != seeds.end()) {
      recorded = seed->second;
      seeds.erase(seed);
    }
    if (recorded == kLegacy) {
      unplannable[key] = "convolution " + key + ": the legacy API, as recorded";
      throw NoGraphPlan(unplannable[key]);
    }
    graph_api::check_not_capturing(ctx, "building the cuDNN graph of convolution " + key);
    Plan chosen;
    bool refused = false;
    if (!recorded.empty() && !seeded(g, d, io, recorded, &chosen, &refused))
      log_warn(DPT_MSG("cuDNN plan '"
                       << recorded << "' recorded for convolution " << key
                       << (refused ? " is non-deterministic, which this run does not allow "
                                     "(--cudnn-nondeterministic)"
                                   : " is unknown or unsupported here")
                       << "; timing the candidates instead"));
    if (!chosen.graph) {
      try {
        chosen = timed(g, d, io, key, trial);
      } catch (const NoGraphPlan& e) {
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        log_info(DPT_MSG("cuDNN's graph API has no plan for convolution "
                         << key << " (" << s << " s searched); the legacy API runs it"));
        log_debug(e.what());
        unplannable[key] = e.what();
        throw;
      }
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    total_seconds += s;
    const std::string how = chosen.candidates > 0
                                ? DPT_MSG(chosen.ms << " ms, the fastest of " << chosen.candidates)
                                : std::string("as recorded");
    // Per key at debug level; at info level too when choosing took over a second: that time is part
    // of the first step's, and an operator seeing a slow first epoch should see where it went.
    (s > 1.0 ? log_info : log_debug)(
        DPT_MSG("cuDNN graph plan for convolution "
                << key << ": " << chosen.name << ", " << how << " (workspace " << chosen.workspace
                << " bytes; " << s << " s to choose, " << total_seconds << " s in all)"));
    return plans.emplace(key, std::move(chosen)).first->second;
  }

  // The recorded plan `name` ("<variant>:<engine tag>") built without timing; false where this
  // cuDNN does not offer it for the key, or (*refused) where it is non-deterministic and this run
  // does not allow those.
  bool seeded(const ConvGeom& g, Dir d, Io io, const std::string& name, Plan* out, bool* refused) {
    const size_t colon = name.find(':');
    if (colon == std::string::npos) return false;
    const std::string variant = name.substr(0, colon), tag = name.substr(colon + 1);
    for (const auto& tier : variant_tiers(g, d, io))
      for (Variant v : tier) {
        if (variant_name(v) != variant) continue;
        for (bool nondeterministic : {false, true}) {
          std::string why;
          auto graph = make_graph(ctx.cudnn(), g, d, io, v, nondeterministic, &why);
          if (!graph) return false;
          ++graphs_built;
          std::vector<Plan> built = build_plans(graph, v, &tag);
          if (!built.empty()) {
            // A recorded non-deterministic plan (a run with --cudnn-nondeterministic, or a key
            // that had no other) is replayed only where this run allows those; otherwise the
            // key is timed again, and candidate_plans warns if it still has no deterministic
            // plan.
            if (nondeterministic && !ctx.nondeterministic()) {
              *refused = true;
              return false;
            }
            *out = std::move(built.front());
            return true;
          }
        }
      }
    return false;
  }

  // The fastest plan of the first (determinism, tier) step that offers any (see the file comment).
  template <class Trial>
  Plan timed(const ConvGeom& g, Dir d, Io io, const std::string& key, const Trial& trial) {
    const auto make = [&](Variant v, bool nondeterministic, std::string* why) {
      return make_graph(ctx.cudnn(), g, d, io, v, nondeterministic, why);
    };
    std::vector<Plan> candidates = graph_api::candidate_plans<Plan>(
        variant_tiers(g, d, io), make, variant_name, "convolution " + key, ctx.nondeterministic(),
        &graphs_built);
    return fastest(candidates, g, key, trial);
  }

  template <class Trial>
  Plan fastest(std::vector<Plan>& candidates, const ConvGeom& g, const std::string& key,
               const Trial& trial) {
    // Every trial's layout fits: its plan's workspace and one fp32 filter, each rounded up.
    const size_t extra =
        static_cast<size_t>(filter_elems(g)) * sizeof(float) + 2 * WorkspaceLayout::kAlign;
    return graph_api::take_fastest(ctx, candidates, extra, "convolution " + key, trial,
                                   &plans_timed);
  }

  void execute(const Plan& p, const void* x, const void* w, const void* y, char* workspace) {
    std::unordered_map<int64_t, void*> pack{{kUidX, const_cast<void*>(x)},
                                            {kUidW, const_cast<void*>(w)},
                                            {kUidY, const_cast<void*>(y)}};
    DPT_LIB_CHECK("cuDNN graph",
                  p.graph->execute_plan_at_index(ctx.cudnn(), pack, workspace, p.index), fe_failed,
                  fe_message);
  }

  // The filter as plan p reads it: w itself, or moved to the workspace at `to` (OHWI, or an
  // aligned copy). `to` is null when moves_weights() is false.
  static bool moves_weights(const Plan& p, const ConvGeom& g, const void* w) {
    return graph_api::moves_filter(g, p.variant.ohwi, w);
  }
  const void* weights(const Plan& p, const ConvGeom& g, Io io, const void* w, char* to) {
    return graph_api::place_filter(ctx, g, io, p.variant.ohwi, w, to);
  }

  // One direction's work with plan p: forward reads x and w into y; backward-data reads y (dy)
  // and w into x (dx).
  void run_data(const Plan& p, const ConvGeom& g, Io io, const void* x, const Filter& f,
                const void* y) {
    if (f.copies) {  // made (or held from earlier in the span) before the workspace is taken
      const void* w =
          f.copies->get(ctx, g, io == Io::kBf16, p.variant.ohwi, static_cast<const float*>(f.w));
      execute(p, x, w, y, static_cast<char*>(ctx.workspace(static_cast<size_t>(p.workspace))));
      return;
    }
    WorkspaceLayout layout;
    const bool move = moves_weights(p, g, f.w);
    const size_t at_w =
        move ? layout.add(static_cast<size_t>(filter_elems(g)) * elem_bytes(io)) : 0;
    const size_t at_plan = layout.add(static_cast<size_t>(p.workspace));
    char* ws = static_cast<char*>(ctx.workspace(layout.total()));
    execute(p, x, weights(p, g, io, f.w, move ? ws + at_w : nullptr), y, ws + at_plan);
  }

  // Backward-filter with plan p: dw (fp32 OIHW) = or += the gradient of x and dy.
  void run_filter(const Plan& p, const ConvGeom& g, const void* x, const void* dy, float* dw,
                  bool accumulate) {
    const bool permute = p.variant.ohwi && !same_layout(g), bf16 = p.variant.dw_bf16;
    const bool direct = !accumulate && !permute && !bf16 && aligned(dw);
    WorkspaceLayout layout;
    const size_t at_dw =
        direct ? 0 : layout.add(static_cast<size_t>(filter_elems(g)) * (bf16 ? 2 : 4));
    const size_t at_plan = layout.add(static_cast<size_t>(p.workspace));
    char* ws = static_cast<char*>(ctx.workspace(layout.total()));
    void* out = direct ? static_cast<void*>(dw) : ws + at_dw;
    execute(p, x, out, dy, ws + at_plan);
    if (direct) return;
    const auto move = permute ? cuda::FilterMove::kToOihw : cuda::FilterMove::kCopy;
    const int64_t kk = g.k * g.k;
    if (bf16)
      CUDA_CHECK(cuda::launch_filter_move_from_bf16(static_cast<const uint16_t*>(out), dw, g.c_out,
                                                    g.c_in, kk, move, accumulate, ctx.stream()));
    else
      CUDA_CHECK(cuda::launch_filter_move(static_cast<const float*>(out), dw, g.c_out, g.c_in, kk,
                                          move, accumulate, ctx.stream()));
  }

  template <class T>
  void forward(const ConvGeom& g, const T* x, const Filter& w, const float* b, T* y) {
    check_geometry(g);
    check_activation(x, "x", g);
    check_activation(y, "y", g);
    const Io io = io_of<T>();
    const auto run = [&](const Plan& p) { run_data(p, g, io, x, w, y); };
    run(plan(g, Dir::kForward, io, run));
    if (b) add_row_bias(ctx, y, b, g.n * g.oh() * g.ow(), g.c_out);
  }

  template <class T>
  void backward(const ConvGeom& g, const T* x, const Filter& w, const T* dy, T* dx, float* dw,
                float* db, bool accumulate) {
    check_geometry(g);
    check_activation(dy, "dy", g);
    const Io io = io_of<T>();
    if (dx) {
      check_activation(dx, "dx", g);
      const auto run = [&](const Plan& p) { run_data(p, g, io, dx, w, dy); };
      run(plan(g, Dir::kBackwardData, io, run));
    }
    if (dw) {
      check_activation(x, "x", g);
      DeviceBuffer scratch;  // the trials' dW, so that only the chosen plan's run touches dw
      const auto trial = [&](const Plan& p) {
        if (scratch.bytes() == 0)
          scratch = DeviceBuffer(static_cast<size_t>(filter_elems(g)) * sizeof(float));
        run_filter(p, g, x, dy, scratch.as<float>(), false);
      };
      run_filter(plan(g, Dir::kBackwardFilter, io, trial), g, x, dy, dw, accumulate);
    }
    if (db) column_sums(ctx, dy, g.n * g.oh() * g.ow(), g.c_out, db, accumulate);
  }
};

CudnnGraphConv::CudnnGraphConv(GpuContext& ctx) : impl_(std::make_unique<Impl>(ctx)) {}
CudnnGraphConv::~CudnnGraphConv() = default;

void CudnnGraphConv::forward(const ConvGeom& g, const float* x, const float* w, const float* b,
                             float* y) {
  impl_->forward(g, x, Filter{w}, b, y);
}

void CudnnGraphConv::backward(const ConvGeom& g, const float* x, const float* w, const float* dy,
                              float* dx, float* dw, float* db, bool accumulate) {
  impl_->backward(g, x, Filter{w}, dy, dx, dw, db, accumulate);
}

void CudnnGraphConv::forward_bf16(const ConvGeom& g, const __nv_bfloat16* x, const __nv_bfloat16* w,
                                  const float* b, __nv_bfloat16* y) {
  impl_->forward(g, x, Filter{w}, b, y);
}

void CudnnGraphConv::backward_bf16(const ConvGeom& g, const __nv_bfloat16* x,
                                   const __nv_bfloat16* w, const __nv_bfloat16* dy,
                                   __nv_bfloat16* dx, float* dw, float* db, bool accumulate) {
  impl_->backward(g, x, Filter{w}, dy, dx, dw, db, accumulate);
}

const __nv_bfloat16* CudnnGraphConv::bf16_weights(const ConvGeom& g, const float* w) {
  const int64_t n = filter_elems(g);
  auto* w16 =
      static_cast<uint16_t*>(impl_->ctx.staging(0, static_cast<size_t>(n) * sizeof(uint16_t)));
  CUDA_CHECK(cuda::launch_to_bf16(w, w16, n, impl_->ctx.stream()));
  return reinterpret_cast<const __nv_bfloat16*>(w16);
}

void CudnnGraphConv::forward(const ConvGeom& g, const BFloat16* x, const float* w, const float* b,
                             BFloat16* y) {
  forward_bf16(g, nv(x), bf16_weights(g, w), b, nv(y));
}

void CudnnGraphConv::backward(const ConvGeom& g, const BFloat16* x, const float* w,
                              const BFloat16* dy, BFloat16* dx, float* dw, float* db,
                              bool accumulate) {
  backward_bf16(g, nv(x), dx ? bf16_weights(g, w) : nullptr, nv(dy), nv(dx), dw, db, accumulate);
}

void CudnnGraphConv::forward(const ConvGeom& g, const float* x, const float* w, const float* b,
                             float* y, FilterCopies& copies) {
  impl_->forward(g, x, Filter{w, &copies}, b, y);
}

void CudnnGraphConv::backward(const ConvGeom& g, const float* x, const float* w, const float* dy,
                              float* dx, float* dw, float* db, bool accumulate,
                              FilterCopies& copies) {
  impl_->backward(g, x, Filter{w, &copies}, dy, dx, dw, db, accumulate);
}

void CudnnGraphConv::forward(const ConvGeom& g, const BFloat16* x, const float* w, const float* b,
                             BFloat16* y, FilterCopies& copies) {
  impl_->forward(g, nv(x), Filter{w, &copies}, b, nv(y));
}

void CudnnGraphConv::backward(const ConvGeom& g, const BFloat16* x, const float* w,
                              const BFloat16* dy, BFloat16* dx, float* dw, float* db,
                              bool accumulate, FilterCopies& copies) {
  impl_->backward(g, nv(x), Filter{w, &copies}, nv(dy), nv(dx), dw, db, accumulate);
}

const void* FilterCopies::get(GpuContext& ctx, const ConvGeom& g, bool bf16, bool ohwi,
                              const float* w) {
  const bool moved = ohwi && !graph_api::same_layout(g);
  if (!bf16 && !moved && aligned(w)) return w;  // the plan reads the master weights as they are
  Copy& c = copies_[bf16][moved];
  if (span_ && span_->holds(c.made, c.of, w)) return c.buf.as<void>();
  const int64_t n = filter_elems(g);
  const size_t bytes = static_cast<size_t>(n) * (bf16 ? sizeof(uint16_t) : sizeof(float));
  if (c.buf.bytes() < bytes) {
    // A layer's filter keeps its size, so this is its first eager calls' only allocation.
    graph_api::check_not_capturing(ctx, "allocating a layer's filter copy");
    ctx.synchronize();  // queued work may still read the buffer being replaced
    c.buf = DeviceBuffer(bytes);
  }
  const auto move = moved ? cuda::FilterMove::kToOhwi : cuda::FilterMove::kCopy;
  const int64_t kk = g.k * g.k;
  if (bf16)
    CUDA_CHECK(cuda::launch_filter_move_to_bf16(w, c.buf.as<uint16_t>(), g.c_out, g.c_in, kk, move,
                                                ctx.stream()));
  else
    CUDA_CHECK(cuda::launch_filter_move(w, c.buf.as<float>(), g.c_out, g.c_in, kk, move, false,
                                        ctx.stream()));
  c.of = w;
  c.made = span_ ? span_->current() : 0;
  return c.buf.as<void>();
}

std::string CudnnGraphConv::plan_choices() const {
  std::map<std::string, std::string> all = impl_->seeds;
  for (const auto& [key, p] : impl_->plans) all[key] = p.name;
  for (const auto& [key, why] : impl_->unplannable) all[key] = kLegacy;
  std::ostringstream out;
  for (const auto& [key, name] : all) out << key << " -> " << name << "\n";
  return out.str();
}

void CudnnGraphConv::set_plan_choices(const std::string& text) {
  static const std::string kArrow = " -> ";
  std::map<std::string, std::string> parsed;
  std::istringstream in(text);
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const size_t at = line.find(kArrow);
    DPT_INPUT_CHECK(
        at != std::string::npos && at > 0 && at + kArrow.size() < line.size(),
        "cuDNN plan choices, line " << number << ": '" << line << "' is not '<key> -> <plan>'");
    parsed[line.substr(0, at)] = line.substr(at + kArrow.size());
  }
  for (auto& [key, name] : parsed) {
    if (auto built = impl_->plans.find(key); built != impl_->plans.end()) {
      if (built->second.name != name)
        log_warn(DPT_MSG("cuDNN plan '" << name << "' for convolution " << key
                                        << " comes after its plan was chosen ("
                                        << built->second.name << "); it is ignored"));
      continue;
    }
    impl_->seeds[key] = std::move(name);
  }
}

std::vector<PlanChoice> CudnnGraphConv::choices() const { return choices_of(impl_->plans); }

uint64_t CudnnGraphConv::graphs_built() const { return impl_->graphs_built; }
uint64_t CudnnGraphConv::plans_timed() const { return impl_->plans_timed; }

}  // namespace dpt::gpu
