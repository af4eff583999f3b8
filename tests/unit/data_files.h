// What the data-set reader tests (test_idx.cc, test_dataset.cc) share: IDX bytes, writing and
// reading files byte for byte (gzip'd with zlib's own writer, as the real dataset files are), and
// the check that a call refuses its input with a message naming what is wrong.
#pragma once

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "dpt/error.h"

namespace dpt::test {

inline void write_raw(const std::filesystem::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline void write_gz(const std::filesystem::path& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  if (!bytes.empty()) {
    ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
  }
  ASSERT_EQ(gzclose(f), Z_OK);
}

// An IDX file: 0 0 dtype ndim, big-endian uint32 dims, then `data` as is.
inline std::vector<uint8_t> idx_bytes(uint8_t dtype, const std::vector<uint32_t>& dims,
                                      const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out = {0, 0, dtype, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(d >> s));
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

inline std::vector<uint8_t> read_all(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Runs f, which must throw a kInput dpt::Error whose message contains every needle.
inline void expect_input_error(const std::function<void()>& f,
                               const std::vector<std::string>& needles) {
  try {
    f();
  } catch (const dpt::Error& e) {
    EXPECT_EQ(e.kind(), dpt::ErrorKind::kInput) << e.what();
    const std::string msg = e.what();
    for (const std::string& needle : needles)
      EXPECT_NE(msg.find(needle), std::string::npos) << "'" << needle << "' not in: " << msg;
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected dpt::Error, got std::exception: " << e.what();
    return;
  }
  ADD_FAILURE() << "expected a dpt::Error containing '" << needles.front() << "', nothing thrown";
}

}  // namespace dpt::test
