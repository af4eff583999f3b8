// CPU kernels of src/cpu/ops.h that call oneDNN: its sgemm, Linear on it, the engine and stream.
// The hand-written loops of ops.h are in ops_loops.{cc,inc}, compiled per instruction-set level.
#include "cpu/ops.h"

#include <oneapi/dnnl/dnnl.h>

#include <string>

#include "dpt/error.h"

namespace dpt::cpu {

void sgemm(char ta, char tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  DPT_LIB_CHECK(
      "oneDNN", dnnl_sgemm(ta, tb, m, n, k, 1.f, a, lda, b, ldb, beta, c, ldc),
      [](dnnl_status_t s) { return s != dnnl_success; },
      [](dnnl_status_t s) { return std::string("sgemm status ") + std::to_string(s); });
}

void linear_forward(const float* x, const float* w, const float* b, float* y, int64_t n, int64_t in,
                    int64_t out, GemmFn gemm) {
  gemm('N', 'T', n, out, in, x, in, w, in, 0.f, y, out);
  if (b) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n; ++r)
      for (int64_t o = 0; o < out; ++o) y[r * out + o] += b[o];
  }
}

void linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                     float* db, int64_t n, int64_t in, int64_t out, bool accumulate, GemmFn gemm) {
  if (dx) gemm('N', 'N', n, in, out, dy, out, w, in, 0.f, dx, in);
  gemm('T', 'N', out, in, n, dy, out, x, in, accumulate ? 1.f : 0.f, dw, in);
  if (db) column_sums(dy, n, out, db, accumulate);
}

}  // namespace dpt::cpu

// ---- oneDNN engine/stream (see dnnl_util.h) ------------------------------------------------
#include "cpu/dnnl_util.h"
#include "dpt/log.h"

namespace dpt::cpu {

dnnl::engine& dnnl_engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

dnnl::stream& dnnl_stream() {
  static dnnl::stream strm(dnnl_engine());
  return strm;
}

void log_dnnl_choice(const char* what, const std::string& impl) {
  log_debug(std::string("oneDNN ") + what + ": " + impl);
}

}  // namespace dpt::cpu
