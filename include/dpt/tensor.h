// Tensor: a float (or, for 16-bit activations, bfloat16) array with a shape, either owning storage
// from a backend (host memory when none is named) or viewing someone else's (parameters are views
// into a model's flat buffers). 4-D activations are NHWC: {N, H, W, C}. Move-only; storage is
// released through its backend.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dpt/dtype.h"
#include "dpt/half.h"

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
  Tensor(const Shape& shape, Backend* backend, DType dtype) { resize(shape, backend, dtype); }
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
    t.capacity_ = shape_numel(shape) * static_cast<int64_t>(sizeof(float));
    t.backend_ = backend;
    return t;
  }

  // Reshapes; reallocates only when more bytes than ever before are needed, so buffers that are
  // resized every step (activations) allocate once. New storage is zero-filled. With a backend
  // other than the tensor's own, the storage moves to it (contents are not kept); with a dtype
  // (kF32 or kBF16) other than its own, the elements are that type from now on (contents
  // meaningless).
  void resize(const Shape& shape);
  void resize(const Shape& shape, Backend* backend);
  void resize(const Shape& shape, Backend* backend, DType dtype);
  void zero();

  // The elements as float (a kF32 tensor) or BFloat16 (kBF16): asking for the other type is a
  // dpt::Error naming both, never a reinterpretation.
  float* data() { return ptr<float>(); }
  const float* data() const { return ptr<float>(); }
  template <typename T>
  T* ptr() {
    if (dtype_ != dtype_of<T>()) wrong_dtype(dtype_of<T>());
    return static_cast<T*>(data_);
  }
  template <typename T>
  const T* ptr() const {
    if (dtype_ != dtype_of<T>()) wrong_dtype(dtype_of<T>());
    return static_cast<const T*>(data_);
  }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[static_cast<size_t>(i < 0 ? i + rank() : i)]; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  bool empty() const { return data_ == nullptr; }
  size_t bytes() const;                          // numel() elements of dtype()
  size_t element_bytes() const;                  // one element of dtype(): 4 or 2
  Backend* backend() const { return backend_; }  // null: host memory
  // Bytes of storage all tensors of this process own right now (the memory estimate measures a
  // probe step with it).
  static int64_t live_bytes();

 private:
  friend class TensorPool;
  void release() noexcept;
  [[noreturn]] void wrong_dtype(DType asked) const;
  void* owned_ = nullptr;  // storage this tensor allocated (null for views)
  int64_t owned_bytes_ = 0;
  Backend* backend_ = nullptr;
  int64_t capacity_ = 0;  // bytes
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Shape shape_;
};

// Storage lent and handed back: the tensors between a model's layers (the activations a forward
// keeps, until backward has passed them; backward's activation gradients, until the layer below
// has used them; kInfer's intermediates, until the next layer has read them). The pool holds at
// most as many buffers as were ever out at once, each as large as its largest use, where one
// buffer per tensor would hold them all for the whole run. Lending a larger buffer grown before
// rather than allocating a fresh one measured better: ResNet-50's step at batch 16 holds 1845 MB
// of tensors this way, 2036 MB when a request that no free buffer fits allocates anew.
// take() lends the smallest free buffer of at least `bytes`,
// else the largest free one (which the caller's resize grows), else an empty tensor; give()
// takes it back. The free list is ordered by capacity, then address, so a step that takes and
// gives in the same order as the last one gets the same buffers (a CUDA graph keeps its
// pointers) and allocates nothing once every buffer has reached its size.
class TensorPool {
 public:
  Tensor take(size_t bytes);
  void give(Tensor&& t);  // an empty tensor (or a view) is dropped
  size_t free_buffers() const { return free_.size(); }

 private:
  std::vector<Tensor> free_;
};

// A tensor borrowed from a pool and handed back when the loan ends, on every path: an exception
// part-way through a forward or backward hands its buffers back instead of freeing them (which
// would cost the pool a regrowth, and on the GPU a failed capture). Code that relies on the
// order of hand-backs (a CUDA graph's pointers) calls give_back() explicitly; the destructor
// covers the rest. The pool must outlive its loans.
class Loan {
 public:
  Loan() = default;
  Loan(TensorPool& pool, size_t bytes) : pool_(&pool), t_(pool.take(bytes)) {}
  Loan(Loan&& o) noexcept : pool_(std::exchange(o.pool_, nullptr)), t_(std::move(o.t_)) {}
  Loan& operator=(Loan&& o) noexcept {
    if (this != &o) {
      give_back();
      pool_ = std::exchange(o.pool_, nullptr);
      t_ = std::move(o.t_);
    }
    return *this;
  }
  ~Loan() { give_back(); }
  Tensor& operator*() { return t_; }
  const Tensor& operator*() const { return t_; }
  Tensor* operator->() { return &t_; }
  const Tensor* operator->() const { return &t_; }
  void give_back() noexcept {
    try {
      if (pool_) pool_->give(std::move(t_));
    } catch (...) {  // no room in the free list: the buffer is freed instead
    }
    pool_ = nullptr;
    t_ = Tensor();
  }

 private:
  TensorPool* pool_ = nullptr;
  Tensor t_;
};

}  // namespace dpt
