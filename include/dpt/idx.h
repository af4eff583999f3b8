// Reader for IDX files (the MNIST / Fashion-MNIST format), raw or gzip'd, the IDX image-set loader
// the trainer used before load_data (include/dpt/dataset.h) read every format, and the uint8 ->
// float gather of a batch. Nothing in a file is trusted: every defect is a kInput dpt::Error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dpt/dataset.h"

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

// Loads split `split` ("train" or "t10k") from `dir`: the files <split>-images-idx3-ubyte[.gz] (or
// -idx4-ubyte[.gz]) and <split>-labels-idx1-ubyte[.gz], preferring .gz when both exist. Refuses a
// missing file (naming the directory and the names tried), images that are not 3-D (channels 1) or
// 4-D (N x H x W x C), labels that are not 1-D, image and label counts that disagree (both files
// and counts named), and a label >= num_classes (index and value named). num_classes must be in
// 1..256. load_data(dir, "idx") reads the same files and derives num_classes from the labels.
ImageSet load_image_set(const std::string& dir, const std::string& split, int num_classes = 10);

// The seed's ToTensor, gathered by index so shuffled batches need no copy of the set:
// out[i*P + p] = images[indices[i]*P + p] / 255.f for i in [0, count), P = set.pixels() (HWC).
// `out` holds count*P floats; every index must be in [0, set.n).
void images_to_float(const ImageSet& set, const int64_t* indices, int64_t count, float* out);
// The same on raw arrays: num_images images of `pixels` uint8 each.
void images_to_float(const uint8_t* images, int64_t num_images, int64_t pixels,
                     const int64_t* indices, int64_t count, float* out);

}  // namespace dpt
