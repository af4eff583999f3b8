// Logging and the Tensor's out-of-line parts (small core pieces with no better home).
#include "dpt/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "dpt/backend.h"
#include "dpt/error.h"
#include "dpt/tensor.h"

namespace dpt {

namespace {
LogLevel g_level = LogLevel::kInfo;
int g_rank = 0;
}  // namespace

void set_log_level(LogLevel level) { g_level = level; }
LogLevel log_level() { return g_level; }
void set_log_rank(int rank) { g_rank = rank; }

LogLevel parse_log_level(const std::string& s) {
  if (s == "error") return LogLevel::kError;
  if (s == "warn") return LogLevel::kWarn;
  if (s == "info") return LogLevel::kInfo;
  if (s == "debug") return LogLevel::kDebug;
  throw Error(ErrorKind::kInput, "--log-level: '" + s + "' is not one of error|warn|info|debug");
}

void log_info(const std::string& msg) {
  if (g_rank != 0 || g_level < LogLevel::kInfo) return;
  std::fprintf(stdout, "%s\n", msg.c_str());
  std::fflush(stdout);
}
void log_debug(const std::string& msg) {
  if (g_level < LogLevel::kDebug) return;
  std::fprintf(stderr, "%sdebug: %s\n", rank_prefix().c_str(), msg.c_str());
}
void log_warn(const std::string& msg) {
  if (g_level < LogLevel::kWarn) return;
  std::fprintf(stderr, "%swarning: %s\n", rank_prefix().c_str(), msg.c_str());
}
void log_error(const std::string& msg) {
  std::fprintf(stderr, "%serror: %s\n", rank_prefix().c_str(), msg.c_str());
  std::fflush(stderr);
}

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
    shape_ = std::move(o.shape_);
  }
  return *this;
}

void Tensor::release() noexcept {
  if (!owned_) return;
  if (backend_) backend_->release(owned_); else std::free(owned_);
  g_live_bytes.fetch_sub(owned_bytes_, std::memory_order_relaxed);
  owned_ = nullptr;
  owned_bytes_ = 0;
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
  if (data_ == nullptr || n > capacity_) {
    DPT_CHECK(owned_ || data_ == nullptr, "cannot grow a view to " << shape_str(shape));
    size_t bytes = (static_cast<size_t>(n) * sizeof(float) + 63) / 64 * 64;
    if (bytes == 0) bytes = 64;
    release();  // a device backend waits for queued work that may still read the old storage
    data_ = nullptr;
    float* p;
    if (backend_) {
      p = static_cast<float*>(backend_->allocate(bytes));
    } else {
      p = static_cast<float*>(std::aligned_alloc(64, bytes));
      DPT_CHECK(p != nullptr, "out of memory allocating " << bytes << " bytes");
      std::memset(p, 0, bytes);
    }
    owned_ = p;
    owned_bytes_ = static_cast<int64_t>(bytes);
    g_live_bytes.fetch_add(owned_bytes_, std::memory_order_relaxed);
    capacity_ = n;
    data_ = p;
  }
  shape_ = shape;
}

void Tensor::zero() {
  if (!data_) return;
  const size_t bytes = static_cast<size_t>(numel()) * sizeof(float);
  if (backend_) backend_->zero(data_, bytes); else std::memset(data_, 0, bytes);
}

}  // namespace dpt
