// Labelled image sets from the common on-disk formats (IDX of any shape, CIFAR-10/100 binary
// batches, NumPy .npy arrays), detected from the files in a directory or named. Nothing in a file
// is trusted: every defect is a kInput dpt::Error naming the file and what is wrong.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dpt {

// A class number. 16 bits: ImageNet-1k's 1,000 classes (and ImageNet-21k's 21,841) do not fit the
// byte that IDX and CIFAR files store, and 65,536 classes is more than any classifier head here
// would hold in memory usefully.
using Label = uint16_t;
constexpr int kMaxClasses = 65536;

// A labelled image set: images uint8 [n, rows, cols, channels] row-major (NHWC, the models'
// layout: a CIFAR record's planes are interleaved on load), labels [n].
struct ImageSet {
  int64_t n = 0, rows = 0, cols = 0, channels = 1;
  std::vector<uint8_t> images;
  std::vector<Label> labels;
  int num_classes = 10;  // every label is < num_classes; the same in a data set's train and test
  int64_t pixels() const { return rows * cols * channels; }  // bytes per image
  // "28x28x1": rows x cols x channels, as messages, the banner and the data digest write it.
  std::string shape_text() const {
    return std::to_string(rows) + "x" + std::to_string(cols) + "x" + std::to_string(channels);
  }
};

// The formats load_data reads; "auto" detects one from the file names in the directory.
//   idx:      train-images-idx3-ubyte / -idx4-ubyte and train-labels-idx1-ubyte, the same with
//             t10k-, raw or gzip'd (.gz). idx3 is N x H x W (one channel), idx4 N x H x W x C.
//   cifar10:  data_batch_1.bin .. data_batch_5.bin (those present, at least one, in order) and
//             test_batch.bin: records of 1 label byte + 3072 pixel bytes (3 planes of 32 x 32).
//   cifar100: train.bin and test.bin: records of 2 label bytes (coarse, fine) + 3072 pixel bytes;
//             the fine label (100 classes) is the one trained on.
//   npy:      train_images.npy, train_labels.npy, test_images.npy, test_labels.npy: uint8 images
//             N x H x W or N x H x W x C in C order, labels of any integer dtype (1-D, N).
std::vector<std::string> data_formats();  // {"auto", "idx", "cifar10", "cifar100", "npy"}

// A data set's training and test splits.
struct DataSets {
  std::string format;  // the format read (never "auto")
  ImageSet train, test;
};

// Reads `dir` in `format` (one of data_formats()). "auto" looks at which names exist: idx
// train-images-idx3-ubyte[.gz] or -idx4-ubyte[.gz]; cifar10 data_batch_1.bin or test_batch.bin;
// cifar100 both train.bin and test.bin; npy train_images.npy. num_classes: 10 for cifar10 and 100
// for cifar100; for idx and npy, one more than the largest training label. Refuses (kInput, naming
// the file): an unknown format, a missing directory, no format detected (the names looked for are
// listed with the directory's first few names, and a subdirectory holding a data set is pointed
// at) or several (asks for --data-format), a missing file or one that is not a regular file (a
// FIFO is never waited on), a CIFAR file that is not a whole number of records, an .npy file with
// a dtype other than uint8 images / integer labels, Fortran order, a bad header or a count that
// disagrees, labels outside 0..kMaxClasses-1 or outside the format's classes, a test label the
// training set has no class for, train and test images of different shapes, and any file or header
// promising more than 2^34 bytes (before allocating).
//
// `dir` may instead be "synthetic:HxWxC:N:K" (is_synthetic): random images of H x W x C and labels
// in 0..K-1 (K <= kMaxClasses), N for training and N/10 (rounded up) for the test split, drawn from
// `seed` (the same on every rank), with format "synthetic"; `format` must be "auto" then.
DataSets load_data(const std::string& dir, const std::string& format, uint64_t seed = 0);
bool is_synthetic(const std::string& data);
DataSets synthetic_data(const std::string& spec, uint64_t seed);

// What load_data(dir, format) will hold in memory, known before any data is read: each file's
// bytes of data from its header (IDX: dims x 1 byte, a gzip'd file's decompressed size, inflating
// only the header; .npy: shape x element size) or its size (CIFAR's records), summed over the
// images and labels of both splits. The same refusals as load_data for what the headers show (a
// missing file, a bad header, more than 2^34 bytes). The largest file is named in messages.
// The headers (or the synthetic spec) also give the images' shape, the test split's count and,
// where the format fixes them, the classes: what the batch's memory depends on, so it is checked
// before the data is read.
struct DataSize {
  uint64_t bytes = 0;
  std::string largest_file;
  uint64_t largest_bytes = 0;
  std::vector<std::string>
      files;  // every file read (none for synthetic data): no output may be one
  std::vector<int64_t> image_shape;  // H, W, C of the training images; empty when not known
  int64_t test_n = 0;                // test images
  int classes = 0;  // fixed by the format or spec (CIFAR, synthetic); 0: the training labels say
};
DataSize data_size(const std::string& dir, const std::string& format);
// data_size of a synthetic spec (is_synthetic): what synthetic_data will allocate, drawn in memory.
DataSize synthetic_size(const std::string& spec);

// Per-channel mean and (population) standard deviation of pixel / 255 over every image of `set`
// (which must not be empty): the --normalize auto statistics. The sums are exact integers (a
// histogram per channel), so the result is the same bits on every rank whatever the order.
struct ChannelStats {
  std::vector<double> mean, std;
};
ChannelStats channel_stats(const ImageSet& set);

}  // namespace dpt
