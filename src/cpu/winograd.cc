// Winograd convolution on NHWC activations (see winograd.h). Every transform runs over whole
// channel vectors (NHWC keeps them contiguous), so the inner loops are plain vectorisable loops;
// tiles are processed in blocks small enough that the transformed tiles stay in cache between the
// input transform, the alpha^2 sgemms and the output transform.
#include "cpu/winograd.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

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

// t = l * s and t += l * s over n floats: the inner loops of every transform. Cloned for AVX2+FMA
// and resolved at load time, since the project is built without -march (runs on any x86-64) and
// the transforms are a third of a ResNet-18 step at SSE2 width.
__attribute__((target_clones("arch=x86-64-v3", "default"))) void scale_into(
    float* __restrict t, float l, const float* __restrict s, int64_t n) {
  for (int64_t c = 0; c < n; ++c) t[c] = l * s[c];
}
__attribute__((target_clones("arch=x86-64-v3", "default"))) void scale_add(
    float* __restrict t, float l, const float* __restrict s, int64_t n) {
  for (int64_t c = 0; c < n; ++c) t[c] += l * s[c];
}

// out(i, j) = sum_{a, b} L[i][a] in(a, b) L[j][b] for i, j < rows, where L is rows x cols and
// in / out address vectors of n floats (in may return nullptr for a zero vector). tmp holds
// rows * cols * n floats. Zero entries of L are skipped: the tables are sparse.
template <class In, class Out>
void transform2d(const float* L, int rows, int cols, int64_t n, In in, Out out, float* tmp) {
  for (int i = 0; i < rows; ++i)
    for (int b = 0; b < cols; ++b) {
      float* __restrict t = tmp + (i * cols + b) * n;
      bool first = true;
      for (int a = 0; a < cols; ++a) {
        const float l = L[i * cols + a];
        const float* __restrict s = l == 0.f ? nullptr : in(a, b);
        if (!s) continue;
        if (first) scale_into(t, l, s, n);
        else scale_add(t, l, s, n);
        first = false;
      }
      if (first) std::memset(t, 0, sizeof(float) * static_cast<size_t>(n));
    }
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < rows; ++j) {
      float* __restrict o = out(i, j);
      bool first = true;
      for (int b = 0; b < cols; ++b) {
        const float l = L[j * cols + b];
        if (l == 0.f) continue;
        const float* __restrict t = tmp + (i * cols + b) * n;
        if (first) scale_into(o, l, t, n);
        else scale_add(o, l, t, n);
        first = false;
      }
      if (first) std::memset(o, 0, sizeof(float) * static_cast<size_t>(n));
    }
}

template <class T>
T* grow(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
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
TileAt tile_at(int64_t tile, int64_t th, int64_t tw) { return {tile / (th * tw), tile / tw % th, tile % tw}; }

// V[p] = (BT d BT^T)[p] for the alpha x alpha patch d of image[H,W,C] whose corner is (y0, x0),
// zeros outside the image; V[p] is written to v + p * pitch. The input side of every pass.
void input_tile(const wino::Tables& t, const float* image, int64_t h, int64_t w, int64_t c, int64_t y0,
                int64_t x0, float* v, int64_t pitch, float* tmp) {
  const int alpha = t.m + t.r - 1;
  transform2d(
      t.bt, alpha, alpha, c,
      [&](int a, int b) -> const float* {
        const int64_t y = y0 + a, x = x0 + b;
        return y >= 0 && y < h && x >= 0 && x < w ? image + (y * w + x) * c : nullptr;
      },
      [&](int p, int q) { return v + (p * alpha + q) * pitch; }, tmp);
}

// Stride-1 correlation out[N,OH,OW,K] = sum_c sum_{a,b} in[N, oy+a-pad, ox+b-pad, c] w[a,b,c,k]
// (+ bias), with w given transformed: U[p][c][k], p over the alpha x alpha tile points.
struct Corr {
  const wino::Tables& t;
  int64_t n, h, w, c, oh, ow, k, pad;
};

}  // namespace

WinogradChoice winograd_choice(const ConvGeom& g) {
  static const bool off = [] {
    const char* e = std::getenv("DPT_WINOGRAD");
    return e && std::string(e) == "off";
  }();
  WinogradChoice ch;
  // Few input or output channels make the sgemms too thin to pay for the transforms (LeNet's
  // and ResNet's first convolution: one input channel).
  if (off || g.stride != 1 || g.c_in < 16 || g.c_out < 16) return ch;
  if (g.k == 3) ch = {4, 4};
  return ch;
}

namespace {

void correlate(const Corr& s, const float* in, const float* u, const float* bias, float* out,
               std::vector<float>& vbuf, std::vector<float>& mbuf, std::vector<float>& tmpbuf) {
  const int m = s.t.m, r = s.t.r, alpha = m + r - 1, P = alpha * alpha;
  const int64_t th = ceil_div(s.oh, m), tw = ceil_div(s.ow, m), total = s.n * th * tw;
  const int64_t tb = block_tiles(P, s.c, s.k, total);
  float* v = grow(vbuf, P * tb * s.c);
  float* mt = grow(mbuf, P * tb * s.k);
  const int threads = omp_get_max_threads();
  const int64_t tmp_each = alpha * alpha * std::max(s.c, s.k);
  float* tmp_all = grow(tmpbuf, threads * tmp_each + threads * m * m * s.k);
  for (int64_t t0 = 0; t0 < total; t0 += tb) {
    const int64_t nb = std::min(tb, total - t0);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < nb; ++i) {
      const TileAt at = tile_at(t0 + i, th, tw);
      input_tile(s.t, in + at.img * s.h * s.w * s.c, s.h, s.w, s.c, at.ty * m - s.pad, at.tx * m - s.pad,
                 v + i * s.c, tb * s.c, tmp_all + omp_get_thread_num() * tmp_each);
    }
    for (int p = 0; p < P; ++p)
      sgemm('N', 'N', nb, s.k, s.c, v + p * tb * s.c, s.c, u + p * s.c * s.k, s.k, 0.f,
            mt + p * tb * s.k, s.k);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < nb; ++i) {
      const auto [img, ty, tx] = tile_at(t0 + i, th, tw);
      const int tid = omp_get_thread_num();
      float* ytile = tmp_all + threads * tmp_each + tid * m * m * s.k;
      transform2d(
          s.t.at, m, alpha, s.k,
          [&](int a, int b) -> const float* { return mt + ((a * alpha + b) * tb + i) * s.k; },
          [&](int p, int q) { return ytile + (p * m + q) * s.k; }, tmp_all + tid * tmp_each);
      for (int p = 0; p < m; ++p) {
        const int64_t y = ty * m + p;
        if (y >= s.oh) break;
        for (int q = 0; q < m; ++q) {
          const int64_t x = tx * m + q;
          if (x >= s.ow) break;
          float* __restrict dst = out + ((img * s.oh + y) * s.ow + x) * s.k;
          const float* __restrict src = ytile + (p * m + q) * s.k;
          if (bias) {
            for (int64_t c = 0; c < s.k; ++c) dst[c] = src[c] + bias[c];
          } else {
            std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(s.k));
          }
        }
      }
    }
  }
}

}  // namespace

// U[p][i][o] = (G f_io G^T)[p] for filters given as wr[i][a][b][o] (r x r taps of `outs`-long
// vectors), vectorised over o: the forward pass's U[p][c][k], backward-data's U[p][k][c].
float* WinogradConv::transform_filters(const wino::Tables& t, int64_t ins, int64_t outs,
                                       const float* wr) {
  const int r = t.r, alpha = t.m + r - 1;
  float* u = grow(u_, alpha * alpha * ins * outs);
  const int threads = omp_get_max_threads();
  float* tmp = grow(tmp_, threads * alpha * r * outs);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < ins; ++i)
    transform2d(
        t.g, alpha, r, outs, [&](int a, int b) { return wr + ((i * r + a) * r + b) * outs; },
        [&](int p, int q) { return u + ((p * alpha + q) * ins + i) * outs; },
        tmp + omp_get_thread_num() * alpha * r * outs);
  return u;
}

// The filters of the forward pass (U[p][c][k] from w[k][c][a][b]) or, rotated by 180 degrees
// with channels swapped, of backward-data (U[p][k][c] from w[k][c][r-1-a][r-1-b]): reordered so
// the vector dimension is innermost, then transformed.
std::pair<const wino::Tables*, float*> WinogradConv::filters(const ConvGeom& g, int m, const float* w,
                                                             bool rotate) {
  DPT_CHECK(g.stride == 1, "Winograd convolution needs stride 1");
  const auto& t = tables(m, static_cast<int>(g.k));
  const int r = t.r;
  const int64_t C = g.c_in, K = g.c_out, ins = rotate ? K : C, outs = rotate ? C : K;
  float* wr = grow(wr_, C * r * r * K);  // wr[in][a][b][out]
  for (int64_t k = 0; k < K; ++k)
    for (int64_t c = 0; c < C; ++c)
      for (int a = 0; a < r; ++a)
        for (int bb = 0; bb < r; ++bb) {
          const float v = rotate ? w[((k * C + c) * r + (r - 1 - a)) * r + (r - 1 - bb)]
                                 : w[((k * C + c) * r + a) * r + bb];
          const int64_t in = rotate ? k : c, out = rotate ? c : k;
          wr[((in * r + a) * r + bb) * outs + out] = v;
        }
  return {&t, transform_filters(t, ins, outs, wr)};
}

void WinogradConv::forward(const ConvGeom& g, int m, const float* x, const float* w,
                           const float* b, float* y) {
  const auto [t, u] = filters(g, m, w, false);
  correlate(Corr{*t, g.n, g.h, g.w, g.c_in, g.oh(), g.ow(), g.c_out, g.pad}, x, u, b, y, v_, mt_, acc_);
}

void WinogradConv::backward_data(const ConvGeom& g, int m, const float* w, const float* dy,
                                 float* dx) {
  const auto [t, u] = filters(g, m, w, true);
  correlate(Corr{*t, g.n, g.oh(), g.ow(), g.c_out, g.h, g.w, g.c_in, g.k - 1 - g.pad}, dy, u, nullptr,
            dx, v_, mt_, acc_);
}

void WinogradConv::backward_weights(const ConvGeom& g, int mw, const float* x, const float* dy,
                                    float* dw, bool accumulate) {
  DPT_CHECK(g.stride == 1, "Winograd convolution needs stride 1");
  const int r = static_cast<int>(g.k);
  const auto& t = tables(r, mw);  // F(r, mw): r x r outputs from an mw x mw "filter" (dy tile)
  const int alpha = r + mw - 1, P = alpha * alpha;
  const int64_t C = g.c_in, K = g.c_out, oh = g.oh(), ow = g.ow();
  const int64_t th = ceil_div(oh, mw), tw = ceil_div(ow, mw), total = g.n * th * tw;
  const int64_t tb = block_tiles(P, C, K, total);
  float* v = grow(v_, P * tb * C);
  float* d = grow(mt_, P * tb * K);
  const int threads = omp_get_max_threads();
  const int64_t tmp_each = alpha * alpha * std::max(C, K);
  float* tmp = grow(tmp_, threads * tmp_each);
  // acc[p][c][k] = sum over tiles of V[p][tile][c] D[p][tile][k]; then dw = AT acc AT^T.
  float* acc = grow(acc_, P * C * K + C * r * r * K);
  for (int64_t t0 = 0; t0 < total; t0 += tb) {
    const int64_t nb = std::min(tb, total - t0);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < nb; ++i) {
      const auto [img, ty, tx] = tile_at(t0 + i, th, tw);
      float* tm = tmp + omp_get_thread_num() * tmp_each;
      input_tile(t, x + img * g.h * g.w * C, g.h, g.w, C, ty * mw - g.pad, tx * mw - g.pad, v + i * C,
                 tb * C, tm);
      const float* db = dy + img * oh * ow * K;
      transform2d(
          t.g, alpha, mw, K,
          [&](int a, int b) -> const float* {
            const int64_t yy = ty * mw + a, xx = tx * mw + b;
            return yy < oh && xx < ow ? db + (yy * ow + xx) * K : nullptr;
          },
          [&](int p, int q) { return d + ((p * alpha + q) * tb + i) * K; }, tm);
    }
    for (int p = 0; p < P; ++p)
      sgemm('T', 'N', C, K, nb, v + p * tb * C, C, d + p * tb * K, K, t0 == 0 ? 0.f : 1.f,
            acc + p * C * K, K);
  }
  float* dwt = acc + P * C * K;  // [c][i][j][k]
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < C; ++c)
    transform2d(
        t.at, r, alpha, K, [&](int a, int b) { return acc + ((a * alpha + b) * C + c) * K; },
        [&](int i, int j) { return dwt + ((c * r + i) * r + j) * K; },
        tmp + omp_get_thread_num() * tmp_each);
  for (int64_t k = 0; k < K; ++k)
    for (int64_t c = 0; c < C; ++c)
      for (int ij = 0; ij < r * r; ++ij) {
        const float val = dwt[(c * r * r + ij) * K + k];
        float& o = dw[(k * C + c) * r * r + ij];
        o = accumulate ? o + val : val;
      }
}

}  // namespace dpt::cpu
