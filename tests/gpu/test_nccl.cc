// The NCCL communicator at world size 1 (and at k ranks on a multi-GPU host): collectives on
// device buffers against formulas. Skipped where no CUDA device is visible (CI).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/nccl_communicator.h"
#include "dpt/comm.h"
#include "dpt/device.h"

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

}  // namespace
}  // namespace dpt
