// MPI_CHECK: the MPI member of the check-macro family (include/dpt/error.h).
#pragma once

#include <mpi.h>

#include <string>

#include "dpt/error.h"

namespace dpt::detail {
inline bool mpi_failed(int code) { return code != MPI_SUCCESS; }
inline std::string mpi_message(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS)
    return "MPI error code " + std::to_string(code);
  return std::string(buf, static_cast<size_t>(len));
}
}  // namespace dpt::detail

#define MPI_CHECK(call) \
  DPT_LIB_CHECK("MPI", call, ::dpt::detail::mpi_failed, ::dpt::detail::mpi_message)
