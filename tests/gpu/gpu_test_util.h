// Helpers shared by the GPU test suites: skipping without a device, device copies of host vectors
// and tensors, seeded random inputs and the relative comparison every GPU-vs-CPU check uses.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#include "dpt/device.h"
#include "dpt/half.h"
#include "dpt/rng.h"
#include "dpt/tensor.h"

namespace dpt::test {

#define SKIP_WITHOUT_GPU() \
  if (::dpt::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible"

// A device copy of a host vector; host() waits for all queued work, then copies back.
template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(const std::vector<T>& h) : n(h.size()) {
    CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
    if (n) CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaDeviceSynchronize());  // the copy is complete before any stream reads it
  }
  explicit Dev(size_t count) : Dev(std::vector<T>(count)) {}
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  std::vector<T> host() const {
    std::vector<T> h(n);
    CUDA_CHECK(cudaDeviceSynchronize());
    if (n) CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

// The NHWC input offset of output (n, oh, ow)'s kernel tap (kh, kw), or -1 where the tap falls in
// the zero padding: the window walk the host convolution references share.
inline int64_t tap_offset(const ConvGeom& g, int64_t n, int64_t oh, int64_t ow, int64_t kh,
                          int64_t kw) {
  const int64_t ih = oh * g.stride - g.pad + kh, iw = ow * g.stride - g.pad + kw;
  if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) return -1;
  return ((n * g.h + ih) * g.w + iw) * g.c_in;
}

// A copy of a host tensor in the backend's memory, and the host values of one there.
inline Tensor to_device(gpu::CudaBackend& be, const Tensor& host) {
  Tensor dev(host.shape(), &be);
  be.copy_from_host(dev.data(), host.data(), static_cast<size_t>(host.numel()) * sizeof(float));
  return dev;
}
inline std::vector<float> to_host(gpu::CudaBackend& be, const Tensor& dev) {
  std::vector<float> h(static_cast<size_t>(dev.numel()));
  be.copy_to_host(h.data(), dev.data(), h.size() * sizeof(float));
  return h;
}

inline std::vector<float> random(size_t n, uint64_t seed, double lo = -1, double hi = 1) {
  Rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(r.uniform(lo, hi));
  return v;
}

// |gpu - cpu| <= rel * max(1, max |cpu|) element-wise.
inline void expect_close(const std::vector<float>& gpu, const std::vector<float>& cpu,
                         const std::string& what = "", double rel = 1e-5) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  double scale = 0;
  for (float c : cpu) scale = std::max(scale, std::fabs(static_cast<double>(c)));
  for (size_t i = 0; i < gpu.size(); ++i)
    ASSERT_NEAR(gpu[i], cpu[i], rel * std::max(1.0, scale)) << what << ", index " << i;
}

// bf16 bit patterns of fp32 values (rounded to nearest even), and back (exact).
inline std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = bf16_from_float(v[i]);
  return h;
}
inline std::vector<float> from_bf16(const std::vector<uint16_t>& h) {
  std::vector<float> v(h.size());
  for (size_t i = 0; i < h.size(); ++i) v[i] = float_from_bf16(h[i]);
  return v;
}
inline __nv_bfloat16* bf(uint16_t* p) { return reinterpret_cast<__nv_bfloat16*>(p); }

}  // namespace dpt::test
