// The CPU backends beyond include/dpt/backend.h's fp32 cpu_backend(): the --precision bf16 one,
// whether this process may use it, and the two bf16 pieces the convolutions and Linear share (the
// rounding of fp32 operands to bf16, and a bf16 GEMM with fp32 accumulation).
#pragma once

#include <cstdint>
#include <string>

#include "dpt/backend.h"

namespace dpt::cpu {

// Why --precision bf16 cannot run on this CPU: "" when it can (the CPU has AVX512-BF16 or
// AMX-BF16 and oneDNN may dispatch to avx512_core_bf16 or higher), else what is missing, with the
// CPU's model name. DPT_CPU_BF16=off makes it report both features absent (tests, diagnosis).
std::string cpu_bf16_missing();

// The CPU backend whose convolutions (every direction, always oneDNN: no Winograd, no im2col
// sgemm) and Linear GEMMs take bf16 operands and accumulate in fp32; everything else, outputs and
// gradients included, is the fp32 backend's. Only where cpu_bf16_missing() is empty.
Backend& cpu_backend_bf16();

// y[i] = x[i] rounded to bfloat16 bits, nearest even. With AVX512-BF16 this is VCVTNEPS2BF16,
// which (as in oneDNN's own conversions) also flushes fp32 denormals to zero; without it
// dpt::bf16_from_float.
void to_bf16(const float* x, uint16_t* y, int64_t n);

// cpu::sgemm's contract (row-major C = op(A) op(B) + beta C, beta 0 or 1; a GemmFn of ops.h)
// with A and B rounded to bf16 and the products accumulated and written in fp32: oneDNN's matmul,
// one primitive per shape, kept per thread.
void gemm_bf16(char ta, char tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// The same on operands that are bf16 already, C float or bf16 (rounded once from the fp32
// accumulators by oneDNN), with an optional fp32 bias[n] added to every row before that.
template <typename C>
void matmul_bf16(char ta, char tb, int64_t m, int64_t n, int64_t k, const BFloat16* a, int64_t lda,
                 const BFloat16* b, int64_t ldb, float beta, C* c, int64_t ldc,
                 const float* bias = nullptr);

}  // namespace dpt::cpu
