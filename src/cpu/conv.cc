// oneDNN 2.x convolution (the `convolution_forward::desc` API of Debian's libdnnl-dev 2.6).
// Activations are fixed NHWC (measured faster than format_tag::any on these shapes, see
// ../../docs/PERFORMANCE.md); weights use whatever layout each primitive prefers, reordered from
// the plain OIHW parameter view by the forward pass (the weights change every step) and reused by
// backward-data where the layouts agree. In bf16 the same primitives take bf16 x, w and dy
// (rounded here, or by the weight reorder) and write fp32; with bf16 activations as well they read
// and write the activations in bf16 directly (y and dx rounded by oneDNN's own conversion).
#include "cpu/conv.h"

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

#include "cpu/cpu_backend.h"
#include "cpu/dnnl_util.h"
#include "cpu/ops.h"
#include "cpu/widen.h"
#include "cpu/winograd.h"
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
  // The weights in the layouts the primitives want (empty when plain; w_bwd made by the first
  // backward that needs it, so an evaluation's batch size never holds one).
  memory w_fwd, w_bwd, db_tmp;
  // Which weights w_fwd and w_bwd hold: their source and the WeightSpan they were made in.
  const float* w_fwd_of = nullptr;
  const float* w_bwd_of = nullptr;
  uint64_t w_fwd_span = 0, w_bwd_span = 0;
  memory::desc scratch_md;  // the largest of the three primitives' scratchpads (CallBuffers)
  bool has_bias = false;
  // Which backward path this shape uses (-1 = not yet decided, 0 = oneDNN, 1 = im2col + sgemm,
  // backward_gemm), decided once per shape (see backward()).
  int bwd_path = -1;
};

namespace {
// A byte buffer grown to the largest request, in the CPU backend's storage (64-byte aligned, as
// oneDNN aligns its own memory).
class AlignedBytes {
 public:
  void* get(size_t bytes) {
    if (bytes > size_) {
      p_.reset(cpu_backend().allocate(bytes));
      size_ = bytes;
    }
    return p_.get();
  }

 private:
  struct Release {
    void operator()(void* p) const noexcept { cpu_backend().release(p); }
  };
  std::unique_ptr<void, Release> p_;
  size_t size_ = 0;
};

// What lives only inside one forward or backward call: oneDNN's scratchpad, the weight gradient in
// the primitive's layout, the bf16 roundings of x and dy, the sgemm path's columns and reordered
// weights. One set per thread for every layer and batch size (a step runs its layers one at a
// time, each call waits for its primitives), as the Winograd passes' scratch is. One set per layer
// and batch size held, among the rest, a second copy of every weight gradient for each batch size
// seen: 305 MB for ResNet-50 in fp32.
struct CallBuffers {
  AlignedBytes scratch, dw;
  std::vector<uint16_t> x16, dy16;
  std::vector<float> col, dcol, w_ohwi, dw_ohwi, dw_tmp;
};
CallBuffers& call_buffers() {
  thread_local CallBuffers b;
  return b;
}
// A primitive's scratchpad of descriptor md, in this thread's buffer.
memory scratchpad(const memory::desc& md) {
  return memory(md, dnnl_engine(), call_buffers().scratch.get(md.get_size()));
}
}  // namespace

ConvPrimitives::ConvPrimitives(bool bf16, const WeightSpan* span)
    : wino_(std::make_unique<WinogradConv>()), bf16_(bf16), span_(span) {}
ConvPrimitives::~ConvPrimitives() = default;

ConvPrimitives::Entry& ConvPrimitives::entry(const ConvGeom& g, bool has_bias, bool act16) {
  // With and without the bias are different primitives: a convolution whose bias is folded
  // (nn.h's fold_conv_biases) runs without it in training and with it in evaluation.
  const int64_t key = (g.n * 2 + (act16 ? 1 : 0)) * 2 + (has_bias ? 1 : 0);
  auto it = cache_.find(key);
  if (it != cache_.end()) return *it->second;
  auto& eng = dnnl_engine();
  auto e = std::make_unique<Entry>();
  e->has_bias = has_bias;
  const memory::dims strides{g.stride, g.stride}, pad{g.pad, g.pad};
  // The operands (x, w, dy) in bf16 or fp32; what the primitives write (y, dx, dw, db) in fp32,
  // or y and dx in bf16 with bf16 activations.
  const dt in = bf16_ ? dt::bf16 : dt::f32, act_out = act16 ? dt::bf16 : dt::f32;
  memory::desc src_md({g.n, g.c_in, g.h, g.w}, in, tag::nhwc);
  memory::desc dsrc_md({g.n, g.c_in, g.h, g.w}, act_out, tag::nhwc);
  memory::desc dst_md({g.n, g.c_out, g.oh(), g.ow()}, act_out, tag::nhwc);
  memory::desc ddst_md({g.n, g.c_out, g.oh(), g.ow()}, in, tag::nhwc);
  memory::desc w_any({g.c_out, g.c_in, g.k, g.k}, in, tag::any);
  memory::desc dw_any({g.c_out, g.c_in, g.k, g.k}, dt::f32, tag::any);
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
      dnnl::convolution_backward_data::desc(algo, dsrc_md, w_any, ddst_md, strides, pad, pad), attr,
      eng, e->fwd_pd);
  // oneDNN 2.6's jit_1x1:avx2 backward-weights kernel writes past its buffers for strided 1x1
  // convolutions whose input channel count is not a multiple of 8 (heap corruption, reproduced
  // without dptrain code). Asking for plain OIHW weight gradients there steers oneDNN to another
  // implementation.
  const bool avoid_1x1 = g.k == 1 && g.stride > 1 && g.c_in % 8 != 0;
  e->bwd_w_pd = dnnl::convolution_backward_weights::primitive_desc(
      dnnl::convolution_backward_weights::desc(algo, src_md, avoid_1x1 ? e->plain_w_md : dw_any,
                                               e->bias_md, ddst_md, strides, pad, pad),
      attr, eng, e->fwd_pd);
  size_t scratch_bytes =
      std::max({e->fwd_pd.scratchpad_desc().get_size(), e->bwd_data_pd.scratchpad_desc().get_size(),
                e->bwd_w_pd.scratchpad_desc().get_size()});
  e->scratch_md =
      memory::desc({static_cast<memory::dim>(std::max<size_t>(scratch_bytes, 1))}, dt::u8, tag::x);
  e->fwd = dnnl::convolution_forward(e->fwd_pd);
  e->bwd_data = dnnl::convolution_backward_data(e->bwd_data_pd);
  e->bwd_w = dnnl::convolution_backward_weights(e->bwd_w_pd);
  if (e->fwd_pd.weights_desc() != e->plain_w_md) e->w_fwd = memory(e->fwd_pd.weights_desc(), eng);
  if (has_bias) e->db_tmp = memory(e->bias_md, eng);
  log_dnnl_choice("conv fwd", e->fwd_pd.impl_info_str());
  log_dnnl_choice("conv bwd-data", e->bwd_data_pd.impl_info_str());
  log_dnnl_choice("conv bwd-weights", e->bwd_w_pd.impl_info_str());
  return *cache_.emplace(key, std::move(e)).first->second;
}

namespace {
// The plain weights w reordered into `to` (the layout a primitive wants), unless `to` already
// holds them from earlier in the same WeightSpan.
void reorder_weights(memory& w_plain, const float* w, memory& to, const float*& to_of,
                     uint64_t& to_span, const WeightSpan* span) {
  if (span && span->holds(to_span, to_of, w)) return;
  dnnl::reorder(w_plain, to).execute(dnnl_stream(), w_plain, to);
  to_of = w;
  to_span = span ? span->current() : 0;
}

// `p` as a primitive's operand of descriptor md: the caller's floats, or in bf16 their rounding
// into buf (the weights instead go through the reorder into the primitive's layout).
memory operand(const memory::desc& md, const float* p, std::vector<uint16_t>& buf) {
  if (md.data.data_type != dnnl_bf16) return memory(md, dnnl_engine(), const_cast<float*>(p));
  buf.resize(md.get_size() / sizeof(uint16_t));
  to_bf16(p, buf.data(), static_cast<int64_t>(buf.size()));
  return memory(md, dnnl_engine(), buf.data());
}
// The caller's bfloat16 activations as an operand, as they are.
memory operand(const memory::desc& md, const BFloat16* p, std::vector<uint16_t>&) {
  return memory(md, dnnl_engine(), const_cast<BFloat16*>(p));
}
}  // namespace

void ConvPrimitives::forward(const ConvGeom& g, const float* x, const float* w, const float* b,
                             float* y) {
  // bf16 never runs Winograd: its transforms would work on the rounded operands in fp32, which
  // is neither the bf16 product nor faster than oneDNN's bf16 kernels.
  if (const int m = bf16_ ? 0 : winograd_choice(g).m) return wino_->forward(g, m, x, w, b, y);
  forward_dnnl(entry(g, b != nullptr, false), x, w, b, y);
}

template <typename T>
void ConvPrimitives::forward_dnnl(Entry& e, const T* x, const float* w, const float* b, T* y) {
  auto& eng = dnnl_engine();
  auto& strm = dnnl_stream();
  memory w_plain(e.plain_w_md, eng, const_cast<float*>(w));
  memory w_used = w_plain;
  if (e.w_fwd) {
    reorder_weights(w_plain, w, e.w_fwd, e.w_fwd_of, e.w_fwd_span, span_);
    w_used = e.w_fwd;
  }
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, operand(e.fwd_pd.src_desc(), x, call_buffers().x16)},
      {DNNL_ARG_WEIGHTS, w_used},
      {DNNL_ARG_DST, memory(e.fwd_pd.dst_desc(), eng, y)}};
  if (b) args[DNNL_ARG_BIAS] = memory(e.bias_md, eng, const_cast<float*>(b));
  args[DNNL_ARG_SCRATCHPAD] = scratchpad(e.scratch_md);
  e.fwd.execute(strm, args);
  strm.wait();
}

template <typename T>
void ConvPrimitives::backward_dnnl(Entry& e, const ConvGeom& g, const T* x, const float* w,
                                   const T* dy, T* dx, float* dw, float* db, bool accumulate) {
  auto& eng = dnnl_engine();
  auto& strm = dnnl_stream();
  CallBuffers& buf = call_buffers();
  const memory scratch = scratchpad(e.scratch_md);
  const memory dy_mem = operand(e.bwd_data_pd.diff_dst_desc(), dy, buf.dy16);
  if (dx) {
    memory w_plain(e.plain_w_md, eng, const_cast<float*>(w));
    memory w_used = w_plain;
    const auto& want = e.bwd_data_pd.weights_desc();
    if (want != e.plain_w_md) {
      // The forward pass already reordered these same weights into this layout when they match.
      if (want == e.fwd_pd.weights_desc()) {
        w_used = e.w_fwd;
      } else {
        if (!e.w_bwd) e.w_bwd = memory(want, eng);
        reorder_weights(w_plain, w, e.w_bwd, e.w_bwd_of, e.w_bwd_span, span_);
        w_used = e.w_bwd;
      }
    }
    e.bwd_data.execute(strm, {{DNNL_ARG_DIFF_DST, dy_mem},
                              {DNNL_ARG_WEIGHTS, w_used},
                              {DNNL_ARG_DIFF_SRC, memory(e.bwd_data_pd.diff_src_desc(), eng, dx)},
                              {DNNL_ARG_SCRATCHPAD, scratch}});
  }
  const int64_t wn = g.c_out * g.c_in * g.k * g.k;
  float* dw_target = dw;
  if (accumulate) {
    buf.dw_tmp.resize(static_cast<size_t>(wn));
    dw_target = buf.dw_tmp.data();
  }
  memory dw_plain(e.plain_w_md, eng, dw_target);
  // The primitive's own layout of dw, when not the plain one: written, then reordered into dw.
  const auto& dw_md = e.bwd_w_pd.diff_weights_desc();
  memory dw_prim =
      dw_md == e.plain_w_md ? memory() : memory(dw_md, eng, buf.dw.get(dw_md.get_size()));
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, operand(e.bwd_w_pd.src_desc(), x, buf.x16)},
                                       {DNNL_ARG_DIFF_DST, dy_mem},
                                       {DNNL_ARG_DIFF_WEIGHTS, dw_prim ? dw_prim : dw_plain}};
  if (db) args[DNNL_ARG_DIFF_BIAS] = accumulate ? e.db_tmp : memory(e.bias_md, eng, db);
  args[DNNL_ARG_SCRATCHPAD] = scratch;
  e.bwd_w.execute(strm, args);
  if (dw_prim) dnnl::reorder(dw_prim, dw_plain).execute(strm, dw_prim, dw_plain);
  strm.wait();
  if (accumulate) {
    add_inplace(dw, buf.dw_tmp.data(), wn);
    if (db) add_inplace(db, static_cast<const float*>(e.db_tmp.get_data_handle()), g.c_out);
  }
}

// The same gradients as backward_dnnl, as two large sgemms over im2col columns (NHWC makes the
// columns contiguous copies): dW = dY^T col and dcol = dY W. On this project's AVX2 machines
// oneDNN 2.6's direct backward kernels reach ~50 GFLOP/s on LeNet's conv2, sgemm ~87.
void ConvPrimitives::backward_gemm(const ConvGeom& g, const float* x, const float* w,
                                   const float* dy, float* dx, float* dw, float* db,
                                   bool accumulate) {
  CallBuffers& buf = call_buffers();
  const int64_t kk = g.k * g.k, kkc = kk * g.c_in, o = g.c_out, per_image = g.oh() * g.ow();
  // Blocks of images whose columns (~1.5 MB) stay in cache between im2col, the two sgemms and
  // col2im, instead of 20 MB round trips through memory for LeNet's conv2 at batch 128.
  const int64_t block =
      std::clamp<int64_t>((int64_t{3} << 18) / std::max<int64_t>(1, per_image * kkc), 1, g.n);
  buf.col.resize(static_cast<size_t>(block * per_image * kkc));
  buf.dw_ohwi.resize(static_cast<size_t>(o * kkc));
  if (dx) {
    buf.w_ohwi.resize(static_cast<size_t>(o * kkc));
    for (int64_t oc = 0; oc < o; ++oc)
      for (int64_t c = 0; c < g.c_in; ++c)
        for (int64_t t = 0; t < kk; ++t)
          buf.w_ohwi[static_cast<size_t>((oc * kk + t) * g.c_in + c)] =
              w[(oc * g.c_in + c) * kk + t];
    buf.dcol.resize(buf.col.size());
  }
  for (int64_t n0 = 0; n0 < g.n; n0 += block) {
    ConvGeom gb = g;
    gb.n = std::min(block, g.n - n0);
    const int64_t rows = gb.n * per_image;
    const float* dyb = dy + n0 * per_image * o;
    im2col_nhwc(x + n0 * g.h * g.w * g.c_in, gb.n, g.h, g.w, g.c_in, g.k, g.stride, g.pad,
                buf.col.data());
    sgemm('T', 'N', o, kkc, rows, dyb, o, buf.col.data(), kkc, n0 == 0 ? 0.f : 1.f,
          buf.dw_ohwi.data(), kkc);
    if (dx) {
      sgemm('N', 'N', rows, kkc, o, dyb, o, buf.w_ohwi.data(), kkc, 0.f, buf.dcol.data(), kkc);
      col2im_nhwc(buf.dcol.data(), gb.n, g.h, g.w, g.c_in, g.k, g.stride, g.pad,
                  dx + n0 * g.h * g.w * g.c_in);
    }
  }
  // [O][kh][kw][C] -> PyTorch's [O][C][kh][kw].
  for (int64_t oc = 0; oc < o; ++oc)
    for (int64_t c = 0; c < g.c_in; ++c)
      for (int64_t t = 0; t < kk; ++t) {
        const float v = buf.dw_ohwi[static_cast<size_t>((oc * kk + t) * g.c_in + c)];
        float& d = dw[(oc * g.c_in + c) * kk + t];
        d = accumulate ? d + v : v;
      }
  if (db) column_sums(dy, g.n * per_image, o, db, accumulate);
}

void ConvPrimitives::backward(const ConvGeom& g, const float* x, const float* w, const float* dy,
                              float* dx, float* dw, float* db, bool accumulate) {
  if (const auto ch = bf16_ ? WinogradChoice{} : winograd_choice(g); ch.m) {
    if (dx) wino_->backward_data(g, ch.m, w, dy, dx);
    wino_->backward_weights(g, ch.mw, x, dy, dw, accumulate);
    if (db) column_sums(dy, g.n * g.oh() * g.ow(), g.c_out, db, accumulate);
    return;
  }
  Entry& e = entry(g, db != nullptr, false);
  if (e.bwd_path < 0) {
    // The path must not depend on timing by default: two runs (or a run and its resume) must
    // compute the same bits. Rule, from measurements (docs/PERFORMANCE.md): sgemm for kernels
    // of 5x5 and larger (LeNet's conv2: 34.5 ms vs 40.4 ms at batch 256) and for strided 3x3
    // kernels (ResNet-18's downsampling convolutions at batch 64: 56/49/58 ms vs 70/61/84 ms),
    // oneDNN for the rest (one-channel stems, 1x1; stride-1 3x3 with channels is Winograd).
    // DPT_CONV_BACKWARD=onednn|sgemm pins a path; =auto times both once per shape and keeps the
    // faster (not reproducible).
    // bf16 is always oneDNN's: the sgemm path is fp32.
    const char* env = std::getenv("DPT_CONV_BACKWARD");
    const std::string force = env ? env : "";
    // A misspelt path (sgem) took the default rule without a word.
    DPT_INPUT_CHECK(force.empty() || force == "onednn" || force == "sgemm" || force == "auto",
                    "DPT_CONV_BACKWARD=" << force << ": expected onednn, sgemm or auto");
    if (force == "onednn" || bf16_)
      e.bwd_path = 0;
    else if (force == "sgemm")
      e.bwd_path = 1;
    else if (force != "auto")
      e.bwd_path = g.k >= 5 || (g.k >= 3 && g.stride > 1) ? 1 : 0;
  }
  if (e.bwd_path < 0 && accumulate) {
    // The trial overwrites the gradients: measure on a call that does not accumulate.
    backward_dnnl(e, g, x, w, dy, dx, dw, db, accumulate);
    return;
  }
  if (e.bwd_path < 0) {
    // DPT_CONV_BACKWARD=auto: once per shape, like cuDNN's algorithm search, time both paths (the
    // second run of each, after first-touch page faults) and keep the faster. Both write the same
    // gradients, so the trial runs are real work (the caller's gradients are overwritten, never
    // accumulated).
    double best[2] = {0, 0};
    for (int rep = 0; rep < 2; ++rep)
      for (int path = 0; path < 2; ++path) {
        const auto t0 = std::chrono::steady_clock::now();
        if (path == 0)
          backward_dnnl(e, g, x, w, dy, dx, dw, db, false);
        else
          backward_gemm(g, x, w, dy, dx, dw, db, false);
        best[path] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
    e.bwd_path = best[1] < best[0] ? 1 : 0;
    log_dnnl_choice("conv backward path", DPT_MSG((e.bwd_path ? "im2col+sgemm" : "oneDNN")
                                                  << " (oneDNN " << best[0] * 1e3 << " ms, sgemm "
                                                  << best[1] * 1e3 << " ms) for N=" << g.n << " C="
                                                  << g.c_in << " O=" << g.c_out << " K=" << g.k));
  }
  if (e.bwd_path == 1)
    backward_gemm(g, x, w, dy, dx, dw, db, accumulate);
  else
    backward_dnnl(e, g, x, w, dy, dx, dw, db, accumulate);
}

// 16-bit activations. The bf16 backend's primitives read and write them directly: x and dy are
// bf16 operands already, and y and dx are rounded once, by oneDNN, from its fp32 accumulators (the
// reference rounds the same fp32 result, give or take the order of the accumulation, which may
// differ between oneDNN's kernels for fp32 and bf16 outputs; and oneDNN's conversion flushes
// subnormal results, below 2^-126, to zero). The fp32 backend's are the reference (widen.h).
void ConvPrimitives::forward(const ConvGeom& g, const BFloat16* x, const float* w, const float* b,
                             BFloat16* y) {
  if (bf16_) return forward_dnnl(entry(g, b != nullptr, true), x, w, b, y);
  Widened f;
  forward(g, f.in(x, g.n * g.h * g.w * g.c_in), w, b, f.out(y, g.n * g.oh() * g.ow() * g.c_out));
}

void ConvPrimitives::backward(const ConvGeom& g, const BFloat16* x, const float* w,
                              const BFloat16* dy, BFloat16* dx, float* dw, float* db,
                              bool accumulate) {
  if (bf16_)
    return backward_dnnl(entry(g, db != nullptr, true), g, x, w, dy, dx, dw, db, accumulate);
  Widened f;
  const int64_t in = g.n * g.h * g.w * g.c_in;
  backward(g, f.in(x, in), w, f.in(dy, g.n * g.oh() * g.ow() * g.c_out), f.out(dx, in), dw, db,
           accumulate);
}

}  // namespace dpt::cpu
