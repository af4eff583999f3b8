// Data and layout kernels and their launchers (see data.cuh): one thread per output element.
#include "data.cuh"
#include "launch_util.cuh"

namespace dpt::cuda {

// ----------------------------------------------------------------------------
// Batch gather by index from the uint8 data set on the device, through image_transform.h's crop,
// flip, scaling and normalisation (the CPU's gather_transformed runs the same functions).

static __global__ void gather_images_kernel(const uint8_t* __restrict__ images,
                                            const Label* __restrict__ labels,
                                            const int64_t* __restrict__ idx, int64_t count,
                                            ImageBatchSpec spec, float* __restrict__ out,
                                            int32_t* __restrict__ out_labels) {
  const int64_t pixels = spec.pixels();
  DPT_GRID_STRIDE(i, count * pixels) {
    const int64_t row = i / pixels, p = i % pixels;
    const uint8_t* src = images + idx[row] * pixels;
    int64_t from = p;
    const int64_t c = p % spec.channels;
    if (spec.draws) {
      const int64_t yx = p / spec.channels;
      from = source_pixel(spec, spec.draws[row], yx / spec.cols, yx % spec.cols, c);
    }
    // A true division (input_value), as the CPU's table: x * (1/255.f) differs in 126 of 256
    // values.
    out[i] = input_value(spec, from < 0 ? 0u : src[from], c);
    if (p == 0 && out_labels) out_labels[row] = labels[idx[row]];
  }
}

cudaError_t launch_gather_images(const uint8_t* images, const Label* labels, const int64_t* idx,
                                 int64_t count, const ImageBatchSpec& spec, float* out,
                                 int32_t* out_labels, cudaStream_t stream) {
  if ((labels == nullptr) != (out_labels == nullptr)) return cudaErrorInvalidValue;
  if ((spec.mean == nullptr) != (spec.std == nullptr) || spec.channels <= 0)
    return cudaErrorInvalidValue;
  if (count <= 0 || spec.pixels() <= 0) return cudaSuccess;
  gather_images_kernel<<<blocks_for(count * spec.pixels()), kThreads, 0, stream>>>(
      images, labels, idx, count, spec, out, out_labels);
  return cudaGetLastError();
}

// ----------------------------------------------------------------------------
// NHWC <-> (c, h, w) permutation: one thread per output element, so writes are coalesced; the
// element type only sets the width of the values moved (fp32 or bf16 bits).

template <typename T>
static __global__ void permute_kernel(const T* __restrict__ in, T* __restrict__ out, int64_t n,
                                      int64_t hw, int64_t c, bool to_chw) {
  DPT_GRID_STRIDE(i, n * hw * c) {
    if (to_chw) {  // i = (b*c + ch)*hw + p
      const int64_t p = i % hw, ch = (i / hw) % c, b = i / (hw * c);
      out[i] = in[(b * hw + p) * c + ch];
    } else {  // i = (b*hw + p)*c + ch
      const int64_t ch = i % c, p = (i / c) % hw, b = i / (hw * c);
      out[i] = in[(b * c + ch) * hw + p];
    }
  }
}

cudaError_t launch_permute_nhwc_chw(const float* in, float* out, int64_t n, int64_t h, int64_t w,
                                    int64_t c, bool to_chw, cudaStream_t stream) {
  return launch_over(n * h * w * c, stream, permute_kernel<float>, in, out, n, h * w, c, to_chw);
}

cudaError_t launch_permute_nhwc_chw(const uint16_t* in, uint16_t* out, int64_t n, int64_t h,
                                    int64_t w, int64_t c, bool to_chw, cudaStream_t stream) {
  return launch_over(n * h * w * c, stream, permute_kernel<uint16_t>, in, out, n, h * w, c, to_chw);
}

}  // namespace dpt::cuda
