// The CPU's batch gather (src/cpu/gather.h): the plain uint8 -> float ToTensor by table lookup, and
// the transformed gather of --augment and --normalize through image_transform.h.
#include "cpu/gather.h"

#include <array>

#include "dpt/error.h"

namespace dpt::cpu {

void images_to_float(const uint8_t* images, int64_t num_images, int64_t per, const int64_t* indices,
                     int64_t count, float* out) {
  // A table lookup is exact (the same float as x / 255.f) and cheaper than a divide per pixel.
  static const std::array<float, 256> kTable = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = static_cast<float>(i) / 255.f;
    return t;
  }();
  DPT_CHECK(count >= 0, "images_to_float: negative count " << count);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t idx = indices[i];
    DPT_CHECK(idx >= 0 && idx < num_images,
              "images_to_float: image index " << idx << " out of range [0, " << num_images << ")");
    const uint8_t* src = images + idx * per;
    float* dst = out + i * per;
    for (int64_t p = 0; p < per; ++p) dst[p] = kTable[src[p]];
  }
}

void gather_transformed(const uint8_t* images, int64_t num_images, const ImageBatchSpec& s,
                        const int64_t* idx, int64_t count, float* x) {
  const int64_t per = s.pixels();
  if (!s.draws && !s.mean) return images_to_float(images, num_images, per, idx, count, x);
  for (int64_t i = 0; i < count; ++i) {
    DPT_CHECK(idx[i] >= 0 && idx[i] < num_images,
              "gather: image index " << idx[i] << " out of range [0, " << num_images << ")");
    const uint8_t* src = images + idx[i] * per;
    float* dst = x + i * per;
    if (!s.draws) {
      for (int64_t p = 0; p < per; ++p) dst[p] = input_value(s, src[p], p % s.channels);
      continue;
    }
    const uint32_t draw = s.draws[i];
    for (int64_t y = 0; y < s.rows; ++y)
      for (int64_t xx = 0; xx < s.cols; ++xx)
        for (int64_t c = 0; c < s.channels; ++c) {
          const int64_t from = source_pixel(s, draw, y, xx, c);
          *dst++ = input_value(s, from < 0 ? 0u : src[from], c);
        }
  }
}

}  // namespace dpt::cpu
