// The GPU's ComputeDevice (include/dpt/device.h): a CudaBackend it owns on GPU local_rank mod
// visible devices, so its memory and gradient transport reach the backend's context directly.
// Only compiled in GPU builds.
#include "cuda/device.h"

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

// A GPU: its context is created here. One layer from the interface to the backend: the driver's
// ComputeDevice calls reach the CudaBackend (and through it the GpuContext) directly.
class CudaDevice final : public ComputeDevice {
 public:
  CudaDevice(const DeviceRequest& r, int devices) : request_(r), be_(r.local_rank % devices) {
    be_.context().set_tf32(r.tf32);
    be_.context().set_bf16(r.bf16);
    be_.context().set_nondeterministic(r.nondeterministic);
    log_debug(loaded_libraries());
  }
  const char* kind() const override { return "cuda"; }
  Backend& ops() override { return be_; }

  // Every rank checks its GPU, after its context exists (so its own memory is already taken): per
  // image as on the CPU, plus 1 GiB for what a run keeps on the device besides activations
  // (parameters, gradients and momentum: 0.2 GiB for ResNet-18; the data set, 55 MiB; cuDNN's
  // workspace, up to 0.25 GiB per algorithm).
  DeviceMemory memory(int rank) override {
    size_t free = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free, &total));
    const int count = cuda_runtime_device_count();
    DeviceMemory m;
    m.checks = true;
    m.free_bytes = static_cast<double>(free);
    // Local ranks r with r mod count == local_rank mod count share this GPU.
    const int local_rank = request_.local_rank;
    m.sharing = count > 0 ? (request_.ranks_here - 1 - local_rank % count) / count + 1 : 1;
    m.extra = double(1 << 30);
    m.where = "on rank " + std::to_string(rank) + "'s GPU " + be_.describe();
    return m;
  }

  // NCCL on its own stream when every rank drives a GPU of its own, else pinned host buffers and
  // MPI (NCCL refuses two ranks on one GPU; rank 0 logs it). Null at world size 1 (nothing to send:
  // the Reducer then takes the MPI transport, which sends nothing either).
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
  // The graph API's convolutions take bf16 natively; the legacy API's do not gain from it.
  bool fast_bf16_activations() override { return be_.graph_api(); }

 private:
  const DeviceRequest request_;
  gpu::CudaBackend be_;
};

}  // namespace

int cuda_runtime_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "insufficient driver" error
    return 0;
  }
  return n;
}

std::unique_ptr<ComputeDevice> open_cuda_device(const DeviceRequest& request) {
  const int count = cuda_runtime_device_count();
  DPT_INPUT_CHECK(count > 0,
                  "--device cuda: no CUDA device visible on local rank " << request.local_rank);
  return std::make_unique<CudaDevice>(request, count);
}

std::string cuda_backend_report() {
#ifdef DPT_HAVE_CUDNN_FRONTEND
  constexpr const char* graph_api = "built in (the default)";
#else
  constexpr const char* graph_api = "not built (the legacy API only)";
#endif
  return DPT_MSG("GPU backend: " << loaded_libraries() << "; cuDNN graph API " << graph_api
                                 << "; devices visible: " << cuda_runtime_device_count());
}

}  // namespace dpt
