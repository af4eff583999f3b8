// Tests for dpt/safetensors.h: bit-exact round trips, the on-disk layout and atomic replace, one
// kInput error per kind of hostile file, and (when torch is importable) a cross-check with Python.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dpt/error.h"
#include "dpt/safetensors.h"

namespace fs = std::filesystem;

namespace dpt {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  std::memcpy(s.data(), &n, 8);
  return s;
}

// A raw file image: length field, header text as given (no padding), then `data_bytes` bytes.
std::string image(const std::string& header, size_t data_bytes) {
  return le64(header.size()) + header + std::string(data_bytes, '\x5a');
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dpt_st_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  std::vector<std::string> dir_entries() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }

  // Writes `bytes` to a file and expects read_safetensors to fail with kInput, naming the file and
  // containing `what`. Also runs the in-memory parser on the same bytes with another origin.
  void expect_hostile(const std::string& name, const std::string& bytes, const std::string& what) {
    const std::string p = path(name);
    spit(p, bytes);
    try {
      read_safetensors(p);
      ADD_FAILURE() << name << ": expected an error containing '" << what << "'";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(e.kind(), ErrorKind::kInput) << msg;
      EXPECT_NE(msg.find(p), std::string::npos) << "message does not name the file: " << msg;
      EXPECT_NE(msg.find(what), std::string::npos) << "expected '" << what << "' in: " << msg;
    }
    try {
      parse_safetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "<buf>");
      ADD_FAILURE() << name << ": the in-memory parser accepted it";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInput);
      EXPECT_NE(std::string(e.what()).find("<buf>"), std::string::npos) << e.what();
    }
  }

  std::string dir_;
};

// Tensors of several dtypes, including a scalar and an empty one; data is not a multiple of 8.
std::vector<StTensor> sample_tensors() {
  const float w[6] = {1.5f,   -0.0f,  3.4028235e38f,
                      1e-45f, -7.25f, std::numeric_limits<float>::infinity()};
  const int64_t idx[4] = {0, -1, std::numeric_limits<int64_t>::max(),
                          std::numeric_limits<int64_t>::min()};
  const float scalar = 0.125f;
  float nan = std::nanf("0x123");
  std::vector<StTensor> ts;
  ts.push_back(st_f32("layer1.weight", {2, 3}, w));
  ts.push_back(st_i64("step_idx", {4}, idx));
  ts.push_back(st_f32("scalar", {}, &scalar));
  ts.push_back(st_f32("empty", {0, 5}, nullptr));
  ts.push_back(st_f32("nan", {1}, &nan));
  ts.push_back(StTensor{"half", "BF16", {3}, {1, 2, 3, 4, 5, 6}});
  ts.push_back(StTensor{"bytes", "U8", {5}, {9, 8, 7, 6, 5}});
  return ts;
}

TEST_F(SafetensorsTest, RoundTripIsBitExact) {
  const auto ts = sample_tensors();
  const std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"step", "42"}, {"note", "caf\xc3\xa9 \"quoted\"\n"}};
  const std::string p = path("model.safetensors");
  write_safetensors(p, ts, meta);

  StFile f = read_safetensors(p);
  EXPECT_EQ(f.metadata, meta);
  ASSERT_EQ(f.tensors.size(), ts.size());
  for (const StTensor& want : ts) {
    const StTensor* got = f.find(want.name);
    ASSERT_NE(got, nullptr) << want.name;
    EXPECT_EQ(got->dtype, want.dtype) << want.name;
    EXPECT_EQ(got->shape, want.shape) << want.name;
    EXPECT_EQ(got->bytes, want.bytes) << want.name;
  }
  EXPECT_EQ(f.find("missing"), nullptr);
  // Non-empty tensors come back in the order they were laid out.
  std::vector<std::string> order;
  for (const StTensor& t : f.tensors)
    if (!t.bytes.empty()) order.push_back(t.name);
  EXPECT_EQ(order, (std::vector<std::string>{"layer1.weight", "step_idx", "scalar", "nan", "half",
                                             "bytes"}));

  const std::vector<float> w = as_f32(*f.find("layer1.weight"));
  ASSERT_EQ(w.size(), 6u);
  EXPECT_EQ(w[0], 1.5f);
  EXPECT_TRUE(std::signbit(w[1]));
  EXPECT_EQ(as_i64(*f.find("step_idx"))[3], std::numeric_limits<int64_t>::min());
  EXPECT_TRUE(as_f32(*f.find("empty")).empty());
}

TEST_F(SafetensorsTest, LayoutIsPaddedAndExact) {
  const auto ts = sample_tensors();
  const std::string p = path("layout.safetensors");
  write_safetensors(p, ts, {{"k", "v"}});
  const std::string raw = slurp(p);
  ASSERT_GE(raw.size(), 8u);
  uint64_t n = 0;
  std::memcpy(&n, raw.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  size_t data = 0;
  for (const StTensor& t : ts) data += t.bytes.size();
  EXPECT_EQ(raw.size(), 8 + n + data);
  // The header is JSON followed only by space padding, and metadata are strings.
  const std::string header = raw.substr(8, n);
  const auto j = nlohmann::json::parse(header);
  EXPECT_EQ(j["__metadata__"]["k"], "v");
  EXPECT_EQ(j["layer1.weight"]["data_offsets"], nlohmann::json::array({0, 24}));
  EXPECT_EQ(j["step_idx"]["data_offsets"], nlohmann::json::array({24, 56}));
  const size_t last = header.find_last_not_of(' ');
  EXPECT_EQ(header[last], '}');
  EXPECT_LT(header.size() - last - 1, 8u);
}

TEST_F(SafetensorsTest, EmptyFileListRoundTrips) {
  const std::string p = path("none.safetensors");
  write_safetensors(p, {}, {});
  StFile f = read_safetensors(p);
  EXPECT_TRUE(f.tensors.empty());
  EXPECT_TRUE(f.metadata.empty());
  EXPECT_EQ(slurp(p).size() % 8, 0u);
}

TEST_F(SafetensorsTest, NoTempFileLeftBehind) {
  write_safetensors(path("a.safetensors"), sample_tensors(), {});
  EXPECT_EQ(dir_entries(), std::vector<std::string>{"a.safetensors"});
}

TEST_F(SafetensorsTest, ExistingFileIsReplacedAtomically) {
  const std::string p = path("ckpt.safetensors");
  const float one = 1.0f, two = 2.0f;
  write_safetensors(p, {st_f32("x", {1}, &one)}, {{"step", "1"}});
  const std::string old_bytes = slurp(p);
  struct stat before {};
  ASSERT_EQ(::stat(p.c_str(), &before), 0);
  // A reader holding the old file keeps seeing the complete old content: the new one is a new
  // inode renamed over the name, never an in-place rewrite.
  std::ifstream old_reader(p, std::ios::binary);

  write_safetensors(p, {st_f32("x", {1}, &two)}, {{"step", "2"}});
  struct stat after {};
  ASSERT_EQ(::stat(p.c_str(), &after), 0);
  EXPECT_NE(before.st_ino, after.st_ino);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(old_reader), {}), old_bytes);
  StFile f = read_safetensors(p);
  EXPECT_EQ(f.metadata.at("step"), "2");
  EXPECT_EQ(as_f32(*f.find("x")), std::vector<float>{2.0f});
  EXPECT_EQ(dir_entries(), std::vector<std::string>{"ckpt.safetensors"});
}

TEST_F(SafetensorsTest, InvalidTensorsAreInternalErrorsAndKeepOldFile) {
  const std::string p = path("keep.safetensors");
  const float v[2] = {1, 2};
  write_safetensors(p, {st_f32("x", {2}, v)}, {});
  const std::string old_bytes = slurp(p);
  auto expect_internal = [&](const std::vector<StTensor>& ts) {
    try {
      write_safetensors(p, ts, {});
      ADD_FAILURE() << "expected an internal error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInternal) << e.what();
    }
  };
  expect_internal({StTensor{"x", "F32", {3}, std::vector<uint8_t>(8)}});  // size mismatch
  expect_internal({st_f32("x", {2}, v), st_f32("x", {2}, v)});            // duplicate
  expect_internal({st_f32("", {2}, v)});                                  // empty name
  expect_internal({StTensor{"x", "F12", {1}, std::vector<uint8_t>(4)}});  // unknown dtype
  EXPECT_EQ(slurp(p), old_bytes);
  EXPECT_EQ(dir_entries(), std::vector<std::string>{"keep.safetensors"});
}

TEST_F(SafetensorsTest, UnwritablePathIsInputErrorNamingIt) {
  const std::string p = path("no/such/dir/x.safetensors");
  try {
    write_safetensors(p, {}, {});
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST_F(SafetensorsTest, AsF32RejectsOtherDtype) {
  const int64_t v = 3;
  try {
    as_f32(st_i64("idx", {1}, &v), "ckpt.safetensors");
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("ckpt.safetensors"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("idx"), std::string::npos) << e.what();
  }
}

// ---- hostile files ----------------------------------------------------------------------------

const char* kGoodHeader =
    R"({"__metadata__":{"a":"b"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
    R"("i":{"dtype":"I64","shape":[1],"data_offsets":[8,16]}})";

TEST_F(SafetensorsTest, GoodHandMadeImageParses) {
  // Control for the hostile cases below, which each break one thing of this image.
  const std::string p = path("good.safetensors");
  spit(p, image(kGoodHeader, 16));
  StFile f = read_safetensors(p);
  ASSERT_EQ(f.tensors.size(), 2u);
  EXPECT_EQ(f.tensors[0].name, "w");
  EXPECT_EQ(f.tensors[1].name, "i");
  EXPECT_EQ(f.metadata.at("a"), "b");
}

TEST_F(SafetensorsTest, MissingFile) {
  const std::string p = path("absent.safetensors");
  try {
    read_safetensors(p);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST_F(SafetensorsTest, EmptyFile) { expect_hostile("empty", "", "at least 8"); }

TEST_F(SafetensorsTest, ShorterThanLengthField) {
  expect_hostile("short", "\x10\0\0", "at least 8");
}

TEST_F(SafetensorsTest, TruncatedInHeader) {
  const std::string full = image(kGoodHeader, 16);
  expect_hostile("cut_header", full.substr(0, 8 + 20), "absurd header length");
}

TEST_F(SafetensorsTest, TruncatedInData) {
  const std::string full = image(kGoodHeader, 16);
  expect_hostile("cut_data", full.substr(0, full.size() - 3), "out of range");
}

TEST_F(SafetensorsTest, AbsurdHeaderLength) {
  expect_hostile("absurd", le64(uint64_t{1} << 63) + "{}", "absurd header length");
  expect_hostile("absurd_max", le64(~uint64_t{0}) + "{}", "absurd header length");
  expect_hostile("absurd_200mb", le64(200ull << 20) + "{}", "absurd header length");
}

TEST_F(SafetensorsTest, HeaderNotJson) {
  expect_hostile("not_json", image("{\"w\": [1, 2", 0), "not valid JSON");
  expect_hostile("zero_header", image("", 0), "not valid JSON");
  expect_hostile("bad_utf8", image("{\"\xff\":1}", 0), "not valid JSON");
}

TEST_F(SafetensorsTest, HeaderJsonNotObject) {
  expect_hostile("array", image("[1,2,3]", 0), "expected an object");
  expect_hostile("string", image("\"hi\"", 0), "expected an object");
}

TEST_F(SafetensorsTest, DeeplyNestedHeader) {
  expect_hostile("deep", image(std::string(100000, '[') + std::string(100000, ']'), 0), "nests");
}

// JSON text inside a metadata string (a checkpoint's config, history) gets the header's bound too:
// 16 levels parse, 17 are refused as such, and brackets inside its strings do not count. Printing
// a million-deep value (dump) overflowed the stack (tests/cli/test_agreement.sh has the resume).
TEST(MetadataJson, NestingIsBounded) {
  EXPECT_EQ(parse_metadata_json(std::string(16, '[') + std::string(16, ']')).dump(),
            std::string(16, '[') + std::string(16, ']'));
  EXPECT_EQ(parse_metadata_json(R"({"a": "[[[[[[[[[[[[[[[[[[[["})").at("a"),
            "[[[[[[[[[[[[[[[[[[[[");
  for (const size_t depth : {17, 1000000}) {
    try {
      (void)parse_metadata_json(std::string(depth, '[') + std::string(depth, ']'));
      ADD_FAILURE() << depth << " levels parsed";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInput);
      EXPECT_STREQ(e.what(), "it nests deeper than 16");
    }
  }
  EXPECT_THROW((void)parse_metadata_json("{not json"), nlohmann::json::parse_error);
}

TEST_F(SafetensorsTest, UnknownDtype) {
  expect_hostile("dtype", image(R"({"w":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", 8),
                 "unknown dtype \"F33\"");
  expect_hostile("dtype_num", image(R"({"w":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", 8),
                 "'w'");
}

TEST_F(SafetensorsTest, BadShapeOrFields) {
  expect_hostile("neg", image(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
                 "non-negative");
  expect_hostile("float_dim",
                 image(R"({"w":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8),
                 "non-negative");
  expect_hostile("no_shape", image(R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", 8),
                 "missing \"shape\"");
  expect_hostile("no_offsets", image(R"({"w":{"dtype":"F32","shape":[2]}})", 8),
                 "missing \"data_offsets\"");
  expect_hostile("entry_not_obj", image(R"({"w":7})", 0), "'w'");
  expect_hostile("overflow",
                 image(R"({"w":{"dtype":"F64","shape":[4294967296,4294967296],)"
                       R"("data_offsets":[0,0]}})",
                       0),
                 "overflows");
}

TEST_F(SafetensorsTest, OffsetsOutOfRange) {
  expect_hostile("range", image(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 8),
                 "out of range");
  expect_hostile("huge",
                 image(R"({"w":{"dtype":"U8","shape":[1],)"
                       R"("data_offsets":[18446744073709551615,18446744073709551616]}})",
                       1),
                 "'w'");
  expect_hostile("reversed", image(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8),
                 "begin > end");
}

TEST_F(SafetensorsTest, OffsetsNotMatchingShape) {
  expect_hostile("mismatch", image(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
                 "needs 12");
}

TEST_F(SafetensorsTest, OverlappingOffsets) {
  expect_hostile("overlap",
                 image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                       12),
                 "overlap");
  expect_hostile("alias",
                 image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                       8),
                 "overlap");
}

TEST_F(SafetensorsTest, GapBetweenTensors) {
  expect_hostile("gap",
                 image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                       R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                       12),
                 "gap");
}

TEST_F(SafetensorsTest, TrailingBytesAfterData) {
  expect_hostile("trailing", image(kGoodHeader, 17), "trailing bytes");
  expect_hostile("trailing_empty", image("{}", 4), "trailing bytes");
}

// What --resume auto may pass over as junk (read_metadata's `junk`) against what it must not: a
// file that a reader cannot get at, or one cut short inside its header, may be a damaged
// checkpoint. `junk` starts true here: read_metadata must clear it.
bool judged_junk(const std::string& path) {
  bool junk = true;
  try {
    read_metadata(path, &junk);
  } catch (const Error&) {
    return junk;
  }
  EXPECT_FALSE(junk) << path << ": read, yet junk";
  return junk;
}

TEST_F(SafetensorsTest, OnlyFilesThatAreNoSafetensorsAtAllAreJunk) {
  const std::string full = image(kGoodHeader, 16);
  const std::map<std::string, std::string> junk = {
      {"empty", ""},
      {"seven_bytes", "\x10\0\0\0\0\0\0"},
      {"zero_length", le64(0) + "{}"},
      {"over_the_limit", le64(100ull * 1000 * 1000 + 1) + "{}"},
      {"text", "hello, world: not a checkpoint\n"},
      {"array_header", image("[1, 2]", 0)},
  };
  for (const auto& [name, bytes] : junk) {
    spit(path(name), bytes);
    EXPECT_TRUE(judged_junk(path(name))) << name;
    EXPECT_THROW(read_metadata(path(name)), Error) << name;  // and no reader takes it
  }
  const std::map<std::string, std::string> not_junk = {
      {"good", full},
      {"cut_in_header", full.substr(0, 8 + 20)},  // length says more than the file holds
      {"cut_in_data", full.substr(0, full.size() - 3)},
      {"bad_json_object", image("{\"w\": [1, 2", 0)},  // opens an object: damaged, not junk
      {"at_the_limit", le64(100ull * 1000 * 1000) + "{"},
      {"only_the_length", le64(2)},  // its header cut off whole
  };
  for (const auto& [name, bytes] : not_junk) {
    spit(path(name), bytes);
    EXPECT_FALSE(judged_junk(path(name))) << name;
  }
  EXPECT_FALSE(judged_junk(path("absent")));
  fs::create_directory(path("dir"));
  EXPECT_FALSE(judged_junk(path("dir")));
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
  EXPECT_FALSE(judged_junk(path("fifo")));  // returns at once: never read from
  spit(path("unreadable"), "junk junk junk");
  ::chmod(path("unreadable").c_str(), 0);
  if (::geteuid() != 0) {
    EXPECT_FALSE(judged_junk(path("unreadable")));
  }
}

// A file far larger than its header accounts for is refused from the header alone: the reader
// neither reads the data nor allocates for it. 1 TiB (sparse: no disk) is more memory than any
// machine this runs on, so a reader that sized a buffer by the file would fail with
// std::bad_alloc, not this input error.
TEST_F(SafetensorsTest, HugeSparseFileIsRefusedFromItsHeader) {
  const std::string p = path("sparse.safetensors");
  const std::string good = image(kGoodHeader, 16);
  spit(p, good);
  const uint64_t huge = uint64_t{1} << 40;
  if (::truncate(p.c_str(), static_cast<off_t>(huge)) != 0)
    GTEST_SKIP() << "cannot make a sparse 1 TiB file in " << dir_;
  try {
    read_safetensors(p);
    ADD_FAILURE() << "a 1 TiB file with a 16-byte data section was read";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kInput) << msg;
    const std::string want = p + ": " + std::to_string(huge - good.size()) +
                             " trailing bytes after the last tensor: the file has " +
                             std::to_string(huge) + " bytes, its header accounts for " +
                             std::to_string(good.size());
    EXPECT_NE(msg.find(want), std::string::npos) << "expected '" << want << "' in: " << msg;
  }
}

// Read in pieces now (header, then each tensor), a file still comes back byte for byte: the
// tensors' bytes are the ones at their offsets, in a file whose header order is not data order.
TEST_F(SafetensorsTest, TensorsAreReadFromTheirOffsets) {
  const std::string header = R"({"b":{"dtype":"U8","shape":[3],"data_offsets":[2,5]},)"
                             R"("a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                             R"("e":{"dtype":"U8","shape":[0],"data_offsets":[5,5]}})";
  const std::string p = path("pieces.safetensors");
  spit(p, le64(header.size()) + header + "\x01\x02\x03\x04\x05");
  const StFile f = read_safetensors(p);
  ASSERT_EQ(f.tensors.size(), 3u);
  EXPECT_EQ(f.find("a")->bytes, (std::vector<uint8_t>{1, 2}));
  EXPECT_EQ(f.find("b")->bytes, (std::vector<uint8_t>{3, 4, 5}));
  EXPECT_TRUE(f.find("e")->bytes.empty());
}

// safetensors forbids a name twice; nlohmann would keep the last one and pass over the other.
TEST_F(SafetensorsTest, DuplicateKeys) {
  expect_hostile("dup_same",
                 image(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                       8),
                 "safetensors header has tensor 'w' twice");
  expect_hostile("dup_differ",
                 image(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                       16),
                 "safetensors header has tensor 'w' twice");
  expect_hostile("dup_meta", image(R"({"__metadata__":{"step":"1","step":"2"}})", 0),
                 "safetensors header has key 'step' twice in one object");
  expect_hostile(
      "dup_field",
      image(R"({"w":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8),
      "safetensors header has key 'dtype' twice in one object");
  // The same key in two objects is no duplicate.
  const std::string p = path("dup_ok.safetensors");
  spit(p, image(R"({"__metadata__":{"w":"x"},"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})",
                1));
  EXPECT_EQ(read_safetensors(p).metadata.at("w"), "x");
}

// A shape of 10,001 dimensions quoted in an error is cut, not a 20 KB line.
TEST_F(SafetensorsTest, LongShapeIsCutInMessages) {
  std::string dims;
  for (int i = 0; i < 10000; ++i) dims += "1,";
  const std::string bad =
      image(R"({"w":{"dtype":"U8","shape":[)" + dims + R"(-1],"data_offsets":[0,1]}})", 1);
  const std::string mismatch =
      image(R"({"w":{"dtype":"U8","shape":[)" + dims + R"(2],"data_offsets":[0,1]}})", 1);
  for (const std::string* bytes : {&bad, &mismatch}) {
    try {
      parse_safetensors(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size(), "<buf>");
      ADD_FAILURE() << "a bad shape was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInput);
      EXPECT_LT(std::string(e.what()).size(), 600u) << e.what();
      EXPECT_NE(std::string(e.what()).find("shape [1"), std::string::npos) << e.what();
    }
  }
}

TEST_F(SafetensorsTest, NonStringMetadata) {
  expect_hostile("meta_num", image(R"({"__metadata__":{"step":42}})", 0), "metadata 'step'");
  expect_hostile("meta_arr", image(R"({"__metadata__":["x"]})", 0), "__metadata__");
}

// ---- cross-check with PyTorch -----------------------------------------------------------------

// Reads a safetensors file with json/struct/torch.frombuffer only (the `safetensors` package may be
// absent) and prints it as JSON; then writes a reference-style file (no padding, header order
// unlike data order) for the C++ reader.
const char* kPyScript = R"PY(
import json, struct, sys
try:
    import torch
except ImportError:
    sys.exit(77)
src, dst = sys.argv[1], sys.argv[2]
raw = open(src, 'rb').read()
n = struct.unpack('<Q', raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
types = {'F32': torch.float32, 'I64': torch.int64, 'U8': torch.uint8}
out = {'metadata': hdr.pop('__metadata__', {}), 'tensors': {}}
for name, info in hdr.items():
    b, e = info['data_offsets']
    t = torch.frombuffer(bytearray(raw[8 + n + b:8 + n + e]), dtype=types[info['dtype']])
    t = t.reshape(info['shape'])
    out['tensors'][name] = {'dtype': info['dtype'], 'shape': list(t.shape),
                            'values': t.flatten().tolist()}
print(json.dumps(out))
a = torch.arange(6, dtype=torch.float32).reshape(2, 3) / 4
b = torch.tensor([5, -6, 2**40], dtype=torch.int64)
bb, ab = b.numpy().tobytes(), a.numpy().tobytes()
h = {'__metadata__': {'format': 'pt'},
     'a': {'dtype': 'F32', 'shape': [2, 3], 'data_offsets': [len(bb), len(bb) + len(ab)]},
     'b': {'dtype': 'I64', 'shape': [3], 'data_offsets': [0, len(bb)]}}
hj = json.dumps(h).encode()
open(dst, 'wb').write(struct.pack('<Q', len(hj)) + hj + bb + ab)
)PY";

TEST_F(SafetensorsTest, CrossCheckWithPythonTorch) {
  if (::access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "/usr/bin/python3 not available";
  const float w[6] = {1.5f, -0.0f, 3.4028235e38f, 1e-45f, -7.25f, 0.1f};
  const int64_t idx[4] = {0, -1, std::numeric_limits<int64_t>::max(),
                          std::numeric_limits<int64_t>::min()};
  const std::string ours = path("ours.safetensors"), theirs = path("theirs.safetensors");
  write_safetensors(
      ours,
      {st_f32("w", {2, 3}, w), st_i64("idx", {4}, idx), StTensor{"u", "U8", {3}, {1, 2, 255}}},
      {{"format", "pt"}, {"epoch", "3"}});
  spit(path("read.py"), kPyScript);
  const std::string cmd = "/usr/bin/python3 " + path("read.py") + " " + ours + " " + theirs +
                          " > " + path("out.json") + " 2> " + path("err.txt");
  // One interpreter start (importing torch takes seconds); the script exits 77 without torch.
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status)) << status;
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << "python3 cannot import torch";
  ASSERT_EQ(WEXITSTATUS(status), 0) << slurp(path("err.txt"));

  const auto j = nlohmann::json::parse(slurp(path("out.json")));
  EXPECT_EQ(j["metadata"], (nlohmann::json{{"format", "pt"}, {"epoch", "3"}}));
  const auto& jw = j["tensors"]["w"];
  EXPECT_EQ(jw["dtype"], "F32");
  EXPECT_EQ(jw["shape"], nlohmann::json::array({2, 3}));
  ASSERT_EQ(jw["values"].size(), 6u);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(jw["values"][i].get<double>(), double{w[i]}) << i;
  const auto& ji = j["tensors"]["idx"];
  ASSERT_EQ(ji["values"].size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(ji["values"][i].get<int64_t>(), idx[i]) << i;
  EXPECT_EQ(j["tensors"]["u"]["values"], nlohmann::json::array({1, 2, 255}));

  StFile f = read_safetensors(theirs);
  EXPECT_EQ(f.metadata.at("format"), "pt");
  ASSERT_EQ(f.tensors.size(), 2u);
  EXPECT_EQ(f.tensors[0].name, "b");  // offset order, not header order
  EXPECT_EQ(as_i64(f.tensors[0]), (std::vector<int64_t>{5, -6, int64_t{1} << 40}));
  EXPECT_EQ(f.tensors[1].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(as_f32(f.tensors[1]), (std::vector<float>{0, 0.25f, 0.5f, 0.75f, 1, 1.25f}));
}

}  // namespace
}  // namespace dpt
