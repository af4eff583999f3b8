// The per-format readers behind load_data (include/dpt/dataset.h), shared by src/data/*.cc, the
// unit tests and the fuzz target; the trainer itself only sees load_data. Each format's reader
// gives dataset.cc's table of formats a loader (dir -> both splits) and a file-size function (dir
// -> the bytes of data each file holds); a new format adds its reader here and its entry there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dpt/dataset.h"

namespace dpt::data {

// No file or header may make us allocate more than this (16 GiB): checked before allocating.
constexpr uint64_t kMaxDataBytes = uint64_t{1} << 34;

// A data file opened with open_input_file (so a FIFO or device is refused at once, never waited
// on), its size taken once from fstat; closed on every path.
class InputFile {
 public:
  explicit InputFile(const std::string& path);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  // Up to n bytes; fewer only at the end of the file.
  size_t read(uint8_t* out, size_t n);
  // Exactly n bytes, or a kInput error saying the file ended early (it shrank while being read).
  void read_exact(uint8_t* out, size_t n);
  void rewind();

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// One split of a data set and the files it came from, so that the checks made across splits
// (test labels against the training classes, train and test shapes) can name them.
struct LoadedSplit {
  ImageSet set;
  std::string images_file, labels_file;  // the same file for CIFAR (the first batch for several)
};

// The split of images [N, H, W] or [N, H, W, C] (dims, bytes) and their labels read from the two
// files; refuses counts that disagree, naming both files. num_classes is left 0 for the caller.
LoadedSplit make_split(const std::string& images_file, const std::string& labels_file,
                       const std::vector<int64_t>& dims, std::vector<uint8_t> images,
                       std::vector<Label> labels);
// "a x b x c" of a shape, for messages.
std::string shape_string(const std::vector<int64_t>& dims);
// The first existing file among dir/name for name in names, else "" (a name that exists but is
// not a regular file is returned: opening it gives the precise refusal).
std::string first_existing(const std::string& dir, const std::vector<std::string>& names);

// A split's two files (the same file twice for a one-file format).
struct SplitFiles {
  std::string images, labels;
};

// A data set's two splits as a format's loader reads them from a directory.
struct LoadedSplits {
  LoadedSplit train, test;
};
// A file a format's loader reads, as known before its data is read: the bytes of data it holds
// and the dims of its array (N x H x W [x C] of images, N of labels) from its header (IDX, .npy)
// or its size (CIFAR's records, images and labels together).
struct FileData {
  std::string path;
  uint64_t bytes = 0;
  std::vector<int64_t> dims;
  bool images = false;  // it holds images
  bool test = false;    // of the test split
};
using FileBytes = std::vector<FileData>;
// For the formats whose every split is an images and a labels file: both files of each of
// `splits` (the training split, then the test split) in turn, found by `files` and read as far as
// their headers by `header`, which gives the bytes and dims.
FileBytes split_file_bytes(const std::string& dir, const std::vector<std::string>& splits,
                           SplitFiles (*files)(const std::string& dir, const std::string& split),
                           FileData (*header)(const std::string& path));

// ---- idx.cc ----
// The files load_idx_split reads, and the bytes of data and dims one IDX file's header promises
// (its header alone is read: a gzip'd file is inflated only that far), with read_idx's header
// checks.
SplitFiles idx_split_files(const std::string& dir, const std::string& split);
FileData idx_file_data(const std::string& path);
// <split>-images-idx3-ubyte or -idx4-ubyte (each raw or .gz, .gz preferred; idx3 and idx4 both
// present is refused as ambiguous) and <split>-labels-idx1-ubyte[.gz]. Images 3-D (N x H x W,
// channels 1) or 4-D (N x H x W x C), labels 1-D with the images' count. num_classes is left 0:
// the caller decides it.
LoadedSplit load_idx_split(const std::string& dir, const std::string& split);
// The idx format: splits "train" and "t10k" (num_classes left 0), and the bytes of their files.
LoadedSplits load_idx(const std::string& dir);
FileBytes idx_file_bytes(const std::string& dir);

// ---- cifar.cc ----
// CIFAR binary batches: records of `label_bytes` (1: CIFAR-10, the class; 2: CIFAR-100, coarse
// then fine) label bytes and 3 planes of 32 x 32 pixels (R, G, B), read in order and interleaved to
// HWC. Every label is checked against its format's classes (10; 20 coarse and 100 fine).
// num_classes is set to 10 or 100.
constexpr int64_t kCifarSide = 32, kCifarChannels = 3;
constexpr int64_t kCifarPixels = kCifarSide * kCifarSide * kCifarChannels;  // 3072
LoadedSplit load_cifar_files(const std::vector<std::string>& paths, int label_bytes);
// The cifar10 format: data_batch_1.bin .. data_batch_5.bin (those present, at least one, in order)
// and test_batch.bin; cifar100: train.bin and test.bin. The bytes of their files are the files'
// sizes (CIFAR's records have no header).
LoadedSplits load_cifar10(const std::string& dir);
FileBytes cifar10_file_bytes(const std::string& dir);
LoadedSplits load_cifar100(const std::string& dir);
FileBytes cifar100_file_bytes(const std::string& dir);

// ---- npy.cc ----
// An .npy file's images: '|u1' data, 3-D (N x H x W, channels 1) or 4-D (N x H x W x C), C order.
struct NpyImages {
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};
NpyImages read_npy_images(const std::string& path);
// An .npy file's labels: 1-D, any integer dtype of 1, 2, 4 or 8 bytes in either byte order, each
// value in 0..kMaxClasses - 1 (65535).
std::vector<Label> read_npy_labels(const std::string& path);
// The bytes of data (shape x element size) and the shape an .npy file's header promises, with the
// header's checks; nothing past the header is read.
FileData npy_file_data(const std::string& path);
// <split>_images.npy and <split>_labels.npy in dir (refused when absent), and the split read from
// them, counts agreeing. num_classes left 0.
SplitFiles npy_split_files(const std::string& dir, const std::string& split);
LoadedSplit load_npy_split(const std::string& dir, const std::string& split);
// The npy format: splits "train" and "test" (num_classes left 0), and the bytes of their files.
LoadedSplits load_npy(const std::string& dir);
FileBytes npy_file_bytes(const std::string& dir);

}  // namespace dpt::data
