// CUDA_CHECK, CUDNN_CHECK, CUBLAS_CHECK, NCCL_CHECK: the GPU members of the one check-macro
// family (include/dpt/error.h); each is one line over DPT_LIB_CHECK. Host code only.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#include <string>

#include "dpt/error.h"

namespace dpt::detail {
inline bool cuda_failed(cudaError_t e) { return e != cudaSuccess; }
inline std::string cuda_message(cudaError_t e) { return cudaGetErrorString(e); }
inline bool cudnn_failed(cudnnStatus_t s) { return s != CUDNN_STATUS_SUCCESS; }
inline std::string cudnn_message(cudnnStatus_t s) { return cudnnGetErrorString(s); }
inline bool cublas_failed(cublasStatus_t s) { return s != CUBLAS_STATUS_SUCCESS; }
inline std::string cublas_message(cublasStatus_t s) {
  return "cuBLAS status " + std::to_string(static_cast<int>(s));
}
inline bool nccl_failed(ncclResult_t r) { return r != ncclSuccess && r != ncclInProgress; }
inline std::string nccl_message(ncclResult_t r) { return ncclGetErrorString(r); }
}  // namespace dpt::detail

#define CUDA_CHECK(call) \
  DPT_LIB_CHECK("CUDA", call, ::dpt::detail::cuda_failed, ::dpt::detail::cuda_message)
#define CUDNN_CHECK(call) \
  DPT_LIB_CHECK("cuDNN", call, ::dpt::detail::cudnn_failed, ::dpt::detail::cudnn_message)
#define CUBLAS_CHECK(call) \
  DPT_LIB_CHECK("cuBLAS", call, ::dpt::detail::cublas_failed, ::dpt::detail::cublas_message)
#define NCCL_CHECK(call) \
  DPT_LIB_CHECK("NCCL", call, ::dpt::detail::nccl_failed, ::dpt::detail::nccl_message)
