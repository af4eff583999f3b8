// BatchNorm on the GPU, one launcher per step of the CPU BatchNorm2d layer (src/nn/layers.cc):
// forward sums, training/evaluation statistics, normalisation, backward sums and input gradient.
// The steps that touch activations also take bf16 ones (uint16_t bit patterns, as in
// precision.cuh): x, residual, dy and relu_out widened exactly, y, dx and dz rounded to nearest
// even once, everything between (and the statistics) exactly as in the fp32 form: the CPU's bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

namespace dpt::cuda {

// Whether the element-wise passes over an [m, c] view of elem_bytes-sized elements (4: fp32, 2:
// bf16) through these pointers (nullable) take 16 bytes of a row per thread (vec_rows.cuh: c a
// multiple of 16 / elem_bytes, at most 256 such vectors a row, every pointer 16-byte aligned)
// rather than one element: the launchers' own test, for the tests that check both forms.
bool bn_rows_in_16_bytes(int64_t m, int64_t c, int elem_bytes,
                         std::initializer_list<const void*> ptrs);

// ----------------------------------------------------------------------------
// BatchNorm forward statistics on the GPU (same semantics as cpu::bn_sums): per-channel sum and
// sum of squares of an [M, C] view, in double.

// Doubles of scratch launch_bn_sums needs for this shape.
int64_t bn_sums_scratch_elems(int64_t m, int64_t c);

// sum[c] = sum_r x[r, c], sumsq[c] = sum_r x[r, c]^2 (overwritten), in double and in a fixed order.
// count (nullable, one device double) = m, so the three can be all-reduced together for
// synchronised BatchNorm exactly like the CPU layer's [sum, sumsq, count] buffer.
cudaError_t launch_bn_sums(const float* x, int64_t m, int64_t c, double* sum, double* sumsq,
                           double* count, double* scratch, cudaStream_t stream);
cudaError_t launch_bn_sums(const uint16_t* x, int64_t m, int64_t c, double* sum, double* sumsq,
                           double* count, double* scratch, cudaStream_t stream);

// ----------------------------------------------------------------------------
// BatchNorm training statistics on the GPU: the per-channel loop of the CPU BatchNorm2d layer's
// training forward (src/nn/layers.cc) as a kernel, so no statistic makes a host round trip.

// From sum, sumsq and *count (device doubles, possibly all-reduced across replicas):
//   mean = sum/count, var = max(0, sumsq/count - mean^2) (biased), invstd = 1/sqrt(var + eps);
//   running_mean = (1-momentum) running_mean + momentum (mean + shift) (shift nullable: the
//   per-channel shift the input lacks, BatchNormOp::set_mean_shift),
//   running_var  = (1-momentum) running_var + momentum var*count/(count-1) (unbiased; var if count
//   <= 1), *num_batches_tracked += 1 (nullable).
// All arithmetic in double, rounded to float once, as on the CPU. Returns the launch status.
cudaError_t launch_bn_stats(const double* sum, const double* sumsq, const double* count, int64_t c,
                            double momentum, double eps, const float* shift, float* running_mean,
                            float* running_var, float* num_batches_tracked, float* mean,
                            float* invstd, cudaStream_t stream);

// ----------------------------------------------------------------------------
// BatchNorm evaluation statistics on the GPU: the CPU BatchNorm2d layer's evaluation-mode loop
// (src/nn/layers.cc), mean and invstd from the running statistics.

// mean = running_mean, invstd = float(1/sqrt(double(running_var) + eps)). Returns the launch
// status.
cudaError_t launch_bn_eval_stats(const float* running_mean, const float* running_var, int64_t c,
                                 double eps, float* mean, float* invstd, cudaStream_t stream);

// ----------------------------------------------------------------------------
// BatchNorm normalisation on the GPU (same semantics as cpu::bn_apply).

// y[r, c] = x[r, c] * scale[c] + shift[c] with scale = gamma*invstd, shift = beta - mean*scale,
// over an [M, C] view; then the fused epilogue: + residual[r, c] when residual is not null, then
// max(., 0) when relu (cpu::relu_forward's rule, x > 0 ? x : 0), each rounded as the separate
// launch_add and launch_relu_forward would. Returns the launch status.
cudaError_t launch_bn_apply(const float* x, float* y, const float* mean, const float* invstd,
                            const float* gamma, const float* beta, int64_t m, int64_t c,
                            const float* residual, bool relu, cudaStream_t stream);
cudaError_t launch_bn_apply(const uint16_t* x, uint16_t* y, const float* mean, const float* invstd,
                            const float* gamma, const float* beta, int64_t m, int64_t c,
                            const uint16_t* residual, bool relu, cudaStream_t stream);

// ----------------------------------------------------------------------------
// BatchNorm backward sums on the GPU (same semantics as cpu::bn_backward_sums), plus this
// replica's gamma/beta gradients, which the CPU layer derives from the same sums.

// Doubles of scratch launch_bn_backward_sums needs for this shape.
int64_t bn_backward_sums_scratch_elems(int64_t m, int64_t c);

// Over an [M, C] view, in double and a fixed order, with g = dy, or with relu_out (a fused ReLU's
// output) relu_backward's g = (relu_out > 0 ? dy : 0):
//   sum_dy[c] = sum_r g, sum_dy_xhat[c] = sum_r g * xhat with xhat = (x - mean) * invstd (float);
//   dgamma[c] = float((accumulate ? dgamma : 0) + sum_dy_xhat), dbeta likewise with sum_dy
//   (each nullable); dz (nullable) = g. The parameter gradients are the local sums, taken before
//   any all-reduce.
cudaError_t launch_bn_backward_sums(const float* x, const float* dy, const float* relu_out,
                                    const float* mean, const float* invstd, int64_t m, int64_t c,
                                    double* sum_dy, double* sum_dy_xhat, float* dgamma,
                                    float* dbeta, bool accumulate, float* dz, double* scratch,
                                    cudaStream_t stream);
cudaError_t launch_bn_backward_sums(const uint16_t* x, const uint16_t* dy, const uint16_t* relu_out,
                                    const float* mean, const float* invstd, int64_t m, int64_t c,
                                    double* sum_dy, double* sum_dy_xhat, float* dgamma,
                                    float* dbeta, bool accumulate, uint16_t* dz, double* scratch,
                                    cudaStream_t stream);

// ----------------------------------------------------------------------------
// BatchNorm input gradient on the GPU (same semantics as cpu::bn_backward_apply, and as the CPU
// layer's evaluation-mode shortcut).

// With g = dy, or dy masked by relu_out > 0 when relu_out is not null (as launch_bn_backward_sums):
// Training (sum_dy != nullptr): dx = gamma*invstd * (g - sum_dy/count - xhat * sum_dy_xhat/count),
//   xhat = (x - mean) * invstd; count is a device double (the rows over all replicas), read on the
//   device so synchronised BatchNorm needs no host round trip.
// Evaluation (sum_dy == nullptr): the statistics are constants, dx = g * (gamma*invstd).
cudaError_t launch_bn_backward_apply(const float* x, const float* dy, const float* relu_out,
                                     const float* mean, const float* invstd, const float* gamma,
                                     const double* sum_dy, const double* sum_dy_xhat,
                                     const double* count, int64_t m, int64_t c, float* dx,
                                     cudaStream_t stream);
cudaError_t launch_bn_backward_apply(const uint16_t* x, const uint16_t* dy,
                                     const uint16_t* relu_out, const float* mean,
                                     const float* invstd, const float* gamma, const double* sum_dy,
                                     const double* sum_dy_xhat, const double* count, int64_t m,
                                     int64_t c, uint16_t* dx, cudaStream_t stream);

}  // namespace dpt::cuda
