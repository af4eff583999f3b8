// CudaBackend (see cuda_backend.h): device memory on the context's stream, and each layer operation
// as one call into cuDNN (CudnnConv), cuBLAS (cublas_linear.h), GpuBatchNorm or a kernels/ launch.
// Nothing here waits for the device except release and the host copies. Only in GPU builds.
#include "cuda/cuda_backend.h"

#include <string>

#include "add.cuh"
#include "avgpool_backward.cuh"
#include "avgpool_forward.cuh"
#include "cuda/cublas_linear.h"
#include "cuda/cuda_check.h"
#include "cuda/cudnn_conv.h"
#include "cuda/gpu_batchnorm.h"
#include "global_avgpool_backward.cuh"
#include "global_avgpool_forward.cuh"
#include "permute_nhwc_chw.cuh"
#include "relu_backward.cuh"
#include "relu_forward.cuh"

namespace dpt::gpu {

CudaBackend::CudaBackend(int device) : ctx_(std::make_unique<GpuContext>(device)) {}

CudaBackend::~CudaBackend() {
  // An abandoned stream may never drain, and destroying the context waits for it: leak it instead
  // (the process is about to end).
  if (abandoned_) (void)ctx_.release();
}

// ---- memory --------------------------------------------------------------------------------------

void* CudaBackend::allocate(size_t bytes) {
  bytes = bytes > 0 ? bytes : 1;  // never null, as on the CPU: null means "no storage" to callers
  void* p = nullptr;
  // The message names the size: an out-of-memory report is useless without it.
  DPT_LIB_CHECK("CUDA", cudaMalloc(&p, bytes), ::dpt::detail::cuda_failed, [bytes](cudaError_t e) {
    return ::dpt::detail::cuda_message(e) + " (allocating " + std::to_string(bytes) + " bytes)";
  });
  // Counted like every DeviceBuffer: a CUDA graph captured before this allocation may hold
  // pointers to storage this one replaces, so StreamGraph must see the count move.
  DeviceBuffer::note_allocation();
  try {
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, ctx_->stream()));
  } catch (...) {
    cudaFree(p);
    throw;
  }
  return p;
}

void CudaBackend::release(void* p) noexcept {
  // Abandoned: the stream may never drain, so waiting for it would hang the teardown; leak.
  if (abandoned_ || p == nullptr) return;
  // Queued kernels may still read or write p; errors are ignored (nothing may throw here).
  cudaStreamSynchronize(ctx_->stream());
  cudaFree(p);
}

void CudaBackend::zero(void* p, size_t bytes) {
  if (bytes > 0) CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, ctx_->stream()));
}

void CudaBackend::copy_to_host(void* host, const void* src, size_t bytes) {
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, ctx_->stream()));
  ctx_->synchronize();  // pageable host memory: the copy is complete only after this
}

void CudaBackend::copy_from_host(void* dst, const void* host, size_t bytes) {
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, ctx_->stream()));
  ctx_->synchronize();  // the caller may reuse `host` as soon as this returns
}

void CudaBackend::copy(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx_->stream()));
}

// ---- layer operations ----------------------------------------------------------------------------

std::unique_ptr<ConvOp> CudaBackend::make_conv() { return std::make_unique<CudnnConv>(*ctx_); }

std::unique_ptr<BatchNormOp> CudaBackend::make_batchnorm(int64_t channels, double momentum, double eps) {
  return std::make_unique<GpuBatchNorm>(*ctx_, channels, momentum, eps);
}

void CudaBackend::relu_forward(const float* x, float* y, int64_t n) {
  CUDA_CHECK(cuda::launch_relu_forward(x, y, n, ctx_->stream()));
}

void CudaBackend::relu_backward(const float* y, const float* dy, float* dx, int64_t n) {
  CUDA_CHECK(cuda::launch_relu_backward(y, dy, dx, n, ctx_->stream()));
}

void CudaBackend::add(const float* a, const float* b, float* y, int64_t n, bool relu) {
  CUDA_CHECK(cuda::launch_add(a, b, y, n, relu, ctx_->stream()));
}

void CudaBackend::avgpool_forward(const float* x, float* y, int64_t n, int64_t h, int64_t w, int64_t c, int k, int s,
                                  bool relu) {
  CUDA_CHECK(cuda::launch_avgpool_forward(x, y, n, h, w, c, k, s, relu, ctx_->stream()));
}

void CudaBackend::avgpool_backward(const float* dy, const float* relu_input, float* dx, int64_t n, int64_t h,
                                   int64_t w, int64_t c, int k, int s) {
  CUDA_CHECK(cuda::launch_avgpool_backward(dy, relu_input, dx, n, h, w, c, k, s, ctx_->stream()));
}

void CudaBackend::global_avgpool_forward(const float* x, float* y, int64_t n, int64_t hw, int64_t c) {
  CUDA_CHECK(cuda::launch_global_avgpool_forward(x, y, n, hw, c, ctx_->stream()));
}

void CudaBackend::global_avgpool_backward(const float* dy, float* dx, int64_t n, int64_t hw, int64_t c) {
  CUDA_CHECK(cuda::launch_global_avgpool_backward(dy, dx, n, hw, c, ctx_->stream()));
}

void CudaBackend::flatten(const float* x, float* y, int64_t n, int64_t h, int64_t w, int64_t c, bool to_chw) {
  // The kernel's to_chw has the interface's meaning: true for Flatten's forward, false for its backward.
  CUDA_CHECK(cuda::launch_permute_nhwc_chw(x, y, n, h, w, c, to_chw, ctx_->stream()));
}

// gpu:: qualified: the members of the same names would hide cublas_linear.h's functions.
void CudaBackend::linear_forward(const float* x, const float* w, const float* b, float* y, int64_t n, int64_t in,
                                 int64_t out) {
  gpu::linear_forward(*ctx_, x, w, b, y, n, in, out);
}

void CudaBackend::linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                                  int64_t n, int64_t in, int64_t out, bool accumulate) {
  gpu::linear_backward(*ctx_, x, w, dy, dx, dw, db, n, in, out, accumulate);
}

}  // namespace dpt::gpu
