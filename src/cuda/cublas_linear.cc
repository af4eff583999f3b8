// Linear on cuBLAS (see cublas_linear.h). cuBLAS is column-major: a row-major [r, c] matrix is the
// column-major [c, r] matrix with leading dimension c, i.e. its transpose, so every row-major
// product below is written as the transposed column-major product. With --precision bf16 the
// operands of each GEMM are cast to bf16 into the workspace and cublasGemmEx accumulates in fp32
// into the fp32 result (tensor cores); bias and column sums stay fp32. Only compiled in GPU builds.
#include "cuda/cublas_linear.h"

#include <climits>

#include "cuda/cuda_check.h"
#include "linear.cuh"
#include "precision.cuh"

namespace dpt::gpu {

namespace {
int as_int(int64_t v, const char* what) {
  DPT_CHECK(v >= 0 && v <= INT_MAX, what << " = " << v << " does not fit cuBLAS's int dimensions");
  return static_cast<int>(v);
}

// C[m,n] = op(A) op(B) + beta C, column-major, A holding m*k and B k*n packed values: cuBLAS
// sgemm in fp32 (TF32 only under --tf32's math mode), or bf16 copies of A and B with fp32 output
// and accumulation under --precision bf16.
void gemm(GpuContext& g, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc) {
  const float one = 1.f;
  if (!g.bf16()) {
    CUBLAS_CHECK(cublasSgemm(g.cublas(), ta, tb, m, n, k, &one, a, lda, b, ldb, &beta, c, ldc));
    return;
  }
  const int64_t na = int64_t{m} * k, nb = int64_t{k} * n;
  WorkspaceLayout layout;
  const size_t at_a = layout.add(static_cast<size_t>(na) * sizeof(uint16_t));
  const size_t at_b = layout.add(static_cast<size_t>(nb) * sizeof(uint16_t));
  char* ws = static_cast<char*>(g.workspace(layout.total()));
  auto* al = reinterpret_cast<uint16_t*>(ws + at_a);
  auto* bl = reinterpret_cast<uint16_t*>(ws + at_b);
  CUDA_CHECK(cuda::launch_to_bf16(a, al, na, g.stream()));
  CUDA_CHECK(cuda::launch_to_bf16(b, bl, nb, g.stream()));
  CUBLAS_CHECK(cublasGemmEx(g.cublas(), ta, tb, m, n, k, &one, al, CUDA_R_16BF, lda, bl, CUDA_R_16BF, ldb, &beta, c,
                            CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}
}  // namespace

void linear_forward(GpuContext& g, const float* x, const float* w, const float* b, float* y, int64_t n,
                    int64_t in, int64_t out) {
  const int N = as_int(n, "batch"), I = as_int(in, "in_features"), O = as_int(out, "out_features");
  // Row-major y = x W^T  <=>  column-major y^T[O,N] = W^T[I,O]^T x^T[I,N] = op_T(W') op_N(x').
  gemm(g, CUBLAS_OP_T, CUBLAS_OP_N, O, N, I, w, I, x, I, 0.f, y, O);
  if (b) add_row_bias(g, y, b, n, out);
}

void linear_backward(GpuContext& g, const float* x, const float* w, const float* dy, float* dx, float* dw,
                     float* db, int64_t n, int64_t in, int64_t out, bool accumulate) {
  const int N = as_int(n, "batch"), I = as_int(in, "in_features"), O = as_int(out, "out_features");
  // Row-major dx[N,I] = dy[N,O] W[O,I]  <=>  column-major dx^T[I,N] = W'[I,O] dy'[O,N].
  if (dx) gemm(g, CUBLAS_OP_N, CUBLAS_OP_N, I, N, O, w, I, dy, O, 0.f, dx, I);
  // Row-major dW[O,I] (+)= dy^T x  <=>  column-major dW^T[I,O] (+)= x'[I,N] dy'[O,N]^T.
  gemm(g, CUBLAS_OP_N, CUBLAS_OP_T, I, O, N, x, I, dy, O, accumulate ? 1.f : 0.f, dw, I);
  if (db) column_sums(g, dy, n, out, db, accumulate);
}

void add_row_bias(GpuContext& g, float* y, const float* b, int64_t rows, int64_t cols) {
  const int R = as_int(rows, "rows"), C = as_int(cols, "columns");
  const float one = 1.f;
  // Column-major y^T[C,R] += b[C] * ones[R]^T: a rank-1 update, element-wise fl(y + b) as on the CPU.
  CUBLAS_CHECK(cublasSger(g.cublas(), C, R, &one, b, 1, g.ones(rows), 1, y, C));
}

namespace {
double* column_sums_scratch(GpuContext& g, int64_t rows, int64_t cols) {
  const int64_t scratch = cuda::column_sums_scratch_elems(rows, cols);
  return static_cast<double*>(g.workspace(static_cast<size_t>(scratch) * sizeof(double)));
}
}  // namespace

void column_sums(GpuContext& g, const float* a, int64_t rows, int64_t cols, float* out, bool accumulate) {
  // Our own reduction rather than cublasSgemv with a ones vector: it accumulates in double like
  // cpu::column_sums (a float sum over N*H*W rows would drift from it) and in a fixed order.
  CUDA_CHECK(
      cuda::launch_column_sums(a, rows, cols, out, accumulate, column_sums_scratch(g, rows, cols), g.stream()));
}

void add_row_bias(GpuContext& g, __nv_bfloat16* y, const float* b, int64_t rows, int64_t cols) {
  // Not cuBLAS: its rank-1 update has no bf16 form; one rounding of the fp32 sum per element.
  CUDA_CHECK(cuda::launch_add_row_bias_bf16(reinterpret_cast<uint16_t*>(y), b, rows, cols, g.stream()));
}

void column_sums(GpuContext& g, const __nv_bfloat16* a, int64_t rows, int64_t cols, float* out, bool accumulate) {
  CUDA_CHECK(cuda::launch_column_sums_bf16(reinterpret_cast<const uint16_t*>(a), rows, cols, out, accumulate,
                                           column_sums_scratch(g, rows, cols), g.stream()));
}

}  // namespace dpt::gpu
