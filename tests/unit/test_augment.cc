// Unit tests for --augment's per-image draws (image_draw, include/dpt/augment.h): the crop offsets
// stay in [0, 2 pad] and reach both ends, the two offsets and the flip are independent draws, the
// flip comes up about half the time, and a draw is a function of (seed, epoch, index) that changes
// with each of them; crop or flip switched off leaves the image where it is. Counts over many
// images are checked against binomial bounds (5 standard deviations: a correct generator fails
// one in millions, a mutation that loses an offset, a bit or an input fails every time).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "dpt/augment.h"
#include "dpt/image_transform.h"

namespace dpt {
namespace {

// pack_draw's fields read back the way source_pixel reads them (image_transform.h).
struct Draw {
  uint32_t oy, ox;
  bool flip;
};
Draw unpack(uint32_t d) {
  constexpr uint32_t mask = (1u << kDrawBits) - 1;
  return {d & mask, (d >> kDrawBits) & mask, ((d >> (2 * kDrawBits)) & 1u) != 0};
}

AugmentSpec spec(bool crop, bool flip, int pad) {
  AugmentSpec s;
  s.crop = crop, s.flip = flip, s.pad = pad;
  return s;
}

// |count - n p| <= 5 sqrt(n p (1 - p)): the binomial count of n independent events of chance p.
void expect_binomial(int64_t count, int64_t n, double p, const std::string& what) {
  const double mean = static_cast<double>(n) * p, sd = std::sqrt(mean * (1 - p));
  EXPECT_LE(std::fabs(static_cast<double>(count) - mean), 5 * sd)
      << what << ": " << count << " of " << n << ", expected about " << mean;
}

constexpr int64_t kImages = 20000;

TEST(AugmentDraw, CropOffsetsCoverZeroToTwicePadEvenlyAndIndependently) {
  for (const int pad : {1, 2, 4, 7}) {
    SCOPED_TRACE("pad " + std::to_string(pad));
    const AugmentSpec s = spec(true, false, pad);
    const int span = 2 * pad + 1;
    std::vector<int64_t> ys(static_cast<size_t>(span)), xs(static_cast<size_t>(span));
    int64_t same = 0, outside = 0;
    for (int64_t i = 0; i < kImages; ++i) {
      const Draw d = unpack(image_draw(s, 42, 3, i));
      if (d.oy >= static_cast<uint32_t>(span) || d.ox >= static_cast<uint32_t>(span)) {
        ++outside;
        continue;
      }
      ++ys[d.oy], ++xs[d.ox];
      same += d.oy == d.ox;
      EXPECT_FALSE(d.flip) << "flipped without flip, image " << i;
    }
    ASSERT_EQ(outside, 0) << "offsets outside 0.." << 2 * pad;
    // Every offset from 0 to 2 pad inclusive, each about 1/span of the time, in both directions.
    for (int v = 0; v < span; ++v) {
      expect_binomial(ys[static_cast<size_t>(v)], kImages, 1.0 / span, "oy " + std::to_string(v));
      expect_binomial(xs[static_cast<size_t>(v)], kImages, 1.0 / span, "ox " + std::to_string(v));
    }
    // Independent offsets agree 1/span of the time (one drawn from the other's bits: always).
    expect_binomial(same, kImages, 1.0 / span, "oy == ox");
  }
}

TEST(AugmentDraw, FlipComesUpAboutHalfTheTimeIndependentlyOfTheCrop) {
  const AugmentSpec s = spec(true, true, 4);
  int64_t flips = 0, flips_at_centre = 0, at_centre = 0;
  for (int64_t i = 0; i < kImages; ++i) {
    const Draw d = unpack(image_draw(s, 7, 0, i));
    flips += d.flip;
    if (d.ox == 4) ++at_centre, flips_at_centre += d.flip;
  }
  expect_binomial(flips, kImages, 0.5, "flips");
  expect_binomial(flips_at_centre, at_centre, 0.5, "flips among images with ox = pad");
  // Flip alone: the window stays centred (offsets pad, pad), the flip still half the time.
  const AugmentSpec f = spec(false, true, 3);
  int64_t only = 0;
  for (int64_t i = 0; i < kImages; ++i) {
    const Draw d = unpack(image_draw(f, 7, 0, i));
    ASSERT_EQ(d.oy, 3u) << i;
    ASSERT_EQ(d.ox, 3u) << i;
    only += d.flip;
  }
  expect_binomial(only, kImages, 0.5, "flips without crop");
}

TEST(AugmentDraw, NoAugmentationIsTheStoredImage) {
  // Neither crop nor flip: offsets pad, pad (no shift) and no flip, whatever the seed and index.
  for (const int pad : {0, 2}) {
    const AugmentSpec s = spec(false, false, pad);
    for (int64_t i = 0; i < 100; ++i)
      EXPECT_EQ(image_draw(s, 42, 1, i), pack_draw(pad, pad, false)) << pad << " " << i;
  }
}

// A function of (seed, epoch, index): the same arguments, the same draw; another seed, epoch or
// index, another draw for all but about 1/(span^2 x 2) of the images (a draw that ignored one of
// them would repeat every time).
TEST(AugmentDraw, DependsOnSeedEpochAndIndexAlone) {
  const AugmentSpec s = spec(true, true, 4);
  const double p_same = 1.0 / (9 * 9 * 2);
  const int64_t n = 4000;
  int64_t same_seed = 0, same_epoch = 0, same_next = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t d = image_draw(s, 42, 5, i);
    ASSERT_EQ(d, image_draw(s, 42, 5, i)) << i;
    same_seed += d == image_draw(s, 43, 5, i);
    same_epoch += d == image_draw(s, 42, 6, i);
    same_next += d == image_draw(s, 42, 5, i + 1);
  }
  expect_binomial(same_seed, n, p_same, "seed 42 and 43 drew alike");
  expect_binomial(same_epoch, n, p_same, "epochs 5 and 6 drew alike");
  expect_binomial(same_next, n, p_same, "images i and i + 1 drew alike");
  // The epoch and the index are not interchangeable (a draw of epoch + index would repeat along
  // the diagonal): epoch e's image i against epoch e + 1's image i - 1.
  int64_t diagonal = 0;
  for (int64_t i = 1; i <= n; ++i)
    diagonal += image_draw(s, 42, 5, i) == image_draw(s, 42, 6, i - 1);
  expect_binomial(diagonal, n, p_same, "(epoch 5, image i) and (epoch 6, image i - 1) drew alike");
}

// crop's padding follows the image size as documented: max(1, min(rows, cols) / 8).
TEST(AugmentDraw, DefaultCropPaddingIsAnEighthOfTheSmallerSide) {
  EXPECT_EQ(parse_augment("crop", 32, 32).pad, 4);
  EXPECT_EQ(parse_augment("crop", 28, 28).pad, 3);
  EXPECT_EQ(parse_augment("crop,flip", 64, 40).pad, 5);
  EXPECT_EQ(parse_augment("crop", 7, 9).pad, 1);
  const AugmentSpec s = parse_augment("flip,crop=6", 32, 32);
  EXPECT_TRUE(s.crop && s.flip);
  EXPECT_EQ(s.pad, 6);
  EXPECT_EQ(s.text(), "crop=6,flip");
}

}  // namespace
}  // namespace dpt
