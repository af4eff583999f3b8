// Device discovery (see include/dpt/device.h). Compiled in every build; the CUDA runtime is
// called only when the GPU backend was built (DPT_HAVE_CUDA).
#include "dpt/device.h"

#ifdef DPT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "dpt/error.h"
#include "dpt/log.h"

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
  const int n = cuda_device_count();
  if (want == "cpu") return "cpu";
  if (want == "cuda") {
    DPT_INPUT_CHECK(n > 0, "--device cuda: no CUDA device visible on rank "
                               << local_rank
                               << " (cudaGetDeviceCount found none); use --device cpu or auto");
    // The GPU compute backend is the next piece of work (issue 4); until it lands, say so.
    throw Error(ErrorKind::kInput, DPT_MSG("--device cuda: " << n
                                               << " CUDA device(s) visible, but this build's GPU "
                                                  "training backend is not implemented yet; use "
                                                  "--device cpu"));
  }
  if (n > 0) log_warn("a CUDA device is visible but the GPU backend is not implemented yet: using the CPU");
  return "cpu";
}

}  // namespace dpt
