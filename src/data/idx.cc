// IDX reading (raw or gzip'd, streamed straight into the final buffer) and the IDX split loader
// (idx3: one channel, idx4: N x H x W x C).
// A bad dataset file must stop the run before training with a message naming the file and defect;
// one that is not a regular file (a FIFO, a device) is refused at open, never read or waited on.
#include "dpt/idx.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>

#include "data/readers.h"
#include "dpt/error.h"

namespace dpt {

using data::InputFile;
using data::kMaxDataBytes;

namespace {

namespace fs = std::filesystem;

// Deflate cannot expand by more than 1032:1, so a gzip file of N bytes decompresses to at most
// about 1032*N; a header promising more is truncated, and we learn that without allocating.
constexpr uint64_t kMaxDeflateRatio = 1032;
constexpr size_t kInChunk = size_t{1} << 20;

std::string hex_byte(uint8_t b) {
  static const char* digits = "0123456789ABCDEF";
  return std::string("0x") + digits[b >> 4] + digits[b & 15];
}

const char* dtype_name(uint8_t code) {
  switch (code) {
    case 0x08:
      return "unsigned byte";
    case 0x09:
      return "signed byte";
    case 0x0B:
      return "int16";
    case 0x0C:
      return "int32";
    case 0x0D:
      return "float32";
    case 0x0E:
      return "float64";
    default:
      return "not an IDX dtype";
  }
}

// The decoded bytes of a file, whether raw or gzip'd, so the IDX parser is written once.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Copies up to n bytes into out; returns fewer only at the end of the data.
  virtual size_t read(uint8_t* out, size_t n) = 0;
  // Consumes and counts whatever is left (only called to report trailing bytes).
  virtual uint64_t count_rest() = 0;
  // An upper bound on the bytes still to come, checked before a header-sized allocation.
  virtual uint64_t max_rest() const = 0;
  // Why max_rest() is the bound, for the "truncated" message.
  virtual std::string bound_note() const = 0;
};

class RawSource : public ByteSource {
 public:
  RawSource(InputFile& in, uint64_t size) : in_(in), size_(size) {}

  size_t read(uint8_t* out, size_t n) override {
    if (n == 0 || pos_ >= size_) return 0;
    const size_t got = in_.read(out, n);
    pos_ += got;
    return got;
  }
  // The size is known up front, so trailing bytes need not be read.
  uint64_t count_rest() override { return size_ > pos_ ? size_ - pos_ : 0; }
  uint64_t max_rest() const override { return size_ > pos_ ? size_ - pos_ : 0; }
  std::string bound_note() const override { return DPT_MSG("file has " << max_rest()); }

 private:
  InputFile& in_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

// Inflates a gzip file chunk by chunk into the caller's buffer (no intermediate copy of the
// decompressed data). Concatenated gzip members are read as one stream, as gzip(1) does.
class GzipSource : public ByteSource {
 public:
  GzipSource(const std::string& path, InputFile& in, uint64_t size)
      : path_(path), in_(in), size_(size), in_buf_(kInChunk) {
    std::memset(&zs_, 0, sizeof(zs_));
    const int ret = inflateInit2(&zs_, 16 + MAX_WBITS);  // 16+: gzip wrapper only
    DPT_CHECK(ret == Z_OK, "inflateInit2 failed with code " << ret);
  }
  ~GzipSource() override { inflateEnd(&zs_); }
  GzipSource(const GzipSource&) = delete;
  GzipSource& operator=(const GzipSource&) = delete;

  size_t read(uint8_t* out, size_t n) override {
    size_t done = 0;
    while (done < n && !finished_) {
      // avail_out is a uInt: feed huge requests in 1 GiB slices.
      const size_t want = std::min(n - done, size_t{1} << 30);
      zs_.next_out = out + done;
      zs_.avail_out = static_cast<uInt>(want);
      if (zs_.avail_in == 0) refill();
      const int ret = inflate(&zs_, Z_NO_FLUSH);
      const size_t made = want - zs_.avail_out;
      done += made;
      produced_ += made;
      if (ret == Z_STREAM_END) {
        next_member();
      } else if (ret == Z_BUF_ERROR) {
        // No progress was possible with output space left: the compressed input ran out.
        DPT_INPUT_CHECK(!(input_eof_ && zs_.avail_in == 0),
                        path_ << ": truncated gzip stream: the compressed data ends before the "
                              << "gzip trailer (after " << produced_ << " decompressed bytes)");
      } else {
        DPT_CHECK(ret != Z_MEM_ERROR && ret != Z_STREAM_ERROR,
                  path_ << ": zlib inflate failed with code " << ret);
        DPT_INPUT_CHECK(ret == Z_OK, path_ << ": corrupted gzip stream: "
                                           << (zs_.msg ? zs_.msg : "inflate error") << " (after "
                                           << produced_ << " decompressed bytes)");
      }
    }
    return done;
  }

  uint64_t count_rest() override {
    std::vector<uint8_t> scratch(size_t{1} << 16);
    uint64_t total = 0;
    while (size_t got = read(scratch.data(), scratch.size())) total += got;
    return total;
  }
  uint64_t max_rest() const override { return size_ * kMaxDeflateRatio + 1024; }
  std::string bound_note() const override {
    return DPT_MSG("but a gzip file of " << size_ << " bytes decompresses to at most "
                                         << max_rest());
  }

 private:
  void refill() {
    if (input_eof_) return;
    const size_t got = in_.read(in_buf_.data(), kInChunk);
    file_pos_ += got;
    if (got < kInChunk) input_eof_ = true;
    zs_.next_in = in_buf_.data();
    zs_.avail_in = static_cast<uInt>(got);
  }

  // After one member's trailer: either the file ends, or another gzip member follows. Anything
  // else is garbage appended to the file, which we refuse rather than silently ignore.
  void next_member() {
    if (zs_.avail_in == 0) refill();
    if (zs_.avail_in == 0) {
      finished_ = true;
      return;
    }
    const uint64_t left = zs_.avail_in + (size_ > file_pos_ ? size_ - file_pos_ : 0);
    DPT_INPUT_CHECK(zs_.next_in[0] == 0x1f, path_ << ": corrupted gzip file: " << left
                                                  << " trailing bytes after the end of the gzip "
                                                  << "stream");
    const int ret = inflateReset(&zs_);
    DPT_CHECK(ret == Z_OK, "inflateReset failed with code " << ret);
  }

  const std::string& path_;
  InputFile& in_;
  uint64_t size_;
  std::vector<uint8_t> in_buf_;
  z_stream zs_;
  uint64_t file_pos_ = 0;
  uint64_t produced_ = 0;
  bool input_eof_ = false;
  bool finished_ = false;
};

// Reads exactly n bytes of header or reports which header field the file ended in.
void read_header_bytes(ByteSource& src, const std::string& path, uint8_t* out, size_t n,
                       size_t offset, const char* field) {
  const size_t got = src.read(out, n);
  DPT_INPUT_CHECK(got == n, path << ": truncated header: the data ends at byte " << offset + got
                                 << ", inside the " << field << " (an IDX header needs "
                                 << offset + n << " bytes here)");
}

// An opened IDX file, its header read: the dims and the bytes of data they promise, the source
// positioned at the first of them.
struct IdxHeader {
  InputFile in;
  bool gzip = false;
  std::unique_ptr<ByteSource> src;
  std::vector<int64_t> dims;
  uint64_t expected = 0;
  std::string promise;  // "header says 10x28x28 = 7840 bytes of data", for messages
  explicit IdxHeader(const std::string& path) : in(path) {}
};

// Opens `path` and reads its header, refusing every defect the header alone shows (including a
// size above kMaxDataBytes); nothing past the header is read.
std::unique_ptr<IdxHeader> read_idx_header(const std::string& path) {
  // InputFile says "no such file" plainly and refuses what is not a regular file (a FIFO would
  // block a plain open until a writer came, or forever).
  auto h = std::make_unique<IdxHeader>(path);
  InputFile& in = h->in;
  const uint64_t size = in.size();

  // Detect gzip by content: datasets are distributed both ways and files get renamed.
  uint8_t sniff[2] = {0, 0};
  const bool gzip = in.read(sniff, 2) == 2 && sniff[0] == 0x1f && sniff[1] == 0x8b;
  in.rewind();
  h->gzip = gzip;
  if (gzip) {
    h->src = std::make_unique<GzipSource>(h->in.path(), in, size);
  } else {
    h->src = std::make_unique<RawSource>(in, size);
  }
  ByteSource* src = h->src.get();

  // Header: 0x00 0x00 <dtype> <ndim>, then ndim big-endian uint32 dims.
  uint8_t head[4];
  const size_t got_head = src->read(head, 4);
  DPT_INPUT_CHECK(got_head == 4,
                  path << ": truncated: " << (gzip ? "decompressed data has" : "file has")
                       << " only " << got_head << " bytes, an IDX header needs at least 4");
  DPT_INPUT_CHECK(head[0] == 0 && head[1] == 0,
                  path << ": bad magic: the " << (gzip ? "decompressed data starts" : "file starts")
                       << " with " << hex_byte(head[0]) << " " << hex_byte(head[1])
                       << ", an IDX file starts with two zero bytes"
                       << (gzip ? "" : " (and a gzip file with 0x1F 0x8B)"));
  DPT_INPUT_CHECK(head[2] == 0x08, path << ": unsupported dtype code " << hex_byte(head[2]) << " ("
                                        << dtype_name(head[2])
                                        << "): only 0x08 (unsigned byte) is supported");
  const int ndim = head[3];
  DPT_INPUT_CHECK(ndim >= 1 && ndim <= 4, path << ": bad ndim " << ndim << ": must be 1..4");

  uint8_t raw_dims[16];
  read_header_bytes(*src, path, raw_dims, 4 * static_cast<size_t>(ndim), 4, "dimension sizes");
  std::vector<int64_t>& dims = h->dims;
  dims.resize(ndim);
  for (int i = 0; i < ndim; ++i) {
    const uint8_t* b = raw_dims + 4 * i;
    dims[i] = (int64_t{b[0]} << 24) | (int64_t{b[1]} << 16) | (int64_t{b[2]} << 8) | b[3];
  }
  for (int i = 0; i < ndim; ++i) {
    DPT_INPUT_CHECK(dims[i] > 0, path << ": zero dimension: dim " << i << " of "
                                      << data::shape_string(dims)
                                      << " is 0, every dimension must be > 0");
  }
  // prod * d > limit  <=>  d > limit / prod (integers), so the check itself cannot overflow.
  uint64_t expected = 1;
  for (int64_t d : dims) {
    DPT_INPUT_CHECK(static_cast<uint64_t>(d) <= kMaxDataBytes / expected,
                    path << ": absurd size: header says " << data::shape_string(dims)
                         << ", more than the limit of " << kMaxDataBytes << " bytes (2^34)");
    expected *= static_cast<uint64_t>(d);
  }
  h->expected = expected;
  h->promise =
      DPT_MSG("header says " << data::shape_string(dims) << " = " << expected << " bytes of data");
  return h;
}

}  // namespace

IdxArray read_idx(const std::string& path) {
  const std::unique_ptr<IdxHeader> h = read_idx_header(path);
  ByteSource* src = h->src.get();
  const bool gzip = h->gzip;
  const uint64_t expected = h->expected;
  const std::string& promise = h->promise;
  DPT_INPUT_CHECK(expected <= src->max_rest(),
                  path << ": truncated: " << promise << ", " << src->bound_note());

  IdxArray arr;
  arr.dims = h->dims;
  arr.data.resize(expected);
  const size_t got = src->read(arr.data.data(), expected);
  DPT_INPUT_CHECK(got == expected, path << ": truncated: " << promise << ", file has " << got
                                        << (gzip ? " (decompressed)" : ""));
  const uint64_t rest = src->count_rest();
  DPT_INPUT_CHECK(rest == 0, path << ": trailing bytes: " << promise << ", file has "
                                  << expected + rest << (gzip ? " (decompressed)" : "") << " ("
                                  << rest << " trailing bytes)");
  return arr;
}

namespace data {

namespace {

// dir/<base>.gz or dir/<base>, whichever exists, else "": the real files are distributed gzip'd,
// users gunzip them. Both present is refused, as idx3 and idx4 together are: gunzip -k (or a copy
// gunzip'd by hand and then edited) leaves two files that may differ, and preferring either would
// leave the user guessing which one was trained on.
std::string gz_or_raw(const std::string& dir, const std::string& base) {
  const std::string gz = first_existing(dir, {base + ".gz"}), raw = first_existing(dir, {base});
  DPT_INPUT_CHECK(gz.empty() || raw.empty(), dir << ": both " << base << ".gz and " << base
                                                 << " exist: which one is meant? Remove one");
  return gz.empty() ? raw : gz;
}

std::string no_file_message(const std::string& dir, const std::string& what,
                            const std::vector<std::string>& tried) {
  std::ostringstream os;
  os << dir << ": no " << what << " file: tried ";
  for (size_t i = 0; i < tried.size(); ++i)
    os << (i == 0 ? "" : i + 1 == tried.size() ? " and " : ", ") << tried[i];
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) os << " (the directory does not exist)";
  return os.str();
}

}  // namespace

SplitFiles idx_split_files(const std::string& dir, const std::string& split) {
  // idx3 (N x H x W, the MNIST family) and idx4 (N x H x W x C, colour images): the name says which
  // the writer meant; both present would leave it to chance which one is trained on.
  const std::string base3 = split + "-images-idx3-ubyte", base4 = split + "-images-idx4-ubyte";
  const std::string img3 = gz_or_raw(dir, base3), img4 = gz_or_raw(dir, base4);
  DPT_INPUT_CHECK(img3.empty() || img4.empty(),
                  dir << ": both " << fs::path(img3).filename().string() << " and "
                      << fs::path(img4).filename().string() << " exist: which are the " << split
                      << " images? Remove one");
  const std::string img_path = img3.empty() ? img4 : img3;
  DPT_INPUT_CHECK(!img_path.empty(), no_file_message(dir, split + " images",
                                                     {base3 + ".gz", base3, base4 + ".gz", base4}));
  const std::string lbl_base = split + "-labels-idx1-ubyte";
  const std::string lbl_path = gz_or_raw(dir, lbl_base);
  DPT_INPUT_CHECK(!lbl_path.empty(),
                  no_file_message(dir, split + " labels", {lbl_base + ".gz", lbl_base}));
  return {img_path, lbl_path};
}

FileData idx_file_data(const std::string& path) {
  const std::unique_ptr<IdxHeader> h = read_idx_header(path);
  return {.path = path, .bytes = h->expected, .dims = h->dims};
}

LoadedSplit load_idx_split(const std::string& dir, const std::string& split) {
  const auto [img_path, lbl_path] = idx_split_files(dir, split);
  IdxArray img = read_idx(img_path);
  DPT_INPUT_CHECK(
      img.dims.size() == 3 || img.dims.size() == 4,
      img_path << ": wrong ndim: expected 3-D images (n x rows x cols) or 4-D (n x rows x "
               << "cols x channels), found " << img.dims.size() << "-D " << shape_string(img.dims));
  IdxArray lbl = read_idx(lbl_path);
  DPT_INPUT_CHECK(lbl.dims.size() == 1, lbl_path << ": wrong ndim: expected 1-D labels, found "
                                                 << lbl.dims.size() << "-D "
                                                 << shape_string(lbl.dims));
  return make_split(img_path, lbl_path, img.dims, std::move(img.data),
                    std::vector<Label>(lbl.data.begin(), lbl.data.end()));
}

LoadedSplits load_idx(const std::string& dir) {
  return {load_idx_split(dir, "train"), load_idx_split(dir, "t10k")};
}

FileBytes idx_file_bytes(const std::string& dir) {
  return split_file_bytes(dir, {"train", "t10k"}, idx_split_files, idx_file_data);
}

}  // namespace data

}  // namespace dpt
