// Tensor: a float array with a shape, either owning storage from a backend (host memory when none
// is named) or viewing someone else's (parameters are views into a model's flat buffers). 4-D
// activations are NHWC: {N, H, W, C}. Move-only; storage is released through its backend.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dpt {

class Backend;
using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(const Shape& shape) { resize(shape); }
  Tensor(const Shape& shape, Backend* backend) { resize(shape, backend); }
  ~Tensor() { release(); }
  Tensor(Tensor&& o) noexcept { *this = std::move(o); }
  Tensor& operator=(Tensor&& o) noexcept;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  // A view of memory owned elsewhere (must outlive the view), on `backend` (null: host).
  static Tensor view(float* data, const Shape& shape, Backend* backend = nullptr) {
    Tensor t;
    t.data_ = data;
    t.shape_ = shape;
    t.capacity_ = shape_numel(shape);
    t.backend_ = backend;
    return t;
  }

  // Reshapes; reallocates only when more elements than ever before are needed, so buffers that are
  // resized every step (activations) allocate once. New storage is zero-filled. With a backend
  // other than the tensor's own, the storage moves to it (contents are not kept).
  void resize(const Shape& shape);
  void resize(const Shape& shape, Backend* backend);
  void zero();

  float* data() { return data_; }
  const float* data() const { return data_; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[static_cast<size_t>(i < 0 ? i + rank() : i)]; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  bool empty() const { return data_ == nullptr; }
  Backend* backend() const { return backend_; }  // null: host memory
  // Bytes of storage all tensors of this process own right now (the memory estimate measures a
  // probe step with it).
  static int64_t live_bytes();

 private:
  void release() noexcept;
  float* owned_ = nullptr;  // storage this tensor allocated (null for views)
  int64_t owned_bytes_ = 0;
  Backend* backend_ = nullptr;
  int64_t capacity_ = 0;
  float* data_ = nullptr;
  Shape shape_;
};

}  // namespace dpt
