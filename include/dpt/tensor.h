// Tensor: a float array with a shape, either owning 64-byte-aligned storage or viewing someone
// else's (parameters are views into a model's flat buffers). 4-D activations are NHWC: {N, H, W, C}.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace dpt {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(const Shape& shape) { resize(shape); }

  // A view of memory owned elsewhere (must outlive the view).
  static Tensor view(float* data, const Shape& shape) {
    Tensor t;
    t.data_ = data;
    t.shape_ = shape;
    t.capacity_ = shape_numel(shape);
    return t;
  }

  // Reshapes; reallocates only when more elements than ever before are needed, so buffers that are
  // resized every step (activations) allocate once. New storage is zero-filled.
  void resize(const Shape& shape);
  void zero();

  float* data() { return data_; }
  const float* data() const { return data_; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[static_cast<size_t>(i < 0 ? i + rank() : i)]; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  bool empty() const { return data_ == nullptr; }

 private:
  struct FreeDeleter {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, FreeDeleter> storage_;
  int64_t capacity_ = 0;
  float* data_ = nullptr;
  Shape shape_;
};

}  // namespace dpt
