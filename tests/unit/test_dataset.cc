// Unit tests for load_data (include/dpt/dataset.h): tiny data sets of every format written here
// byte by byte, loaded and compared pixel for pixel; one test per refusal, each checking the kInput
// message names the file and the defect; --data synthetic's draws (shape, counts, labels in
// range, the seed and the split); the synthetic writer tests/data/make_data.py round-tripped; and
// Fashion-MNIST read byte-identically to its files.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "data/readers.h"
#include "data_files.h"
#include "dpt/dataset.h"
#include "dpt/error.h"

namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;
using Labels = std::vector<dpt::Label>;
using dpt::test::expect_input_error;
using dpt::test::read_all;
using dpt::test::write_gz;
using dpt::test::write_raw;

using dpt::test::idx_bytes;

// ---- writers of each format ---------------------------------------------------------------------

// An .npy file with `header` as its dict text (padded as numpy pads it) in format `major`.0.
Bytes npy_raw(const std::string& header, const Bytes& data, int major = 1) {
  const size_t prefix = major == 1 ? 10 : 12;
  std::string h = header;
  while ((prefix + h.size() + 1) % 64 != 0) h += ' ';
  h += '\n';
  Bytes out = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<uint8_t>(major), 0};
  for (size_t i = 0; i < prefix - 8; ++i) out.push_back(static_cast<uint8_t>(h.size() >> (8 * i)));
  out.insert(out.end(), h.begin(), h.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// Python's repr of the shape tuple, as numpy writes it: "(5,)", "(2, 3, 3)".
std::string shape_tuple(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  s += ")";
  return s;
}

Bytes npy_bytes(const std::string& descr, const std::vector<int64_t>& shape, const Bytes& data,
                int major = 1, bool fortran = false) {
  return npy_raw("{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") +
                     ", 'shape': " + shape_tuple(shape) + ", }",
                 data, major);
}

// Integer labels in dtype `descr` ("<i8", ">u2", "|u1", ...), values as given (may be negative).
Bytes label_data(const std::string& descr, const std::vector<int64_t>& values) {
  const size_t size = std::stoul(descr.substr(2));
  const bool big = descr[0] == '>';
  Bytes out;
  for (int64_t v : values) {
    const auto u = static_cast<uint64_t>(v);
    for (size_t k = 0; k < size; ++k) {
      const size_t byte = big ? size - 1 - k : k;
      out.push_back(static_cast<uint8_t>(u >> (8 * byte)));
    }
  }
  return out;
}

// Pixel value of a test image: distinct for every (image, y, x, c) in the tiny sets.
uint8_t pixel(int64_t i, int64_t y, int64_t x, int64_t c) {
  return static_cast<uint8_t>(i * 31 + y * 7 + x * 3 + c * 101 + 5);
}

// n images H x W x C in HWC order from pixel().
Bytes hwc_images(int64_t n, int64_t h, int64_t w, int64_t c, int64_t first = 0) {
  Bytes out;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t y = 0; y < h; ++y)
      for (int64_t x = 0; x < w; ++x)
        for (int64_t ch = 0; ch < c; ++ch) out.push_back(pixel(first + i, y, x, ch));
  return out;
}

// CIFAR records for images first..first+labels.size(): label bytes, then the R, G, B planes.
Bytes cifar_records(const std::vector<Bytes>& label_bytes, int64_t first = 0) {
  Bytes out;
  for (size_t r = 0; r < label_bytes.size(); ++r) {
    out.insert(out.end(), label_bytes[r].begin(), label_bytes[r].end());
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t y = 0; y < 32; ++y)
        for (int64_t x = 0; x < 32; ++x)
          out.push_back(pixel(first + static_cast<int64_t>(r), y, x, c));
  }
  return out;
}

// The decompressed bytes of a gzip file, by zlib's own reader: independent of dptrain's.
Bytes gunzip(const fs::path& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  EXPECT_NE(f, nullptr) << path;
  Bytes out;
  std::vector<uint8_t> buf(1 << 16);
  for (int got; (got = gzread(f, buf.data(), static_cast<unsigned>(buf.size()))) > 0;)
    out.insert(out.end(), buf.begin(), buf.begin() + got);
  gzclose(f);
  return out;
}

class DatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("dpt_test_dataset_" + std::to_string(getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path file(const std::string& name) const { return dir_ / name; }
  std::string path(const std::string& name) const { return file(name).string(); }
  dpt::DataSets load(const std::string& format = "auto") const {
    return dpt::load_data(dir_.string(), format);
  }
  void expect_load_error(const std::vector<std::string>& needles,
                         const std::string& format = "auto") {
    expect_input_error([&] { load(format); }, needles);
  }

  // A good npy data set: n_train / n_test images of h x w (x c when c > 0), labels as given.
  void write_npy_set(int64_t h, int64_t w, int64_t c, const std::vector<int64_t>& train_labels,
                     const std::vector<int64_t>& test_labels,
                     const std::string& label_descr = "|u1") {
    const auto shape = [&](int64_t n) {
      return c > 0 ? std::vector<int64_t>{n, h, w, c} : std::vector<int64_t>{n, h, w};
    };
    const int64_t cc = c > 0 ? c : 1;
    const auto ntr = static_cast<int64_t>(train_labels.size());
    const auto nte = static_cast<int64_t>(test_labels.size());
    write_raw(file("train_images.npy"), npy_bytes("|u1", shape(ntr), hwc_images(ntr, h, w, cc)));
    write_raw(file("test_images.npy"),
              npy_bytes("|u1", shape(nte), hwc_images(nte, h, w, cc, 100)));
    write_raw(file("train_labels.npy"),
              npy_bytes(label_descr, {ntr}, label_data(label_descr, train_labels)));
    write_raw(file("test_labels.npy"),
              npy_bytes(label_descr, {nte}, label_data(label_descr, test_labels)));
  }

  // A good idx set: 4 training and 3 test images of h x w x c (idx4 when c > 1).
  void write_idx_set(int64_t h, int64_t w, int64_t c, const Bytes& train_labels = {3, 0, 4, 1},
                     const Bytes& test_labels = {2, 4, 0}, bool gz = false) {
    const std::string kind = c > 1 ? "idx4" : "idx3";
    const auto dims = [&](size_t n) {
      std::vector<uint32_t> d = {static_cast<uint32_t>(n), static_cast<uint32_t>(h),
                                 static_cast<uint32_t>(w)};
      if (c > 1) d.push_back(static_cast<uint32_t>(c));
      return d;
    };
    const std::string ext = gz ? ".gz" : "";
    auto write = gz ? write_gz : write_raw;
    const auto ntr = static_cast<int64_t>(train_labels.size()),
               nte = static_cast<int64_t>(test_labels.size());
    write(file("train-images-" + kind + "-ubyte" + ext),
          idx_bytes(0x08, dims(ntr), hwc_images(ntr, h, w, c)));
    write(file("t10k-images-" + kind + "-ubyte" + ext),
          idx_bytes(0x08, dims(nte), hwc_images(nte, h, w, c, 100)));
    write(file("train-labels-idx1-ubyte" + ext),
          idx_bytes(0x08, {static_cast<uint32_t>(ntr)}, train_labels));
    write(file("t10k-labels-idx1-ubyte" + ext),
          idx_bytes(0x08, {static_cast<uint32_t>(nte)}, test_labels));
  }

  fs::path dir_;
};

// Every pixel of `set` is pixel(first + i, y, x, c).
void expect_pixels(const dpt::ImageSet& set, int64_t first = 0) {
  ASSERT_EQ(static_cast<int64_t>(set.images.size()), set.n * set.pixels());
  int64_t wrong = 0;
  for (int64_t i = 0; i < set.n; ++i)
    for (int64_t y = 0; y < set.rows; ++y)
      for (int64_t x = 0; x < set.cols; ++x)
        for (int64_t c = 0; c < set.channels; ++c) {
          const uint8_t got = set.images[static_cast<size_t>(
              ((i * set.rows + y) * set.cols + x) * set.channels + c)];
          if (got != pixel(first + i, y, x, c) && ++wrong <= 5)
            ADD_FAILURE() << "image " << i << " [" << y << "][" << x << "][" << c
                          << "] = " << int{got} << ", expected " << int{pixel(first + i, y, x, c)};
        }
  EXPECT_EQ(wrong, 0);
}

// ---- formats, good files
// --------------------------------------------------------------------------

TEST(DataFormats, ListsEveryFormat) {
  EXPECT_EQ(dpt::data_formats(),
            (std::vector<std::string>{"auto", "idx", "cifar10", "cifar100", "npy"}));
}

// Every format data_formats() lists (but "auto") against a small data set written here: it loads
// pixel for pixel, it is detected, and data_size says what load_data holds. A format added without
// a writer here fails.
TEST_F(DatasetTest, EveryListedFormatLoadsIsDetectedAndSized) {
  const std::map<std::string, std::function<void()>> writers = {
      {"idx", [&] { write_idx_set(2, 3, 1); }},
      {"cifar10",
       [&] {
         write_raw(file("data_batch_1.bin"), cifar_records({{7}, {0}}));
         write_raw(file("test_batch.bin"), cifar_records({{1}}, 100));
       }},
      {"cifar100",
       [&] {
         write_raw(file("train.bin"), cifar_records({{19, 99}, {0, 0}, {4, 21}}));
         write_raw(file("test.bin"), cifar_records({{3, 17}}, 100));
       }},
      {"npy",
       [&] {
         write_npy_set(2, 3, 3, {0, 2, 1}, {1, 1});
       }},
  };
  const std::vector<std::string> formats = dpt::data_formats();
  ASSERT_FALSE(formats.empty());
  EXPECT_EQ(formats.front(), "auto");
  for (size_t i = 1; i < formats.size(); ++i) {
    const std::string& name = formats[i];
    SCOPED_TRACE(name);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const auto writer = writers.find(name);
    ASSERT_NE(writer, writers.end()) << "no data set written here for format " << name;
    writer->second();
    const dpt::DataSets d = load(name);
    EXPECT_EQ(d.format, name);
    EXPECT_GT(d.train.n, 0);
    EXPECT_GT(d.test.n, 0);
    expect_pixels(d.train);
    expect_pixels(d.test, 100);
    EXPECT_EQ(load("auto").format, name);
    // CIFAR-100 records keep the coarse label in the file besides the fine one load_data holds.
    const uint64_t file_label_bytes = name == "cifar100" ? 2 : 1;
    const dpt::DataSize size = dpt::data_size(dir_.string(), name);
    EXPECT_EQ(size.bytes, d.train.images.size() + d.test.images.size() +
                              file_label_bytes * (d.train.labels.size() + d.test.labels.size()));
    EXPECT_EQ(dpt::data_size(dir_.string(), "auto").bytes, size.bytes);
    EXPECT_FALSE(size.largest_file.empty());
  }
}

TEST_F(DatasetTest, IdxIdx3IsOneChannelAndClassesComeFromTrainingLabels) {
  for (bool gz : {false, true}) {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    write_idx_set(2, 3, 1, {3, 0, 4, 1}, {2, 4, 0}, gz);
    for (const char* format : {"auto", "idx"}) {
      const dpt::DataSets d = load(format);
      EXPECT_EQ(d.format, "idx");
      for (const dpt::ImageSet* s : {&d.train, &d.test}) {
        EXPECT_EQ(s->rows, 2);
        EXPECT_EQ(s->cols, 3);
        EXPECT_EQ(s->channels, 1);
        EXPECT_EQ(s->pixels(), 6);
        EXPECT_EQ(s->num_classes, 5);  // one more than the largest training label, 4
      }
      EXPECT_EQ(d.train.n, 4);
      EXPECT_EQ(d.test.n, 3);
      expect_pixels(d.train);
      expect_pixels(d.test, 100);
      EXPECT_EQ(d.train.labels, (Labels{3, 0, 4, 1}));
      EXPECT_EQ(d.test.labels, (Labels{2, 4, 0}));
    }
  }
}

TEST_F(DatasetTest, IdxIdx4KeepsChannelsLast) {
  write_idx_set(3, 2, 3, {1, 1, 0, 1}, {0, 1, 1}, /*gz=*/true);
  const dpt::DataSets d = load();
  EXPECT_EQ(d.format, "idx");
  EXPECT_EQ(d.train.shape_text(), "3x2x3");
  EXPECT_EQ(d.train.num_classes, 2);
  expect_pixels(d.train);
  expect_pixels(d.test, 100);
}

TEST_F(DatasetTest, Cifar10InterleavesPlanesAndReadsBatchesInOrder) {
  // Batches 1 and 3 only (those present are read, in order), then the test batch.
  write_raw(file("data_batch_1.bin"), cifar_records({{7}, {0}}, 0));
  write_raw(file("data_batch_3.bin"), cifar_records({{9}, {3}, {5}}, 2));
  write_raw(file("test_batch.bin"), cifar_records({{1}, {2}}, 100));
  for (const char* format : {"auto", "cifar10"}) {
    const dpt::DataSets d = load(format);
    EXPECT_EQ(d.format, "cifar10");
    EXPECT_EQ(d.train.n, 5);
    EXPECT_EQ(d.test.n, 2);
    for (const dpt::ImageSet* s : {&d.train, &d.test}) {
      EXPECT_EQ(s->rows, 32);
      EXPECT_EQ(s->cols, 32);
      EXPECT_EQ(s->channels, 3);
      EXPECT_EQ(s->num_classes, 10);
    }
    EXPECT_EQ(d.train.labels, (Labels{7, 0, 9, 3, 5}));
    EXPECT_EQ(d.test.labels, (Labels{1, 2}));
    expect_pixels(d.train);  // the R/G/B planes land at [y][x][0/1/2]
    expect_pixels(d.test, 100);
  }
  // One pixel spelled out: record 0 of data_batch_1, y = 1, x = 2: R at 1 + 34, G at 1 + 1024 + 34.
  const Bytes raw = read_all(file("data_batch_1.bin"));
  const dpt::DataSets d = load();
  for (int c = 0; c < 3; ++c)
    EXPECT_EQ(d.train.images[(1 * 32 + 2) * 3 + c], raw[1 + c * 1024 + 34]) << c;
}

// A file of more records than one read takes (512, cifar.cc): every record lands in its place, the
// ones past the first read too, and a bad label there is named by its index in the file.
TEST_F(DatasetTest, CifarFilesLongerThanOneReadKeepEveryRecordInPlace) {
  std::vector<Bytes> labels;
  for (int r = 0; r < 1030; ++r) labels.push_back({static_cast<uint8_t>(r * 7 % 10)});
  write_raw(file("data_batch_1.bin"), cifar_records(labels));
  write_raw(file("test_batch.bin"), cifar_records({{4}}, 2000));
  const dpt::DataSets d = load("cifar10");
  ASSERT_EQ(d.train.n, 1030);
  ASSERT_EQ(d.train.labels.size(), 1030u);
  for (int r = 0; r < 1030; ++r) EXPECT_EQ(d.train.labels[r], r * 7 % 10) << r;
  expect_pixels(d.train);
  expect_pixels(d.test, 2000);
  labels[1029] = {10};
  write_raw(file("data_batch_1.bin"), cifar_records(labels));
  expect_load_error({path("data_batch_1.bin"), "label 10 at index 1029"});
}

TEST_F(DatasetTest, Cifar100TrainsOnTheFineLabel) {
  write_raw(file("train.bin"), cifar_records({{19, 99}, {0, 0}, {4, 21}}));
  write_raw(file("test.bin"), cifar_records({{3, 17}}, 100));
  const dpt::DataSets d = load();
  EXPECT_EQ(d.format, "cifar100");
  EXPECT_EQ(d.train.num_classes, 100);
  EXPECT_EQ(d.test.num_classes, 100);
  EXPECT_EQ(d.train.labels, (Labels{99, 0, 21}));
  EXPECT_EQ(d.test.labels, (Labels{17}));
  expect_pixels(d.train);
  expect_pixels(d.test, 100);
}

TEST_F(DatasetTest, Npy3DAnd4DImages) {
  write_npy_set(2, 5, 0, {0, 2, 1}, {1, 1});
  dpt::DataSets d = load();
  EXPECT_EQ(d.format, "npy");
  EXPECT_EQ(d.train.shape_text(), "2x5x1");
  EXPECT_EQ(d.train.num_classes, 3);
  EXPECT_EQ(d.train.labels, (Labels{0, 2, 1}));
  EXPECT_EQ(d.test.labels, (Labels{1, 1}));
  expect_pixels(d.train);
  expect_pixels(d.test, 100);

  write_npy_set(4, 3, 2, {1, 0}, {0, 0, 1});
  d = load("npy");
  EXPECT_EQ(d.train.shape_text(), "4x3x2");
  EXPECT_EQ(d.test.n, 3);
  EXPECT_EQ(d.train.num_classes, 2);
  expect_pixels(d.train);
  expect_pixels(d.test, 100);
}

TEST_F(DatasetTest, NpyLabelsOfEveryIntegerDtypeAndByteOrder) {
  const std::vector<int64_t> train = {0, 255, 7, 128}, test = {3, 254};
  for (const char* kind : {"i", "u"}) {
    for (const char* size : {"1", "2", "4", "8"}) {
      for (const char* order : {"<", ">", "|"}) {
        std::string descr = std::string(order) + kind + size;
        // int8 cannot hold 255: use the values it can.
        const bool i1 = descr.substr(1) == "i1";
        const std::vector<int64_t> tr = i1 ? std::vector<int64_t>{0, 127, 7, 100} : train;
        const std::vector<int64_t> te = i1 ? std::vector<int64_t>{3, 126} : test;
        write_npy_set(2, 2, 0, tr, te, descr);
        const dpt::DataSets d = load();
        EXPECT_EQ(d.train.labels, Labels(tr.begin(), tr.end())) << descr;
        EXPECT_EQ(d.test.labels, Labels(te.begin(), te.end())) << descr;
        EXPECT_EQ(d.train.num_classes, i1 ? 128 : 256) << descr;
      }
    }
  }
}

TEST_F(DatasetTest, NpyHeaderVersions) {
  const Bytes img = hwc_images(2, 3, 3, 1);
  for (int major : {1, 2, 3}) {
    write_raw(file("x.npy"), npy_bytes("|u1", {2, 3, 3}, img, major));
    const dpt::data::NpyImages got = dpt::data::read_npy_images(path("x.npy"));
    EXPECT_EQ(got.shape, (std::vector<int64_t>{2, 3, 3})) << major;
    EXPECT_EQ(got.data, img) << major;
  }
  // What numpy wrote in other times: double quotes, "L" longs, keys in another order, no padding.
  write_raw(
      file("y.npy"),
      npy_raw("{\"shape\": (2L, 3L, 3L), \"fortran_order\": False, \"descr\": \"<u1\"}", img));
  EXPECT_EQ(dpt::data::read_npy_images(path("y.npy")).data, img);
  // Labels may be in Fortran order: a 1-D array is the same bytes either way.
  write_raw(file("l.npy"), npy_bytes("<i4", {3}, label_data("<i4", {4, 5, 6}), 1, true));
  EXPECT_EQ(dpt::data::read_npy_labels(path("l.npy")), (Labels{4, 5, 6}));
}

// ---- channel_stats ----------------------------------------------------------------------------

TEST(ChannelStats, MatchesHandComputedValues) {
  // Two images of 1 x 2 pixels, 2 channels: channel 0 holds 0, 255, 0, 255 (mean 0.5, std 0.5);
  // channel 1 holds 51 four times (mean 0.2, std 0).
  dpt::ImageSet s;
  s.n = 2, s.rows = 1, s.cols = 2, s.channels = 2;
  s.images = {0, 51, 255, 51, 0, 51, 255, 51};
  s.labels = {0, 1};
  dpt::ChannelStats st = dpt::channel_stats(s);
  ASSERT_EQ(st.mean.size(), 2u);
  ASSERT_EQ(st.std.size(), 2u);
  EXPECT_DOUBLE_EQ(st.mean[0], 0.5);
  EXPECT_DOUBLE_EQ(st.std[0], 0.5);
  EXPECT_DOUBLE_EQ(st.mean[1], 0.2);
  EXPECT_DOUBLE_EQ(st.std[1], 0.0);
  // One channel 0, 51, 102: mean 51/255 = 0.2, variance (51^2 + 0 + 51^2) / 3 / 255^2 = 0.08/3.
  dpt::ImageSet g;
  g.n = 3, g.rows = 1, g.cols = 1, g.channels = 1;
  g.images = {0, 51, 102};
  g.labels = {0, 0, 0};
  st = dpt::channel_stats(g);
  ASSERT_EQ(st.mean.size(), 1u);
  EXPECT_DOUBLE_EQ(st.mean[0], 0.2);
  EXPECT_NEAR(st.std[0], std::sqrt(0.08 / 3), 1e-15);
}

TEST(ChannelStats, RgbOfALoadedCifarRecordAgreesWithATwoPassSum) {
  dpt::ImageSet s;
  s.n = 5, s.rows = 4, s.cols = 3, s.channels = 3;
  s.images = hwc_images(5, 4, 3, 3);
  s.labels.assign(5, 0);
  const dpt::ChannelStats st = dpt::channel_stats(s);
  for (int c = 0; c < 3; ++c) {
    double sum = 0, sq = 0;
    const int64_t count = s.n * s.rows * s.cols;
    for (int64_t p = 0; p < count; ++p) sum += s.images[static_cast<size_t>(p * 3 + c)] / 255.0;
    const double mean = sum / static_cast<double>(count);
    for (int64_t p = 0; p < count; ++p) {
      const double d = s.images[static_cast<size_t>(p * 3 + c)] / 255.0 - mean;
      sq += d * d;
    }
    EXPECT_NEAR(st.mean[static_cast<size_t>(c)], mean, 1e-12) << c;
    EXPECT_NEAR(st.std[static_cast<size_t>(c)], std::sqrt(sq / static_cast<double>(count)), 1e-12)
        << c;
  }
}

// ---- detection ----------------------------------------------------------------------------------

TEST_F(DatasetTest, NothingDetectedListsWhatWasLookedFor) {
  write_raw(file("readme.txt"), {'h', 'i'});
  expect_load_error({dir_.string(), "no data set found", "train-images-idx3-ubyte",
                     "train-images-idx4-ubyte", "data_batch_1.bin", "test_batch.bin",
                     "train.bin and test.bin", "train_images.npy",
                     "the directory holds readme.txt"});
  // train.bin alone is not taken for CIFAR-100.
  write_raw(file("train.bin"), cifar_records({{0, 0}}));
  expect_load_error({"no data set found", "the directory holds readme.txt and train.bin"});
}

TEST_F(DatasetTest, NothingDetectedInAnEmptyDirectorySaysSo) {
  expect_load_error({dir_.string(), "no data set found",
                     "looked for idx: ", "npy: train_images.npy", "the directory is empty"});
  expect_input_error([&] { dpt::data_size(dir_.string(), "auto"); },
                     {dir_.string(), "no data set found", "the directory is empty"});
}

TEST_F(DatasetTest, NothingDetectedNamesTheFirstFilesFound) {
  // Eight entries: the first five in order (a directory marked with /), then how many more.
  for (const char* name : {"g.txt", "b.csv", "a.png", "f", "e.bin", "c.npy", "d.json"})
    write_raw(file(name), {1});
  fs::create_directories(dir_ / "aa");
  expect_load_error({dir_.string(), "no data set found", "train_images.npy",
                     "; the directory holds a.png, aa/, b.csv, c.npy, d.json and 3 more"});
}

TEST_F(DatasetTest, NothingDetectedEscapesTheNamesItLists) {
  // A file name planted in a shared directory reaches the message escaped, never as the terminal
  // control sequence it spells.
  write_raw(file("\x1b[2Jx\nname"), {1});
  try {
    dpt::load_data(dir_.string(), "auto");
    ADD_FAILURE() << "a directory without a data set loaded";
  } catch (const dpt::Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\x1b'), std::string::npos) << what;
    EXPECT_NE(what.find("the directory holds \\x1b[2Jx\\nname"), std::string::npos) << what;
  }
}

TEST_F(DatasetTest, NothingDetectedPointsAtTheUnpackedFolder) {
  const fs::path sub = dir_ / "cifar-10-batches-bin";
  fs::create_directories(sub);
  write_raw(sub / "data_batch_1.bin", cifar_records({{0}}));
  write_raw(sub / "test_batch.bin", cifar_records({{0}}));
  expect_load_error({"no data set found", sub.string(), "point --data there"});
  EXPECT_EQ(dpt::load_data(sub.string(), "auto").format, "cifar10");
}

TEST_F(DatasetTest, SeveralFormatsPresentAsksForDataFormat) {
  write_idx_set(2, 2, 1);
  write_npy_set(2, 2, 0, {0, 1}, {1});
  expect_load_error({dir_.string(), "several formats", "idx and npy", "--data-format"});
  // Named, either is read.
  EXPECT_EQ(load("idx").train.n, 4);
  EXPECT_EQ(load("npy").train.n, 2);
}

TEST_F(DatasetTest, UnknownFormatAndMissingDirectory) {
  expect_load_error(
      {"--data-format", "cifar", "unknown format", "auto, idx, cifar10, cifar100, npy"}, "cifar");
  expect_input_error([&] { dpt::data_size(dir_.string(), "cifar"); },
                     {"--data-format", "cifar", "unknown format"});
  const std::string gone = (dir_ / "absent").string();
  expect_input_error([&] { dpt::load_data(gone, "auto"); }, {gone, "no such directory"});
  expect_input_error([&] { dpt::load_data(gone, "idx"); }, {gone, "no such directory"});
  write_raw(file("plain"), {1});
  expect_input_error([&] { dpt::load_data(path("plain"), "npy"); },
                     {path("plain"), "not a directory"});
}

TEST_F(DatasetTest, MissingFilesOfANamedFormat) {
  expect_load_error({dir_.string(), "no CIFAR-10 training batch", "data_batch_1.bin"}, "cifar10");
  write_raw(file("data_batch_2.bin"), cifar_records({{0}}));
  expect_load_error({path("test_batch.bin"), "no such file"}, "cifar10");
  expect_load_error({path("train.bin"), "no such file"}, "cifar100");
  write_npy_set(2, 2, 0, {0, 1}, {1});
  fs::remove(file("test_labels.npy"));
  expect_load_error({dir_.string(), "no test_labels.npy"});
  write_idx_set(2, 2, 1);
  fs::remove(file("t10k-labels-idx1-ubyte"));
  expect_load_error({dir_.string(), "t10k labels", "t10k-labels-idx1-ubyte.gz"}, "idx");
}

TEST_F(DatasetTest, FifoAndDirectoryAreRefusedNotWaitedOn) {
  ASSERT_EQ(::mkfifo(file("data_batch_1.bin").c_str(), 0600), 0);
  write_raw(file("test_batch.bin"), cifar_records({{0}}));
  const auto start = std::chrono::steady_clock::now();
  expect_load_error({path("data_batch_1.bin"), "FIFO", "not a regular file"});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  fs::remove(file("data_batch_1.bin"));
  fs::remove(file("test_batch.bin"));
  write_npy_set(2, 2, 0, {0, 1}, {1});
  fs::remove(file("test_images.npy"));
  fs::create_directory(file("test_images.npy"));
  expect_load_error({path("test_images.npy"), "directory"});
}

// ---- refusals across splits ---------------------------------------------------------------------

TEST_F(DatasetTest, TestLabelWithoutATrainingClass) {
  write_idx_set(2, 2, 1, {0, 9, 1, 2}, {1, 2, 3, 4, 5, 12});
  expect_load_error(
      {path("t10k-labels-idx1-ubyte"), "label 12 at index 5", "the training set has classes 0..9"});
  write_npy_set(2, 2, 0, {0, 1}, {1, 0, 2});
  expect_load_error({path("test_labels.npy"), "label 2 at index 2", "classes 0..1"}, "npy");
}

TEST_F(DatasetTest, TrainAndTestShapesMustAgree) {
  write_raw(file("train_images.npy"), npy_bytes("|u1", {2, 4, 4}, hwc_images(2, 4, 4, 1)));
  write_raw(file("train_labels.npy"), npy_bytes("|u1", {2}, {0, 1}));
  write_raw(file("test_images.npy"), npy_bytes("|u1", {1, 4, 4, 3}, hwc_images(1, 4, 4, 3)));
  write_raw(file("test_labels.npy"), npy_bytes("|u1", {1}, {0}));
  expect_load_error(
      {"differ in shape", path("train_images.npy"), "4x4x1", path("test_images.npy"), "4x4x3"});
  write_idx_set(5, 4, 1);
  write_raw(file("t10k-images-idx3-ubyte"), idx_bytes(0x08, {3, 4, 5}, hwc_images(3, 4, 5, 1)));
  expect_load_error({"differ in shape", path("train-images-idx3-ubyte"), "5x4x1",
                     path("t10k-images-idx3-ubyte"), "4x5x1"},
                    "idx");
}

TEST_F(DatasetTest, IdxIdx3AndIdx4BothPresentIsAmbiguous) {
  write_idx_set(2, 2, 1);
  write_raw(file("train-images-idx4-ubyte"), idx_bytes(0x08, {4, 2, 2, 1}, hwc_images(4, 2, 2, 1)));
  expect_load_error(
      {dir_.string(), "train-images-idx3-ubyte", "train-images-idx4-ubyte", "Remove one"});
}

// ---- CIFAR refusals ---------------------------------------------------------------------------

TEST_F(DatasetTest, CifarPartialRecord) {
  Bytes batch = cifar_records({{1}, {2}});
  batch.pop_back();
  write_raw(file("data_batch_1.bin"), batch);
  write_raw(file("test_batch.bin"), cifar_records({{0}}));
  expect_load_error(
      {path("data_batch_1.bin"), "6145 bytes", "not a whole number of 3073-byte CIFAR-10 records"});
  // A CIFAR-100 file read as CIFAR-10: the message suggests the other format.
  write_raw(file("data_batch_1.bin"), cifar_records({{1, 2}, {3, 4}, {5, 6}}));
  expect_load_error(
      {path("data_batch_1.bin"), "9222 bytes", "3073-byte", "--data-format cifar100"});
  // And the other way round.
  write_raw(file("train.bin"), cifar_records({{1}, {2}}));
  write_raw(file("test.bin"), cifar_records({{1, 2}}));
  expect_load_error(
      {path("train.bin"), "6146 bytes", "3074-byte CIFAR-100 records", "--data-format cifar10?"},
      "cifar100");
}

TEST_F(DatasetTest, CifarEmptyFile) {
  write_raw(file("data_batch_1.bin"), cifar_records({{1}}));
  write_raw(file("test_batch.bin"), {});
  expect_load_error({path("test_batch.bin"), "empty file"});
}

TEST_F(DatasetTest, CifarLabelsOutsideTheFormatsClasses) {
  write_raw(file("data_batch_1.bin"), cifar_records({{1}, {2}, {10}}));
  write_raw(file("test_batch.bin"), cifar_records({{0}}));
  expect_load_error({path("data_batch_1.bin"), "label 10 at index 2", "CIFAR-10 has classes 0..9"});
  write_raw(file("data_batch_1.bin"), cifar_records({{1}}));
  write_raw(file("test_batch.bin"), cifar_records({{0}, {255}}));
  expect_load_error({path("test_batch.bin"), "label 255 at index 1"});

  write_raw(file("train.bin"), cifar_records({{1, 5}, {20, 99}}));
  write_raw(file("test.bin"), cifar_records({{1, 5}}));
  expect_load_error({path("train.bin"), "coarse label 20 at index 1", "coarse classes 0..19"},
                    "cifar100");
  write_raw(file("train.bin"), cifar_records({{1, 5}, {19, 100}}));
  expect_load_error({path("train.bin"), "fine label 100 at index 1", "classes 0..99"}, "cifar100");
}

// ---- npy refusals -----------------------------------------------------------------------------

class NpyRefusal : public DatasetTest {
 protected:
  void expect_images_error(const Bytes& bytes, const std::vector<std::string>& needles) {
    write_raw(file("bad.npy"), bytes);
    std::vector<std::string> all = needles;
    all.push_back(path("bad.npy"));
    expect_input_error([&] { dpt::data::read_npy_images(path("bad.npy")); }, all);
  }
  void expect_labels_error(const Bytes& bytes, const std::vector<std::string>& needles) {
    write_raw(file("bad.npy"), bytes);
    std::vector<std::string> all = needles;
    all.push_back(path("bad.npy"));
    expect_input_error([&] { dpt::data::read_npy_labels(path("bad.npy")); }, all);
  }
  const Bytes img_ = hwc_images(2, 3, 3, 1);
};

TEST_F(NpyRefusal, BadMagicAndTruncatedPrefix) {
  Bytes b = npy_bytes("|u1", {2, 3, 3}, img_);
  b[1] = 'n';
  expect_images_error(b, {"bad magic", "\\x93NUMPY"});
  expect_images_error({}, {"bad magic"});
  expect_images_error({0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0}, {"truncated", "8 bytes"});
  expect_images_error({0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, 10, 0}, {"truncated", "10 bytes"});
}

TEST_F(NpyRefusal, UnsupportedVersion) {
  Bytes b = npy_bytes("|u1", {2, 3, 3}, img_, 2);
  b[6] = 4;
  expect_images_error(b, {"unsupported .npy format version 4.0"});
  b = npy_bytes("|u1", {2, 3, 3}, img_);
  b[7] = 1;
  expect_images_error(b, {"version 1.1"});
}

TEST_F(NpyRefusal, UnsupportedDtypeIsNamed) {
  expect_images_error(npy_bytes("<f4", {2, 3, 3}, Bytes(72, 0)),
                      {"unsupported dtype '<f4'", "float32", "uint8"});
  expect_images_error(npy_bytes("<i2", {2, 3, 3}, Bytes(36, 0)), {"'<i2'", "int16"});
  expect_images_error(npy_bytes("|b1", {2, 3, 3}, img_), {"'|b1'", "bool"});
  expect_labels_error(npy_bytes("<f8", {2}, Bytes(16, 0)),
                      {"unsupported dtype '<f8'", "float64", "integers"});
  expect_labels_error(npy_bytes("|O", {2}, Bytes(16, 0)), {"'|O'", "Python objects"});
  expect_labels_error(npy_bytes("<u3", {2}, Bytes(6, 0)), {"'<u3'"});
  expect_labels_error(npy_bytes("=i4", {2}, Bytes(8, 0)), {"'=i4'"});
  expect_images_error(
      npy_raw("{'descr': [('a', '<u1')], 'fortran_order': False, 'shape': (2, 3, 3), }", img_),
      {"structured dtype"});
}

TEST_F(NpyRefusal, FortranOrderImages) {
  expect_images_error(npy_bytes("|u1", {2, 3, 3}, img_, 1, true), {"Fortran order"});
}

TEST_F(NpyRefusal, HeaderThatIsNotTheExpectedDict) {
  expect_images_error(npy_raw("[1, 2, 3]", img_), {"bad .npy header", "not a dict"});
  expect_images_error(npy_raw("{'descr': '|u1', 'fortran_order': False}", img_),
                      {"no 'shape' key"});
  expect_images_error(
      npy_raw("{'descr': '|u1', 'fortran_order': False, 'shape': (2, 3, 3), 'x': 1}", img_),
      {"unexpected key 'x'"});
  expect_images_error(
      npy_raw("{'descr': '|u1', 'descr': '|u1', 'fortran_order': False, 'shape': (2, 3, 3)}", img_),
      {"bad .npy header", "no repeated key"});
  expect_images_error(npy_raw("{'descr': '|u1', 'fortran_order': 0, 'shape': (2, 3, 3)}", img_),
                      {"'fortran_order' is not True or False"});
  expect_images_error(npy_raw("{'descr': '|u1', 'fortran_order': False, 'shape': [2, 3, 3]}", img_),
                      {"'shape' is not a tuple"});
  expect_images_error(
      npy_raw("{'descr': '|u1', 'fortran_order': False, 'shape': (2, -3, 3)}", img_),
      {"'shape' holds something other than a size"});
  expect_images_error(npy_raw("{'descr': 1, 'fortran_order': False, 'shape': (2, 3, 3)}", img_),
                      {"'descr' is not a string"});
  expect_images_error(npy_raw("{'descr': '|u1, 'fortran_order': False, 'shape': (2, 3, 3)}", img_),
                      {"bad .npy header", "expected"});
  expect_images_error(
      npy_raw("{'descr': '|u1', 'fortran_order': False, 'shape': (2, 3, 3)} junk", img_),
      {"bad .npy header", "the end of the header", "'junk"});
  expect_images_error(
      npy_raw("{'descr': '|u1', 'fortran_order': False, 'shape': (99999999999999999999, 3)}", img_),
      {"bad .npy header", "below 2^56"});
  expect_images_error(npy_raw(std::string(200, '(') + std::string(200, ')'), img_),
                      {"bad .npy header", "less nesting"});
}

TEST_F(NpyRefusal, HeaderLengthBeyondTheFileOrAbsurd) {
  Bytes b = npy_bytes("|u1", {2, 3, 3}, {});
  b.resize(40);  // the header is cut
  expect_images_error(b, {"truncated", "the header says it is"});
  Bytes big = {0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, 0, 0, 0, 0x40};  // 1 GiB header
  expect_images_error(big, {"bad .npy header", "1073741824 bytes"});
}

TEST_F(NpyRefusal, DataSizeDisagreesWithTheShape) {
  Bytes shortd(img_.begin(), img_.end() - 1);
  expect_images_error(npy_bytes("|u1", {2, 3, 3}, shortd),
                      {"truncated", "2x3x3", "18 bytes", "has 17"});
  Bytes longd = img_;
  longd.push_back(0);
  longd.push_back(0);
  expect_images_error(npy_bytes("|u1", {2, 3, 3}, longd), {"trailing bytes", "2 trailing"});
  expect_labels_error(npy_bytes("<i8", {3}, Bytes(20, 0)), {"truncated", "24 bytes", "has 20"});
  expect_images_error(npy_bytes("|u1", {1 << 20, 1 << 20, 1 << 20}, img_), {"absurd size", "2^34"});
  expect_images_error(npy_bytes("|u1", {2, 0, 3}, {}), {"zero dimension", "2x0x3"});
}

TEST_F(NpyRefusal, WrongNdimAndChannelsFirst) {
  expect_images_error(npy_bytes("|u1", {2, 9}, img_), {"wrong ndim", "2-D 2x9", "3-D"});
  expect_images_error(npy_bytes("|u1", {1, 3, 8, 8}, Bytes(192, 0)),
                      {"1x3x8x8", "channels-first", "transpose"});
  expect_labels_error(npy_bytes("|u1", {2, 1}, {0, 1}),
                      {"wrong ndim", "1-D", "2x1", "reshape(-1)"});
}

TEST_F(NpyRefusal, LabelsOutside0To65535NameIndexAndValue) {
  expect_labels_error(npy_bytes("<i2", {3}, label_data("<i2", {1, -1, 2})),
                      {"label -1 at index 1", "0..65535"});
  expect_labels_error(npy_bytes(">u4", {3}, label_data(">u4", {1, 2, 65536})),
                      {"label 65536 at index 2"});
  expect_labels_error(npy_bytes("<i8", {2}, label_data("<i8", {INT64_MIN, 0})),
                      {"label -9223372036854775808 at index 0"});
  expect_labels_error(npy_bytes("<u8", {2}, label_data("<u8", {3, -1})),
                      {"label 18446744073709551615 at index 1"});
  expect_labels_error(npy_bytes("|i1", {2}, label_data("|i1", {3, -128})),
                      {"label -128 at index 1"});
  // Every width sign-extends before it is named: a 4-byte -5 is -5, not 4294967291.
  expect_labels_error(npy_bytes(">i4", {3}, label_data(">i4", {0, 1, -5})),
                      {"label -5 at index 2"});
}

// Class numbers past a byte (ImageNet's 1,000 classes, up to 65,535) load as they are, in both
// byte orders, and the classes are the largest training label + 1.
TEST_F(DatasetTest, NpyLabelsPastAByteKeepTheirValue) {
  for (const std::string descr : {"<u2", ">i4", "<i8"}) {
    write_npy_set(2, 2, 0, {300, 0, 999, 65535}, {256, 1000}, descr);
    const dpt::DataSets d = load();
    EXPECT_EQ(d.train.labels, (Labels{300, 0, 999, 65535})) << descr;
    EXPECT_EQ(d.test.labels, (Labels{256, 1000})) << descr;
    EXPECT_EQ(d.train.num_classes, 65536) << descr;
  }
}

TEST_F(DatasetTest, NpyImageAndLabelCountsDisagree) {
  write_npy_set(2, 2, 0, {0, 1, 1}, {1});
  write_raw(file("train_labels.npy"), npy_bytes("|u1", {2}, {0, 1}));
  expect_load_error({"counts disagree", path("train_images.npy"), "3 images",
                     path("train_labels.npy"), "2 labels"});
}

// ---- --data synthetic:HxWxC:N:K ----------------------------------------------------------------

// The number of positions where two byte strings agree, over the shorter one's length.
template <typename T>
int64_t agreeing(const std::vector<T>& a, const std::vector<T>& b) {
  int64_t same = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) same += a[i] == b[i];
  return same;
}

// |count - n p| <= 5 sqrt(n p (1 - p)): a binomial count; a correct draw fails one in millions.
void expect_binomial(int64_t count, int64_t n, double p, const std::string& what) {
  const double mean = static_cast<double>(n) * p, sd = std::sqrt(mean * (1 - p));
  EXPECT_LE(std::fabs(static_cast<double>(count) - mean), 5 * sd)
      << what << ": " << count << " of " << n << ", expected about " << mean;
}

// The shape and counts the spec names (N training images, ceil(N / 10) test images, K classes),
// labels in 0..K-1 and every class drawn about N/K times, and data_size's bytes being what the
// two sets hold (images and 16-bit labels).
TEST(SyntheticData, ShapeCountsAndLabelsAreTheSpecs) {
  for (const auto& [n, test_n] :
       std::vector<std::pair<int64_t, int64_t>>{{95, 10}, {90, 9}, {1, 1}}) {
    const std::string spec = "synthetic:5x3x2:" + std::to_string(n) + ":7";
    SCOPED_TRACE(spec);
    const dpt::DataSets d = dpt::load_data(spec, "auto", 42);
    EXPECT_EQ(d.format, "synthetic");
    EXPECT_EQ(d.train.n, n);
    EXPECT_EQ(d.test.n, test_n);
    for (const dpt::ImageSet* s : {&d.train, &d.test}) {
      EXPECT_EQ(s->rows, 5);
      EXPECT_EQ(s->cols, 3);
      EXPECT_EQ(s->channels, 2);
      EXPECT_EQ(s->num_classes, 7);
      EXPECT_EQ(static_cast<int64_t>(s->images.size()), s->n * 30);
      ASSERT_EQ(static_cast<int64_t>(s->labels.size()), s->n);
      for (dpt::Label l : s->labels) ASSERT_LT(l, 7);
    }
    EXPECT_EQ(dpt::data_size(spec, "auto").bytes,
              static_cast<uint64_t>(n + test_n) * (30 + sizeof(dpt::Label)));
  }
  // Uniform over the classes: each of K = 7 about N/7 times, the last one included.
  const dpt::DataSets d = dpt::load_data("synthetic:1x1x1:70000:7", "auto", 3);
  std::vector<int64_t> counts(7);
  for (dpt::Label l : d.train.labels) ++counts[l];
  for (int k = 0; k < 7; ++k)
    expect_binomial(counts[k], 70000, 1.0 / 7, "class " + std::to_string(k));
}

// The seed draws the sets: the same seed the same images and labels, another seed others; the
// training and test sets are two different draws (not one the other's beginning), and one seed's
// test set is not another seed's training set. Random bytes agree by chance 1/256 of the time,
// labels of K classes 1/K of the time: a draw that ignored the seed or the split agrees everywhere.
TEST(SyntheticData, TheSeedDrawsTheSetsAndTheSplitsDiffer) {
  const std::string spec = "synthetic:8x8x3:500:5";
  const dpt::DataSets a = dpt::load_data(spec, "auto", 42), b = dpt::load_data(spec, "auto", 42);
  EXPECT_EQ(a.train.images, b.train.images);
  EXPECT_EQ(a.train.labels, b.train.labels);
  EXPECT_EQ(a.test.images, b.test.images);
  EXPECT_EQ(a.test.labels, b.test.labels);
  const auto bytes = static_cast<int64_t>(a.train.images.size());
  const auto test_bytes = static_cast<int64_t>(a.test.images.size());
  // 42 + 2^62: the seed was once mixed as seed * 4 + split, which drew the same sets for it.
  for (const uint64_t other : {43ull, 41ull, 0ull, 42ull + (1ull << 62)}) {
    SCOPED_TRACE("seed " + std::to_string(other));
    const dpt::DataSets c = dpt::load_data(spec, "auto", other);
    expect_binomial(agreeing(a.train.images, c.train.images), bytes, 1.0 / 256, "train bytes");
    expect_binomial(agreeing(a.train.labels, c.train.labels), 500, 1.0 / 5, "train labels");
    expect_binomial(agreeing(a.test.images, c.test.images), test_bytes, 1.0 / 256, "test bytes");
    // Across seeds and splits: seed 42's test set against the other seed's training set.
    expect_binomial(agreeing(a.test.images, c.train.images), test_bytes, 1.0 / 256,
                    "seed 42's test bytes against this seed's training bytes");
  }
  expect_binomial(agreeing(a.test.images, a.train.images), test_bytes, 1.0 / 256,
                  "test bytes against the training set's first");
  expect_binomial(agreeing(a.test.labels, a.train.labels), a.test.n, 1.0 / 5,
                  "test labels against the training set's first");
  // The bytes themselves are uniform: each of the 256 values about bytes / 256 times.
  std::vector<int64_t> values(256);
  for (uint8_t v : a.train.images) ++values[v];
  for (int v = 0; v < 256; ++v)
    expect_binomial(values[v], bytes, 1.0 / 256, "byte " + std::to_string(v));
}

// ---- the synthetic writer ---------------------------------------------------------------------

// tests/data/make_data.py, found from this source file's path (meson passes it relative to the
// build directory, which is the parent of tests/ where this binary lives), or "" if absent.
std::string make_data_script() {
  std::vector<fs::path> roots;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) roots.push_back(exe.parent_path().parent_path());
  roots.push_back(fs::current_path(ec));
  const fs::path self = __FILE__;
  for (const fs::path& root : roots) {
    const fs::path candidate =
        (self.is_absolute() ? self : root / self).parent_path().parent_path() / "data" /
        "make_data.py";
    if (fs::exists(candidate, ec)) return candidate.lexically_normal().string();
  }
  return {};
}

// `path` in single quotes for the shell (built by appending: GCC 12 warns falsely on "'" + s).
std::string quoted(const std::string& path) {
  std::string q = "'";
  q += path;
  q += "'";
  return q;
}

// Runs make_data.py on directory `dir` with `args`; its exit status.
int run_make_data(const std::string& dir, const std::string& args) {
  std::string cmd = "python3 ";
  cmd += quoted(make_data_script());
  cmd += ' ';
  cmd += quoted(dir);
  cmd += ' ';
  cmd += args;
  cmd += " 2>&1";
  return std::system(cmd.c_str());
}

class MakeData : public DatasetTest {
 protected:
  void SetUp() override {
    DatasetTest::SetUp();
    if (make_data_script().empty()) GTEST_SKIP() << "tests/data/make_data.py not found";
    if (std::system("python3 -c pass >/dev/null 2>&1") != 0)
      GTEST_SKIP() << "python3 not installed";
  }
  fs::path sub(const std::string& name) const { return dir_ / name; }
};

TEST_F(MakeData, EveryFormatLoadsWithItsShapeAndClasses) {
  struct Case {
    std::string name, args, format;
    int64_t rows, cols, channels;
    int classes;
  };
  const std::vector<Case> cases = {
      {"idx3", "--format idx --rows 6 --cols 5 --channels 1 --classes 7", "idx", 6, 5, 1, 7},
      {"idx3gz", "--format idx --gzip --rows 4 --cols 4 --classes 3", "idx", 4, 4, 1, 3},
      {"idx4", "--format idx --gzip --rows 5 --cols 3 --channels 3 --classes 4", "idx", 5, 3, 3, 4},
      {"cifar10", "--format cifar10 --classes 10", "cifar10", 32, 32, 3, 10},
      {"cifar10few", "--format cifar10 --classes 4", "cifar10", 32, 32, 3, 10},
      {"cifar100", "--format cifar100 --train 120", "cifar100", 32, 32, 3, 100},
      {"npy3", "--format npy --rows 3 --cols 7 --classes 5 --label-dtype '>i8'", "npy", 3, 7, 1, 5},
      {"npy4d", "--format npy --rows 3 --cols 7 --classes 5 --npy-4d", "npy", 3, 7, 1, 5},
      {"npyrgb", "--format npy --rows 8 --cols 6 --channels 3 --classes 2 --label-dtype '<u2'",
       "npy", 8, 6, 3, 2},
  };
  for (const Case& c : cases) {
    const std::string d = sub(c.name).string();
    const std::string train = c.name == "cifar100" ? "" : "--train 40 ";
    ASSERT_EQ(run_make_data(d, train + "--test 9 --seed 4 " + c.args), 0) << c.name;
    const dpt::DataSets ds = dpt::load_data(d, "auto");
    EXPECT_EQ(ds.format, c.format) << c.name;
    for (const dpt::ImageSet* s : {&ds.train, &ds.test}) {
      EXPECT_EQ(s->rows, c.rows) << c.name;
      EXPECT_EQ(s->cols, c.cols) << c.name;
      EXPECT_EQ(s->channels, c.channels) << c.name;
      EXPECT_EQ(s->num_classes, c.classes) << c.name;
    }
    EXPECT_EQ(ds.train.n, c.name == "cifar100" ? 120 : 40) << c.name;
    EXPECT_EQ(ds.test.n, 9) << c.name;
    // data_size, from the headers alone, says what load_data holds: images and labels at the
    // files' element size (CIFAR-100 keeps 2 label bytes a record in its file).
    const uint64_t label_size = c.args.find("i8'") != std::string::npos ? 8
                                : c.args.find("u2'") != std::string::npos || c.name == "cifar100"
                                    ? 2
                                    : 1;
    const dpt::DataSize size = dpt::data_size(d, "auto");
    EXPECT_EQ(size.bytes, ds.train.images.size() + ds.test.images.size() +
                              label_size * (ds.train.labels.size() + ds.test.labels.size()))
        << c.name;
    EXPECT_FALSE(size.largest_file.empty()) << c.name;
    EXPECT_GT(size.largest_bytes, 0u) << c.name;
    // And, before any image is read, their shape, the test count and the classes a format fixes
    // (what the batch's memory is checked with: preflight).
    EXPECT_EQ(size.image_shape, (std::vector<int64_t>{c.rows, c.cols, c.channels})) << c.name;
    EXPECT_EQ(size.test_n, ds.test.n) << c.name;
    EXPECT_EQ(size.classes, c.format == "cifar10"    ? 10
                            : c.format == "cifar100" ? 100
                                                     : 0)
        << c.name;
    // Every class of the writer is in the training set.
    const int written = c.name == "cifar10"      ? 10
                        : c.name == "cifar10few" ? 4
                        : c.name == "cifar100"   ? 100
                                                 : c.classes;
    std::vector<int> seen(256, 0);
    for (dpt::Label l : ds.train.labels) seen[l] = 1;
    for (int k = 0; k < written; ++k)
      EXPECT_TRUE(seen[static_cast<size_t>(k)]) << c.name << " class " << k;
  }
}

TEST_F(MakeData, DeterministicFromTheSeed) {
  const std::string args =
      " --format npy --train 20 --test 5 --rows 4 --cols 4 --classes 3 --learnable";
  ASSERT_EQ(run_make_data(sub("a").string(), "--seed 1" + args), 0);
  ASSERT_EQ(run_make_data(sub("b").string(), "--seed 1" + args), 0);
  ASSERT_EQ(run_make_data(sub("c").string(), "--seed 2" + args), 0);
  for (const char* f :
       {"train_images.npy", "train_labels.npy", "test_images.npy", "test_labels.npy"})
    EXPECT_EQ(read_all(sub("a") / f), read_all(sub("b") / f)) << f;
  EXPECT_NE(read_all(sub("a") / "train_images.npy"), read_all(sub("c") / "train_images.npy"));
  // The gzip'd idx files carry no time stamp: byte-identical too.
  ASSERT_EQ(run_make_data(sub("g1").string(), "--format idx --gzip --train 10 --test 2 --seed 5"),
            0);
  ASSERT_EQ(run_make_data(sub("g2").string(), "--format idx --gzip --train 10 --test 2 --seed 5"),
            0);
  EXPECT_EQ(read_all(sub("g1") / "train-images-idx3-ubyte.gz"),
            read_all(sub("g2") / "train-images-idx3-ubyte.gz"));
}

TEST_F(MakeData, RefusesImpossibleRequests) {
  EXPECT_NE(run_make_data(sub("x").string(), "--format cifar10 --rows 28 --cols 28 --channels 1"),
            0);
  EXPECT_NE(run_make_data(sub("x").string(), "--format cifar10 --classes 11"), 0);
  EXPECT_NE(run_make_data(sub("x").string(), "--format npy --train 3 --classes 5"), 0);
  EXPECT_NE(run_make_data(sub("x").string(), "--format npy --gzip"), 0);
}

// Nearest class mean of the per-channel image means and the stripe period, fitted on the training
// set and scored on the test set, after a random +-4 px shift (zero padding) and a horizontal flip:
// a cheap stand-in for "a small CNN learns it" that also checks the cues survive augmentation.
double nearest_mean_accuracy(const dpt::DataSets& d, uint64_t seed) {
  const int64_t h = d.train.rows, w = d.train.cols, c = d.train.channels;
  auto features = [&](const dpt::ImageSet& s, int64_t i, bool augment, uint64_t& rng) {
    auto next = [&] { return (rng = rng * 6364136223846793005ULL + 1442695040888963407ULL) >> 33; };
    const int64_t dy = augment ? static_cast<int64_t>(next() % 9) - 4 : 0;
    const int64_t dx = augment ? static_cast<int64_t>(next() % 9) - 4 : 0;
    const bool flip = augment && (next() & 1);
    std::vector<double> img(static_cast<size_t>(h * w * c), 0.0);
    for (int64_t y = 0; y < h; ++y)
      for (int64_t x = 0; x < w; ++x) {
        const int64_t sy = y + dy, sx0 = x + dx;
        if (sy < 0 || sy >= h || sx0 < 0 || sx0 >= w) continue;  // zero padding
        const int64_t sx = flip ? w - 1 - sx0 : sx0;
        for (int64_t ch = 0; ch < c; ++ch)
          img[static_cast<size_t>((y * w + x) * c + ch)] =
              s.images[static_cast<size_t>(((i * h + sy) * w + sx) * c + ch)];
      }
    // Per-channel means over the central region (away from padding), and the row profile's
    // autocorrelation at lags 2..7 (the stripe period).
    std::vector<double> f;
    std::vector<double> rowmean(static_cast<size_t>(h), 0.0);
    for (int64_t ch = 0; ch < c; ++ch) {
      double sum = 0;
      int64_t cnt = 0;
      for (int64_t y = 4; y < h - 4; ++y)
        for (int64_t x = 4; x < w - 4; ++x, ++cnt)
          sum += img[static_cast<size_t>((y * w + x) * c + ch)];
      f.push_back(sum / static_cast<double>(cnt) / 255.0);
    }
    for (int64_t y = 4; y < h - 4; ++y) {
      for (int64_t x = 4; x < w - 4; ++x)
        for (int64_t ch = 0; ch < c; ++ch)
          rowmean[static_cast<size_t>(y)] += img[static_cast<size_t>((y * w + x) * c + ch)];
    }
    double mean = 0;
    for (int64_t y = 4; y < h - 4; ++y) mean += rowmean[static_cast<size_t>(y)];
    mean /= static_cast<double>(h - 8);
    double var = 1e-9;
    for (int64_t y = 4; y < h - 4; ++y) var += std::pow(rowmean[static_cast<size_t>(y)] - mean, 2);
    for (int64_t lag = 2; lag <= 7; ++lag) {
      double ac = 0;
      for (int64_t y = 4; y + lag < h - 4; ++y)
        ac += (rowmean[static_cast<size_t>(y)] - mean) *
              (rowmean[static_cast<size_t>(y + lag)] - mean);
      f.push_back(ac / var);
    }
    return f;
  };
  const int k = d.train.num_classes;
  std::vector<std::vector<double>> centroid(static_cast<size_t>(k));
  std::vector<int64_t> count(static_cast<size_t>(k), 0);
  uint64_t rng = seed;
  for (int64_t i = 0; i < d.train.n; ++i) {
    const auto f = features(d.train, i, false, rng);
    auto& m = centroid[d.train.labels[static_cast<size_t>(i)]];
    if (m.empty()) m.assign(f.size(), 0.0);
    for (size_t j = 0; j < f.size(); ++j) m[j] += f[j];
    ++count[d.train.labels[static_cast<size_t>(i)]];
  }
  for (int cl = 0; cl < k; ++cl)
    for (double& v : centroid[static_cast<size_t>(cl)])
      v /= static_cast<double>(count[static_cast<size_t>(cl)]);
  int64_t hits = 0;
  for (int64_t i = 0; i < d.test.n; ++i) {
    const auto f = features(d.test, i, true, rng);
    int best = -1;
    double best_d = 1e300;
    for (int cl = 0; cl < k; ++cl) {
      if (centroid[static_cast<size_t>(cl)].empty()) continue;
      double dist = 0;
      for (size_t j = 0; j < f.size(); ++j)
        dist += std::pow(f[j] - centroid[static_cast<size_t>(cl)][j], 2);
      if (dist < best_d) best_d = dist, best = cl;
    }
    hits += best == d.test.labels[static_cast<size_t>(i)];
  }
  return static_cast<double>(hits) / static_cast<double>(d.test.n);
}

TEST_F(MakeData, LearnableSetsAreSeparableUnderCropAndFlip) {
  for (const std::string& args :
       {std::string("--format cifar10"), std::string("--format idx --classes 10"),
        std::string("--format npy --rows 32 --cols 32 --channels 3 --classes 10")}) {
    const std::string d = sub("learn").string();
    fs::remove_all(d);
    ASSERT_EQ(run_make_data(d, "--train 200 --test 200 --seed 9 --learnable " + args), 0) << args;
    const double acc = nearest_mean_accuracy(dpt::load_data(d, "auto"), 42);
    std::cout << "[          ] " << args << ": nearest class mean " << acc << " (chance 0.1)\n";
    EXPECT_GT(acc, 0.6) << args;
  }
  // Without --learnable the same measure is at chance.
  const std::string d = sub("random").string();
  ASSERT_EQ(run_make_data(d, "--format idx --train 200 --test 200 --seed 9"), 0);
  EXPECT_LT(nearest_mean_accuracy(dpt::load_data(d, "auto"), 42), 0.3);
}

// ---- the real dataset -------------------------------------------------------------------------

TEST(DatasetRealData, FashionMnistIsReadByteForByte) {
  const char* env = std::getenv("DPT_TEST_DATA");
  const std::string fallback = "/usr/share/datasets/fashion-mnist";
  const std::string dir = env != nullptr && fs::is_directory(env) ? env : fallback;
  if (!fs::is_directory(dir)) GTEST_SKIP() << dir << " does not exist";
  const dpt::DataSets d = dpt::load_data(dir, "auto");
  EXPECT_EQ(d.format, "idx");
  const std::map<std::string, const dpt::ImageSet*> splits = {{"train", &d.train},
                                                              {"t10k", &d.test}};
  for (const auto& [split, set] : splits) {
    const int64_t n = split == "train" ? 60000 : 10000;
    EXPECT_EQ(set->n, n);
    EXPECT_EQ(set->rows, 28);
    EXPECT_EQ(set->cols, 28);
    EXPECT_EQ(set->channels, 1);
    EXPECT_EQ(set->num_classes, 10);
    // zlib's own reader on the same files, past the 16- and 8-byte IDX headers.
    const Bytes images = gunzip(fs::path(dir) / (split + "-images-idx3-ubyte.gz"));
    const Bytes labels = gunzip(fs::path(dir) / (split + "-labels-idx1-ubyte.gz"));
    ASSERT_EQ(images.size(), static_cast<size_t>(16 + n * 784));
    ASSERT_EQ(labels.size(), static_cast<size_t>(8 + n));
    EXPECT_TRUE(set->images == Bytes(images.begin() + 16, images.end())) << split;
    EXPECT_TRUE(set->labels == Labels(labels.begin() + 8, labels.end())) << split;
  }
  // The statistics --normalize auto would use: Fashion-MNIST's well-known mean 0.2860, std 0.3530.
  const dpt::ChannelStats st = dpt::channel_stats(d.train);
  ASSERT_EQ(st.mean.size(), 1u);
  EXPECT_NEAR(st.mean[0], 0.2860, 5e-4);
  EXPECT_NEAR(st.std[0], 0.3530, 5e-4);
}

}  // namespace
