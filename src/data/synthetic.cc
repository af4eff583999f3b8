// --data synthetic:HxWxC:N:K (dataset.h): random images and labels drawn from the seed, for
// throughput at any image size without a data set on disk (the synthetic benchmarks of Horovod
// and TensorFlow). Every rank draws the same sets from the same seed.
#include <limits>
#include <string>
#include <vector>

#include "data/readers.h"
#include "dpt/dataset.h"
#include "dpt/error.h"
#include "dpt/text.h"

namespace dpt {

namespace {

constexpr const char* kPrefix = "synthetic:";

struct SyntheticSpec {
  int64_t rows = 0, cols = 0, channels = 0, n = 0, classes = 0;
  int64_t test_n() const { return (n + 9) / 10; }  // a tenth, rounded up: at least one image
  // Images and labels of both splits, saturated at 2^64 - 1: the fields' ranges allow 2^79
  // (65536x65536x4096 images, 1.1 x 2^34 of them), and a product that wrapped passed the limit
  // (synthetic:65536x65536x256:15252014:10 counted 32 MiB, then failed to allocate: exit 3).
  uint64_t bytes() const {
    uint64_t b = 0;
    return __builtin_mul_overflow(
               static_cast<uint64_t>(n + test_n()),
               static_cast<uint64_t>(rows * cols * channels + static_cast<int64_t>(sizeof(Label))),
               &b)
               ? std::numeric_limits<uint64_t>::max()
               : b;
  }
};

// One decimal field in [lo, hi], or an input error naming the spec, the field and the range.
int64_t field(const std::string& spec, const std::string& text, const char* what, int64_t lo,
              int64_t hi) {
  const std::optional<int64_t> read = read_number<int64_t>(text);  // text.h's one reader
  const int64_t v = read.value_or(lo - 1);
  DPT_INPUT_CHECK(
      read && v >= lo && v <= hi,
      "--data " << printable(spec) << ": " << what << " '" << printable(text)
                << "' is not a whole number in " << lo << ".." << hi
                << " (the form is synthetic:HxWxC:N:K, e.g. synthetic:224x224x3:1024:100)");
  return v;
}

SyntheticSpec parse(const std::string& spec) {
  const std::vector<std::string> parts = split_list(spec.substr(std::string(kPrefix).size()), ':');
  DPT_INPUT_CHECK(parts.size() == 3, "--data " << printable(spec)
                                               << ": expected synthetic:HxWxC:N:K (image shape, "
                                                  "number of training images, classes), e.g. "
                                                  "synthetic:224x224x3:1024:100");
  const std::vector<std::string> dims = split_list(parts[0], 'x');
  DPT_INPUT_CHECK(dims.size() == 3, "--data " << printable(spec) << ": the image shape '"
                                              << printable(parts[0])
                                              << "' is not HxWxC (e.g. 224x224x3)");
  SyntheticSpec s;
  s.rows = field(spec, dims[0], "the height", 1, 1 << 16);
  s.cols = field(spec, dims[1], "the width", 1, 1 << 16);
  s.channels = field(spec, dims[2], "the channel count", 1, 1 << 12);
  s.n = field(spec, parts[1], "the number of training images", 1, int64_t{1} << 34);
  s.classes = field(spec, parts[2], "the number of classes", 1, kMaxClasses);
  DPT_INPUT_CHECK(
      s.bytes() <= data::kMaxDataBytes,
      "--data " << printable(spec) << ": "
                << (s.bytes() == std::numeric_limits<uint64_t>::max() ? "2^64 or more"
                                                                      : std::to_string(s.bytes()))
                << " bytes of images and labels, more than the limit of " << data::kMaxDataBytes
                << " (16 GiB)");
  return s;
}

// SplitMix64: a fast generator whose every state gives a well-mixed output. A split's starting
// state is the seed's first output plus the split: that output is a bijection of the seed, so two
// seeds never start a split alike (seed * 4 + split, the old form, wrapped for seeds 2^62 apart).
struct SplitMix {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
};

ImageSet draw(const SyntheticSpec& s, int64_t n, uint64_t seed, uint64_t split) {
  ImageSet set;
  set.n = n;
  set.rows = s.rows;
  set.cols = s.cols;
  set.channels = s.channels;
  set.num_classes = static_cast<int>(s.classes);
  set.images.resize(static_cast<size_t>(n * set.pixels()));
  set.labels.resize(static_cast<size_t>(n));
  SplitMix g{SplitMix{SplitMix{seed}.next() + split}.next()};
  size_t i = 0;
  for (; i + 8 <= set.images.size(); i += 8) {
    const uint64_t v = g.next();
    for (int b = 0; b < 8; ++b) set.images[i + b] = static_cast<uint8_t>(v >> (8 * b));
  }
  for (; i < set.images.size(); ++i) set.images[i] = static_cast<uint8_t>(g.next());
  // Uniform over the classes: the high 32 bits scaled (Lemire's multiply, bias below 2^-24).
  for (Label& l : set.labels)
    l = static_cast<Label>(((g.next() >> 32) * static_cast<uint64_t>(s.classes)) >> 32);
  return set;
}

}  // namespace

bool is_synthetic(const std::string& data) { return data.rfind(kPrefix, 0) == 0; }

DataSets synthetic_data(const std::string& spec, uint64_t seed) {
  const SyntheticSpec s = parse(spec);
  DataSets out;
  out.format = "synthetic";
  out.train = draw(s, s.n, seed, 1);
  out.test = draw(s, s.test_n(), seed, 2);
  return out;
}

DataSize synthetic_size(const std::string& spec) {
  const SyntheticSpec s = parse(spec);
  DataSize out;
  out.bytes = out.largest_bytes = s.bytes();
  out.largest_file = "(drawn in memory)";
  out.image_shape = {s.rows, s.cols, s.channels};
  out.test_n = s.test_n();
  out.classes = static_cast<int>(s.classes);
  return out;
}

}  // namespace dpt
