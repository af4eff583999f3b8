// The Tensor's out-of-line parts (include/dpt/tensor.h): shapes, storage from a backend or the
// host, move and release, and the element-type checks.
#include "dpt/tensor.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <utility>

#include "dpt/backend.h"
#include "dpt/error.h"

namespace dpt {

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}
std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

namespace {
std::atomic<int64_t> g_live_bytes{0};
}  // namespace

int64_t Tensor::live_bytes() { return g_live_bytes.load(std::memory_order_relaxed); }

Tensor& Tensor::operator=(Tensor&& o) noexcept {
  if (this != &o) {
    release();
    owned_ = std::exchange(o.owned_, nullptr);
    owned_bytes_ = std::exchange(o.owned_bytes_, 0);
    backend_ = std::exchange(o.backend_, nullptr);
    capacity_ = std::exchange(o.capacity_, 0);
    data_ = std::exchange(o.data_, nullptr);
    dtype_ = std::exchange(o.dtype_, DType::kF32);
    shape_ = std::move(o.shape_);
  }
  return *this;
}

void Tensor::release() noexcept {
  if (!owned_) return;
  if (backend_)
    backend_->release(owned_);
  else
    std::free(owned_);
  g_live_bytes.fetch_sub(owned_bytes_, std::memory_order_relaxed);
  owned_ = nullptr;
  owned_bytes_ = 0;
}

namespace {
size_t type_bytes(DType dt) { return dt == DType::kBF16 ? 2 : 4; }
const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::kF32:
      return "float32";
    case DType::kBF16:
      return "bfloat16";
    default:
      return "another type";
  }
}
}  // namespace

size_t Tensor::bytes() const { return static_cast<size_t>(numel()) * type_bytes(dtype_); }
size_t Tensor::element_bytes() const { return type_bytes(dtype_); }

void Tensor::wrong_dtype(DType asked) const {
  DPT_CHECK(false, "tensor " << shape_str(shape_) << " holds " << dtype_name(dtype_) << ", read as "
                             << dtype_name(asked));
  std::abort();  // not reached: DPT_CHECK(false) throws
}

void Tensor::resize(const Shape& shape, Backend* backend, DType dtype) {
  DPT_CHECK(dtype == DType::kF32 || dtype == DType::kBF16, "a tensor holds float32 or bfloat16");
  DPT_CHECK(dtype == dtype_ || owned_ || data_ == nullptr,
            "cannot change the element type of a view");
  dtype_ = dtype;
  resize(shape, backend);
}

void Tensor::resize(const Shape& shape, Backend* backend) {
  if (backend != backend_) {
    DPT_CHECK(owned_ || data_ == nullptr, "cannot move a view to another backend");
    release();
    data_ = nullptr;
    capacity_ = 0;
    backend_ = backend;
  }
  resize(shape);
}

void Tensor::resize(const Shape& shape) {
  int64_t n = shape_numel(shape);
  DPT_CHECK(n >= 0, "negative tensor size " << shape_str(shape));
  const int64_t need = n * static_cast<int64_t>(type_bytes(dtype_));
  if (data_ == nullptr || need > capacity_) {
    DPT_CHECK(owned_ || data_ == nullptr, "cannot grow a view to " << shape_str(shape));
    size_t bytes = (static_cast<size_t>(need) + 63) / 64 * 64;
    if (bytes == 0) bytes = 64;
    release();  // a device backend waits for queued work that may still read the old storage
    data_ = nullptr;
    void* p;
    if (backend_) {
      p = backend_->allocate(bytes);
    } else {
      p = std::aligned_alloc(64, bytes);
      DPT_CHECK(p != nullptr, "out of memory allocating " << bytes << " bytes");
      std::memset(p, 0, bytes);
    }
    owned_ = p;
    owned_bytes_ = static_cast<int64_t>(bytes);
    g_live_bytes.fetch_add(owned_bytes_, std::memory_order_relaxed);
    capacity_ =
        static_cast<int64_t>(bytes);  // all of it: a later dtype or shape may use the rounding
    data_ = p;
  }
  shape_ = shape;
}

void Tensor::zero() {
  if (!data_) return;
  if (backend_)
    backend_->zero(data_, bytes());
  else
    std::memset(data_, 0, bytes());
}

Tensor TensorPool::take(size_t bytes) {
  if (free_.empty()) return {};
  // free_ is ascending by capacity: the first that fits is the best fit, else the last is the
  // largest.
  auto it = std::find_if(free_.begin(), free_.end(), [&](const Tensor& t) {
    return t.capacity_ >= static_cast<int64_t>(bytes);
  });
  if (it == free_.end()) --it;
  Tensor t = std::move(*it);
  free_.erase(it);
  return t;
}

void TensorPool::give(Tensor&& t) {
  if (!t.owned_) return;
  auto before = [](const Tensor& a, const Tensor& b) {
    return a.capacity_ != b.capacity_ ? a.capacity_ < b.capacity_
                                      : std::less<const void*>()(a.data_, b.data_);
  };
  free_.insert(std::upper_bound(free_.begin(), free_.end(), t, before), std::move(t));
}

}  // namespace dpt
