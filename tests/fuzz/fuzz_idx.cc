// libFuzzer target for the IDX reader: any byte string, raw or gzip'd, must be read or refused
// with a dpt::Error of kind kInput; never a crash, a sanitizer report, or another exception.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "dpt/error.h"
#include "dpt/idx.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The reader takes paths (it streams gzip from disk): each input goes through a tmpfs file.
  static const std::string path = "/dev/shm/dpt_fuzz_idx_" + std::to_string(getpid());
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size) std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    dpt::IdxArray a = dpt::read_idx(path);
    size_t n = 1;
    for (int64_t d : a.dims) n *= static_cast<size_t>(d);
    if (n != a.data.size()) std::abort();  // accepted files must be consistent
  } catch (const dpt::Error& e) {
    if (e.kind() != dpt::ErrorKind::kInput) std::abort();
  }
  return 0;
}
