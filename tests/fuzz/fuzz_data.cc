// libFuzzer target for the CIFAR and .npy readers and load_data: any byte string, read as a CIFAR
// batch, an .npy file of images or labels, or a whole data set directory, must be loaded
// consistently or refused with a kInput dpt::Error; never a crash, a sanitizer report, or another
// exception. The first byte picks the use, the rest is the file.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "data/readers.h"
#include "dpt/dataset.h"
#include "dpt/error.h"

namespace {

namespace fs = std::filesystem;

void write_file(const std::string& path, const uint8_t* data, size_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size) std::fwrite(data, 1, size, f);
  std::fclose(f);
}

// What every accepted set must be: sizes that agree, labels within the classes.
void check_set(const dpt::ImageSet& s) {
  if (s.n <= 0 || s.rows <= 0 || s.cols <= 0 || s.channels <= 0) std::abort();
  if (s.images.size() != static_cast<size_t>(s.n * s.pixels())) std::abort();
  if (s.labels.size() != static_cast<size_t>(s.n)) std::abort();
  if (s.num_classes < 1 || s.num_classes > dpt::kMaxClasses) std::abort();
  for (dpt::Label l : s.labels)
    if (l >= s.num_classes) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The readers take paths (they refuse what is not a regular file): inputs go through tmpfs.
  static const std::string dir = "/dev/shm/dpt_fuzz_data_" + std::to_string(getpid());
  static const bool made = fs::create_directories(dir) || fs::is_directory(dir);
  if (!made) std::abort();
  for (const auto& entry : fs::directory_iterator(dir)) fs::remove(entry.path());
  const std::string file = dir + "/input";
  const uint8_t mode = data[0] % 6;
  const uint8_t* body = data + 1;
  const size_t n = size - 1;
  try {
    switch (mode) {
      case 0:
      case 1: {
        write_file(file, body, n);
        check_set(dpt::data::load_cifar_files({file}, mode + 1).set);
        break;
      }
      case 2: {
        write_file(file, body, n);
        const dpt::data::NpyImages img = dpt::data::read_npy_images(file);
        size_t count = 1;
        for (int64_t d : img.shape) count *= static_cast<size_t>(d);
        if (img.shape.size() < 3 || img.shape.size() > 4 || count != img.data.size()) std::abort();
        break;
      }
      case 3: {
        write_file(file, body, n);
        (void)dpt::data::read_npy_labels(file);
        break;
      }
      case 4: {
        // An npy data set: the first two bytes split the rest into the images and the labels
        // file, used for both splits.
        if (n < 2) return 0;
        const size_t cut = std::min<size_t>(n - 2, size_t{body[0]} | (size_t{body[1]} << 8));
        const uint8_t* rest = body + 2;
        for (const char* split : {"train", "test"}) {
          write_file(dir + "/" + split + "_images.npy", rest, cut);
          write_file(dir + "/" + split + "_labels.npy", rest + cut, n - 2 - cut);
        }
        const dpt::DataSets d = dpt::load_data(dir, "auto");
        check_set(d.train);
        check_set(d.test);
        break;
      }
      default: {
        // A CIFAR-10 directory detected from its names, the bytes as both batches.
        write_file(dir + "/data_batch_1.bin", body, n);
        write_file(dir + "/test_batch.bin", body, n);
        const dpt::DataSets d = dpt::load_data(dir, "auto");
        check_set(d.train);
        check_set(d.test);
        break;
      }
    }
  } catch (const dpt::Error& e) {
    if (e.kind() != dpt::ErrorKind::kInput) std::abort();
  }
  return 0;
}
