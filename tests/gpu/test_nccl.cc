// The NCCL communicator at world size 1 (and at k ranks on a multi-GPU host): collectives on
// device buffers against formulas, its non-blocking set-up with and without a --timeout, and a
// set-up whose peer never joins ending at --timeout. Skipped where no CUDA device is visible (CI).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/nccl_communicator.h"
#include "dpt/comm.h"
#include "dpt/device.h"
#include "dpt/error.h"

namespace dpt {
namespace {

TEST(Nccl, CollectivesOnDeviceBuffers) {
  const int devices = cuda_device_count();
  if (devices == 0) GTEST_SKIP() << "no CUDA device visible";
  auto mpi = make_mpi_communicator();
  mpi->set_timeout(60);
  if (mpi->size() > devices) GTEST_SKIP() << "NCCL needs one device per rank";
  auto nccl = make_nccl_communicator(*mpi, mpi->rank() % devices);
  const int k = nccl->size(), r = nccl->rank();
  const size_t n = 1 << 20;
  std::vector<float> h(n, static_cast<float>(r + 1));
  float* d = nullptr;
  CUDA_CHECK(cudaMalloc(&d, n * sizeof(float)));
  CUDA_CHECK(cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  // A pageable host-to-device cudaMemcpy may return before its DMA lands, and NCCL's stream is
  // non-blocking (not ordered after the legacy stream): wait before it reads d.
  CUDA_CHECK(cudaDeviceSynchronize());
  nccl->allreduce(d, static_cast<int64_t>(n), ReduceOp::kSum);
  CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; i += 997) ASSERT_EQ(h[i], static_cast<float>(k * (k + 1) / 2));
  nccl->allreduce(d, static_cast<int64_t>(n), ReduceOp::kAvg);
  CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
  EXPECT_FLOAT_EQ(h[5], static_cast<float>(k * (k + 1) / 2));
  float v = r == 0 ? 42.f : -1.f;
  CUDA_CHECK(cudaMemcpy(d, &v, sizeof v, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaDeviceSynchronize());
  nccl->broadcast(d, 1, 0);
  CUDA_CHECK(cudaMemcpy(&v, d, sizeof v, cudaMemcpyDeviceToHost));
  EXPECT_EQ(v, 42.f);
  nccl->barrier();
  auto dup = nccl->duplicate();
  EXPECT_EQ(dup->size(), k);
  dup->allreduce(d, 1, ReduceOp::kMax);
  CUDA_CHECK(cudaFree(d));
}

// The set-up is non-blocking and polled (with no deadline at --timeout 0, with one otherwise); a
// collective right after it must see the communicator complete: an integer sum, exact.
TEST(Nccl, NonBlockingSetUpThenAnExactSum) {
  const int devices = cuda_device_count();
  if (devices == 0) GTEST_SKIP() << "no CUDA device visible";
  auto mpi = make_mpi_communicator();
  if (mpi->size() > devices) GTEST_SKIP() << "NCCL needs one device per rank";
  for (const double timeout : {0.0, 60.0}) {
    mpi->set_timeout(timeout);
    auto nccl = make_nccl_communicator(*mpi, mpi->rank() % devices);
    EXPECT_EQ(nccl->timeout(), timeout);
    const int k = nccl->size(), r = nccl->rank();
    const int n = 1000;
    std::vector<int32_t> h(n);
    for (int i = 0; i < n; ++i) h[static_cast<size_t>(i)] = i * (r + 1);
    int32_t* d = nullptr;
    CUDA_CHECK(cudaMalloc(&d, n * sizeof(int32_t)));
    CUDA_CHECK(cudaMemcpy(d, h.data(), n * sizeof(int32_t), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaDeviceSynchronize());
    nccl->allreduce(d, n, ReduceOp::kSum);
    CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(int32_t), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(d));
    for (int i = 0; i < n; ++i) ASSERT_EQ(h[static_cast<size_t>(i)], i * (k * (k + 1) / 2)) << "element " << i;
  }
}

// The bootstrap of a world of two whose rank 1 never starts: this process is rank 0 (the root of
// the unique id's broadcast, which has nothing to receive), so NCCL's set-up waits for a peer that
// never joins. Only what make_nccl_communicator calls is implemented.
class AbsentPeerBootstrap : public Communicator {
 public:
  explicit AbsentPeerBootstrap(double timeout) : timeout_(timeout) {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  const std::string& host() const override { return host_; }
  std::unique_ptr<Communicator> duplicate() const override { unused(); }
  void set_timeout(double seconds) override { timeout_ = seconds; }
  double timeout() const override { return timeout_; }
  std::unique_ptr<Request> iallreduce_raw(void*, int64_t, DType, ReduceOp, const std::string&) override { unused(); }
  std::unique_ptr<Request> ibroadcast_raw(void*, int64_t, DType, int, const std::string&) override {
    return std::make_unique<Done>();
  }
  void reduce_raw(const void*, void*, int64_t, DType, ReduceOp, int) override { unused(); }
  void allgather_raw(const void*, void*, int64_t, DType) override { unused(); }
  void barrier() override { unused(); }
  void allreduce_unbounded_raw(void*, int64_t, DType, ReduceOp) override { unused(); }
  std::string diagnose() override { return "rank 1 never started"; }

 private:
  struct Done : Request {
    void wait() override {}
    bool test() override { return true; }
  };
  [[noreturn]] static void unused() { throw std::logic_error("not used by make_nccl_communicator"); }
  double timeout_;
  std::string host_ = "testhost";
};

TEST(Nccl, APeerThatNeverJoinsEndsTheSetUpAtTimeout) {
  const int devices = cuda_device_count();
  if (devices == 0) GTEST_SKIP() << "no CUDA device visible";
  auto mpi = make_mpi_communicator();  // only to pick this rank's device on a multi-GPU host
  AbsentPeerBootstrap bootstrap(2.0);
  const auto start = std::chrono::steady_clock::now();
  try {
    (void)make_nccl_communicator(bootstrap, mpi->rank() % devices);
    FAIL() << "the set-up completed without its peer";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.exit_code(), 3);
    EXPECT_NE(m.find("NCCL communicator set-up did not complete within --timeout 2 s on rank 0 (host testhost"),
              std::string::npos) << m;
    EXPECT_NE(m.find("a peer rank did not join"), std::string::npos) << m;
  }
  EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 2.0);
}

}  // namespace
}  // namespace dpt
