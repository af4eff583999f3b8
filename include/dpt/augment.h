// --augment and --normalize: parsing, and the per-image random draws of augmentation (pack_draw of
// image_transform.h, which the CPU's gather, src/cpu/gather.h, and the CUDA kernel apply).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dpt/dataset.h"

namespace dpt {

// --augment: "none", or a comma list of "crop" (padding max(1, min(rows, cols) / 8): 4 for 32x32,
// 3 for 28x28), "crop=P" and "flip". With rows = cols = 0 only the syntax is checked (pad left 0
// for a bare "crop"). Input errors name --augment.
struct AugmentSpec {
  bool crop = false, flip = false;
  int pad = 0;
  bool any() const { return crop || flip; }
  std::string text() const;  // "none", "crop=4,flip", ...
};
AugmentSpec parse_augment(const std::string& value, int64_t rows, int64_t cols);

// The draw of training image `index` in epoch `epoch` (pack_draw): a function of (seed, epoch,
// index) alone, so an image is augmented alike whichever rank takes it and however many there are.
uint32_t image_draw(const AugmentSpec& spec, uint64_t seed, int64_t epoch, int64_t index);

// --normalize: "none" (empty), "auto" (channel_stats of the training set) or "M1,..,Mc/S1,..,Sc"
// (c = the data's channels; each value a finite float, every S a normal positive float, and every
// input (x/255 - M) / S finite). With train == nullptr only the values and the syntax are checked.
struct Normalization {
  std::vector<float> mean, std;
  bool any() const { return !mean.empty(); }
  std::string text() const;  // "none" or mean_text() + "/" + std_text()
  // "M1,..,Mc" and "S1,..,Sc", with every digit a float needs (the checkpoint metadata's values).
  std::string mean_text() const;
  std::string std_text() const;
};
Normalization resolve_normalize(const std::string& value, const ImageSet* train);

}  // namespace dpt
