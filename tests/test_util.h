// Helpers shared by tests: temporary directories, a small synthetic, learnable IDX data set
// (class k has a bright band at a class-specific position, plus noise), so training tests need
// no download and run in seconds, and host <-> backend copies of test values.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "dpt/backend.h"
#include "dpt/comm.h"
#include "dpt/config.h"
#include "dpt/rng.h"
#include "dpt/tensor.h"

namespace dpt::test {

inline void fill_uniform(float* p, int64_t n, std::mt19937_64& g, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> d(lo, hi);
  for (int64_t i = 0; i < n; ++i) p[i] = d(g);
}

inline Tensor random_tensor(const Shape& s, std::mt19937_64& g, float lo = -1.f, float hi = 1.f) {
  Tensor t(s);
  fill_uniform(t.data(), t.numel(), g, lo, hi);
  return t;
}

// Host values into a new tensor of `shape` (1-D without one) in be's memory, and a tensor's values
// back to the host: only Backend::copy_from_host/copy_to_host, so they work on every backend.
inline Tensor to_backend(Backend& be, const std::vector<float>& v, const Shape& shape) {
  Tensor t(shape, &be);
  if (t.numel() != static_cast<int64_t>(v.size()))
    throw std::invalid_argument("to_backend: " + std::to_string(v.size()) + " values for shape " +
                                shape_str(shape));
  if (!v.empty()) be.copy_from_host(t.data(), v.data(), v.size() * sizeof(float));
  return t;
}
inline Tensor to_backend(Backend& be, const std::vector<float>& v) {
  return to_backend(be, v, Shape{static_cast<int64_t>(v.size())});
}
inline std::vector<float> to_host(Backend& be, const Tensor& t) {
  std::vector<float> h(static_cast<size_t>(t.numel()));
  if (!h.empty()) be.copy_to_host(h.data(), t.data(), h.size() * sizeof(float));
  return h;
}
// The same for arrays of any element type (indices, labels, statistics).
template <typename T>
DeviceArray<T> to_backend_array(Backend& be, const std::vector<T>& v) {
  DeviceArray<T> a(be, static_cast<int64_t>(v.size()));
  a.copy_from_host(v.data(), a.size());
  return a;
}
template <typename T>
std::vector<T> to_host(const DeviceArray<T>& a) {
  std::vector<T> h(static_cast<size_t>(a.size()));
  a.copy_to_host(h.data(), a.size());
  return h;
}

// The world communicator with a timeout, so a failing rank ends a test instead of hanging it.
inline std::unique_ptr<Communicator> world_comm(double timeout = 120) {
  auto c = make_mpi_communicator();
  c->set_timeout(timeout);
  return c;
}

inline std::string make_temp_dir(const std::string& tag) {
  auto base = std::filesystem::temp_directory_path() /
              ("dpt_" + tag + "_" + std::to_string(getpid()) + "_" + std::to_string(rand()));
  std::filesystem::create_directories(base);
  return base.string();
}

inline void write_idx(const std::string& path, const std::vector<int32_t>& dims,
                      const std::vector<uint8_t>& data) {
  std::ofstream f(path, std::ios::binary);
  const uint8_t head[4] = {0, 0, 0x08, static_cast<uint8_t>(dims.size())};
  f.write(reinterpret_cast<const char*>(head), 4);
  for (int32_t d : dims) {
    const uint8_t be[4] = {static_cast<uint8_t>(d >> 24), static_cast<uint8_t>(d >> 16),
                           static_cast<uint8_t>(d >> 8), static_cast<uint8_t>(d)};
    f.write(reinterpret_cast<const char*>(be), 4);
  }
  f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}

// Writes train (n_train) and t10k (n_test) 28x28 sets into dir.
inline void write_synthetic_dataset(const std::string& dir, int n_train, int n_test,
                                    uint64_t seed) {
  Rng rng(seed);
  auto make = [&](const std::string& split, int n) {
    std::vector<uint8_t> images(static_cast<size_t>(n) * 784), labels(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      const int label = static_cast<int>(rng.below(10));
      labels[static_cast<size_t>(i)] = static_cast<uint8_t>(label);
      for (int p = 0; p < 784; ++p) {
        const int row = p / 28;
        const bool band = row >= 2 + 2 * label && row < 4 + 2 * label;
        const double v = (band ? 200.0 : 20.0) + 40.0 * rng.uniform();
        images[static_cast<size_t>(i) * 784 + p] = static_cast<uint8_t>(v);
      }
    }
    write_idx(dir + "/" + split + "-images-idx3-ubyte", {n, 28, 28}, images);
    write_idx(dir + "/" + split + "-labels-idx1-ubyte", {n}, labels);
  };
  make("train", n_train);
  make("t10k", n_test);
}

// Rank 0 writes a synthetic set into a new temporary directory; every rank returns its path.
inline std::string shared_synthetic_dir(Communicator& comm, const std::string& tag, int n_train,
                                        int n_test, uint64_t seed) {
  std::string dir;
  if (comm.rank() == 0) {
    dir = make_temp_dir(tag);
    write_synthetic_dataset(dir, n_train, n_test, seed);
  }
  int64_t len = static_cast<int64_t>(dir.size());
  comm.broadcast(&len, 1);
  dir.resize(static_cast<size_t>(len));
  comm.broadcast(reinterpret_cast<uint8_t*>(dir.data()), len);
  return dir;
}

// A quiet run of `model` with its recipe's defaults over the data in `dir`: the TrainConfig every
// training test starts from.
inline TrainConfig small_config(const std::string& model, const std::string& dir, int epochs,
                                int64_t batch) {
  TrainConfig c;
  c.model = model;
  apply_recipe(&c);
  c.data = dir;
  c.epochs = epochs;
  c.batch_size = batch;
  c.quiet = true;
  return c;
}

}  // namespace dpt::test
