// CIFAR-10 / CIFAR-100 binary batches: fixed-size records of label bytes and three 32 x 32 colour
// planes, read in bounded chunks and interleaved into the NHWC layout the models take; the files
// that make up each format's two splits.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>

#include "data/readers.h"
#include "dpt/error.h"

namespace dpt::data {

namespace {

constexpr int64_t kPlane = kCifarSide * kCifarSide;  // 1024 bytes per colour plane
constexpr int64_t kChunkRecords = 512;               // about 1.5 MiB read at a time

const char* format_name(int label_bytes) { return label_bytes == 1 ? "CIFAR-10" : "CIFAR-100"; }

// The records of one file, appended to `set`: labels checked against the format's classes (the
// index named is the record's within this file, where a user can find it).
void read_cifar_file(InputFile& in, int label_bytes, int64_t records, ImageSet& set) {
  const int64_t record = label_bytes + kCifarPixels;
  std::vector<uint8_t> chunk(static_cast<size_t>(std::min(records, kChunkRecords) * record));
  for (int64_t first = 0; first < records; first += kChunkRecords) {
    const int64_t count = std::min(kChunkRecords, records - first);
    in.read_exact(chunk.data(), static_cast<size_t>(count * record));
    for (int64_t r = 0; r < count; ++r) {
      const uint8_t* rec = chunk.data() + r * record;
      const int64_t index = first + r;
      uint8_t label = rec[0];
      if (label_bytes == 1) {
        DPT_INPUT_CHECK(label < 10, in.path() << ": label " << int{label} << " at index " << index
                                              << ", but CIFAR-10 has classes 0..9");
      } else {
        // CIFAR-100 records carry the coarse (superclass) label first, then the fine one we train
        // on; a coarse label out of range means the file is not what it claims to be.
        DPT_INPUT_CHECK(rec[0] < 20, in.path()
                                         << ": coarse label " << int{rec[0]} << " at index "
                                         << index << ", but CIFAR-100 has coarse classes 0..19");
        label = rec[1];
        DPT_INPUT_CHECK(label < 100, in.path() << ": fine label " << int{label} << " at index "
                                               << index << ", but CIFAR-100 has classes 0..99");
      }
      set.labels.push_back(label);
      // Planes R, G, B of 1024 bytes each, row-major within a plane -> [y][x][c].
      const uint8_t* planes = rec + label_bytes;
      uint8_t* dst = set.images.data() + (set.n + index) * kCifarPixels;
      for (int64_t p = 0; p < kPlane; ++p) {
        dst[3 * p + 0] = planes[p];
        dst[3 * p + 1] = planes[kPlane + p];
        dst[3 * p + 2] = planes[2 * kPlane + p];
      }
    }
  }
  set.n += records;
}

std::string in_dir(const std::string& dir, const char* name) {
  return (std::filesystem::path(dir) / name).string();
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

// The training files `paths`, then the test file `test`, each with its size and the records it
// holds (images and labels together: whole records of `label_bytes` label bytes and an image; a
// file of a partial record is load_cifar_files' to refuse).
FileBytes file_sizes(std::vector<std::string> paths, const std::string& test, int label_bytes) {
  FileBytes out;
  paths.push_back(test);
  for (const std::string& path : paths) {
    const uint64_t size = InputFile(path).size();
    const auto records = static_cast<int64_t>(size / (label_bytes + kCifarPixels));
    out.push_back({.path = path,
                   .bytes = size,
                   .dims = {records, kCifarSide, kCifarSide, kCifarChannels},
                   .images = true,
                   .test = path == test});
  }
  return out;
}

}  // namespace

LoadedSplit load_cifar_files(const std::vector<std::string>& paths, int label_bytes) {
  DPT_CHECK(!paths.empty() && (label_bytes == 1 || label_bytes == 2),
            "load_cifar_files: " << paths.size() << " files, " << label_bytes << " label bytes");
  const int64_t record = label_bytes + kCifarPixels;
  const int64_t other = (label_bytes == 1 ? 2 : 1) + kCifarPixels;
  // Open and size every file before allocating: the whole split goes into one buffer.
  std::vector<std::unique_ptr<InputFile>> files;
  std::vector<int64_t> records;
  uint64_t total = 0;
  for (const std::string& path : paths) {
    files.push_back(std::make_unique<InputFile>(path));
    const uint64_t size = files.back()->size();
    DPT_INPUT_CHECK(size <= kMaxDataBytes, path << ": absurd size: " << size
                                                << " bytes, more than the limit of "
                                                << kMaxDataBytes << " bytes (2^34)");
    DPT_INPUT_CHECK(size > 0, path << ": empty file: a " << format_name(label_bytes)
                                   << " batch holds records of " << record << " bytes");
    if (size % static_cast<uint64_t>(record) != 0) {
      // The other CIFAR's record size is the usual mix-up: say so.
      const bool other_fits = size % static_cast<uint64_t>(other) == 0;
      DPT_INPUT_CHECK(
          false,
          path << ": " << size << " bytes is not a whole number of " << record << "-byte "
               << format_name(label_bytes) << " records (" << label_bytes << " label byte"
               << (label_bytes == 1 ? "" : "s") << " + " << kCifarPixels << " pixel bytes)"
               << (other_fits ? DPT_MSG("; it is a whole number of "
                                        << other << "-byte " << format_name(3 - label_bytes)
                                        << " records: --data-format "
                                        << (label_bytes == 1 ? "cifar100" : "cifar10") << "?")
                              : std::string()));
    }
    records.push_back(static_cast<int64_t>(size / static_cast<uint64_t>(record)));
    total += size;
    DPT_INPUT_CHECK(total <= kMaxDataBytes, path << ": absurd size: the files up to this one hold "
                                                 << total << " bytes, more than the limit of "
                                                 << kMaxDataBytes << " bytes (2^34)");
  }
  int64_t n = 0;
  for (int64_t r : records) n += r;
  LoadedSplit out;
  out.images_file = out.labels_file = paths.front();
  ImageSet& set = out.set;
  set.rows = set.cols = kCifarSide;
  set.channels = kCifarChannels;
  set.num_classes = label_bytes == 1 ? 10 : 100;
  set.images.resize(static_cast<size_t>(n * kCifarPixels));
  set.labels.reserve(static_cast<size_t>(n));
  for (size_t i = 0; i < files.size(); ++i)
    read_cifar_file(*files[i], label_bytes, records[i], set);
  return out;
}

LoadedSplits load_cifar10(const std::string& dir) {
  const std::vector<std::string> batches = cifar10_batches(dir);
  return {load_cifar_files(batches, 1), load_cifar_files({in_dir(dir, "test_batch.bin")}, 1)};
}

FileBytes cifar10_file_bytes(const std::string& dir) {
  return file_sizes(cifar10_batches(dir), in_dir(dir, "test_batch.bin"), 1);
}

LoadedSplits load_cifar100(const std::string& dir) {
  return {load_cifar_files({in_dir(dir, "train.bin")}, 2),
          load_cifar_files({in_dir(dir, "test.bin")}, 2)};
}

FileBytes cifar100_file_bytes(const std::string& dir) {
  return file_sizes({in_dir(dir, "train.bin")}, in_dir(dir, "test.bin"), 2);
}

}  // namespace dpt::data
