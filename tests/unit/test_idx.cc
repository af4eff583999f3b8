// Unit tests for the IDX reader and the idx format's split loader (src/data/readers.h): round trips
// of raw and gzip'd files (idx3 one channel, idx4 N x H x W x C), and one test per corruption, each
// checking the kInput error names the file and says what is wrong; also the CPU's plain uint8 ->
// float gather (src/cpu/gather.h) on what they read. load_data over every format is
// tests/unit/test_dataset.cc.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <numeric>
#include <string>
#include <vector>

#include "cpu/gather.h"
#include "data/readers.h"
#include "data_files.h"
#include "dpt/error.h"
#include "dpt/idx.h"

namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;
using Labels = std::vector<dpt::Label>;
using dpt::test::expect_input_error;
using dpt::test::idx_bytes;
using dpt::test::read_all;
using dpt::test::write_gz;
using dpt::test::write_raw;

Bytes iota_bytes(size_t n, uint8_t start = 0) {
  Bytes b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(start + i);
  return b;
}

// One split as the idx format reads it (its classes are load_data's to decide).
dpt::ImageSet load_split(const std::string& dir, const std::string& split) {
  return dpt::data::load_idx_split(dir, split).set;
}

// images_to_float over a whole loaded set.
void images_to_float(const dpt::ImageSet& set, const int64_t* indices, int64_t count, float* out) {
  dpt::cpu::images_to_float(set.images.data(), set.n, set.pixels(), indices, count, out);
}

void expect_read_error(const fs::path& path, const std::vector<std::string>& needles) {
  std::vector<std::string> all = needles;
  all.push_back(path.string());
  expect_input_error([&] { dpt::read_idx(path.string()); }, all);
}

class IdxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("dpt_test_idx_" + std::to_string(getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path file(const std::string& name) const { return dir_ / name; }

  // A good tiny set: 5 images of 2x3 with pixel values 7*i + p, labels 0..4.
  void write_tiny_set(const std::string& split, bool gz, int n_labels = 5,
                      const Bytes& labels = {3, 0, 4, 1, 2}) {
    Bytes pixels(5 * 6);
    for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(7 * i + 1);
    const Bytes img = idx_bytes(0x08, {5, 2, 3}, pixels);
    const Bytes lbl = idx_bytes(0x08, {static_cast<uint32_t>(n_labels)},
                                Bytes(labels.begin(), labels.begin() + n_labels));
    const std::string ext = gz ? ".gz" : "";
    auto write = gz ? write_gz : write_raw;
    write(file(split + "-images-idx3-ubyte" + ext), img);
    write(file(split + "-labels-idx1-ubyte" + ext), lbl);
  }

  fs::path dir_;
};

// ---- good files -------------------------------------------------------------------------------

TEST_F(IdxTest, Reads3DRawAndGzip) {
  const Bytes data = iota_bytes(4 * 2 * 3, 100);
  const Bytes bytes = idx_bytes(0x08, {4, 2, 3}, data);
  write_raw(file("a.idx"), bytes);
  write_gz(file("a.idx.gz"), bytes);
  for (const char* name : {"a.idx", "a.idx.gz"}) {
    const dpt::IdxArray arr = dpt::read_idx(file(name).string());
    EXPECT_EQ(arr.dims, (std::vector<int64_t>{4, 2, 3})) << name;
    EXPECT_EQ(arr.data, data) << name;
  }
}

TEST_F(IdxTest, Reads1DRawAndGzip) {
  const Bytes data = {9, 8, 7, 0, 255, 1, 2};
  const Bytes bytes = idx_bytes(0x08, {7}, data);
  write_raw(file("l"), bytes);
  write_gz(file("l.gz"), bytes);
  for (const char* name : {"l", "l.gz"}) {
    const dpt::IdxArray arr = dpt::read_idx(file(name).string());
    EXPECT_EQ(arr.dims, (std::vector<int64_t>{7})) << name;
    EXPECT_EQ(arr.data, data) << name;
  }
}

TEST_F(IdxTest, Reads4DAndLargeDims) {
  // Dims above 2^16 exercise all four big-endian bytes.
  const Bytes data = iota_bytes(70000);
  write_gz(file("big.gz"), idx_bytes(0x08, {70000, 1, 1, 1}, data));
  const dpt::IdxArray arr = dpt::read_idx(file("big.gz").string());
  EXPECT_EQ(arr.dims, (std::vector<int64_t>{70000, 1, 1, 1}));
  EXPECT_EQ(arr.data, data);
}

TEST_F(IdxTest, DetectsGzipByContentNotName) {
  const Bytes data = iota_bytes(12);
  const Bytes bytes = idx_bytes(0x08, {3, 4}, data);
  write_gz(file("looks-raw"), bytes);
  write_raw(file("looks-gzipped.gz"), bytes);
  EXPECT_EQ(dpt::read_idx(file("looks-raw").string()).data, data);
  EXPECT_EQ(dpt::read_idx(file("looks-gzipped.gz").string()).data, data);
}

TEST_F(IdxTest, ReadsConcatenatedGzipMembers) {
  // `cat a.gz b.gz` is a valid gzip file; gzip(1) and zlib's gzread read it as one stream.
  const Bytes bytes = idx_bytes(0x08, {2, 5}, iota_bytes(10));
  const Bytes first(bytes.begin(), bytes.begin() + 9), second(bytes.begin() + 9, bytes.end());
  write_gz(file("p1"), first);
  write_gz(file("p2"), second);
  Bytes cat = read_all(file("p1"));
  const Bytes b2 = read_all(file("p2"));
  cat.insert(cat.end(), b2.begin(), b2.end());
  write_raw(file("cat.gz"), cat);
  const dpt::IdxArray arr = dpt::read_idx(file("cat.gz").string());
  EXPECT_EQ(arr.dims, (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(arr.data, iota_bytes(10));
}

TEST_F(IdxTest, LoadsTinyImageSet) {
  for (bool gz : {false, true}) {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    write_tiny_set("train", gz);
    const dpt::data::LoadedSplit loaded = dpt::data::load_idx_split(dir_.string(), "train");
    const std::string ext = gz ? ".gz" : "";
    EXPECT_EQ(loaded.images_file, file("train-images-idx3-ubyte" + ext).string());
    EXPECT_EQ(loaded.labels_file, file("train-labels-idx1-ubyte" + ext).string());
    const dpt::ImageSet& set = loaded.set;
    EXPECT_EQ(set.n, 5);
    EXPECT_EQ(set.rows, 2);
    EXPECT_EQ(set.cols, 3);
    EXPECT_EQ(set.channels, 1);
    EXPECT_EQ(set.pixels(), 6);
    ASSERT_EQ(set.images.size(), 30u);
    for (size_t i = 0; i < 30; ++i) EXPECT_EQ(set.images[i], static_cast<uint8_t>(7 * i + 1));
    EXPECT_EQ(set.labels, (Labels{3, 0, 4, 1, 2}));
  }
}

TEST_F(IdxTest, LoadsIdx4ImageSetChannelsLast) {
  // 2 images of 2 x 3 pixels x 4 channels: the bytes stay in file order, [n][y][x][c].
  const Bytes pixels = iota_bytes(2 * 2 * 3 * 4, 10);
  write_gz(file("train-images-idx4-ubyte.gz"), idx_bytes(0x08, {2, 2, 3, 4}, pixels));
  write_raw(file("train-labels-idx1-ubyte"), idx_bytes(0x08, {2}, {1, 0}));
  const dpt::ImageSet set = load_split(dir_.string(), "train");
  EXPECT_EQ(set.n, 2);
  EXPECT_EQ(set.rows, 2);
  EXPECT_EQ(set.cols, 3);
  EXPECT_EQ(set.channels, 4);
  EXPECT_EQ(set.pixels(), 24);
  EXPECT_EQ(set.images, pixels);
  EXPECT_EQ(set.labels, (Labels{1, 0}));
  // images_to_float gathers whole H x W x C images.
  const int64_t index = 1;
  std::vector<float> out(24);
  images_to_float(set, &index, 1, out.data());
  for (size_t p = 0; p < 24; ++p) EXPECT_EQ(out[p], pixels[24 + p] / 255.f) << p;
}

TEST_F(IdxTest, LoadRefusesIdx3AndIdx4Together) {
  write_tiny_set("train", false);
  write_raw(file("train-images-idx4-ubyte"), idx_bytes(0x08, {5, 2, 3, 1}, iota_bytes(30)));
  expect_input_error(
      [&] { load_split(dir_.string(), "train"); },
      {dir_.string(), "train-images-idx3-ubyte", "train-images-idx4-ubyte", "Remove one"});
}

TEST_F(IdxTest, LoadRefusesRawAndGzipTogether) {
  // Both copies of one file, with different contents: neither is chosen silently, for the images
  // and for the labels alike.
  write_tiny_set("t10k", /*gz=*/true);
  write_raw(file("t10k-images-idx3-ubyte"), idx_bytes(0x08, {1, 1, 1}, {0}));
  expect_input_error(
      [&] { load_split(dir_.string(), "t10k"); },
      {dir_.string(), "t10k-images-idx3-ubyte.gz and t10k-images-idx3-ubyte exist", "Remove one"});
  fs::remove(file("t10k-images-idx3-ubyte"));
  write_raw(file("t10k-labels-idx1-ubyte"), idx_bytes(0x08, {1}, {9}));
  expect_input_error(
      [&] { load_split(dir_.string(), "t10k"); },
      {dir_.string(), "t10k-labels-idx1-ubyte.gz and t10k-labels-idx1-ubyte exist", "Remove one"});
  // Either copy alone loads (the gzip'd set as written).
  fs::remove(file("t10k-labels-idx1-ubyte"));
  const dpt::ImageSet set = load_split(dir_.string(), "t10k");
  EXPECT_EQ(set.n, 5);
  EXPECT_EQ(set.labels, (Labels{3, 0, 4, 1, 2}));
}

TEST_F(IdxTest, ImagesToFloatGathersByIndex) {
  write_tiny_set("train", true);
  const dpt::ImageSet set = load_split(dir_.string(), "train");
  const std::vector<int64_t> indices = {3, 0, 4, 1, 2, 3};
  std::vector<float> out(indices.size() * 6, -1.f);
  images_to_float(set, indices.data(), static_cast<int64_t>(indices.size()), out.data());
  for (size_t i = 0; i < indices.size(); ++i) {
    for (size_t p = 0; p < 6; ++p) {
      const uint8_t x = set.images[indices[i] * 6 + p];
      EXPECT_EQ(out[i * 6 + p], static_cast<float>(x) / 255.f) << "i=" << i << " p=" << p;
    }
  }
}

TEST_F(IdxTest, ImagesToFloatIsExactForEveryByte) {
  dpt::ImageSet set;
  set.n = 1;
  set.rows = 16;
  set.cols = 16;
  set.images = iota_bytes(256);
  set.labels = {0};
  std::vector<float> out(256);
  const int64_t index = 0;
  images_to_float(set, &index, 1, out.data());
  for (int x = 0; x < 256; ++x) EXPECT_EQ(out[x], static_cast<float>(x) / 255.f) << x;
  EXPECT_EQ(out[0], 0.f);
  EXPECT_EQ(out[255], 1.f);
}

// ---- corrupt files ----------------------------------------------------------------------------

TEST_F(IdxTest, TruncatedData) {
  const Bytes bytes = idx_bytes(0x08, {4, 2, 3}, iota_bytes(23));  // one byte short
  write_raw(file("short"), bytes);
  write_gz(file("short.gz"), bytes);
  expect_read_error(file("short"), {"truncated", "4x2x3 = 24 bytes", "file has 23"});
  expect_read_error(file("short.gz"), {"truncated", "4x2x3 = 24 bytes", "has 23"});
}

TEST_F(IdxTest, TruncatedHeaderAndEmptyFile) {
  Bytes bytes = idx_bytes(0x08, {4, 2, 3}, {});
  bytes.resize(9);  // ends inside the dims
  write_raw(file("head"), bytes);
  expect_read_error(file("head"), {"truncated"});
  write_raw(file("empty"), {});
  expect_read_error(file("empty"), {"truncated", "0 bytes"});
  write_gz(file("empty.gz"), {});
  expect_read_error(file("empty.gz"), {"truncated", "0 bytes"});
}

TEST_F(IdxTest, TrailingBytes) {
  const Bytes bytes = idx_bytes(0x08, {4, 2, 3}, iota_bytes(27));  // three bytes too many
  write_raw(file("long"), bytes);
  write_gz(file("long.gz"), bytes);
  for (const char* name : {"long", "long.gz"}) {
    expect_read_error(file(name), {"trailing", "24 bytes", "3 trailing"});
  }
}

TEST_F(IdxTest, WrongMagic) {
  Bytes bytes = idx_bytes(0x08, {2}, {1, 2});
  bytes[1] = 0x01;
  write_raw(file("magic"), bytes);
  write_gz(file("magic.gz"), bytes);
  expect_read_error(file("magic"), {"magic", "0x01"});
  expect_read_error(file("magic.gz"), {"magic"});
}

TEST_F(IdxTest, WrongDtypeCode) {
  // A float32 IDX file (code 0x0D) with 2 floats: a valid file, but not of bytes.
  write_raw(file("float"), idx_bytes(0x0D, {2}, Bytes(8, 0)));
  write_gz(file("float.gz"), idx_bytes(0x0D, {2}, Bytes(8, 0)));
  for (const char* name : {"float", "float.gz"}) {
    expect_read_error(file(name), {"dtype", "0x0D", "float32"});
  }
}

TEST_F(IdxTest, BadNdim) {
  write_raw(file("ndim0"), idx_bytes(0x08, {}, {1}));
  write_raw(file("ndim5"), idx_bytes(0x08, {1, 1, 1, 1, 1}, {1}));
  expect_read_error(file("ndim0"), {"ndim 0"});
  expect_read_error(file("ndim5"), {"ndim 5"});
}

TEST_F(IdxTest, ZeroDim) {
  write_raw(file("zero"), idx_bytes(0x08, {3, 0, 2}, {}));
  expect_read_error(file("zero"), {"zero dimension", "3x0x2"});
}

TEST_F(IdxTest, AbsurdSizeRefusedBeforeAllocating) {
  // 2^32-1 cubed overflows int64 arithmetic if done naively; 2^17 * 2^18 = 2^35 > 2^34.
  write_raw(file("huge"), idx_bytes(0x08, {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu}, {1, 2}));
  write_raw(file("big"), idx_bytes(0x08, {1u << 17, 1u << 18}, {1, 2}));
  expect_read_error(file("huge"), {"absurd"});
  expect_read_error(file("big"), {"absurd", "131072x262144"});
  // Under the cap but far more than a small gzip file can hold: truncated, without a 4 GiB buffer.
  write_gz(file("lying.gz"), idx_bytes(0x08, {1u << 16, 1u << 16}, {1, 2, 3}));
  expect_read_error(file("lying.gz"), {"truncated", "65536x65536"});
}

TEST_F(IdxTest, GarbageThatIsNeitherGzipNorIdx) {
  const std::string text = "this is not a dataset, just some text\n";
  write_raw(file("garbage"), Bytes(text.begin(), text.end()));
  expect_read_error(file("garbage"), {"magic"});
}

TEST_F(IdxTest, TruncatedGzipStream) {
  write_gz(file("good.gz"), idx_bytes(0x08, {50, 10, 10}, iota_bytes(5000)));
  const Bytes gz = read_all(file("good.gz"));
  ASSERT_GT(gz.size(), 30u);
  // Cut in the middle of the deflate data, and cut only the 8-byte trailer (all data present).
  write_raw(file("half.gz"), Bytes(gz.begin(), gz.begin() + gz.size() / 2));
  write_raw(file("notrailer.gz"), Bytes(gz.begin(), gz.end() - 8));
  write_raw(file("magiconly.gz"), Bytes{0x1f, 0x8b});
  for (const char* name : {"half.gz", "notrailer.gz", "magiconly.gz"}) {
    expect_read_error(file(name), {"truncated gzip"});
  }
}

TEST_F(IdxTest, CorruptedGzipStream) {
  write_gz(file("good.gz"), idx_bytes(0x08, {50, 10, 10}, iota_bytes(5000)));
  Bytes gz = read_all(file("good.gz"));
  Bytes bad_crc = gz;
  bad_crc[bad_crc.size() - 8] ^= 0xFF;  // first byte of the CRC-32 in the trailer
  write_raw(file("crc.gz"), bad_crc);
  expect_read_error(file("crc.gz"), {"corrupted gzip"});
  Bytes bad_method = gz;
  bad_method[2] = 0x07;  // compression method must be 8 (deflate)
  write_raw(file("method.gz"), bad_method);
  expect_read_error(file("method.gz"), {"corrupted gzip"});
  Bytes junk_after = gz;
  junk_after.push_back('x');
  junk_after.push_back('y');
  write_raw(file("junk.gz"), junk_after);
  expect_read_error(file("junk.gz"), {"corrupted gzip", "2 trailing bytes"});
}

TEST_F(IdxTest, MissingFileAndDirectory) {
  expect_read_error(file("nope"), {"no such file"});
  expect_read_error(dir_, {"directory"});
}

TEST_F(IdxTest, LoadMissingFiles) {
  expect_input_error([&] { load_split(dir_.string(), "train"); },
                     {dir_.string(), "train-images-idx3-ubyte.gz", "train-images-idx3-ubyte",
                      "train-images-idx4-ubyte.gz", "train-images-idx4-ubyte"});
  write_tiny_set("train", true);
  fs::remove(file("train-labels-idx1-ubyte.gz"));
  expect_input_error([&] { load_split(dir_.string(), "train"); },
                     {dir_.string(), "train-labels-idx1-ubyte.gz", "tried"});
  const std::string gone = (dir_ / "absent").string();
  expect_input_error([&] { load_split(gone, "t10k"); },
                     {gone, "t10k-images-idx3-ubyte", "does not exist"});
}

TEST_F(IdxTest, LoadCountsDisagree) {
  write_tiny_set("train", false, /*n_labels=*/4);
  expect_input_error(
      [&] { load_split(dir_.string(), "train"); },
      {"disagree", "train-images-idx3-ubyte", "train-labels-idx1-ubyte", "5 images", "4 labels"});
}

TEST_F(IdxTest, LoadWrongRank) {
  write_tiny_set("train", false);
  write_raw(file("train-images-idx3-ubyte"), idx_bytes(0x08, {5, 6}, iota_bytes(30)));
  expect_input_error([&] { load_split(dir_.string(), "train"); },
                     {"train-images-idx3-ubyte", "3-D", "4-D", "5x6"});
  write_tiny_set("train", false);
  write_raw(file("train-labels-idx1-ubyte"), idx_bytes(0x08, {5, 1}, iota_bytes(5)));
  expect_input_error([&] { load_split(dir_.string(), "train"); },
                     {"train-labels-idx1-ubyte", "1-D", "5x1"});
}

// ---- the real dataset -------------------------------------------------------------------------

TEST(IdxRealData, FashionMnistIsBalanced) {
  const char* env = std::getenv("DPT_TEST_DATA");
  const std::string fallback = "/usr/share/datasets/fashion-mnist";
  if (env == nullptr) GTEST_SKIP() << "DPT_TEST_DATA not set";
  // DPT_TEST_DATA may name the dataset directory itself or just switch the test on.
  const std::string dir = fs::is_directory(env) ? env : fallback;
  if (!fs::is_directory(dir)) GTEST_SKIP() << dir << " does not exist";
  for (const auto& [split, n] :
       {std::pair<std::string, int64_t>{"train", 60000}, {"t10k", 10000}}) {
    const auto start = std::chrono::steady_clock::now();
    const dpt::ImageSet set = load_split(dir, split);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cout << "[          ] loaded " << split << " (" << set.n << " images) in " << secs
              << " s\n";
    EXPECT_EQ(set.n, n);
    EXPECT_EQ(set.rows, 28);
    EXPECT_EQ(set.cols, 28);
    ASSERT_EQ(set.images.size(), static_cast<size_t>(n * 28 * 28));
    ASSERT_EQ(set.labels.size(), static_cast<size_t>(n));
    std::array<int64_t, 10> counts{};
    for (dpt::Label l : set.labels) ++counts[l];
    for (int c = 0; c < 10; ++c) EXPECT_EQ(counts[c], n / 10) << split << " class " << c;
    // Images are not blank: some pixel of the first image is set, and the floats stay in [0, 1].
    std::vector<float> out(28 * 28);
    const int64_t first = 0;
    images_to_float(set, &first, 1, out.data());
    float mx = 0.f;
    for (float v : out) {
      EXPECT_GE(v, 0.f);
      EXPECT_LE(v, 1.f);
      mx = std::max(mx, v);
    }
    EXPECT_GT(mx, 0.f);
  }
}

}  // namespace
