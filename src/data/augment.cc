// --augment and --normalize (include/dpt/augment.h): their parsing, and the counter-based draws
// that make augmentation independent of the rank count (the gathers that apply them:
// src/cpu/gather.cc and kernels/data.cu).
#include "dpt/augment.h"

#include <cmath>
#include <iomanip>
#include <limits>
#include <sstream>

#include "dpt/error.h"
#include "dpt/image_transform.h"
#include "dpt/text.h"

namespace dpt {

namespace {

// SplitMix64's finaliser: a counter-based generator needs no state to carry between ranks or
// epochs.
uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Each value is checked as the float it is stored in, not as the double read_number reads: 1e39 is
// a finite double but an infinite float, and 1e-40 a positive double but a subnormal float, which
// as a standard deviation turns most inputs into infinities. Messages quote the value as given. An
// empty list is no values (split_list's rule), so "/" is refused as giving no means.
std::vector<float> parse_floats(const std::string& list, const std::string& value, bool stds) {
  const char* what = stds ? "standard deviation" : "mean";
  std::vector<float> out;
  for (const std::string& t : split_list(list, ',')) {
    NumberError why = NumberError::kNone;
    const std::optional<double> read = read_number<double>(t, &why);  // text.h's one reader
    DPT_INPUT_CHECK(read || why == NumberError::kTooLarge,
                    "--normalize '" << value << "': " << what << " '" << t << "' "
                                    << number_error_text<double>(why));
    const double v = read.value_or(HUGE_VAL);
    const float f = static_cast<float>(v);
    DPT_INPUT_CHECK(std::isfinite(f), "--normalize '" << value << "': " << what << " " << t
                                                      << " is outside a float's range (|x| <= "
                                                      << std::numeric_limits<float>::max() << ")");
    DPT_INPUT_CHECK(!stds || v > 0,
                    "--normalize '" << value << "': standard deviation " << t << " is not > 0");
    DPT_INPUT_CHECK(!stds || std::isnormal(f), "--normalize '"
                                                   << value << "': standard deviation " << t
                                                   << " is below the smallest normal float ("
                                                   << std::numeric_limits<float>::min() << ")");
    out.push_back(f);
  }
  return out;
}

std::string join(const std::vector<float>& v) {
  std::ostringstream os;
  os << std::setprecision(std::numeric_limits<float>::max_digits10);
  for (size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
  return os.str();
}

}  // namespace

std::string AugmentSpec::text() const {
  if (!any()) return "none";
  std::string s = crop ? "crop=" + std::to_string(pad) : "";
  if (flip) s += std::string(crop ? "," : "") + "flip";
  return s;
}

AugmentSpec parse_augment(const std::string& value, int64_t rows, int64_t cols) {
  AugmentSpec spec;
  // An empty value (an unset variable) is not taken for none: the user meant some augmentation.
  DPT_INPUT_CHECK(!value.empty(), "--augment: empty; use none for no augmentation");
  if (value == "none") return spec;
  for (const std::string& item : split_list(value, ',')) {
    if (item == "flip") {
      DPT_INPUT_CHECK(!spec.flip, "--augment '" << value << "': flip is given twice");
      spec.flip = true;
      continue;
    }
    DPT_INPUT_CHECK(item == "crop" || item.rfind("crop=", 0) == 0,
                    "--augment '" << value << "': '" << item
                                  << "' is not crop, crop=P or flip (or none alone)");
    DPT_INPUT_CHECK(!spec.crop, "--augment '" << value << "': crop is given twice");
    spec.crop = true;
    if (item == "crop") {
      spec.pad = static_cast<int>(std::max<int64_t>(1, std::min(rows, cols) / 8));
    } else {
      const std::string p = item.substr(5);
      const std::optional<int> v = read_number<int>(p);
      DPT_INPUT_CHECK(v && *v >= 1 && *v <= 2047, "--augment '"
                                                      << value << "': crop=" << p
                                                      << " is not a padding of 1..2047 pixels");
      spec.pad = *v;
    }
  }
  // A window shifted by more than the image would see only padding.
  DPT_INPUT_CHECK(rows == 0 || !spec.crop || (spec.pad < rows && spec.pad < cols),
                  "--augment '" << value << "': a crop padding of " << spec.pad
                                << " pixels needs images larger than " << spec.pad << "x"
                                << spec.pad << ", the data's are " << rows << "x" << cols);
  return spec;
}

uint32_t image_draw(const AugmentSpec& spec, uint64_t seed, int64_t epoch, int64_t index) {
  // Domain-separated from the sampler's and the initialisation's use of the seed.
  const uint64_t h = mix(mix(mix(seed ^ 0x6175676d656e74ULL) + static_cast<uint64_t>(epoch)) +
                         static_cast<uint64_t>(index));
  const uint32_t span = static_cast<uint32_t>(2 * spec.pad + 1);
  const uint32_t oy = spec.crop ? static_cast<uint32_t>((h & 0xffffffffULL) % span) : spec.pad;
  const uint32_t ox =
      spec.crop ? static_cast<uint32_t>(((h >> 32) & 0x7fffffffULL) % span) : spec.pad;
  const bool flip = spec.flip && (h >> 63) != 0;
  return pack_draw(oy, ox, flip);
}

std::string Normalization::mean_text() const { return join(mean); }
std::string Normalization::std_text() const { return join(std); }
std::string Normalization::text() const { return any() ? mean_text() + "/" + std_text() : "none"; }

Normalization resolve_normalize(const std::string& value, const ImageSet* train) {
  Normalization n;
  if (value == "none") return n;
  if (value == "auto") {
    if (!train) return n;
    const ChannelStats st = channel_stats(*train);
    for (size_t c = 0; c < st.mean.size(); ++c) {
      n.mean.push_back(static_cast<float>(st.mean[c]));
      // A constant channel has no spread to divide by: it is only centred.
      n.std.push_back(st.std[c] > 0 ? static_cast<float>(st.std[c]) : 1.f);
    }
    return n;
  }
  const auto halves = split_list(value, '/');
  DPT_INPUT_CHECK(
      halves.size() == 2,
      "--normalize '" << value
                      << "' is not none, auto or M1,..,Mc/S1,..,Sc (means / standard deviations)");
  n.mean = parse_floats(halves[0], value, false);
  n.std = parse_floats(halves[1], value, true);
  DPT_INPUT_CHECK(!n.mean.empty(),
                  "--normalize '" << value << "' gives no means: write M1,..,Mc/S1,..,Sc");
  DPT_INPUT_CHECK(n.mean.size() == n.std.size(),
                  "--normalize '" << value << "' gives " << n.mean.size() << " means but "
                                  << n.std.size() << " standard deviations");
  // A large mean over a small standard deviation overflows too: every input a pixel in [0, 1] makes
  // must be a finite float, computed as the transform computes it (image_transform.h).
  for (size_t c = 0; c < n.std.size(); ++c)
    DPT_INPUT_CHECK(
        std::isfinite((0.f - n.mean[c]) / n.std[c]) && std::isfinite((1.f - n.mean[c]) / n.std[c]),
        "--normalize '" << value << "': mean " << n.mean[c] << " over standard deviation "
                        << n.std[c] << " makes inputs outside a float's range");
  DPT_INPUT_CHECK(!train || static_cast<int64_t>(n.mean.size()) == train->channels,
                  "--normalize '" << value << "' gives " << n.mean.size()
                                  << " channel(s), the data's images have " << train->channels);
  return n;
}

}  // namespace dpt
