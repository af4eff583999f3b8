// Reader and atomic writer for the safetensors checkpoint format, so weights load in PyTorch.
// The reader trusts nothing in the file: every malformed field becomes a dpt::Error of kind kInput.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace dpt {

// One tensor: raw little-endian bytes of a safetensors dtype ("F32", "I64", "F16", "BF16", "I32",
// "U8", ...). bytes.size() must equal product(shape) * st_dtype_size(dtype).
struct StTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// A parsed file: metadata from "__metadata__" and the tensors in file (data offset) order.
struct StFile {
  std::map<std::string, std::string> metadata;
  std::vector<StTensor> tensors;

  // nullptr when absent.
  const StTensor* find(const std::string& name) const;
};

// Bytes per element of a safetensors dtype string; 0 when the dtype is unknown.
size_t st_dtype_size(const std::string& dtype);

// Writes `tensors` (laid out contiguously in the given order) and `metadata` to `path`. The header
// is padded with spaces to a multiple of 8 bytes, as the reference implementation does. Atomic and
// safe through dpt::AtomicFile (files.h): a crash leaves either the old file or the new one.
// Inconsistent tensors (empty or duplicate names, size/shape mismatch, unknown dtype) are internal
// errors; I/O failures (cannot open, disk full, rename, a target that is not a regular file) are
// input errors naming `what` ("checkpoint", "--save") and the path.
void write_safetensors(const std::string& path, const std::vector<StTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {},
                       const std::string& what = "checkpoint");

// Reads and fully validates a safetensors file (see parse_safetensors for the checks). A FIFO,
// device or directory is refused at once (files.h's open_input_file), never read from.
// `check_header`, when given, sees the file with every tensor's name, dtype and shape but no bytes
// before any data is read, and throws to refuse it: a loader refuses names and shapes its model
// lacks without reading (or allocating) gigabytes a header may claim.
StFile read_safetensors(const std::string& path,
                        const std::function<void(const StFile&)>& check_header = nullptr);
// Only the "__metadata__" of a safetensors file, after every check of its header (the data section
// is not read: a truncated file still tells what it is, and fails when loaded).
// `junk`, when given, is set to whether the file opened and its first bytes show it is no
// safetensors file at all (and so the error thrown is certain): fewer than 8 bytes, a header
// length of 0 or beyond the 100 MB limit, or a header that does not open a JSON object. It is false
// for a file read whole, an open or read failure, a FIFO or device (never read from), or a header
// cut short by the file's end: such a file may be a damaged checkpoint, which a caller must not
// take for junk (and, say, start fresh over).
std::map<std::string, std::string> read_metadata(const std::string& path, bool* junk = nullptr);

// Parses an in-memory safetensors image; `origin` names the source in every message. Checks: at
// least 8 bytes; header length sane (<= size - 8 and <= 100 MB); header a JSON object; every entry
// has a known dtype, a shape of non-negative ints, data_offsets [b, e] with b <= e <= data size and
// e - b == product(shape) * element size; the ranges neither overlap nor leave gaps and cover the
// data section exactly; "__metadata__" maps strings to strings. Any violation is a kInput error.
StFile parse_safetensors(const uint8_t* data, size_t size, const std::string& origin);

// A metadata value that is itself JSON text (a checkpoint's "config", "history", "epoch_so_far"),
// parsed with the nesting bound the header has (16 levels; dptrain writes at most 3): the header's
// bound does not reach text inside its strings, and nlohmann prints and compares values by
// recursion, one stack frame per level, so a value nested a million deep ended the run in a stack
// overflow (SIGSEGV). Deeper text throws dpt::Error (kInput) saying so; text that is not JSON
// throws nlohmann's parse error.
nlohmann::json parse_metadata_json(const std::string& text);

// Conveniences for the common dtypes. The builders copy product(shape) elements from `p`.
StTensor st_f32(const std::string& name, const std::vector<int64_t>& shape, const float* p);
StTensor st_i64(const std::string& name, const std::vector<int64_t>& shape, const int64_t* p);
// Copy the elements out; a tensor of another dtype is an input error (it came from a file), named
// with `origin` (e.g. the checkpoint path) when given.
std::vector<float> as_f32(const StTensor& t, const std::string& origin = "");
std::vector<int64_t> as_i64(const StTensor& t, const std::string& origin = "");

}  // namespace dpt
