// BatchNorm kernels and their launchers (see batchnorm.cuh): the sums use the fixed-order double
// reduction of channel_reduce.cuh, the statistics one thread per channel, the element-wise passes
// 32 channels x 8 rows per block, or 16 bytes of a row per thread (vec_rows.cuh). The passes over
// activations are templated on their element type (storage.cuh: fp32 or bf16), so both forms are
// one code.
#include "batchnorm.cuh"
#include "channel_reduce.cuh"
#include "launch_util.cuh"
#include "relu.cuh"
#include "storage.cuh"
#include "vec_rows.cuh"

namespace dpt::cuda {

bool bn_rows_in_16_bytes(int64_t m, int64_t c, int elem_bytes,
                         std::initializer_list<const void*> ptrs) {
  VecRows v;
  return elem_bytes == 2 ? vec_rows<__nv_bfloat16>(m, c, ptrs, &v)
                         : vec_rows<float>(m, c, ptrs, &v);
}

// ----------------------------------------------------------------------------
// BatchNorm forward sums: the fixed-order double reduction of channel_reduce.cuh.

namespace {
// One element's contribution: the same function in the one-element and the 16-byte forms.
template <typename T>
__device__ __forceinline__ void sums_one(T x, double& sum, double& sumsq) {
  const double v = widen(x);
  sum += v;
  sumsq += v * v;
}
struct NoChannels {};
template <typename T>
struct SumsTerm {
  const T* x;
  int64_t c;
  __device__ void operator()(int64_t r, int64_t ch, double* acc) const {
    sums_one(x[r * c + ch], acc[0], acc[1]);
  }
  template <int V>
  __device__ NoChannels channels(int64_t) const {
    return {};
  }
  template <int V>
  __device__ Vec16<T> load(int64_t r, int64_t ch0) const {
    return load16(x + r * c + ch0);
  }
  template <int V>
  __device__ void add(const Vec16<T>& xv, int64_t, int64_t, NoChannels, double (&acc)[2][V]) const {
#pragma unroll
    for (int k = 0; k < V; ++k) sums_one(xv.v[k], acc[0][k], acc[1][k]);
  }
};
struct SumsOut {
  double *sum, *sumsq, *count;
  double m;
  __device__ void operator()(int64_t ch, const double* total) const {
    sum[ch] = total[0];
    sumsq[ch] = total[1];
    if (count && ch == 0) *count = m;
  }
};
}  // namespace

int64_t bn_sums_scratch_elems(int64_t m, int64_t c) { return reduce_scratch_elems(m, c, 2); }

template <typename T>
static cudaError_t bn_sums(const T* x, int64_t m, int64_t c, double* sum, double* sumsq,
                           double* count, double* scratch, cudaStream_t stream) {
  const SumsTerm<T> term{x, c};
  const SumsOut out{sum, sumsq, count, static_cast<double>(m)};
  if (vec_fits<T>(c, {x}))
    return launch_channel_reduce<2, Vec16<T>::kN>(m, c, term, out, scratch, stream);
  return launch_channel_reduce<2>(m, c, term, out, scratch, stream);
}

cudaError_t launch_bn_sums(const float* x, int64_t m, int64_t c, double* sum, double* sumsq,
                           double* count, double* scratch, cudaStream_t stream) {
  return bn_sums(x, m, c, sum, sumsq, count, scratch, stream);
}

cudaError_t launch_bn_sums(const uint16_t* x, int64_t m, int64_t c, double* sum, double* sumsq,
                           double* count, double* scratch, cudaStream_t stream) {
  return bn_sums(as_bf16(x), m, c, sum, sumsq, count, scratch, stream);
}

// ----------------------------------------------------------------------------
// BatchNorm training statistics and running-statistics update: one thread per channel.

static __global__ void bn_stats_kernel(
    const double* __restrict__ sum, const double* __restrict__ sumsq,
    const double* __restrict__ count_p, int64_t c, double momentum, double eps,
    const float* __restrict__ shift, float* __restrict__ running_mean,
    float* __restrict__ running_var, float* __restrict__ num_batches, float* __restrict__ mean_out,
    float* __restrict__ invstd_out) {
  const double count = *count_p;
  DPT_GRID_STRIDE(ch, c) {
    const double mean = sum[ch] / count;
    const double var = fmax(0.0, sumsq[ch] / count - mean * mean);
    mean_out[ch] = static_cast<float>(mean);
    invstd_out[ch] = static_cast<float>(1.0 / sqrt(var + eps));
    const double unbiased = count > 1 ? var * count / (count - 1) : var;
    const double shifted = mean + (shift ? static_cast<double>(shift[ch]) : 0.0);
    running_mean[ch] = static_cast<float>((1 - momentum) * running_mean[ch] + momentum * shifted);
    running_var[ch] = static_cast<float>((1 - momentum) * running_var[ch] + momentum * unbiased);
  }
  if (num_batches && blockIdx.x == 0 && threadIdx.x == 0) *num_batches += 1.f;
}

cudaError_t launch_bn_stats(const double* sum, const double* sumsq, const double* count, int64_t c,
                            double momentum, double eps, const float* shift, float* running_mean,
                            float* running_var, float* num_batches_tracked, float* mean,
                            float* invstd, cudaStream_t stream) {
  if (c <= 0) return cudaSuccess;
  bn_stats_kernel<<<blocks_for(c), kThreads, 0, stream>>>(sum, sumsq, count, c, momentum, eps,
                                                          shift, running_mean, running_var,
                                                          num_batches_tracked, mean, invstd);
  return cudaGetLastError();
}

// ----------------------------------------------------------------------------
// BatchNorm evaluation statistics: one thread per channel.

static __global__ void bn_eval_stats_kernel(const float* __restrict__ running_mean,
                                            const float* __restrict__ running_var, int64_t c,
                                            double eps, float* __restrict__ mean,
                                            float* __restrict__ invstd) {
  DPT_GRID_STRIDE(ch, c) {
    mean[ch] = running_mean[ch];
    invstd[ch] = static_cast<float>(1.0 / sqrt(static_cast<double>(running_var[ch]) + eps));
  }
}

cudaError_t launch_bn_eval_stats(const float* running_mean, const float* running_var, int64_t c,
                                 double eps, float* mean, float* invstd, cudaStream_t stream) {
  if (c <= 0) return cudaSuccess;
  bn_eval_stats_kernel<<<blocks_for(c), kThreads, 0, stream>>>(running_mean, running_var, c, eps,
                                                               mean, invstd);
  return cudaGetLastError();
}

// ----------------------------------------------------------------------------
// BatchNorm apply: 32 channels x 8 rows per block, the channel's scale and shift in registers; one
// instantiation per epilogue (residual add, ReLU), so the plain form keeps its own kernel. Where
// vec_rows.cuh's 16-byte form applies (every ResNet layer: channels a multiple of 8), its kernel
// runs instead; both compute each element with the functions below, so they give the same bits.

__device__ __forceinline__ void bn_scale_shift(const float* __restrict__ mean,
                                               const float* __restrict__ invstd,
                                               const float* __restrict__ gamma,
                                               const float* __restrict__ beta, int64_t ch,
                                               float& scale, float& shift) {
  scale = gamma[ch] * invstd[ch];
  shift = beta[ch] - mean[ch] * scale;
}

// The value the unfused kernel stored (its expression, so nvcc contracts it the same way), then
// add_kernel's sum, then the ReLU; one rounding at the end (a bf16 y). res is read only with
// kResidual.
template <bool kResidual, bool kRelu, typename T>
__device__ __forceinline__ void bn_apply_one(T x, T res, float scale, float shift, T& y) {
  float v = widen(x) * scale + shift;
  if (kResidual) v = v + widen(res);
  if (kRelu) v = relu_value(v);
  store(v, y);
}

template <typename T, bool kResidual, bool kRelu>
static __global__ void bn_apply_kernel(const T* __restrict__ x, T* __restrict__ y,
                                       const float* __restrict__ mean,
                                       const float* __restrict__ invstd,
                                       const float* __restrict__ gamma,
                                       const float* __restrict__ beta,
                                       const T* __restrict__ residual, int64_t m, int64_t c) {
  const int64_t ch = blockIdx.x * static_cast<int64_t>(kReduceLanes) + threadIdx.x;
  if (ch >= c) return;
  float scale, shift;
  bn_scale_shift(mean, invstd, gamma, beta, ch, scale, shift);
  for (int64_t r = blockIdx.y * static_cast<int64_t>(kReduceRowLanes) + threadIdx.y; r < m;
       r += static_cast<int64_t>(gridDim.y) * kReduceRowLanes) {
    const int64_t i = r * c + ch;
    bn_apply_one<kResidual, kRelu>(x[i], kResidual ? residual[i] : x[i], scale, shift, y[i]);
  }
}

template <typename T, bool kResidual, bool kRelu>
static __global__ void __launch_bounds__(kVecThreads)
    bn_apply_vec_kernel(const T* __restrict__ x, T* __restrict__ y, const float* __restrict__ mean,
                        const float* __restrict__ invstd, const float* __restrict__ gamma,
                        const float* __restrict__ beta, const T* __restrict__ residual, int64_t m,
                        int64_t c, int64_t cols, int64_t rows_per_block) {
  constexpr int kV = Vec16<T>::kN;
  const int64_t col = threadIdx.x % cols, row = threadIdx.x / cols;
  if (row >= rows_per_block) return;
  const int64_t ch0 = col * kV;
  float scale[kV], shift[kV];
#pragma unroll
  for (int k = 0; k < kV; ++k)
    bn_scale_shift(mean, invstd, gamma, beta, ch0 + k, scale[k], shift[k]);
  for (int64_t r = blockIdx.x * rows_per_block + row; r < m;
       r += static_cast<int64_t>(gridDim.x) * rows_per_block) {
    const int64_t i = r * c + ch0;
    const Vec16<T> xv = load16(x + i);
    const Vec16<T> rv = kResidual ? load16(residual + i) : xv;
    Vec16<T> yv;
#pragma unroll
    for (int k = 0; k < kV; ++k)
      bn_apply_one<kResidual, kRelu>(xv.v[k], rv.v[k], scale[k], shift[k], yv.v[k]);
    store16(yv, y + i);
  }
}

template <typename T>
static cudaError_t bn_apply(const T* x, T* y, const float* mean, const float* invstd,
                            const float* gamma, const float* beta, int64_t m, int64_t c,
                            const T* residual, bool relu, cudaStream_t stream) {
  if (m <= 0 || c <= 0) return cudaSuccess;
  if (c > kMaxChannels) return cudaErrorInvalidValue;
  VecRows v;
  if (vec_rows<T>(m, c, {x, y, residual}, &v)) {
    auto* kernel =
        residual
            ? (relu ? bn_apply_vec_kernel<T, true, true> : bn_apply_vec_kernel<T, true, false>)
            : (relu ? bn_apply_vec_kernel<T, false, true> : bn_apply_vec_kernel<T, false, false>);
    kernel<<<v.grid, kVecThreads, 0, stream>>>(x, y, mean, invstd, gamma, beta, residual, m, c,
                                               v.cols, v.rows_per_block);
    return cudaGetLastError();
  }
  const dim3 grid = rows_grid(m, c), block(kReduceLanes, kReduceRowLanes);
  auto* kernel = residual
                     ? (relu ? bn_apply_kernel<T, true, true> : bn_apply_kernel<T, true, false>)
                     : (relu ? bn_apply_kernel<T, false, true> : bn_apply_kernel<T, false, false>);
  kernel<<<grid, block, 0, stream>>>(x, y, mean, invstd, gamma, beta, residual, m, c);
  return cudaGetLastError();
}

cudaError_t launch_bn_apply(const float* x, float* y, const float* mean, const float* invstd,
                            const float* gamma, const float* beta, int64_t m, int64_t c,
                            const float* residual, bool relu, cudaStream_t stream) {
  return bn_apply(x, y, mean, invstd, gamma, beta, m, c, residual, relu, stream);
}

cudaError_t launch_bn_apply(const uint16_t* x, uint16_t* y, const float* mean, const float* invstd,
                            const float* gamma, const float* beta, int64_t m, int64_t c,
                            const uint16_t* residual, bool relu, cudaStream_t stream) {
  return bn_apply(as_bf16(x), as_bf16(y), mean, invstd, gamma, beta, m, c, as_bf16(residual), relu,
                  stream);
}

// ----------------------------------------------------------------------------
// BatchNorm backward sums: the fixed-order double reduction of channel_reduce.cuh.

namespace {
// The gradient BatchNorm takes: dy, or dy through the fused ReLU whose output is y (the sums and
// the apply pass alike).
template <bool kRelu, typename T>
__device__ __forceinline__ float bn_grad_in(T y, T dy) {
  return kRelu ? relu_grad(widen(y), widen(dy)) : widen(dy);
}
// One element's contribution (g, and g xhat), returning g: the same function in the one-element
// and the 16-byte forms. y is read only with relu.
template <typename T>
__device__ __forceinline__ float backward_one(bool relu, T y, T dy, T x, float mean, float invstd,
                                              double& sum_g, double& sum_g_xhat) {
  const float g = relu ? bn_grad_in<true>(y, dy) : bn_grad_in<false>(y, dy);
  sum_g += g;
  sum_g_xhat += static_cast<double>(g) * ((widen(x) - mean) * invstd);
  return g;
}
template <int V>
struct MeanInvstd {
  float mean[V], invstd[V];
};
// Each (row, channel) is visited once, so the masked gradient can be stored (dz) as it is summed.
// (g is dy or 0, so a bf16 dz holds it exactly.)
template <typename T>
struct BackwardTerm {
  const T *x, *dy, *relu_out;
  const float *mean, *invstd;
  T* dz;
  int64_t c;
  __device__ void operator()(int64_t r, int64_t ch, double* acc) const {
    const int64_t i = r * c + ch;
    const float g = backward_one(relu_out != nullptr, relu_out ? relu_out[i] : dy[i], dy[i], x[i],
                                 mean[ch], invstd[ch], acc[0], acc[1]);
    if (dz) store(g, dz[i]);
  }
  template <int V>
  __device__ MeanInvstd<V> channels(int64_t ch0) const {
    MeanInvstd<V> s;
#pragma unroll
    for (int k = 0; k < V; ++k) s.mean[k] = mean[ch0 + k], s.invstd[k] = invstd[ch0 + k];
    return s;
  }
  // One row's dy, x and (with the fused ReLU) y.
  struct Row {
    Vec16<T> dy, x, y;
  };
  template <int V>
  __device__ Row load(int64_t r, int64_t ch0) const {
    const int64_t i = r * c + ch0;
    Row l;
    l.dy = load16(dy + i);
    l.x = load16(x + i);
    l.y = relu_out ? load16(relu_out + i) : l.dy;
    return l;
  }
  template <int V>
  __device__ void add(const Row& l, int64_t r, int64_t ch0, const MeanInvstd<V>& s,
                      double (&acc)[2][V]) const {
    Vec16<T> zv;
#pragma unroll
    for (int k = 0; k < V; ++k)
      store(backward_one(relu_out != nullptr, l.y.v[k], l.dy.v[k], l.x.v[k], s.mean[k], s.invstd[k],
                         acc[0][k], acc[1][k]),
            zv.v[k]);
    if (dz) store16(zv, dz + r * c + ch0);
  }
};
struct BackwardOut {
  double *sum_dy, *sum_dy_xhat;
  float *dgamma, *dbeta;
  bool accumulate;
  __device__ void operator()(int64_t ch, const double* total) const {
    sum_dy[ch] = total[0];
    sum_dy_xhat[ch] = total[1];
    if (dgamma) dgamma[ch] = static_cast<float>((accumulate ? dgamma[ch] : 0.0) + total[1]);
    if (dbeta) dbeta[ch] = static_cast<float>((accumulate ? dbeta[ch] : 0.0) + total[0]);
  }
};
}  // namespace

int64_t bn_backward_sums_scratch_elems(int64_t m, int64_t c) {
  return reduce_scratch_elems(m, c, 2);
}

template <typename T>
static cudaError_t bn_backward_sums(const T* x, const T* dy, const T* relu_out, const float* mean,
                                    const float* invstd, int64_t m, int64_t c, double* sum_dy,
                                    double* sum_dy_xhat, float* dgamma, float* dbeta,
                                    bool accumulate, T* dz, double* scratch, cudaStream_t stream) {
  const BackwardTerm<T> term{x, dy, relu_out, mean, invstd, dz, c};
  const BackwardOut out{sum_dy, sum_dy_xhat, dgamma, dbeta, accumulate};
  if (vec_fits<T>(c, {x, dy, relu_out, dz}))
    return launch_channel_reduce<2, Vec16<T>::kN>(m, c, term, out, scratch, stream);
  return launch_channel_reduce<2>(m, c, term, out, scratch, stream);
}

cudaError_t launch_bn_backward_sums(const float* x, const float* dy, const float* relu_out,
                                    const float* mean, const float* invstd, int64_t m, int64_t c,
                                    double* sum_dy, double* sum_dy_xhat, float* dgamma,
                                    float* dbeta, bool accumulate, float* dz, double* scratch,
                                    cudaStream_t stream) {
  return bn_backward_sums(x, dy, relu_out, mean, invstd, m, c, sum_dy, sum_dy_xhat, dgamma, dbeta,
                          accumulate, dz, scratch, stream);
}

cudaError_t launch_bn_backward_sums(const uint16_t* x, const uint16_t* dy, const uint16_t* relu_out,
                                    const float* mean, const float* invstd, int64_t m, int64_t c,
                                    double* sum_dy, double* sum_dy_xhat, float* dgamma,
                                    float* dbeta, bool accumulate, uint16_t* dz, double* scratch,
                                    cudaStream_t stream) {
  return bn_backward_sums(as_bf16(x), as_bf16(dy), as_bf16(relu_out), mean, invstd, m, c, sum_dy,
                          sum_dy_xhat, dgamma, dbeta, accumulate, as_bf16(dz), scratch, stream);
}

// ----------------------------------------------------------------------------
// BatchNorm backward apply: 32 channels x 8 rows per block, per-channel coefficients in registers.

// dx of one element: after a training forward from the batch sums (b = mean g, d = mean g xhat),
// after an evaluation forward g a. Shared by the two kernels below (the same bits).
__device__ __forceinline__ float bn_dx_train(float g, float x, float a, float b, float d, float mu,
                                             float is) {
  const float xhat = (x - mu) * is;
  return a * (g - b - xhat * d);
}
__device__ __forceinline__ float bn_dx_eval(float g, float a) { return g * a; }

template <typename T>
static __global__ void bn_backward_apply_kernel(
    const T* __restrict__ x, const T* __restrict__ dy, const T* __restrict__ relu_out,
    const float* __restrict__ mean, const float* __restrict__ invstd,
    const float* __restrict__ gamma, const double* __restrict__ sum_dy,
    const double* __restrict__ sum_dy_xhat, const double* __restrict__ count_p, int64_t m,
    int64_t c, T* __restrict__ dx) {
  const int64_t ch = blockIdx.x * static_cast<int64_t>(kReduceLanes) + threadIdx.x;
  if (ch >= c) return;
  const float a = gamma[ch] * invstd[ch];
  const int64_t r0 = blockIdx.y * static_cast<int64_t>(kReduceRowLanes) + threadIdx.y;
  const int64_t step = static_cast<int64_t>(gridDim.y) * kReduceRowLanes;
  // The same test in every thread.
  auto grad = [&](int64_t i) {
    return relu_out ? bn_grad_in<true>(relu_out[i], dy[i]) : bn_grad_in<false>(dy[i], dy[i]);
  };
  if (sum_dy == nullptr) {
    for (int64_t r = r0; r < m; r += step) store(bn_dx_eval(grad(r * c + ch), a), dx[r * c + ch]);
    return;
  }
  const double count = *count_p;
  const float b = static_cast<float>(sum_dy[ch] / count);
  const float d = static_cast<float>(sum_dy_xhat[ch] / count);
  const float mu = mean[ch], is = invstd[ch];
  for (int64_t r = r0; r < m; r += step) {
    const int64_t i = r * c + ch;
    store(bn_dx_train(grad(i), widen(x[i]), a, b, d, mu, is), dx[i]);
  }
}

// The 16-byte form (vec_rows.cuh); kTrain: after a training forward (the batch sums given).
template <typename T, bool kRelu, bool kTrain>
static __global__ void __launch_bounds__(kVecThreads)
    bn_backward_apply_vec_kernel(const T* __restrict__ x, const T* __restrict__ dy,
                                 const T* __restrict__ relu_out, const float* __restrict__ mean,
                                 const float* __restrict__ invstd, const float* __restrict__ gamma,
                                 const double* __restrict__ sum_dy,
                                 const double* __restrict__ sum_dy_xhat,
                                 const double* __restrict__ count_p, int64_t m, int64_t c,
                                 T* __restrict__ dx, int64_t cols, int64_t rows_per_block) {
  constexpr int kV = Vec16<T>::kN;
  const int64_t col = threadIdx.x % cols, row = threadIdx.x / cols;
  if (row >= rows_per_block) return;
  const int64_t ch0 = col * kV;
  float a[kV], b[kV], d[kV], mu[kV], is[kV];
  const double count = kTrain ? *count_p : 1.0;
#pragma unroll
  for (int k = 0; k < kV; ++k) {
    const int64_t ch = ch0 + k;
    a[k] = gamma[ch] * invstd[ch];
    if (kTrain) {
      b[k] = static_cast<float>(sum_dy[ch] / count);
      d[k] = static_cast<float>(sum_dy_xhat[ch] / count);
      mu[k] = mean[ch];
      is[k] = invstd[ch];
    }
  }
  for (int64_t r = blockIdx.x * rows_per_block + row; r < m;
       r += static_cast<int64_t>(gridDim.x) * rows_per_block) {
    const int64_t i = r * c + ch0;
    const Vec16<T> gv = load16(dy + i);
    const Vec16<T> yv = kRelu ? load16(relu_out + i) : gv;
    Vec16<T> xv, out;
    if (kTrain) xv = load16(x + i);
#pragma unroll
    for (int k = 0; k < kV; ++k) {
      const float g = bn_grad_in<kRelu>(yv.v[k], gv.v[k]);
      store(kTrain ? bn_dx_train(g, widen(xv.v[k]), a[k], b[k], d[k], mu[k], is[k])
                   : bn_dx_eval(g, a[k]),
            out.v[k]);
    }
    store16(out, dx + i);
  }
}

template <typename T>
static cudaError_t bn_backward_apply(const T* x, const T* dy, const T* relu_out, const float* mean,
                                     const float* invstd, const float* gamma, const double* sum_dy,
                                     const double* sum_dy_xhat, const double* count, int64_t m,
                                     int64_t c, T* dx, cudaStream_t stream) {
  if (m <= 0 || c <= 0) return cudaSuccess;
  if (c > kMaxChannels || (sum_dy && (!sum_dy_xhat || !count))) return cudaErrorInvalidValue;
  VecRows v;
  if (vec_rows<T>(m, c, {x, dy, relu_out, dx}, &v)) {
    const bool train = sum_dy != nullptr;
    auto* kernel = relu_out ? (train ? bn_backward_apply_vec_kernel<T, true, true>
                                     : bn_backward_apply_vec_kernel<T, true, false>)
                            : (train ? bn_backward_apply_vec_kernel<T, false, true>
                                     : bn_backward_apply_vec_kernel<T, false, false>);
    kernel<<<v.grid, kVecThreads, 0, stream>>>(x, dy, relu_out, mean, invstd, gamma, sum_dy,
                                               sum_dy_xhat, count, m, c, dx, v.cols,
                                               v.rows_per_block);
    return cudaGetLastError();
  }
  bn_backward_apply_kernel<<<rows_grid(m, c), dim3(kReduceLanes, kReduceRowLanes), 0, stream>>>(
      x, dy, relu_out, mean, invstd, gamma, sum_dy, sum_dy_xhat, count, m, c, dx);
  return cudaGetLastError();
}

cudaError_t launch_bn_backward_apply(const float* x, const float* dy, const float* relu_out,
                                     const float* mean, const float* invstd, const float* gamma,
                                     const double* sum_dy, const double* sum_dy_xhat,
                                     const double* count, int64_t m, int64_t c, float* dx,
                                     cudaStream_t stream) {
  return bn_backward_apply(x, dy, relu_out, mean, invstd, gamma, sum_dy, sum_dy_xhat, count, m, c,
                           dx, stream);
}

cudaError_t launch_bn_backward_apply(const uint16_t* x, const uint16_t* dy,
                                     const uint16_t* relu_out, const float* mean,
                                     const float* invstd, const float* gamma, const double* sum_dy,
                                     const double* sum_dy_xhat, const double* count, int64_t m,
                                     int64_t c, uint16_t* dx, cudaStream_t stream) {
  return bn_backward_apply(as_bf16(x), as_bf16(dy), as_bf16(relu_out), mean, invstd, gamma, sum_dy,
                           sum_dy_xhat, count, m, c, as_bf16(dx), stream);
}

}  // namespace dpt::cuda
