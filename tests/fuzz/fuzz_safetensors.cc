// libFuzzer target for the safetensors parser: any byte string must parse or be refused with a
// dpt::Error of kind kInput; what parses must describe tensors that fit the buffer.
#include <cstdint>
#include <cstdlib>

#include "dpt/error.h"
#include "dpt/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    dpt::StFile f = dpt::parse_safetensors(data, size, "fuzz-input");
    size_t total = 0;
    for (const auto& t : f.tensors) {
      size_t n = dpt::st_dtype_size(t.dtype);
      for (int64_t d : t.shape) n *= static_cast<size_t>(d);
      if (n != t.bytes.size()) std::abort();
      total += n;
    }
    if (total > size) std::abort();
  } catch (const dpt::Error& e) {
    if (e.kind() != dpt::ErrorKind::kInput) std::abort();
  }
  return 0;
}
