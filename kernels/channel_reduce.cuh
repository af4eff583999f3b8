// Per-channel sums over the rows of a row-major [m, c] view (NHWC with m = N*H*W), in double, in
// a fixed order: shared by column_sums (linear.cu), bn_sums and bn_backward_sums (batchnorm.cu)
// (a private helper, not an op).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "launch_util.cuh"
#include "vec_rows.cuh"

namespace dpt::cuda {

// Two passes instead of atomics so every run adds in the same order and gets the same bits (the
// project's runs and resumes are bit-reproducible). Pass 1: block (32 channels x 8 row lanes) of
// grid (channel tiles, chunks) sums its chunk of rows into partial[q][chunk][c]; pass 2: block (32
// channels x 16 chunk lanes) per channel tile, lane y adding chunks y, y + 16, ... in index order,
// then the 16 lane sums added in lane order (512 threads: room for any Out's registers). The
// chunking depends on m only, so the order does too. Pass 2 was one thread per channel adding all
// chunks itself: with 64 channels and 512 chunks that is 64 threads each waiting on 1,024 loads in
// turn, 84 us a call and 32 % of ResNet-18's bf16 step on an H100 (ncu, 2026-11-26), more than all
// its convolutions' forward passes.
constexpr int kReduceLanes = 32, kReduceRowLanes = 8, kTotalLanes = 16;
// Channel counts above this are refused (cudaErrorInvalidValue) so grid sizes always fit.
constexpr int64_t kMaxChannels = int64_t{1} << 24;

struct ReducePlan {
  int64_t chunks = 0, rows_per_chunk = 0;
};

inline ReducePlan reduce_plan(int64_t m) {
  ReducePlan p;
  if (m <= 0) return p;
  int64_t chunks = (m + 255) / 256;  // about 256 rows per chunk, at most 512 chunks
  chunks = chunks < 1 ? 1 : (chunks > 512 ? 512 : chunks);
  p.rows_per_chunk = (m + chunks - 1) / chunks;
  p.chunks = (m + p.rows_per_chunk - 1) / p.rows_per_chunk;
  return p;
}

// Doubles of scratch a reduction of NQ quantities over [m, c] needs.
inline int64_t reduce_scratch_elems(int64_t m, int64_t c, int nq) {
  return nq * reduce_plan(m).chunks * c;
}

// term(r, ch, acc) adds row r's contribution for channel ch into acc[0..NQ).
template <int NQ, class Term>
__global__ void channel_partials_kernel(int64_t m, int64_t c, int64_t rows_per_chunk,
                                        int64_t chunks, Term term, double* __restrict__ partial) {
  const int64_t ch = blockIdx.x * static_cast<int64_t>(kReduceLanes) + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  const int64_t r0 = chunk * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < m ? r0 + rows_per_chunk : m;
  double acc[NQ];
  for (int q = 0; q < NQ; ++q) acc[q] = 0.0;
  if (ch < c)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kReduceRowLanes) term(r, ch, acc);
  __shared__ double s[NQ][kReduceRowLanes][kReduceLanes + 1];
  for (int q = 0; q < NQ; ++q) s[q][threadIdx.y][threadIdx.x] = acc[q];
  __syncthreads();
  if (threadIdx.y == 0 && ch < c)
    for (int q = 0; q < NQ; ++q) {
      double t = 0.0;
      for (int k = 0; k < kReduceRowLanes; ++k) t += s[q][k][threadIdx.x];
      partial[(q * chunks + chunk) * c + ch] = t;
    }
}

// Pass 1 in 16-byte accesses (vec_rows.cuh's Vec16), for Terms with a row form: a thread sums V
// adjacent channels over the rows channel_partials_kernel's thread of each would (row lane y:
// rows r0 + y, r0 + y + 8, ... of its chunk, in that order), and the 8 lanes are added in lane
// order, so every partial sum, and all after it, has the same bits. Block: `lanes` vector columns
// x 8 row lanes x `groups` chunks (kVecThreads where the channels allow); shared memory
// groups * NQ * 8 * (lanes * V + 1) doubles. term.channels<V>(ch0) is a thread's per-channel
// state, loaded once; term.load<V>(r, ch0) reads row r's V elements of every tensor it needs, and
// term.add<V>(loaded, r, ch0, state, acc) adds their contributions to acc[q][k] (and stores what
// the term writes back, BackwardTerm's masked gradient).
//
// Why loads and adds apart: this grid has few threads (vecs x 8 x chunks: 32K at ResNet-18's 64
// channels and 200K rows, 8K at 512 channels), so with one row's loads in flight a thread waits a
// whole memory latency per row; the H100 profile put the backward partial sums at 0.53 ms of a
// 4.6 ms step, about 3x their bytes at the card's bandwidth (2026-11-27). A thread now issues the
// loads of kRowBatch rows before it adds the first (a store in add, which nvcc must assume may
// alias the next row's loads, kept them one row at a time even when unrolled); the adds run in
// the same row order, so the bits are unchanged. Rows are distinct per thread, so loading a
// later row before storing an earlier one reads the same values even where dz is dy.
constexpr int kRowBatch = 4;
template <int NQ, int V, class Term>
__global__ void __launch_bounds__(kVecThreads)
    channel_partials_vec_kernel(int64_t m, int64_t c, int64_t rows_per_chunk, int64_t chunks,
                                Term term, double* __restrict__ partial) {
  extern __shared__ double shared_sums[];
  const int lanes = static_cast<int>(blockDim.x), width = lanes * V + 1;
  const int64_t ch0 = (blockIdx.x * static_cast<int64_t>(lanes) + threadIdx.x) * V;
  const int64_t chunk = blockIdx.y * static_cast<int64_t>(blockDim.z) + threadIdx.z;
  double acc[NQ][V] = {};
  if (ch0 < c && chunk < chunks) {
    const int64_t r0 = chunk * rows_per_chunk;
    const int64_t r1 = r0 + rows_per_chunk < m ? r0 + rows_per_chunk : m;
    const auto state = term.template channels<V>(ch0);
    using Loaded = decltype(term.template load<V>(r0, ch0));
    constexpr int64_t kBatchRows = int64_t{kRowBatch} * kReduceRowLanes;
    int64_t r = r0 + threadIdx.y;
    for (; r + kBatchRows - kReduceRowLanes < r1; r += kBatchRows) {
      Loaded rows[kRowBatch];
#pragma unroll
      for (int u = 0; u < kRowBatch; ++u)
        rows[u] = term.template load<V>(r + u * kReduceRowLanes, ch0);
#pragma unroll
      for (int u = 0; u < kRowBatch; ++u)
        term.template add<V>(rows[u], r + u * kReduceRowLanes, ch0, state, acc);
    }
    for (; r < r1; r += kReduceRowLanes)
      term.template add<V>(term.template load<V>(r, ch0), r, ch0, state, acc);
  }
  double* s =
      shared_sums + threadIdx.z * NQ * kReduceRowLanes * width;  // this chunk's [NQ][8][width]
  for (int q = 0; q < NQ; ++q)
    for (int k = 0; k < V; ++k)
      s[(q * kReduceRowLanes + threadIdx.y) * width + threadIdx.x * V + k] = acc[q][k];
  __syncthreads();
  if (threadIdx.y == 0 && ch0 < c && chunk < chunks)
    for (int q = 0; q < NQ; ++q)
      for (int k = 0; k < V; ++k) {
        double t = 0.0;
        for (int y = 0; y < kReduceRowLanes; ++y)
          t += s[(q * kReduceRowLanes + y) * width + threadIdx.x * V + k];
        partial[(q * chunks + chunk) * c + ch0 + k] = t;
      }
}

// out(ch, total) receives the NQ totals of channel ch (zeros when m == 0).
// Launched with kReduceLanes x kTotalLanes threads: the bound keeps nvcc's register use within
// what a block that size may have, whatever Out needs.
template <int NQ, class Out>
__global__ void __launch_bounds__(kReduceLanes* kTotalLanes)
    channel_totals_kernel(const double* __restrict__ partial, int64_t chunks, int64_t c, Out out) {
  const int64_t ch = blockIdx.x * static_cast<int64_t>(kReduceLanes) + threadIdx.x;
  double acc[NQ];
  for (int q = 0; q < NQ; ++q) acc[q] = 0.0;
  if (ch < c) {
#pragma unroll 4
    for (int64_t k = threadIdx.y; k < chunks; k += kTotalLanes)
      for (int q = 0; q < NQ; ++q) acc[q] += partial[(q * chunks + k) * c + ch];
  }
  __shared__ double s[NQ][kTotalLanes][kReduceLanes + 1];
  for (int q = 0; q < NQ; ++q) s[q][threadIdx.y][threadIdx.x] = acc[q];
  __syncthreads();
  if (threadIdx.y == 0 && ch < c) {
    double total[NQ];
    for (int q = 0; q < NQ; ++q) {
      double t = 0.0;
      for (int k = 0; k < kTotalLanes; ++k) t += s[q][k][threadIdx.x];
      total[q] = t;
    }
    out(ch, total);
  }
}

// Both passes on `stream`; scratch holds reduce_scratch_elems(m, c, NQ) doubles. V > 1: pass 1 in
// its 16-byte form (the caller has checked vec_fits: c a multiple of V and the term's pointers
// 16-byte aligned); the same bits either way.
template <int NQ, int V = 1, class Term, class Out>
cudaError_t launch_channel_reduce(int64_t m, int64_t c, Term term, Out out, double* scratch,
                                  cudaStream_t stream) {
  if (c <= 0) return cudaSuccess;
  if (m < 0 || c > kMaxChannels || c % V != 0) return cudaErrorInvalidValue;
  const ReducePlan p = reduce_plan(m);
  const int64_t tiles = (c + kReduceLanes - 1) / kReduceLanes;
  if (p.chunks > 0) {
    if (scratch == nullptr) return cudaErrorInvalidValue;
    if constexpr (V > 1) {
      const int64_t vecs = c / V, lanes = vecs < kReduceLanes ? vecs : kReduceLanes;
      const int64_t groups = std::max<int64_t>(1, kVecThreads / (lanes * kReduceRowLanes));
      const dim3 grid(static_cast<unsigned>((vecs + lanes - 1) / lanes),
                      static_cast<unsigned>((p.chunks + groups - 1) / groups));
      const size_t shared =
          static_cast<size_t>(groups * NQ * kReduceRowLanes * (lanes * V + 1)) * sizeof(double);
      channel_partials_vec_kernel<NQ, V>
          <<<grid,
             dim3(static_cast<unsigned>(lanes), kReduceRowLanes, static_cast<unsigned>(groups)),
             shared, stream>>>(m, c, p.rows_per_chunk, p.chunks, term, scratch);
    } else {
      const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(p.chunks));
      channel_partials_kernel<NQ><<<grid, dim3(kReduceLanes, kReduceRowLanes), 0, stream>>>(
          m, c, p.rows_per_chunk, p.chunks, term, scratch);
    }
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  channel_totals_kernel<NQ>
      <<<static_cast<unsigned>(tiles), dim3(kReduceLanes, kTotalLanes), 0, stream>>>(
          scratch, p.chunks, c, out);
  return cudaGetLastError();
}

// Element-wise passes over [m, c] with per-channel constants: block (32 channels x 8 rows), so
// each thread keeps its channel's constants in registers and needs no index division.
inline dim3 rows_grid(int64_t m, int64_t c) {
  const int64_t tiles = (c + kReduceLanes - 1) / kReduceLanes;
  int64_t rows = (m + kReduceRowLanes - 1) / kReduceRowLanes;
  rows = rows < 1 ? 1 : (rows > 65535 ? 65535 : rows);
  return dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(rows));
}

}  // namespace dpt::cuda
