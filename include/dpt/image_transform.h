// What happens to an image between the uint8 data set and the model, in one place for the CPU's
// gather (src/cpu/gather.cc) and the CUDA kernel (kernels/data.cu compiles this header with nvcc,
// C++17, no library): the random crop with zero padding and the horizontal flip of --augment, read
// from a per-image draw, then x / 255 and the per-channel normalisation of --normalize.
#pragma once

#include <cstdint>

#include "dpt/host_device.h"

namespace dpt {

// How gather_images turns each gathered image into the model's input. Pointers are backend memory.
struct ImageBatchSpec {
  int64_t rows = 0, cols = 0, channels = 1;
  int pad = 0;                      // the crop's zero padding; a draw's offsets are in [0, 2 pad]
  const uint32_t* draws = nullptr;  // one draw per gathered image (image_draw), or null: as stored
  const float* mean = nullptr;      // `channels` means and standard deviations, or null: x / 255
  const float* std = nullptr;
  DPT_HOST_DEVICE int64_t pixels() const { return rows * cols * channels; }
};

// A draw: the crop's offsets into the padded image (oy, ox in [0, 2 pad]) and the flip.
constexpr int kDrawBits = 12;  // so pads up to 2047 fit
DPT_HOST_DEVICE constexpr uint32_t pack_draw(uint32_t oy, uint32_t ox, bool flip) {
  return oy | (ox << kDrawBits) | (flip ? 1u << (2 * kDrawBits) : 0u);
}

// The offset within its image of the stored pixel that lands at output (y, x, c), or -1 where the
// crop reaches into the zero padding. torchvision's order: RandomCrop(padding) then
// RandomHorizontalFlip, so the flip mirrors the cropped window.
DPT_HOST_DEVICE inline int64_t source_pixel(const ImageBatchSpec& s, uint32_t draw, int64_t y,
                                            int64_t x, int64_t c) {
  constexpr uint32_t mask = (1u << kDrawBits) - 1;
  const int64_t oy = static_cast<int64_t>(draw & mask),
                ox = static_cast<int64_t>((draw >> kDrawBits) & mask);
  const bool flip = (draw >> (2 * kDrawBits)) & 1u;
  const int64_t sy = y + oy - s.pad, sx = (flip ? s.cols - 1 - x : x) + ox - s.pad;
  if (sy < 0 || sy >= s.rows || sx < 0 || sx >= s.cols) return -1;
  return (sy * s.cols + sx) * s.channels + c;
}

// The model's input value of stored byte v (or of the zero padding) in channel c. Without
// normalisation it is v / 255.f exactly (a true division, as the CPU's table and PyTorch's
// ToTensor).
DPT_HOST_DEVICE inline float input_value(const ImageBatchSpec& s, uint32_t v, int64_t c) {
  const float x = static_cast<float>(v) / 255.f;
  return s.mean ? (x - s.mean[c]) / s.std[c] : x;
}

}  // namespace dpt
