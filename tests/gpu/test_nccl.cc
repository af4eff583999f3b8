// The NCCL communicator at world size 1 (and at k ranks on a multi-GPU host): collectives on
// device buffers against formulas, its non-blocking set-up with and without a --timeout, and a
// set-up whose peer never joins ending at --timeout. The GPU transports of the Reducer with
// gradients sent compressed (--grad-dtype bf16 / fp16) against a host reference, at any world size
// (NCCL where every rank has a GPU of its own, host MPI always: `mpirun -np 2` on one GPU runs it).
// Skipped where no CUDA device is visible (CI).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#include "cuda/gpu_reducer.h"
#include "cuda/nccl_communicator.h"
#include "dpt/comm.h"
#include "dpt/device.h"
#include "dpt/error.h"
#include "dpt/half.h"
#include "dpt/reducer.h"
#include "dpt/rng.h"
#include "dpt/tensor.h"

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
  nccl->barrier("test barrier");
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
    for (int i = 0; i < n; ++i)
      ASSERT_EQ(h[static_cast<size_t>(i)], i * (k * (k + 1) / 2)) << "element " << i;
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
  std::unique_ptr<Request> iallreduce_raw(void*, int64_t, DType, ReduceOp,
                                          const std::string&) override {
    unused();
  }
  void broadcast_raw(void*, int64_t, DType, int, const std::string&) override {}
  void allgather_raw(const void*, void*, int64_t, DType) override { unused(); }
  void barrier(const std::string&) override { unused(); }
  void allreduce_unbounded_raw(void*, int64_t, DType, ReduceOp) override { unused(); }
  std::string diagnose() override { return "rank 1 never started"; }

 private:
  [[noreturn]] static void unused() {
    throw std::logic_error("not used by make_nccl_communicator");
  }
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
    EXPECT_NE(m.find("NCCL communicator set-up did not complete within --timeout 2 s on rank 0 "
                     "(host testhost"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("a peer rank did not join"), std::string::npos) << m;
  }
  EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 2.0);
}

// ---- The Reducer's GPU transports with gradients sent as bf16 / fp16, at any world size
// ----------

// Rank r's gradients, which every rank can recompute: both signs, magnitudes from 2^-12 to 2^4
// (sums of a few ranks stay far from fp16's overflow; some inputs are fp16 subnormals).
std::vector<float> rank_gradients(int r, int64_t n) {
  Rng g = Rng::derive(77, static_cast<uint64_t>(r));
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) {
    const double m = g.uniform(-1, 1);
    const int e = static_cast<int>(g.below(17)) - 12;
    v = static_cast<float>(std::ldexp(m, e));
  }
  return x;
}

// Rank r all-reduces rank_gradients(r) through the Reducer over `transport` (two steps: the
// second reuses the staging buffer and the events) and checks the sums against the host:
//  - one rank: exactly decompress16(compress16(x)) (the transport still casts);
//  - k ranks: |sum - exact| <= gamma_{2k-1} * sum_r |x_r| + (2k-1) * t, where gamma_m = m u'/(1 - m
//  u')
//    is (2k-1) u up to second-order terms: k roundings of the inputs and k-1 of partial sums (in
//    whatever order NCCL or MPI adds), u = 2^-8 (bf16) or 2^-11 (fp16), u' = u + 2^-23 allowing for
//    a float addition rounded before its 16-bit rounding, and t = half the 16-bit type's smallest
//    subnormal (the absolute error of a rounding below its normals: 2^-25 for fp16);
//  - the 16-bit path ran: most sums differ from the fp32 sum in rank order;
//  - every rank holds the same sums.
// Failures are counted, never returned early from: every rank must reach the same collectives.
void check_compressed_reducer(Communicator& mpi, gpu::CudaBackend& be, bool nccl, DType wire) {
  const int k = mpi.size(), me = mpi.rank();
  const int64_t n = 300007;
  const std::vector<Bucket> buckets{{0, 1000}, {1000, 131072}, {131072, n}};
  Tensor grads({n}, &be);
  const int device = be.context().device();
  Reducer reducer(nccl ? gpu::make_nccl_transport(be, grads.data(), n,
                                                  make_nccl_communicator(mpi, device), wire)
                       : gpu::make_host_mpi_transport(be, grads.data(), n, mpi, wire),
                  buckets, /*overlap=*/true);
  std::vector<std::vector<float>> xs;
  for (int q = 0; q < k; ++q) xs.push_back(rank_gradients(q, n));
  const double u = (wire == DType::kBF16 ? 0x1p-8 : 0x1p-11) + 0x1p-23;
  const double tiny = wire == DType::kBF16 ? 0x1p-134 : 0x1p-25;
  const double m = 2.0 * k - 1;
  const double gamma = m * u / (1 - m * u);
  std::vector<uint16_t> r16(static_cast<size_t>(n));
  std::vector<float> rounded(static_cast<size_t>(n));  // one rank: its gradients through 16 bits
  compress16(xs[static_cast<size_t>(me)].data(), r16.data(), n, wire);
  decompress16(r16.data(), rounded.data(), n, wire);
  std::vector<float> got(static_cast<size_t>(n));
  for (int64_t step = 0; step < 2; ++step) {
    SCOPED_TRACE(testing::Message() << "step " << step);
    reducer.begin(step);
    be.copy_from_host(grads.data(), xs[static_cast<size_t>(me)].data(),
                      static_cast<size_t>(n) * sizeof(float));
    for (size_t b = buckets.size(); b-- > 0;)
      reducer.mark_ready(buckets[b].begin, buckets[b].end);  // as backward
    reducer.wait();
    reducer.transport().quiesce();
    be.copy_to_host(got.data(), grads.data(), got.size() * sizeof(float));
    int64_t differ = 0, bad = 0;
    std::string first_bad;
    for (int64_t i = 0; i < n; ++i) {
      const size_t j = static_cast<size_t>(i);
      double exact = 0, mass = 0;
      float f32 = 0;
      for (int q = 0; q < k; ++q) {
        const float v = xs[static_cast<size_t>(q)][j];
        exact += v;
        mass += std::fabs(static_cast<double>(v));
        f32 += v;
      }
      differ += got[j] != f32;
      const bool ok =
          k == 1 ? got[j] == rounded[j] : std::fabs(got[j] - exact) <= gamma * mass + m * tiny;
      if (!ok && bad++ == 0)
        first_bad =
            DPT_MSG("element " << i << ": sum " << got[j] << ", exact " << exact
                               << ", through 16 bits " << rounded[j] << " (one rank), sum of |x| "
                               << mass << ", bound " << gamma * mass + m * tiny);
    }
    EXPECT_EQ(bad, 0) << "first: " << first_bad;
    EXPECT_GT(differ, n / 4) << "the sums look like fp32 ones: was the 16-bit path taken?";
    const auto sums = mpi.allgather(checksum(got.data(), got.size() * sizeof(float)));
    for (int q = 0; q < k; ++q)
      EXPECT_EQ(sums[static_cast<size_t>(q)], sums[0]) << "rank " << q << "'s sums differ";
  }
}

TEST(GpuReducer, CompressedGradientsWithinTheRoundingBoundAtAnyWorldSize) {
  const int devices = cuda_device_count();
  if (devices == 0) GTEST_SKIP() << "no CUDA device visible";
  auto mpi = make_mpi_communicator();
  mpi->set_timeout(60);
  gpu::CudaBackend be(mpi->rank() % devices);
  // NCCL only where every rank has a GPU of its own (it refuses two ranks on one).
  const bool nccl_possible = mpi->size() <= devices;
  if (!nccl_possible && mpi->rank() == 0)
    std::printf("[ note ] %d ranks on %d GPU(s): only the host-MPI transport is checked\n",
                mpi->size(), devices);
  for (bool nccl : {true, false}) {
    if (nccl && !nccl_possible) continue;
    for (DType wire : {DType::kBF16, DType::kF16}) {
      SCOPED_TRACE(testing::Message() << (nccl ? "NCCL" : "host MPI") << ", "
                                      << (wire == DType::kBF16 ? "bf16" : "fp16") << ", "
                                      << mpi->size() << " rank(s)");
      check_compressed_reducer(*mpi, be, nccl, wire);
    }
  }
}

}  // namespace
}  // namespace dpt
