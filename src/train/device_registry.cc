// The device registry (include/dpt/device.h): which devices this build and process can use, and
// the door the driver opens one through. Each backend's device lives in its own folder
// (src/cpu/device.cc; src/cuda/device.cc, compiled only in GPU builds); this file is the only
// place outside the backends that knows whether the GPU backend was built.
#include "cpu/device.h"
#include "dpt/device.h"
#include "dpt/error.h"

#if DPT_HAVE_CUDA
#include "cuda/device.h"
#endif

namespace dpt {

namespace {
// Why a CPU-only build refuses --device cuda.
constexpr const char* kNoGpuBackend =
    "--device cuda: no CUDA device visible to this build: it was compiled without the GPU backend "
    "(nvcc, cuDNN, cuBLAS or NCCL missing, or -Dgpu=disabled); use --device cpu or auto";
}  // namespace

int cuda_device_count() {
#if DPT_HAVE_CUDA
  return cuda_runtime_device_count();
#else
  return 0;
#endif
}

std::string resolve_device(const std::string& want, int local_rank) {
  if (want == "cpu") return "cpu";
  const int n = cuda_device_count();
  if (want == "cuda") {
#if DPT_HAVE_CUDA
    DPT_INPUT_CHECK(n > 0, "--device cuda: no CUDA device visible on local rank "
                               << local_rank
                               << " (cudaGetDeviceCount found none); use --device cpu or auto");
#else
    (void)local_rank;
    DPT_INPUT_CHECK(false, kNoGpuBackend);
#endif
    return "cuda";
  }
  return n > 0 ? "cuda" : "cpu";
}

std::string backends_report() {
#if DPT_HAVE_CUDA
  const std::string gpu = cuda_backend_report();
#else
  const std::string gpu =
      "GPU backend: not built (nvcc, cuDNN, cuBLAS or NCCL missing, or -Dgpu=disabled)";
#endif
  return cpu_backend_report() + "\n" + gpu;
}

std::unique_ptr<ComputeDevice> open_device(const DeviceRequest& request) {
  if (request.kind == "cpu") return open_cpu_device(request);
  DPT_INPUT_CHECK(request.kind == "cuda", "--device: '" << request.kind << "' is not cpu|cuda");
#if DPT_HAVE_CUDA
  return open_cuda_device(request);
#else
  DPT_INPUT_CHECK(false, kNoGpuBackend);
  return nullptr;
#endif
}

}  // namespace dpt
