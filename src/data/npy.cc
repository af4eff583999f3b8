// NumPy .npy files (format versions 1.0, 2.0, 3.0): the header's Python dict literal parsed with a
// small bounded parser (never evaluated), then uint8 images or integer labels read in C order.
#include <algorithm>
#include <bit>
#include <cstring>
#include <sstream>

#include "data/readers.h"
#include "dpt/error.h"

namespace dpt::data {

namespace {

// numpy itself refuses headers above 10000 bytes unless told otherwise; a real one is ~128 bytes.
constexpr uint64_t kMaxHeaderBytes = uint64_t{1} << 16;
// Nesting allowed in the header literal: the real one nests two deep; a bound keeps a hostile
// "((((((..." from exhausting the stack.
constexpr int kMaxDepth = 8;

// A value of the Python literal subset numpy writes: str, int, True/False/None, tuple, list, dict.
struct PyValue {
  enum Kind { kStr, kInt, kBool, kNone, kTuple, kList, kDict } kind = kNone;
  std::string str;
  int64_t num = 0;
  bool flag = false;
  std::vector<PyValue> items;     // tuple, list; dict values
  std::vector<std::string> keys;  // dict keys (strings only)
};

class HeaderParser {
 public:
  HeaderParser(const std::string& path, const std::string& text) : path_(path), s_(text) {}

  PyValue parse() {
    PyValue v = value(0);
    skip_space();
    if (pos_ < s_.size() && s_[pos_] == '\0') pos_ = s_.size();  // tolerate NUL padding
    expect(pos_ == s_.size(), "the end of the header");
    return v;
  }

 private:
  void skip_space() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\t' || s_[pos_] == '\r'))
      ++pos_;
  }
  void expect(bool ok, const char* what) {
    if (ok) return;
    // A short printable excerpt of what was found instead: enough to recognise, never the file.
    const std::string found =
        printable(std::string_view(s_).substr(std::min(pos_, s_.size()), 20), 20);
    DPT_INPUT_CHECK(false, path_ << ": bad .npy header: expected " << what << " at byte " << pos_
                                 << " of the header, found "
                                 << (found.empty() ? std::string("its end") : "'" + found + "'"));
  }
  bool eat(char c) {
    skip_space();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool eat_word(const char* w) {
    const size_t n = std::strlen(w);
    if (s_.compare(pos_, n, w) != 0) return false;
    pos_ += n;
    return true;
  }

  PyValue value(int depth) {
    expect(depth < kMaxDepth, "less nesting");
    skip_space();
    expect(pos_ < s_.size(), "a value");
    PyValue v;
    const char c = s_[pos_];
    if (c == '\'' || c == '"') {
      v.kind = PyValue::kStr;
      v.str = string();
    } else if (c == '(' || c == '[') {
      v.kind = c == '(' ? PyValue::kTuple : PyValue::kList;
      const char close = c == '(' ? ')' : ']';
      ++pos_;
      while (!eat(close)) {
        v.items.push_back(value(depth + 1));
        if (eat(close)) break;
        expect(eat(','), "',' or a closing bracket");
      }
    } else if (c == '{') {
      v.kind = PyValue::kDict;
      ++pos_;
      while (!eat('}')) {
        skip_space();
        expect(pos_ < s_.size() && (s_[pos_] == '\'' || s_[pos_] == '"'), "a string key");
        std::string key = string();
        expect(std::find(v.keys.begin(), v.keys.end(), key) == v.keys.end(), "no repeated key");
        expect(eat(':'), "':'");
        v.keys.push_back(std::move(key));
        v.items.push_back(value(depth + 1));
        if (eat('}')) break;
        expect(eat(','), "',' or '}'");
      }
    } else if (c == '-' || c == '+' || (c >= '0' && c <= '9')) {
      v.kind = PyValue::kInt;
      v.num = integer();
    } else if (eat_word("True")) {
      v.kind = PyValue::kBool;
      v.flag = true;
    } else if (eat_word("False")) {
      v.kind = PyValue::kBool;
    } else if (eat_word("None")) {
      v.kind = PyValue::kNone;
    } else {
      expect(false, "a string, number, True, False, a tuple or a dict");
    }
    return v;
  }

  std::string string() {
    const char quote = s_[pos_++];
    std::string out;
    while (pos_ < s_.size() && s_[pos_] != quote) {
      if (s_[pos_] == '\\') {
        ++pos_;
        expect(pos_ < s_.size(), "an escaped character");
      }
      out += s_[pos_++];
    }
    expect(pos_ < s_.size(), "the closing quote of a string");
    ++pos_;
    return out;
  }

  int64_t integer() {
    bool negative = false;
    if (s_[pos_] == '-' || s_[pos_] == '+') negative = s_[pos_++] == '-';
    expect(pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9', "a digit");
    int64_t v = 0;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      expect(v <= (int64_t{1} << 56), "a number below 2^56");
      v = v * 10 + (s_[pos_++] - '0');
    }
    if (pos_ < s_.size() && s_[pos_] == 'L') ++pos_;  // Python 2 wrote long ints as "3L"
    return negative ? -v : v;
  }

  const std::string& path_;
  const std::string& s_;
  size_t pos_ = 0;
};

// What a dtype string means, for messages: "<f4" -> "float32".
std::string dtype_description(const std::string& descr) {
  if (descr.size() < 2) return "not a dtype";
  const std::string body =
      descr.substr(std::string("<>|=").find(descr[0]) != std::string::npos ? 1 : 0);
  if (body.empty()) return "not a dtype";
  const char kind = body[0];
  const std::string size = body.substr(1);
  auto bits = [&]() -> std::string {
    for (char ch : size)
      if (ch < '0' || ch > '9') return printable(size, 20);
    return size.empty() || size.size() > 4 ? size : std::to_string(std::stoi(size) * 8);
  };
  switch (kind) {
    case 'u':
      return "uint" + bits();
    case 'i':
      return "int" + bits();
    case 'f':
      return "float" + bits();
    case 'c':
      return "complex" + bits();
    case 'b':
      return "bool";
    case 'U':
      return "unicode string";
    case 'S':
    case 'a':
      return "byte string";
    case 'O':
      return "Python objects";
    case 'V':
      return "raw void records";
    case 'M':
      return "datetime";
    case 'm':
      return "timedelta";
    default:
      return "not a numeric dtype";
  }
}

// An .npy header, checked as far as its keys and types; what the array must be is the caller's.
struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
  uint64_t data_offset = 0;  // where the array's bytes start
};

NpyHeader read_header(InputFile& in) {
  const std::string& path = in.path();
  uint8_t prefix[12] = {};
  const size_t got = in.read(prefix, std::min<uint64_t>(in.size(), sizeof prefix));
  static const uint8_t kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  DPT_INPUT_CHECK(got >= 6 && std::memcmp(prefix, kMagic, 6) == 0,
                  path << ": not an .npy file: bad magic (an .npy file starts with \\x93NUMPY)");
  DPT_INPUT_CHECK(got >= 10,
                  path << ": truncated: " << got << " bytes, an .npy header needs at least 10");
  const int major = prefix[6], minor = prefix[7];
  DPT_INPUT_CHECK((major >= 1 && major <= 3) && minor == 0,
                  path << ": unsupported .npy format version " << major << "." << minor
                       << " (1.0, 2.0 and 3.0 are read)");
  // 1.0: a 2-byte little-endian header length; 2.0 and 3.0 (utf-8 header): 4 bytes.
  uint64_t header_len = 0, offset = 0;
  if (major == 1) {
    header_len = uint64_t{prefix[8]} | (uint64_t{prefix[9]} << 8);
    offset = 10;
  } else {
    DPT_INPUT_CHECK(got >= 12, path << ": truncated: " << got << " bytes, an .npy " << major
                                    << ".0 header needs at least 12");
    for (int i = 0; i < 4; ++i) header_len |= uint64_t{prefix[8 + i]} << (8 * i);
    offset = 12;
  }
  DPT_INPUT_CHECK(header_len <= kMaxHeaderBytes, path << ": bad .npy header: its length field says "
                                                      << header_len << " bytes, more than the "
                                                      << kMaxHeaderBytes << " a header may have");
  DPT_INPUT_CHECK(offset + header_len <= in.size(), path << ": truncated: the header says it is "
                                                         << header_len << " bytes, the file has "
                                                         << in.size() - offset << " after the "
                                                         << offset << "-byte prefix");
  std::string text(header_len, '\0');
  in.rewind();
  std::vector<uint8_t> skip(offset);
  in.read_exact(skip.data(), offset);
  in.read_exact(reinterpret_cast<uint8_t*>(text.data()), header_len);

  const PyValue dict = HeaderParser(path, text).parse();
  DPT_INPUT_CHECK(
      dict.kind == PyValue::kDict,
      path << ": bad .npy header: not a dict (an .npy header is a Python dict literal)");
  static const char* kKeys[] = {"descr", "fortran_order", "shape"};
  for (const std::string& key : dict.keys) {
    DPT_INPUT_CHECK(std::find(std::begin(kKeys), std::end(kKeys), key) != std::end(kKeys),
                    path << ": bad .npy header: unexpected key '" << printable(key)
                         << "' (the keys are 'descr', 'fortran_order' and 'shape')");
  }
  auto field = [&](const char* key) -> const PyValue& {
    const auto it = std::find(dict.keys.begin(), dict.keys.end(), key);
    DPT_INPUT_CHECK(it != dict.keys.end(), path << ": bad .npy header: no '" << key << "' key");
    return dict.items[static_cast<size_t>(it - dict.keys.begin())];
  };
  NpyHeader h;
  const PyValue& descr = field("descr");
  DPT_INPUT_CHECK(descr.kind != PyValue::kList,
                  path << ": unsupported dtype: a structured dtype (record array); save plain "
                       << "uint8 images and integer labels");
  DPT_INPUT_CHECK(descr.kind == PyValue::kStr,
                  path << ": bad .npy header: 'descr' is not a string");
  h.descr = descr.str;
  const PyValue& fortran = field("fortran_order");
  DPT_INPUT_CHECK(fortran.kind == PyValue::kBool,
                  path << ": bad .npy header: 'fortran_order' is not True or False");
  h.fortran_order = fortran.flag;
  const PyValue& shape = field("shape");
  DPT_INPUT_CHECK(shape.kind == PyValue::kTuple,
                  path << ": bad .npy header: 'shape' is not a tuple");
  for (const PyValue& d : shape.items) {
    DPT_INPUT_CHECK(d.kind == PyValue::kInt && d.num >= 0,
                    path << ": bad .npy header: 'shape' holds something other than a size");
    h.shape.push_back(d.num);
  }
  h.data_offset = offset + header_len;
  return h;
}

// shape x itemsize, refusing a zero dimension and a product above the limit without overflow.
uint64_t promised_bytes(const std::string& path, const NpyHeader& h, uint64_t itemsize) {
  for (size_t i = 0; i < h.shape.size(); ++i) {
    DPT_INPUT_CHECK(h.shape[i] > 0, path << ": zero dimension: dim " << i << " of "
                                         << shape_string(h.shape)
                                         << " is 0, every dimension must be > 0");
  }
  // prod * d > limit  <=>  d > limit / prod (integers), so the check itself cannot overflow.
  uint64_t expected = itemsize;
  for (int64_t d : h.shape) {
    DPT_INPUT_CHECK(static_cast<uint64_t>(d) <= kMaxDataBytes / expected,
                    path << ": absurd size: header says " << shape_string(h.shape) << " of '"
                         << printable(h.descr) << "', more than the limit of " << kMaxDataBytes
                         << " bytes (2^34)");
    expected *= static_cast<uint64_t>(d);
  }
  return expected;
}

// The element size a dtype string names ("<i8": 8); 1 for what names none (such a file is refused
// when it is read, with the reason).
uint64_t item_size(const std::string& descr) {
  const size_t digits = descr.find_first_of("0123456789");
  if (digits == std::string::npos || descr.size() - digits > 2) return 1;
  const uint64_t n = std::stoull(descr.substr(digits));
  return n >= 1 && n <= 16 ? n : 1;
}

// Checks that the file holds exactly shape x itemsize bytes after the header (nothing missing,
// nothing trailing) without overflow and within the limit, and reads them.
std::vector<uint8_t> read_data(InputFile& in, const NpyHeader& h, uint64_t itemsize) {
  const std::string& path = in.path();
  const uint64_t expected = promised_bytes(path, h, itemsize);
  const uint64_t have = in.size() - h.data_offset;
  const std::string promise =
      DPT_MSG("header says " << shape_string(h.shape) << " of '" << printable(h.descr)
                             << "' = " << expected << " bytes of data");
  DPT_INPUT_CHECK(have >= expected, path << ": truncated: " << promise << ", the file has " << have
                                         << " after the header");
  DPT_INPUT_CHECK(have == expected, path << ": trailing bytes: " << promise << ", the file has "
                                         << have << " after the header (" << have - expected
                                         << " trailing bytes)");
  std::vector<uint8_t> data(expected);
  in.read_exact(data.data(), expected);
  return data;
}

}  // namespace

NpyImages read_npy_images(const std::string& path) {
  InputFile in(path);
  const NpyHeader h = read_header(in);
  DPT_INPUT_CHECK(h.descr == "|u1" || h.descr == "<u1" || h.descr == ">u1",
                  path << ": unsupported dtype '" << printable(h.descr) << "' ("
                       << dtype_description(h.descr)
                       << "): images must be uint8 ('|u1'), e.g. a.astype(numpy.uint8)");
  DPT_INPUT_CHECK(h.shape.size() == 3 || h.shape.size() == 4,
                  path << ": wrong ndim: expected 3-D images (n x rows x cols) or 4-D (n x rows x "
                       << "cols x channels), found " << h.shape.size() << "-D "
                       << shape_string(h.shape));
  DPT_INPUT_CHECK(!h.fortran_order,
                  path << ": Fortran order (column-major) is not supported: save a C-order array, "
                       << "e.g. numpy.ascontiguousarray(a)");
  // N x C x H x W (PyTorch's layout) would be read as H = C rows of W x W-channel pixels: train on
  // garbage without a word. Colour images have at most 4 channels, so refuse that pattern.
  DPT_INPUT_CHECK(!(h.shape.size() == 4 && h.shape[1] <= 4 && h.shape[3] > 4),
                  path << ": shape " << shape_string(h.shape) << " looks channels-first (n x "
                       << "channels x rows x cols); images are read as n x rows x cols x channels: "
                       << "numpy.transpose(a, (0, 2, 3, 1))");
  NpyImages out;
  out.data = read_data(in, h, 1);
  out.shape = h.shape;
  return out;
}

std::vector<Label> read_npy_labels(const std::string& path) {
  InputFile in(path);
  const NpyHeader h = read_header(in);
  // '|' on a multi-byte integer means "not applicable"; numpy reads it in the machine's order.
  const std::string& d = h.descr;
  const bool order_ok = d.size() >= 3 && (d[0] == '<' || d[0] == '>' || d[0] == '|');
  const char kind = order_ok ? d[1] : '?';
  const std::string size = order_ok ? d.substr(2) : "";
  const bool size_ok = size == "1" || size == "2" || size == "4" || size == "8";
  DPT_INPUT_CHECK(order_ok && (kind == 'i' || kind == 'u') && size_ok,
                  path << ": unsupported dtype '" << printable(d) << "' (" << dtype_description(d)
                       << "): labels must be integers (int8..int64 or uint8..uint64)");
  DPT_INPUT_CHECK(h.shape.size() == 1, path << ": wrong ndim: expected 1-D labels (n), found "
                                            << h.shape.size() << "-D " << shape_string(h.shape)
                                            << (h.shape.size() == 2 ? " (a.reshape(-1)?)" : ""));
  // A 1-D array is the same bytes in C and Fortran order: fortran_order does not matter here.
  const uint64_t itemsize = static_cast<uint64_t>(size[0] - '0');
  const std::vector<uint8_t> raw = read_data(in, h, itemsize);
  const bool big = d[0] == '>' || (d[0] == '|' && std::endian::native == std::endian::big);
  const size_t n = raw.size() / itemsize;
  std::vector<Label> labels(n);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* b = raw.data() + i * itemsize;
    uint64_t u = 0;
    for (uint64_t k = 0; k < itemsize; ++k) u |= uint64_t{b[big ? itemsize - 1 - k : k]} << (8 * k);
    // Sign-extend a signed value whose top bit is set, so -1 is named as -1.
    const bool negative = kind == 'i' && (u >> (8 * itemsize - 1)) & 1;
    if (negative && itemsize < 8) u |= ~uint64_t{0} << (8 * itemsize);
    DPT_INPUT_CHECK(!negative && u < static_cast<uint64_t>(kMaxClasses),
                    path << ": label "
                         << (negative ? std::to_string(static_cast<int64_t>(u)) : std::to_string(u))
                         << " at index " << i << " is outside 0.." << kMaxClasses - 1
                         << " (labels are class numbers 0.." << kMaxClasses - 1 << ")");
    labels[i] = static_cast<Label>(u);
  }
  return labels;
}

FileData npy_file_data(const std::string& path) {
  InputFile in(path);
  const NpyHeader h = read_header(in);
  return {.path = path, .bytes = promised_bytes(path, h, item_size(h.descr)), .dims = h.shape};
}

SplitFiles npy_split_files(const std::string& dir, const std::string& split) {
  const std::string names[2] = {split + "_images.npy", split + "_labels.npy"};
  for (const std::string& name : names) {
    DPT_INPUT_CHECK(!first_existing(dir, {name}).empty(),
                    dir << ": no " << name << " (the npy format needs train_images.npy, "
                        << "train_labels.npy, test_images.npy and test_labels.npy)");
  }
  return {first_existing(dir, {names[0]}), first_existing(dir, {names[1]})};
}

LoadedSplit load_npy_split(const std::string& dir, const std::string& split) {
  LoadedSplit out;
  const SplitFiles files = npy_split_files(dir, split);
  out.images_file = files.images;
  out.labels_file = files.labels;
  NpyImages img = read_npy_images(out.images_file);
  return make_split(out.images_file, out.labels_file, img.shape, std::move(img.data),
                    read_npy_labels(out.labels_file));
}

LoadedSplits load_npy(const std::string& dir) {
  return {load_npy_split(dir, "train"), load_npy_split(dir, "test")};
}

FileBytes npy_file_bytes(const std::string& dir) {
  return split_file_bytes(dir, {"train", "test"}, npy_split_files, npy_file_data);
}

}  // namespace dpt::data
