// The GPU executor of a host Model: it walks the built layer tree (Layer::spec) and builds a device
// counterpart of every layer, over ONE device allocation each for parameters, gradients and buffers
// laid out at the host flat buffers' offsets, so gradient buckets are the same contiguous slices.
#pragma once

#include <cstdint>
#include <memory>

#include "cuda/gpu_batchnorm.h"
#include "cuda/gpu_context.h"
#include "dpt/nn.h"

namespace dpt::gpu {

// A device float array with a shape, grow-only like dpt::Tensor (activations allocate once).
class DeviceTensor {
 public:
  // Reallocates only when more elements than ever before are needed; it first waits for ctx's
  // stream, since queued kernels may still use the old storage. Contents are not kept.
  void resize(GpuContext& ctx, const Shape& shape);
  float* data() { return data_; }
  const float* data() const { return data_; }
  const Shape& shape() const { return shape_; }
  int64_t numel() const { return shape_numel(shape_); }
  int64_t dim(int i) const { return shape_[static_cast<size_t>(i < 0 ? i + rank() : i)]; }
  int rank() const { return static_cast<int>(shape_.size()); }

 private:
  DeviceBuffer storage_;
  float* data_ = nullptr;
  Shape shape_;
  int64_t capacity_ = 0;
};

class GpuNode;  // one layer's device counterpart (gpu_model.cc)

// Where device layers find their parameters: host Param offsets into these base pointers.
struct DeviceParams {
  float* params = nullptr;   // num_params floats, host layout
  float* grads = nullptr;    // same layout
  float* buffers = nullptr;  // num_buffers floats (BatchNorm running statistics, counters)
  DeviceSumFn bn_sync;       // synchronised BatchNorm (empty: per-replica statistics)
};

class GpuModel {
 public:
  // Builds the device layers of `model` (which must outlive this) on ctx, allocates the flat device
  // buffers and copies the host parameters and buffers in. A layer kind without a GPU version is
  // refused with an error naming the layer, its kind and input shape.
  GpuModel(Model& model, GpuContext& ctx);
  ~GpuModel();
  GpuModel(const GpuModel&) = delete;
  GpuModel& operator=(const GpuModel&) = delete;

  Model& host() { return model_; }
  GpuContext& context() { return ctx_; }
  float* params() { return dev_.params; }
  float* grads() { return dev_.grads; }
  float* buffers() { return dev_.buffers; }
  int64_t num_params() const { return model_.store().num_params(); }
  int64_t num_buffers() const { return model_.store().num_buffers(); }

  // Host store -> device (parameters and buffers) and back, on ctx's stream; both wait until done.
  // Callers must make sure nothing else queued can block the stream forever (see GpuReducer::quiesce).
  void upload();
  void download();
  // Device -> host copies of one flat array into `host` (num_params or num_buffers floats).
  void copy_params_to(float* host);
  void copy_grads_to(float* host);
  void copy_buffers_to(float* host);
  void upload_buffers();
  void download_buffers();

  // Synchronised BatchNorm: every BatchNorm layer sums its statistics through fn (empty: off).
  void set_batchnorm_sync(DeviceSumFn fn) { dev_.bn_sync = std::move(fn); }

  // x: device [N, H, W, C] (the model's input shape). Returns the logits [N, classes], valid until
  // the next forward. Only queues work on ctx's stream.
  const DeviceTensor& forward(const DeviceTensor& x, Mode mode);
  // Backward from dL/dlogits (device, the logits' shape) of the last forward; ctx.on_ready is told
  // each leaf layer's gradient range right after that layer's kernels are queued.
  void backward(const DeviceTensor& dlogits, BackwardCtx& ctx);

 private:
  void copy(void* dst, const void* src, int64_t floats, cudaMemcpyKind kind);

  Model& model_;
  GpuContext& ctx_;
  DeviceBuffer params_, grads_, buffers_;
  DeviceParams dev_;
  std::unique_ptr<GpuNode> root_;
  const DeviceTensor* input_ = nullptr;
  DeviceTensor logits_;
};

}  // namespace dpt::gpu
