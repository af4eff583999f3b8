// 16-byte passes over the rows of a row-major [m, c] view (NHWC, m = N*H*W) for the kernels that
// also read per-channel values (BatchNorm's apply passes, and channel_reduce.cuh's partial sums):
// a private helper, not an op. Device-side (.cu files only).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

namespace dpt::cuda {

// Why: with one element per thread (32 channels x 8 rows a block), a bf16 pass issues a 2-byte
// load per tensor per element and reloads the channel's values for it, and a block is launched
// for every 256 elements; BatchNorm's backward apply ran at 41 us a call, about half the H100's
// bandwidth (ncu, 2026-11-27). Here a thread takes V adjacent channels of a row (V elements, 16
// bytes: 8 bf16 or 4 fp32) per access, holds their per-channel values in registers, and walks the
// rows; each element's arithmetic is the same function as the one-element kernel's, so the bits
// are the same.
// V adjacent elements loaded and stored in one access (aligned to their size): V = 1 is one
// element, Vec16 the 16-byte form (kernels/pooling.cu takes either).
template <typename T, int V>
struct alignas(V * sizeof(T)) Lanes {
  static constexpr int kN = V;
  T v[V];
};
template <typename T, int V>
__device__ __forceinline__ Lanes<T, V> load_lanes(const T* p) {
  return *reinterpret_cast<const Lanes<T, V>*>(p);
}
template <typename T, int V>
__device__ __forceinline__ void store_lanes(const Lanes<T, V>& l, T* p) {
  *reinterpret_cast<Lanes<T, V>*>(p) = l;
}
template <typename T>
using Vec16 = Lanes<T, 16 / static_cast<int>(sizeof(T))>;
template <typename T>
__device__ __forceinline__ Vec16<T> load16(const T* p) {
  return load_lanes<T, Vec16<T>::kN>(p);
}
template <typename T>
__device__ __forceinline__ void store16(const Vec16<T>& v, T* p) {
  store_lanes<T, Vec16<T>::kN>(v, p);
}

constexpr int kVecThreads = 256;
// At most this many blocks: each walks its rows with a stride, so the per-channel values are
// loaded once per thread instead of once per element (about 8 resident blocks of 256 threads on
// each of an H100's 132 SMs, twice over).
constexpr int64_t kVecMaxBlocks = 2048;

// Thread t of a block: vector column t % cols (channels V*col .. V*col + V - 1), row t / cols of
// the block's rows_per_block (threads past cols * rows_per_block idle).
struct VecRows {
  int64_t cols = 0, rows_per_block = 0;
  dim3 grid;
};

// Whether rows of c elements can be read 16 bytes at a time through every non-null pointer: c a
// multiple of V and each pointer 16-byte aligned.
template <typename T>
bool vec_fits(int64_t c, std::initializer_list<const void*> ptrs) {
  if (c <= 0 || c % Vec16<T>::kN != 0) return false;
  for (const void* p : ptrs)
    if (p && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// Whether the 16-byte element-wise form applies (vec_fits, and at most kVecThreads vectors a
// row), and its grid.
template <typename T>
bool vec_rows(int64_t m, int64_t c, std::initializer_list<const void*> ptrs, VecRows* out) {
  constexpr int64_t v = Vec16<T>::kN;
  if (m <= 0 || !vec_fits<T>(c, ptrs) || c / v > kVecThreads) return false;
  out->cols = c / v;
  out->rows_per_block = kVecThreads / out->cols;
  int64_t blocks = (m + out->rows_per_block - 1) / out->rows_per_block;
  blocks = blocks < 1 ? 1 : (blocks > kVecMaxBlocks ? kVecMaxBlocks : blocks);
  out->grid = dim3(static_cast<unsigned>(blocks));
  return true;
}

}  // namespace dpt::cuda
