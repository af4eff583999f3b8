// CPU kernels of src/cpu/ops.h: plain loops, OpenMP across the batch or channel dimension,
// oneDNN's sgemm for Linear. Accumulations that feed BatchNorm statistics are done in double.
#include "cpu/ops.h"

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "dpt/error.h"

namespace dpt::cpu {

void relu_forward(const float* x, float* y, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
}

void relu_backward(const float* y, const float* dy, float* dx, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dx[i] = y[i] > 0.f ? dy[i] : 0.f;
}

void add(const float* a, const float* b, float* y, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

void add_inplace(float* y, const float* b, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] += b[i];
}

namespace {
// Average pooling forward, optionally of relu(x): the one loop behind avgpool_forward and the
// fused relu_avgpool_forward.
template <bool kRelu>
void pool_forward(const float* x, float* y, int64_t n, int64_t h, int64_t w, int64_t c, int k, int s) {
  const int64_t oh = (h - k) / s + 1, ow = (w - k) / s + 1;
  const float inv = 1.f / static_cast<float>(k * k);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < n; ++b) {
    const float* xb = x + b * h * w * c;
    float* yb = y + b * oh * ow * c;
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        float* yo = yb + (i * ow + j) * c;
        for (int64_t ch = 0; ch < c; ++ch) yo[ch] = 0.f;
        for (int di = 0; di < k; ++di)
          for (int dj = 0; dj < k; ++dj) {
            const float* xi = xb + ((i * s + di) * w + (j * s + dj)) * c;
#pragma omp simd
            for (int64_t ch = 0; ch < c; ++ch) yo[ch] += kRelu ? (xi[ch] > 0.f ? xi[ch] : 0.f) : xi[ch];
          }
        for (int64_t ch = 0; ch < c; ++ch) yo[ch] *= inv;
      }
  }
}
}  // namespace

void avgpool_forward(const float* x, float* y, int64_t n, int64_t h, int64_t w, int64_t c, int k,
                     int s) {
  pool_forward<false>(x, y, n, h, w, c, k, s);
}

namespace {
// One image's average-pooling backward: dx (zeroed here) += each window's gradient / k^2.
void pool_backward_image(const float* dyb, float* dxb, int64_t h, int64_t w, int64_t c, int k, int s) {
  const int64_t oh = (h - k) / s + 1, ow = (w - k) / s + 1;
  const float inv = 1.f / static_cast<float>(k * k);
  std::memset(dxb, 0, sizeof(float) * static_cast<size_t>(h * w * c));
  for (int64_t i = 0; i < oh; ++i)
    for (int64_t j = 0; j < ow; ++j) {
      const float* g = dyb + (i * ow + j) * c;
      for (int di = 0; di < k; ++di)
        for (int dj = 0; dj < k; ++dj) {
          float* d = dxb + ((i * s + di) * w + (j * s + dj)) * c;
#pragma omp simd
          for (int64_t ch = 0; ch < c; ++ch) d[ch] += g[ch] * inv;
        }
    }
}
}  // namespace

void avgpool_backward(const float* dy, float* dx, int64_t n, int64_t h, int64_t w, int64_t c, int k,
                      int s) {
  const int64_t oh = (h - k) / s + 1, ow = (w - k) / s + 1;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < n; ++b) pool_backward_image(dy + b * oh * ow * c, dx + b * h * w * c, h, w, c, k, s);
}

void relu_avgpool_forward(const float* x, float* y, int64_t n, int64_t h, int64_t w, int64_t c,
                          int k, int s) {
  pool_forward<true>(x, y, n, h, w, c, k, s);
}

void relu_avgpool_backward(const float* x, const float* dy, float* dx, int64_t n, int64_t h,
                           int64_t w, int64_t c, int k, int s) {
  const int64_t oh = (h - k) / s + 1, ow = (w - k) / s + 1;
  const float inv = 1.f / static_cast<float>(k * k);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < n; ++b) {
    const float* xb = x + b * h * w * c;
    float* dxb = dx + b * h * w * c;
    const float* dyb = dy + b * oh * ow * c;
    if (s == k) {
      // Non-overlapping windows: each input position is written exactly once, or zeroed when
      // the floor-mode pooling never covers it.
      if (oh * k < h) std::memset(dxb + oh * k * w * c, 0, sizeof(float) * static_cast<size_t>((h - oh * k) * w * c));
      for (int64_t r = 0; r < oh * k; ++r) {
        if (ow * k < w) std::memset(dxb + (r * w + ow * k) * c, 0, sizeof(float) * static_cast<size_t>((w - ow * k) * c));
        const float* g = dyb + (r / k) * ow * c;
        for (int64_t q = 0; q < ow * k; ++q) {
          const float* gq = g + (q / k) * c;
          const float* xi = xb + (r * w + q) * c;
          float* d = dxb + (r * w + q) * c;
#pragma omp simd
          for (int64_t ch = 0; ch < c; ++ch) d[ch] = xi[ch] > 0.f ? gq[ch] * inv : 0.f;
        }
      }
      continue;
    }
    pool_backward_image(dyb, dxb, h, w, c, k, s);  // overlapping windows: scatter, then mask
    for (int64_t p = 0; p < h * w * c; ++p)
      if (!(xb[p] > 0.f)) dxb[p] = 0.f;
  }
}

void global_avgpool_forward(const float* x, float* y, int64_t n, int64_t hw, int64_t c) {
  const float inv = 1.f / static_cast<float>(hw);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < n; ++b) {
    float* yb = y + b * c;
    for (int64_t ch = 0; ch < c; ++ch) yb[ch] = 0.f;
    for (int64_t p = 0; p < hw; ++p) {
      const float* xp = x + (b * hw + p) * c;
#pragma omp simd
      for (int64_t ch = 0; ch < c; ++ch) yb[ch] += xp[ch];
    }
    for (int64_t ch = 0; ch < c; ++ch) yb[ch] *= inv;
  }
}

void global_avgpool_backward(const float* dy, float* dx, int64_t n, int64_t hw, int64_t c) {
  const float inv = 1.f / static_cast<float>(hw);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < n; ++b)
    for (int64_t p = 0; p < hw; ++p) {
      float* d = dx + (b * hw + p) * c;
      const float* g = dy + b * c;
#pragma omp simd
      for (int64_t ch = 0; ch < c; ++ch) d[ch] = g[ch] * inv;
    }
}

namespace {
// Per-thread partial sums over row blocks, combined in a fixed order so results do not depend on
// scheduling: the same input gives bit-identical statistics run to run.
template <typename RowFn>
void channel_reduce2(int64_t m, int64_t c, double* out_a, double* out_b, RowFn row_fn) {
  constexpr int64_t kBlock = 256;
  const int64_t blocks = (m + kBlock - 1) / kBlock;
  std::vector<double> part(static_cast<size_t>(blocks * 2 * c), 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    double* a = part.data() + blk * 2 * c;
    double* b = a + c;
    const int64_t end = std::min(m, (blk + 1) * kBlock);
    for (int64_t r = blk * kBlock; r < end; ++r) row_fn(r, a, b);
  }
  std::fill(out_a, out_a + c, 0.0);
  std::fill(out_b, out_b + c, 0.0);
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const double* a = part.data() + blk * 2 * c;
    for (int64_t ch = 0; ch < c; ++ch) {
      out_a[ch] += a[ch];
      out_b[ch] += a[c + ch];
    }
  }
}
}  // namespace

void bn_sums(const float* x, int64_t m, int64_t c, double* sum, double* sumsq) {
  channel_reduce2(m, c, sum, sumsq, [&](int64_t r, double* a, double* b) {
    const float* xr = x + r * c;
    for (int64_t ch = 0; ch < c; ++ch) {
      const double v = xr[ch];
      a[ch] += v;
      b[ch] += v * v;
    }
  });
}

void bn_apply(const float* x, float* y, const float* mean, const float* invstd, const float* gamma,
              const float* beta, int64_t m, int64_t c) {
  std::vector<float> scale(static_cast<size_t>(c)), shift(static_cast<size_t>(c));
  for (int64_t ch = 0; ch < c; ++ch) {
    scale[ch] = gamma[ch] * invstd[ch];
    shift[ch] = beta[ch] - mean[ch] * scale[ch];
  }
  const float* sc = scale.data();
  const float* sh = shift.data();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < m; ++r) {
    const float* xr = x + r * c;
    float* yr = y + r * c;
#pragma omp simd
    for (int64_t ch = 0; ch < c; ++ch) yr[ch] = xr[ch] * sc[ch] + sh[ch];
  }
}

void bn_backward_sums(const float* x, const float* dy, const float* mean, const float* invstd,
                      int64_t m, int64_t c, double* sum_dy, double* sum_dy_xhat) {
  channel_reduce2(m, c, sum_dy, sum_dy_xhat, [&](int64_t r, double* a, double* b) {
    const float* xr = x + r * c;
    const float* gr = dy + r * c;
    for (int64_t ch = 0; ch < c; ++ch) {
      a[ch] += gr[ch];
      b[ch] += static_cast<double>(gr[ch]) * ((xr[ch] - mean[ch]) * invstd[ch]);
    }
  });
}

void bn_backward_apply(const float* x, const float* dy, const float* mean, const float* invstd,
                       const float* gamma, const double* sum_dy, const double* sum_dy_xhat,
                       double count, int64_t m, int64_t c, float* dx) {
  std::vector<float> k1(static_cast<size_t>(c)), k2(static_cast<size_t>(c)), k3(static_cast<size_t>(c));
  for (int64_t ch = 0; ch < c; ++ch) {
    const float g = gamma[ch] * invstd[ch];
    k1[ch] = g;
    k2[ch] = static_cast<float>(sum_dy[ch] / count);
    k3[ch] = static_cast<float>(sum_dy_xhat[ch] / count);
  }
  const float *a = k1.data(), *b = k2.data(), *d = k3.data();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < m; ++r) {
    const float* xr = x + r * c;
    const float* gr = dy + r * c;
    float* o = dx + r * c;
#pragma omp simd
    for (int64_t ch = 0; ch < c; ++ch) {
      const float xhat = (xr[ch] - mean[ch]) * invstd[ch];
      o[ch] = a[ch] * (gr[ch] - b[ch] - xhat * d[ch]);
    }
  }
}

void sgemm(char ta, char tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  DPT_LIB_CHECK("oneDNN", dnnl_sgemm(ta, tb, m, n, k, 1.f, a, lda, b, ldb, beta, c, ldc),
                [](dnnl_status_t s) { return s != dnnl_success; },
                [](dnnl_status_t s) { return std::string("sgemm status ") + std::to_string(s); });
}

void column_sums(const float* a, int64_t rows, int64_t cols, float* out, bool accumulate) {
  std::vector<double> sum(static_cast<size_t>(cols), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) sum[static_cast<size_t>(c)] += a[r * cols + c];
  for (int64_t c = 0; c < cols; ++c)
    out[c] = static_cast<float>(accumulate ? out[c] + sum[static_cast<size_t>(c)] : sum[static_cast<size_t>(c)]);
}

void linear_forward(const float* x, const float* w, const float* b, float* y, int64_t n,
                    int64_t in, int64_t out) {
  sgemm('N', 'T', n, out, in, x, in, w, in, 0.f, y, out);
  if (b) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n; ++r)
      for (int64_t o = 0; o < out; ++o) y[r * out + o] += b[o];
  }
}

void linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                     float* db, int64_t n, int64_t in, int64_t out, bool accumulate) {
  if (dx) sgemm('N', 'N', n, in, out, dy, out, w, in, 0.f, dx, in);
  sgemm('T', 'N', out, in, n, dy, out, x, in, accumulate ? 1.f : 0.f, dw, in);
  if (db) column_sums(dy, n, out, db, accumulate);
}

void nhwc_to_chw(const float* x, float* y, int64_t n, int64_t h, int64_t w, int64_t c) {
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < n; ++b)
    for (int64_t p = 0; p < h * w; ++p)
      for (int64_t ch = 0; ch < c; ++ch) y[(b * c + ch) * h * w + p] = x[(b * h * w + p) * c + ch];
}

void chw_to_nhwc(const float* x, float* y, int64_t n, int64_t h, int64_t w, int64_t c) {
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < n; ++b)
    for (int64_t p = 0; p < h * w; ++p)
      for (int64_t ch = 0; ch < c; ++ch) y[(b * h * w + p) * c + ch] = x[(b * c + ch) * h * w + p];
}

namespace {
// The SGD loops, with the gradient read through `grad(i)`: the plain g[i], or coef * g[i] when
// clipping (a separate instantiation, so the unclipped loop keeps its exact arithmetic).
template <typename Grad>
void sgd_loop(float* p, float* buf, int64_t n, float lr, float mom, float wd, bool first, Grad grad) {
  if (mom > 0) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float d = grad(i) + wd * p[i];
      buf[i] = first ? d : mom * buf[i] + d;
      p[i] -= lr * buf[i];
    }
  } else {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) p[i] -= lr * (grad(i) + wd * p[i]);
  }
}
}  // namespace

void sgd_update(float* p, const float* g, float* buf, int64_t n, float lr, float mom, float wd, bool first,
                float coef) {
  if (coef != 1.f)
    sgd_loop(p, buf, n, lr, mom, wd, first, [g, coef](int64_t i) { return coef * g[i]; });
  else
    sgd_loop(p, buf, n, lr, mom, wd, first, [g](int64_t i) { return g[i]; });
}

double sum_squares(const float* x, int64_t n) {
  // Four interleaved accumulators (a fixed order, and no loop-carried latency on one of them).
  double acc[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int k = 0; k < 4; ++k) acc[k] += static_cast<double>(x[i + k]) * static_cast<double>(x[i + k]);
  for (; i < n; ++i) acc[0] += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

double softmax_xent(const float* logits, const int32_t* labels, int64_t n, int64_t k,
                    float grad_scale, float* dlogits, int64_t* correct) {
  double loss = 0;
  int64_t hits = 0;
  for (int64_t r = 0; r < n; ++r) {
    const float* z = logits + r * k;
    int64_t arg = 0;
    float mx = z[0];
    for (int64_t j = 1; j < k; ++j)
      if (z[j] > mx) mx = z[j], arg = j;
    double se = 0;
    for (int64_t j = 0; j < k; ++j) se += std::exp(static_cast<double>(z[j] - mx));
    const double lse = std::log(se) + mx;
    const int32_t y = labels[r];
    loss += lse - z[y];
    hits += (arg == y);
    if (dlogits) {
      float* d = dlogits + r * k;
      for (int64_t j = 0; j < k; ++j) {
        const double p = std::exp(static_cast<double>(z[j]) - lse);
        d[j] = static_cast<float>((p - (j == y ? 1.0 : 0.0)) * grad_scale);
      }
    }
  }
  if (correct) *correct = hits;
  return loss;
}

}  // namespace dpt::cpu

// ---- oneDNN engine/stream (see dnnl_util.h) ------------------------------------------------
#include "cpu/dnnl_util.h"
#include "dpt/log.h"

namespace dpt::cpu {

dnnl::engine& dnnl_engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

dnnl::stream& dnnl_stream() {
  static dnnl::stream strm(dnnl_engine());
  return strm;
}

void log_dnnl_choice(const char* what, const std::string& impl) {
  log_debug(std::string("oneDNN ") + what + ": " + impl);
}

}  // namespace dpt::cpu
