// The per-rank GPU execution context of the op backend: one stream, the cuDNN and cuBLAS handles
// bound to it, and one grow-only scratch workspace. Create one per rank, once, and share it.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>
#include <cstdint>

namespace dpt::gpu {

// Owning device allocation (bytes), freed on destruction; move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_) {
    o.p_ = nullptr, o.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }
  // How many device allocations this process has made so far (every DeviceBuffer of nonzero size).
  // A CUDA graph holds raw pointers: one captured when this was N stays valid while it is still N.
  static uint64_t allocations();
  // Counts a device allocation made outside DeviceBuffer (CudaBackend::allocate), so the count
  // above stays complete.
  static void note_allocation();

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// Carves one workspace request into pieces, each aligned for any cuDNN/cuBLAS/kernel use: add()
// every piece first, then take workspace(total()) once and offset into it.
class WorkspaceLayout {
 public:
  static constexpr size_t kAlign = 256;
  size_t add(size_t bytes) {
    const size_t at = total_;
    total_ += (bytes + kAlign - 1) / kAlign * kAlign;
    return at;
  }
  size_t total() const { return total_; }

 private:
  size_t total_ = 0;
};

class GpuContext {
 public:
  // Makes `device` current for this thread and creates the stream and both handles. The stream is
  // non-blocking: while it is captured into a CUDA graph, work on the legacy default stream from
  // any thread (a library's plain cudaMemcpy) would invalidate the capture of a blocking stream.
  // So nothing orders itself with it implicitly: host code synchronises it (or the device) first.
  explicit GpuContext(int device);
  ~GpuContext();
  GpuContext(const GpuContext&) = delete;
  GpuContext& operator=(const GpuContext&) = delete;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  cudnnHandle_t cudnn() const { return cudnn_; }
  cublasHandle_t cublas() const { return cublas_; }

  // At least `bytes` of scratch on the device, valid until the next call that asks for more (which
  // waits for this stream, so work still queued on the old buffer finishes before it is freed).
  // One op call takes it once; ops run in stream order, so they can all share it.
  void* workspace(size_t bytes);
  size_t workspace_bytes() const { return workspace_.bytes(); }
  // Grow-only scratch apart from the workspace, kStagingSlots of it, each as workspace() (valid
  // until the next call that asks the same slot for more): what an op call keeps while it also
  // takes the workspace (or calls an op that does), which may move it. The 16-bit activations'
  // staging: the legacy convolution's fp32 copies of bf16 activations, the graph convolution's bf16
  // copy of its fp32 weights, a bf16 Linear's fp32 result before its bias.
  static constexpr int kStagingSlots = 2;
  void* staging(int slot, size_t bytes);
  // A device vector of at least n ones (grow-only): the broadcast operand of bias additions.
  const float* ones(int64_t n);
  // Waits for everything queued on the stream.
  void synchronize();
  // --tf32: lets cuBLAS (math mode) and cuDNN (convolutions planned from now on) use TF32 tensor
  // cores for fp32 data: faster, with 10-bit mantissa products, so results leave the CPU's
  // agreement. Off by default. Set it before the first convolution runs.
  void set_tf32(bool allow);
  bool tf32() const { return tf32_; }
  // --precision bf16: convolutions and Linear GEMMs take bf16 operands (cast from the fp32
  // activations and master weights into the workspace), accumulate in fp32 on tensor cores, and
  // give fp32 results (a convolution's outputs, dW included, pass through bf16 first); the
  // gradient buffers, the optimizer and the all-reduce stay fp32. Set it before the first
  // convolution runs.
  void set_bf16(bool on) { bf16_ = on; }
  bool bf16() const { return bf16_; }
  // Whether convolution algorithms may use tensor cores: TF32 allowed, or bf16 operands.
  bool tensor_ops() const { return tf32_ || bf16_; }
  // --cudnn-nondeterministic: cuDNN's non-deterministic algorithms and engines compete in the plan
  // searches from now on, beside the deterministic ones (without it they are taken only where a
  // convolution has no deterministic one, with a warning). Set it before the first convolution.
  void set_nondeterministic(bool allow) { nondeterministic_ = allow; }
  bool nondeterministic() const { return nondeterministic_; }

 private:
  void create();
  void release() noexcept;

  int device_;
  bool tf32_ = false;
  bool bf16_ = false;
  bool nondeterministic_ = false;
  cudaStream_t stream_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  DeviceBuffer workspace_;
  DeviceBuffer staging_[kStagingSlots];
  DeviceBuffer ones_;
  DeviceBuffer cublas_workspace_;  // fixed, so cuBLAS never allocates while a graph is captured
};

}  // namespace dpt::gpu
