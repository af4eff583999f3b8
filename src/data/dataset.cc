// load_data (include/dpt/dataset.h): the table of formats (each one's name, detection signature,
// loader and file sizes; the readers are src/data/idx.cc, cifar.cc, npy.cc), which format a
// directory holds, and the checks made across a data set's two splits (classes, shapes); also the
// bounded input file they all read through, and the --normalize auto statistics.
#include "dpt/dataset.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
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
                       std::vector<Label> labels) {
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

FileBytes split_file_bytes(const std::string& dir, const std::vector<std::string>& splits,
                           SplitFiles (*files)(const std::string& dir, const std::string& split),
                           FileData (*header)(const std::string& path)) {
  FileBytes out;
  for (const std::string& split : splits) {
    const SplitFiles f = files(dir, split);
    for (const std::string& path : {f.images, f.labels}) {
      out.push_back(header(path));
      out.back().images = path == f.images;
      out.back().test = split != splits.front();
    }
  }
  return out;
}

namespace {

// One on-disk format: everything load_data, data_size and detection know of it. A new format is
// one more entry here, naming its reader's functions (readers.h).
struct Format {
  const char* name;  // as --data-format names it
  // The file names that identify the format: it is present when all the names of one of the
  // alternatives exist.
  std::vector<std::vector<std::string>> alternatives;
  const char* described;  // the alternatives in words, for the "no data set found" message
  LoadedSplits (*load)(const std::string& dir);
  // 0: the training labels define the classes (derive_classes); else the format fixes them and its
  // reader sets them, having checked every label against them (CIFAR: 10, 100).
  int classes;
  FileBytes (*file_bytes)(const std::string& dir);  // what load reads, from headers or sizes
};

// In the order data_formats() lists them and detection reports them.
const std::vector<Format>& formats() {
  static const std::vector<Format> table = {
      {"idx",
       {{"train-images-idx3-ubyte.gz"},
        {"train-images-idx3-ubyte"},
        {"train-images-idx4-ubyte.gz"},
        {"train-images-idx4-ubyte"}},
       "idx: train-images-idx3-ubyte[.gz] or train-images-idx4-ubyte[.gz]",
       load_idx,
       0,
       idx_file_bytes},
      {"cifar10",
       {{"data_batch_1.bin"}, {"test_batch.bin"}},
       "cifar10: data_batch_1.bin or test_batch.bin",
       load_cifar10,
       10,
       cifar10_file_bytes},
      // train.bin alone is too common a name to mean CIFAR-100.
      {"cifar100",
       {{"train.bin", "test.bin"}},
       "cifar100: train.bin and test.bin",
       load_cifar100,
       100,
       cifar100_file_bytes},
      {"npy", {{"train_images.npy"}}, "npy: train_images.npy", load_npy, 0, npy_file_bytes},
  };
  return table;
}

// "a, b and c" (with last = ", ": "a, b, c").
std::string listed(const std::vector<std::string>& items, const char* last = " and ") {
  std::ostringstream os;
  for (size_t i = 0; i < items.size(); ++i)
    os << (i == 0 ? "" : i + 1 == items.size() ? last : ", ") << items[i];
  return os.str();
}

// The entry of a format named by --data-format ("auto" is not one).
const Format& format_named(const std::string& name) {
  const std::vector<Format>& table = formats();
  const auto it =
      std::find_if(table.begin(), table.end(), [&](const Format& f) { return name == f.name; });
  DPT_INPUT_CHECK(it != table.end(), "--data-format " << name << ": unknown format (one of "
                                                      << listed(data_formats(), ", ") << ")");
  return *it;
}

std::vector<const Format*> formats_present(const std::string& dir) {
  std::vector<const Format*> found;
  for (const Format& f : formats()) {
    for (const auto& names : f.alternatives) {
      const bool all = std::all_of(names.begin(), names.end(), [&](const std::string& n) {
        return !first_existing(dir, {n}).empty();
      });
      if (all) {
        found.push_back(&f);
        break;
      }
    }
  }
  return found;
}

// The rest of the "no data set found" message: what was looked for, what the directory holds
// instead (its first few names in order, a directory with a trailing /, or that it is empty) and,
// where a subdirectory holds a data set, that one.
std::string nothing_found(const std::string& dir) {
  std::ostringstream os;
  os << "looked for";
  for (const Format& f : formats()) os << (&f == &formats().front() ? " " : "; ") << f.described;
  constexpr size_t kShown = 5;
  std::vector<std::string> names;
  std::string hint;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::error_code ec2;
    const bool is_dir = entry.is_directory(ec2);
    // Names come from a directory anyone may write: escaped (printable), never raw bytes that a
    // terminal would act on.
    names.push_back(printable(entry.path().filename().string()) + (is_dir ? "/" : ""));
    // The archives unpack into a folder (cifar-10-batches-bin, cifar-100-binary): pointing --data
    // at its parent is the usual slip, so say where a data set is.
    if (is_dir && hint.empty() && !formats_present(entry.path().string()).empty())
      hint = " (" + printable(entry.path().string(), PATH_MAX) +
             " holds a data set: point --data there)";
  }
  std::sort(names.begin(), names.end());
  const size_t more = names.size() > kShown ? names.size() - kShown : 0;
  names.resize(names.size() - more);
  if (more > 0) names.push_back(std::to_string(more) + " more");
  os << "; " << (names.empty() ? "the directory is empty" : "the directory holds " + listed(names))
     << hint;
  return os.str();
}

const Format& detect_format(const std::string& dir) {
  const std::vector<const Format*> found = formats_present(dir);
  std::vector<std::string> names;
  for (const Format* f : found) names.emplace_back(f->name);
  DPT_INPUT_CHECK(found.size() <= 1, "--data " << dir << ": files of several formats are present ("
                                               << listed(names)
                                               << "): name the one to read with --data-format");
  DPT_INPUT_CHECK(!found.empty(),
                  "--data " << dir << ": no data set found; " << nothing_found(dir));
  return *found.front();
}

// Splits whose classes the format does not fix (idx, npy): the training labels define them, and a
// test label outside them is an error of the data set, not something to train around.
void derive_classes(LoadedSplit& train, LoadedSplit& test) {
  const std::vector<Label>& tl = train.set.labels;
  DPT_INPUT_CHECK(!tl.empty(), train.labels_file << ": the training set has no labels");
  const int num_classes = *std::max_element(tl.begin(), tl.end()) + 1;
  const std::vector<Label>& vl = test.set.labels;
  const auto bad = std::find_if(vl.begin(), vl.end(), [&](Label v) { return v >= num_classes; });
  DPT_INPUT_CHECK(bad == vl.end(),
                  test.labels_file << ": label " << int{*bad} << " at index " << (bad - vl.begin())
                                   << ", but the training set has classes 0.." << num_classes - 1
                                   << " (from " << train.labels_file << ")");
  train.set.num_classes = test.set.num_classes = num_classes;
}

DataSets read_format(const std::string& dir, const Format& format) {
  LoadedSplits splits = format.load(dir);
  LoadedSplit &train = splits.train, &test = splits.test;
  if (format.classes == 0) derive_classes(train, test);
  DPT_CHECK(train.set.num_classes > 0 && train.set.num_classes == test.set.num_classes,
            format.name << ": the reader of a format with fixed classes set "
                        << train.set.num_classes << " training and " << test.set.num_classes
                        << " test classes");
  const ImageSet &a = train.set, &b = test.set;
  DPT_INPUT_CHECK(a.shape_text() == b.shape_text(),
                  "training and test images differ in shape: "
                      << train.images_file << " holds " << a.shape_text()
                      << " (rows x cols x channels), " << test.images_file << " holds "
                      << b.shape_text());
  DataSets out;
  out.format = format.name;
  out.train = std::move(train.set);
  out.test = std::move(test.set);
  return out;
}

// The files read_format reads and, from each one's header (IDX, .npy) or size (CIFAR's records
// have none), the bytes of data it holds, the training images' shape and the test images' count.
DataSize sizes_of(const std::string& dir, const Format& format) {
  DataSize out;
  out.classes = format.classes;
  for (const FileData& f : format.file_bytes(dir)) {
    out.bytes += f.bytes;
    out.files.push_back(f.path);
    if (f.bytes >= out.largest_bytes) out.largest_file = f.path, out.largest_bytes = f.bytes;
    if (!f.images || f.dims.size() < 3) continue;  // a bad rank is read_format's to refuse
    if (f.test)
      out.test_n += f.dims[0];
    else if (out.image_shape.empty())
      out.image_shape = {f.dims[1], f.dims[2], f.dims.size() == 4 ? f.dims[3] : 1};
  }
  return out;
}

// The format to read in dir: `format` checked, "auto" detected, the directory checked first.
const Format& format_in(const std::string& dir, const std::string& format) {
  const Format* named = format == "auto" ? nullptr : &format_named(format);
  std::error_code ec;
  DPT_INPUT_CHECK(
      fs::is_directory(dir, ec),
      "--data " << dir << ": " << (fs::exists(dir, ec) ? "not a directory" : "no such directory"));
  return named ? *named : detect_format(dir);
}

}  // namespace

}  // namespace data

std::vector<std::string> data_formats() {
  std::vector<std::string> names = {"auto"};
  for (const data::Format& f : data::formats()) names.emplace_back(f.name);
  return names;
}

namespace {
void check_synthetic_format(const std::string& dir, const std::string& format) {
  DPT_INPUT_CHECK(format == "auto", "--data-format " << format << " does not apply to --data "
                                                     << printable(dir)
                                                     << " (drawn, not read: leave it auto)");
}
}  // namespace

DataSets load_data(const std::string& dir, const std::string& format, uint64_t seed) {
  if (is_synthetic(dir)) {
    check_synthetic_format(dir, format);
    return synthetic_data(dir, seed);
  }
  return data::read_format(dir, data::format_in(dir, format));
}

DataSize data_size(const std::string& dir, const std::string& format) {
  if (is_synthetic(dir)) {
    check_synthetic_format(dir, format);
    return synthetic_size(dir);
  }
  return data::sizes_of(dir, data::format_in(dir, format));
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
