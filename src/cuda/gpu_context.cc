// GpuContext (see gpu_context.h): stream, cuDNN and cuBLAS handles created once per rank; the
// shared grow-only workspace and ones vector. Only compiled in GPU builds.
#include "cuda/gpu_context.h"

#include <atomic>
#include <utility>
#include <vector>

#include "cuda/cuda_check.h"

namespace dpt::gpu {

namespace {
std::atomic<uint64_t> g_allocations{0};
}  // namespace

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes_ > 0) {
    CUDA_CHECK(cudaMalloc(&p_, bytes_));
    note_allocation();
  }
}

uint64_t DeviceBuffer::allocations() { return g_allocations.load(std::memory_order_relaxed); }

void DeviceBuffer::note_allocation() { g_allocations.fetch_add(1, std::memory_order_relaxed); }

DeviceBuffer::~DeviceBuffer() {
  if (p_) cudaFree(p_);  // no throwing from a destructor; a failed free leaks, nothing worse
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (p_) cudaFree(p_);
    p_ = std::exchange(o.p_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

GpuContext::GpuContext(int device) : device_(device) {
  try {
    create();
  } catch (...) {
    release();  // the destructor does not run for a half-built object
    throw;
  }
}

void GpuContext::create() {
  CUDA_CHECK(cudaSetDevice(device_));
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  CUDNN_CHECK(cudnnCreate(&cudnn_));
  CUDNN_CHECK(cudnnSetStream(cudnn_, stream_));
  CUBLAS_CHECK(cublasCreate(&cublas_));
  CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
  // fp32 GEMMs in full fp32: the default math mode never uses TF32 (only CUBLAS_TF32_TENSOR_OP_MATH
  // would), so results match the CPU backend to fp32 rounding. Set explicitly so nobody's later
  // default change slips in. Scalars (alpha, beta) are host values.
  CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
  CUBLAS_CHECK(cublasSetPointerMode(cublas_, CUBLAS_POINTER_MODE_HOST));
  // An explicit workspace (32 MiB, NVIDIA's advice for Hopper) instead of cuBLAS's own: the memory
  // is fixed from the start and no GEMM captured into a CUDA graph allocates.
  cublas_workspace_ = DeviceBuffer(size_t{32} << 20);
  CUBLAS_CHECK(
      cublasSetWorkspace(cublas_, cublas_workspace_.as<void>(), cublas_workspace_.bytes()));
}

GpuContext::~GpuContext() { release(); }

void GpuContext::release() noexcept {
  // Teardown must not throw: queued work is drained, then everything is released best-effort.
  if (stream_) cudaStreamSynchronize(stream_);
  workspace_ = DeviceBuffer();
  for (DeviceBuffer& b : staging_) b = DeviceBuffer();
  ones_ = DeviceBuffer();
  if (cublas_) cublasDestroy(cublas_);
  cublas_workspace_ = DeviceBuffer();  // after the handle that uses it
  if (cudnn_) cudnnDestroy(cudnn_);
  if (stream_) cudaStreamDestroy(stream_);
  cublas_ = nullptr, cudnn_ = nullptr, stream_ = nullptr;
}

namespace {
// buf holding at least `bytes`, grown in 1 MiB steps; the old buffer may still be read by kernels
// queued on `stream`, so that drains first.
void* grown(DeviceBuffer& buf, size_t bytes, cudaStream_t stream) {
  if (bytes > buf.bytes()) {
    constexpr size_t kStep = size_t{1} << 20;
    CUDA_CHECK(cudaStreamSynchronize(stream));
    buf = DeviceBuffer();
    buf = DeviceBuffer((bytes + kStep - 1) / kStep * kStep);
  }
  return buf.as<void>();
}
}  // namespace

void* GpuContext::workspace(size_t bytes) { return grown(workspace_, bytes, stream_); }

void* GpuContext::staging(int slot, size_t bytes) {
  DPT_CHECK(slot >= 0 && slot < kStagingSlots, "GPU staging slot " << slot << " does not exist");
  return grown(staging_[slot], bytes, stream_);
}

const float* GpuContext::ones(int64_t n) {
  const size_t need = static_cast<size_t>(n < 1 ? 1 : n) * sizeof(float);
  if (need > ones_.bytes()) {
    constexpr size_t kStep = size_t{1} << 18;  // 64 Ki floats
    const size_t bytes = (need + kStep - 1) / kStep * kStep;
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    ones_ = DeviceBuffer();
    ones_ = DeviceBuffer(bytes);
    const std::vector<float> host(bytes / sizeof(float), 1.f);
    CUDA_CHECK(
        cudaMemcpyAsync(ones_.as<void>(), host.data(), bytes, cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));  // `host` dies at the end of this scope
  }
  return ones_.as<float>();
}

void GpuContext::synchronize() { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

void GpuContext::set_tf32(bool allow) {
  CUBLAS_CHECK(
      cublasSetMathMode(cublas_, allow ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  tf32_ = allow;
}

}  // namespace dpt::gpu
