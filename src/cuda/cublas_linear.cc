// Linear on cuBLAS (see cublas_linear.h). cuBLAS is column-major: a row-major [r, c] matrix is the
// column-major [c, r] matrix with leading dimension c, i.e. its transpose, so every row-major
// product below is written as the transposed column-major product. Only compiled in GPU builds.
#include "cuda/cublas_linear.h"

#include <climits>

#include "column_sums.cuh"
#include "cuda/cuda_check.h"

namespace dpt::gpu {

namespace {
int as_int(int64_t v, const char* what) {
  DPT_CHECK(v >= 0 && v <= INT_MAX, what << " = " << v << " does not fit cuBLAS's int dimensions");
  return static_cast<int>(v);
}
}  // namespace

void linear_forward(GpuContext& g, const float* x, const float* w, const float* b, float* y, int64_t n,
                    int64_t in, int64_t out) {
  const int N = as_int(n, "batch"), I = as_int(in, "in_features"), O = as_int(out, "out_features");
  const float one = 1.f, zero = 0.f;
  // Row-major y = x W^T  <=>  column-major y^T[O,N] = W^T[I,O]^T x^T[I,N] = op_T(W') op_N(x').
  CUBLAS_CHECK(cublasSgemm(g.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, O, N, I, &one, w, I, x, I, &zero, y, O));
  if (b) add_row_bias(g, y, b, n, out);
}

void linear_backward(GpuContext& g, const float* x, const float* w, const float* dy, float* dx, float* dw,
                     float* db, int64_t n, int64_t in, int64_t out, bool accumulate) {
  const int N = as_int(n, "batch"), I = as_int(in, "in_features"), O = as_int(out, "out_features");
  const float one = 1.f, zero = 0.f, beta = accumulate ? 1.f : 0.f;
  // Row-major dx[N,I] = dy[N,O] W[O,I]  <=>  column-major dx^T[I,N] = W'[I,O] dy'[O,N].
  if (dx) CUBLAS_CHECK(cublasSgemm(g.cublas(), CUBLAS_OP_N, CUBLAS_OP_N, I, N, O, &one, w, I, dy, O, &zero, dx, I));
  // Row-major dW[O,I] (+)= dy^T x  <=>  column-major dW^T[I,O] (+)= x'[I,N] dy'[O,N]^T.
  CUBLAS_CHECK(cublasSgemm(g.cublas(), CUBLAS_OP_N, CUBLAS_OP_T, I, O, N, &one, x, I, dy, O, &beta, dw, I));
  if (db) column_sums(g, dy, n, out, db, accumulate);
}

void add_row_bias(GpuContext& g, float* y, const float* b, int64_t rows, int64_t cols) {
  const int R = as_int(rows, "rows"), C = as_int(cols, "columns");
  const float one = 1.f;
  // Column-major y^T[C,R] += b[C] * ones[R]^T: a rank-1 update, element-wise fl(y + b) as on the CPU.
  CUBLAS_CHECK(cublasSger(g.cublas(), C, R, &one, b, 1, g.ones(rows), 1, y, C));
}

void column_sums(GpuContext& g, const float* a, int64_t rows, int64_t cols, float* out, bool accumulate) {
  // Our own reduction rather than cublasSgemv with a ones vector: it accumulates in double like
  // cpu::column_sums (a float sum over N*H*W rows would drift from it) and in a fixed order.
  const int64_t scratch = cuda::column_sums_scratch_elems(rows, cols);
  auto* ws = static_cast<double*>(g.workspace(static_cast<size_t>(scratch) * sizeof(double)));
  CUDA_CHECK(cuda::launch_column_sums(a, rows, cols, out, accumulate, ws, g.stream()));
}

}  // namespace dpt::gpu
