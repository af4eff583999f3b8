// oneDNN 2.x convolution (the `convolution_forward::desc` API of Debian's libdnnl-dev 2.6).
// Activations are fixed NHWC (measured faster than format_tag::any on these shapes, see
// ../../docs/PERFORMANCE.md); weights use whatever layout each primitive prefers, reordered from
// the plain OIHW parameter view once per call, since the weights change every step.
#include "cpu/conv.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <vector>

#include "cpu/dnnl_util.h"
#include "cpu/ops.h"
#include "dpt/error.h"

namespace dpt::cpu {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

struct ConvPrimitives::Entry {
  dnnl::convolution_forward::primitive_desc fwd_pd;
  dnnl::convolution_backward_data::primitive_desc bwd_data_pd;
  dnnl::convolution_backward_weights::primitive_desc bwd_w_pd;
  dnnl::convolution_forward fwd;
  dnnl::convolution_backward_data bwd_data;
  dnnl::convolution_backward_weights bwd_w;
  memory::desc plain_w_md, bias_md;
  memory w_fwd, w_bwd, dw_prim, db_tmp;  // layouts the primitives want (empty when plain)
  memory scratch;  // one user-managed scratchpad for the three primitives: no allocation per call
  bool has_bias = false;
};

ConvPrimitives::ConvPrimitives() = default;
ConvPrimitives::~ConvPrimitives() = default;

ConvPrimitives::Entry& ConvPrimitives::entry(const ConvGeom& g, bool has_bias) {
  auto it = cache_.find(g.n);
  if (it != cache_.end()) return *it->second;
  auto& eng = dnnl_engine();
  auto e = std::make_unique<Entry>();
  e->has_bias = has_bias;
  const memory::dims strides{g.stride, g.stride}, pad{g.pad, g.pad};
  memory::desc src_md({g.n, g.c_in, g.h, g.w}, dt::f32, tag::nhwc);
  memory::desc dst_md({g.n, g.c_out, g.oh(), g.ow()}, dt::f32, tag::nhwc);
  memory::desc w_any({g.c_out, g.c_in, g.k, g.k}, dt::f32, tag::any);
  e->plain_w_md = memory::desc({g.c_out, g.c_in, g.k, g.k}, dt::f32, tag::oihw);
  e->bias_md = has_bias ? memory::desc({g.c_out}, dt::f32, tag::x) : memory::desc();
  auto algo = dnnl::algorithm::convolution_direct;
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  e->fwd_pd = dnnl::convolution_forward::primitive_desc(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algo, src_md, w_any,
                                      e->bias_md, dst_md, strides, pad, pad),
      attr, eng);
  e->bwd_data_pd = dnnl::convolution_backward_data::primitive_desc(
      dnnl::convolution_backward_data::desc(algo, src_md, w_any, dst_md, strides, pad, pad), attr,
      eng, e->fwd_pd);
  // oneDNN 2.6's jit_1x1:avx2 backward-weights kernel writes past its buffers for strided 1x1
  // convolutions whose input channel count is not a multiple of 8 (heap corruption, reproduced
  // without dptrain code). Asking for plain OIHW weight gradients there steers oneDNN to another
  // implementation.
  const bool avoid_1x1 = g.k == 1 && g.stride > 1 && g.c_in % 8 != 0;
  e->bwd_w_pd = dnnl::convolution_backward_weights::primitive_desc(
      dnnl::convolution_backward_weights::desc(algo, src_md, avoid_1x1 ? e->plain_w_md : w_any,
                                               e->bias_md, dst_md, strides, pad, pad),
      attr, eng, e->fwd_pd);
  size_t scratch_bytes = std::max({e->fwd_pd.scratchpad_desc().get_size(),
                                   e->bwd_data_pd.scratchpad_desc().get_size(),
                                   e->bwd_w_pd.scratchpad_desc().get_size()});
  e->scratch = memory(memory::desc({static_cast<memory::dim>(std::max<size_t>(scratch_bytes, 1))},
                                   dt::u8, tag::x),
                      eng);
  e->fwd = dnnl::convolution_forward(e->fwd_pd);
  e->bwd_data = dnnl::convolution_backward_data(e->bwd_data_pd);
  e->bwd_w = dnnl::convolution_backward_weights(e->bwd_w_pd);
  if (e->fwd_pd.weights_desc() != e->plain_w_md) e->w_fwd = memory(e->fwd_pd.weights_desc(), eng);
  if (e->bwd_data_pd.weights_desc() != e->plain_w_md &&
      e->bwd_data_pd.weights_desc() != e->fwd_pd.weights_desc())
    e->w_bwd = memory(e->bwd_data_pd.weights_desc(), eng);
  if (e->bwd_w_pd.diff_weights_desc() != e->plain_w_md)
    e->dw_prim = memory(e->bwd_w_pd.diff_weights_desc(), eng);
  if (has_bias) e->db_tmp = memory(e->bias_md, eng);
  log_dnnl_choice("conv fwd", e->fwd_pd.impl_info_str());
  log_dnnl_choice("conv bwd-data", e->bwd_data_pd.impl_info_str());
  log_dnnl_choice("conv bwd-weights", e->bwd_w_pd.impl_info_str());
  return *cache_.emplace(g.n, std::move(e)).first->second;
}

void ConvPrimitives::forward(const ConvGeom& g, const float* x, const float* w, const float* b,
                             float* y) {
  Entry& e = entry(g, b != nullptr);
  auto& eng = dnnl_engine();
  auto& strm = dnnl_stream();
  memory w_plain(e.plain_w_md, eng, const_cast<float*>(w));
  memory w_used = w_plain;
  if (e.w_fwd) {
    dnnl::reorder(w_plain, e.w_fwd).execute(strm, w_plain, e.w_fwd);
    w_used = e.w_fwd;
  }
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, memory(e.fwd_pd.src_desc(), eng, const_cast<float*>(x))},
      {DNNL_ARG_WEIGHTS, w_used},
      {DNNL_ARG_DST, memory(e.fwd_pd.dst_desc(), eng, y)}};
  if (b) args[DNNL_ARG_BIAS] = memory(e.bias_md, eng, const_cast<float*>(b));
  args[DNNL_ARG_SCRATCHPAD] = e.scratch;
  e.fwd.execute(strm, args);
  strm.wait();
}

void ConvPrimitives::backward(const ConvGeom& g, const float* x, const float* w, const float* dy,
                              float* dx, float* dw, float* db, bool accumulate) {
  Entry& e = entry(g, db != nullptr);
  auto& eng = dnnl_engine();
  auto& strm = dnnl_stream();
  memory dy_mem(e.fwd_pd.dst_desc(), eng, const_cast<float*>(dy));
  if (dx) {
    memory w_plain(e.plain_w_md, eng, const_cast<float*>(w));
    memory w_used = w_plain;
    const auto& want = e.bwd_data_pd.weights_desc();
    if (want != e.plain_w_md) {
      // The forward pass already reordered these same weights into this layout when they match.
      if (want == e.fwd_pd.weights_desc()) {
        w_used = e.w_fwd;
      } else {
        dnnl::reorder(w_plain, e.w_bwd).execute(strm, w_plain, e.w_bwd);
        w_used = e.w_bwd;
      }
    }
    e.bwd_data.execute(strm, {{DNNL_ARG_DIFF_DST, dy_mem},
                              {DNNL_ARG_WEIGHTS, w_used},
                              {DNNL_ARG_DIFF_SRC, memory(e.bwd_data_pd.diff_src_desc(), eng, dx)},
                              {DNNL_ARG_SCRATCHPAD, e.scratch}});
  }
  const int64_t wn = g.c_out * g.c_in * g.k * g.k;
  std::vector<float> dw_tmp;
  float* dw_target = dw;
  if (accumulate) {
    dw_tmp.resize(static_cast<size_t>(wn));
    dw_target = dw_tmp.data();
  }
  memory dw_plain(e.plain_w_md, eng, dw_target);
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, memory(e.fwd_pd.src_desc(), eng, const_cast<float*>(x))},
      {DNNL_ARG_DIFF_DST, dy_mem},
      {DNNL_ARG_DIFF_WEIGHTS, e.dw_prim ? e.dw_prim : dw_plain}};
  if (db) args[DNNL_ARG_DIFF_BIAS] = accumulate ? e.db_tmp : memory(e.bias_md, eng, db);
  args[DNNL_ARG_SCRATCHPAD] = e.scratch;
  e.bwd_w.execute(strm, args);
  if (e.dw_prim) dnnl::reorder(e.dw_prim, dw_plain).execute(strm, e.dw_prim, dw_plain);
  strm.wait();
  if (accumulate) {
    add_inplace(dw, dw_tmp.data(), wn);
    if (db) add_inplace(db, static_cast<const float*>(e.db_tmp.get_data_handle()), g.c_out);
  }
}

}  // namespace dpt::cpu
