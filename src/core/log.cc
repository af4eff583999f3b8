// Logging and the Tensor's out-of-line parts (small core pieces with no better home).
#include "dpt/log.h"

#include <atomic>
#include <cerrno>
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
// Set by the first failed write to the stream. Training never depends on being watched: with
// SIGPIPE ignored (main) a closed pipe makes writes fail with EPIPE, and we stop writing there
// instead of paying a failing syscall per line (or dying, as SIGPIPE would have us).
std::atomic<bool> g_stdout_gone{false};
std::atomic<bool> g_stderr_gone{false};

// One whole line per call, so lines of threads and ranks do not interleave mid-line.
bool write_line(FILE* stream, const std::string& line) {
  const bool ok = std::fwrite(line.data(), 1, line.size(), stream) == line.size();
  return std::fflush(stream) == 0 && ok;
}

// stderr: a failure just ends writing there (there is nowhere left to say so).
void write_stderr(const std::string& line) {
  if (g_stderr_gone.load(std::memory_order_relaxed)) return;
  if (!write_line(stderr, line)) g_stderr_gone.store(true, std::memory_order_relaxed);
}

// stdout: the first failure is reported once on stderr (a warning: not under --log-level error), if
// that still works; later lines are dropped.
void write_stdout(const std::string& line) {
  if (g_stdout_gone.load(std::memory_order_relaxed)) return;
  errno = 0;
  if (write_line(stdout, line)) return;
  const int err = errno;
  if (g_stdout_gone.exchange(true)) return;  // another thread already reported it
  std::clearerr(stdout);
  if (g_level < LogLevel::kWarn) return;
  const std::string why = err == EPIPE ? "the reader closed the pipe"
                          : err        ? std::strerror(err)
                                       : "a write failed";
  write_stderr(rank_prefix() + "warning: stdout is gone (" + why +
               "): training goes on; later stdout lines are dropped\n");
}
}  // namespace

void set_log_level(LogLevel level) { g_level = level; }
LogLevel log_level() { return g_level; }
void set_log_rank(int rank) { g_rank = rank; }
bool stdout_gone() { return g_stdout_gone.load(std::memory_order_relaxed); }

LogLevel parse_log_level(const std::string& s) {
  if (s == "error") return LogLevel::kError;
  if (s == "warn") return LogLevel::kWarn;
  if (s == "info") return LogLevel::kInfo;
  if (s == "debug") return LogLevel::kDebug;
  throw Error(ErrorKind::kInput, "--log-level: '" + s + "' is not one of error|warn|info|debug");
}

void log_info(const std::string& msg) {
  if (g_rank != 0 || g_level < LogLevel::kInfo) return;
  write_stdout(msg + "\n");
}
void log_result(const std::string& msg) {
  if (g_rank != 0) return;
  write_stdout(msg + "\n");
}
void log_debug(const std::string& msg) {
  if (g_level < LogLevel::kDebug) return;
  write_stderr(rank_prefix() + "debug: " + msg + "\n");
}
void log_warn(const std::string& msg) {
  if (g_level < LogLevel::kWarn) return;
  write_stderr(rank_prefix() + "warning: " + msg + "\n");
}
void log_error(const std::string& msg) { write_stderr(rank_prefix() + "error: " + msg + "\n"); }

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
size_t element_bytes(DType dt) { return dt == DType::kBF16 ? 2 : 4; }
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

size_t Tensor::bytes() const { return static_cast<size_t>(numel()) * element_bytes(dtype_); }

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
  const int64_t need = n * static_cast<int64_t>(element_bytes(dtype_));
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

}  // namespace dpt
