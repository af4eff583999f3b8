// open_gpu (see gpu_setup.h): the GpuDevice over a CudaBackend it owns, so its memory and transport
// reach the backend's context directly. Only compiled in GPU builds.
#include "cuda/gpu_setup.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstring>
#include <string>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#include "cuda/gpu_reducer.h"
#include "cuda/nccl_communicator.h"
#include "dpt/device.h"
#include "dpt/error.h"
#include "dpt/log.h"

namespace dpt {

namespace {

// Whether two ranks would drive the same physical GPU (NCCL refuses that): every rank's device
// UUID, gathered. UUIDs, not local ranks against device counts, so per-rank CUDA_VISIBLE_DEVICES
// (Slurm's --gpus-per-task) is recognised as distinct GPUs.
bool ranks_share_a_gpu(Communicator& comm, const cudaDeviceProp& prop) {
  constexpr int64_t kBytes = sizeof(prop.uuid.bytes);
  std::vector<uint8_t> mine(kBytes), all(static_cast<size_t>(kBytes * comm.size()));
  std::memcpy(mine.data(), prop.uuid.bytes, kBytes);
  comm.allgather(mine.data(), all.data(), kBytes);
  for (int a = 0; a < comm.size(); ++a)
    for (int b = a + 1; b < comm.size(); ++b)
      if (std::memcmp(all.data() + a * kBytes, all.data() + b * kBytes, kBytes) == 0) return true;
  return false;
}

// The CUDA libraries this process loaded, each with its version and file: a GPU machine may hold
// several copies (the toolkit's, PyTorch's wheels), and a report must name the one that ran. The
// file is where the dynamic linker resolved one of the library's symbols.
std::string loaded_libraries() {
  const auto file = [](const char* symbol) {
    Dl_info info{};
    void* at = dlsym(RTLD_DEFAULT, symbol);
    return at && dladdr(at, &info) && info.dli_fname ? std::string(info.dli_fname)
                                                     : std::string("?");
  };
  int runtime = 0, driver = 0, nccl = 0, major = 0, minor = 0, patch = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  ncclGetVersion(&nccl);
  cublasGetProperty(MAJOR_VERSION, &major);
  cublasGetProperty(MINOR_VERSION, &minor);
  cublasGetProperty(PATCH_LEVEL, &patch);
  return DPT_MSG("CUDA runtime " << runtime << " (" << file("cudaRuntimeGetVersion") << "), driver "
                                 << driver << "; cuDNN " << cudnnGetVersion() << " ("
                                 << file("cudnnGetVersion") << "); cuBLAS " << major << "." << minor
                                 << "." << patch << " (" << file("cublasGetProperty") << "); NCCL "
                                 << nccl << " (" << file("ncclGetVersion") << ")");
}

class CudaGpu final : public GpuDevice {
 public:
  CudaGpu(int local_rank, int devices, bool tf32, bool bf16)
      : local_rank_(local_rank), be_(local_rank % devices) {
    be_.context().set_tf32(tf32);
    be_.context().set_bf16(bf16);
    log_debug(loaded_libraries());
  }

  Backend& ops() override { return be_; }

  GpuMemory memory(int ranks_here) override {
    size_t free = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free, &total));
    const int count = cuda_device_count();
    GpuMemory m;
    m.free_bytes = static_cast<double>(free);
    // Local ranks r with r mod count == local_rank mod count share this GPU.
    m.ranks_on_gpu = count > 0 ? (ranks_here - 1 - local_rank_ % count) / count + 1 : 1;
    m.device = be_.describe();
    return m;
  }

  std::unique_ptr<ReduceTransport> transport(Communicator& comm, float* grads, int64_t count,
                                             DType wire) override {
    if (comm.size() == 1) return nullptr;
    const int device = be_.context().device();
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    if (ranks_share_a_gpu(comm, prop)) {
      if (comm.rank() == 0)
        log_info(
            "ranks share a GPU (NCCL needs one per rank): gradients are summed by MPI through host "
            "memory");
      return gpu::make_host_mpi_transport(be_, grads, count, comm, wire);
    }
    return gpu::make_nccl_transport(be_, grads, count, make_nccl_communicator(comm, device), wire);
  }
  bool fast_bf16_activations() override { return be_.graph_api(); }

 private:
  const int local_rank_;
  gpu::CudaBackend be_;
};

}  // namespace

std::unique_ptr<GpuDevice> open_gpu(int local_rank, bool tf32, bool bf16) {
  const int count = cuda_device_count();
  DPT_INPUT_CHECK(count > 0, "--device cuda: no CUDA device visible on local rank " << local_rank);
  return std::make_unique<CudaGpu>(local_rank, count, tf32, bf16);
}

}  // namespace dpt
