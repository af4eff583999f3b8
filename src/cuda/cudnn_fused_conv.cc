// FusedConvGenstats (see cudnn_fused_conv.h) on cuDNN's graph API through cudnn-frontend; built,
// like cudnn_graph_conv.cc, only where the frontend's headers are.
//
// Graphs, per key (geometry, prologue or not, data type), all NHWC, fp32 intermediates and compute:
//   prologue: x -> MUL scale[1,Cin,1,1] -> ADD bias[1,Cin,1,1] -> RELU_FWD -> conv_fprop(., w) -> y
//   plain:    x -> conv_fprop(., w) -> y
//   then the statistics of y, in one of two forms that compete:
//     "genstats": a GENSTATS node (sum and sum of squares per channel): the pattern of cuDNN's
//       specialised ConvBNfprop engine, the one NVIDIA's ResNet training runs;
//     "reduce": REDUCTION ADD of y, and REDUCTION ADD of MUL(y, y), over N, H, W: the same sums as
//       a generic runtime-fusion epilogue, for where the specialised engine declines (bf16, a
//       geometry it does not cover).
// The filter is described as stored (OIHW) or as OHWI, moved there through the workspace, as in
// CudnnGraphConv. scale and bias are described in fp32 first; where no engine takes fp32 scale and
// bias with bf16 arrays (cuDNN's sample gives them the arrays' type), a second tier rounds them to
// bf16 in the workspace each call ("+iosb" in the plan's name: one rounding of each, 2^-9).
// Which of these cuDNN supports is only known on a device (check_support): the test and the bench
// print the chosen plan per key, and a key with none throws naming every graph's reason.
//
// Numerics: the same numerical notes are barred as in CudnnGraphConv (no down-converted inputs,
// no reduced-precision reductions, TF32 for fp32 arrays only with tensor_ops()), deterministic
// engines first (for "reduce", reductions asked deterministic), non-deterministic ones only where
// a key has no other plan, with a warning. sum and sqsum are zeroed before each run: cuDNN does
// not document whether its statistics epilogues overwrite or accumulate, and zeroing is right
// for both.
#include "cuda/cudnn_fused_conv.h"

#include <chrono>
#include <map>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "cuda/conv_common.h"
#include "cuda/cuda_check.h"
#include "cuda/cudnn_graph_common.h"
#include "dpt/log.h"
#include "precision.cuh"

namespace dpt::gpu {

namespace fe = cudnn_frontend;

namespace {

using graph_api::Io;

// How a plan's graph computes the statistics and lays out the filter and the prologue's operands.
struct Variant {
  bool genstats = true;  // GENSTATS node, else REDUCTION nodes
  bool ohwi = false;     // filter described as OHWI (moved there), else as stored
  bool io_sb = false;    // scale and bias in the arrays' type (rounded each call), else fp32
};
std::string variant_name(Variant v) {
  return std::string(v.genstats ? "genstats" : "reduce") + (v.ohwi ? "+ohwi" : "+oihw") +
         (v.io_sb ? "+iosb" : "");
}

// Tiers as in CudnnGraphConv: a later tier only where no earlier one offers a plan.
std::vector<std::vector<Variant>> variant_tiers(const ConvGeom& g, bool prologue, Io io) {
  std::vector<Variant> first;
  for (bool genstats : {true, false}) {
    if (!graph_api::same_layout(g)) first.push_back({genstats, false, false});
    first.push_back({genstats, true, false});
  }
  std::vector<std::vector<Variant>> tiers{first};
  if (prologue && io == Io::kBf16) {
    for (Variant& v : first) v.io_sb = true;
    tiers.push_back(first);
  }
  return tiers;
}

constexpr int64_t kUidX = 1, kUidW = 2, kUidY = 3, kUidScale = 4, kUidBias = 5, kUidSum = 6,
                  kUidSqSum = 7;

std::string key_of(const ConvGeom& g, bool prologue, Io io) {
  return geom_str(g) + (prologue ? " scale-bias-relu-conv-genstats " : " conv-genstats ") +
         graph_api::io_name(io);
}

struct Plan : graph_api::BuiltPlan {
  Variant variant;
  std::string name;  // "<variant>:<engine tag>"
  float ms = 0;
  int candidates = 0;
};

using Tensor = std::shared_ptr<fe::graph::Tensor_attributes>;

// NHWC strides of an [n, c, h, w] tensor; per-channel vectors are [1, c, 1, 1].
std::vector<int64_t> nhwc(int64_t c, int64_t h, int64_t w) { return {h * w * c, 1, w * c, c}; }

std::shared_ptr<fe::graph::Graph> make_graph(cudnnHandle_t handle, const ConvGeom& g, bool prologue,
                                             Io io, Variant v, bool nondeterministic,
                                             std::string* why) {
  using fe::DataType_t;
  const DataType_t t = graph_api::data_type(io);
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(t)
      .set_intermediate_data_type(DataType_t::FLOAT)
      .set_compute_data_type(DataType_t::FLOAT);
  const auto tensor = [&](const char* name, int64_t uid, DataType_t type, std::vector<int64_t> dim,
                          std::vector<int64_t> stride) {
    return graph->tensor(fe::graph::Tensor_attributes()
                             .set_name(name)
                             .set_uid(uid)
                             .set_data_type(type)
                             .set_dim(dim)
                             .set_stride(stride));
  };
  const auto output = [](const Tensor& a, const char* name, int64_t uid, DataType_t type,
                         std::vector<int64_t> dim, std::vector<int64_t> stride) {
    a->set_name(name).set_uid(uid).set_data_type(type).set_dim(dim).set_stride(stride).set_output(
        true);
  };
  const int64_t ci = g.c_in, co = g.c_out;
  Tensor in = tensor("x", kUidX, t, {g.n, ci, g.h, g.w}, nhwc(ci, g.h, g.w));
  if (prologue) {
    const DataType_t sb = v.io_sb ? t : DataType_t::FLOAT;
    const Tensor scale = tensor("scale", kUidScale, sb, {1, ci, 1, 1}, nhwc(ci, 1, 1));
    const Tensor bias = tensor("bias", kUidBias, sb, {1, ci, 1, 1}, nhwc(ci, 1, 1));
    using fe::graph::Pointwise_attributes;
    in = graph->pointwise(
        in, scale, Pointwise_attributes().set_name("scale").set_mode(fe::PointwiseMode_t::MUL));
    in = graph->pointwise(
        in, bias, Pointwise_attributes().set_name("bias").set_mode(fe::PointwiseMode_t::ADD));
    in = graph->pointwise(
        in, Pointwise_attributes().set_name("relu").set_mode(fe::PointwiseMode_t::RELU_FWD));
  }
  const Tensor w = tensor("w", kUidW, t, {co, ci, g.k, g.k}, graph_api::filter_stride(g, v.ohwi));
  const Tensor y = graph->conv_fprop(in, w,
                                     fe::graph::Conv_fprop_attributes()
                                         .set_padding({g.pad, g.pad})
                                         .set_stride({g.stride, g.stride})
                                         .set_dilation({1, 1}));
  output(y, "y", kUidY, t, {g.n, co, g.oh(), g.ow()}, nhwc(co, g.oh(), g.ow()));
  Tensor sum, sqsum;
  if (v.genstats) {
    const auto stats = graph->genstats(y, fe::graph::Genstats_attributes().set_name("genstats"));
    sum = stats[0];
    sqsum = stats[1];
  } else {
    const auto reduce = [&](const Tensor& of, const char* name) {
      return graph->reduction(of, fe::graph::Reduction_attributes()
                                      .set_name(name)
                                      .set_mode(fe::ReductionMode_t::ADD)
                                      .set_is_deterministic(!nondeterministic));
    };
    sum = reduce(y, "sum");
    sqsum = reduce(graph->pointwise(y, y,
                                    fe::graph::Pointwise_attributes().set_name("square").set_mode(
                                        fe::PointwiseMode_t::MUL)),
                   "sqsum");
  }
  output(sum, "sum", kUidSum, DataType_t::FLOAT, {1, co, 1, 1}, nhwc(co, 1, 1));
  output(sqsum, "sqsum", kUidSqSum, DataType_t::FLOAT, {1, co, 1, 1}, nhwc(co, 1, 1));
  // Runtime fusion has no precompiled engine: NVRTC-compiled ones are this op's only plans.
  if (!graph_api::finish_graph(*graph, handle, io != Io::kFp32, nondeterministic, true, why))
    return nullptr;
  return graph;
}

}  // namespace

struct FusedConvGenstats::Impl {
  GpuContext& ctx;
  std::map<std::string, Plan> plans;  // by key
  uint64_t graphs_built = 0, plans_timed = 0;

  explicit Impl(GpuContext& c) : ctx(c) {}

  // The fastest plan of the first (determinism, tier) step that offers any, built and timed
  // through `trial` on the key's first call.
  template <class Trial>
  const Plan& plan(const ConvGeom& g, bool prologue, Io io, const Trial& trial) {
    const std::string key = key_of(g, prologue, io);
    if (auto it = plans.find(key); it != plans.end()) return it->second;
    graph_api::check_not_capturing(ctx, "building the cuDNN graph of fused convolution " + key);
    const auto t0 = std::chrono::steady_clock::now();
    const auto make = [&](Variant v, bool nondeterministic, std::string* why) {
      return make_graph(ctx.cudnn(), g, prologue, io, v, nondeterministic, why);
    };
    std::vector<Plan> candidates = graph_api::candidate_plans<Plan>(
        variant_tiers(g, prologue, io), make, variant_name, "fused convolution " + key,
        ctx.nondeterministic(), &graphs_built);
    // Every trial's layout fits: the plan's workspace, an fp32 filter, fp32 scale and bias.
    const size_t extra =
        static_cast<size_t>(graph_api::filter_elems(g) + 2 * g.c_in) * sizeof(float) +
        3 * WorkspaceLayout::kAlign;
    Plan chosen = graph_api::take_fastest(ctx, candidates, extra, "fused convolution " + key, trial,
                                          &plans_timed);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    log_debug(DPT_MSG("cuDNN graph plan for fused convolution "
                      << key << ": " << chosen.name << ", " << chosen.ms << " ms, the fastest of "
                      << chosen.candidates << " (workspace " << chosen.workspace << " bytes; " << s
                      << " s to choose)"));
    return plans.emplace(key, std::move(chosen)).first->second;
  }

  // One run of plan p on the call's operands: the filter and, where needed, scale and bias
  // staged in the workspace, the sums zeroed, then the plan.
  void run(const Plan& p, const ConvGeom& g, Io io, const void* x, const float* scale,
           const float* bias, const void* w, void* y, float* sum, float* sqsum) {
    const bool prologue = scale != nullptr;
    const bool move_w = graph_api::moves_filter(g, p.variant.ohwi, w);
    // cuDNN describes every tensor 16-byte aligned; a BatchNorm's parameters may sit anywhere.
    const bool stage_sb =
        prologue && (p.variant.io_sb || reinterpret_cast<uintptr_t>(scale) % 16 != 0 ||
                     reinterpret_cast<uintptr_t>(bias) % 16 != 0);
    const size_t sb_bytes =
        static_cast<size_t>(g.c_in) * (p.variant.io_sb ? graph_api::elem_bytes(io) : 4);
    WorkspaceLayout layout;
    const size_t at_w = move_w ? layout.add(static_cast<size_t>(graph_api::filter_elems(g)) *
                                            graph_api::elem_bytes(io))
                               : 0;
    const size_t at_scale = stage_sb ? layout.add(sb_bytes) : 0,
                 at_bias = stage_sb ? layout.add(sb_bytes) : 0;
    const size_t at_plan = layout.add(static_cast<size_t>(p.workspace));
    char* ws = static_cast<char*>(ctx.workspace(layout.total()));
    const void* wp =
        graph_api::place_filter(ctx, g, io, p.variant.ohwi, w, move_w ? ws + at_w : nullptr);
    const void *sp = scale, *bp = bias;
    if (stage_sb) {
      for (auto [from, at, to] :
           {std::tuple{scale, at_scale, &sp}, std::tuple{bias, at_bias, &bp}}) {
        if (p.variant.io_sb)
          CUDA_CHECK(cuda::launch_to_bf16(from, reinterpret_cast<uint16_t*>(ws + at), g.c_in,
                                          ctx.stream()));
        else
          CUDA_CHECK(
              cudaMemcpyAsync(ws + at, from, sb_bytes, cudaMemcpyDeviceToDevice, ctx.stream()));
        *to = ws + at;
      }
    }
    const size_t stat_bytes = static_cast<size_t>(g.c_out) * sizeof(float);
    CUDA_CHECK(cudaMemsetAsync(sum, 0, stat_bytes, ctx.stream()));
    CUDA_CHECK(cudaMemsetAsync(sqsum, 0, stat_bytes, ctx.stream()));
    std::unordered_map<int64_t, void*> pack{{kUidX, const_cast<void*>(x)},
                                            {kUidW, const_cast<void*>(wp)},
                                            {kUidY, y},
                                            {kUidSum, sum},
                                            {kUidSqSum, sqsum}};
    if (prologue) {
      pack[kUidScale] = const_cast<void*>(sp);
      pack[kUidBias] = const_cast<void*>(bp);
    }
    DPT_LIB_CHECK("cuDNN graph",
                  p.graph->execute_plan_at_index(ctx.cudnn(), pack, ws + at_plan, p.index),
                  graph_api::fe_failed, graph_api::fe_message);
  }

  void forward(const ConvGeom& g, Io io, const void* x, const float* scale, const float* bias,
               const void* w, void* y, float* sum, float* sqsum) {
    check_geometry(g);
    DPT_CHECK((scale == nullptr) == (bias == nullptr),
              "fused convolution " << geom_str(g)
                                   << ": scale and bias come together (both null: no prologue)");
    graph_api::check_activation(x, "x", g);
    graph_api::check_activation(y, "y", g);
    graph_api::check_activation(sum, "sum", g);
    graph_api::check_activation(sqsum, "sqsum", g);
    const auto trial = [&](const Plan& p) { run(p, g, io, x, scale, bias, w, y, sum, sqsum); };
    trial(plan(g, scale != nullptr, io, trial));
  }
};

FusedConvGenstats::FusedConvGenstats(GpuContext& ctx) : impl_(std::make_unique<Impl>(ctx)) {}
FusedConvGenstats::~FusedConvGenstats() = default;

void FusedConvGenstats::forward_bf16(const ConvGeom& g, const __nv_bfloat16* x, const float* scale,
                                     const float* bias, const __nv_bfloat16* w, __nv_bfloat16* y,
                                     float* sum, float* sqsum) {
  impl_->forward(g, Io::kBf16, x, scale, bias, w, y, sum, sqsum);
}

void FusedConvGenstats::forward(const ConvGeom& g, const float* x, const float* scale,
                                const float* bias, const float* w, float* y, float* sum,
                                float* sqsum) {
  impl_->forward(g, impl_->ctx.tensor_ops() ? Io::kTf32 : Io::kFp32, x, scale, bias, w, y, sum,
                 sqsum);
}

std::vector<PlanChoice> FusedConvGenstats::choices() const { return choices_of(impl_->plans); }

uint64_t FusedConvGenstats::graphs_built() const { return impl_->graphs_built; }
uint64_t FusedConvGenstats::plans_timed() const { return impl_->plans_timed; }

}  // namespace dpt::gpu
