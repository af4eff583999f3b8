// load_data (include/dpt/dataset.h): which format a directory holds, the per-format readers
// (src/data/idx.cc, cifar.cc, npy.cc), and the checks made across a data set's two splits (classes,
// shapes); also the bounded input file they all read through, and the --normalize auto statistics.
#include "dpt/dataset.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "data/readers.h"
#include "dpt/error.h"
#include "dpt/files.h"

namespace dpt {

namespace data {

namespace fs = std::filesystem;

InputFile::InputFile(const std::string& path) : path_(path) {
  // The plain message for the common mistake; open_input_file then refuses anything that is not a
  // regular file (a FIFO would block a plain open until a writer came, or forever).
  struct stat st {};
  DPT_INPUT_CHECK(::stat(path.c_str(), &st) == 0 || errno != ENOENT, path << ": no such file");
  fd_ = open_input_file(path, "--data");
  struct stat fst {};
  if (::fstat(fd_, &fst) != 0) {
    const int err = errno;
    ::close(fd_);
    DPT_INPUT_CHECK(false, path << ": cannot stat: " << std::strerror(err));
  }
  size_ = static_cast<uint64_t>(fst.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

size_t InputFile::read(uint8_t* out, size_t n) {
  size_t done = 0;
  while (done < n) {
    const ssize_t got = ::read(fd_, out + done, std::min(n - done, size_t{1} << 30));
    if (got < 0 && errno == EINTR) continue;
    DPT_INPUT_CHECK(got >= 0, path_ << ": read error: " << std::strerror(errno));
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  return done;
}

void InputFile::read_exact(uint8_t* out, size_t n) {
  const size_t got = read(out, n);
  DPT_INPUT_CHECK(got == n, path_ << ": the file ended early (it was " << size_
                                  << " bytes when opened): did it change while being read?");
}

void InputFile::rewind() {
  DPT_INPUT_CHECK(::lseek(fd_, 0, SEEK_SET) == 0,
                  path_ << ": cannot seek: " << std::strerror(errno));
}

LoadedSplit make_split(const std::string& images_file, const std::string& labels_file,
                       const std::vector<int64_t>& dims, std::vector<uint8_t> images,
                       std::vector<uint8_t> labels) {
  DPT_INPUT_CHECK(static_cast<int64_t>(labels.size()) == dims[0],
                  "image and label counts disagree: " << images_file << " has " << dims[0]
                                                      << " images, " << labels_file << " has "
                                                      << labels.size() << " labels");
  LoadedSplit out;
  out.images_file = images_file;
  out.labels_file = labels_file;
  ImageSet& set = out.set;
  set.n = dims[0];
  set.rows = dims[1];
  set.cols = dims[2];
  set.channels = dims.size() == 4 ? dims[3] : 1;
  set.images = std::move(images);
  set.labels = std::move(labels);
  set.num_classes = 0;
  return out;
}

std::string shape_string(const std::vector<int64_t>& dims) {
  std::ostringstream os;
  for (size_t i = 0; i < dims.size(); ++i) os << (i ? "x" : "") << dims[i];
  return os.str();
}

std::string first_existing(const std::string& dir, const std::vector<std::string>& names) {
  std::error_code ec;
  for (const std::string& name : names) {
    const fs::path p = fs::path(dir) / name;
    // symlink_status: a dangling link "exists" too, and opening it then says why it fails.
    if (fs::exists(fs::symlink_status(p, ec))) return p.string();
  }
  return {};
}

namespace {

// The file names that identify each format, in the order data_formats() lists them. A format is
// present when all the names of one of its alternatives exist.
struct Signature {
  const char* format;
  std::vector<std::vector<std::string>> alternatives;
  const char* described;  // for the "nothing found" message
};

const std::vector<Signature>& signatures() {
  static const std::vector<Signature> sigs = {
      {"idx",
       {{"train-images-idx3-ubyte.gz"},
        {"train-images-idx3-ubyte"},
        {"train-images-idx4-ubyte.gz"},
        {"train-images-idx4-ubyte"}},
       "idx: train-images-idx3-ubyte[.gz] or train-images-idx4-ubyte[.gz]"},
      {"cifar10",
       {{"data_batch_1.bin"}, {"test_batch.bin"}},
       "cifar10: data_batch_1.bin or test_batch.bin"},
      // train.bin alone is too common a name to mean CIFAR-100.
      {"cifar100", {{"train.bin", "test.bin"}}, "cifar100: train.bin and test.bin"},
      {"npy", {{"train_images.npy"}}, "npy: train_images.npy"},
  };
  return sigs;
}

std::vector<std::string> formats_present(const std::string& dir) {
  std::vector<std::string> found;
  for (const Signature& sig : signatures()) {
    for (const auto& names : sig.alternatives) {
      const bool all = std::all_of(names.begin(), names.end(), [&](const std::string& n) {
        return !first_existing(dir, {n}).empty();
      });
      if (all) {
        found.push_back(sig.format);
        break;
      }
    }
  }
  return found;
}

std::string detect_format(const std::string& dir) {
  std::error_code ec;
  const std::vector<std::string> found = formats_present(dir);
  if (found.size() == 1) return found[0];
  if (found.size() > 1) {
    std::ostringstream os;
    for (size_t i = 0; i < found.size(); ++i)
      os << (i == 0 ? "" : i + 1 == found.size() ? " and " : ", ") << found[i];
    DPT_INPUT_CHECK(false, "--data " << dir << ": files of several formats are present ("
                                     << os.str() << "): name the one to read with --data-format");
  }
  std::ostringstream looked;
  for (const Signature& sig : signatures())
    looked << (looked.tellp() > 0 ? "; " : " ") << sig.described;
  // The archives unpack into a folder (cifar-10-batches-bin, cifar-100-binary): pointing --data at
  // its parent is the usual slip, so say where a data set is.
  std::string hint;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::error_code ec2;
    if (entry.is_directory(ec2) && !formats_present(entry.path().string()).empty()) {
      hint = " (" + entry.path().string() + " holds a data set: point --data there)";
      break;
    }
  }
  DPT_INPUT_CHECK(false,
                  "--data " << dir << ": no data set found; looked for" << looked.str() << hint);
  return {};
}

// Splits whose classes the format does not fix (idx, npy): the training labels define them, and a
// test label outside them is an error of the data set, not something to train around.
void derive_classes(LoadedSplit& train, LoadedSplit& test) {
  const std::vector<uint8_t>& tl = train.set.labels;
  DPT_INPUT_CHECK(!tl.empty(), train.labels_file << ": the training set has no labels");
  const int num_classes = *std::max_element(tl.begin(), tl.end()) + 1;
  const std::vector<uint8_t>& vl = test.set.labels;
  const auto bad = std::find_if(vl.begin(), vl.end(), [&](uint8_t v) { return v >= num_classes; });
  DPT_INPUT_CHECK(bad == vl.end(),
                  test.labels_file << ": label " << int{*bad} << " at index " << (bad - vl.begin())
                                   << ", but the training set has classes 0.." << num_classes - 1
                                   << " (from " << train.labels_file << ")");
  train.set.num_classes = test.set.num_classes = num_classes;
}

// The CIFAR-10 training batches present in dir, in order (at least one).
std::vector<std::string> cifar10_batches(const std::string& dir) {
  std::vector<std::string> batches;
  for (int i = 1; i <= 5; ++i) {
    const std::string p = first_existing(dir, {"data_batch_" + std::to_string(i) + ".bin"});
    if (!p.empty()) batches.push_back(p);
  }
  DPT_INPUT_CHECK(!batches.empty(), "--data " << dir << ": no CIFAR-10 training batch: expected "
                                              << "data_batch_1.bin .. data_batch_5.bin");
  return batches;
}

DataSets read_format(const std::string& dir, const std::string& format) {
  LoadedSplit train, test;
  if (format == "idx") {
    train = load_idx_split(dir, "train");
    test = load_idx_split(dir, "t10k");
    derive_classes(train, test);
  } else if (format == "cifar10") {
    const std::vector<std::string> batches = cifar10_batches(dir);
    const std::string test_path = (fs::path(dir) / "test_batch.bin").string();
    train = load_cifar_files(batches, 1);
    test = load_cifar_files({test_path}, 1);
  } else if (format == "cifar100") {
    train = load_cifar_files({(fs::path(dir) / "train.bin").string()}, 2);
    test = load_cifar_files({(fs::path(dir) / "test.bin").string()}, 2);
  } else {
    train = load_npy_split(dir, "train");
    test = load_npy_split(dir, "test");
    derive_classes(train, test);
  }
  const ImageSet &a = train.set, &b = test.set;
  DPT_INPUT_CHECK(a.shape_text() == b.shape_text(),
                  "training and test images differ in shape: "
                      << train.images_file << " holds " << a.shape_text()
                      << " (rows x cols x channels), " << test.images_file << " holds "
                      << b.shape_text());
  DataSets out;
  out.format = format;
  out.train = std::move(train.set);
  out.test = std::move(test.set);
  return out;
}

// The files read_format reads for `format` and, from each one's header (IDX, .npy) or size
// (CIFAR's records have none), the bytes of data it holds.
DataSize sizes_of(const std::string& dir, const std::string& format) {
  std::vector<std::pair<std::string, uint64_t>> files;
  if (format == "idx" || format == "npy") {
    for (const char* split : {"train", format == "idx" ? "t10k" : "test"}) {
      const SplitFiles f =
          format == "idx" ? idx_split_files(dir, split) : npy_split_files(dir, split);
      for (const std::string& path : {f.images, f.labels})
        files.emplace_back(path, format == "idx" ? idx_data_bytes(path) : npy_data_bytes(path));
    }
  } else {
    std::vector<std::string> paths =
        format == "cifar10" ? cifar10_batches(dir)
                            : std::vector<std::string>{(fs::path(dir) / "train.bin").string()};
    paths.push_back(
        (fs::path(dir) / (format == "cifar10" ? "test_batch.bin" : "test.bin")).string());
    for (const std::string& path : paths) files.emplace_back(path, InputFile(path).size());
  }
  DataSize out;
  for (const auto& [path, bytes] : files) {
    out.bytes += bytes;
    if (bytes >= out.largest_bytes) out.largest_file = path, out.largest_bytes = bytes;
  }
  return out;
}

}  // namespace

}  // namespace data

std::vector<std::string> data_formats() { return {"auto", "idx", "cifar10", "cifar100", "npy"}; }

namespace {

// The format to read in dir: `format` checked, "auto" detected, the directory checked first.
std::string format_in(const std::string& dir, const std::string& format) {
  const std::vector<std::string> formats = data_formats();
  if (std::find(formats.begin(), formats.end(), format) == formats.end()) {
    std::ostringstream os;
    for (size_t i = 0; i < formats.size(); ++i) os << (i ? ", " : "") << formats[i];
    DPT_INPUT_CHECK(false,
                    "--data-format " << format << ": unknown format (one of " << os.str() << ")");
  }
  std::error_code ec;
  DPT_INPUT_CHECK(
      std::filesystem::is_directory(dir, ec),
      "--data " << dir << ": "
                << (std::filesystem::exists(dir, ec) ? "not a directory" : "no such directory"));
  return format == "auto" ? data::detect_format(dir) : format;
}

}  // namespace

DataSets load_data(const std::string& dir, const std::string& format) {
  return data::read_format(dir, format_in(dir, format));
}

DataSize data_size(const std::string& dir, const std::string& format) {
  return data::sizes_of(dir, format_in(dir, format));
}

ChannelStats channel_stats(const ImageSet& set) {
  const int64_t c = set.channels;
  DPT_CHECK(set.n > 0 && c > 0 && static_cast<int64_t>(set.images.size()) == set.n * set.pixels(),
            "channel_stats: an empty or inconsistent image set (" << set.n << " images of "
                                                                  << set.pixels() << " bytes)");
  // A histogram per channel, then the sums from it in exact integers: the result does not depend
  // on the summation order (every rank computes the same bits) and costs one increment a byte.
  std::vector<std::array<uint64_t, 256>> hist(static_cast<size_t>(c));
  for (auto& h : hist) h.fill(0);
  const uint8_t* p = set.images.data();
  const size_t total = set.images.size();
  if (c == 1) {
    for (size_t i = 0; i < total; ++i) ++hist[0][p[i]];
  } else {
    for (size_t i = 0; i < total; i += static_cast<size_t>(c))
      for (int64_t ch = 0; ch < c; ++ch) ++hist[static_cast<size_t>(ch)][p[i + ch]];
  }
  ChannelStats stats;
  for (const auto& h : hist) {
    unsigned __int128 count = 0, sum = 0, sumsq = 0;
    for (uint64_t v = 0; v < 256; ++v) {
      count += h[v];
      sum += static_cast<unsigned __int128>(h[v]) * v;
      sumsq += static_cast<unsigned __int128>(h[v]) * v * v;
    }
    // Population variance n*sumsq - sum^2 over n^2 (exact and >= 0 in integers; < 2^128 since
    // n <= 2^34 and v < 2^8), scaled by 255^2 for pixel / 255.
    const unsigned __int128 num = count * sumsq - sum * sum;
    const double n = static_cast<double>(count);
    stats.mean.push_back(static_cast<double>(sum) / n / 255.0);
    stats.std.push_back(std::sqrt(static_cast<double>(num)) / n / 255.0);
  }
  return stats;
}

}  // namespace dpt
