// Reader for IDX files (the MNIST / Fashion-MNIST format), raw or gzip'd: what load_data
// (include/dpt/dataset.h) reads the idx format's files with (src/data/idx.cc). Nothing in a file is
// trusted: every defect is a kInput dpt::Error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dpt {

// IdxArray: one IDX file of unsigned bytes (dtype code 0x08) with its dimensions.
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;
};

// Reads a gzip'd or raw IDX file; gzip is detected by its magic 1f 8b, never by the name.
// Refuses (kInput, message names `path` and the defect): a missing/unreadable file, a corrupted or
// truncated gzip stream, a bad magic (IDX starts with two zero bytes), a dtype code other than 0x08
// (the code found is named), ndim outside 1..4, a zero dim, data shorter or longer than the
// product of the dims, and a product above 2^34 bytes.
IdxArray read_idx(const std::string& path);

}  // namespace dpt
