// The filter layout kernel and its launchers (see conv_filter.cuh): one grid-stride pass over the
// destination, templated on the source and destination element types.
#include "conv_filter.cuh"
#include "launch_util.cuh"
#include "storage.cuh"

namespace dpt::cuda {

namespace {

// Thread i writes destination element i; its source index depends on the move. A bf16 -> bf16
// move widens and narrows back, which is exact.
template <typename S, typename D>
__global__ void filter_move_kernel(const S* __restrict__ src, D* __restrict__ dst, int64_t co,
                                   int64_t ci, int64_t kk, FilterMove move, bool accumulate) {
  const int64_t n = co * ci * kk;
  DPT_GRID_STRIDE(i, n) {
    int64_t j = i;
    if (move == FilterMove::kToOhwi) {  // i = (o*kk + s)*ci + c  <-  (o*ci + c)*kk + s
      const int64_t c = i % ci, s = (i / ci) % kk, o = i / (ci * kk);
      j = (o * ci + c) * kk + s;
    } else if (move == FilterMove::kToOihw) {  // i = (o*ci + c)*kk + s  <-  (o*kk + s)*ci + c
      const int64_t s = i % kk, c = (i / kk) % ci, o = i / (ci * kk);
      j = (o * kk + s) * ci + c;
    }
    const float v = widen(src[j]);
    store(accumulate ? widen(dst[i]) + v : v, dst[i]);
  }
}

template <typename S, typename D>
cudaError_t launch(const S* src, D* dst, int64_t co, int64_t ci, int64_t kk, FilterMove move,
                   bool accumulate, cudaStream_t stream) {
  const int64_t n = co * ci * kk;
  if (n <= 0) return cudaSuccess;
  filter_move_kernel<<<blocks_for(n), kThreads, 0, stream>>>(src, dst, co, ci, kk, move,
                                                             accumulate);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_filter_move(const float* src, float* dst, int64_t co, int64_t ci, int64_t kk,
                               FilterMove move, bool accumulate, cudaStream_t stream) {
  return launch(src, dst, co, ci, kk, move, accumulate, stream);
}

cudaError_t launch_filter_move_bf16(const uint16_t* src, uint16_t* dst, int64_t co, int64_t ci,
                                    int64_t kk, FilterMove move, cudaStream_t stream) {
  return launch(as_bf16(src), as_bf16(dst), co, ci, kk, move, false, stream);
}

cudaError_t launch_filter_move_to_bf16(const float* src, uint16_t* dst, int64_t co, int64_t ci,
                                       int64_t kk, FilterMove move, cudaStream_t stream) {
  return launch(src, as_bf16(dst), co, ci, kk, move, false, stream);
}

cudaError_t launch_filter_move_from_bf16(const uint16_t* src, float* dst, int64_t co, int64_t ci,
                                         int64_t kk, FilterMove move, bool accumulate,
                                         cudaStream_t stream) {
  return launch(as_bf16(src), dst, co, ci, kk, move, accumulate, stream);
}

}  // namespace dpt::cuda
