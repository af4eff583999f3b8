// Device discovery (see include/dpt/device.h). Compiled in every build; the CUDA runtime is
// called only when the GPU backend was built (DPT_HAVE_CUDA).
#include "dpt/device.h"

#ifdef DPT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "dpt/error.h"

namespace dpt {

int cuda_device_count() {
#ifdef DPT_HAVE_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "insufficient driver" error
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

std::string resolve_device(const std::string& want, int local_rank) {
  if (want == "cpu") return "cpu";
  const int n = cuda_device_count();
  if (want == "cuda") {
#ifdef DPT_HAVE_CUDA
    DPT_INPUT_CHECK(n > 0, "--device cuda: no CUDA device visible on local rank "
                               << local_rank
                               << " (cudaGetDeviceCount found none); use --device cpu or auto");
#else
    (void)local_rank;
    DPT_INPUT_CHECK(false,
                    "--device cuda: no CUDA device visible to this build: it was compiled without "
                    "the GPU backend (nvcc, cuDNN, cuBLAS or NCCL missing, or -Dgpu=disabled); "
                    "use --device cpu or auto");
#endif
    return "cuda";
  }
  return n > 0 ? "cuda" : "cpu";
}

}  // namespace dpt
