// Winograd convolution on NHWC activations (see winograd.h): the tables, buffers, tile geometry and
// the choice of path live here; the loops of the passes are in winograd_loops.inc, compiled once
// per instruction-set level (isa.h) and called through the level isa.cc chose. Tiles are processed
// in blocks small enough that the transformed tiles stay in cache between the input transform,
// the alpha^2 sgemms and the output transform.
#include "cpu/winograd.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "cpu/isa.h"
#include "cpu/ops.h"
#include "cpu/winograd_tables.h"
#include "dpt/error.h"

namespace dpt::cpu {

namespace {

const wino::Tables& tables(int m, int r) {
  for (const auto& t : wino::kTables)
    if (t.m == m && t.r == r) return t;
  DPT_CHECK(false, "no Winograd tables for F(" << m << ", " << r << ")");
  return wino::kTables[0];
}

template <class T>
T* grow(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

// The buffers of the passes, one set per thread for every layer: nothing in them outlives a call
// (each call transforms its filters again), and a step runs its layers one at a time. One set
// per layer held every layer's at once: 309 MB for ResNet-50 at batch 16, all of it first
// touched (page faults) in the first step; shared, the largest layer's (about 80 MB).
struct Scratch {
  std::vector<float> wr, u, v, mt, acc, tmp;
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Tiles per block: the block's transformed inputs and products (P x Tb x (C + K) floats) should
// stay in the outer caches, but the sgemms need enough rows to amortise packing U (C x K).
int64_t block_tiles(int64_t P, int64_t c, int64_t k, int64_t total) {
  const int64_t budget = (int64_t{4} << 20) / (4 * P * (c + k));
  return std::min(total, std::max<int64_t>(64, budget));
}

// Tiles numbered image by image, row by row: `th` x `tw` per image.
struct TileAt {
  int64_t img, ty, tx;
};
TileAt tile_at(int64_t tile, int64_t th, int64_t tw) {
  return {tile / (th * tw), tile / tw % th, tile % tw};
}

// Stride-1 correlation out[N,OH,OW,K] = sum_c sum_{a,b} in[N, oy+a-pad, ox+b-pad, c] w[a,b,c,k]
// (+ bias), with w given transformed: U[p][c][k], p over the alpha x alpha tile points.
struct Corr {
  const wino::Tables& t;
  int64_t n, h, w, c, oh, ow, k, pad;
};

// One level's copies of the passes' loops (winograd_loops.inc).
struct WinogradLoops {
  void (*transform_filters)(const wino::Tables& t, int64_t ins, int64_t outs, const float* wr,
                            float* u, std::vector<float>& tmp);
  void (*correlate)(const Corr& s, const float* in, const float* u, const float* bias, float* out,
                    std::vector<float>& v, std::vector<float>& mt, std::vector<float>& tmp);
  void (*weight_gradient)(const ConvGeom& g, const wino::Tables& t, const float* x, const float* dy,
                          float* dw, bool accumulate, std::vector<float>& v, std::vector<float>& d,
                          std::vector<float>& tmp, std::vector<float>& acc);
};

#define DPT_ISA_LOOPS "cpu/winograd_loops.inc"
#include "cpu/isa_targets.inc"
#undef DPT_ISA_LOOPS

const WinogradLoops kByIsa[] = {isa_generic::kLoops, isa_avx2::kLoops, isa_avx512::kLoops};
const WinogradLoops& loops() { return for_active_isa(kByIsa); }

}  // namespace

WinogradChoice winograd_choice(const ConvGeom& g) {
  static const bool off = [] {
    const char* e = std::getenv("DPT_WINOGRAD");
    const std::string v = e ? e : "";
    // Another value (0, no, OFF) left Winograd on without a word.
    DPT_INPUT_CHECK(v.empty() || v == "off", "DPT_WINOGRAD=" << v << ": expected off (or unset)");
    return v == "off";
  }();
  WinogradChoice ch;
  // Few input or output channels make the sgemms too thin to pay for the transforms (LeNet's
  // and ResNet's first convolution: one input channel).
  if (off || g.stride != 1 || g.c_in < 16 || g.c_out < 16) return ch;
  // F(2,3) for forward and backward-data, not F(4,3): F(4,3)'s transforms (entries up to 8, rows
  // summing to 19 in absolute value) give 3.7-4.8x a direct convolution's rounding error, F(2,3)
  // 0.5-0.9x. In a network the forward error decides how many ReLUs land on the other side of 0
  // than in exact arithmetic, and each flip moves every gradient upstream: with F(4,3), 18 of
  // ResNet-18's 59 gradients were over 4x PyTorch fp32's error against float64, with F(2,3) none
  // (docs/PERFORMANCE.md, "Gradient accuracy"), for about 10 % more time in these convolutions.
  // The weight gradient keeps F(3,4): its error stays in its own output (no flips downstream).
  if (g.k == 3) ch = {2, 4};
  return ch;
}

// The transformed filters, in the buffer of the forward and backward-data passes.
float* WinogradConv::transform_filters(const wino::Tables& t, int64_t ins, int64_t outs,
                                       const float* wr) {
  Scratch& s = scratch();
  float* u = grow(s.u, (t.m + t.r - 1) * (t.m + t.r - 1) * ins * outs);
  loops().transform_filters(t, ins, outs, wr, u, s.tmp);
  return u;
}

// The filters of the forward pass (U[p][c][k] from w[k][c][a][b]) or, rotated by 180 degrees
// with channels swapped, of backward-data (U[p][k][c] from w[k][c][r-1-a][r-1-b]): reordered so
// the vector dimension is innermost, then transformed. Both reorders write wr in runs of
// consecutive floats: scattering single floats K apart made the forward one 2.6x slower
// (7 ms for 512 x 512 x 3 x 3 on the AVX-512 EPYC of docs/PERFORMANCE.md).
std::pair<const wino::Tables*, float*> WinogradConv::filters(const ConvGeom& g, int m,
                                                             const float* w, bool rotate) {
  DPT_CHECK(g.stride == 1, "Winograd convolution needs stride 1");
  const auto& t = tables(m, static_cast<int>(g.k));
  const int r = t.r;
  const int64_t C = g.c_in, K = g.c_out, ins = rotate ? K : C, outs = rotate ? C : K, rr = r * r;
  float* wr = grow(scratch().wr, C * rr * K);  // wr[in][a][b][out]
  if (rotate) {
    // wr[k][a][b][c] = w[k][c][r-1-a][r-1-b]: each row of C floats gathered at a stride of r*r.
    for (int64_t k = 0; k < K; ++k)
      for (int a = 0; a < r; ++a)
        for (int bb = 0; bb < r; ++bb) {
          float* __restrict dst = wr + ((k * r + a) * r + bb) * C;
          const float* src = w + (k * C * r + (r - 1 - a)) * r + (r - 1 - bb);
          for (int64_t c = 0; c < C; ++c) dst[c] = src[c * rr];
        }
  } else {
    // wr[c][a][b][k] = w[k][c][a][b]: the transpose of [K][C*r*r], 16 rows of w at a time.
    constexpr int64_t kRows = 16;
    for (int64_t k0 = 0; k0 < K; k0 += kRows) {
      const int64_t kn = std::min(kRows, K - k0);
      for (int64_t j = 0; j < C * rr; ++j)
        for (int64_t k = 0; k < kn; ++k) wr[j * K + k0 + k] = w[(k0 + k) * C * rr + j];
    }
  }
  return {&t, transform_filters(t, ins, outs, wr)};
}

void WinogradConv::forward(const ConvGeom& g, int m, const float* x, const float* w, const float* b,
                           float* y) {
  const auto [t, u] = filters(g, m, w, false);
  Scratch& s = scratch();
  loops().correlate(Corr{*t, g.n, g.h, g.w, g.c_in, g.oh(), g.ow(), g.c_out, g.pad}, x, u, b, y,
                    s.v, s.mt, s.acc);
}

void WinogradConv::backward_data(const ConvGeom& g, int m, const float* w, const float* dy,
                                 float* dx) {
  const auto [t, u] = filters(g, m, w, true);
  Scratch& s = scratch();
  loops().correlate(Corr{*t, g.n, g.oh(), g.ow(), g.c_out, g.h, g.w, g.c_in, g.k - 1 - g.pad}, dy,
                    u, nullptr, dx, s.v, s.mt, s.acc);
}

void WinogradConv::backward_weights(const ConvGeom& g, int mw, const float* x, const float* dy,
                                    float* dw, bool accumulate) {
  DPT_CHECK(g.stride == 1, "Winograd convolution needs stride 1");
  // F(k, mw): k x k outputs (the weight gradient) from an mw x mw "filter" (a tile of dy).
  const auto& t = tables(static_cast<int>(g.k), mw);
  Scratch& s = scratch();
  loops().weight_gradient(g, t, x, dy, dw, accumulate, s.v, s.mt, s.tmp, s.acc);
}

}  // namespace dpt::cpu
