// safetensors I/O: a strict parser (also the libFuzzer entry point's target, so it must survive any
// byte string without UB) and a crash-safe writer (dpt::AtomicFile).
#include "dpt/safetensors.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <utility>

#include "dpt/error.h"
#include "dpt/files.h"

namespace dpt {

// Tensor bytes are copied verbatim between memory and file, which is only correct on a
// little-endian host (every platform this project targets).
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes little-endian");

namespace {

using nlohmann::json;

// Headers of real checkpoints are a few KB; the cap keeps a hostile length from driving a huge
// allocation (the same limit the reference implementation uses).
constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;
// A valid header nests 3 deep (object -> entry -> shape array). Bounding the depth before handing
// the text to nlohmann keeps a fuzzed "[[[[..." from exhausting the stack.
constexpr int kMaxHeaderDepth = 16;
constexpr const char* kMetadataKey = "__metadata__";

// product(shape); false when a dimension is negative or the product overflows int64.
bool checked_numel(const std::vector<int64_t>& shape, int64_t* numel) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return false;
  }
  *numel = n;
  return true;
}

// product(shape) * element size in bytes; false on overflow (of int64 or size_t).
bool checked_nbytes(const std::vector<int64_t>& shape, size_t elem, uint64_t* nbytes) {
  int64_t numel = 0;
  if (!checked_numel(shape, &numel)) return false;
  uint64_t n = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(numel), static_cast<uint64_t>(elem), &n))
    return false;
  if (n > std::numeric_limits<size_t>::max()) return false;
  *nbytes = n;
  return true;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Maximum bracket nesting of JSON text, ignoring brackets inside strings. Stops early (returning
// a value above `limit`) so the scan is linear and cheap.
int json_depth(const char* p, size_t n, int limit) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < n; ++i) {
    char c = p[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
      if (max_depth > limit) return max_depth;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}

// A JSON value that is a non-negative integer fitting in int64 (nlohmann stores those as
// unsigned; negative integers and floats are rejected by the callers with their own message).
bool as_nonneg_int(const json& v, uint64_t* out) {
  if (!v.is_number_unsigned()) return false;
  uint64_t u = v.get<uint64_t>();
  if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
  *out = u;
  return true;
}

// One header entry as parsed, before its bytes are copied out.
struct Entry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

Entry parse_entry(const std::string& name, const json& v, uint64_t data_size,
                  const std::string& origin) {
  DPT_INPUT_CHECK(!name.empty(), origin << ": safetensors header has a tensor with an empty name");
  DPT_INPUT_CHECK(v.is_object(), origin << ": tensor '" << printable(name)
                                        << "': header entry is a " << v.type_name()
                                        << ", expected an object");
  Entry e;
  e.name = name;

  auto dt = v.find("dtype");
  DPT_INPUT_CHECK(dt != v.end(),
                  origin << ": tensor '" << printable(name) << "': missing \"dtype\"");
  DPT_INPUT_CHECK(dt->is_string(), origin << ": tensor '" << printable(name) << "': \"dtype\" is a "
                                          << dt->type_name() << ", expected a string");
  e.dtype = dt->get<std::string>();
  size_t elem = st_dtype_size(e.dtype);
  DPT_INPUT_CHECK(elem != 0, origin << ": tensor '" << printable(name) << "': unknown dtype \""
                                    << printable(e.dtype) << "\"");

  auto sh = v.find("shape");
  DPT_INPUT_CHECK(sh != v.end(),
                  origin << ": tensor '" << printable(name) << "': missing \"shape\"");
  DPT_INPUT_CHECK(sh->is_array(), origin << ": tensor '" << printable(name) << "': \"shape\" is a "
                                         << sh->type_name() << ", expected an array");
  for (const json& d : *sh) {
    uint64_t u = 0;
    DPT_INPUT_CHECK(as_nonneg_int(d, &u), origin << ": tensor '" << printable(name) << "': shape "
                                                 << printable(sh->dump()) << " has "
                                                 << printable(d.dump())
                                                 << ", expected non-negative integers");
    e.shape.push_back(static_cast<int64_t>(u));
  }
  uint64_t nbytes = 0;
  DPT_INPUT_CHECK(checked_nbytes(e.shape, elem, &nbytes),
                  origin << ": tensor '" << printable(name) << "': shape "
                         << printable(shape_str(e.shape)) << " overflows the element count");

  auto off = v.find("data_offsets");
  DPT_INPUT_CHECK(off != v.end(),
                  origin << ": tensor '" << printable(name) << "': missing \"data_offsets\"");
  DPT_INPUT_CHECK(off->is_array() && off->size() == 2 && as_nonneg_int((*off)[0], &e.begin) &&
                      as_nonneg_int((*off)[1], &e.end),
                  origin << ": tensor '" << printable(name) << "': \"data_offsets\" is "
                         << printable(off->dump())
                         << ", expected [begin, end] of non-negative integers");
  DPT_INPUT_CHECK(e.begin <= e.end, origin << ": tensor '" << printable(name) << "': data_offsets ["
                                           << e.begin << ", " << e.end << "] has begin > end");
  DPT_INPUT_CHECK(e.end <= data_size, origin << ": tensor '" << printable(name)
                                             << "': data_offsets [" << e.begin << ", " << e.end
                                             << "] out of range: the data section has " << data_size
                                             << " bytes (file truncated?)");
  DPT_INPUT_CHECK(e.end - e.begin == nbytes,
                  origin << ": tensor '" << printable(name) << "': data_offsets [" << e.begin
                         << ", " << e.end << "] span " << (e.end - e.begin) << " bytes but shape "
                         << printable(shape_str(e.shape)) << " of " << e.dtype << " needs "
                         << nbytes);
  return e;
}

}  // namespace

size_t st_dtype_size(const std::string& dtype) {
  static const std::map<std::string, size_t> kSizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"U16", 2},  {"I16", 2}, {"F16", 2}, {"BF16", 2},    {"U32", 4},
      {"I32", 4},  {"F32", 4}, {"U64", 8}, {"I64", 8},     {"F64", 8},
  };
  auto it = kSizes.find(dtype);
  return it == kSizes.end() ? 0 : it->second;
}

const StTensor* StFile::find(const std::string& name) const {
  for (const StTensor& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

// The header of a safetensors image of `size` bytes whose first `avail` bytes are at `data` (at
// least the length field and the header): metadata into *file, the entries sorted by offset and
// checked to tile the data section. Returns the header length.
uint64_t parse_header(const uint8_t* data, size_t avail, uint64_t size, const std::string& origin,
                      StFile* file_out, std::vector<Entry>* entries_out, bool whole = true) {
  DPT_INPUT_CHECK(size >= 8 && avail >= 8, origin
                                               << ": not a safetensors file: " << size
                                               << " bytes, need at least 8 for the header length");
  uint64_t n = 0;
  std::memcpy(&n, data, 8);
  const uint64_t rest = size - 8;
  DPT_INPUT_CHECK(n <= kMaxHeaderBytes, origin << ": absurd header length " << n << " (limit "
                                               << kMaxHeaderBytes << " bytes)");
  DPT_INPUT_CHECK(n <= rest, origin << ": absurd header length " << n << ": only " << rest
                                    << " bytes follow the length field (file truncated?)");
  DPT_CHECK(avail >= 8 + n, origin << ": header not read whole");
  const char* hdr = reinterpret_cast<const char*>(data + 8);
  DPT_INPUT_CHECK(json_depth(hdr, n, kMaxHeaderDepth) <= kMaxHeaderDepth,
                  origin << ": safetensors header nests deeper than " << kMaxHeaderDepth);

  // nlohmann keeps the last of two equal keys: a tensor named twice would load one entry and pass
  // over the other (safetensors forbids it). The parse callback sees every key of every object, so
  // a duplicate is refused there, naming it (a stack of the keys seen per open object).
  std::vector<std::set<std::string>> keys;
  auto refuse_duplicates = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      keys.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      keys.pop_back();
    } else if (event == json::parse_event_t::key) {
      const std::string& key = parsed.get_ref<const std::string&>();
      DPT_INPUT_CHECK(keys.back().insert(key).second,
                      origin << ": safetensors header has "
                             << (keys.size() == 1 && key != kMetadataKey ? "tensor" : "key") << " '"
                             << printable(key) << "' twice"
                             << (keys.size() == 1 ? "" : " in one object"));
    }
    return true;
  };
  json header;
  try {
    header = json::parse(hdr, hdr + n, refuse_duplicates);
  } catch (const json::exception& e) {
    DPT_INPUT_CHECK(false, origin << ": safetensors header (" << n
                                  << " bytes) is not valid JSON: " << printable(e.what(), 300));
  }
  DPT_INPUT_CHECK(header.is_object(), origin << ": safetensors header is a JSON "
                                             << header.type_name() << ", expected an object");

  // Without the data (`whole` false: the header alone), entries are checked among themselves only.
  const uint64_t data_size = whole ? rest - n : std::numeric_limits<uint64_t>::max();
  StFile& file = *file_out;
  std::vector<Entry>& entries = *entries_out;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == kMetadataKey) {
      DPT_INPUT_CHECK(it->is_object(), origin << ": \"__metadata__\" is a " << it->type_name()
                                              << ", expected an object of strings");
      for (auto m = it->begin(); m != it->end(); ++m) {
        DPT_INPUT_CHECK(m->is_string(), origin << ": metadata '" << printable(m.key()) << "' is a "
                                               << m->type_name() << " (" << printable(m->dump())
                                               << "), expected a string");
        file.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(it.key(), *it, data_size, origin));
  }

  // The reference implementation requires the ranges to tile the data section: sorted by
  // offset, each starts where the previous ended and the last ends at the end of the file.
  // Names break ties between empty tensors at one offset, so the order is deterministic.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  uint64_t cursor = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    DPT_INPUT_CHECK(e.begin >= cursor,
                    origin << ": tensor '" << printable(e.name) << "': data_offsets [" << e.begin
                           << ", " << e.end << "] overlap tensor '"
                           << printable(prev ? prev->name : "") << "' which ends at " << cursor);
    DPT_INPUT_CHECK(e.begin == cursor, origin << ": tensor '" << printable(e.name)
                                              << "': data_offsets [" << e.begin << ", " << e.end
                                              << "] leave a gap of " << (e.begin - cursor)
                                              << " unused bytes before it");
    cursor = e.end;
    prev = &e;
  }
  DPT_INPUT_CHECK(!whole || cursor == data_size,
                  origin << ": " << (data_size - cursor)
                         << " trailing bytes after the last tensor: the file has " << size
                         << " bytes, its header accounts for " << (8 + n + cursor) << " (data "
                         << "section " << data_size << " bytes, tensors cover " << cursor << ")");
  return n;
}

json parse_metadata_json(const std::string& text) {
  DPT_INPUT_CHECK(json_depth(text.data(), text.size(), kMaxHeaderDepth) <= kMaxHeaderDepth,
                  "it nests deeper than " << kMaxHeaderDepth);
  return json::parse(text);
}

StFile parse_safetensors(const uint8_t* data, size_t size, const std::string& origin) {
  StFile file;
  std::vector<Entry> entries;
  const uint64_t n = parse_header(data, size, size, origin, &file, &entries);
  const uint8_t* section = data + 8 + n;
  file.tensors.reserve(entries.size());
  for (Entry& e : entries) {
    StTensor t;
    t.name = std::move(e.name);
    t.dtype = std::move(e.dtype);
    t.shape = std::move(e.shape);
    t.bytes.assign(section + e.begin, section + e.end);
    file.tensors.push_back(std::move(t));
  }
  return file;
}

namespace {
using FileGuard = std::unique_ptr<FILE, int (*)(FILE*)>;

// `path` opened for reading, and its size. Never blocks: a FIFO or device is refused before
// anything is read from it.
FileGuard open_safetensors(const std::string& path, uint64_t& size) {
  const int fd = open_input_file(path, "safetensors file");
  FILE* f = ::fdopen(fd, "rb");
  if (!f) {
    const int err = errno;
    ::close(fd);
    throw Error(ErrorKind::kInput,
                DPT_MSG("cannot open safetensors file " << path << ": " << std::strerror(err)));
  }
  FileGuard guard(f, std::fclose);
  struct stat st {};
  DPT_INPUT_CHECK(::fstat(fileno(f), &st) == 0,
                  "cannot stat safetensors file " << path << ": " << std::strerror(errno));
  size = static_cast<uint64_t>(st.st_size);
  return guard;
}
}  // namespace

namespace {
// The length field and the header of the file open as `f` (of `size` bytes), read from its start:
// never more than 8 + 100 MB, whatever the file's size. A length parse_header refuses is not
// followed (the 8 bytes alone go to parse_header, which says what is wrong).
std::vector<uint8_t> read_head(FILE* f, uint64_t size, const std::string& path) {
  std::vector<uint8_t> head(8);
  DPT_INPUT_CHECK(size >= 8 && std::fread(head.data(), 1, 8, f) == 8,
                  path << ": not a safetensors file: " << size
                       << " bytes, need at least 8 for the header length");
  uint64_t n = 0;
  std::memcpy(&n, head.data(), 8);
  if (n <= kMaxHeaderBytes && n <= size - 8) {
    head.resize(8 + n);
    DPT_INPUT_CHECK(std::fread(head.data() + 8, 1, n, f) == n,
                    "cannot read safetensors file " << path);
  }
  return head;
}
}  // namespace

StFile read_safetensors(const std::string& path,
                        const std::function<void(const StFile&)>& check_header) {
  // The header first, checked against the file's size (the tensors must cover the data section
  // exactly), and only then the data: a file of 50 GB whose header accounts for 100 KB is refused
  // without reading it or allocating for it.
  uint64_t size = 0;
  FileGuard guard = open_safetensors(path, size);
  FILE* f = guard.get();
  const std::vector<uint8_t> head = read_head(f, size, path);
  StFile file;
  std::vector<Entry> entries;
  const uint64_t n = parse_header(head.data(), head.size(), size, path, &file, &entries);
  if (check_header) {
    for (const Entry& e : entries) file.tensors.push_back({e.name, e.dtype, e.shape, {}});
    check_header(file);
    file.tensors.clear();
  }
  // The entries tile the data section in offset order, which follows the header at once: one
  // sequential read per tensor, of exactly the bytes its entry covers.
  file.tensors.reserve(entries.size());
  uint64_t at = 8 + n;
  for (Entry& e : entries) {
    StTensor t;
    t.name = std::move(e.name);
    t.dtype = std::move(e.dtype);
    t.shape = std::move(e.shape);
    const uint64_t nbytes = e.end - e.begin;
    try {
      t.bytes.resize(static_cast<size_t>(nbytes));
    } catch (const std::bad_alloc&) {
      throw Error(ErrorKind::kInput, DPT_MSG(path << ": tensor '" << printable(t.name) << "' of "
                                                  << nbytes << " bytes does not fit in memory"));
    }
    const size_t got = nbytes ? std::fread(t.bytes.data(), 1, t.bytes.size(), f) : 0;
    DPT_INPUT_CHECK(got == nbytes, "cannot read safetensors file "
                                       << path << ": got " << got << " of " << nbytes
                                       << " bytes of tensor '" << printable(t.name)
                                       << "' at offset " << at);
    at += nbytes;
    file.tensors.push_back(std::move(t));
  }
  return file;
}

namespace {
// Whether a file of `size` bytes whose header read_head read as `head` (empty: the file was shorter
// than 8 bytes, or a read failed) is no safetensors file at all (read_metadata's `junk`).
bool junk_head(const std::vector<uint8_t>& head, uint64_t size) {
  if (head.empty()) return size < 8;
  uint64_t n = 0;
  std::memcpy(&n, head.data(), 8);
  if (n == 0 || n > kMaxHeaderBytes) return true;
  if (n > size - 8) return false;  // cut short: damaged, not junk
  return head[8] != '{';           // read_head read the n >= 1 bytes of the header
}
}  // namespace

std::map<std::string, std::string> read_metadata(const std::string& path, bool* junk) {
  // The length field and the header only: listing checkpoints must not read 85 MB each.
  if (junk) *junk = false;
  uint64_t size = 0;
  FileGuard guard = open_safetensors(path, size);  // refused: no file to judge, so no junk
  std::vector<uint8_t> head;
  try {
    head = read_head(guard.get(), size, path);
    StFile file;
    std::vector<Entry> entries;
    parse_header(head.data(), head.size(), size, path, &file, &entries, false);
    return file.metadata;
  } catch (const Error&) {
    if (junk) *junk = junk_head(head, size);  // judged from the bytes read once
    throw;
  }
}

void write_safetensors(const std::string& path, const std::vector<StTensor>& tensors,
                       const std::map<std::string, std::string>& metadata,
                       const std::string& what) {
  // Validate everything before touching the disk, so a bad call never clobbers an old file.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const StTensor& t : tensors) {
    DPT_CHECK(!t.name.empty(), "safetensors " << path << ": tensor with an empty name");
    DPT_CHECK(t.name != kMetadataKey, "safetensors " << path << ": reserved tensor name");
    DPT_CHECK(names.insert(t.name).second,
              "safetensors " << path << ": duplicate tensor name '" << t.name << "'");
    size_t elem = st_dtype_size(t.dtype);
    DPT_CHECK(elem != 0, "safetensors " << path << ": tensor '" << t.name << "' dtype " << t.dtype);
    uint64_t nbytes = 0;
    DPT_CHECK(checked_nbytes(t.shape, elem, &nbytes) && nbytes == t.bytes.size(),
              "safetensors " << path << ": tensor '" << t.name << "' has " << t.bytes.size()
                             << " bytes but shape " << shape_str(t.shape) << " of " << t.dtype
                             << " needs " << nbytes);
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {  // names/metadata that are not valid UTF-8
    DPT_CHECK(false, "safetensors " << path << ": cannot encode header: " << e.what());
  }
  // Pad so the data section starts 8-byte aligned, matching the reference writer.
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t n = text.size();
  // Never a file that no reader takes: parse_header refuses a header above kMaxHeaderBytes, as
  // the reference implementation does above 100 MB.
  DPT_CHECK(n <= kMaxHeaderBytes, "safetensors " << path << ": a header of " << n
                                                 << " bytes, above the " << kMaxHeaderBytes
                                                 << " that readers accept: not written");

  AtomicFile out(path, what);
  out.write(&n, 8);
  out.write(text.data(), text.size());
  for (const StTensor& t : tensors) out.write(t.bytes.data(), t.bytes.size());
  out.commit();
}

StTensor st_f32(const std::string& name, const std::vector<int64_t>& shape, const float* p) {
  int64_t numel = 0;
  DPT_CHECK(checked_numel(shape, &numel), "tensor '" << name << "' shape " << shape_str(shape));
  StTensor t{name, "F32", shape, std::vector<uint8_t>(static_cast<size_t>(numel) * 4)};
  if (numel > 0) std::memcpy(t.bytes.data(), p, t.bytes.size());
  return t;
}

StTensor st_i64(const std::string& name, const std::vector<int64_t>& shape, const int64_t* p) {
  int64_t numel = 0;
  DPT_CHECK(checked_numel(shape, &numel), "tensor '" << name << "' shape " << shape_str(shape));
  StTensor t{name, "I64", shape, std::vector<uint8_t>(static_cast<size_t>(numel) * 8)};
  if (numel > 0) std::memcpy(t.bytes.data(), p, t.bytes.size());
  return t;
}

namespace {
template <typename T>
std::vector<T> copy_out(const StTensor& t, const char* dtype, const std::string& origin) {
  const std::string where = origin.empty() ? "" : origin + ": ";
  DPT_INPUT_CHECK(t.dtype == dtype, where << "tensor '" << printable(t.name) << "' has dtype "
                                          << printable(t.dtype) << ", expected " << dtype);
  uint64_t nbytes = 0;
  DPT_INPUT_CHECK(checked_nbytes(t.shape, sizeof(T), &nbytes) && nbytes == t.bytes.size(),
                  where << "tensor '" << printable(t.name) << "' has " << t.bytes.size()
                        << " bytes, shape " << printable(shape_str(t.shape)) << " of " << dtype);
  std::vector<T> out(t.bytes.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), t.bytes.data(), t.bytes.size());
  return out;
}
}  // namespace

std::vector<float> as_f32(const StTensor& t, const std::string& origin) {
  return copy_out<float>(t, "F32", origin);
}

std::vector<int64_t> as_i64(const StTensor& t, const std::string& origin) {
  return copy_out<int64_t>(t, "I64", origin);
}

}  // namespace dpt
