// Linear on cuBLAS (see cublas_linear.h). cuBLAS is column-major: a row-major [r, c] matrix is the
// column-major [c, r] matrix with leading dimension c, i.e. its transpose, so every row-major
// product below is written as the transposed column-major product. With --precision bf16 the
// operands of each GEMM are cast to bf16 into the workspace and cublasGemmEx accumulates in fp32
// into the fp32 result (tensor cores); bias and column sums stay fp32. On bf16 activations the same
// GEMM takes them as they are and only the fp32 master weights are cast. Only compiled in GPU
// builds.
#include "cuda/cublas_linear.h"

#include <climits>
#include <type_traits>

#include "cuda/cuda_check.h"
#include "linear.cuh"
#include "precision.cuh"

namespace dpt::gpu {

namespace {
int as_int(int64_t v, const char* what) {
  DPT_CHECK(v >= 0 && v <= INT_MAX, what << " = " << v << " does not fit cuBLAS's int dimensions");
  return static_cast<int>(v);
}

// The cuBLAS type of an array's elements.
cudaDataType_t type_of(const float*) { return CUDA_R_32F; }
cudaDataType_t type_of(const __nv_bfloat16*) { return CUDA_R_16BF; }
// A GEMM operand in device memory, fp32 or bf16, with its cuBLAS type.
struct Mat {
  const void* p;
  cudaDataType_t type;
};
template <typename T>
Mat mat(const T* p) {
  return {p, type_of(p)};
}

// Operand x (n values) as bf16: itself, or its fp32 values rounded to nearest even into `to`.
const void* bf16_operand(GpuContext& g, Mat x, int64_t n, char* to) {
  if (x.type == CUDA_R_16BF) return x.p;
  auto* d = reinterpret_cast<uint16_t*>(to);
  CUDA_CHECK(cuda::launch_to_bf16(static_cast<const float*>(x.p), d, n, g.stream()));
  return d;
}

// C[m,n] = op(A) op(B) + beta C, column-major, A holding m*k and B k*n packed values. All fp32:
// cuBLAS sgemm (TF32 only under --tf32's math mode). Under --precision bf16, or with a bf16
// operand or C (16-bit activations): bf16 A and B (the fp32 ones cast into the workspace), fp32
// accumulation on tensor cores, C fp32 or bf16 (rounded once from the fp32 sum).
void gemm(GpuContext& g, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, Mat a,
          int lda, Mat b, int ldb, float beta, void* c, cudaDataType_t c_type, int ldc) {
  const float one = 1.f;
  if (!g.bf16() && a.type == CUDA_R_32F && b.type == CUDA_R_32F && c_type == CUDA_R_32F) {
    CUBLAS_CHECK(cublasSgemm(g.cublas(), ta, tb, m, n, k, &one, static_cast<const float*>(a.p), lda,
                             static_cast<const float*>(b.p), ldb, &beta, static_cast<float*>(c),
                             ldc));
    return;
  }
  const int64_t na = int64_t{m} * k, nb = int64_t{k} * n;
  WorkspaceLayout layout;  // room for the fp32 operands' copies only
  const size_t at_a =
      layout.add(a.type == CUDA_R_32F ? static_cast<size_t>(na) * sizeof(uint16_t) : 0);
  const size_t at_b =
      layout.add(b.type == CUDA_R_32F ? static_cast<size_t>(nb) * sizeof(uint16_t) : 0);
  char* ws = static_cast<char*>(g.workspace(layout.total()));
  const void* al = bf16_operand(g, a, na, ws + at_a);
  const void* bl = bf16_operand(g, b, nb, ws + at_b);
  CUBLAS_CHECK(cublasGemmEx(g.cublas(), ta, tb, m, n, k, &one, al, CUDA_R_16BF, lda, bl,
                            CUDA_R_16BF, ldb, &beta, c, c_type, ldc, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
}

// Both activation types' Linear (T = float or __nv_bfloat16; W, b, dW, db fp32).
template <typename T>
void forward(GpuContext& g, const T* x, const float* w, const float* b, T* y, int64_t n, int64_t in,
             int64_t out) {
  const int N = as_int(n, "batch"), I = as_int(in, "in_features"), O = as_int(out, "out_features");
  // Row-major y = x W^T  <=>  column-major y^T[O,N] = W^T[I,O]^T x^T[I,N] = op_T(W') op_N(x').
  const auto product = [&](auto* to) {
    gemm(g, CUBLAS_OP_T, CUBLAS_OP_N, O, N, I, mat(w), I, mat(x), I, 0.f, to, type_of(to), O);
  };
  if constexpr (std::is_same_v<T, float>) {
    product(y);
    if (b) add_row_bias(g, y, b, n, out);
  } else if (!b) {
    product(y);
  } else {
    // The bias joins the fp32 product before the one rounding, as on the CPU (bf16(fl(acc) + b)),
    // rather than bf16(bf16(acc) + b): the product waits in staging (the GEMM takes the workspace).
    auto* acc = static_cast<float*>(g.staging(0, static_cast<size_t>(n * out) * sizeof(float)));
    product(acc);
    CUDA_CHECK(
        cuda::launch_add_row_bias_bf16(acc, b, reinterpret_cast<uint16_t*>(y), n, out, g.stream()));
  }
}

template <typename T>
void backward(GpuContext& g, const T* x, const float* w, const T* dy, T* dx, float* dw, float* db,
              int64_t n, int64_t in, int64_t out, bool accumulate) {
  const int N = as_int(n, "batch"), I = as_int(in, "in_features"), O = as_int(out, "out_features");
  // Row-major dx[N,I] = dy[N,O] W[O,I]  <=>  column-major dx^T[I,N] = W'[I,O] dy'[O,N].
  if (dx)
    gemm(g, CUBLAS_OP_N, CUBLAS_OP_N, I, N, O, mat(w), I, mat(dy), O, 0.f, dx, type_of(dx), I);
  // Row-major dW[O,I] (+)= dy^T x  <=>  column-major dW^T[I,O] (+)= x'[I,N] dy'[O,N]^T.
  gemm(g, CUBLAS_OP_N, CUBLAS_OP_T, I, O, N, mat(x), I, mat(dy), O, accumulate ? 1.f : 0.f, dw,
       CUDA_R_32F, I);
  if (db) column_sums(g, dy, n, out, db, accumulate);
}
}  // namespace

void linear_forward(GpuContext& g, const float* x, const float* w, const float* b, float* y,
                    int64_t n, int64_t in, int64_t out) {
  forward(g, x, w, b, y, n, in, out);
}

void linear_backward(GpuContext& g, const float* x, const float* w, const float* dy, float* dx,
                     float* dw, float* db, int64_t n, int64_t in, int64_t out, bool accumulate) {
  backward(g, x, w, dy, dx, dw, db, n, in, out, accumulate);
}

void linear_forward(GpuContext& g, const __nv_bfloat16* x, const float* w, const float* b,
                    __nv_bfloat16* y, int64_t n, int64_t in, int64_t out) {
  forward(g, x, w, b, y, n, in, out);
}

void linear_backward(GpuContext& g, const __nv_bfloat16* x, const float* w, const __nv_bfloat16* dy,
                     __nv_bfloat16* dx, float* dw, float* db, int64_t n, int64_t in, int64_t out,
                     bool accumulate) {
  backward(g, x, w, dy, dx, dw, db, n, in, out, accumulate);
}

void add_row_bias(GpuContext& g, float* y, const float* b, int64_t rows, int64_t cols) {
  const int R = as_int(rows, "rows"), C = as_int(cols, "columns");
  const float one = 1.f;
  // Column-major y^T[C,R] += b[C] * ones[R]^T: a rank-1 update, element-wise fl(y + b) as on the
  // CPU.
  CUBLAS_CHECK(cublasSger(g.cublas(), C, R, &one, b, 1, g.ones(rows), 1, y, C));
}

namespace {
double* column_sums_scratch(GpuContext& g, int64_t rows, int64_t cols) {
  const int64_t scratch = cuda::column_sums_scratch_elems(rows, cols);
  return static_cast<double*>(g.workspace(static_cast<size_t>(scratch) * sizeof(double)));
}
}  // namespace

void column_sums(GpuContext& g, const float* a, int64_t rows, int64_t cols, float* out,
                 bool accumulate) {
  // Our own reduction rather than cublasSgemv with a ones vector: it accumulates in double like
  // cpu::column_sums (a float sum over N*H*W rows would drift from it) and in a fixed order.
  CUDA_CHECK(cuda::launch_column_sums(a, rows, cols, out, accumulate,
                                      column_sums_scratch(g, rows, cols), g.stream()));
}

void add_row_bias(GpuContext& g, __nv_bfloat16* y, const float* b, int64_t rows, int64_t cols) {
  // Not cuBLAS: its rank-1 update has no bf16 form; one rounding of the fp32 sum per element.
  CUDA_CHECK(
      cuda::launch_add_row_bias_bf16(reinterpret_cast<uint16_t*>(y), b, rows, cols, g.stream()));
}

void column_sums(GpuContext& g, const __nv_bfloat16* a, int64_t rows, int64_t cols, float* out,
                 bool accumulate) {
  CUDA_CHECK(cuda::launch_column_sums_bf16(reinterpret_cast<const uint16_t*>(a), rows, cols, out,
                                           accumulate, column_sums_scratch(g, rows, cols),
                                           g.stream()));
}

}  // namespace dpt::gpu
